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
from reference import assert_monte_carlo_matches_exact

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


def test_epsilon_is_monotone_and_the_target_is_met():
    def eps(sigma, T):
        return fj.accounting.epsilon(fj.channel.privacy(sigma, 1.0), T, num_agents=10).epsilon

    by_rounds = [eps(1.0, T) for T in (1, 10, 100, 1000)]
    by_sigma = [eps(s, 100) for s in (0.5, 1.0, 2.0, 4.0)]
    assert np.all(np.diff(by_rounds) > 0) and np.all(np.diff(by_sigma) < 0)
    sigma = fj.accounting.noise_multiplier(2.0, 100, num_agents=10)
    assert eps(sigma, 100) == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("mode", ["local", "central"])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        dict(success_prob=0.3),  # rounds where nothing arrives: no noise then
        dict(success_prob=0.6, aggregation="divide_by_received"),
        dict(clients_per_round=2),
        dict(quantizer="rand_k"),
    ],
)
def test_monte_carlo_matches_exact_mse_without_clipping(het_gaussian, mode, extra):
    extra = dict(extra)
    if extra.get("quantizer") == "rand_k":
        extra["quantizer"] = fj.channel.rand_k(2)
    alg = fj.fedlsa(0.05, 3, privacy=fj.channel.privacy(0.7, 0.5, mode, clip=False), **extra)
    assert_monte_carlo_matches_exact(het_gaussian, alg, T=8, n=4000)


@pytest.mark.parametrize("mode", ["local", "central"])
def test_monte_carlo_matches_exact_mse_td(tiny_td_sampled, mode):
    problem = tiny_td_sampled["generative"]
    privacy = fj.channel.privacy(1.0, 0.3, mode, clip=False)
    for alg in (fj.fedlsa(0.1, 2, privacy=privacy), fj.qfedtd(0.2, privacy=privacy, success_prob=0.7)):
        assert_monte_carlo_matches_exact(problem, alg, T=8, n=4000)


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
    assert cohort.privacy["releases"] == 12 and cohort.privacy["event"] == "SampledWithoutReplacementDpEvent"
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
