"""Differential privacy on the uplink (fj.channel.privacy, fj.accounting).

* Clipping: no delivered message exceeds C (local and central, with a quantizer in central mode).
* sigma = 0 with C = inf is no mechanism: the same configuration and run, bit for bit.
* The noise: its empirical covariance is sigma^2 C^2 I per message (local) and sigma^2 C^2 / N^2 I
  on the aggregate (central), within Z_TOL standard errors.
* The accountant's epsilon equals dp-accounting's for the same event, grows with the releases and
  falls with sigma; --target-epsilon's sigma meets the target.
* Monte Carlo within Z_TOL s.e. of exact_mse at every round for the unclipped Gaussian mechanism
  (local and central; Gaussian LSA and generative TD, float64, with erasures, a cohort, rand-k).
* The noise floor in closed form (discrete Lyapunov) against the exact stationary MSE, and its first
  order in eta (the error halves with eta).
* Adaptive clipping (Andrew et al. 2021): without noise the norm settles where the fraction of
  unclipped messages is the target quantile; the sum's noise multiplier is sigma_Delta; the
  accountant composes sigma; the norm is a metric.
* Bad input: a one-line error naming the argument, before compiling.
"""

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL
from dp_accounting import rdp
from dp_accounting.pld import PLDAccountant
from reference import assert_monte_carlo_matches_exact_jointly

import fedsa_jax as fj

KEY = jax.random.key(5)


def _transmit(messages, ch, n_keys=1):
    keys = jax.random.split(KEY, n_keys)
    return jax.vmap(lambda k: fj.channel.transmit(k, messages, ch))(keys)


@pytest.mark.parametrize("mode", ["local", "central"])
def test_clipped_messages_never_exceed_the_bound(mode):
    rng = np.random.default_rng(0)
    messages = jnp.asarray(rng.normal(size=(6, 4)) * np.array([[0.1], [1], [3], [10], [0.5], [100]]))
    q = fj.channel.stochastic_uniform(bits=2) if mode == "central" else None
    ch = fj.channel.channel(q, privacy=fj.channel.privacy(0.0, 1.5, mode))
    d = _transmit(messages, ch, 64)
    norms = np.linalg.norm(np.asarray(d.messages), axis=-1)
    assert norms.max() <= 1.5 * (1 + 1e-6)
    small = np.linalg.norm(np.asarray(messages), axis=-1) < 1.5
    if mode == "local":  # below the bound a message is sent as it is
        np.testing.assert_array_equal(np.asarray(d.messages)[0][small], np.asarray(messages)[small])


@pytest.mark.parametrize("mode", ["local", "central"])
def test_the_channel_counts_the_messages_clipping_shortens(mode):
    """``delivery.clipped`` is the number of sent messages of norm above C (norms 0.5, 1, 2, 3, 0 at
    C = 1: two; the one of norm exactly C is not shortened), over the cohort's agents only; lost
    messages count as sent (central: clipped on arrival); no clipping counts none."""
    messages = jnp.asarray([[0.5, 0.0], [0.6, 0.8], [0.0, 2.0], [3.0, 0.0], [0.0, 0.0]])
    p = fj.channel.privacy(0.3, 1.0, mode)
    for ch, cohort, expected in [
        (fj.channel.channel(privacy=p), None, 2),
        (fj.channel.channel(privacy=p), jnp.asarray([True, True, False, True, True]), 1),
        (fj.channel.channel(success_prob=0.2, privacy=p), None, 2),
        (fj.channel.channel(privacy=fj.channel.privacy(0.3, 1.0, mode, clip=False)), None, 0),
    ]:
        delivery = fj.channel.transmit(KEY, messages, ch, cohort=cohort)
        assert int(delivery.clipped) == expected, (cohort, ch)


@pytest.mark.parametrize(
    ("build", "clip_norm", "expected"),
    [
        (lambda p: fj.fedlsa(0.05, 3, privacy=p, clients_per_round=2), 1e-9, 1.0),  # the cohort's m = 2
        (lambda p: fj.fedlsa(0.05, 3, privacy=p), 1e9, 0.0),
        (lambda p: fj.scaffnew(0.05, 1.0, 3, privacy=p), 1e-9, 1.0),  # every local step communicates
    ],
)
def test_clipped_fraction_metric(het_gaussian, build, clip_norm, expected):
    """The metric ``"clipped_fraction"``: every message clipped at a tiny C (1 from round 1, round 0
    sent nothing), none at a huge one, through a cohort and Scaffnew's communications."""
    p = fj.channel.privacy(0.0, clip_norm, "local")  # no noise: a huge C runs
    res = fj.simulate(1, het_gaussian, build(p), 4, 8, metrics=["clipped_fraction"])
    np.testing.assert_array_equal(res.metrics["clipped_fraction"].mean, [0.0] + [expected] * 4)


