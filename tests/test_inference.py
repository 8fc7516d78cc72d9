"""Confidence intervals for ``u^T theta*`` from one run (``fj.inference.intervals``) against exact
references:

* the ``"exact"`` interval (the exact ``Cov(theta_t)`` of ``fj.theory.exact_covariance``) covers
  ``u^T theta*`` within 3 binomial standard errors of its level once the mean has converged, on a
  homogeneous problem; under heterogeneity FedLSA's bias makes it miss far more often (the
  collapse that ``fj.theory.fedlsa_bias`` predicts: coverage of ``N(bias, sd^2)`` by ``0 -+ z sd``),
  and SCAFFLSA, unbiased, is back at its level;
* the bootstrap's quantile and normal intervals cover within Z_TOL binomial standard errors of
  their level at a horizon where the bootstrap variance matches the exact one;
* the recorded bounds are the formulas (by hand from the final iterates and the exact sd);
* bad input is a one-line error.
"""

import math

import jax
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj

U = np.array([1.0, 0.0, 0.0])


def gaussian(heterogeneity, noise_A=0.2, noise_b=0.5):
    return fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=heterogeneity, noise_A=noise_A, noise_b=noise_b
    )


def binomial_se(p, n):
    return math.sqrt(p * (1 - p) / n)


def test_the_exact_interval_covers_at_its_level_and_its_bounds_are_the_formula():
    problem, alg, T, n = gaussian(0.0), fj.fedlsa(0.05, 2), 80, 4000
    sd = fj.inference.exact_sd(problem, alg, T, U)
    metrics = fj.inference.intervals(U, levels=(0.8, 0.95), methods="exact", exact_sd=sd)
    res = fj.simulate(jax.random.key(2), problem, alg, T, n, metrics=metrics, keep_seeds=5, record_every=T)
    for level in (0.8, 0.95):
        name = f"covers_exact_{'8' if level == 0.8 else '95'}"
        covered = res.metrics[name].mean[-1]
        assert abs(covered - level) <= 3 * binomial_se(level, n), (level, covered)
    v = res.final_theta[:5] @ U  # the first 5 seeds' u^T theta_T; z_0.9 and z_0.975 of the normal
    np.testing.assert_allclose(
        res.metrics["lower_exact_8"].seeds[-1], v - 1.2815515655446004 * sd[-1], rtol=1e-12
    )
    np.testing.assert_allclose(
        res.metrics["upper_exact_95"].seeds[-1], v + 1.959963984540054 * sd[-1], rtol=1e-12
    )


def test_fedlsa_bias_breaks_the_intervals_and_scafflsa_recovers():
    """Heterogeneous agents with little noise, eta = 0.1, H = 10, u along FedLSA's bias: its limit
    is theta* + bias with u^T bias = 2.6 sd, so the 0.9 interval's coverage is the probability that
    N(u^T bias, sd^2) falls in ``-+ 1.645 sd`` (0.16), computed here; SCAFFLSA's is 0.9."""
    problem, T, n = gaussian(1.0, noise_A=0.05, noise_b=0.1), 100, 2000
    fed, scaff = fj.fedlsa(0.1, 10), fj.scafflsa(0.1, 10)
    bias = fj.theory.exact_mean(problem, fed, T)[-1] - np.asarray(problem.theta_star)
    u = bias / np.linalg.norm(bias)
    for alg in (fed, scaff):
        sd = fj.inference.exact_sd(problem, alg, T, u)
        metrics = fj.inference.intervals(u, levels=0.9, methods="exact", exact_sd=sd, bounds=False)
        res = fj.simulate(jax.random.key(4), problem, alg, T, n, metrics=metrics, record_every=T)
        covered = res.metrics["covers_exact_9"].mean[-1]
        r = (fj.theory.exact_mean(problem, alg, T)[-1] - np.asarray(problem.theta_star)) @ u / sd[-1]
        z = 1.6448536269514722  # the normal's 0.95 quantile
        predicted = 0.5 * (math.erf((z - r) / math.sqrt(2)) + math.erf((z + r) / math.sqrt(2)))
        assert abs(covered - predicted) <= Z_TOL * binomial_se(predicted, n), (alg.name, covered, predicted)
        if alg is fed:
            assert abs(r) > 2 and predicted < 0.9 - 10 * binomial_se(0.9, n)  # the collapse
        else:
            assert abs(covered - 0.9) <= 3 * binomial_se(0.9, n)  # no bias: at its level


