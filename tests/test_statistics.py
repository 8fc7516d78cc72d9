"""Monte Carlo statistics for claims: paired comparisons on common random numbers (``fj.compare``),
precision-targeted runs (``fj.until``), intervals and rate fits, checked against exact values."""

import numpy as np
import optax
import pytest
from conftest import Z_TOL

import fedsa_jax as fj

T, EVERY = 12, 4


@pytest.fixture(scope="module")
def pair_run(het_gaussian):
    """FedLSA, SCAFFLSA, a second identical FedLSA and FedLSA with server momentum, on the same seeds,
    every seed kept."""
    algorithms = {
        "FedLSA": fj.fedlsa(0.1, 3),
        "SCAFFLSA": fj.scafflsa(0.1, 3),
        "FedLSA again": fj.fedlsa(0.1, 3),
        "momentum": fj.fedlsa(0.1, 3, server_optimizer=optax.sgd(1.0, momentum=0.5)),
    }
    return fj.compare(0, het_gaussian, algorithms, T, 24, record_every=EVERY, keep_seeds=24)


def test_identical_algorithms_differ_by_exactly_zero(pair_run):
    d = pair_run.difference("FedLSA", "FedLSA again")
    assert np.all(d.mean == 0.0) and np.all(d.sem == 0.0)
    assert np.all(d.num_pairs == 24)


