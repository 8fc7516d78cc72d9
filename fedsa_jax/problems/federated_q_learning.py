"""Federated Q-learning: tabular control, off-policy, nonlinear through a max.

Agent c has an MDP with kernel ``P_c(s' | s, a)`` (``transitions (N, S, A, S)``) and reward
``r_c(s, a)`` (``rewards (N, S, A)``); the agents share the discount gamma. The iterate is the
Q-table flattened over the pairs, ``theta[s A + a] = Q(s, a)`` (d = S A). Agent c's Bellman
optimality operator is ``(T_c Q)(s, a) = r_c(s, a) + gamma sum_s' P_c(s' | s, a) max_a' Q(s', a')``.

* **Synchronous** sampling (``sampling="synchronous"``; the generative model): at each local step
  every pair draws its own next state ``s'(s, a) ~ P_c(. | s, a)`` and every entry moves,
  ``Q(s, a) <- (1 - eta) Q(s, a) + eta (r_c(s, a) + gamma max_a' Q(s'(s, a), a'))``.
* **Asynchronous** sampling (``"asynchronous"``): agent c follows its own fixed behaviour policy
  ``b_c(a | s)`` on one Markov trajectory, carried across rounds and started from the stationary
  law of its chain; a step at ``(s, a)`` draws ``s' ~ P_c(. | s, a)``, updates the visited entry
  only, ``Q(s, a) <- (1 - eta) Q(s, a) + eta (r_c(s, a) + gamma max_a' Q(s', a'))``, then draws
  ``a' ~ b_c(. | s')``.

In the algorithms' form ``theta <- theta - eta direction`` the direction is
``Q - r_c - gamma max_a' Q(s', a')`` on the updated entries and 0 elsewhere: not affine in Q
(``linear = False``), so the exact linear recursions refuse the problem. ``fj.fedlsa`` on it is
federated Q-learning with equal averaging every H local steps (Woo, Joshi, Chi; Wang, Yang, Su).

**References** (float64, :func:`optimal_q`: policy iteration on the MDP, then a check of the
Bellman residual below ``Q_TOL``):

* ``theta_star``, the limit of the noise-free path with H = 1: the root of
  ``sum_c D_c (T_c Q - Q)`` with ``D_c = 1`` (synchronous) or ``D_c(s, a) = nu_c(s, a)``, the
  stationary state-action law of agent c's behaviour (asynchronous). Per entry it is the Bellman
  optimality equation of one MDP, the ``D``-weighted mean of the agents' kernels and rewards, so it
  is that MDP's Q*: the averaged MDP's under synchronous sampling or equal occupancies;
* ``local_theta_star[c]``, ``Q*_c`` of agent c's own MDP;
* ``theta_avg``, ``Q*`` of the averaged MDP (``mean_c P_c``, ``mean_c r_c``);
* ``A_bar[c] = D_c (I - gamma P_c Pi*)`` and ``b_bar[c] = D_c r_c``: agent c's system with the
  greedy policy ``pi*`` of ``theta_star`` frozen (``Pi*`` maps Q to ``Q(s', pi*(s'))``), so that
  ``mean_c A_bar[c]`` solves to ``theta_star``: what the protocol's host-side readers see.

The noise-free H-step path of any algorithm and its limit run the algorithm's own kernel on
:meth:`QLearning.mean_field` (``-D_c (T_c Q - Q)``; :func:`fedsa_jax.theory.mean_path`): with a
constant step, the fixed point of the averaged H-fold local operator ``mean_c (T_c^eta)^H``,
``T_c^eta Q = (1 - eta) Q + eta T_c Q`` (synchronous).

References: Watkins & Dayan, "Q-learning", Machine Learning 8 (1992); Woo, Joshi, Chi, "The blessing
of heterogeneity in federated Q-learning: linear speedup and beyond", JMLR 26 (2025),
arXiv:2305.10697; Wang, Yang, Su, "On the convergence rates of federated Q-learning across
heterogeneous environments", TMLR (2025), arXiv:2409.03897.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate, registry
from fedsa_jax.problems._base import AgentMDPs, alias_draw, alias_tables, stationary_distribution
from fedsa_jax.problems.mean_path import NoRandomness

__all__ = [
    "QLearning",
    "QLearningMeanField",
    "bellman_operator",
    "maze_q_learning",
    "optimal_q",
    "q_learning",
    "two_state_q_learning",
]

SAMPLING = ("synchronous", "asynchronous")
Q_TOL = 1e-12  # sup-norm Bellman residual of the references (float64)
MAX_POLICY_ITERATIONS = 1000


class AsyncObservation(NamedTuple):
    pair: jax.Array  # () int32, s A + a: the visited entry
    next_state: jax.Array  # () int32, s'


def bellman_operator(P: np.ndarray, r: np.ndarray, gamma: float, Q: np.ndarray) -> np.ndarray:
    """``T Q = r + gamma P max_a' Q(., a')`` of one MDP, float64 numpy (``P (S, A, S)``, ``r (S, A)``,
    ``Q (S, A)``)."""
    return r + gamma * P @ Q.max(axis=1)


def optimal_q(P, r, gamma: float) -> np.ndarray:
    """``Q*`` of one MDP (``P (S, A, S)``, ``r (S, A)``), float64 ``(S, A)``: policy iteration (each
    policy evaluated by one linear solve of its Bellman equation) until the greedy policy repeats,
    then checked: the Bellman optimality residual ``|T Q - Q|_inf`` must be below ``Q_TOL`` times
    ``max(1, |Q|_inf)``."""
    P = np.asarray(P, np.float64)
    r = np.asarray(r, np.float64)
    S, A = r.shape
    policy = r.argmax(axis=1)
    for _ in range(MAX_POLICY_ITERATIONS):
        P_pi = P[np.arange(S), policy]  # (S, S)
        v = np.linalg.solve(np.eye(S) - gamma * P_pi, r[np.arange(S), policy])
        Q = r + gamma * P @ v
        better = Q.argmax(axis=1)
        # keep the current action on ties (rounding must not make policy iteration cycle)
        keep = Q[np.arange(S), policy] >= Q[np.arange(S), better] - 1e-14 * max(1.0, np.abs(Q).max())
        better = np.where(keep, policy, better)
        if np.array_equal(better, policy):
            break
        policy = better
    residual = np.abs(bellman_operator(P, r, gamma, Q) - Q).max()
    if not residual <= Q_TOL * max(1.0, np.abs(Q).max()):
        raise RuntimeError(f"policy iteration stopped at Bellman residual {residual:.3g}")
    return Q


def _mixed_mdp(P: np.ndarray, r: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, the weighted mean of the agents' kernels and rewards (``weights (N, S, A)``)."""
    w = weights / weights.sum(0)
    return np.einsum("csa,csat->sat", w, P), np.einsum("csa,csa->sa", w, r)