def test_bootstrap_intervals_cover_at_their_level():
    """At T = 60, where the bootstrap variance matches the exact one (tests/test_bootstrap.py), the
    quantile and normal intervals cover ``u^T theta*`` within Z_TOL binomial s.e. of their level over
    1000 seeds. Power: an interval with alpha in each tail (0.6 at 0.8) is 3 tolerances away, a 10x
    narrow one (0.10 at 0.8) 10."""
    problem, alg, T, n = gaussian(0.0), fj.fedlsa(0.05, 2), 60, 1000
    metrics = fj.inference.intervals(U, levels=(0.8, 0.95), methods=("quantile", "normal"))
    res = fj.simulate(
        jax.random.key(1), problem, fj.bootstrap(alg, 100), T, n, metrics=metrics, record_every=T
    )
    for method in ("quantile", "normal"):
        for level, tag in ((0.8, "8"), (0.95, "95")):
            covered = res.metrics[f"covers_{method}_{tag}"].mean[-1]
            tolerance = Z_TOL * binomial_se(level, n)
            assert abs(covered - level) <= tolerance, (method, level, covered)
            lower, upper = (res.metrics[f"{p}_{method}_{tag}"].mean[-1] for p in ("lower", "upper"))
            assert lower < upper
    assert 0.8 - (1 - 2 * 0.2) > 3 * Z_TOL * binomial_se(0.8, n)  # power: alpha in each tail at 0.8
    assert 0.8 - (2 * 0.5 * math.erfc(-1.2816 / 10 / math.sqrt(2)) - 1) > 10 * Z_TOL * binomial_se(0.8, n)
    # the normal interval is centred at the main iterate: its bounds' mean is the iterate's mean
    centre = 0.5 * (res.metrics["lower_normal_8"].mean[-1] + res.metrics["upper_normal_8"].mean[-1])
    assert centre == pytest.approx(res.theta_mean[-1] @ U, rel=1e-10)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: fj.inference.intervals(U, levels=1.5), r"level=1.5 is invalid"),
        (lambda: fj.inference.intervals(U, levels=0.0), r"level=0.0 is invalid"),
        (lambda: fj.inference.intervals(U, levels=()), r"levels=.* is invalid: expected one or more levels"),
        (lambda: fj.inference.intervals(U, methods="median"), r"methods='median' is invalid"),
        (lambda: fj.inference.intervals(U, methods="exact"), r"exact_sd=None is invalid"),
        (lambda: fj.inference.intervals([0.0, 0.0, 0.0]), r"direction=.* is invalid"),
        (lambda: fj.inference.intervals([np.inf, 0.0, 0.0]), r"direction=.* is invalid"),
        (
            lambda: fj.inference.intervals(U, levels=(0.9, 0.9000001)),
            r"levels=.* is invalid: levels 0.9 and 0.9000001 share the metric name '9'",
        ),
        (lambda: fj.inference.intervals(U, levels=(0.8, 0.8)), r"levels 0.8 and 0.8 share the metric name"),
        (lambda: fj.inference.joint(3, levels=(0.95, 0.9500000001)), r"share the metric name '95'"),
        (
            lambda: fj.inference.exact_sd(gaussian(0.0), fj.fedlsa(0.1, 2), 3, [1.0, 0.0]),
            r"direction=.* 3 entries",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(build, match):
    with pytest.raises(ValueError, match=match) as err:
        build()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "metrics, match",
    [
        (
            lambda p, a: fj.inference.intervals(U, 0.9, "exact", exact_sd=fj.inference.exact_sd(p, a, 5, U)),
            r"exact_sd='6 rows' is invalid: it has 6 rows \(rounds t = 0..5\), fewer than the run's 9 "
            r"\(num_rounds = 8",
        ),
        (
            lambda p, a: fj.inference.joint(3, 0.9, "exact", exact_cov=fj.theory.exact_covariance(p, a, 5)),
            r"exact_cov='6 rows' is invalid: it has 6 rows .* fewer than the run's 9 \(num_rounds = 8",
        ),
        (
            lambda p, a: fj.inference.intervals([1.0, 0.0]),
            r"direction=.* is invalid: expected 3 entries \(the iterate's dimension d = 3\), got 2",
        ),
        (
            lambda p, a: {"bv": fj.inference.bootstrap_variance([1.0, 0.0, 0.0, 0.0])},
            r"direction=.* is invalid: expected 3 entries \(the iterate's dimension d = 3\), got 4",
        ),
    ],
)
def test_a_table_or_direction_that_does_not_fit_the_run_is_refused_before_compiling(metrics, match):
    """An exact table shorter than the run (its last row was reused: 0.59 reported for 0.875) and a
    direction of another length than the iterate are refused naming the parameter and both sizes."""
    problem, alg = gaussian(0.0), fj.fedlsa(0.05, 2)
    with pytest.raises(ValueError, match=match) as err:
        fj.simulate(0, problem, fj.bootstrap(alg, 4), 8, 4, metrics=metrics(problem, alg))
    assert "\n" not in str(err.value)


