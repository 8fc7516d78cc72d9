"""The multiplier bootstrap (``fj.bootstrap``) against exact references:

* with weights identically 1 every replicate equals the main trajectory bit for bit, and the main
  trajectory equals the run without the option, for FedLSA, SCAFFLSA, Scaffnew and QFedTD, under
  generative and Markov sampling, through channels, cohorts and local steps that change with the
  round;
* a replicate with random weights equals a numpy loop whose local updates are multiplied by the
  weights drawn from the documented key stream;
* every weight law has mean 1 and variance 1 (and the Beta law the skewness of Beta(1/2, 2)),
  within Z_TOL standard errors;
* the seeds' mean bootstrap variance of ``u^T theta_T`` approaches the exact variance of
  ``u^T theta_T`` (``fj.theory.exact_covariance``): far from it at the start, within [0.8, 1.25]
  later;
* the exact theory of a bootstrap is the algorithm's; every refusal is a one-line error.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL
from reference import _round_keys, round_randomness

import fedsa_jax as fj
from fedsa_jax.algorithms.bootstrap import replicate_weights


def spread(state, problem):
    """The largest |theta^b - theta| over the replicates and coordinates."""
    del problem
    return jnp.max(jnp.abs(state.replicates.theta - state.theta))


def garnet(sampling):
    return fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=5, dim=2, sampling=sampling)


CASES = {
    "fedlsa": (fj.fedlsa(0.2, 3), "generative"),
    "fedlsa-growing-markov": (fj.fedlsa(0.2, [1, 3, 2, 2]), "markov"),
    "scafflsa-rand-k": (fj.scafflsa(0.2, 3, quantizer=fj.channel.rand_k(1)), "markov"),
    "scafflsa-erasures": (fj.scafflsa(0.2, 3, success_prob=0.7), "markov"),
    "fedlsa-rand-k-erasures": (fj.fedlsa(0.2, 3, quantizer=fj.channel.rand_k(1), success_prob=0.7), "markov"),
    "scaffnew-cohort": (fj.scaffnew(0.2, 0.4, 3, clients_per_round=2), "generative"),
    "qfedtd-quantized-markov": (fj.qfedtd(0.3, fj.channel.stochastic_uniform(4), success_prob=0.8), "markov"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_unit_weights_replicate_the_main_trajectory(name):
    alg, sampling = CASES[name]
    problem = garnet(sampling)
    plain = fj.simulate(jax.random.key(1), problem, alg, 4, 6, keep_seeds=6)
    res = fj.simulate(
        jax.random.key(1),
        problem,
        fj.bootstrap(alg, 3, weights="ones"),
        4,
        6,
        metrics={"spread": spread},
        keep_seeds=6,
    )
    np.testing.assert_array_equal(res.final_theta, plain.final_theta)  # the main trajectory, bit for bit
    np.testing.assert_array_equal(res.seed_mse, plain.seed_mse)  # every seed, every round
    # every replicate, every recorded round; rand-k with erasures sums the delivered messages with a
    # dot that XLA batches otherwise over the replicates: the same sum, up to its last bit
    rounding = 1e-15 if name == "fedlsa-rand-k-erasures" else 0.0
    assert np.all(res.metrics["spread"].mean <= rounding * np.max(np.abs(problem.theta_star)))
    np.testing.assert_array_equal(res.samples, plain.samples)  # the main trajectory's counts
    # power: random weights move the replicates, and leave the main trajectory as it was
    moved = fj.simulate(jax.random.key(1), problem, fj.bootstrap(alg, 3), 4, 6, metrics={"spread": spread})
    np.testing.assert_array_equal(moved.final_theta, plain.final_theta)
    assert np.all(moved.metrics["spread"].mean[1:] > 1e-3)


def test_a_replicate_equals_a_weighted_numpy_loop(het_gaussian):
    """Replicate b of seed 0: FedLSA whose agent c's local update h of round t is multiplied by
    ``w[b, c, h]``, the weights of ``replicate_weights`` from the round's channel key."""
    problem, T, eta, H = het_gaussian, 4, 0.1, 3
    alg = fj.bootstrap(fj.fedlsa(eta, H), 2)
    key = jax.random.key(5)
    res = fj.simulate(
        key, problem, alg, T, 1, metrics={"rep1_x": lambda s, p: s.replicates.theta[1, 0]}, keep_seeds=1
    )
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    sA, sb = np.asarray(problem.noise_A), np.asarray(problem.noise_b)
    main, rep = np.zeros(3), np.zeros(3)
    mains, reps = [main], [rep]
    for t in range(T):
        z = round_randomness(problem, key, 0, t, H).reshape(3, H, -1)
        w = np.asarray(replicate_weights(_round_keys(key, 0, t)[1], alg.config, 3, problem.dtype))[1]
        new = []
        for theta, weights in ((main, np.ones((3, H))), (rep, w)):
            local = []
            for c in range(3):
                th = theta.copy()
                for h in range(H):
                    g = A[c] @ th - b[c] + np.sqrt(sA[c] ** 2 * (th @ th) + sb[c] ** 2) * z[c, h]
                    th = th - eta * weights[c, h] * g
                local.append(th)
            new.append(np.mean(local, axis=0))
        main, rep = new
        mains.append(main)
        reps.append(rep)
    np.testing.assert_allclose(res.final_theta[0], mains[-1], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(
        res.metrics["rep1_x"].seeds[:, 0], np.array(reps)[:, 0], rtol=1e-11, atol=1e-13
    )


@pytest.mark.parametrize("law", ["beta", "rademacher", "exponential", "gaussian"])
def test_weight_moments(law):
    alg = fj.bootstrap(fj.fedlsa(0.1, 64), 64, weights=law)
    w = np.asarray(replicate_weights(jax.random.key(0), alg.config, 64, jnp.float64)).ravel()  # 2^18 draws
    n = w.size
    for k, exact in ((1, 0.0), (2, 1.0)):  # E[w - 1] = 0, E[(w - 1)^2] = 1
        x = (w - 1.0) ** k
        assert abs(x.mean() - exact) <= Z_TOL * x.std() / np.sqrt(n) + 1e-12, (k, x.mean())
    if law == "beta":  # the standardized Beta(1/2, 2): its skewness and its support
        a, b_ = 0.5, 2.0
        skew = 2 * (b_ - a) * np.sqrt(a + b_ + 1) / ((a + b_ + 2) * np.sqrt(a * b_))
        x = (w - 1.0) ** 3
        assert abs(x.mean() - skew) < Z_TOL * x.std() / np.sqrt(n)
        assert w.min() >= 1 - np.sqrt(7 / 8) - 1e-12
        # power: a standardized Gamma(1/2) (skewness 2 sqrt 2) is far outside
        assert abs(2 * np.sqrt(2) - x.mean()) > 10 * Z_TOL * x.std() / np.sqrt(n)


def test_bootstrap_variance_approaches_the_exact_variance():
    """Homogeneous Gaussian LSA, FedLSA with eta = 0.05 and H = 2 from theta = 0: the seeds' mean of
    ``(1/B) sum_b (u^T (theta^b_t - theta_t))^2`` against ``u^T Cov(theta_t) u``. The start's
    deterministic drift makes the bootstrap overstate the variance at first (ratio 1.5 at t = 10);
    by t = 60 the ratio is within [0.8, 1.25]."""
    problem = fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=0.0, noise_A=0.2, noise_b=0.5
    )
    u = np.array([1.0, 0.0, 0.0])
    alg, T = fj.fedlsa(0.05, 2), 60
    res = fj.simulate(
        jax.random.key(1),
        problem,
        fj.bootstrap(alg, 100),
        T,
        200,
        metrics={"bv": fj.inference.bootstrap_variance(u)},
        record_every=10,
    )
    exact = np.einsum("i,tij,j->t", u, fj.theory.exact_covariance(problem, alg, T), u)[res.rounds[1:]]
    ratio, sem = res.metrics["bv"].mean[1:] / exact, res.metrics["bv"].sem[1:] / exact
    assert ratio[0] - Z_TOL * sem[0] > 1.25, ratio  # t = 10: still far
    assert 0.8 <= ratio[-1] - Z_TOL * sem[-1] and ratio[-1] + Z_TOL * sem[-1] <= 1.25, ratio  # t = 60