@pytest.mark.parametrize("other", ["SCAFFLSA", "momentum"])
def test_paired_sem_is_the_std_of_kept_differences(pair_run, other):
    d = pair_run.difference("FedLSA", other)
    per_seed = pair_run.results["FedLSA"].seed_mse - pair_run.results[other].seed_mse  # (R, 24)
    np.testing.assert_allclose(d.mean, per_seed.mean(axis=1), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(d.sem, per_seed.std(axis=1, ddof=1) / np.sqrt(24), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(d.seeds, per_seed)
    assert np.all(d.sem[1:] > 0)
    reverse = pair_run.difference(other, "FedLSA")
    np.testing.assert_array_equal(reverse.mean, -d.mean)
    np.testing.assert_array_equal(reverse.sem, d.sem)


def test_compared_results_are_the_lone_runs(pair_run, het_gaussian):
    """Each algorithm of a comparison sees the seeds it sees alone (common random numbers)."""
    for name, alg in [("SCAFFLSA", fj.scafflsa(0.1, 3)), ("momentum", None)]:
        if alg is None:
            alg = fj.fedlsa(0.1, 3, server_optimizer=optax.sgd(1.0, momentum=0.5))
        alone = fj.simulate(0, het_gaussian, alg, T, 24, record_every=EVERY, keep_seeds=24)
        got = pair_run.results[name]
        np.testing.assert_allclose(got.seed_mse, alone.seed_mse, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got.final_theta, alone.final_theta, rtol=1e-12, atol=1e-15)
        assert got.config["compare"]["algorithms"] == list(pair_run.results)


def test_ratio_interval_holds_the_ratio(pair_run):
    d = pair_run.difference("FedLSA", "SCAFFLSA")
    low, high = d.ratio_interval(0.95)
    ratio = pair_run.results["FedLSA"].mse_mean / pair_run.results["SCAFFLSA"].mse_mean
    np.testing.assert_allclose(d.ratio, ratio)
    assert np.all(low[1:] < ratio[1:]) and np.all(ratio[1:] < high[1:])
    narrow = d.ratio_interval(0.5)
    assert np.all(narrow[0][1:] > low[1:]) and np.all(narrow[1][1:] < high[1:])


def test_ratio_interval_uses_the_covariance_with_its_sign(pair_run, het_gaussian):
    """The ratio interval's width is the delta method's from the kept per-seed squared errors x_i
    (FedLSA), y_i (SCAFFLSA): ``Var log(m_x / m_y) = (V_x / m_x^2 + V_y / m_y^2 - 2 C_xy / (m_x m_y)) / n``
    with sample (co)variances; common random numbers make C_xy > 0, so the sign matters (+2 C would
    widen it by over 10 % here). Its coverage of the exact ratio (exact_mse of each), over 100
    independent comparisons of 32 seeds at level 0.9, is within 4.5 binomial s.e. of 0.9."""
    from scipy import stats as scipy_stats

    d = pair_run.difference("FedLSA", "SCAFFLSA")
    x, y = pair_run.results["FedLSA"].seed_mse, pair_run.results["SCAFFLSA"].seed_mse  # (R, 24)
    n = x.shape[1]
    mx, my = x.mean(1), y.mean(1)
    cxy = np.array([np.cov(a, b)[0, 1] for a, b in zip(x, y)])
    var = (x.var(1, ddof=1) / mx**2 + y.var(1, ddof=1) / my**2 - 2 * cxy / (mx * my)) / n
    z = scipy_stats.norm.ppf(0.975)
    low, high = d.ratio_interval(0.95)
    np.testing.assert_allclose(np.log(high[1:] / low[1:]), 2 * z * np.sqrt(var[1:]), rtol=1e-8)
    wrong = var + 4 * cxy / (mx * my) / n
    assert np.all(cxy[1:] > 0) and np.all(np.sqrt(wrong[1:] / var[1:]) > 1.1)

    algs = {"FedLSA": fj.fedlsa(0.1, 3), "SCAFFLSA": fj.scafflsa(0.1, 3)}
    exact = (
        fj.theory.exact_mse(het_gaussian, algs["FedLSA"], T)[T]
        / fj.theory.exact_mse(het_gaussian, algs["SCAFFLSA"], T)[T]
    )
    reps, level, hits = 100, 0.9, 0
    for rep in range(reps):
        diff = fj.compare(100 + rep, het_gaussian, algs, T, 32, record_every=T).difference(
            "FedLSA", "SCAFFLSA"
        )
        lo, hi = diff.ratio_interval(level)
        hits += int(lo[-1] <= exact <= hi[-1])
    assert abs(hits / reps - level) <= 4.5 * np.sqrt(level * (1 - level) / reps), hits


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: fj.compare(0, p, {"A": fj.fedlsa(0.1, 1)}, 3, 4), "algorithms="),
        (lambda p: fj.compare(0, p, [fj.fedlsa(0.1, 1)] * 2, 3, 4), "algorithms="),  # pyright: ignore
        (lambda p: fj.compare(0, p, {"A": fj.fedlsa(0.1, 1), 3: fj.fedlsa(0.1, 1)}, 3, 4), "algorithms="),  # pyright: ignore
        (lambda p: fj.compare(0, p, {"A": fj.fedlsa(0.1, 1), "B": 1}, 3, 4), "algorithm="),  # pyright: ignore
        (
            lambda p: fj.compare(0, p, {"A": fj.fedlsa(0.1, 1), "B": fj.fedlsa(0.1, 1)}, 3, 4, every=2),
            "options=",
        ),
        (
            lambda p: fj.compare(0, p, {"A": fj.fedlsa(0.1, 1), "B": fj.fedlsa(0.1, 1)}, 3, fj.until()),
            "num_seeds=",
        ),
        (lambda p: fj.compare(0, p, {"A": fj.fedlsa(0.1, 1), "B": fj.fedlsa(0.1, 1)}, 3, 0), "num_seeds="),
    ],
)
def test_compare_refuses_bad_input_in_one_line(het_gaussian, call, message):
    with pytest.raises(ValueError, match=message) as err:
        call(het_gaussian)
    assert "\n" not in str(err.value)


def test_difference_refuses_unknown_names(pair_run):
    for a, b, message in [
        ("FedLSA", "nope", "name_b="),
        ("x", "FedLSA", "name_a="),
        ("FedLSA", "FedLSA", "name_b="),
    ]:
        with pytest.raises(ValueError, match=message):
            pair_run.difference(a, b)
    with pytest.raises(ValueError, match="level="):
        pair_run.difference("FedLSA", "SCAFFLSA").ratio_interval(1.0)


# ---- precision-targeted runs


def test_until_meets_its_target_and_is_the_fixed_count_run(het_gaussian):
    alg = fj.scafflsa(0.1, 2)
    target = fj.until(rel_sem=0.08, max_seeds=4096, min_seeds=16)
    res = fj.simulate(1, het_gaussian, alg, T, target, record_every=EVERY, seed_batch_size=16)
    assert res.config["until"]["stopped"] == "target met"
    assert np.all(res.mse_sem <= 0.08 * res.mse_mean)
    n = res.num_seeds
    assert n % 16 == 0 and 16 < n < 4096 and res.config["num_seeds"] == n
    fixed = fj.simulate(1, het_gaussian, alg, T, n, record_every=EVERY, seed_batch_size=16)
    for field in ("mse_mean", "mse_sem", "theta_mean", "final_theta", "mse_quantiles", "samples"):
        np.testing.assert_array_equal(getattr(res, field), getattr(fixed, field))
    fewer = fj.simulate(1, het_gaussian, alg, T, n - 16, record_every=EVERY, seed_batch_size=16)
    assert not np.all(fewer.mse_sem <= 0.08 * fewer.mse_mean)  # it stopped at the first batch that met it
    exact = fj.theory.exact_mse(het_gaussian, alg, T)[res.rounds]
    assert np.all(np.abs(res.mse_mean - exact) <= Z_TOL * res.mse_sem + 1e-12 * exact)


