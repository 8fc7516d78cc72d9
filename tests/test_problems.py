"""Problem families: exact systems, fixed points, samplers against their laws."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax.problems._base import alias_draw, alias_tables
from fedsa_jax.problems.generators import is_primitive


def direct_td_system(P, r, Phi, gamma):
    """A_bar, b_bar by summing over (s, s') pairs: E[phi(s)(phi(s) - gamma phi(s'))^T], E[r(s) phi(s)]."""
    S = P.shape[0]
    # stationary law by power iteration (independent of the library's linear solve)
    mu = np.full(S, 1.0 / S)
    for _ in range(20000):
        mu = mu @ P
    A = np.zeros((Phi.shape[1],) * 2)
    b = np.zeros(Phi.shape[1])
    for s in range(S):
        b += mu[s] * r[s] * Phi[s]
        for s2 in range(S):
            A += mu[s] * P[s, s2] * np.outer(Phi[s], Phi[s] - gamma * Phi[s2])
    return mu, A, b


def test_td_system_matches_direct_sum(tiny_td):
    P, r, Phi = tiny_td
    p = fj.problems.federated_td(P, r, Phi, 0.9)
    for c in range(3):
        mu, A, b = direct_td_system(P[c], r[c], Phi, 0.9)
        np.testing.assert_allclose(p.stationary[c], mu, rtol=1e-10)
        np.testing.assert_allclose(p.A_bar[c], A, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(p.b_bar[c], b, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(np.mean(p.A_bar, 0) @ p.theta_star, np.mean(p.b_bar, 0), atol=1e-12)
    for c in range(3):
        np.testing.assert_allclose(p.A_bar[c] @ p.local_theta_star[c], p.b_bar[c], atol=1e-12)


def test_gaussian_fixed_points(het_gaussian):
    p = het_gaussian
    np.testing.assert_allclose(np.mean(p.A_bar, 0) @ p.theta_star, np.mean(p.b_bar, 0), atol=1e-12)
    for c in range(p.num_agents):
        np.testing.assert_allclose(p.A_bar[c] @ p.local_theta_star[c], p.b_bar[c], atol=1e-12)
    # heterogeneity 0 makes every agent the same
    q = fj.problems.random_gaussian_lsa(jax.random.key(3), 3, 3, heterogeneity=0.0)
    np.testing.assert_array_equal(q.A_bar[0], q.A_bar[2])
    np.testing.assert_allclose(q.local_theta_star, np.broadcast_to(q.theta_star, (3, 3)), atol=1e-12)
    # every agent's matrix is positive definite at full heterogeneity
    for A in np.asarray(p.A_bar):
        assert np.linalg.eigvalsh((A + A.T) / 2).min() > 0


def binomial_check(counts, probs, n):
    """Each count within Z_TOL binomial standard errors of n * prob."""
    sd = np.sqrt(n * probs * (1 - probs)) + 1e-12
    z = np.abs(counts - n * probs) / sd
    assert np.all(z[probs > 0] < Z_TOL), z
    assert np.all(counts[probs == 0] == 0)


def test_alias_tables_sample_exact_law():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(7) * 0.5)
    probs[3] = 0.0
    probs /= probs.sum()
    prob, al = alias_tables(probs)
    u = jax.random.uniform(jax.random.key(0), (400_000,), jnp.float64)
    draws = np.asarray(alias_draw(jnp.asarray(prob), jnp.asarray(al), 0, u, 7))
    binomial_check(np.bincount(draws, minlength=7), probs, len(draws))


def test_generative_pairs_follow_mu_times_P(tiny_td):
    P, r, Phi = tiny_td
    p = fj.problems.federated_td(P, r, Phi, 0.9)
    assert p.describe()["sampler"] == "pair_tables"  # recorded: the stream differs from per-state draws
    assert fj.problems.federated_td(P, r, Phi, 0.9, sampling="markov").describe()["sampler"] == "per_state"
    u = p.randomness(jax.random.key(0), 3, 100_000)
    obs, _ = jax.vmap(p.observe, (0, None, 0))(p.agent_params(), 0, u)
    for c in range(3):
        pair = np.asarray(obs.state[c] * 4 + obs.next_state[c])
        law = (np.asarray(p.stationary[c])[:, None] * P[c]).ravel()
        binomial_check(np.bincount(pair, minlength=16), law, len(pair))
        np.testing.assert_array_equal(np.asarray(obs.reward[c]), r[c][np.asarray(obs.state[c])])


def test_markov_chain_is_carried_and_stationary(tiny_td):
    P, r, Phi = tiny_td
    p = fj.problems.federated_td(P, r, Phi, 0.9, sampling="markov")
    n, H = 20_000, 3
    keys = jax.random.split(jax.random.key(5), n)
    s0 = jax.vmap(p.init_sampler, (0, None))(keys, jnp.int32(1))

    def two_rounds(k, s):
        k1, k2 = jax.random.split(k)
        o1, s = p.observe(1, s, p.randomness(k1, 1, H)[0])
        o2, s = p.observe(1, s, p.randomness(k2, 1, H)[0])
        return o1, o2, s

    o1, o2, last = jax.vmap(two_rounds)(keys, s0)
    s_all = np.concatenate([np.asarray(o1.state), np.asarray(o2.state)], 1)
    n_all = np.concatenate([np.asarray(o1.next_state), np.asarray(o2.next_state)], 1)
    # one trajectory: each observation starts where the previous ended, across rounds
    np.testing.assert_array_equal(s_all[:, 1:], n_all[:, :-1])
    np.testing.assert_array_equal(np.asarray(last), n_all[:, -1])
    np.testing.assert_array_equal(s_all[:, 0], np.asarray(s0))
    # started from mu, the chain stays stationary: every time's marginal is mu
    mu = np.asarray(p.stationary[1])
    for t in (0, 2 * H - 1):
        binomial_check(np.bincount(s_all[:, t], minlength=4), mu, n)
    # transitions follow P
    first = s_all[:, 0] == 2
    binomial_check(np.bincount(n_all[first, 0], minlength=4), P[1, 2], int(first.sum()))


def test_garnet_structure():
    p = fj.problems.garnet(jax.random.key(0), num_agents=4)
    assert (p.num_agents, p.num_states, p.dim) == (4, 30, 8)
    assert float(p.gamma) == 0.95
    np.testing.assert_allclose(np.asarray(p.features).sum(1), 1.0, atol=1e-12)
    P = np.asarray(p.transitions)
    assert np.all((P > 0).sum(-1) <= 2 * 2)  # 2 actions x branching 2
    assert all(is_primitive(P[c]) for c in range(4))
    # heterogeneous: even agents share a kernel's support, odd agents another; rewards flip sign
    R = np.asarray(p.rewards)
    assert np.all(np.abs(R[0] + R[1]) <= 2 * 0.02 + 1e-12)  # r + U0 - r + U1
    assert np.array_equal(P[0] > 0, P[2] > 0) and not np.array_equal(P[0] > 0, P[1] > 0)
    h = fj.problems.garnet(jax.random.key(0), num_agents=4, heterogeneity="homogeneous")
    Ph = np.asarray(h.transitions)
    assert all(np.array_equal(Ph[0] > 0, Ph[c] > 0) for c in range(4))
    Rh = np.asarray(h.rewards)
    assert np.all(np.abs(Rh - Rh[0]) <= 0.02 + 1e-12)
    # heterogeneity makes local solutions spread out
    spread = lambda q: np.linalg.norm(np.asarray(q.local_theta_star) - np.asarray(q.theta_star))  # noqa: E731
    assert spread(p) > 10 * spread(h)
    # deterministic in the key
    q = fj.problems.garnet(jax.random.key(0), num_agents=4)
    np.testing.assert_array_equal(np.asarray(q.transitions), P)


def test_qfedtd_mdp():
    p = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=5)
    assert (p.num_agents, p.num_states, p.dim, float(p.gamma), p.sampling) == (5, 20, 10, 0.5, "markov")
    Phi = np.asarray(p.features)
    np.testing.assert_allclose(Phi.T @ Phi, np.eye(10), atol=1e-12)
    np.testing.assert_array_equal(np.asarray(p.A_bar[0]), np.asarray(p.A_bar[4]))
    np.testing.assert_allclose(np.asarray(p.local_theta_star[2]), np.asarray(p.theta_star), atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_follows_problem(dtype, tiny_td):
    P, r, Phi = tiny_td
    p = fj.problems.federated_td(P, r, Phi, 0.9, dtype=dtype)
    assert p.A_bar.dtype == np.dtype(dtype)
    res = fj.simulate(jax.random.key(0), p, fj.fedlsa(0.1, 2), 3, 4)
    assert res.final_theta.dtype == np.dtype(dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _ScannedGaussian(fj.problems.GaussianLSA):
    """The Gaussian family with its directions restated: it declines ``error_local_steps``, so the
    algorithms scan ``error_direction`` vmapped the usual way (seeds leading)."""

    def error_direction(self, params, obs, error):
        return super().error_direction(params, obs, error)


@pytest.mark.parametrize("case", ["fedlsa", "scafflsa_schedule_momentum", "sweep"])
def test_gaussian_laid_out_steps_equal_the_scan(het_gaussian, case):
    """The Gaussian local steps in their own layout (agents leading, seeds last, in a custom
    batching rule) are the scan of ``error_direction``: same iterates, seed by seed, to rounding."""
    scanned = _ScannedGaussian(
        **{f.name: getattr(het_gaussian, f.name) for f in dataclasses.fields(het_gaussian)}
    )
    assert scanned.error_local_steps(*([None] * 5)) is None
    theta0 = np.ones(het_gaussian.dim)
    if case == "sweep":  # a vmap over configurations: a third batch level
        configs = fj.grid(step_size=[0.05, 0.1])
        build = lambda p: lambda c: (p, fj.fedlsa(c["step_size"], 4))  # noqa: E731
        runs = [
            fj.sweep(jax.random.key(2), configs, build(p), 6, 8, theta0=theta0, progress=False)
            for p in (het_gaussian, scanned)
        ]
        results = [[e.result for e in r] for r in runs]
    else:
        if case == "fedlsa":
            alg = fj.fedlsa(0.1, 5)
        else:
            alg = fj.scafflsa(
                optax.exponential_decay(0.1, 5, 0.9), 5, server_optimizer=optax.sgd(1.0, momentum=0.5)
            )
        results = [
            [fj.simulate(jax.random.key(2), p, alg, 6, 8, theta0, keep_seeds=8)]
            for p in (het_gaussian, scanned)
        ]
    for fast, slow in zip(*results):
        np.testing.assert_allclose(fast.theta_mean, slow.theta_mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(fast.seed_mse, slow.seed_mse, rtol=1e-12, atol=1e-14)
        assert np.all(fast.mse_mean[-1] < fast.mse_mean[0])  # it moved
