"""Checks for features that could break with every other test still green.

* the exact MSE of Gaussian LSA with d, N, H > 1 against brute-force enumeration
  (Rademacher noise has the Gaussian's first two moments);
* rand-k's error covariance (off-diagonal terms) against enumeration of the kept
  subsets, and the exact MSE with d = 3, k = 2 against enumeration;
* the channel's expected weights and their covariances against enumeration of the
  delivery patterns, and against closed-form identities for N = 1500;
* ``theta_sem`` and ``theta_mean`` against the seeds' own values, across seed
  batches and with diverged seeds left out;
* Garnet and Gaussian heterogeneity levels strictly between 0 and 1;
* the theory curves, reference lines and markers that the plots are given.
"""

import itertools
import math

import jax
import matplotlib
import numpy as np
import pytest
from reference import enumerated_algorithm_mse

import fedsa_jax as fj
from fedsa_jax import plotting
from fedsa_jax.moments import aggregation as aggregation_moments
from fedsa_jax.result import SimulationResult


@pytest.fixture(scope="module")
def gauss2():
    return fj.problems.random_gaussian_lsa(
        jax.random.key(4), num_agents=2, dim=2, heterogeneity=1.0, noise_A=0.4, noise_b=0.5
    )


GAUSS_CASES = {
    "fedlsa": lambda: fj.fedlsa(0.2, 3),
    "scafflsa": lambda: fj.scafflsa(0.2, 3),
    "fedlsa_randk_received": lambda: fj.fedlsa(
        0.2, 3, quantizer=fj.channel.rand_k(1), success_prob=0.6, aggregation="divide_by_received"
    ),
    "qfedtd_randk_erasures": lambda: fj.qfedtd(0.3, fj.channel.rand_k(1), success_prob=0.7),
}


@pytest.mark.parametrize("case", list(GAUSS_CASES))
def test_gaussian_exact_mse_matches_enumeration(gauss2, case):
    alg = GAUSS_CASES[case]()
    theta0 = np.array([1.0, -0.5])
    T = 4
    got = fj.theory.exact_mse(gauss2, alg, T, theta0=theta0)
    np.testing.assert_allclose(got, enumerated_algorithm_mse(gauss2, alg, T, theta0), rtol=1e-10)
    # power: the multiplicative noise enters through tr(E[x x^T]); a factor 1/d on it moves the curve
    # far beyond the tolerance
    scaled = fj.problems.gaussian_lsa(
        gauss2.A_bar, gauss2.b_bar, float(gauss2.noise_A[0]) / math.sqrt(2), gauss2.noise_b
    )
    wrong = fj.theory.exact_mse(scaled, alg, T, theta0=theta0)
    assert np.max(np.abs(wrong[1:] / got[1:] - 1)) > 1e-4


