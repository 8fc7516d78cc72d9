"""A run whose MSE grows by orders of magnitude says so, in the library and on the command line, though
no seed is non-finite; a stable run, one started at theta_star and one whose seeds diverge do not get
that warning; the t interval over the seeds that did not diverge."""

import warnings

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

import fedsa_jax as fj
from fedsa_jax import cli
from fedsa_jax._runtime.growth import GROWTH_FACTOR, mse_growth

KEY = jax.random.key(0)
ROUNDS, EVERY = 50, 10


@pytest.fixture(scope="module")
def problem():
    return fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=3, dim=4, heterogeneity=1.0)


def blowing_up(error_feedback="ef14"):
    """SCAFFLSA with top-1 of 4 coordinates and error feedback: the MSE grows about 10x every 10 rounds
    (the control variates' loop with the memory's delay is unstable, docs/guide/algorithms.md)."""
    return fj.scafflsa(0.3, 2, quantizer=fj.channel.top_k(1), error_feedback=error_feedback)


def run(problem, alg, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fj.simulate(KEY, problem, alg, ROUNDS, 8, record_every=EVERY, **kw)
    return res, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_blow_up_warns_naming_algorithm_rounds_and_factor(problem):
    res, messages = run(problem, blowing_up())
    assert int(res.num_diverged.max()) == 0 and np.all(np.isfinite(res.mse_mean))
    factor = res.mse_mean[-1] / res.mse_mean[0]
    assert factor > GROWTH_FACTOR
    assert len(messages) == 1, messages
    text = messages[0]
    assert text.startswith("scafflsa (") and f"grew {factor:.2g}x from round 0 to {ROUNDS}" in text, text
    assert "since round 20" in text and len(text) <= 500 and "\n" not in text


def test_stable_runs_do_not_warn(problem):
    """Top-k without error feedback (stable, biased), FedLSA with EF14, and a run started at theta_star
    (its MSE rises from 0 to its noise floor: no baseline at round 0) warn of nothing."""
    star = np.asarray(problem.theta_star)
    for alg, theta0 in (
        (fj.scafflsa(0.3, 2, quantizer=fj.channel.top_k(1)), None),
        (fj.fedlsa(0.3, 2, quantizer=fj.channel.top_k(1), error_feedback="ef14"), None),
        (fj.scafflsa(0.05, 2), star),
    ):
        res, messages = run(problem, alg, theta0=theta0)
        assert messages == [], (alg.name, messages)
    assert res.mse_mean[0] == 0 and res.mse_mean[-1] > 0  # the last one started at theta_star


def test_non_finite_seeds_get_the_diverged_warning(problem):
    res, messages = run(problem, fj.scafflsa(5.0, 2))
    assert int(res.num_diverged[-1]) == 8
    assert len(messages) == 1 and "seeds diverged" in messages[0], messages


def test_growth_rule():
    """Grown: the last value over 100x the first and 10x the middle one; a rise to a floor (from 0,
    at most doubling over the second half), NaN, and a record without a middle round are not."""
    rounds = np.arange(0, 70, 10)
    assert mse_growth(rounds, 2.0 * 3.0 ** np.arange(7)) is not None  # 729x, 27x since round 30
    assert mse_growth(rounds, 1.0 + 2.0 ** np.arange(7)) is None  # 32x the start only
    assert mse_growth(rounds, 1e3 * (1 - 0.9 ** (rounds + 0.0))) is None  # from 0 to a floor
    assert mse_growth(rounds, np.r_[1.0, 1.0, 1.0, 2.0, 50.0, 90.0, np.nan]) is None
    assert mse_growth([0, 50], [1.0, 1e6]) is None
    grown = mse_growth(rounds, np.r_[0.0, 0.0, 0.0, 0.0, 1.0, 5.0, 100.0])
    assert grown is not None and grown.factor == np.inf and "from round 0 to 60" in grown.summary()


def test_settled_rule():
    """Settled too high: the median of the second half's records at 5x or more the larger of the start
    and |theta_star|^2 (a FedBuff curve whose last record fell to 2.9x its start: its median is 6.1x);
    a converging run, a rise from theta_star to a floor below 5 |theta_star|^2, NaN, no reference
    (the blow-up rule only) are not."""
    rounds = np.arange(0, 70, 10)
    fedbuff = np.r_[4.36, 30.6, 44.1, 28.1, 34.4, 25.1, 12.7]
    settled = mse_growth(rounds, fedbuff, reference=4.36)
    assert settled is not None and settled.settled == np.median(fedbuff[3:]) and settled.base == 4.36
    assert settled.summary() == "stayed at 6.1x its start from round 30 to 60"
    assert mse_growth(rounds, fedbuff) is None  # not a blow-up
    assert mse_growth(rounds, fedbuff, reference=6.0) is None  # 26.6 < 5 x 6
    assert mse_growth(rounds, 7.5 * 0.5 ** np.arange(7), reference=7.5) is None  # converging
    from_star = np.r_[0.0, 1.0, 2.0, 2.0, 2.1, 1.9, 2.0]
    assert mse_growth(rounds, from_star, reference=1.0) is None  # its floor: 2 |theta_star|^2
    floor = mse_growth(rounds, from_star, reference=0.1)  # a floor at 20 |theta_star|^2
    assert floor is not None and floor.summary() == "stayed at 20x |theta_star|^2 from round 30 to 60"
    assert mse_growth(rounds, np.r_[1.0, 9, 9, np.nan, np.nan, np.nan, 9], reference=1.0) is None


def fedbuff_settling():
    """FedBuff with stragglers (durations 1 or 20): stale updates overshoot, the MSE stays 5-10x its
    start though no seed diverges (the lockstep guide's former command, at small sizes)."""
    return fj.fedbuff(0.2, 30, buffer_size=3, durations=fj.clock.straggler(1, 0.1, 20.0))


@pytest.fixture(scope="module")
def garnet():
    return fj.problems.garnet(jax.random.key(0), num_agents=4, num_states=6, dim=2)


def test_a_run_settling_far_above_its_start_warns_and_a_converging_one_does_not(garnet):
    def settle(alg):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = fj.simulate(KEY, garnet, alg, 60, 16, record_every=10)
        return res, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    res, messages = settle(fedbuff_settling())
    star = np.asarray(garnet.theta_star)
    ratio = np.median(res.mse_mean[3:]) / res.mse_mean[0]
    assert int(res.num_diverged.max()) == 0 and res.mse_mean[0] == star @ star and ratio > 5.5, ratio
    assert len(messages) == 1, messages
    text = messages[0]
    assert text.startswith(
        "fedbuff (step_size=0.2, num_local_steps=30, buffer_size=3, durations=straggler, staleness=0.5): "
        f"the MSE stayed at {ratio:.2g}x its start from round 30 to 60"
    ), text
    assert "step size or the local steps H are too large" in text and len(text) <= 500 and "\n" not in text
    for alg in (fj.fedbuff(0.2, 30, buffer_size=3), fj.fedlsa(0.2, 30)):  # the same without stragglers
        res, messages = settle(alg)
        assert messages == [] and res.mse_mean[-1] < res.mse_mean[0], (alg.name, messages, res.mse_mean)


def test_cli_blow_up_prints_the_warning_and_the_console_line_says_it(tmp_path, capsys):
    argv = ["run", "--problem", "gaussian", "--agents", "3", "--dim", "4", "--algorithms", "scafflsa"]
    argv += ["--step-size", "0.3", "--local-steps", "2", "--quantizer", "top-k", "--k", "1"]
    argv += ["--error-feedback", "ef14", "--rounds", str(ROUNDS), "--record-every", str(EVERY)]
    argv += ["--seeds", "8", "--dtype", "float64", "--no-plot", "--out", str(tmp_path)]
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # shown by the command line, one line each
        assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    (err,) = [line for line in err.splitlines() if not line.startswith("scafflsa: ")]  # no progress lines
    assert err.startswith("fedsa-jax: warning: scafflsa (") and f"x from round 0 to {ROUNDS}" in err, err
    assert len(err) <= 520
    line = next(line for line in out.splitlines() if line.startswith("scafflsa "))
    assert "0 diverged, but the MSE grew " in line and f"from round 0 to {ROUNDS}: blowing up" in line, line


def test_t_interval_counts_the_seeds_that_did_not_diverge(problem):
    """``mse_interval(method="t")``: Student's quantile at n - 1 degrees of freedom, n the seeds that did
    not diverge at that round (a divergence threshold that some seeds cross at each round and others do not;
    keep_seeds gives each seed's values)."""
    alg = fj.fedlsa(0.3, 2)
    res, messages = run(problem, alg, divergence_threshold=0.009, keep_seeds=8)
    n = res.num_seeds - res.num_diverged
    assert messages and np.all(n[1:] >= 2) and np.any((n > 1) & (n < 8)), n  # some seeds out, a few in
    star = np.asarray(problem.theta_star)
    threshold = 0.009 * (1 + 2 * star @ star)  # times 1 + |theta_star|^2 + |theta0 - theta_star|^2
    low, high = res.mse_interval(level=0.9)
    for r in np.flatnonzero(n >= 2):  # the interval from the kept per-seed values
        x = res.seed_mse[r][res.seed_mse[r] <= threshold]
        assert x.size == n[r]
        half = scipy_stats.t.ppf(0.95, x.size - 1) * np.std(x, ddof=1) / np.sqrt(x.size)
        np.testing.assert_allclose([low[r], high[r]], [x.mean() - half, x.mean() + half], rtol=1e-10)
        if x.size < 8:  # the test can tell the two apart
            assert abs(scipy_stats.t.ppf(0.95, x.size - 1) / scipy_stats.t.ppf(0.95, 7) - 1) > 0.01


def test_cli_settled_run_says_so_on_its_console_line(tmp_path, capsys):
    """The lockstep guide's former FedBuff command (stragglers of duration 20, staleness 0.5) at small
    sizes: the console line says the MSE stayed too high, the warning names the run in a few words."""
    argv = ["run", "--agents", "4", "--states", "6", "--dim", "2", "--algorithms", "fedbuff"]
    argv += [
        "--step-size",
        "0.2",
        "--local-steps",
        "30",
        "--buffer-size",
        "3",
        "--durations",
        "straggler:1,0.1,20",
    ]
    argv += ["--staleness", "0.5", "--rounds", "60", "--record-every", "10", "--seeds", "16"]
    argv += ["--dtype", "float64", "--no-plot", "--out", str(tmp_path)]
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # shown by the command line, one line each
        assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    (warned,) = [line for line in err.splitlines() if line.startswith("fedsa-jax: warning:")]
    assert warned.startswith("fedsa-jax: warning: fedbuff (step_size=0.2, num_local_steps=30, buffer_size=3")
    assert "too large" in warned, warned
    line = next(line for line in out.splitlines() if line.startswith("fedbuff "))
    assert (
        "0 diverged, but the MSE stayed at " in line and "its start from round 30 to 60: too high" in line
    ), line
