"""Federated SARSA: observations that follow the iterate, checked against numpy written from the
definitions (trajectory for trajectory on the same random numbers), the references against an
independent root solve, the noise-free limits against their fixed-point equations, and the linear
theory's refusals."""

import jax
import numpy as np
import pytest
from reference import assert_gap_to_noise_free_limit_halves
from scipy import optimize

import fedsa_jax as fj
from fedsa_jax.channel.cohorts import (
    round_cohort,
)

N, S, A, D = 3, 3, 2, 3
GAMMA, TAU = 0.8, 1.0


@pytest.fixture(scope="module")
def mdp():
    rng = np.random.default_rng(5)
    P = rng.uniform(size=(N, S, A, S)) + 0.05
    P /= P.sum(-1, keepdims=True)
    r = rng.uniform(size=(N, S, A))
    Phi = rng.uniform(size=(S, A, D))
    return P, r, Phi


@pytest.fixture(scope="module")
def problem(mdp):
    P, r, Phi = mdp
    return fj.problems.sarsa(P, r, Phi, GAMMA, TAU)


# --- numpy, from the definitions ---------------------------------------------------------------------


def np_policy(q):
    e = np.exp((q - q.max()) / TAU)
    return e / e.sum()


def np_action(p, u):
    return int(np.sum(np.cumsum(p[:-1]) <= u))


def np_stationary(M):
    """The stationary law of ``M`` from its eigenvector of eigenvalue 1 (not a linear solve)."""
    w, v = np.linalg.eig(M.T)
    mu = np.real(v[:, np.argmin(np.abs(w - 1))])
    return mu / mu.sum()


def np_mean_field(P, r, Phi, theta):
    """g(theta) of DESIGN's definition: sum nu(s,a) [r + gamma E[phi(s',a')^T theta] - phi^T theta] phi."""
    q = Phi @ theta
    pi = np.stack([np_policy(q[s]) for s in range(S)])
    mu = np_stationary(np.einsum("sa,sat->st", pi, P))
    g = np.zeros(D)
    for s in range(S):
        for a in range(A):
            expected_next = sum(P[s, a, t] * pi[t] @ q[t] for t in range(S))
            g += mu[s] * pi[s, a] * (r[s, a] + GAMMA * expected_next - q[s, a]) * Phi[s, a]
    return g


