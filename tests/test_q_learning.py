"""Federated Q-learning: the references against value iteration and the Bellman equation of the
optimal policy, the kernel against numpy written from the definitions (trajectory for trajectory on
the same random numbers), the noise-free E-step limit against its fixed-point equation, and the
refusals."""

import jax
import numpy as np
import pytest
from reference import assert_gap_to_noise_free_limit_halves

import fedsa_jax as fj
from fedsa_jax.algorithms.importance_averaging import importance_weights
from fedsa_jax.channel.cohorts import (
    round_cohort,
)

N, S, A = 3, 4, 2
GAMMA = 0.8


@pytest.fixture(scope="module")
def mdp():
    rng = np.random.default_rng(3)
    P = rng.uniform(size=(N, S, A, S)) + 0.05
    P /= P.sum(-1, keepdims=True)
    r = rng.uniform(size=(N, S, A))
    b = rng.uniform(size=(N, S, A)) + 0.1
    b /= b.sum(-1, keepdims=True)
    return P, r, b


@pytest.fixture(scope="module")
def problems(mdp):
    P, r, b = mdp
    return {
        "synchronous": fj.problems.q_learning(P, r, GAMMA),
        "asynchronous": fj.problems.q_learning(P, r, GAMMA, sampling="asynchronous", behaviour=b),
    }


# --- numpy, from the definitions ---------------------------------------------------------------------


def np_value_iteration(P, r, tol=1e-13):
    Q = np.zeros(r.shape)
    while True:
        new = r + GAMMA * P @ Q.max(1)
        if np.abs(new - Q).max() < tol:
            return new
        Q = new


def np_stationary(M):
    w, v = np.linalg.eig(M.T)
    mu = np.real(v[:, np.argmin(np.abs(w - 1))])
    return mu / mu.sum()


def test_optimal_q_is_value_iterations_and_solves_its_policys_bellman_equation(mdp):
    P, r, _ = mdp
    for c in range(N):
        Q = fj.problems.optimal_q(P[c], r[c], GAMMA)
        np.testing.assert_allclose(Q, np_value_iteration(P[c], r[c]), rtol=0, atol=1e-11)
        pi = Q.argmax(1)  # the optimal policy's own Bellman equation, one linear solve over pairs
        M = np.zeros((S * A, S * A))
        for s in range(S):
            for a in range(A):
                for t in range(S):
                    M[s * A + a, t * A + pi[t]] += GAMMA * P[c, s, a, t]
        np.testing.assert_allclose(np.linalg.solve(np.eye(S * A) - M, r[c].ravel()), Q.ravel(), atol=1e-12)


def test_references(mdp, problems):
    """theta_star: Q* of the averaged MDP (synchronous); the root of sum_c nu_c (T_c Q - Q) with
    each agent's behaviour occupancy (asynchronous); Q*_c; A_bar, b_bar solving to theta_star."""
    P, r, b = mdp
    sync, asyn = problems["synchronous"], problems["asynchronous"]
    Q_avg = np_value_iteration(P.mean(0), r.mean(0))
    np.testing.assert_allclose(np.asarray(sync.theta_star, np.float64), Q_avg.ravel(), atol=1e-11)
    np.testing.assert_allclose(np.asarray(sync.theta_avg, np.float64), Q_avg.ravel(), atol=1e-11)
    for c in range(N):
        np.testing.assert_allclose(
            np.asarray(sync.local_theta_star[c], np.float64),
            np_value_iteration(P[c], r[c]).ravel(),
            atol=1e-11,
        )
    Q = np.asarray(asyn.theta_star, np.float64).reshape(S, A)
    field = np.zeros((S, A))
    for c in range(N):
        mu = np_stationary(np.einsum("sa,sat->st", b[c], P[c]))
        field += mu[:, None] * b[c] * (r[c] + GAMMA * P[c] @ Q.max(1) - Q)
    assert np.abs(field).max() < 1e-12
    assert np.abs(Q.ravel() - Q_avg.ravel()).max() > 1e-3  # the occupancies move it: a real check
    for p in problems.values():
        A_bar, b_bar = np.asarray(p.A_bar, np.float64), np.asarray(p.b_bar, np.float64)
        solved = np.linalg.solve(A_bar.mean(0), b_bar.mean(0))
        np.testing.assert_allclose(solved, np.asarray(p.theta_star, np.float64), atol=1e-10)