def test_coverage_does_not_depend_on_the_directions_scale_in_float32():
    """In float32, ``u = 1e39 e_0`` overflowed (coverage 0), ``1e-46 e_0`` underflowed to 0 (coverage 1)
    and ``1e-20 e_0`` gave a bootstrap variance of 0: the direction is normalised, so every scale
    gives the unit direction's metrics bit for bit, and an exact table for a scaled u is the unit one's."""
    problem = fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=0.0, noise_A=0.2, noise_b=0.5, dtype=np.float32
    )
    alg = fj.fedlsa(0.05, 2)
    sd = fj.inference.exact_sd(problem, alg, 20, U)
    values = {}
    for scale in (1.0, 1e39, 1e-46, 1e-20):
        u = scale * U
        np.testing.assert_allclose(fj.inference.exact_sd(problem, alg, 20, u), sd, rtol=1e-12)
        metrics = fj.inference.intervals(u, levels=0.9, methods=METHODS_ALL, exact_sd=sd)
        metrics["bv"] = fj.inference.bootstrap_variance(u)
        res = fj.simulate(
            1, problem, fj.plug_in(fj.bootstrap(alg, 20)), 20, 32, metrics=metrics, record_every=20
        )
        values[scale] = {k: v.mean[-1] for k, v in res.metrics.items()}
    assert 0.5 < values[1.0]["covers_normal_9"] < 1 and values[1.0]["bv"] > 0  # not degenerate
    for scale in (1e39, 1e-46, 1e-20):
        assert values[scale] == values[1.0], scale


METHODS_ALL = ("quantile", "normal", "plug_in", "exact")