class NumpySARSA:
    """One seed of FedSARSA / drift-corrected FedSARSA, the kernel's random numbers read from it."""

    def __init__(self, mdp, eta, H, control_variates, topk=None):
        self.P, self.r, self.Phi = mdp
        self.prob, self.alias = fj.problems.alias_tables(self.P)
        self.eta, self.H, self.cv, self.topk = eta, H, control_variates, topk

    def next_state(self, c, s, a, u):
        x = u * S
        i = min(int(x), S - 1)
        return i if x - i < self.prob[c, s, a, i] else int(self.alias[c, s, a, i])

    def start(self, key, theta0):
        self.theta = np.array(theta0, float)
        self.xi = np.zeros((N, D))
        self.pairs = []
        for k in jax.random.split(key, N):
            u = np.asarray(jax.random.uniform(k, (2,), np.float64))
            s = min(int(u[0] * S), S - 1)
            self.pairs.append((s, np_action(np_policy(self.Phi[s] @ self.theta), u[1])))

    def local(self, c, u):
        th = self.theta.copy()
        s, a = self.pairs[c]
        for h in range(self.H):
            s2 = self.next_state(c, s, a, u[h, 0])
            a2 = np_action(np_policy(self.Phi[s2] @ th), u[h, 1])
            td = self.r[c, s, a] + GAMMA * self.Phi[s2, a2] @ th - self.Phi[s, a] @ th
            th = th + self.eta * (td * self.Phi[s, a] + (self.xi[c] if self.cv else 0.0))
            s, a = s2, a2
        self.pairs[c] = (s, a)
        return th - self.theta

    def quantize(self, m):
        if self.topk is None:
            return m
        keep = np.argsort(-np.abs(m), kind="stable")[: self.topk]
        out = np.zeros_like(m)
        out[keep] = m[keep]
        return out

    def round(self, u, cohort):
        agents = [c for c in range(N) if cohort[c]]
        sent = {c: self.quantize(self.local(c, u[c])) for c in agents}
        mean = sum(sent.values()) / len(agents)
        if self.cv:
            for c in agents:
                self.xi[c] += (mean - sent[c]) / (self.eta * self.H)
        self.theta = self.theta + mean


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
@pytest.mark.parametrize("cohort", [None, 2])
@pytest.mark.parametrize("topk", [None, 2])
def test_kernel_equals_numpy_loop(mdp, problem, name, cohort, topk):
    eta, H, T = 0.3, 4, 6
    quantizer = None if topk is None else fj.channel.top_k(topk)
    alg = getattr(fj, name)(eta, H, clients_per_round=cohort, quantizer=quantizer)
    ref = NumpySARSA(mdp, eta, H, control_variates=name == "scafflsa", topk=topk)
    theta0 = np.array([1.0, -2.0, 0.5])
    key = jax.random.key(11)
    state = alg.init(key, problem, jax.numpy.asarray(theta0))
    ref.start(key, theta0)
    assert [int(p) for p in state.sampler] == [s * A + a for s, a in ref.pairs]
    step = jax.jit(alg.step_from)
    for t in range(T):
        rand = alg.randomness(jax.random.key(100 + t), problem)
        mask = round_cohort(rand, alg.config, problem)
        ref.round(np.asarray(rand.obs), np.ones(N, bool) if mask is None else np.asarray(mask))
        state, _ = step(rand, state, problem)
        np.testing.assert_allclose(np.asarray(state.theta), ref.theta, rtol=1e-10, atol=1e-12)
        assert [int(p) for p in state.sampler] == [s * A + a for s, a in ref.pairs]
    if name == "scafflsa":
        np.testing.assert_allclose(np.asarray(state.xi), ref.xi, rtol=1e-9, atol=1e-11)


def test_qfedtd_is_one_step_rounds(mdp, problem):
    """QFedTD on SARSA: one SARSA step per agent and round at the server iterate, then averaging."""
    alg = fj.qfedtd(0.3)
    ref = NumpySARSA(mdp, 0.3, 1, control_variates=False)
    key = jax.random.key(3)
    state = alg.init(key, problem, jax.numpy.zeros(D))
    ref.start(key, np.zeros(D))
    for t in range(5):
        rand = alg.randomness(jax.random.key(t), problem)
        ref.round(np.asarray(rand.obs), np.ones(N, bool))
        state, _ = alg.step_from(rand, state, problem)
    np.testing.assert_allclose(np.asarray(state.theta), ref.theta, rtol=1e-10, atol=1e-12)


def test_references_against_an_independent_root_solve(mdp, problem):
    P, r, Phi = mdp

    def fed_field(th):
        return np.mean([np_mean_field(P[c], r[c], Phi, th) for c in range(N)], 0)

    fed = optimize.root(fed_field, np.zeros(D), tol=1e-14)
    np.testing.assert_allclose(np.asarray(problem.theta_star), fed.x, atol=1e-10)
    for c in range(N):
        own = optimize.root(lambda th, c=c: np_mean_field(P[c], r[c], Phi, th), fed.x, tol=1e-14)
        np.testing.assert_allclose(np.asarray(problem.local_theta_star[c]), own.x, atol=1e-10)
    avg = optimize.root(lambda th: np_mean_field(P.mean(0), r.mean(0), Phi, th), fed.x, tol=1e-14)
    np.testing.assert_allclose(np.asarray(problem.theta_avg), avg.x, atol=1e-10)
    # the frozen-policy systems reproduce the mean field at theta_star, and solve to theta_star
    star = np.asarray(problem.theta_star)
    for c in range(N):
        g = np.asarray(problem.b_bar[c]) - np.asarray(problem.A_bar[c]) @ star
        np.testing.assert_allclose(g, np_mean_field(P[c], r[c], Phi, star), atol=1e-12)
    theta, _ = fj.problems.fixed_points(problem.A_bar, problem.b_bar)
    np.testing.assert_allclose(theta, star, atol=1e-10)