class NumpyQ:
    """One seed of federated Q-learning with equal averaging, reading the kernel's random numbers."""

    def __init__(self, mdp, problem, eta, H):
        self.P, self.r, self.b = mdp
        self.mode = problem.mode
        self.P_prob, self.P_alias = fj.problems.alias_tables(self.P)
        self.b_prob, self.b_alias = fj.problems.alias_tables(np.asarray(problem.behaviour, np.float64))
        self.eta, self.H = eta, H

    @staticmethod
    def alias(prob, alias, u, K):
        x = u * K
        i = min(int(x), K - 1)
        return i if x - i < prob[i] else int(alias[i])

    def local(self, c, u, pair):
        Q = self.Q.copy()
        visits = np.zeros((S, A), int)
        for h in range(self.H):
            if self.mode == "synchronous":
                nxt = [
                    self.alias(self.P_prob[c, s, a], self.P_alias[c, s, a], u[h, s * A + a], S)
                    for s in range(S)
                    for a in range(A)
                ]
                Q = (1 - self.eta) * Q + self.eta * (self.r[c] + GAMMA * Q[nxt].max(1).reshape(S, A))
                visits += 1
            else:
                s, a = divmod(pair, A)
                s2 = self.alias(self.P_prob[c, s, a], self.P_alias[c, s, a], u[h, 0], S)
                a2 = self.alias(self.b_prob[c, s2], self.b_alias[c, s2], u[h, 1], A)
                Q[s, a] = (1 - self.eta) * Q[s, a] + self.eta * (self.r[c, s, a] + GAMMA * Q[s2].max())
                visits[s, a] += 1
                pair = s2 * A + a2
        return Q, pair, visits

    def round(self, u, pairs, cohort, importance=False, delivered=None, by_received=False):
        """Equal averaging over the cohort; or importance averaging (Woo, Joshi, Chi, eq. (14)): per
        entry, weights (1 - eta)^(-visits) normalised over the cohort (or over what was delivered),
        the delivered agents' differences added to Q_t."""
        agents = [c for c in range(N) if cohort[c]]
        delivered = cohort if delivered is None else delivered
        out = {c: self.local(c, u[c], pairs[c]) for c in agents}
        if not importance:
            self.Q = sum(out[c][0] for c in agents) / len(agents)
        else:
            norm = [c for c in agents if delivered[c]] if by_received else agents
            total = sum((1 - self.eta) ** -out[c][2].astype(float) for c in norm) if norm else 1.0
            self.Q = self.Q + sum(
                (1 - self.eta) ** -out[c][2].astype(float) / total * (out[c][0] - self.Q)
                for c in agents
                if delivered[c]
            )
        return [out[c][1] if c in out else pairs[c] for c in range(N)]


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
@pytest.mark.parametrize(
    "averaging,channel",
    [
        ("equal", {}),
        ("equal", {"clients_per_round": 2}),
        ("importance", {}),
        ("importance", {"clients_per_round": 2}),
        ("importance", {"success_prob": 0.6}),
        ("importance", {"success_prob": 0.6, "aggregation": "divide_by_received", "clients_per_round": 2}),
    ],
    ids=[
        "equal",
        "equal-cohort",
        "importance",
        "importance-cohort",
        "importance-lossy",
        "importance-received",
    ],
)
def test_kernel_equals_numpy_loop(mdp, problems, mode, averaging, channel):
    """Trajectory for trajectory on the same random numbers: equal averaging (``fj.fedlsa``) with every
    agent and with a cohort of 2; importance averaging with every agent, a cohort, erasures with the
    weights normalised over the agents asked (a lost message a zero update) and, with a cohort, over
    what arrived (the delivery mask read from the kernel's channel)."""
    problem = problems[mode]
    eta, H, T = 0.3, 4, 6
    importance = averaging == "importance"
    alg = (fj.importance_averaging if importance else fj.fedlsa)(eta, H, **channel)
    ref = NumpyQ(mdp, problem, eta, H)
    theta0 = np.linspace(-1.0, 2.0, S * A)
    state = alg.init(jax.random.key(11), problem, jax.numpy.asarray(theta0))
    ref.Q = theta0.reshape(S, A).copy()
    pairs = [int(p) for p in state.sampler]
    step = jax.jit(alg.step_from)
    by_received = channel.get("aggregation") == "divide_by_received"
    lost = 0
    for t in range(T):
        rand = alg.randomness(jax.random.key(100 + t), problem)
        mask = round_cohort(rand, alg.config, problem)
        cohort = np.ones(N, bool) if mask is None else np.asarray(mask)
        zeros = jax.numpy.zeros((N, S * A))
        delivered = np.asarray(fj.channel.transmit(rand.channel, zeros, alg.channel, (), mask).delivered)
        lost += int((cohort & ~delivered).sum())
        pairs = ref.round(np.asarray(rand.obs), pairs, cohort, importance, delivered, by_received)
        state, _ = step(rand, state, problem)
        np.testing.assert_allclose(np.asarray(state.theta).reshape(S, A), ref.Q, rtol=1e-10, atol=1e-12)
        if mode == "asynchronous":
            assert [int(p) for p in state.sampler] == pairs
    assert (lost > 0) == ("success_prob" in channel)  # the lossy cases did lose messages