class _QTables(AgentMDPs):
    """The Q-learning problems' tables: per-agent MDPs, rewards ``(N, S, A)``, d = S A."""

    rewards: jax.Array

    @property
    def dim(self) -> int:
        return self.num_states * self.num_actions

    @property
    def dtype(self):
        return self.rewards.dtype


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QLearning(_QTables):
    """Federated tabular Q-learning problem (module docstring); build with :func:`q_learning`."""

    transitions: jax.Array  # (N, S, A, S)
    rewards: jax.Array  # (N, S, A)
    gamma: jax.Array  # ()
    behaviour: jax.Array  # (N, S, A) b_c(a | s) (asynchronous; uniform under synchronous sampling)
    occupancy: jax.Array  # (N, S*A) D_c: 1 (synchronous) or nu_c(s, a) (asynchronous)
    A_bar: jax.Array  # (N, d, d) the frozen-policy systems at theta_star
    b_bar: jax.Array  # (N, d)
    theta_star: jax.Array  # (d,)
    local_theta_star: jax.Array  # (N, d) Q*_c
    theta_avg: jax.Array  # (d,) Q* of the averaged MDP
    P_prob: jax.Array  # (N*S*A*S,) alias tables of P_c(. | s, a), flat (alias_draw)
    P_alias: jax.Array  # (N*S*A*S,)
    b_prob: jax.Array  # (N*S*A,) alias tables of b_c(. | s), flat
    b_alias: jax.Array  # (N*S*A,)
    mu_prob: jax.Array  # (N*S,) alias tables of the behaviour chain's stationary state law
    mu_alias: jax.Array  # (N*S,)
    star_transitions: jax.Array  # (S, A, S) the MDP whose Q* is theta_star: the D-weighted mean kernel
    star_rewards: jax.Array  # (S, A) and reward
    gaps_star: jax.Array  # (d,) Q*(s, a) - max_a' Q*(s, a'), theta_star's, from float64
    residual_star: jax.Array  # (N*d*S,) Q*(p) - r_c(p) - gamma V*(s') at (c, p, s'), from float64
    mode: str = dataclasses.field(default="synchronous", metadata=dict(static=True))

    linear = False  # the max: the exact linear recursions refuse the problem

    @property
    def sampling(self) -> str:
        """``"generative"`` (synchronous: i.i.d. next states) or ``"markov"`` (asynchronous: one
        trajectory per agent and seed)."""
        return "generative" if self.mode == "synchronous" else "markov"

    def init_sampler(self, key: jax.Array, c: jax.Array) -> jax.Array:
        """The pair ``s_0 A + a_0``: ``s_0`` from the behaviour chain's stationary law,
        ``a_0 ~ b_c(. | s_0)`` (unused under synchronous sampling)."""
        S, A = self.num_states, self.num_actions
        u = jax.random.uniform(key, (2,), self.dtype)
        s = alias_draw(self.mu_prob, self.mu_alias, c * S, u[0], S)
        return s * A + alias_draw(self.b_prob, self.b_alias, (c * S + s) * A, u[1], A)

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> jax.Array:
        """One round's uniforms in one block: ``(N, H, S A)`` (synchronous: every pair's next state
        at every step) or ``(N, H, 2)`` (asynchronous: the next state's and the next action's)."""
        if skip != 1:
            _validate.fail("skip", skip, "Q-learning updates on every transition it draws: skip must be 1")
        width = self.dim if self.mode == "synchronous" else 2
        return _prng.uniform(key, (num_agents, num_obs, width), self.dtype)

    def observe(self, c: jax.Array, sampler: jax.Array, u: jax.Array, skip: int = 1):
        """Agent c's round of observations from its uniforms (alias sampling): the ``(H, S A)``
        next states of every pair (synchronous), or the trajectory's ``(H,)`` visited pairs and
        next states (asynchronous, the behaviour policy drawing each next action)."""
        del skip
        S, A = self.num_states, self.num_actions
        if self.mode == "synchronous":
            pairs = jnp.arange(S * A, dtype=jnp.int32)
            nxt = alias_draw(self.P_prob, self.P_alias, (c * (S * A) + pairs) * S, u, S)
            return nxt, sampler

        def move(pair, u_h):
            s_next = alias_draw(self.P_prob, self.P_alias, (c * (S * A) + pair) * S, u_h[0], S)
            a_next = alias_draw(self.b_prob, self.b_alias, (c * S + s_next) * A, u_h[1], A)
            return s_next * A + a_next, (pair, s_next)

        last, (pairs, nxt) = jax.lax.scan(move, sampler, u)
        return AsyncObservation(pairs, nxt), last

    def visits(self, obs) -> jax.Array:
        """``(H, d)`` bool: the entries each local step of a round's observations updates (every
        entry under synchronous sampling, the visited pair under asynchronous):
        :func:`fedsa_jax.importance_averaging` counts them."""
        if self.mode == "synchronous":
            return jnp.ones(obs.shape, bool)
        return obs.pair[:, None] == jnp.arange(self.dim, dtype=jnp.int32)

    def _targets(self, nxt, values):
        """``max_a' values(s', a')`` for next states ``nxt``: ``(H, d)`` under synchronous sampling
        (the S state values first, then one gather per pair rather than A), a scalar under
        asynchronous sampling (A values gathered)."""
        A = self.num_actions
        if self.mode == "synchronous":
            return jnp.max(values.reshape(-1, A), axis=-1)[nxt]
        return jnp.max(values[nxt * A + jnp.arange(A, dtype=jnp.int32)])

    def direction(self, c: jax.Array, obs, theta: jax.Array) -> jax.Array:
        """``Q - r_c - gamma max_a' Q(s', a')`` on the updated entries, 0 elsewhere."""
        r = self.rewards.reshape(self.num_agents, -1)[c]
        if self.mode == "synchronous":
            return theta - r - self.gamma * self._targets(obs, theta)
        value = theta[obs.pair] - r[obs.pair] - self.gamma * self._targets(obs.next_state, theta)
        return jnp.where(jnp.arange(self.dim) == obs.pair, value, 0.0)

    def error_direction(self, c: jax.Array, obs, error: jax.Array) -> jax.Array:
        """The direction at ``theta_star + error``, accurate in ``error``:
        ``e(p) + [Q*(p) - r_c(p) - gamma V*(s')] - gamma max_a' (g*(s', a') + e(s', a'))`` with the
        bracket and the gaps ``g* = Q* - V*`` from float64 (``V*(s) = max_a Q*(s, a)``)."""
        S, d = self.num_states, self.dim
        if self.mode == "synchronous":
            pairs = jnp.arange(d, dtype=jnp.int32)
            residual = self.residual_star[(c * d + pairs) * S + obs]
            return error + residual - self.gamma * self._targets(obs, self.gaps_star + error)
        p, nxt = obs.pair, obs.next_state
        moved = self.gaps_star[nxt * self.num_actions + jnp.arange(self.num_actions)]
        target = jnp.max(moved + error[nxt * self.num_actions + jnp.arange(self.num_actions)])
        value = error[p] + self.residual_star[(c * d + p) * S + nxt] - self.gamma * target
        return jnp.where(jnp.arange(d) == p, value, 0.0)

    def greedy_suboptimality(self, theta: jax.Array) -> jax.Array:
        """``max_s (V*(s) - V^pi(s))`` for the greedy policy ``pi(s) = argmax_a theta(s, a)``, on the
        MDP whose ``Q*`` is ``theta_star`` (``star_transitions``, ``star_rewards``): ``V^pi`` by one
        linear solve of its Bellman equation, ``V* = max_a theta_star``. 0 when the greedy policy is
        optimal (the built-in metric ``"greedy_suboptimality"``)."""
        S, A = self.num_states, self.num_actions
        pi = jnp.argmax(theta.reshape(S, A), axis=1)
        states = jnp.arange(S)
        P_pi = self.star_transitions[states, pi]  # (S, S)
        v = jnp.linalg.solve(jnp.eye(S, dtype=P_pi.dtype) - self.gamma * P_pi, self.star_rewards[states, pi])
        return jnp.max(self.theta_star.reshape(S, A).max(axis=1) - v)

    def mean_field(self) -> QLearningMeanField:
        """The noise-free problem whose direction at Q is ``-D_c (T_c Q - Q)`` (the protocol's
        ``mean_field``)."""
        return QLearningMeanField(
            self.transitions,
            self.rewards,
            self.gamma,
            self.occupancy,
            self.A_bar,
            self.b_bar,
            self.theta_star,
            self.local_theta_star,
        )

    def describe(self) -> dict[str, Any]:
        return self.mdp_description("q_learning", mode=self.mode, sampling=self.sampling)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QLearningMeanField(_QTables, NoRandomness):
    """The noise-free version of a :class:`QLearning` problem: agent c's direction at Q is
    ``-D_c (T_c Q - Q)``, with no randomness (``linear = False``); the algorithms' own kernels run
    its deterministic mean path (:func:`fedsa_jax.theory.mean_path`)."""

    transitions: jax.Array
    rewards: jax.Array
    gamma: jax.Array
    occupancy: jax.Array
    A_bar: jax.Array
    b_bar: jax.Array
    theta_star: jax.Array
    local_theta_star: jax.Array

    linear = False

    def direction(self, c: jax.Array, obs: Any, theta: jax.Array) -> jax.Array:
        """``-D_c (T_c Q - Q)``."""
        del obs
        S, A = self.rewards.shape[1:]
        Q = theta.reshape(S, A)
        # the greedy entries by index: a derivative through one maximiser, also at ties (jnp.max's
        # splits it by a count of equal entries, which NaNs where rounding leaves none equal)
        V = jnp.take_along_axis(Q, jnp.argmax(Q, axis=1)[:, None], axis=1)[:, 0]
        TQ = self.rewards[c] + self.gamma * self.transitions[c] @ V
        return -self.occupancy[c] * (TQ - Q).reshape(-1)

    def describe(self) -> dict[str, Any]:
        return self.mdp_description("q_learning_mean_field")