def test_joint_sets_cover_at_their_level_and_equal_the_formula():
    """Homogeneous Gaussian LSA: the exact ellipsoid ``(theta_T - theta*)^T Cov(theta_T)^{-1} (...)
    <= chi2_3(level)`` covers ``theta*`` within 3 binomial s.e. of its level; each seed's verdict and
    distance equal numpy's from its final iterate. The bootstrap's normal set, whose covariance is
    estimated from B = 100 replicates, covers within Z_TOL binomial s.e. of Hotelling's prediction
    for B Gaussian draws of the true covariance, ``P(F(d, B - d + 1) <= chi2_d(level) (B - d + 1) /
    (B d))`` (0.94 at 0.95, 0.78 at 0.8), and the quantile set, the same ellipsoid with the
    replicates' own threshold, within Z_TOL s.e. of an unpaired difference of it."""
    from scipy.stats import chi2, f

    problem, alg, T, n = gaussian(0.0), fj.fedlsa(0.05, 2), 60, 1000
    cov = fj.theory.exact_covariance(problem, alg, T)
    metrics = fj.inference.joint(3, levels=(0.8, 0.95), methods=fj.inference.METHODS, exact_cov=cov)
    res = fj.simulate(
        jax.random.key(2),
        problem,
        fj.plug_in(fj.bootstrap(alg, 100)),
        T,
        n,
        metrics=metrics,
        record_every=T,
        keep_seeds=n,
    )
    e = res.final_theta - np.asarray(problem.theta_star)
    distance = np.einsum("si,ij,sj->s", e, np.linalg.inv(cov[-1]), e)
    np.testing.assert_allclose(res.metrics["distance_joint_exact"].seeds[-1], distance, rtol=1e-9)
    for level, tag in ((0.8, "8"), (0.95, "95")):
        covers = res.metrics[f"covers_joint_exact_{tag}"]
        np.testing.assert_array_equal(covers.seeds[-1], (distance <= chi2.ppf(level, 3)).astype(float))
        assert abs(covers.mean[-1] - level) <= 3 * binomial_se(level, n), (level, covers.mean[-1])
        B, d = 100, 3
        hotelling = f.cdf(chi2.ppf(level, d) * (B - d + 1) / (B * d), d, B - d + 1)
        covered = res.metrics[f"covers_joint_normal_{tag}"].mean[-1]
        assert abs(covered - hotelling) <= Z_TOL * binomial_se(hotelling, n), (level, covered, hotelling)
        # the quantile set estimates the same ellipsoid: within Z_TOL s.e. of an unpaired difference
        quantile = res.metrics[f"covers_joint_quantile_{tag}"].mean[-1]
        assert abs(quantile - covered) <= Z_TOL * np.sqrt(2) * binomial_se(hotelling, n), (level, quantile)


def test_a_joint_bootstrap_set_with_too_few_replicates_is_refused_before_compiling():
    metrics = fj.inference.joint(3, levels=0.9, methods="normal")
    with pytest.raises(
        ValueError, match=r"needs more replicates than coordinates \(B > d\): B = 3, d = 3"
    ) as err:
        fj.simulate(0, gaussian(0.0), fj.bootstrap(fj.fedlsa(0.1, 2), 3), 3, 4, metrics=metrics)
    assert "\n" not in str(err.value)


def test_a_joint_set_of_the_wrong_dimension_is_refused_before_compiling():
    metrics = fj.inference.joint(1, levels=0.9, methods="plug_in")
    with pytest.raises(ValueError, match=r"built for dim = 1; the iterate has 3") as err:
        fj.simulate(0, gaussian(0.0), fj.plug_in(fj.fedlsa(0.1, 2)), 3, 4, metrics=metrics)
    assert "\n" not in str(err.value)


def test_joint_bad_input_is_a_one_line_error():
    for build, match in (
        (lambda: fj.inference.joint(0), r"dim=0 is invalid"),
        (lambda: fj.inference.joint(2, levels=1.0), r"level=1.0 is invalid"),
        (lambda: fj.inference.joint(2, methods="exact"), r"exact_cov=None is invalid"),
        (lambda: fj.inference.joint(2, methods="exact", exact_cov=np.zeros((3, 3, 3))), r"exact_cov=.*2, 2"),
    ):
        with pytest.raises(ValueError, match=match) as err:
            build()
        assert "\n" not in str(err.value)