def test_importance_averaging_is_equal_averaging_when_the_visits_agree(problems):
    """Synchronous sampling updates every entry at every step: the weights are 1/N and the round is
    FedLSA's (to rounding), also with a cohort."""
    problem = problems["synchronous"]
    for cohort in (None, 2):
        a = fj.simulate(
            jax.random.key(4), problem, fj.importance_averaging(0.2, 5, clients_per_round=cohort), 30, 16
        )
        b = fj.simulate(jax.random.key(4), problem, fj.fedlsa(0.2, 5, clients_per_round=cohort), 30, 16)
        np.testing.assert_allclose(
            np.asarray(a.final_theta), np.asarray(b.final_theta), rtol=1e-12, atol=1e-12
        )


def test_importance_weights_favour_the_frequent_visitor(problems):
    """Asynchronous, behaviours that split the actions: importance averaging differs from equal
    averaging, and its weights are a softmax over the agents (sum 1 on the normalising set, 0 off
    the senders, no overflow at large counts)."""
    w = importance_weights(
        jax.numpy.array([[2000.0, 0.0], [1999.0, 0.0], [5.0, 1.0]]),
        jax.numpy.array([True, True, False]),
        jax.numpy.array([True, True, True]),
    )
    e = np.e
    np.testing.assert_allclose(np.asarray(w)[:, 0], [e / (e + 1), 1 / (e + 1), 0.0], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(w)[:, 1], [1 / (2 + e), 1 / (2 + e), 0.0], rtol=1e-12)
    problem = problems["asynchronous"]
    a = fj.simulate(jax.random.key(4), problem, fj.importance_averaging(0.2, 5), 10, 8, keep_seeds=8)
    b = fj.simulate(jax.random.key(4), problem, fj.fedlsa(0.2, 5), 10, 8, keep_seeds=8)
    assert np.abs(np.asarray(a.final_theta) - np.asarray(b.final_theta)).max() > 1e-3


def test_importance_averaging_refusals(problems):
    with pytest.raises(ValueError, match=r"^step_size=1\.0 is invalid"):
        fj.importance_averaging(1.0, 5)
    td = fj.problems.garnet(jax.random.key(0), num_agents=2)
    with pytest.raises(ValueError, match=r"visits to it in the round"):
        fj.simulate(jax.random.key(0), td, fj.importance_averaging(0.1, 5), 3, 2)


def test_noise_free_E_step_limit_is_the_fixed_point_of_the_averaged_local_operator(mdp, problems):
    """Synchronous, constant step: the limit of the mean path solves Q = mean_c (T_c^eta)^E Q, and
    it is not Q* of the averaged MDP (heterogeneous kernels, E > 1)."""
    P, r, _ = mdp
    problem = problems["synchronous"]
    eta, E = 0.2, 6
    limit = np.asarray(fj.theory.mean_path_limit(problem, fj.fedlsa(eta, E)), np.float64).reshape(S, A)

    def local(c, Q):
        for _ in range(E):
            Q = (1 - eta) * Q + eta * (r[c] + GAMMA * P[c] @ Q.max(1))
        return Q

    image = sum(local(c, limit) for c in range(N)) / N
    assert np.abs(image - limit).max() < 1e-11
    assert np.abs(limit.ravel() - np.asarray(problem.theta_star, np.float64)).max() > 1e-3
    one = np.asarray(fj.theory.mean_path_limit(problem, fj.fedlsa(eta, 1)), np.float64)
    np.testing.assert_allclose(one, np.asarray(problem.theta_star, np.float64), atol=1e-10)


