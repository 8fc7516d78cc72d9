"""Scaffnew (ProxSkip) against exact references.

* a numpy loop on tiny problems fed the kernel's own random numbers (observations and
  coins): trajectories agree to float64 rounding, seed by seed, and so do the counts;
* p = 1: every local step communicates, and the mean iterate is FedLSA with one local step;
* Monte Carlo means and MSEs against the exact recursions (a mixture over the coin), within
  Z_TOL standard errors; communications against their binomial law;
* no heterogeneity bias, control variates down to their exact variance floor, float32
  control variates summing to 0; clear errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL
from reference import gaussian_loop, scaffnew_coins, td_loop

import fedsa_jax as fj
from fedsa_jax import theory
from fedsa_jax._runtime import kernel as sim_mod


@pytest.fixture(scope="module")
def td3(tiny_td):
    P, r, Phi = tiny_td
    return fj.problems.federated_td(P, r, Phi, 0.9)


@pytest.mark.parametrize("case", ["gaussian", "td_generative", "td_markov_skip2"])
def test_matches_numpy_loop_and_counts_its_coins(het_gaussian, tiny_td, case):
    if case == "gaussian":
        problem, alg, loop, theta0 = (
            het_gaussian,
            fj.scaffnew(0.1, 0.4, 3),
            gaussian_loop,
            np.array([1.0, -1.0, 0.5]),
        )
    else:
        P, r, Phi = tiny_td
        markov = case == "td_markov_skip2"
        problem = fj.problems.federated_td(P, r, Phi, 0.9, sampling="markov" if markov else "generative")
        alg, loop, theta0 = fj.scaffnew(0.3, 0.5, 3, skip=2 if markov else 1), td_loop, np.array([0.5, -0.2])
    key, T, n = jax.random.key(11), 5, 3
    res = fj.simulate(key, problem, alg, T, n, theta0=theta0)
    refs = np.stack([loop(problem, alg, key, s, T, theta0=theta0) for s in range(n)])
    np.testing.assert_allclose(res.final_theta, refs[:, -1], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(res.theta_mean, refs.mean(0), rtol=1e-12, atol=1e-13)
    # N messages per coin = 1, against the reference's coins seed by seed (the result holds their mean)
    N, H = problem.num_agents, alg.num_local_steps
    coins = np.array(
        [[scaffnew_coins(key, s, t, H, alg.config.comm_prob).sum() for t in range(T)] for s in range(n)]
    )
    assert 0 < coins.sum() < n * T * H  # both outcomes occur
    sent = np.concatenate([np.zeros((n, 1)), np.cumsum(N * coins, axis=1)], axis=1)
    np.testing.assert_allclose(res.communications, sent.mean(0), rtol=1e-15)
    np.testing.assert_array_equal(res.messages_delivered, res.communications)
    np.testing.assert_allclose(res.bits_sent, res.communications * 32 * problem.dim, rtol=1e-15)
    np.testing.assert_array_equal(
        res.samples, res.rounds * N * H * alg.skip
    )  # Markov: skip steps per kept one
    if case == "gaussian":  # comm_prob is a traced leaf: another value runs the same kernel
        before = sim_mod._num_traces
        other = fj.simulate(key, problem, fj.scaffnew(0.1, 0.9, 3), T, n, theta0=theta0)
        assert sim_mod._num_traces == before
        assert other.communications[-1] > res.communications[-1]
        assert other.config["algorithm"]["comm_prob"] == pytest.approx(0.9)


def test_every_step_communicates_when_p_is_one(het_gaussian):
    """p = 1: with xbar the common iterate and g_c = A_c(Z) xbar - b_c(Z), a local step and its
    communication give xbar' = mean_c (xbar - eta (g_c - h_c)) = xbar - eta mean_c g_c (sum_c h_c = 0)
    and h_c' = h_c + (xbar' - xh_c) / eta = g_c - mean_j g_j: FedLSA with one local step."""
    key, theta0 = jax.random.key(4), np.array([1.0, -1.0, 0.5])
    # H = 1: the same observations, so the same iterates seed by seed
    a = fj.simulate(key, het_gaussian, fj.scaffnew(0.1, 1.0, 1), 6, 8, theta0=theta0)
    b = fj.simulate(key, het_gaussian, fj.fedlsa(0.1, 1), 6, 8, theta0=theta0)
    np.testing.assert_allclose(a.final_theta, b.final_theta, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(a.communications, b.communications)
    # H = 4 in law: the exact recursions every 4th FedLSA round
    alg, H, T = fj.scaffnew(0.15, 1.0, 4), 4, 10
    np.testing.assert_allclose(
        theory.exact_mean(het_gaussian, alg, T, theta0=theta0),
        theory.exact_mean(het_gaussian, fj.fedlsa(0.15, 1), H * T, theta0=theta0)[::H],
        rtol=1e-12,
        atol=1e-14,
    )
    np.testing.assert_allclose(
        theory.exact_mse(het_gaussian, alg, T, theta0=theta0),
        theory.exact_mse(het_gaussian, fj.fedlsa(0.15, 1), H * T, theta0=theta0)[::H],
        rtol=1e-12,
    )
    # the control variates after one noise-free step from theta0
    quiet = fj.problems.gaussian_lsa(het_gaussian.A_bar, het_gaussian.b_bar, 0.0, 0.0)
    alg = fj.scaffnew(0.1, 1.0, 1)
    state = alg.init(jax.random.key(0), quiet, jnp.asarray(theta0))
    state, info = alg.step(jax.random.key(1), state, quiet)
    g = np.einsum("cij,j->ci", np.asarray(quiet.A_bar), theta0) - np.asarray(quiet.b_bar)
    np.testing.assert_allclose(state.xi, g - g.mean(0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(state.theta, theta0 - 0.1 * g.mean(0), rtol=1e-12)
    np.testing.assert_allclose(state.x, np.tile(state.error, (3, 1)), rtol=1e-12)  # errors from theta_star
    assert float(info.client_drift) < 1e-28 and int(info.messages_sent) == 3


def test_exact_recursions_against_coin_enumeration(het_gaussian):
    """Noise-free: the process is deterministic given the coins, so E over the 2^(T H) coin
    sequences of a plain loop is exact; exact_mean and exact_mse must match it."""
    import itertools

    quiet = fj.problems.gaussian_lsa(het_gaussian.A_bar, het_gaussian.b_bar, 0.0, 0.0)
    A, b = np.asarray(quiet.A_bar), np.asarray(quiet.b_bar)
    star = np.asarray(quiet.theta_star)
    eta, p, H, T, theta0 = 0.15, 0.4, 2, 3, np.array([1.0, -1.0, 0.5])
    mean, mse = np.zeros((T + 1, 3)), np.zeros(T + 1)
    for coins in itertools.product((0, 1), repeat=T * H):
        x, h, path = np.tile(theta0, (3, 1)), np.zeros((3, 3)), [theta0]
        for t in range(T):
            for k in range(H):
                xh = x - eta * (np.einsum("cij,cj->ci", A, x) - b - h)
                if coins[t * H + k]:
                    h = h + (p / eta) * (xh.mean(0) - xh)
                    x = np.tile(xh.mean(0), (3, 1))
                else:
                    x = xh
            path.append(x.mean(0))
        weight = np.prod([p if c else 1 - p for c in coins])
        mean += weight * np.array(path)
        mse += weight * np.sum((np.array(path) - star) ** 2, axis=1)
    alg = fj.scaffnew(eta, p, H)
    np.testing.assert_allclose(theory.exact_mean(quiet, alg, T, theta0=theta0), mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(theory.exact_mse(quiet, alg, T, theta0=theta0), mse, rtol=1e-12)


@pytest.mark.parametrize("case", ["gaussian", "td"])
def test_monte_carlo_matches_exact_mean_and_mse(het_gaussian, td3, case):
    if case == "gaussian":
        problem, alg, T, n, theta0 = (
            het_gaussian,
            fj.scaffnew(0.15, 0.1, 4),
            30,
            4000,
            np.array([1.0, -1.0, 0.5]),
        )
    else:
        problem, alg, T, n, theta0 = td3, fj.scaffnew(1.0, 0.1, 5), 20, 40000, np.array([1.0, -1.0])
    res = fj.simulate(jax.random.key(7), problem, alg, T, n, theta0=theta0, record_every=2)
    mse = theory.exact_mse(problem, alg, T, theta0=theta0)[res.rounds]
    mean = theory.exact_mean(problem, alg, T, theta0=theta0)[res.rounds]
    z = (res.mse_mean[1:] - mse[1:]) / res.mse_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    z = (res.theta_mean[1:] - mean[1:]) / res.theta_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    # power: the curve moves far more than the tolerance, and the coin's mixture matters (with p = 1
    # the same step size gives another mean)
    assert mse[0] - mse[-1] > 20 * Z_TOL * res.mse_sem[-1]
    every_step = theory.exact_mean(
        problem, fj.scaffnew(alg.config.step_size, 1.0, alg.num_local_steps), T, theta0=theta0
    )[res.rounds]
    assert np.max(np.abs(res.theta_mean[1:] - every_step[1:]) / res.theta_sem[1:]) > 2 * Z_TOL
    # communications: N Binomial(T H, p) per seed
    N, H, p = problem.num_agents, alg.num_local_steps, alg.config.comm_prob
    sd = N * np.sqrt(T * H * p * (1 - p))
    assert abs(res.communications[-1] - T * H * p * N) < Z_TOL * sd / np.sqrt(n)


def test_lossy_channel_mean_and_delivered_counts(het_gaussian):
    q, s = fj.channel.rand_k(2), 0.6
    alg = fj.scaffnew(0.15, 0.5, 3, quantizer=q, success_prob=s)
    T, n, theta0 = 24, 4000, np.array([1.0, -1.0, 0.5])
    res = fj.simulate(jax.random.key(8), het_gaussian, alg, T, n, theta0=theta0, record_every=4)
    mean = theory.exact_mean(het_gaussian, alg, T, theta0=theta0)[res.rounds]
    z = (res.theta_mean[1:] - mean[1:]) / res.theta_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    lossless = theory.exact_mean(het_gaussian, fj.scaffnew(0.15, 0.5, 3), T, theta0=theta0)[res.rounds]
    assert np.max(np.abs(res.theta_mean[1:] - lossless[1:]) / res.theta_sem[1:]) > 3 * Z_TOL
    # delivered messages per seed: sum over T H steps of coin x Binomial(N, s)
    N, K, p = 3, T * 3, 0.5
    var = K * (p * (N * s * (1 - s) + (N * s) ** 2) - (p * N * s) ** 2)
    assert abs(res.messages_delivered[-1] - K * p * N * s) < Z_TOL * np.sqrt(var / n)
    np.testing.assert_allclose(res.bits_sent, res.communications * q.bits(3), rtol=1e-15)
    np.testing.assert_allclose(res.bits_delivered, res.messages_delivered * q.bits(3), rtol=1e-15)
    with pytest.raises(ValueError, match="Scaffnew with an exact channel only.*exact_mean covers"):
        theory.exact_mse(het_gaussian, alg, 3)


def test_no_heterogeneity_bias_and_control_variates_reach_their_floor(het_gaussian):
    eta, p, H, T, n = 0.1, 0.2, 8, 60, 4000
    star = np.asarray(het_gaussian.theta_star)
    alg = fj.scaffnew(eta, p, H)
    bias = theory.fedlsa_bias(het_gaussian, eta, H)
    assert np.linalg.norm(bias) > 1e-2  # a heterogeneous problem: FedLSA is biased
    np.testing.assert_allclose(theory.exact_mean(het_gaussian, alg, 200)[-1], star, rtol=1e-9, atol=1e-12)
    res = fj.simulate(
        jax.random.key(9), het_gaussian, alg, T, n, record_every=5, metrics=["control_variate_error"]
    )
    assert np.max(np.abs(res.theta_mean[-1] - star) / res.theta_sem[-1]) < Z_TOL
    # power: FedLSA's limit (theta_star + bias, tests/test_algorithms.py) would be far outside that band
    assert np.max(np.abs(bias) / res.theta_sem[-1]) > 3 * Z_TOL
    # mean_c E|xi_c - xi_c*|^2 read off the exact second moments
    A, b = np.asarray(het_gaussian.A_bar), np.asarray(het_gaussian.b_bar)
    xi_star = np.einsum("cij,j->ci", A, star) - b
    d, N = 3, 3
    xi = [slice(1 + d + c * d, 1 + d + (c + 1) * d) for c in range(N)]
    _, moments = theory._second_moments(het_gaussian, alg, T)
    exact = np.array(
        [
            np.mean(
                [
                    np.trace(S[xi[c], xi[c]]) - 2 * xi_star[c] @ S[0, xi[c]] + xi_star[c] @ xi_star[c]
                    for c in range(N)
                ]
            )
            for S in moments
        ]
    )[res.rounds]
    cv = res.metrics["control_variate_error"]
    assert cv.mean[0] == pytest.approx(exact[0], rel=1e-12)  # xi = 0 at start: mean_c |xi_c*|^2
    z = (cv.mean[1:] - exact[1:]) / cv.sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    # it decreases to a floor set by the noise (flat over the last rounds, far below the start)
    assert 0 < exact[-1] < 0.2 * exact[0]
    assert abs(exact[-1] - exact[-2]) < 1e-4 * exact[-1]
    assert cv.mean[0] - cv.mean[-1] > 20 * Z_TOL * cv.sem[-1]


def test_float32_control_variates_keep_summing_to_zero():
    """The control-variate step divides by eta / p: in float32 the increments' rounding errors would
    make sum_c xi_c drift unless their sum is removed at every communication."""
    problem = fj.problems.garnet(jax.random.key(0), num_agents=10, dtype="float32")
    alg, T = fj.scaffnew(0.01, 0.5, 4), 5000
    state = alg.init(jax.random.key(0), problem, jnp.zeros(problem.dim, jnp.float32))

    def body(s, t):
        return alg.step(jax.random.fold_in(jax.random.key(2), t), s, problem)[0], None

    state = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(T))[0])(state)
    scale = float(jnp.max(jnp.abs(state.xi)))
    assert scale > 0 and float(jnp.max(jnp.abs(state.xi.sum(0)))) < 1e-4 * scale  # 0.4 * scale without it


def test_mean_stability_bound(het_gaussian):
    # identical scalar agents a: the mean iterate moves by (1 - eta a) every local step and the
    # disagreement (x_c - xbar, h_c) is stable below 2 / a for every p, so the bound is 2 / a
    a = 0.8
    scalar = fj.problems.gaussian_lsa(np.full((3, 1, 1), a), np.ones((3, 1)), noise_A=0.0, noise_b=0.0)
    for p in (1.0, 0.3):
        assert theory.max_stable_step_size(scalar, fj.scaffnew(0.1, p, 4)) == pytest.approx(2 / a, rel=1e-5)
    # heterogeneous: the exact mean grows just above the bound and contracts just below
    eta = theory.max_stable_step_size(het_gaussian, fj.scaffnew(0.1, 0.5, 5))
    far = np.ones(3) * 10
    for factor, grows in ((0.98, False), (1.02, True)):
        m = theory.exact_mean(het_gaussian, fj.scaffnew(eta * factor, 0.5, 5), 400, theta0=far)
        dist = np.linalg.norm(m - np.asarray(het_gaussian.theta_star), axis=1)
        assert (dist[-1] > dist[0]) == grows


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(step_size=0.0), "step_size=0.0 is invalid"),
        (dict(comm_prob=0.0), r"comm_prob=0.0 is invalid: expected a finite real number in \(0.0, 1.0\]"),
        (dict(comm_prob=1.5), "comm_prob=1.5 is invalid"),
        (dict(comm_prob=float("nan")), "comm_prob=nan is invalid"),
        (dict(comm_prob="often"), "comm_prob='often' is invalid: expected a real number"),
        (dict(num_local_steps=0), "num_local_steps=0 is invalid"),
        (dict(num_local_steps=2.5), "num_local_steps=2.5 is invalid"),
        (dict(skip=0), "skip=0 is invalid"),
        (dict(success_prob=0.0), "success_prob=0.0 is invalid"),
        (dict(quantizer="4 bits"), "quantizer='4 bits' is invalid"),
        (dict(aggregation="mean"), "aggregation='mean' is invalid"),
    ],
)
def test_bad_inputs(kwargs, match):
    args = dict(step_size=0.1, comm_prob=0.5, num_local_steps=4) | kwargs
    with pytest.raises(ValueError, match=match):
        fj.scaffnew(**args)