def test_exact_theory_is_the_algorithms(het_gaussian):
    alg = fj.scafflsa(0.1, 2)
    boot = fj.bootstrap(alg, 5)
    np.testing.assert_array_equal(
        fj.theory.exact_mse(het_gaussian, boot, 6), fj.theory.exact_mse(het_gaussian, alg, 6)
    )
    described = boot.describe()
    assert described["algorithm"] == "bootstrap_scafflsa"
    assert described["num_replicates"] == 5 and described["weights"] == "beta"
    assert described["inner"]["algorithm"] == "scafflsa"


def test_exact_covariance_is_the_mse_less_the_squared_bias(het_gaussian):
    alg, theta0 = fj.fedlsa(0.1, 3), np.array([1.0, -1.0, 0.5])
    cov = fj.theory.exact_covariance(het_gaussian, alg, 8, theta0)
    bias = fj.theory.exact_mean(het_gaussian, alg, 8, theta0) - np.asarray(het_gaussian.theta_star)
    mse = fj.theory.exact_mse(het_gaussian, alg, 8, theta0)
    np.testing.assert_allclose(
        np.trace(cov, axis1=1, axis2=2) + np.sum(bias**2, 1), mse, rtol=1e-12, atol=1e-15
    )
    assert np.all(np.linalg.eigvalsh(cov[1:]) > 0)