def np_noise_free_round(mdp, theta, xi, eta, H):
    """One noise-free round from the definitions: each agent's H steps follow g_c, then averaging
    (and SCAFFLSA's control variates when ``xi`` is given)."""
    P, r, Phi = mdp
    local = []
    for c in range(N):
        th = theta.copy()
        for _ in range(H):
            th = th + eta * (np_mean_field(P[c], r[c], Phi, th) + (0.0 if xi is None else xi[c]))
        local.append(th)
    local = np.array(local)
    new = local.mean(0)
    return new, None if xi is None else xi + (new - local) / (eta * H)


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_mean_path_and_its_limit(mdp, problem, name):
    eta, H = 0.2, 5
    alg = getattr(fj, name)(eta, H)
    theta0 = np.array([1.0, 0.0, -1.0])
    path = fj.theory.mean_path(problem, alg, 3, theta0)
    theta, xi = theta0, (np.zeros((N, D)) if name == "scafflsa" else None)
    for t in range(3):
        theta, xi = np_noise_free_round(mdp, theta, xi, eta, H)
        np.testing.assert_allclose(path[t + 1], theta, atol=1e-12)
    limit = fj.theory.mean_path_limit(problem, alg)
    star = np.asarray(problem.theta_star)
    if name == "fedlsa":  # a fixed point of the round
        np.testing.assert_allclose(np_noise_free_round(mdp, limit, None, eta, H)[0], limit, atol=1e-10)
        assert np.linalg.norm(limit - star) > 1e-4  # local steps on heterogeneous agents: a bias
        h1 = fj.theory.mean_path_limit(problem, fj.fedlsa(eta, 1))
        np.testing.assert_allclose(h1, star, atol=1e-10)  # H = 1: the federated limit itself
    else:
        # At a fixed point each agent's loop closes (theta^c_H = theta); xi_c = -g_c(theta) keeps every
        # local iterate at theta, and sum_c xi_c = 0 then makes theta the root of mean_c g_c: the
        # drift-corrected noise-free limit is theta_lim_fed at every eta and H.
        np.testing.assert_allclose(limit, star, atol=1e-10)
        path = fj.theory.mean_path(problem, alg, 2000)
        np.testing.assert_allclose(path[-1], limit, atol=1e-6)


def test_linear_problem_mean_path_is_exact_mean(het_gaussian):
    """On a linear problem the noise-free path is the exact mean recursion (a reduction)."""
    alg = fj.scafflsa(0.1, 4)
    np.testing.assert_allclose(
        fj.theory.mean_path(het_gaussian, alg, 6), fj.theory.exact_mean(het_gaussian, alg, 6), atol=1e-12
    )


def test_linear_theory_refuses(problem):
    alg = fj.fedlsa(0.1, 4)
    calls = {
        "exact_mean": lambda: fj.theory.exact_mean(problem, alg, 3),
        "exact_mse": lambda: fj.theory.exact_mse(problem, alg, 3),
        "stationary_mean": lambda: fj.theory.stationary_mean(problem, alg),
        "stationary_mse": lambda: fj.theory.stationary_mse(problem, alg),
        "fedlsa_bias": lambda: fj.theory.fedlsa_bias(problem, 0.1, 4),
        "max_stable_step_size": lambda: fj.theory.max_stable_step_size(problem, "fedlsa", 4),
        "mixing_time": lambda: fj.theory.mixing_time(problem),
        "exact_sd": lambda: fj.inference.exact_sd(problem, alg, 3, np.ones(D)),
        "noise_free_mean_field": lambda: fj.theory.exact_mean(fj.problems.expected(problem), alg, 3),
    }
    for what, call in calls.items():
        refusal = "problem=.*is invalid: .*(follow the iterate|not affine)"
        with pytest.raises(ValueError, match=refusal) as err:
            call()
        assert "\n" not in str(err.value), what
    with pytest.raises(ValueError, match="plug-in covariance"):
        fj.simulate(jax.random.key(0), problem, fj.plug_in(alg), 2, 2, progress=False)