def test_no_noise_and_no_bound_is_no_mechanism(het_gaussian):
    assert fj.channel.privacy(0.0, float("inf")) is None
    a = fj.simulate(
        1,
        het_gaussian,
        fj.fedlsa(0.05, 3, privacy=fj.channel.privacy(0.0, float("inf"))),
        5,
        16,
        keep_seeds=16,
    )
    b = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 3), 5, 16, keep_seeds=16)
    np.testing.assert_array_equal(a.seed_mse, b.seed_mse)
    assert a.config == b.config and a.privacy is None


def _check_covariance(samples, variance):
    """Entries of the empirical covariance of ``samples (n, d)`` (mean known to be 0) against
    ``variance * I`` within Z_TOL standard errors (Gaussian: Var(x_i^2) = 2 v^2, Var(x_i x_j) = v^2)."""
    n = samples.shape[0]
    cov = samples.T @ samples / n
    se = variance * np.where(np.eye(cov.shape[0], dtype=bool), np.sqrt(2.0), 1.0) / np.sqrt(n)
    z = (cov - variance * np.eye(cov.shape[0])) / se
    assert np.all(np.abs(z) < Z_TOL), z


def test_the_noise_has_the_mechanism_covariance():
    sigma, C, N, d = 0.8, 2.0, 5, 3
    zero = jnp.zeros((N, d), jnp.float64)
    local = _transmit(zero, fj.channel.channel(privacy=fj.channel.privacy(sigma, C, "local")), 4000)
    _check_covariance(np.asarray(local.messages).reshape(-1, d), (sigma * C) ** 2)
    central = fj.channel.channel(privacy=fj.channel.privacy(sigma, C, "central"))
    agg = jax.vmap(fj.channel.aggregate)(_transmit(zero, central, 20000))
    _check_covariance(np.asarray(agg), (sigma * C / N) ** 2)


def test_the_accountant_is_the_library():
    p = fj.channel.privacy(1.1, 1.0, "central")
    loss = fj.accounting.epsilon(p, 200, num_agents=10, delta=1e-5)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.1), 200))
    assert loss.epsilon == acc.get_epsilon(1e-5)
    wor = fj.accounting.epsilon(p, 200, num_agents=10, delta=1e-5, clients_per_round=3)
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(10, 3, dp_accounting.GaussianDpEvent(0.55))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, 200))
    assert wor.epsilon == acc.get_epsilon(1e-5) and wor.relation == "replace_one"
    local = fj.accounting.epsilon(fj.channel.privacy(1.1, 1.0, "local"), 200, num_agents=10)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(0.55), 200))
    assert local.epsilon == acc.get_epsilon(1e-5)
    pld = fj.accounting.epsilon(p, 200, num_agents=10, accountant="pld")
    assert 0 < pld.epsilon < loss.epsilon  # PLD is tighter than RDP


def _library_epsilon(event, relation, T, delta=1e-5, accountant=rdp.RdpAccountant):
    acc = accountant(neighboring_relation=getattr(dp_accounting.NeighboringRelation, relation))
    return acc.compose(dp_accounting.SelfComposedDpEvent(event, T)).get_epsilon(delta)


def test_a_cohort_reports_the_smaller_valid_bound():
    """Replace-one with a cohort: each release is at most a Gaussian of sensitivity 2C whether or not the
    agent was drawn (no amplification: add-or-remove at sigma / 2), or the library's amplified bound;
    the smaller is reported and its event recorded. m = 5 of 10, sigma = 5: 24.4 (no amplification)
    against 26.1; m = 1 of 100, sigma = 1: the amplified one; m = N is full participation."""
    T = 100
    cases = ((5.0, 10, 5, "GaussianDpEvent"), (1.0, 100, 1, "SampledWithoutReplacementDpEvent"))
    for sigma, N, m, expected in cases:
        loss = fj.accounting.epsilon(fj.channel.privacy(sigma, 1.0), T, N, clients_per_round=m)
        plain = _library_epsilon(dp_accounting.GaussianDpEvent(sigma / 2), "ADD_OR_REMOVE_ONE", T)
        sampled = dp_accounting.SampledWithoutReplacementDpEvent(
            N, m, dp_accounting.GaussianDpEvent(sigma / 2)
        )
        amplified = _library_epsilon(sampled, "REPLACE_ONE", T)
        assert loss.epsilon == min(plain, amplified) and loss.event == expected, (loss, plain, amplified)
        assert loss.relation == "replace_one"
        if N == 10:  # the calibration follows the same minimum
            target = 1.2 * loss.epsilon
            s = fj.accounting.noise_multiplier(target, T, N, clients_per_round=m)
            spent = fj.accounting.epsilon(fj.channel.privacy(s, 1.0), T, N, clients_per_round=m).epsilon
            assert spent <= target and spent == pytest.approx(target, rel=1e-3)
    assert abs(plain - amplified) > 0.5 * amplified  # power: the two bounds are far apart here
    p = fj.channel.privacy(5.0, 1.0)
    pld = fj.accounting.epsilon(
        p, T, 10, clients_per_round=5, accountant="pld"
    )  # no sampling: the plain bound
    expected = _library_epsilon(
        dp_accounting.GaussianDpEvent(2.5), "ADD_OR_REMOVE_ONE", T, 1e-5, PLDAccountant
    )
    assert pld.epsilon == expected and pld.event == "GaussianDpEvent"