def unweighted_algorithm():
    base = fj.fedlsa(0.1, 2)
    return fj.Algorithm(base.config, "mine", base.init_fn, base.step_fn, base.theory)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: fj.bootstrap(fj.fedlsa(0.1, 2), 0), r"num_replicates=0 is invalid"),
        (lambda: fj.bootstrap(fj.fedlsa(0.1, 2), 2.5), r"num_replicates=2.5 is invalid"),
        (lambda: fj.bootstrap(fj.fedlsa(0.1, 2), 10, weights="poisson"), r"weights='poisson' is invalid"),
        (
            lambda: fj.bootstrap(fj.fedlsa(0.1, 2), 10, weights=lambda k, s, d: 2.0 * jnp.ones(s, d)),
            r"weights=.* is invalid: a weight law must have mean 1 and variance 1; .* mean 2 and variance 0",
        ),
        (
            lambda: fj.bootstrap(
                fj.fedlsa(0.1, 2), 10, weights=lambda k, s, d: jax.random.exponential(k, s, d) + 1
            ),
            r"draws have mean 1\.99\d* and variance",
        ),
        (lambda: fj.bootstrap(unweighted_algorithm(), 10), r"algorithm='mine' is invalid: .*weighted=True"),
        (lambda: fj.bootstrap("fedlsa", 10), r"algorithm='str' is invalid"),
        (
            lambda: fj.bootstrap(fj.plug_in(fj.fedlsa(0.1, 2)), 10),
            r"algorithm='plug_in_fedlsa' is invalid: .* wrap the other way, "
            r"fj.plug_in\(fj.bootstrap\(fedlsa, B\)\)",
        ),
        (lambda: fj.inference.bootstrap_variance([0.0, 0.0]), r"direction=.* is invalid"),
    ],
)
def test_bad_input_is_a_one_line_error(build, match):
    with pytest.raises(ValueError, match=match) as err:
        build()
    assert "\n" not in str(err.value)


def test_too_many_replicates_for_memory_are_refused_before_compiling():
    problem = garnet("generative")
    alg = fj.bootstrap(fj.fedlsa(0.1, 2), 100_000)
    with pytest.raises(
        ValueError, match=r"num_replicates=100000 is invalid: one seed .* GiB .* memory_budget"
    ) as err:
        fj.simulate(0, problem, alg, 3, 4, execution=fj.Execution(memory_budget=2**20))
    assert "\n" not in str(err.value)