def test_bootstrap_bounds_and_variance_equal_numpy_on_each_seeds_replicates():
    """Each seed's recorded bounds from its own replicates ``v_b`` (B = 20, recorded as metrics): the
    quantile interval is numpy's ``[q_{alpha/2}, q_{1-alpha/2}]`` (alpha/2 in each tail), the normal one
    ``v -+ z sd(v_b)`` (the replicates' sd, not divided by sqrt(B)), the bootstrap variance
    ``mean((v_b - v)^2)`` around the main iterate ``v`` (not the replicates' mean). Power: each
    competing answer is far from the recorded one on these seeds."""
    problem, alg, B, T, n = gaussian(1.0), fj.fedlsa(0.1, 4), 20, 6, 8
    metrics = fj.inference.intervals(U, levels=0.8, methods=("quantile", "normal"))
    metrics["bv"] = fj.inference.bootstrap_variance(U)
    metrics["main"] = lambda s, p: s.theta @ U
    for b in range(B):
        metrics[f"rep{b}"] = lambda s, p, b=b: s.replicates.theta[b] @ U
    res = fj.simulate(1, problem, fj.bootstrap(alg, B), T, n, metrics=metrics, record_every=T, keep_seeds=n)
    v = res.metrics["main"].seeds[-1]
    vb = np.stack([res.metrics[f"rep{b}"].seeds[-1] for b in range(B)], axis=1)  # (n, B)
    z = 1.2815515655446004  # the normal's 0.9 quantile
    got = {k: res.metrics[k].seeds[-1] for k in ("lower_quantile_8", "upper_quantile_8", "bv")}
    np.testing.assert_allclose(got["lower_quantile_8"], np.quantile(vb, 0.1, axis=1), rtol=1e-12)
    np.testing.assert_allclose(got["upper_quantile_8"], np.quantile(vb, 0.9, axis=1), rtol=1e-12)
    sd = np.std(vb, axis=1)
    np.testing.assert_allclose(res.metrics["lower_normal_8"].seeds[-1], v - z * sd, rtol=1e-12)
    np.testing.assert_allclose(res.metrics["upper_normal_8"].seeds[-1], v + z * sd, rtol=1e-12)
    np.testing.assert_allclose(got["bv"], np.mean((vb - v[:, None]) ** 2, axis=1), rtol=1e-12)
    # power: alpha in each tail, sd / sqrt(B), and the variance around the replicates' mean differ
    assert np.all(np.abs(np.quantile(vb, 0.2, axis=1) - got["lower_quantile_8"]) > 1e-3 * sd)
    assert np.all(sd > 1e-3)  # a width divided by sqrt(B) is far from the recorded one
    assert np.max(np.abs(np.var(vb, axis=1) / got["bv"] - 1)) > 1e-2


def test_exact_interval_of_a_bare_bootstrap_uses_the_rounds_own_sd():
    """``fj.bootstrap(alg)`` without the plug-in, the exact interval recorded at every round: its bounds
    are ``v -+ z sd_t`` with the sd of round t itself (not t + 1; a frozen round counter would give
    round 0's sd, 0, a point)."""
    problem, alg, T, n = gaussian(0.0), fj.fedlsa(0.05, 2), 6, 4
    sd = fj.inference.exact_sd(problem, alg, T + 3, U)  # longer than the run: rows past T unused
    metrics = fj.inference.intervals(U, levels=0.9, methods="exact", exact_sd=sd)
    metrics["main"] = lambda s, p: s.theta @ U
    res = fj.simulate(2, problem, fj.bootstrap(alg, 3), T, n, metrics=metrics, keep_seeds=n)
    z, v = 1.6448536269514722, res.metrics["main"].seeds  # (T + 1, n)
    np.testing.assert_array_equal(res.rounds, np.arange(T + 1))
    np.testing.assert_allclose(res.metrics["lower_exact_9"].seeds, v - z * sd[: T + 1, None], rtol=1e-12)
    np.testing.assert_allclose(res.metrics["upper_exact_9"].seeds, v + z * sd[: T + 1, None], rtol=1e-12)
    assert sd[0] == 0 and np.all(np.diff(sd[: T + 2]) > 1e-3 * sd[T])  # power: round t + 1 differs


def test_a_singular_joint_covariance_does_not_cover():
    """At round 0 nothing has been observed: the exact covariance and the bootstrap's are 0, the set
    is the point ``theta_0 != theta*``, its distance infinite and it covers for no seed."""
    problem, alg, T = gaussian(0.0), fj.fedlsa(0.05, 2), 3
    cov = fj.theory.exact_covariance(problem, alg, T)
    metrics = fj.inference.joint(3, levels=0.9, methods=("normal", "exact"), exact_cov=cov)
    res = fj.simulate(1, problem, fj.bootstrap(alg, 8), T, 4, metrics=metrics, keep_seeds=4)
    for method in ("normal", "exact"):
        np.testing.assert_array_equal(res.metrics[f"covers_joint_{method}_9"].seeds[0], 0.0)
        assert np.all(np.isinf(res.metrics[f"distance_joint_{method}"].seeds[0]))
        assert np.all(np.isfinite(res.metrics[f"distance_joint_{method}"].seeds[1:]))