def test_until_stops_at_max_seeds_and_at_named_rounds(het_gaussian):
    alg = fj.fedlsa(0.1, 2)
    capped = fj.simulate(
        0, het_gaussian, alg, T, fj.until(1e-6, max_seeds=40), record_every=EVERY, seed_batch_size=16
    )
    assert capped.num_seeds == 40 and capped.config["until"]["stopped"] == "max_seeds"
    early = fj.until(rel_sem=0.05, max_seeds=10**5, rounds=[4], min_seeds=16)
    res = fj.simulate(0, het_gaussian, alg, T, early, record_every=EVERY, seed_batch_size=16)
    assert res.mse_sem[1] <= 0.05 * res.mse_mean[1] and res.config["until"]["rounds"] == [4]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rel_sem=0.0), "rel_sem="),
        (dict(rel_sem=float("nan")), "rel_sem="),
        (dict(rel_sem="x"), "rel_sem="),
        (dict(max_seeds=1), "max_seeds="),
        (dict(max_seeds=2**31), "max_seeds="),
        (dict(max_seeds=100, min_seeds=200), "min_seeds="),
        (dict(rounds=[]), "rounds="),
        (dict(rounds=[1.5]), "rounds="),
        (dict(rounds=[-1]), "rounds="),
    ],
)
def test_until_refuses_bad_values_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        fj.until(**kwargs)
    assert "\n" not in str(err.value)


def test_until_refuses_rounds_not_recorded_and_sweeps(het_gaussian):
    with pytest.raises(ValueError, match=r"until\.rounds=.*round 5 is not recorded"):
        fj.simulate(0, het_gaussian, fj.fedlsa(0.1, 1), T, fj.until(rounds=[5]), record_every=EVERY)
    configs = fj.grid(step_size=[0.05, 0.1])
    with pytest.raises(ValueError, match=r"num_seeds=Until\(.* is invalid: expected a count"):
        fj.sweep(0, configs, lambda c: (het_gaussian, fj.fedlsa(c["step_size"], 1)), T, fj.until())


# ---- intervals, fits and their coverage