@pytest.mark.parametrize(
    "algorithm",
    [lambda: fj.scaffnew(0.1, 0.5, 4), lambda: fj.fedbuff(0.1, 4, 2)],
    ids=["scaffnew", "fedbuff"],
)
def test_algorithms_that_draw_a_round_first_refuse(problem, algorithm):
    with pytest.raises(ValueError, match="draws a round's observations before its local steps"):
        fj.simulate(jax.random.key(0), problem, algorithm(), 2, 2, progress=False)


def test_bad_input_named(mdp):
    P, r, Phi = mdp
    with pytest.raises(ValueError, match="temperature=0.0 is invalid"):
        fj.problems.sarsa(P, r, Phi, GAMMA, temperature=0.0)
    with pytest.raises(ValueError, match="transitions=.*row-stochastic"):
        fj.problems.sarsa(P * 2, r, Phi, GAMMA)
    with pytest.raises(ValueError, match="features=.*full column rank"):
        fj.problems.sarsa(P, r, np.ones((S, A, 2)), GAMMA)
    with pytest.raises(ValueError, match="skip=2 is invalid"):
        fj.simulate(jax.random.key(0), fj.problems.sarsa(P, r, Phi, GAMMA), fj.fedlsa(0.1, 2, skip=2), 2, 2)
    with pytest.raises(ValueError, match="generation_seeds=.*nonnegative integers"):
        fj.problems.garnet_control(generation_seeds=(0, -1))


def test_garnet_control_draws_as_the_papers_code():
    """The peer's GarnetEnv, written out: per (s, a) ``rng.choice(S, B, replace=False)``, then the
    probabilities ``(S, A, B)`` normalised, then the rewards ``(S, A)``."""
    rng = np.random.default_rng(1)
    succ = np.array([[rng.choice(10, 2, replace=False) for _ in range(3)] for _ in range(10)])
    probs = rng.uniform(size=(10, 3, 2))
    probs /= probs.sum(2, keepdims=True)
    rewards = rng.uniform(0, 1, size=(10, 3))
    P, r = fj.problems.garnet_control_mdp(10, 3, 2, 1)
    np.testing.assert_array_equal(r, rewards)
    for s in range(10):
        for a in range(3):
            np.testing.assert_array_equal(P[s, a, succ[s, a]], probs[s, a])
            assert P[s, a].sum() == pytest.approx(1.0)
    p = fj.problems.garnet_control(num_agents=4)
    np.testing.assert_array_equal(np.asarray(p.transitions[2]), np.asarray(p.transitions[0]))
    np.testing.assert_allclose(np.asarray(p.transitions[1]), P)
    half = fj.problems.garnet_control(num_agents=4, heterogeneity=0.0)
    np.testing.assert_allclose(np.asarray(half.transitions[0]), np.asarray(half.transitions[1]))
    np.testing.assert_allclose(np.asarray(half.theta_avg), np.asarray(p.theta_avg), atol=1e-8)