@pytest.mark.slow  # about a minute: run with -m slow
def test_monte_carlo_approaches_the_noise_free_limit_as_the_step_shrinks(problems):
    """Synchronous, heterogeneous kernels, E = 2: the stationary mean of federated Q-learning
    (Polyak-Ruppert averages over many seeds) minus the noise-free E-step limit at the same step is
    O(eta) (the max's bias grows with the noise): halving eta halves the gap, within Monte Carlo error."""
    assert_gap_to_noise_free_limit_halves(problems["synchronous"], H=2, etas=(0.2, 0.1), steps=200.0)


def test_sup_error_metric(problems):
    """The built-in ``"sup_error"``: each seed's ``|theta_T - theta_star|_inf`` at the last round."""
    res = fj.simulate(
        jax.random.key(0),
        problems["asynchronous"],
        fj.fedlsa(0.2, 3),
        5,
        3,
        metrics=["sup_error"],
        keep_seeds=3,
    )
    star = np.asarray(res.theta_star)
    want = np.abs(np.asarray(res.final_theta) - star).max(axis=1).mean()
    np.testing.assert_allclose(res.metrics["sup_error"].mean[-1], want, rtol=1e-12)


def test_greedy_suboptimality_metric(mdp, problems):
    """Each seed's greedy policy of theta_T evaluated by numpy on the mixed MDP whose Q* is theta_star
    (the occupancy-weighted kernels and rewards), against the built-in metric at the last round;
    and 0 at theta_star, refused on a problem without a greedy policy."""
    P, r, b = mdp
    problem = problems["asynchronous"]
    res = fj.simulate(
        jax.random.key(2), problem, fj.fedlsa(0.3, 2), 3, 16, metrics=["greedy_suboptimality"], keep_seeds=16
    )
    D = np.asarray(problem.occupancy, np.float64).reshape(N, S, A)
    w = D / D.sum(0)
    P_mix, r_mix = np.einsum("csa,csat->sat", w, P), np.einsum("csa,csa->sa", w, r)
    V_star = np.asarray(problem.theta_star, np.float64).reshape(S, A).max(1)
    gaps = []
    for theta in np.asarray(res.final_theta, np.float64):
        pi = theta.reshape(S, A).argmax(1)
        v = np.linalg.solve(np.eye(S) - GAMMA * P_mix[np.arange(S), pi], r_mix[np.arange(S), pi])
        gaps.append((V_star - v).max())
    assert max(gaps) > 1e-3  # some seeds' greedy policies are not optimal yet: a real check
    np.testing.assert_allclose(res.metrics["greedy_suboptimality"].mean[-1], np.mean(gaps), rtol=1e-9)
    at_star = problem.greedy_suboptimality(problem.theta_star)
    assert abs(float(at_star)) < 1e-12
    td = fj.problems.garnet(jax.random.key(0), num_agents=2)
    with pytest.raises(ValueError, match="no greedy policy"):
        fj.simulate(jax.random.key(0), td, fj.fedlsa(0.1, 2), 2, 2, metrics=["greedy_suboptimality"])


def test_linear_theory_refuses(problems):
    with pytest.raises(ValueError, match="linear"):
        fj.theory.exact_mse(problems["synchronous"], fj.fedlsa(0.1, 2), 3)


def test_bad_input_named(mdp):
    P, r, b = mdp
    with pytest.raises(ValueError, match=r"^behaviour=.*asynchronous sampling only"):
        fj.problems.q_learning(P, r, GAMMA, behaviour=b)
    with pytest.raises(ValueError, match=r"^sampling='sometimes' is invalid"):
        fj.problems.q_learning(P, r, GAMMA, sampling="sometimes")
    with pytest.raises(ValueError, match=r"^gamma=1\.0 is invalid"):
        fj.problems.q_learning(P, r, 1.0)
    never = b.copy()
    never[:, 0] = [1.0, 0.0]  # no agent takes action 1 in state 0
    with pytest.raises(ValueError, match=r"no agent visits the pair \(s=0, a=1\)"):
        fj.problems.q_learning(P, r, GAMMA, sampling="asynchronous", behaviour=never)