def test_a_cohort_of_every_agent_is_full_participation():
    """clients_per_round = N: every agent every round, add or remove one at sigma (not a sample, not the
    replace-one bound at sigma / 2, which overstates epsilon)."""
    p = fj.channel.privacy(1.1, 1.0)
    full = fj.accounting.epsilon(p, 50, 10)
    assert fj.accounting.epsilon(p, 50, 10, clients_per_round=10) == full
    assert full.relation == "add_or_remove_one" and full.event == "GaussianDpEvent"
    sigma = fj.accounting.noise_multiplier(3.0, 50, 10, clients_per_round=10)
    assert sigma == fj.accounting.noise_multiplier(3.0, 50, 10)


def test_accounting_at_its_limits_is_a_number_or_one_line():
    """A huge noise multiplier costs about 0 (accounted at MAX_NOISE_MULTIPLIER, an upper bound: the
    library overflowed at 1e155); a target every sigma meets, and a PLD grid too large to hold
    (releases / sigma^2 above PLD_MAX_LOAD: 9 GB at 1000), are one-line errors before any work."""
    cap = fj.accounting.epsilon(fj.channel.privacy(fj.accounting.MAX_NOISE_MULTIPLIER, 1.0), 100, 10).epsilon
    for mode in ("central", "local"):
        for accountant in ("rdp", "pld"):
            huge = fj.channel.privacy(1e200, 1.0, mode)
            eps = fj.accounting.epsilon(huge, 100, 10, accountant=accountant).epsilon
            assert 0 <= eps <= 2 * cap < 0.01
    for build, name in (
        (lambda: fj.accounting.noise_multiplier(1e300, 100, 10), "target_epsilon"),
        (lambda: fj.accounting.noise_multiplier(1e8, 100, 10), "target_epsilon"),
        (
            lambda: fj.accounting.epsilon(fj.channel.privacy(1.0, 1.0), 1000, 10, accountant="pld"),
            "accountant",
        ),
        (
            lambda: fj.accounting.epsilon(fj.channel.privacy(1.0, 1.0), 10**6, 10, accountant="pld"),
            "accountant",
        ),
    ):
        with pytest.raises(ValueError, match=name) as err:
            build()
        assert "\n" not in str(err.value)


def test_epsilon_is_monotone_and_the_target_is_met():
    def eps(sigma, T):
        return fj.accounting.epsilon(fj.channel.privacy(sigma, 1.0), T, num_agents=10).epsilon

    by_rounds = [eps(1.0, T) for T in (1, 10, 100, 1000)]
    by_sigma = [eps(s, 100) for s in (0.5, 1.0, 2.0, 4.0)]
    assert np.all(np.diff(by_rounds) > 0) and np.all(np.diff(by_sigma) < 0)
    sigma = fj.accounting.noise_multiplier(2.0, 100, num_agents=10)
    assert eps(sigma, 100) == pytest.approx(2.0, rel=1e-3)


# each channel around the noise: rounds where nothing arrives (no noise then), division by the
# messages received, a cohort, a random sparsifier
CHANNELS = {
    "plain": {},
    "erasures": dict(success_prob=0.3),
    "divide_by_received": dict(success_prob=0.6, aggregation="divide_by_received"),
    "cohort": dict(clients_per_round=2),
    "rand_k": dict(quantizer="rand_k"),
}


@pytest.mark.parametrize("mode", ["local", "central"])
def test_monte_carlo_matches_exact_mse_without_clipping(het_gaussian, mode):
    """Each channel of CHANNELS checked on its own (one compiled program runs them side by side)."""
    algorithms = {}
    for name, extra in CHANNELS.items():
        extra = dict(extra)
        if extra.get("quantizer") == "rand_k":
            extra["quantizer"] = fj.channel.rand_k(2)
        algorithms[name] = fj.fedlsa(0.05, 3, privacy=fj.channel.privacy(0.7, 0.5, mode, clip=False), **extra)
    assert_monte_carlo_matches_exact_jointly(het_gaussian, algorithms, T=8, n=4000)