@pytest.mark.slow  # about a minute: run with -m slow
def test_monte_carlo_approaches_the_noise_free_limit_as_the_step_shrinks():
    """The stationary mean of FedSARSA (Polyak-Ruppert averages, many seeds) minus the noise-free
    H-step limit at the same step is O(eta): halving eta halves the gap, within Monte Carlo error."""
    rng = np.random.default_rng(2)
    P = rng.uniform(size=(2, 2, 2, 2)) + 0.2
    P /= P.sum(-1, keepdims=True)
    prob = fj.problems.sarsa(P, rng.uniform(size=(2, 2, 2)), np.eye(4).reshape(2, 2, 4), 0.5, 0.5)
    assert_gap_to_noise_free_limit_halves(prob, H=2)


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_tabular_fast_path_equals_the_generic_scan(mdp, name):
    """One-hot features run SARSA's own O(A) local steps (``error_observed_steps``): the same draws
    and iterates as the generic scan over ``observe_step`` and ``error_direction``."""
    import dataclasses

    P, r, _ = mdp
    tabular = fj.problems.sarsa(P, r, np.eye(S * A).reshape(S, A, S * A), GAMMA, TAU)
    assert tabular.one_hot
    generic = dataclasses.replace(tabular, one_hot=False)
    alg = getattr(fj, name)(0.3, 5)
    runs = [
        fj.simulate(jax.random.key(4), p, alg, 8, 16, theta0=np.ones(S * A), keep_seeds=16, progress=False)
        for p in (tabular, generic)
    ]
    np.testing.assert_allclose(runs[0].final_theta, runs[1].final_theta, rtol=1e-12, atol=1e-12)


def test_noise_free_refusals(problem):
    with pytest.raises(ValueError, match="num_local_steps='a table' is invalid"):
        fj.theory.mean_path_limit(problem, fj.fedlsa(0.1, [1, 2, 3]))
    with pytest.raises(ValueError, match="step_size='a schedule' is invalid"):
        fj.theory.mean_path_limit(
            problem, fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=0.1, k0=10.0), 2)
        )
    with pytest.raises(ValueError, match="algorithm='fedlsa' is invalid: its rounds draw random numbers"):
        fj.theory.mean_path(problem, fj.fedlsa(0.1, 2, clients_per_round=2), 3)


@pytest.mark.parametrize("family", ["gaussian", "td_markov", "least_squares"])
def test_problems_that_do_not_follow_the_iterate_run_as_before(family, het_gaussian, tiny_td_sampled):
    """``observed_updates`` leaves today's problems on the code they ran before: the round's
    observations drawn first, then ``local_updates`` (with a control variate), to float rounding: the
    two programs are compiled on their own, and XLA may vectorise them differently (a unit in the last
    place on some CPUs)."""
    from fedsa_jax.algorithms._base import ErrorCoordinates

    rng = np.random.default_rng(0)
    problem = {
        "gaussian": het_gaussian,
        "td_markov": tiny_td_sampled["markov"],
        "least_squares": fj.problems.least_squares(rng.normal(size=(3, 9, 2)), rng.normal(size=(3, 9))),
    }[family]
    view = ErrorCoordinates(problem)
    alg = fj.fedlsa(0.1, 4)
    rand = alg.randomness(jax.random.key(2), problem)
    samplers = fj.algorithms.init_samplers(jax.random.key(3), problem)
    params = problem.agent_params()
    error = jax.numpy.full((problem.dim,), 0.3, problem.dtype)
    controls = jax.numpy.asarray(rng.normal(size=(problem.num_agents, problem.dim)), problem.dtype)

    def before(r, p, s, control):
        obs, s = problem.observe(p, s, r, 1)
        return fj.algorithms.local_updates(view, p, obs, error, 0.1, control), s

    expected = jax.jit(jax.vmap(before))(rand.obs, params, samplers, controls)
    now = jax.jit(lambda: fj.algorithms.run_agents(rand.obs, view, samplers, error, 0.1, controls=controls))()
    ulps = 4 * np.finfo(problem.dtype).eps
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(now)):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=ulps, atol=ulps * np.abs(a).max())