def test_command_line(tmp_path, capsys):
    """``--bootstrap B --bootstrap-weights``: the recorded configuration, the main trajectory of the
    plain run; ``--bootstrap-weights`` without ``--bootstrap`` exits 2 naming it."""
    from fedsa_jax.cli import main

    args = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "4"]
    args += ["--rounds", "3", "--local-steps", "2", "--algorithms", "fedlsa"]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--bootstrap", "3", "--bootstrap-weights", "ones", "--out", str(tmp_path / "b")]) == 0
    plain = fj.load(tmp_path / "plain" / "result_fedlsa.npz")
    boot = fj.load(tmp_path / "b" / "result_bootstrap_fedlsa.npz")
    assert boot.config["algorithm"]["num_replicates"] == 3 and boot.config["algorithm"]["weights"] == "ones"
    np.testing.assert_array_equal(boot.final_theta, plain.final_theta)
    capsys.readouterr()
    assert main([*args, "--bootstrap-weights", "gaussian", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--bootstrap-weights='gaussian' is invalid: it is read only with --bootstrap" in err


def test_command_line_prints_the_coverage(tmp_path, capsys):
    """``--bootstrap B --plug-in --level L --direction U``: one line per algorithm with each
    interval's coverage of ``u^T theta*``, equal to the result's ``covers_*`` metric at the last round
    (and in summary.json); ``--level`` outside (0, 1), a ``--direction`` of the wrong length or
    index, and ``--level`` without an interval are one-line errors that run nothing."""
    import json

    from fedsa_jax.cli import main

    args = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "16"]
    args += ["--rounds", "6", "--local-steps", "2", "--algorithms", "fedlsa", "--no-plot"]
    out = tmp_path / "b"
    run = [
        *args,
        "--bootstrap",
        "20",
        "--plug-in",
        "--level",
        "0.8",
        "--direction",
        "1,-1",
        "--out",
        str(out),
    ]
    assert main(run) == 0
    out_text = capsys.readouterr().out
    lines = [line for line in out_text.splitlines() if "coverage" in line]
    assert len(lines) == 1 and "at level 0.8 (u: --direction 1,-1)" in lines[0], lines
    assert "agent-steps/s warm (" in out_text and "counting the 20 replicates' steps)" in out_text
    res = fj.load(out / "result_plug_in_bootstrap_fedlsa.npz")
    summary = json.loads((out / "summary.json").read_text())["runs"]["plug_in_bootstrap_fedlsa"]["coverage"]
    for method in ("quantile", "normal", "plug_in"):
        stats = res.metrics[f"covers_{method}_8"]
        assert f"{method} {stats.mean[-1]:.3f} +- {stats.sem[-1]:.3f}" in lines[0]
        assert summary[method] == {"coverage": stats.mean[-1], "sem": stats.sem[-1]}
    u = np.array([1.0, -1.0])
    lower, upper = res.metrics["lower_normal_8"].mean[-1], res.metrics["upper_normal_8"].mean[-1]
    assert lower < res.theta_mean[-1] @ u < upper  # the interval along the direction given
    for bad, match in (
        (["--bootstrap", "5", "--level", "1"], "argument --level: expected a number in (0, 1), got '1'"),
        (["--bootstrap", "5", "--direction", "1,2,3"], "--direction='1,2,3' is invalid: expected 2"),
        (["--bootstrap", "5", "--direction", "2"], "--direction='2' is invalid: expected a coordinate index"),
        (["--level", "0.9"], "--level=0.9 is invalid: it is read only with --bootstrap or --plug-in"),
    ):
        try:
            code = main([*args, *bad, "--out", str(tmp_path / "x")])
        except SystemExit as exit:  # the parser's own errors
            code = exit.code
        assert code == 2
        captured = capsys.readouterr()
        assert match in captured.err and captured.out == "", (bad, captured.err)
        assert len(captured.err.strip().splitlines()) == 1


def test_the_command_line_says_when_the_intervals_are_centred_off_their_target():
    """``_centre_note``: no note where the seeds' mean ``u^T theta_T`` lies within the widest interval's
    mean half-width of ``u^T theta*``; beyond it, "has not reached its limit" where the MSE still falls
    or the mean still moves (from the recorded round nearest T/2 to T, beyond 4.5 s.e.), "its limit is
    biased" where both have settled, and either with rounds 0 and T alone recorded."""
    from types import SimpleNamespace

    from fedsa_jax.cli.run import _centre_note

    def result(theta_along_u, mse, rounds=(0, 5, 10)):
        R = len(rounds)
        return SimpleNamespace(
            rounds=np.array(rounds),
            theta_mean=np.array([[x, 7.0] for x in theta_along_u]),
            theta_sem=np.full((R, 2), 0.01),
            mse_mean=np.array(mse, float),
            mse_sem=np.full(R, 0.01),
            metrics={
                "lower_normal_9": SimpleNamespace(mean=np.array([-0.5])),
                "upper_normal_9": SimpleNamespace(mean=np.array([1.5])),
            },
        )  # the interval's mean half-width is 1

    args, problem = SimpleNamespace(direction="0"), SimpleNamespace(dim=2, theta_star=np.zeros(2))
    note = lambda res: _centre_note(args, res, problem, ["normal_9"])  # noqa: E731
    assert note(result([5.0, 0.9, 0.9], [9.0, 1.0, 1.0])) is None  # within the half-width
    assert note(result([5.0, -0.9, -0.9], [9.0, 1.0, 1.0])) is None
    transient = note(result([9.0, 4.0, 3.0], [9.0, 5.0, 4.9]))  # the mean moves by 1 (s.e. 0.014)
    assert "off u^T theta* by 3, 3 times the widest interval's mean half-width 1" in transient
    assert "has not reached its limit (from round 5 to 10 the MSE went from 5 to 4.9" in transient
    assert "has not reached its limit" in note(result([9.0, 3.0, 3.0], [9.0, 6.0, 4.0]))  # MSE falls
    biased = note(result([9.0, 3.0, 3.02], [9.0, 4.0, 4.0]))  # settled within 4.5 s.e.
    assert "stopped moving (MSE 4): its limit is biased" in biased
    assert "record more rounds to tell" in note(result([9.0, 3.0], [9.0, 4.0], rounds=(0, 10)))