def test_monte_carlo_matches_exact_mse_td(tiny_td_sampled):
    """Local and central noise, FedLSA and QFedTD through erasures, each checked on its own."""
    algorithms = {}
    for mode in ("local", "central"):
        privacy = fj.channel.privacy(1.0, 0.3, mode, clip=False)
        algorithms[f"fedlsa-{mode}"] = fj.fedlsa(0.1, 2, privacy=privacy)
        algorithms[f"qfedtd-{mode}"] = fj.qfedtd(0.2, privacy=privacy, success_prob=0.7)
    assert_monte_carlo_matches_exact_jointly(tiny_td_sampled["generative"], algorithms, T=8, n=4000)


def test_noise_floor_in_closed_form(het_gaussian):
    """The stationary MSE added by the noise equals the discrete-Lyapunov closed form to O(eta) of it
    (the error halves with eta), and the first-order expression to O(eta)."""
    errors, first = [], []
    for mode in ("local", "central"):
        privacy = fj.channel.privacy(0.7, 0.5, mode, clip=False)
        for eta in (0.04, 0.02):
            added = fj.theory.stationary_mse(het_gaussian, fj.fedlsa(eta, 3, privacy=privacy))
            added -= fj.theory.stationary_mse(het_gaussian, fj.fedlsa(eta, 3))
            errors.append(added / fj.theory.privacy_noise_floor(het_gaussian, eta, 3, privacy) - 1)
            first.append(added / fj.theory.privacy_noise_floor(het_gaussian, eta, 3, privacy, True) - 1)
    for e in (errors, first):
        assert 1.8 < e[0] / e[1] < 2.2 and 1.8 < e[2] / e[3] < 2.2, e  # first order in eta
    assert max(map(abs, errors)) < 2e-3 and max(map(abs, first)) < 0.1


def test_clipping_is_refused_by_the_exact_theory_and_monte_carlo_shows_its_bias(het_gaussian):
    clipped = fj.fedlsa(0.05, 3, privacy=fj.channel.privacy(0.0, 0.05, "central"))
    with pytest.raises(ValueError, match="clipping is not linear"):
        fj.theory.exact_mse(het_gaussian, clipped, 5)
    res = fj.simulate(1, het_gaussian, clipped, 400, 256)
    exact = fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.05, 3), 400)
    assert res.mse_mean[-1] > exact[-1] + Z_TOL * res.mse_sem[-1]  # clipping's bias, far above noise


def test_numpy_scalars_are_accepted_as_clip_norm():
    """clip_norm as a numpy scalar is the number it holds, as noise_multiplier is."""
    p = fj.channel.privacy(np.float32(1.0), np.float32(0.5))
    assert p == fj.channel.privacy(1.0, 0.5) and type(p.clip_norm) is float
    assert fj.channel.privacy(1.0, np.int64(2)).clip_norm == 2.0
    adaptive = dict(target_quantile=0.5, clip_lr=0.25, count_noise=1.0)
    q = fj.channel.privacy(
        1.0, 1.0, delta=np.float64(1e-6), **{k: np.float32(v) for k, v in adaptive.items()}
    )
    assert q == fj.channel.privacy(1.0, 1.0, delta=1e-6, **adaptive)  # the other arguments too
    assert all(type(getattr(q, k)) is float for k in ("delta", *adaptive))


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: fj.channel.privacy(1.0, 0.0), "clip_norm"),
        (lambda: fj.channel.privacy(1.0, -1.0), "clip_norm"),
        (lambda: fj.channel.privacy(-0.5, 1.0), "noise_multiplier"),
        (lambda: fj.channel.privacy(1.0, 1.0, delta=1.0), "delta"),
        (lambda: fj.channel.privacy(1.0, 1.0, delta=0.0), "delta"),
        (lambda: fj.channel.privacy(1.0, 1.0, mode="global"), "mode"),
        (lambda: fj.accounting.noise_multiplier(1e-9, 10**6, num_agents=2, delta=1e-12), "target_epsilon"),
        (lambda: fj.accounting.noise_multiplier(-1.0, 10, num_agents=2), "target_epsilon"),
        (lambda: fj.accounting.epsilon(fj.channel.privacy(1.0, 1.0, clip=False), 10, 2), "privacy"),
        (lambda: fj.scafflsa(0.1, 2, privacy=fj.channel.privacy(1.0, 1.0, "central")), "privacy"),
        (
            lambda: fj.fedlsa(
                0.1,
                2,
                quantizer=fj.channel.top_k(1),
                error_feedback="ef21",
                privacy=fj.channel.privacy(1.0, 1.0),
            ),
            "error_feedback",
        ),
        (lambda: fj.fedbuff(0.1, 2, 2, privacy=fj.channel.privacy(1.0, 1.0)), "privacy"),
    ],
)
def test_bad_input_is_one_line(build, name):
    with pytest.raises(ValueError, match=name) as err:
        build()
    assert "\n" not in str(err.value)