def _behaviour_occupancy(
    P: np.ndarray, b: np.ndarray, name: str, value: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``(mu (N, S), nu (N, S, A))``: each agent's stationary state law under its behaviour and the
    state-action occupancy ``nu_c(s, a) = mu_c(s) b_c(a | s)``."""
    mu = np.stack(
        [
            stationary_distribution(np.einsum("sa,sat->st", b[c], P[c]), f"{name}[{c}] (its behaviour chain)")
            for c in range(P.shape[0])
        ]
    )
    return mu, mu[:, :, None] * b


def q_learning(
    transitions,
    rewards,
    gamma: float,
    sampling: str = "synchronous",
    behaviour=None,
    dtype=None,
) -> QLearning:
    """Federated tabular Q-learning problem from per-agent MDPs (module docstring).

    Args:
      transitions: ``(N, S, A, S)`` kernels ``P_c(s' | s, a)`` (``(S, A, S)``: one agent).
      rewards: ``(N, S, A)`` rewards ``r_c(s, a)`` (``(S, A)`` is shared by all agents).
      gamma: discount in ``(0, 1)``.
      sampling: ``"synchronous"`` (every pair draws a next state at every local step) or
        ``"asynchronous"`` (one trajectory per agent under its behaviour policy).
      behaviour: ``(N, S, A)`` (or ``(S, A)``, shared) behaviour policies ``b_c(a | s)`` for
        asynchronous sampling (default uniform); together the agents must visit every pair.
      dtype: ``float32`` or ``float64`` (needs x64); default follows ``rewards``.

    The references are computed in float64 when the problem is built (module docstring).
    """
    mode = _validate.choice("sampling", sampling, SAMPLING)
    dt = _validate.float_dtype("dtype", dtype, default_from=getattr(rewards, "dtype", None), source="rewards")
    P = _validate.array("transitions", transitions, (3, 4))
    if P.ndim == 3:
        P = P[None]
    N, S, A, S2 = P.shape
    if S != S2 or min(N, S, A) < 1:
        _validate.fail("transitions", transitions, "expected shape (num_agents, S, A, S)")
    _validate.table_size("transitions", transitions, N * S * A * S, "num_agents x S^2 x A")
    if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=1e-6):
        _validate.fail("transitions", transitions, "rows P[c, s, a, :] must be nonnegative and sum to 1")
    r = _validate.array("rewards", rewards, (2, 3))
    r = np.broadcast_to(r, (N, S, A)) if r.shape == (S, A) else r
    if r.shape != (N, S, A):
        _validate.fail("rewards", rewards, f"expected shape ({N}, {S}, {A}) or ({S}, {A})")
    g = _validate.real("gamma", gamma, 0.0, 1.0, low_open=True, high_open=True)
    if behaviour is None:
        b = np.full((N, S, A), 1.0 / A)
    else:
        if mode == "synchronous":
            _validate.fail("behaviour", "given", "a behaviour policy drives asynchronous sampling only")
        b = _validate.array("behaviour", behaviour, (2, 3))
        b = np.broadcast_to(b, (N, S, A)) if b.shape == (S, A) else b
        if b.shape != (N, S, A) or np.any(b < 0) or not np.allclose(b.sum(-1), 1.0, atol=1e-6):
            _validate.fail(
                "behaviour",
                behaviour,
                f"expected ({N}, {S}, {A}) probabilities b_c(a | s), rows summing to 1",
            )
    mu, nu = _behaviour_occupancy(P, b, "transitions", transitions)
    D = np.ones((N, S, A)) if mode == "synchronous" else nu
    if np.any(D.sum(0) <= 1e-12):
        s, a = np.argwhere(D.sum(0) <= 1e-12)[0]
        _validate.fail(
            "behaviour", behaviour, f"no agent visits the pair (s={s}, a={a}): its Q-value is never learned"
        )
    P_star, r_star = _mixed_mdp(P, r, D)
    star = optimal_q(P_star, r_star, g)
    avg = optimal_q(P.mean(0), r.mean(0), g)
    local = np.stack([optimal_q(P[c], r[c], g) for c in range(N)])
    greedy = star.argmax(axis=1)
    Pi = np.zeros((S, S * A))
    Pi[np.arange(S), np.arange(S) * A + greedy] = 1.0
    d = S * A
    A_bar = np.stack([D[c].reshape(-1, 1) * (np.eye(d) - g * P[c].reshape(d, S) @ Pi) for c in range(N)])
    b_bar = (D * r).reshape(N, d)
    V = star.max(axis=1)
    residual = (star.reshape(1, d, 1) - r.reshape(N, d, 1)) - g * V[None, None, :]
    P_prob, P_alias = alias_tables(P)
    b_prob, b_alias = alias_tables(b)
    mu_prob, mu_alias = alias_tables(mu)
    _validate.fits("rewards", rewards, r, dt)
    _validate.fits("transitions", transitions, star, dt, "the optimal Q-values")
    f = lambda x: jnp.asarray(x, dtype=dt)  # noqa: E731
    i = lambda x: jnp.asarray(np.asarray(x).ravel(), jnp.int32)  # noqa: E731
    return QLearning(
        transitions=f(P),
        rewards=f(r),
        gamma=f(g),
        behaviour=f(b),
        occupancy=f(D.reshape(N, d)),
        A_bar=f(A_bar),
        b_bar=f(b_bar),
        theta_star=f(star.ravel()),
        local_theta_star=f(local.reshape(N, d)),
        theta_avg=f(avg.ravel()),
        P_prob=f(P_prob.ravel()),
        P_alias=i(P_alias),
        b_prob=f(b_prob.ravel()),
        b_alias=i(b_alias),
        mu_prob=f(mu_prob.ravel()),
        mu_alias=i(mu_alias),
        star_transitions=f(P_star),
        star_rewards=f(r_star),
        gaps_star=f((star - V[:, None]).ravel()),
        residual_star=f(residual.ravel()),
        mode=mode,
    )


def two_state_q_learning(
    num_agents: int = 20,
    num_actions: int = 2,
    heterogeneity: float = 1.0,
    gamma: float = 0.9,
    sampling: str = "asynchronous",
    seed: int = 0,
    dtype=None,
) -> QLearning:
    """The importance-averaging paper's two-state MDP (Woo, Joshi, Chi, Sec. 5), shared by every agent,
    with behaviour policies that split the actions among the agents.

    States {0, 1}, reward ``r(s, a) = s`` (1 in state 1), and each action keeps the state with its
    own probability, ``P(s | s, a) = p_{s,a} ~ U[0.4, 0.6]`` (``numpy.random.default_rng(seed)``),
    moving to the other state otherwise. Agent c's behaviour prefers the action ``a_c = c mod A``:
    ``b_c(a | s) = (1 - h) / A + h [a = a_c]``, so ``heterogeneity h = 0`` gives every agent the
    uniform policy and ``h = 1`` lets agent c take only ``a_c``: no agent covers the pairs alone, the
    agents together do (``num_agents >= num_actions``). The paper's exact behaviour policies are not
    stated in a form we could rebuild; this family spans its "homogeneous" and "heterogeneous" cases.
    Synchronous sampling (``sampling="synchronous"``) ignores the behaviours."""
    N = _validate.integer("num_agents", num_agents, maximum=_validate.INDEX_MAX)
    A = _validate.integer("num_actions", num_actions, maximum=2**10)
    h = _validate.real("heterogeneity", heterogeneity, 0.0, 1.0)
    mode = _validate.choice("sampling", sampling, SAMPLING)
    seed = _validate.integer("seed", seed, minimum=0)
    if mode == "asynchronous" and h == 1.0 and N < A:
        _validate.fail(
            "num_agents",
            N,
            f"with heterogeneity=1 each agent takes one action: at least num_actions={A} agents",
        )
    stay = np.random.default_rng(seed).uniform(0.4, 0.6, size=(2, A))
    P = np.zeros((2, A, 2))
    for s in range(2):
        P[s, :, s] = stay[s]
        P[s, :, 1 - s] = 1.0 - stay[s]
    r = np.repeat(np.arange(2.0)[:, None], A, axis=1)
    behaviour = None
    if mode == "asynchronous":
        own = np.eye(A)[np.arange(N) % A]  # (N, A) agent c's action a_c
        behaviour = np.broadcast_to(((1.0 - h) / A + h * own)[:, None, :], (N, 2, A))
    return q_learning(np.broadcast_to(P, (N, 2, A, 2)), r, gamma, mode, behaviour, dtype=dtype)


MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left


def maze_q_learning(
    num_agents: int = 20,
    size: int = 5,
    num_walls: int = 3,
    wind: float = 0.2,
    gamma: float = 0.99,
    seed: int = 0,
    dtype=None,
) -> QLearning:
    """Heterogeneous mazes for synchronous federated Q-learning (the setting of Wang, Yang, Su, Sec. 6:
    20 agents, 5 x 5 mazes, gamma 0.99; their layouts and kernels are not published, so these are
    ours, documented here).

    A ``size x size`` grid with ``num_walls`` wall cells drawn by ``numpy.random.default_rng(seed)``
    (never on the two corners below; redrawn until the free cells are connected); the states are the
    free cells (row-major), the start is the bottom-left corner and the goal the top-right one.
    Four actions (up, right, down, left): a move into a wall or off the grid keeps the state. Agent c
    has its own wind: with probability ``wind`` it moves in its wind direction ``c mod 4`` whatever
    the action, else as chosen, so the agents' kernels differ and ``wind = 0`` makes them equal. The
    reward is 1 at the goal (every action), where every action returns to the start: a recurrent MDP
    whose ``Q*`` is the discounted rate of reaching the goal. Synchronous sampling."""
    N = _validate.integer("num_agents", num_agents, maximum=_validate.INDEX_MAX)
    L = _validate.integer("size", size, minimum=2, maximum=64)
    W = _validate.integer("num_walls", num_walls, minimum=0, maximum=L * L - 2)
    w = _validate.real("wind", wind, 0.0, 1.0)
    seed = _validate.integer("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    corners = {(L - 1, 0), (0, L - 1)}
    for _ in range(1000):
        cells = [(i, j) for i in range(L) for j in range(L) if (i, j) not in corners]
        walls = {cells[k] for k in rng.choice(len(cells), size=W, replace=False)}
        free = [(i, j) for i in range(L) for j in range(L) if (i, j) not in walls]
        if _connected(free):
            break
    else:
        _validate.fail("num_walls", W, f"no draw of {W} walls left a {L} x {L} maze connected")
    index = {cell: k for k, cell in enumerate(free)}
    S, start, goal = len(free), index[(L - 1, 0)], index[(0, L - 1)]

    def step(cell, move):
        nxt = (cell[0] + move[0], cell[1] + move[1])
        return index.get(nxt, index[cell])

    P = np.zeros((N, S, 4, S))
    for c in range(N):
        for k, cell in enumerate(free):
            for a in range(4):
                if k == goal:
                    P[c, k, a, start] = 1.0
                    continue
                P[c, k, a, step(cell, MOVES[a])] += 1.0 - w
                P[c, k, a, step(cell, MOVES[c % 4])] += w
    r = np.zeros((S, 4))
    r[goal] = 1.0
    return q_learning(P, r, gamma, "synchronous", dtype=dtype)


def _connected(cells: list) -> bool:
    """Whether the grid cells ``cells`` form one 4-connected region."""
    todo, seen, allowed = [cells[0]], {cells[0]}, set(cells)
    while todo:
        i, j = todo.pop()
        for di, dj in MOVES:
            nxt = (i + di, j + dj)
            if nxt in allowed and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return len(seen) == len(cells)


def _two_state_from_options(key, args):
    """``--problem q-learning``: :func:`two_state_q_learning` from the options (``--sampling markov``:
    asynchronous, ``generative``: synchronous; ``--problem-seed`` draws the transition probabilities,
    ``key`` is not used)."""
    del key
    if args.states not in (None, 2):
        _validate.fail("num_states", args.states, "the q-learning problem has two states")
    level = {"homogeneous": 0.0, "heterogeneous": 1.0}.get(args.heterogeneity, args.heterogeneity)
    return two_state_q_learning(
        num_agents=args.agents,
        num_actions=args.actions or 2,
        heterogeneity=level,  # pyright: ignore[reportArgumentType]
        gamma=0.9 if args.gamma is None else args.gamma,
        sampling="synchronous" if args.sampling == "generative" else "asynchronous",
        seed=args.problem_seed,
        dtype=args.dtype,
    )


registry.register_problem(
    "q-learning",
    _two_state_from_options,
    options=(registry.HETEROGENEITY, registry.STATES, registry.ACTIONS, registry.SAMPLING, registry.GAMMA),
    note="federated Q-learning on the importance-averaging paper's two-state MDP",
    order=4,
)