@pytest.mark.parametrize("d,k", [(2, 1), (3, 2), (4, 1), (5, 2), (5, 3), (5, 5)])
def test_rand_k_error_covariance_matches_subset_enumeration(d, k):
    """``E[(Q(x) - x)(Q(x) - x)^T]`` for ``E[x x^T] = S``: average over the C(d, k) kept subsets."""
    rng = np.random.default_rng(d * 10 + k)
    G = rng.standard_normal((d, d))
    S = G @ G.T
    exact = np.zeros((d, d))
    subsets = list(itertools.combinations(range(d), k))
    for sub in subsets:
        E = np.diag(np.isin(np.arange(d), sub) * (d / k)) - np.eye(d)
        exact += E @ S @ E.T / len(subsets)
    got = aggregation_moments._quantizer_covariance(fj.channel.rand_k(k), d)(S)
    np.testing.assert_allclose(got, exact, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def td3():
    rng = np.random.default_rng(7)
    P = rng.uniform(size=(2, 4, 4)) + 0.1
    P /= P.sum(-1, keepdims=True)
    return fj.problems.federated_td(P, rng.uniform(-1, 1, (2, 4)), rng.uniform(size=(4, 3)), 0.8)


@pytest.mark.parametrize(
    "make",
    [
        lambda: fj.fedlsa(
            0.4, 2, quantizer=fj.channel.rand_k(2), success_prob=0.6, aggregation="divide_by_received"
        ),
        lambda: fj.qfedtd(0.6, fj.channel.rand_k(2), success_prob=0.7),
    ],
    ids=["fedlsa", "qfedtd"],
)
def test_rand_k_exact_mse_with_d3_k2_matches_enumeration(td3, make):
    """With k = 1 the off-diagonal error covariance is -x_i x_j whatever the formula's k-dependence;
    with d = 3, k = 2 it is -x_i x_j / 4."""
    alg = make()
    theta0 = np.array([0.7, -0.4, 0.2])
    got = fj.theory.exact_mse(td3, alg, 5, theta0=theta0)
    np.testing.assert_allclose(got, enumerated_algorithm_mse(td3, alg, 5, theta0), rtol=1e-10)


def delivery_moments(N, p, aggregation):
    """Enumerate the 2^N delivery patterns: E[w_0], E[1{0 in R}/|R|], E[1{0,1 in R}/|R|],
    Cov(w_0, w_0), Cov(w_0, w_1)."""
    out = np.zeros(6)
    for pattern in itertools.product((0, 1), repeat=N):
        x = np.array(pattern)
        prob = np.prod(np.where(x == 1, p, 1 - p))
        n = x.sum()
        w = x / N if aggregation == "divide_by_n" else (x / n if n else np.zeros(N))
        inv = x / n if n else np.zeros(N)
        out += prob * np.array(
            [w[0], inv[0], inv[0] * x[1] if N > 1 else 0.0, w[0] ** 2, w[0] * w[1] if N > 1 else 0.0, 1.0]
        )
    mean = out[0]
    return out[0], out[1], out[2], out[3] - mean**2, (out[4] - mean**2) if N > 1 else 0.0


@pytest.mark.parametrize("aggregation", ["divide_by_n", "divide_by_received"])
def test_channel_weight_moments_match_enumeration(aggregation):
    for N in range(1, 7):
        for p in (0.3, 0.85):
            ch = fj.channel.channel(None, p, aggregation)
            mean, same, other, c_same, c_other = delivery_moments(N, p, aggregation)
            got = aggregation_moments._expected_weights(ch, N)
            np.testing.assert_allclose(got, (mean, same, other), rtol=1e-12, atol=1e-15)
            cov = aggregation_moments._weight_covariance(ch, N)
            n_pairs = 2 if N > 1 else 1  # with one agent there is no pair (c, j != c)
            np.testing.assert_allclose(cov[:n_pairs], (c_same, c_other)[:n_pairs], rtol=1e-10, atol=1e-15)


def test_channel_weight_moments_for_many_agents():
    """N = 1500 (log-space binomials): sum_c 1{c in R}/|R| = 1{|R| > 0} gives closed forms."""
    N, p = 1500, 0.003  # about 4.5 messages received per round, none with probability 1 %
    ch = fj.channel.channel(None, p, "divide_by_received")
    mean, same, other = aggregation_moments._expected_weights(ch, N)
    some = 1 - (1 - p) ** N
    assert mean == pytest.approx(some / N, rel=1e-12)
    assert same == pytest.approx(some / N, rel=1e-10)
    assert same + (N - 1) * other == pytest.approx(p, rel=1e-10)  # E[sum_j 1{c,j in R}/|R|] = p
    c_same, c_other = aggregation_moments._weight_covariance(ch, N)
    # N E[w^2] + N (N-1) E[w_c w_j] = E[(sum_c w_c)^2] = P(|R| > 0), and N E[w^2] = E[1/|R|; |R| > 0]
    assert N * (c_same + mean**2) + N * (N - 1) * (c_other + mean**2) == pytest.approx(some, rel=1e-9)
    k = np.arange(1, N + 1)  # |R| ~ Binomial(N, p), pmf by the ratio recursion
    log_pmf = N * np.log1p(-p) + np.concatenate([[0.0], np.cumsum(np.log((N - k + 1) / k * p / (1 - p)))])
    assert N * (c_same + mean**2) == pytest.approx(np.sum(np.exp(log_pmf[1:]) / k), rel=1e-9)
    # and the exact mean of QFedTD dividing by |R| takes the step alpha (1 - (1-p)^N)
    big = fj.problems.gaussian_lsa(np.full((N, 1, 1), 0.5), np.ones((N, 1)))
    m = fj.theory.exact_mean(big, fj.qfedtd(0.4, success_prob=p, aggregation="divide_by_received"), 3)
    ref = [0.0]
    for _ in range(3):
        ref.append(ref[-1] - 0.4 * some * (0.5 * ref[-1] - 1.0))
    np.testing.assert_allclose(m[:, 0], ref, rtol=1e-12)


def test_seed_statistics_against_the_seeds_across_batches():
    """theta_mean, theta_sem, mse_mean and mse_sem of the last round from the seeds' final iterates,
    with seeds split into uneven batches and the diverged ones left out of every statistic."""
    p = fj.problems.gaussian_lsa([[[1.0]]], [[1.0]], noise_A=2.0, noise_b=0.1)
    n = 300
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = fj.simulate(
            jax.random.key(0), p, fj.fedlsa(0.9, 1), 200, n, record_every=100, seed_batch_size=110
        )
    assert res.config["execution"]["num_batches"] == 3
    final = res.final_theta[:, 0]
    bad = ~np.isfinite(final) | ((final - 1.0) ** 2 > 1e10 * 3)
    ok = final[~bad]
    assert 10 < bad.sum() < n - 10 and res.num_diverged[-1] == bad.sum()
    m = len(ok)
    np.testing.assert_allclose(res.theta_mean[-1, 0], ok.mean(), rtol=1e-10)
    np.testing.assert_allclose(res.theta_sem[-1, 0], ok.std(ddof=1) / math.sqrt(m), rtol=1e-9)
    err = (ok - 1.0) ** 2
    np.testing.assert_allclose(res.mse_mean[-1], err.mean(), rtol=1e-10)
    np.testing.assert_allclose(res.mse_sem[-1], err.std(ddof=1) / math.sqrt(m), rtol=1e-9)
    assert res.theta_sem[0, 0] == 0.0  # every seed starts at theta0


@pytest.mark.parametrize("h", [0.3, 0.75])
def test_garnet_intermediate_heterogeneity_interpolates(h):
    """Without perturbations every agent's kernel and reward are affine in the level h: the level-h
    problem is (1 - h) x (level 0) + h x (level 1), for every agent."""
    make = lambda level: fj.problems.garnet(
        jax.random.key(2),
        num_agents=4,
        num_states=10,
        dim=4,  # noqa: E731
        heterogeneity=level,
        perturbation=0.0,
    )
    p0, p1, ph = make(0.0), make(1.0), make(h)
    for field in ("transitions", "rewards"):
        a0, a1 = np.asarray(getattr(p0, field)), np.asarray(getattr(p1, field))
        assert np.abs(a1 - a0).max() > 0.1
        np.testing.assert_allclose(
            np.asarray(getattr(ph, field)), (1 - h) * a0 + h * a1, rtol=1e-12, atol=1e-14
        )
    # with the default perturbations the level still orders the spread of local solutions
    spread = lambda level: np.linalg.norm(
        np.asarray(  # noqa: E731
            (
                q := fj.problems.garnet(
                    jax.random.key(2), num_agents=4, num_states=10, dim=4, heterogeneity=level
                )
            ).local_theta_star
        )
        - np.asarray(q.theta_star)
    )
    assert spread(0.0) < spread(h) < spread(1.0)
    # random Gaussian LSA: A_bar and b_bar are affine in the level too
    g = [
        fj.problems.random_gaussian_lsa(jax.random.key(5), 3, 2, heterogeneity=level)
        for level in (0.0, 1.0, h)
    ]
    for field in ("A_bar", "b_bar"):
        a0, a1, ah = (np.asarray(getattr(x, field)) for x in g)
        np.testing.assert_allclose(ah, (1 - h) * a0 + h * a1, rtol=1e-12, atol=1e-14)


def fake_result(mse, sem, num_agents=3, local_steps=2, seeds=10):
    """A hand-made result (no simulation) with the given per-round MSE and standard error."""
    R = len(mse)
    rounds = np.arange(R) * 2
    return SimulationResult(
        rounds=rounds,
        mse_mean=np.asarray(mse, float),
        mse_sem=np.asarray(sem, float),
        theta_mean=np.zeros((R, 2)),
        theta_sem=np.zeros((R, 2)),
        num_diverged=np.zeros(R, np.int64),
        final_theta=np.zeros((seeds, 2)),
        theta_star=np.zeros(2),
        bits_sent=rounds * num_agents * 64.0,
        bits_delivered=rounds * num_agents * 64.0,
        mse_quantiles=np.full((R, 5), np.nan),
        config={
            "problem": {"num_agents": num_agents},
            "algorithm": {"num_local_steps": local_steps, "skip": 1},
        },
        communications=rounds * float(num_agents),
        messages_delivered=rounds * float(num_agents),
        samples=rounds * float(num_agents * local_steps),
        seed_mse=np.zeros((R, 0)),
    )


def test_plot_mse_draws_the_curves_and_levels_it_is_given():
    res = fake_result([4.0, 2.0, 1.5, 1.2], [0.1, 0.2, 0.1, 0.05])
    exact = np.linspace(4.0, 1.0, 7)  # rounds 0..6
    free = np.array([3.0, 2.0, 1.0])
    levels = {"bias$^2$": 0.123, "floor": 0.5}
    fig = plotting.plot_mse(
        {"run": res}, x="communications", theory={"run": exact, "alone": free}, reference_lines=levels
    )
    ax = fig.axes[0]
    by_label = {line.get_label(): line for line in ax.lines}
    np.testing.assert_array_equal(by_label["run (10 seeds)"].get_ydata(), res.mse_mean)
    on_run = by_label["exact"]  # drawn over the result, mapped to its x axis (t N)
    np.testing.assert_array_equal(on_run.get_ydata(), exact)
    np.testing.assert_allclose(on_run.get_xdata(), np.arange(7) * 3)
    alone = by_label["alone"]  # no result of that label: against round indices
    np.testing.assert_array_equal(alone.get_ydata(), free)
    np.testing.assert_array_equal(alone.get_xdata(), np.arange(3))
    for label, level in levels.items():
        line = by_label[label]
        assert line.get_linestyle() == "--"
        np.testing.assert_array_equal(line.get_ydata(), [level, level])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    np.testing.assert_allclose(band.max(), (res.mse_mean + 2 * res.mse_sem).max())
    np.testing.assert_allclose(band.min(), (res.mse_mean - 2 * res.mse_sem).min())
    matplotlib.pyplot.close(fig)


def test_plot_final_mse_vs_agents_draws_its_data_theory_and_reference():
    series = {
        "a": {1: fake_result([1.0, 0.5], [0.1, 0.02]), 10: fake_result([1.0, 0.06], [0.1, 0.01])},
        "b": {2: fake_result([1.0, 0.9], [0.1, 0.05]), 20: fake_result([1.0, 0.2], [0.1, 0.03])},
    }
    exact = {"a": {1: 0.48, 10: 0.05}}
    fig = plotting.plot_final_mse_vs_agents(series, theory=exact)
    ax = fig.axes[0]
    data = [c for c in ax.containers]
    np.testing.assert_array_equal(data[0].lines[0].get_ydata(), [0.5, 0.06])
    np.testing.assert_array_equal(data[1].lines[0].get_xdata(), [2, 20])
    bars = np.array(data[0].lines[2][0].get_segments())  # (N, 2 ends, xy): mean -+ 2 s.e.
    np.testing.assert_allclose(bars[:, 0, 1], [0.5 - 0.04, 0.06 - 0.02])
    np.testing.assert_allclose(bars[:, 1, 1], [0.5 + 0.04, 0.06 + 0.02])
    markers = [line for line in ax.lines if line.get_marker() == "s" and len(line.get_xdata())]
    assert len(markers) == 1
    np.testing.assert_array_equal(markers[0].get_xdata(), [1, 10])
    np.testing.assert_array_equal(markers[0].get_ydata(), [0.48, 0.05])
    ref = next(line for line in ax.lines if line.get_linestyle() == "--")
    np.testing.assert_array_equal(ref.get_xdata(), [1, 20])  # over every N
    np.testing.assert_allclose(ref.get_ydata(), [0.5, 0.5 / 20])  # C / N through the first point
    matplotlib.pyplot.close(fig)