def test_mse_interval_t_and_bootstrap(het_gaussian, tmp_path):
    res = fj.simulate(0, het_gaussian, fj.scafflsa(0.1, 3), T, 40, record_every=EVERY, keep_seeds=40)
    low, high = res.mse_interval(0.95, "t")
    values = res.seed_mse
    from scipy import stats

    half = stats.t.ppf(0.975, 39) * values.std(axis=1, ddof=1) / np.sqrt(40)
    np.testing.assert_allclose(low, values.mean(axis=1) - half, rtol=1e-12)
    np.testing.assert_allclose(high, values.mean(axis=1) + half, rtol=1e-12)
    b_low, b_high = res.mse_interval(0.95, "bootstrap")
    assert np.all(b_low[1:] < res.mse_mean[1:]) and np.all(res.mse_mean[1:] < b_high[1:])
    assert b_low[0] == b_high[0] == res.mse_mean[0]  # every seed starts at theta0: no spread
    # the bootstrap leans towards the long right tail of a squared error
    assert np.all(b_high[1:] - res.mse_mean[1:] > res.mse_mean[1:] - b_low[1:])
    table = res.table()
    np.testing.assert_array_equal(table["mse_low"], low)
    np.testing.assert_array_equal(table["mse_high"], high)
    res.save(tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as data:
        np.testing.assert_array_equal(data["mse_low"], low)
    np.testing.assert_array_equal(fj.load(tmp_path / "r.npz").mse_interval()[1], high)


def test_mse_interval_refuses_bad_values(het_gaussian, tmp_path):
    res = fj.simulate(0, het_gaussian, fj.fedlsa(0.1, 1), 4, 6, keep_seeds=3)
    for kwargs, message in [
        (dict(level=1.0), "level="),
        (dict(level=0), "level="),
        (dict(method="percentile"), "method="),
        (dict(method="bootstrap"), r"method='bootstrap' is invalid: .*3 of 6 seeds kept"),
    ]:
        with pytest.raises(ValueError, match=message):
            res.mse_interval(**kwargs)
    res.save(tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as data:
        arrays = dict(data)
    arrays["mse_low"] = arrays["mse_low"][:-1]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="mse_low has shape"):
        fj.load(tmp_path / "bad.npz")


def test_rate_of_the_decreasing_step_recovers_the_exact_slope(het_gaussian):
    """benchmarks/averaging.py's decreasing step eta_k = eta0 / (1 + k / k0), started at theta_star (the
    MSE then decays like 1/k): the fitted slope's interval holds the exact curve's slope, with every
    seed kept (bootstrap) and from the standard errors alone (bound)."""
    alg = fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=0.5, k0=20.0), 2)
    start = np.asarray(het_gaussian.theta_star)
    kept = fj.simulate(0, het_gaussian, alg, 200, 256, theta0=start, record_every=10, keep_seeds=256)
    streamed = fj.simulate(0, het_gaussian, alg, 200, 256, theta0=start, record_every=10)
    exact = fj.theory.exact_mse(het_gaussian, alg, 200, theta0=start)
    pick = kept.rounds >= 50
    exact_slope = np.polyfit(np.log(kept.rounds[pick]), np.log(exact[kept.rounds[pick]]), 1)[0]
    for res, method in [(kept, "bootstrap"), (streamed, "bound")]:
        fit = fj.stats.rate(res, rounds=(50, 200))
        assert method in fit.method
        low, high = fit.interval
        assert low < exact_slope < high and high < 0  # the decay is resolved
    assert fj.stats.rate(kept, rounds=(50, 200)).slope == fj.stats.rate(streamed, rounds=(50, 200)).slope
    with pytest.raises(ValueError, match="rounds="):
        fj.stats.rate(kept, rounds=(200, 50))
    with pytest.raises(ValueError, match="rounds="):
        fj.stats.rate(kept, rounds=(195, 199))
    with pytest.raises(ValueError, match="t0="):
        fj.stats.rate(kept, t0=-1.0)
    with pytest.raises(ValueError, match="resamples="):
        fj.stats.rate(kept, resamples=10)


def test_speedup_and_wilson_from_their_formulas():
    from types import SimpleNamespace

    results = {
        n: SimpleNamespace(
            rounds=np.array([0, 10]), mse_mean=np.array([1.0, 2.0 / n]), mse_sem=np.array([0, 0.02 / n])
        )
        for n in (1, 10, 100)
    }
    fit = fj.stats.speedup(results)
    assert fit.slope == pytest.approx(-1.0, abs=1e-12)  # MSE ~ 1/N: linear speed-up
    # Var(slope) = sum_N w_N^2 (s/m)^2 with w the least-squares weights of log N and s/m = 0.01
    x = np.log([1.0, 10.0, 100.0])
    w = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    half = 1.959963984540054 * 0.01 * np.sqrt(np.sum(w**2))
    np.testing.assert_allclose(fit.interval, (-1 - half, -1 + half), rtol=1e-9)
    low, high = fj.stats.wilson_interval(np.array([0, 5, 10]), 10)
    np.testing.assert_allclose(high[0], 1.959963984540054**2 / (10 + 1.959963984540054**2))
    assert low[0] == 0.0 and high[2] == 1.0 and low[1] < 0.5 < high[1]
    np.testing.assert_allclose(low[1] + high[1], 1.0)  # symmetric around 1/2
    res = SimpleNamespace(num_diverged=np.array([0, 3]), num_seeds=10)
    p, lo, hi = fj.stats.divergence(res)
    np.testing.assert_array_equal(p, [0.0, 0.3])
    with pytest.raises(ValueError, match="results="):
        fj.stats.speedup({10: results[10]})
    with pytest.raises(ValueError, match="round=5 is invalid"):
        fj.stats.speedup(results, round=5)
    assert fj.stats.speedup(results, round=10).slope == fit.slope


