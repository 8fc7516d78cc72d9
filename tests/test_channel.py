"""The uplink channel: quantizers against exact moments, erasures against the
binomial law, QFedTD and channel-equipped FedLSA/SCAFFLSA against exact mean
recursions, reductions, bit accounting."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax.channel import transmit

X = jnp.array([0.9, -0.35, 0.0, 2.0, -1.7, 0.05, 0.3, -0.0])  # d = 8, includes zeros
D = X.shape[0]
M = 100_000  # draws per quantizer

QUANTIZERS = {
    "uniform-1bit": fj.channel.stochastic_uniform(bits=1),
    "uniform-2bit": fj.channel.stochastic_uniform(bits=2),
    "uniform-4bit": fj.channel.stochastic_uniform(bits=4),
    "uniform-fixed-range": fj.channel.stochastic_uniform(bits=3, range=2.5),
    "qsgd-1": fj.channel.qsgd(1),
    "qsgd-4": fj.channel.qsgd(4),
    "rand-1": fj.channel.rand_k(1),
    "rand-3": fj.channel.rand_k(3),
    "natural": fj.channel.natural(),
    "identity": fj.channel.identity(),
}


def draws(q, x=X, m=M, seed=0):
    keys = jax.random.split(jax.random.key(seed), m)
    return np.asarray(jax.jit(jax.vmap(q, in_axes=(0, None)))(keys, x))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantizer_unbiased_and_within_zeta(name):
    q = QUANTIZERS[name]
    y = draws(q)
    x = np.asarray(X)
    sem = y.std(0, ddof=1) / np.sqrt(M)
    # (1e-10: float64 rounding of a 1e5-term sum along a strided axis)
    assert np.all(np.abs(y.mean(0) - x) <= Z_TOL * sem + 1e-10), (y.mean(0) - x, sem)
    if q.kind != "stochastic_uniform":  # 0 is no grid point of 2^b evenly spaced levels
        assert np.all(y[:, x == 0] == 0)  # zero coordinates stay zero
    err = np.sum((y - x) ** 2, axis=1)
    bound = q.zeta(D) * float(x @ x)
    assert err.mean() - Z_TOL * err.std(ddof=1) / np.sqrt(M) <= bound


@pytest.mark.parametrize("bits", [1, 2, 3, 5])
def test_stochastic_uniform_exact_variance(bits):
    """Per coordinate, stochastic rounding on a grid of step delta has variance delta^2 f (1 - f)."""
    q = fj.channel.stochastic_uniform(bits=bits)
    y = draws(q)
    x = np.asarray(X)
    Mx = np.abs(x).max()
    L = 2**bits - 1
    delta = 2 * Mx / L
    frac = ((x + Mx) / delta) % 1.0
    exact = delta**2 * frac * (1 - frac)
    var = y.var(0, ddof=1)
    # standard error of a sample variance of a two-point law: sqrt((mu4 - var^2) / M)
    mu4 = delta**4 * frac * (1 - frac) * ((1 - frac) ** 3 + frac**3)
    se = np.sqrt(np.maximum(mu4 - exact**2, 0) / M)
    # plus the error from estimating the mean: (ybar - mu)^2 <= Z^2 var / M at Z standard errors
    assert np.all(np.abs(var - exact) <= Z_TOL * se + Z_TOL**2 * exact / M + 1e-12)
    assert exact.sum() <= q.zeta(D) * float(x @ x)
    # every output lies on the grid
    k = (y + Mx) / delta
    np.testing.assert_allclose(k, np.round(k), atol=1e-9)


def test_quantization_error_decreases_in_bits():
    x = np.asarray(X)
    errs = [
        np.mean(np.sum((draws(fj.channel.stochastic_uniform(b), m=20_000) - x) ** 2, 1))
        for b in (1, 2, 3, 4, 6)
    ]
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    zetas = [fj.channel.stochastic_uniform(b).zeta(D) for b in (1, 2, 3, 4, 6)]
    assert zetas == sorted(zetas, reverse=True) and zetas[0] == D / 1


def test_fixed_range_is_biased_when_clipping():
    q = fj.channel.stochastic_uniform(bits=3, range=1.0)
    assert not q.unbiased and math.isinf(q.zeta(D))
    y = draws(q, m=20_000)
    assert abs(y[:, 3].mean() - 1.0) < 1e-12  # 2.0 is clipped to 1.0: bias of 1.0


def test_bits_per_message():
    assert fj.channel.stochastic_uniform(4).bits(10) == 32 + 40
    assert fj.channel.stochastic_uniform(4, range=1.0).bits(10) == 40
    assert fj.channel.qsgd(3).bits(10) == 32 + 10 * 3
    assert fj.channel.rand_k(2).bits(16) == 2 * (32 + 4)
    assert fj.channel.natural().bits(10) == 90
    assert fj.channel.identity().bits(10) == 320


def test_rand_k_keeps_exactly_k():
    y = draws(fj.channel.rand_k(3), x=jnp.arange(1.0, 9.0), m=1000)
    assert np.all((y != 0).sum(1) == 3)
    np.testing.assert_allclose(y[y != 0] / np.tile(np.arange(1.0, 9.0), (1000, 1))[y != 0], 8 / 3)


def test_natural_outputs_powers_of_two():
    y = draws(fj.channel.natural(), m=1000)
    nz = y[y != 0]
    np.testing.assert_array_equal(np.abs(nz), 2.0 ** np.round(np.log2(np.abs(nz))))


@pytest.mark.parametrize("aggregation", ["divide_by_n", "divide_by_received"])
def test_erasures_follow_binomial_and_weights(aggregation):
    ch = fj.channel.channel(None, success_prob=0.3, aggregation=aggregation)
    N, trials = 7, 20_000
    msgs = jnp.ones((N, 2))
    out = jax.jit(jax.vmap(lambda k: transmit(k, msgs, ch)))(jax.random.split(jax.random.key(0), trials))
    delivered = np.asarray(out.delivered)
    n = delivered.size
    assert abs(delivered.sum() - 0.3 * n) < Z_TOL * math.sqrt(n * 0.3 * 0.7)
    # independence across agents: pairs delivered together at rate p^2
    both = (delivered[:, 0] & delivered[:, 1]).sum()
    assert abs(both - 0.09 * trials) < Z_TOL * math.sqrt(trials * 0.09 * 0.91)
    w = np.asarray(out.weights)
    assert np.all(w[~delivered] == 0) and np.all(np.asarray(out.messages)[~delivered] == 0)
    count = delivered.sum(1)
    if aggregation == "divide_by_n":
        np.testing.assert_allclose(w[delivered], 1 / N)
    else:
        np.testing.assert_allclose(w.sum(1), (count > 0).astype(float))


def test_bad_channel_arguments():
    for make, param in [
        (lambda: fj.channel.stochastic_uniform(0), "bits"),
        (lambda: fj.channel.stochastic_uniform(4, range=-1.0), "range"),
        (lambda: fj.channel.stochastic_uniform(4, range="minmax"), "range"),
        (lambda: fj.channel.qsgd(0), "levels"),
        (lambda: fj.channel.rand_k(0), "k"),
        (lambda: fj.qfedtd(0.5, success_prob=0.0), "success_prob"),
        (lambda: fj.qfedtd(0.5, success_prob=1.2), "success_prob"),
        (lambda: fj.fedlsa(0.5, 2, success_prob=-0.1), "success_prob"),
        (lambda: fj.scafflsa(0.5, 2, aggregation="mean"), "aggregation"),
        (lambda: fj.qfedtd(0.5, quantizer="4bit"), "quantizer"),
        (lambda: fj.qfedtd(-0.5), "step_size"),
    ]:
        with pytest.raises(ValueError, match=rf"^{param}="):
            make()
    p = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=5, dim=3)
    with pytest.raises(ValueError, match=r"^k=4 is invalid: expected k <= d = 3"):
        fj.simulate(jax.random.key(0), p, fj.qfedtd(0.5, fj.channel.rand_k(4)), 3, 2)


@pytest.fixture(scope="module")
def het_td():
    return fj.problems.garnet(jax.random.key(1), num_agents=4, num_states=8, dim=3)


@pytest.mark.parametrize("aggregation", ["divide_by_n", "divide_by_received"])
def test_qfedtd_mean_matches_exact_recursion(het_td, aggregation):
    """E[theta_{k+1}] = (I - alpha p mean A) E[theta_k] + alpha p mean b
    (p -> 1-(1-p)^N when dividing by |R|)."""
    alpha, p, T, n = 0.6, 0.6, 40, 4000
    alg = fj.qfedtd(alpha, fj.channel.stochastic_uniform(bits=2), success_prob=p, aggregation=aggregation)
    theta0 = np.array([2.0, -1.0, 1.0])
    res = fj.simulate(jax.random.key(3), het_td, alg, T, n, theta0=theta0)
    A, b = np.asarray(het_td.A_bar).mean(0), np.asarray(het_td.b_bar).mean(0)
    p_eff = p if aggregation == "divide_by_n" else 1 - (1 - p) ** 4
    x, ref = theta0, [theta0]
    for _ in range(T):
        x = x - alpha * p_eff * (A @ x - b)
        ref.append(x)
    np.testing.assert_allclose(
        fj.theory.exact_mean(het_td, alg, T, theta0=theta0), ref, rtol=1e-12, atol=1e-14
    )
    z = (res.theta_mean[1:] - np.array(ref)[1:]) / res.theta_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), np.abs(z).max()
    # power: a recursion with the other rule's factor (1 instead of p, p instead of 1-(1-p)^N) is rejected
    wrong_factor = 1.0 if aggregation == "divide_by_n" else p
    x, wrong = theta0, [theta0]
    for _ in range(T):
        x = x - alpha * wrong_factor * (A @ x - b)
        wrong.append(x)
    assert np.abs((res.theta_mean[1:] - np.array(wrong)[1:]) / res.theta_sem[1:]).max() > 3 * Z_TOL


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
@pytest.mark.parametrize("aggregation", ["divide_by_n", "divide_by_received"])
def test_channel_fedlsa_scafflsa_mean_matches_exact(het_td, name, aggregation):
    make = {"fedlsa": fj.fedlsa, "scafflsa": fj.scafflsa}[name]
    alg = make(0.5, 4, quantizer=fj.channel.qsgd(2), success_prob=0.5, aggregation=aggregation)
    theta0 = np.array([2.0, -1.0, 1.0])
    T, n = 25, 4000
    res = fj.simulate(jax.random.key(5), het_td, alg, T, n, theta0=theta0)
    exact = fj.theory.exact_mean(het_td, alg, T, theta0=theta0)
    z = (res.theta_mean[1:] - exact[1:]) / res.theta_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), np.abs(z).max()
    assert np.linalg.norm(exact[0] - exact[-1]) > 20 * Z_TOL * res.theta_sem[-1].max()


def test_scafflsa_control_variates_sum_to_zero_under_erasures(het_td):
    for aggregation in ("divide_by_n", "divide_by_received"):
        alg = fj.scafflsa(
            0.5, 3, quantizer=fj.channel.stochastic_uniform(3), success_prob=0.4, aggregation=aggregation
        )
        state = alg.init(jax.random.key(0), het_td, jnp.zeros(3))
        step = jax.jit(lambda k, s: alg.step(k, s, het_td))  # noqa: B023 (used in this iteration only)
        frozen = 0
        for t in range(60):
            new, info = step(jax.random.key(t), state)
            np.testing.assert_allclose(np.asarray(new.xi).sum(0), 0.0, atol=1e-12)
            lost = np.all(np.asarray(new.xi) == np.asarray(state.xi), axis=1)
            frozen += lost.sum()
            assert int(info.messages_delivered) >= 4 - lost.sum()
            state = new
        assert frozen > 0  # lost messages left some control variates unchanged


def test_reductions(het_td):
    key = jax.random.key(7)
    # p = 1 and identity: QFedTD is FedTD, i.e. FedLSA with one local step
    a = fj.simulate(key, het_td, fj.qfedtd(0.5), 20, 16)
    b = fj.simulate(key, het_td, fj.fedlsa(0.5, 1), 20, 16)
    np.testing.assert_allclose(a.final_theta, b.final_theta, rtol=1e-12, atol=1e-14)
    # an explicit p = 1, identity channel is the exact one, for all algorithms
    for make in (fj.fedlsa, fj.scafflsa):
        c = fj.simulate(key, het_td, make(0.5, 3), 10, 8)
        e = fj.simulate(
            key,
            het_td,
            make(0.5, 3, quantizer=fj.channel.identity(), success_prob=1.0, aggregation="divide_by_received"),
            10,
            8,
        )
        np.testing.assert_array_equal(c.final_theta, e.final_theta)
    # N = 1: dividing by N or by the number received is the same
    one = fj.problems.garnet(jax.random.key(1), num_agents=1, num_states=8, dim=3)
    q = fj.channel.stochastic_uniform(3)
    x = fj.simulate(key, one, fj.qfedtd(0.5, q, 0.5), 15, 8)
    y = fj.simulate(key, one, fj.qfedtd(0.5, q, 0.5, aggregation="divide_by_received"), 15, 8)
    np.testing.assert_array_equal(x.final_theta, y.final_theta)


def test_bits_accounting(het_td):
    q = fj.channel.stochastic_uniform(bits=4)
    n, T, p = 2000, 30, 0.6
    res = fj.simulate(jax.random.key(0), het_td, fj.qfedtd(0.5, q, p), T, n, record_every=10)
    per_msg = q.bits(3)
    assert res.config["bits_per_message"] == per_msg == 32 + 12
    np.testing.assert_array_equal(res.bits_sent, res.rounds * 4 * per_msg)
    # delivered messages per seed ~ Binomial(4 T, p); mean over n seeds
    sd = math.sqrt(4 * T * p * (1 - p) / n) * per_msg
    assert abs(res.bits_delivered[-1] - p * res.bits_sent[-1]) < Z_TOL * sd
    assert np.all(np.diff(res.bits_delivered) > 0) and res.bits_delivered[0] == 0


def test_markov_sampling_runs_with_channel():
    p = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=5)
    res = fj.simulate(
        jax.random.key(1), p, fj.qfedtd(0.6, fj.channel.stochastic_uniform(4), 0.6), 200, 64, record_every=50
    )
    assert res.mse_mean[-1] < 0.2 * res.mse_mean[0] and res.num_diverged.max() == 0