# local noise at epsilon 4 over 20 rounds: the growth warning is expected
@pytest.mark.filterwarnings("ignore:.*the MSE stayed at:RuntimeWarning")
def test_result_and_command_line(tmp_path, capsys, het_gaussian):
    res = fj.simulate(
        1, het_gaussian, fj.fedlsa(0.05, 3, privacy=fj.channel.privacy(1.0, 0.5, "local")), 30, 8
    )
    assert res.privacy["releases"] == 30 and res.privacy["relation"] == "replace_one"
    assert (
        res.privacy["epsilon"] == fj.accounting.epsilon(fj.channel.privacy(1.0, 0.5, "local"), 30, 3).epsilon
    )
    res.save(tmp_path / "r.npz")
    assert fj.load(tmp_path / "r.npz").privacy == res.privacy
    from fedsa_jax.cli import main

    out = tmp_path / "run"
    args = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "8"]
    args += ["--rounds", "20", "--local-steps", "2", "--algorithms", "fedlsa", "--out", str(out)]
    capsys.readouterr()
    assert main([*args, "--clip-norm", "1", "--target-epsilon", "4", "--dp-mode", "local"]) == 0
    printed = capsys.readouterr().out
    assert "privacy: epsilon 4 at delta 1e-05 after 20 releases (local noise" in printed, printed
    assert main([*args, "--noise-multiplier", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--noise-multiplier=1.0 is invalid: it needs --clip-norm" in err


def test_command_line_refusals_name_the_flags(tmp_path, capsys):
    """A library refusal read on the command line names the options, not their Python spellings: the
    default SCAFFLSA with central noise is told ``--dp-mode local`` (not ``mode='local'``), the exact
    curve of a clipped run ``--no-clip`` (not ``fj.channel.privacy(..., clip=False)``)."""
    from fedsa_jax.cli import main

    args = ["run", "--problem", "garnet", "--states", "4", "--agents", "3", "--dim", "2", "--seeds", "2"]
    args += ["--rounds", "2", "--local-steps", "2", "--out", str(tmp_path), "--no-plot"]
    args += ["--clip-norm", "1", "--noise-multiplier", "1.1"]
    capsys.readouterr()
    assert main(args) == 2  # the default algorithms: FedLSA and SCAFFLSA
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.endswith("central noise does not cover: use --dp-mode local"), err
    assert err.startswith("fedsa-jax: error: --noise-multiplier=1.1 --clip-norm=1.0 --dp-mode central"), err
    assert "mode=" not in err and "privacy=" not in err
    ef21 = ["--algorithms", "fedlsa", "--quantizer", "top-k", "--error-feedback", "ef21"]
    assert main([*args, *ef21]) == 2  # another refusal, the same translation
    assert capsys.readouterr().err.strip().endswith("(use --dp-mode local, or EF14)")
    assert main([*args, "--algorithms", "fedlsa", "--exact"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "no exact curve" in line]
    assert len(lines) == 1 and "(simulate it; --no-clip, the noise alone, is exact" in lines[0], lines
    assert "clip=False" not in lines[0] and "fj." not in lines[0] and "privacy=" not in lines[0]


def test_command_line_reports_the_clipped_fraction(tmp_path, capsys):
    """A privacy run records the metric ``"clipped_fraction"`` and prints it, with a warning when nearly
    every message was clipped (C = 1e-6: all of them, exactly)."""
    import json

    from fedsa_jax.cli import main

    args = ["run", "--problem", "garnet", "--states", "4", "--agents", "3", "--dim", "2", "--seeds", "4"]
    args += ["--rounds", "3", "--local-steps", "2", "--algorithms", "fedlsa", "--out", str(tmp_path)]
    capsys.readouterr()
    assert main([*args, "--no-plot", "--clip-norm", "1e-6", "--noise-multiplier", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "clipped" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("fedlsa    privacy: 100 % of the messages clipped (C = 1e-06)"), lines
    assert "nearly every update is shortened to norm C" in lines[0] and "--clip-norm" in lines[0]
    assert json.loads((tmp_path / "summary.json").read_text())["runs"]["fedlsa"]["clipped_fraction"] == 1.0
    res = fj.load(tmp_path / "result_fedlsa.npz")
    np.testing.assert_array_equal(res.metrics["clipped_fraction"].mean, [0.0, 1.0, 1.0, 1.0])


def test_a_sweep_at_a_total_of_local_steps_calibrates_each_configuration(tmp_path, het_gaussian):
    """``target_epsilon`` with ``total_local_steps``: each configuration's sigma is calibrated on its own
    rounds (8 local steps: 4 rounds at H = 2, 2 at H = 4), and spends the target; a huge noise
    multiplier runs and reports epsilon about 0 (the accounting no longer overflows after the run)."""
    import json

    from fedsa_jax.cli import main

    toml = tmp_path / "grid.toml"
    toml.write_text(
        "[run]\nseeds = 2\ntotal_local_steps = 8\n[grid]\nproblem = 'garnet'\nstates = 4\nagents = 3\n"
        "dim = 2\nalgorithm = 'fedlsa'\nclip_norm = 1.0\ntarget_epsilon = 4.0\nlocal_steps = [2, 4]\n"
    )
    assert main(["sweep", str(toml), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    index = json.loads((tmp_path / "o" / "sweep.json").read_text())
    for row in index:
        res = fj.load(tmp_path / "o" / row["file"])
        assert res.privacy["releases"] == 8 // row["config"]["local_steps"] == res.rounds[-1]
        assert res.privacy["epsilon"] == pytest.approx(4.0, rel=1e-3) and res.privacy["epsilon"] <= 4.0
    with pytest.warns(RuntimeWarning, match="diverged"):  # a noise of 1e200: every seed diverges
        huge = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 2, privacy=fj.channel.privacy(1e200, 1.0)), 3, 2)
    assert 0 <= huge.privacy["epsilon"] < 0.01


def test_adaptive_clipping_tracks_the_quantile():
    """Messages of norms 1..4, gamma = 1/2, no noise: C_t settles in [2, 3), where two of the four are
    unclipped (the geometric step stops there); from below and from above."""
    messages = jnp.asarray(np.diag([1.0, 2.0, 3.0, 4.0]))
    for start in (0.5, 10.0):
        ch = fj.channel.channel(privacy=fj.channel.privacy(0.0, start, target_quantile=0.5, clip_lr=0.2))
        memory = ch.init_memory(4, 4, jnp.float64)
        send = jax.jit(lambda k, m, ch=ch: fj.channel.transmit(k, messages, ch, m))
        for t in range(100):
            memory = send(jax.random.key(t), memory).memory
        assert 2.0 <= float(memory[1]) < 3.0, (start, memory)


def test_adaptive_clipping_noise_and_accounting(het_gaussian):
    sigma, sigma_b, C, N, d = 1.0, 1.0, 2.0, 5, 3
    p = fj.channel.privacy(sigma, C, target_quantile=0.5, count_noise=sigma_b)
    sum_sigma = (sigma**-2 - (2 * sigma_b) ** -2) ** -0.5
    assert p.sum_noise_multiplier == pytest.approx(sum_sigma)
    ch = fj.channel.channel(privacy=p)
    zero = jnp.zeros((N, d), jnp.float64)
    memory = ch.init_memory(N, d, jnp.float64)
    keys = jax.random.split(KEY, 20000)
    agg = jax.vmap(lambda k: fj.channel.aggregate(fj.channel.transmit(k, zero, ch, memory)))(keys)
    _check_covariance(np.asarray(agg), (sum_sigma * C / N) ** 2)
    fixed = fj.channel.privacy(sigma, C)
    assert fj.accounting.epsilon(p, 50, N).epsilon == fj.accounting.epsilon(fixed, 50, N).epsilon
    res = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 3, privacy=p), 20, 8, metrics=["clip_norm"])
    assert res.metrics["clip_norm"].mean[0] == C and res.metrics["clip_norm"].mean[-1] != C
    assert res.privacy["mechanism"]["target_quantile"] == 0.5


def _gdp_epsilon(mu, delta):
    """The exact epsilon at ``delta`` of mu-GDP (Dong, Roth, Su, "Gaussian differential privacy"):
    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, solved with scipy."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(eps):
        return norm.cdf(-eps / mu + mu / 2) - np.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta

    return brentq(excess, 0.0, mu * mu + 20 * mu + 20, xtol=1e-12, rtol=1e-14)


def _released_fraction(privacy, messages, delivered, n, C, key=KEY):
    """The noised fraction b~ the server released, read back from C_{t+1} = C exp(-lr (b~ - gamma))."""
    from fedsa_jax.channel import dp

    C_t = jnp.asarray(C, jnp.float64)
    nxt = dp.next_clip(key, jnp.asarray(messages), jnp.asarray(delivered), n, C_t, privacy)
    return privacy.target_quantile - np.log(float(nxt) / C) / privacy.clip_lr


def _worst_pair_epsilon(sigma, sigma_b, T, delta, N=5, C=2.0):
    """The exact epsilon of T rounds of adaptive clipping on its worst neighbouring pair, measured from
    the mechanism: one agent's unclipped message of norm C present or absent (same key) moves the
    released count (n b~) by `count` and the clipped sum by `total`; each round is then the Gaussian
    mechanism of mu^2 = (total / (sigma_Delta C))^2 + (count / sigma_b)^2, T rounds are sqrt(T) mu-GDP."""
    p = fj.channel.privacy(sigma, C, target_quantile=0.5, count_noise=sigma_b)
    messages = np.zeros((N, 3))
    messages[0, 0] = C  # the worst agent: unclipped, at the bound
    messages[1:, 1] = 10 * C  # the others clipped (any values: they are the same in both data sets)
    present, absent = np.ones(N, bool), np.ones(N, bool)
    absent[0] = False
    count = N * abs(
        _released_fraction(p, messages, present, N, C) - _released_fraction(p, messages, absent, N, C)
    )
    ch = fj.channel.channel(privacy=p)
    received = fj.channel.transmit(KEY, jnp.asarray(messages), ch, ch.init_memory(N, 3, jnp.float64)).messages
    total = float(np.linalg.norm(np.asarray(received)[0]))  # what agent 0 adds to the sum
    sigma_delta = (sigma**-2 - (2 * sigma_b) ** -2) ** -0.5  # the sum's noise multiplier (Theorem 1)
    mu = np.sqrt((total / (sigma_delta * C)) ** 2 + (count / sigma_b) ** 2)
    return p, count, _gdp_epsilon(np.sqrt(T) * mu, delta)


@pytest.mark.parametrize(("sigma", "sigma_b"), [(1.0, 1.0), (5.0, 3.0)])
def test_adaptive_clipping_epsilon_covers_its_worst_neighbours(sigma, sigma_b):
    """The reported epsilon (RDP and PLD) is at least the exact epsilon of the worst neighbouring pair's
    privacy loss, computed without dp-accounting from sensitivities measured on the mechanism; PLD is
    within 0.1 % of it. Power: an uncentred count (sensitivity 1) gives 143.1 where 96.1 is reported
    (sigma = sigma_b = 1, 100 rounds)."""
    T, N, delta = 100, 5, 1e-5
    p, count, exact = _worst_pair_epsilon(sigma, sigma_b, T, delta, N)
    rdp_eps = fj.accounting.epsilon(p, T, N, delta).epsilon
    pld_eps = fj.accounting.epsilon(p, T, N, delta, accountant="pld").epsilon
    assert rdp_eps >= exact and exact * (1 - 1e-6) <= pld_eps <= exact * (1 + 1e-3), (rdp_eps, pld_eps, exact)
    assert count == pytest.approx(0.5, rel=1e-9)  # the centred bit: 1/2, Theorem 1's sensitivity


def test_adaptive_clipping_counts_over_the_agents_asked():
    """With a cohort and erasures, b~ = (sum over the delivered of (b_c - 1/2)) / n + 1/2 with n the
    cohort's size (not the messages received; no noise here, sigma = sigma_b = 0)."""
    N, m, C = 6, 4, 1.5
    p = fj.channel.privacy(0.0, C, target_quantile=0.5, clip_lr=0.3)
    ch = fj.channel.channel(privacy=p, success_prob=0.6)
    messages = jnp.asarray(np.diag([0.5, 1.0, 3.0, 1.2, 4.0, 0.1]))
    cohort = jnp.asarray([True, True, True, True, False, False])
    memory = ch.init_memory(N, N, jnp.float64)
    seen = set()
    for t in range(12):
        key = jax.random.key(t)
        d = fj.channel.transmit(key, messages, ch, memory, cohort)
        delivered = np.asarray(d.delivered)
        bits = np.diag(np.asarray(messages)) <= C
        fraction = np.sum(np.where(delivered, bits - 0.5, 0.0)) / m + 0.5
        np.testing.assert_allclose(float(d.memory[1]), C * np.exp(-0.3 * (fraction - 0.5)), rtol=1e-12)
        seen.add(int(delivered.sum()))
    assert len(seen - {m}) >= 2  # rounds with lost messages, where |R| < m tells the two apart


def test_adaptive_clipping_count_noise_is_independent_of_the_sum_noise():
    """The count's noise (read back from C_{t+1}) and the sum's (from the aggregate) are uncorrelated
    coordinate by coordinate within Z_TOL s.e. (their streams differ), each of unit variance."""
    sigma, sigma_b, C, N, d = 1.0, 1.0, 2.0, 4, 3
    p = fj.channel.privacy(sigma, C, target_quantile=0.5, count_noise=sigma_b, clip_lr=0.1)
    ch = fj.channel.channel(privacy=p)
    zero = jnp.zeros((N, d), jnp.float64)
    memory = ch.init_memory(N, d, jnp.float64)

    def one(k):
        dl = fj.channel.transmit(k, zero, ch, memory)
        return fj.channel.aggregate(dl), dl.memory[1]

    agg, nxt = jax.vmap(one)(jax.random.split(KEY, 20000))
    z_sum = np.asarray(agg) * N / (p.sum_noise_multiplier * C)
    fraction = 0.5 - np.log(np.asarray(nxt) / C) / 0.1  # every bit is 1: b~ = (N/2 + sigma_b z) / N + 1/2
    z_count = (fraction - 1.0) * N / sigma_b
    n = z_count.size
    assert abs(np.mean(z_count**2) - 1) < Z_TOL * np.sqrt(2 / n)
    corr = z_sum.T @ z_count / n
    assert np.all(np.abs(corr) < Z_TOL / np.sqrt(n)), corr


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(target_quantile=0.0), "target_quantile"),
        (dict(target_quantile=1.5), "target_quantile"),
        (dict(target_quantile=0.5, mode="local", count_noise=1.0), "target_quantile"),
        (dict(target_quantile=0.5, clip=False, count_noise=1.0), "target_quantile"),
        (dict(target_quantile=0.5, count_noise=0.4), "count_noise"),
        (dict(target_quantile=0.5, count_noise=1.0, clip_lr=0.0), "clip_lr"),
    ],
)
def test_bad_adaptive_clipping_is_one_line(kwargs, name):
    with pytest.raises(ValueError, match=name) as err:
        fj.channel.privacy(1.0, 1.0, **kwargs)
    assert "\n" not in str(err.value)