def test_recommended_interval_covers_the_exact_mse(het_gaussian):
    """400 independent 64-seed runs (seeds 64k .. 64k + 63 of one run of 25600 seeds, every seed kept) of
    SCAFFLSA on Gaussian LSA: the t interval (the one the docs recommend from 64 seeds) contains
    exact_mse in 95 % of them, within 3 binomial standard errors (0.033), early and late."""
    from fedsa_jax.stats import t_interval

    problem = het_gaussian  # random_gaussian_lsa(key(3), 3 agents, d=3), as benchmarks/coverage.py
    alg, reps, n = fj.scafflsa(0.1, 3), 400, 64
    res = fj.simulate(
        7, problem, alg, 20, reps * n, record_every=2, keep_seeds=reps * n, seed_batch_size=reps * n
    )
    exact = fj.theory.exact_mse(problem, alg, 20)
    for t in (2, 20):
        values = res.seed_mse[t // 2].reshape(reps, n)
        low, high = t_interval(values.mean(axis=1), values.std(axis=1, ddof=1) / np.sqrt(n), n)
        covered = np.mean((low <= exact[t]) & (exact[t] <= high))
        assert abs(covered - 0.95) <= 3 * np.sqrt(0.95 * 0.05 / reps), (t, covered)


def test_compare_resumes_from_its_checkpoint(het_gaussian, tmp_path):
    """A comparison's checkpoint holds every algorithm's carry (a tuple) and the pairs' statistics: an
    interrupted run resumes where it stopped and ends as the uninterrupted one, bitwise."""
    algs = {"A": fj.fedlsa(0.1, 2), "B": fj.scafflsa(0.1, 2)}
    options = dict(record_every=2, chunk_rounds=4, seed_batch_size=4, checkpoint_dir=tmp_path)
    whole = fj.compare(0, het_gaussian, algs, T, 8, record_every=2, seed_batch_size=4)

    class Stop(Exception):
        pass

    def stop_in_second_batch(record):
        if record.batch == 1 and record.rounds[-1] >= 4:
            raise Stop

    with pytest.raises(Stop):
        fj.compare(0, het_gaussian, algs, T, 8, on_record=stop_in_second_batch, **options)
    again = fj.compare(0, het_gaussian, algs, T, 8, **options)
    assert again.results["A"].config["execution"]["resumed_from"] == {"seed_batch": 1, "round": 4}
    for name in algs:
        np.testing.assert_array_equal(again.results[name].mse_mean, whole.results[name].mse_mean)
        np.testing.assert_array_equal(again.results[name].final_theta, whole.results[name].final_theta)
    np.testing.assert_array_equal(again.difference("A", "B").sem, whole.difference("A", "B").sem)


def test_rate_refuses_a_diverged_curve_and_warns_at_the_rounding_floor():
    """A curve through rounds where every seed diverged (mean MSE NaN) is refused, naming the round;
    SCAFFLSA on a noise-free heterogeneous problem reaches theta* up to float64 rounding (a constant
    1.7e-32 from round 30, alike over seeds): its slope is warned of, naming the rounds, while the
    rounds before the floor fit without a word."""
    import warnings

    A = np.array([[[1.0, 0.2], [0.0, 0.8]], [[0.8, 0.1], [0.0, 1.2]]])
    star = np.array([3.0, -4.0])
    b = np.einsum("cij,j->ci", A, star) + np.array([[0.3, -0.2], [-0.3, 0.2]])
    clean = fj.problems.gaussian_lsa(A, b, noise_A=0.0, noise_b=0.0, dtype="float64")  # x64: conftest
    res = fj.simulate(0, clean, fj.scafflsa(0.5, 2), 200, 4, record_every=10, keep_seeds=4)
    assert np.all(res.mse_mean[3:] < 1e-30)
    with pytest.warns(
        RuntimeWarning, match=r"recorded rounds 30\.\.200 \(18 of 20\) is at float64's rounding floor"
    ):
        fj.stats.rate(res, rounds=(10, 200))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fj.stats.rate(res, rounds=(0, 20), t0=1.0).slope < 0
    noisy = fj.problems.gaussian_lsa(A, b, noise_A=0.5, noise_b=0.5)
    with pytest.warns(RuntimeWarning, match="4 of 4 seeds diverged"):
        blown = fj.simulate(0, noisy, fj.fedlsa(3.0, 4), 40, 4, record_every=10, divergence_threshold=1e6)
    assert blown.num_diverged[-1] == 4 and np.isnan(blown.mse_mean[-1])
    with pytest.raises(
        ValueError, match=r"rounds=None is invalid: the mean MSE is nan at recorded round \d+ \(4 of 4"
    ):
        fj.stats.rate(blown)