def test_what_the_wrappers_and_the_downlink_refuse(het_gaussian):
    p = fj.channel.privacy(1.0, 0.5)
    alg = fj.fedlsa(0.05, 3, privacy=p)
    for wrap, match in (
        (fj.richardson, "Richardson"),
        (lambda a: fj.bootstrap(a, 5), "bootstrap"),
        (fj.plug_in, "plug-in"),
    ):
        with pytest.raises(ValueError, match=match) as err:
            wrap(alg)
        assert "\n" not in str(err.value)
    res = fj.simulate(1, het_gaussian, fj.averaged(alg), 10, 4)  # averaging is post-processing: kept
    assert res.privacy["releases"] == 10
    with pytest.raises(ValueError, match="downlink.privacy"):
        fj.fedlsa(0.05, 3, downlink=fj.channel.channel(fj.channel.top_k(1), privacy=p))


def test_releases_with_a_cohort_and_scaffnew(het_gaussian):
    """A cohort releases once a round (its m messages); Scaffnew once per communication (the mean
    count, rounded up); sigma = 0 reports no epsilon, with the reason, and survives a file."""
    cohort = fj.simulate(
        1, het_gaussian, fj.fedlsa(0.05, 3, clients_per_round=2, privacy=fj.channel.privacy(1.0, 0.5)), 12, 4
    )
    assert (
        cohort.privacy["releases"] == 12 and cohort.privacy["event"] == "GaussianDpEvent"
    )  # 2 of 3: tighter
    alg = fj.scaffnew(0.05, 0.3, 4, privacy=fj.channel.privacy(1.0, 0.5, "local"))
    res = fj.simulate(1, het_gaussian, alg, 12, 16)
    assert res.privacy["releases"] == int(np.ceil(res.communications[-1] / 3 - 1e-9)) > 0
    none = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 3, privacy=fj.channel.privacy(0.0, 0.5)), 5, 4)
    assert none.privacy["epsilon"] is None and "no noise" in none.privacy["reason"]


def test_pld_local_is_the_replace_one_gaussian():
    """Local noise: replace-one at sensitivity 2C, i.e. the library's PLD under replace-one at sigma, and
    RDP's add-or-remove at sigma / 2; the PLD calibration runs (few releases: PLD is slow)."""
    from dp_accounting import pld

    acc = pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 20))
    ours = fj.accounting.epsilon(fj.channel.privacy(2.0, 1.0, "local"), 20, 10, accountant="pld")
    assert ours.epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    rdp_eps = fj.accounting.epsilon(fj.channel.privacy(2.0, 1.0, "local"), 20, 10).epsilon
    assert ours.epsilon < rdp_eps  # PLD is tighter
    sigma = fj.accounting.noise_multiplier(4.0, 2, 10, accountant="pld")
    spent = fj.accounting.epsilon(fj.channel.privacy(sigma, 1.0), 2, 10, accountant="pld").epsilon
    assert spent == pytest.approx(4.0, rel=1e-2)
