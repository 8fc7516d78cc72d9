"""Federated SARSA: control, where the observation law follows the iterate.

Agent c has an MDP with kernel ``P_c(s' | s, a)`` (``transitions (N, S, A, S)``) and reward
``r_c(s, a)`` (``rewards (N, S, A)``); the agents share the discount gamma and the state-action
features ``phi(s, a)`` in R^d (``features (S, A, d)``; one-hot features, ``d = S A``, give tabular
SARSA). The behaviour policy is a softmax of the current Q-estimate,
``pi_theta(a | s) ∝ exp(phi(s, a)^T theta / tau)`` (temperature tau), or epsilon-greedy in it.

Each agent follows one Markov trajectory of state-action pairs per seed, carried across rounds,
started from a uniform state and an action drawn from the policy of ``theta0``. A local step at
``(s, a)`` with the agent's *current local iterate* ``theta^c`` draws ``s' ~ P_c(. | s, a)``, then
``a' ~ pi_{theta^c}(. | s')`` and updates

    theta^c <- theta^c + alpha (r_c(s, a) + gamma phi(s', a')^T theta^c - phi(s, a)^T theta^c) phi(s, a),

then ``(s, a) <- (s', a')``. In LSA form the observation is ``Z = (s, a, s', a')`` with
``A(Z) = phi(s, a) (phi(s, a) - gamma phi(s', a'))^T`` and ``b(Z) = r_c(s, a) phi(s, a)``, but the
law of Z depends on theta: the problem draws it with ``observe_step`` (the protocol's member for
observations that follow the iterate), and the exact linear recursions refuse it.
``fj.fedlsa`` on this problem is FedSARSA (local SARSA steps, then averaging); ``fj.scafflsa``'s
control variates make a drift-corrected FedSARSA.

**Mean field.** ``g_c(theta) = sum_{s,a} nu_{c,theta}(s, a) [r_c(s, a) + gamma (P_c V_theta)(s, a)
- phi(s, a)^T theta] phi(s, a)`` with ``V_theta(s') = sum_{a'} pi_theta(a' | s') phi(s', a')^T theta``
and ``nu_{c,theta}(s, a) = mu(s) pi_theta(a | s)``, mu the stationary law of
``P_pi(s, s') = sum_a pi_theta(a | s) P_c(s' | s, a)`` (one linear solve). It is computed in JAX
(:func:`mean_field`), so its Jacobian is an autodiff one.

**References** (float64, Newton's method on the mean field with an autodiff Jacobian, backtracking,
to a residual below ``LIMIT_TOL``):

* ``theta_star`` = ``theta_lim_fed``, the root of ``mean_c g_c(theta)``: the limit of FedSARSA's
  noise-free path with ``H = 1`` (the peer code's ``fed_sarsa_det``);
* ``local_theta_star[c]``, the root of ``g_c`` (agent c's own SARSA limit);
* ``theta_avg`` = ``theta_lim_avg``, the SARSA limit of the averaged MDP (``mean_c P_c``,
  ``mean_c r_c``);
* ``A_bar[c]``, ``b_bar[c]``: the mean LSA system of agent c with the policy frozen at
  ``theta_star`` (``sum nu phi (phi - gamma E[phi(s', a') | s, a])^T`` and ``sum nu r phi``), so
  that ``g_c(theta_star) = b_bar[c] - A_bar[c] theta_star`` and ``mean_c A_bar[c]`` solves to
  ``theta_star``: what the protocol's host-side readers see.

The noise-free H-step path of any algorithm (and its limit) runs the algorithm's own kernel on
:meth:`FederatedSARSA.mean_field` (:func:`fedsa_jax.theory.mean_path`).

References: Mangold, Berthier, Moulines, "Convergence guarantees for federated SARSA with local
training and heterogeneous agents", arXiv:2512.17688 (2025); Rummery & Niranjan (1994); Sutton &
Barto, "Reinforcement Learning", 2nd ed., Sec. 6.4 and 10.1 (SARSA with linear features).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate, registry
from fedsa_jax.problems._base import AgentMDPs, alias_draw, alias_tables, float64, stationary_distribution
from fedsa_jax.problems.mean_path import NoRandomness
from fedsa_jax.problems.protocol import FOLLOWS_ITERATE_UNROLL, local_unroll, merged_vmaps

__all__ = [
    "FederatedSARSA",
    "SARSAMeanField",
    "garnet_control",
    "garnet_control_mdp",
    "mean_field",
    "sarsa",
    "sarsa_limit",
]

POLICIES = ("softmax", "epsilon_greedy")
LIMIT_TOL = 1e-12  # Newton's stopping residual |mean_c g_c(theta)| of the references (float64)
MAX_NEWTON = 100


class SARSAObservation(NamedTuple):
    pair: jax.Array  # () int32, s A + a
    next_pair: jax.Array  # () int32, s' A + a'
    reward: jax.Array  # () r_c(s, a)


def policy_probabilities(q, temperature, epsilon, policy: str):
    """``pi(. | s)`` from the Q-values ``q (..., A)``: ``softmax(q / tau)``, or epsilon-greedy
    (``1 - epsilon`` on the first maximiser, ``epsilon / A`` on every action)."""
    if policy == "softmax":
        return jax.nn.softmax(q / temperature, axis=-1)
    A = q.shape[-1]
    greedy = jax.nn.one_hot(jnp.argmax(q, axis=-1), A, dtype=q.dtype)
    return (1.0 - epsilon) * greedy + epsilon / A


def draw_action(probs, u):
    """The action of the uniform ``u`` by inversion: ``#{k < A - 1 : cdf_k <= u}`` (the last action
    takes what rounding leaves of the cumulative sum)."""
    cdf = jnp.cumsum(probs[:-1])
    return jnp.sum(cdf <= u).astype(jnp.int32)


def softmax_draw(q, temperature, u):
    """``a ~ softmax(q / tau)`` from the uniform ``u`` by inversion, on unnormalised weights: the draw
    compares ``u sum(w)`` to the cumulative sums of ``w = exp((q - max q) / tau)`` (no division)."""
    w = jnp.exp((q - jnp.max(q)) / temperature)
    return jnp.sum(jnp.cumsum(w[:-1]) <= u * jnp.sum(w)).astype(jnp.int32)


def refuse_observe(name: str):
    """The error of a SARSA problem's ``observe``: its observations follow the iterate."""
    _validate.fail(
        "problem",
        name,
        "this algorithm draws a round's observations before its local steps, and SARSA's follow "
        "the iterate (its policy is a softmax of the current Q-estimate); algorithms that observe "
        "step by step run it: fedlsa, scafflsa, qfedtd (and their averaging, bootstrap)",
    )


def _stationary(P_pi):
    """Stationary law of a row-stochastic ``(S, S)`` kernel by one linear solve (differentiable):
    ``(I - P)^T mu = 0`` with its last equation replaced by ``sum(mu) = 1``."""
    S = P_pi.shape[0]
    M = (jnp.eye(S, dtype=P_pi.dtype) - P_pi).T.at[-1].set(1.0)
    return jnp.linalg.solve(M, jnp.zeros(S, P_pi.dtype).at[-1].set(1.0))


def _occupancy(P, Phi, theta, temperature, epsilon, policy):
    """``(q (S, A), pi (S, A), nu (S, A))`` at ``theta`` for one MDP ``P (S, A, S)``."""
    q = Phi @ theta
    pi = policy_probabilities(q, temperature, epsilon, policy)
    mu = _stationary(jnp.einsum("sa,sat->st", pi, P))
    return q, pi, mu[:, None] * pi


def mean_field(P, r, Phi, gamma, theta, temperature, epsilon: Any = 0.0, policy: str = "softmax"):
    """``g(theta)``, the expected SARSA direction of one MDP under the stationary state-action law
    of its chain driven by ``pi_theta`` (module docstring): ``P (S, A, S)``, ``r (S, A)``,
    ``Phi (S, A, d)``; JAX, differentiable in ``theta``."""
    q, pi, nu = _occupancy(P, Phi, theta, temperature, epsilon, policy)
    V = jnp.sum(pi * q, axis=-1)
    td = r + gamma * (P @ V) - q
    return jnp.einsum("sa,sad->d", nu * td, Phi)


def frozen_system(P, r, Phi, gamma, theta, temperature, epsilon: Any = 0.0, policy: str = "softmax"):
    """``(A, b)`` of one MDP with the policy frozen at ``theta``: ``g(theta) = b - A theta``."""
    _, pi, nu = _occupancy(P, Phi, theta, temperature, epsilon, policy)
    next_phi = jnp.einsum("sat,tb,tbd->sad", P, pi, Phi)  # E[phi(s', a') | s, a]
    A = jnp.einsum("sa,sai,saj->ij", nu, Phi, Phi - gamma * next_phi)
    b = jnp.einsum("sa,sa,sad->d", nu, r, Phi)
    return A, b


def _field_of(theta, P, r, w, Phi, gamma, tau, eps, policy):
    """``sum_k w_k g_k(theta)`` over the MDPs ``P (K, S, A, S)``, ``r (K, S, A)``."""
    per = jax.vmap(lambda P_k, r_k: mean_field(P_k, r_k, Phi, gamma, theta, tau, eps, policy))(P, r)
    return w @ per


# Compiled once per shape and policy (arrays and scalars are arguments): every problem of a shape reuses them.
_weighted_field = jax.jit(_field_of, static_argnums=8)
_weighted_jacobian = jax.jit(jax.jacfwd(_field_of), static_argnums=8)


def sarsa_limit(
    transitions,
    rewards,
    features,
    gamma,
    temperature,
    epsilon=0.0,
    policy="softmax",
    weights=None,
    start=None,
) -> np.ndarray:
    """The root of ``sum_k w_k g_k(theta)`` over MDPs k (``transitions (K, S, A, S)``, ``rewards
    (K, S, A)``, weights summing to 1, default equal), float64: damped Newton's method with the
    autodiff Jacobian from ``start`` (default 0), to a residual below ``LIMIT_TOL``. With the agents'
    MDPs it is ``theta_lim_fed``; with one MDP its SARSA limit. Raises a ``ValueError`` when Newton's
    method finds no root (e.g. a temperature so small that the policy is nearly greedy)."""
    with float64():
        P = jnp.asarray(np.asarray(transitions, np.float64))
        r = jnp.asarray(np.asarray(rewards, np.float64))
        Phi = jnp.asarray(np.asarray(features, np.float64))
        K = P.shape[0]
        w = jnp.full((K,), 1.0 / K) if weights is None else jnp.asarray(np.asarray(weights, np.float64))
        scalars = (float(gamma), float(temperature), float(epsilon))
        G_jit = lambda th: _weighted_field(th, P, r, w, Phi, *scalars, policy)  # noqa: E731
        J_jit = lambda th: _weighted_jacobian(th, P, r, w, Phi, *scalars, policy)  # noqa: E731
        theta = np.zeros(Phi.shape[-1]) if start is None else np.asarray(start, np.float64)
        value = np.asarray(G_jit(theta))
        norm = float(np.linalg.norm(value))
        for _ in range(MAX_NEWTON):
            if not np.isfinite(norm) or norm <= LIMIT_TOL:
                break
            step = np.linalg.lstsq(np.asarray(J_jit(theta)), -value, rcond=None)[0]
            t = 1.0
            while t > 1e-12:
                candidate = theta + t * step
                new = np.asarray(G_jit(candidate))
                new_norm = float(np.linalg.norm(new))
                if new_norm < (1.0 - 1e-4 * t) * norm:
                    break
                t /= 2.0
            else:
                break  # no decrease along Newton's direction: at the rounding floor, or stuck
            theta, value, norm = candidate, new, new_norm
    if not (np.isfinite(norm) and norm <= 1e3 * LIMIT_TOL):
        _validate.fail(
            "temperature",
            temperature,
            f"no SARSA limit found: Newton's method stopped at residual |mean_c g_c| = {norm:.3g} "
            "(a nearly greedy policy makes the mean field nonsmooth; use a larger temperature)",
        )
    return theta


class _AgentTables(AgentMDPs):
    """The SARSA problems' tables: per-agent MDPs and the features ``(S, A, d)``."""

    features: jax.Array

    @property
    def dim(self) -> int:
        return self.features.shape[-1]

    @property
    def dtype(self):
        return self.features.dtype


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FederatedSARSA(_AgentTables):
    """Federated SARSA problem (module docstring); build with :func:`sarsa` or
    :func:`garnet_control`."""

    transitions: jax.Array  # (N, S, A, S)
    rewards: jax.Array  # (N, S, A)
    features: jax.Array  # (S, A, d)
    gamma: jax.Array  # ()
    temperature: jax.Array  # () tau of the softmax policy
    epsilon: jax.Array  # () exploration of the epsilon-greedy policy
    A_bar: jax.Array  # (N, d, d) the frozen-policy systems at theta_star
    b_bar: jax.Array  # (N, d)
    theta_star: jax.Array  # (d,) theta_lim_fed
    local_theta_star: jax.Array  # (N, d) each agent's SARSA limit
    theta_avg: jax.Array  # (d,) theta_lim_avg, the averaged MDP's SARSA limit
    P_prob: jax.Array  # (N*S*A*S,) alias tables of P_c(. | s, a), flat (alias_draw)
    P_alias: jax.Array  # (N*S*A*S,)
    features_star: jax.Array  # (S*A, d + 1) [Phi | Phi theta_star] from float64 (error_direction)
    values_less_rewards: jax.Array  # (N*S*A,) (Phi theta_star)(s, a) - r_c(s, a) from float64
    policy: str = dataclasses.field(default="softmax", metadata=dict(static=True))
    one_hot: bool = dataclasses.field(default=False, metadata=dict(static=True))  # features = identity

    sampling = "markov"  # one trajectory per agent and seed, carried across rounds

    def _action(self, state, u, theta):
        """``a ~ pi_theta(. | state)`` from the uniform ``u``."""
        q = self.features[state] @ theta  # (A,)
        if self.policy == "softmax":
            return softmax_draw(q, self.temperature, u)
        return draw_action(policy_probabilities(q, self.temperature, self.epsilon, self.policy), u)

    def init_sampler(self, key: jax.Array, c: jax.Array, theta0: jax.Array) -> jax.Array:
        """The pair ``s_0 A + a_0``: ``s_0`` uniform, ``a_0 ~ pi_{theta0}(. | s_0)`` (two uniforms)."""
        del c
        u = jax.random.uniform(key, (2,), self.dtype)
        s = jnp.minimum((u[0] * self.num_states).astype(jnp.int32), self.num_states - 1)
        return s * self.num_actions + self._action(s, u[1], theta0)

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> jax.Array:
        """Two uniforms per agent and local step, ``(N, H, 2)``: the next state's and the next
        action's."""
        if skip != 1:
            _validate.fail(
                "skip", skip, "SARSA updates on every transition of its trajectory: skip must be 1"
            )
        return _prng.uniform(key, (num_agents, num_obs, 2), self.dtype)

    def observe(self, params, sampler, rand, skip: int = 1):
        """Refused: the observations follow the iterate (``observe_step``)."""
        del params, sampler, rand, skip
        refuse_observe("sarsa")

    def observe_step(self, c: jax.Array, pair: jax.Array, u: jax.Array, theta: jax.Array):
        """One transition from ``(s, a)``: ``s' ~ P_c(. | s, a)`` (alias table, ``u[0]``) and
        ``a' ~ pi_theta(. | s')`` (``u[1]``) with the agent's current iterate ``theta``."""
        S, A = self.num_states, self.num_actions
        s_next = alias_draw(self.P_prob, self.P_alias, (c * (S * A) + pair) * S, u[0], S)
        next_pair = s_next * A + self._action(s_next, u[1], theta)
        reward = self.rewards.reshape(-1)[c * (S * A) + pair]
        return SARSAObservation(pair, next_pair, reward), next_pair

    def direction(self, c: jax.Array, obs: SARSAObservation, theta: jax.Array) -> jax.Array:
        """``A(Z) theta - b(Z) = ((phi(s, a) - gamma phi(s', a'))^T theta - r) phi(s, a)``."""
        del c
        d = self.dim
        phi = self.features_star[obs.pair, :d]
        psi = phi - self.gamma * self.features_star[obs.next_pair, :d]
        return (jnp.dot(psi, theta) - obs.reward) * phi

    def error_direction(self, c: jax.Array, obs: SARSAObservation, error: jax.Array) -> jax.Array:
        """The direction at ``theta_star + error``, with the TD error at ``theta_star`` from
        ``v = Phi theta_star`` (float64): ``(psi^T error + v(s, a) - gamma v(s', a') - r) phi(s, a)``."""
        del c
        d = self.dim
        row = self.features_star[obs.pair]
        full = row - self.gamma * self.features_star[obs.next_pair]
        return (jnp.dot(full[:d], error) + (full[d] - obs.reward)) * row[:d]

    def error_observed_steps(self, c, pair, u, error, step_sizes, control):
        """One agent's local steps in error coordinates with tabular (one-hot) features and the
        softmax policy, laid out for speed (the protocol's ``error_observed_steps``; ``None``
        otherwise). With ``phi(s, a) = e_{sA+a}`` the Q-values of s' are the entries
        ``theta[s'A:s'A+A]`` and the update moves one entry:
        ``e <- e - eta ((e_p - gamma e_n + k_p - gamma v_n) 1_p - control)`` with p = (s, a),
        n = (s', a'), ``v = theta_star`` and ``k = v - r_c`` (both from float64): O(A) reads per
        step instead of O(A d). ``e_p`` is carried from the step before (it is that step's
        ``e_n``, moved if n = p), so a step reads one row of A entries, one entry of ``k`` and one
        of the alias tables. The same draws and updates as the generic scan, to rounding."""
        if not self.one_hot or self.policy != "softmax":
            return None
        return merged_vmaps(_one_hot_steps)(self, c, pair, u, error, step_sizes, control)

    def mean_field(self) -> SARSAMeanField:
        """The noise-free problem whose direction at ``theta`` is ``-g_c(theta)`` (the protocol's
        ``mean_field``; :func:`fedsa_jax.problems.expected` returns it)."""
        return SARSAMeanField(
            self.transitions,
            self.rewards,
            self.features,
            self.gamma,
            self.temperature,
            self.epsilon,
            self.A_bar,
            self.b_bar,
            self.theta_star,
            self.local_theta_star,
            self.policy,
        )

    def describe(self) -> dict[str, Any]:
        return self.mdp_description("sarsa", policy=self.policy, sampling=self.sampling)


def _one_hot_steps(self: FederatedSARSA, c, pair, u, error, step_sizes, control):
    """:meth:`FederatedSARSA.error_observed_steps` with one-hot features (its docstring)."""
    S, A = self.num_states, self.num_actions
    v = self.features_star[:, self.dim]  # v(s, a) = phi(s, a)^T theta_star, from float64
    actions = jnp.arange(A, dtype=jnp.int32)
    gamma, tau = self.gamma, self.temperature

    def body(carry, xs):
        e, p, e_p = carry
        u_h, eta = xs
        s_next = alias_draw(self.P_prob, self.P_alias, (c * (S * A) + p) * S, u_h[0], S)
        e_row = jax.lax.dynamic_slice(e, (s_next * A,), (A,))
        v_row = jax.lax.dynamic_slice(v, (s_next * A,), (A,))
        a = softmax_draw(e_row + v_row, tau, u_h[1])
        n = s_next * A + a
        e_n = jnp.sum(jnp.where(actions == a, e_row, 0.0))
        v_n = jnp.sum(jnp.where(actions == a, v_row, 0.0))
        step = eta * ((e_p - gamma * e_n) + (self.values_less_rewards[c * (S * A) + p] - gamma * v_n))
        if control is None:
            e = e.at[p].add(-step)
            e_p = jnp.where(n == p, e_n - step, e_n)
        else:
            e = e.at[p].add(-step) + eta * control
            e_p = jnp.where(n == p, e_n - step, e_n) + eta * control[n]
        return (e, n, e_p), None

    H = step_sizes.shape[0]
    carry = (error, pair, error[pair])
    unroll = local_unroll(H, FOLLOWS_ITERATE_UNROLL)
    (error, pair, _), _ = jax.lax.scan(body, carry, (u, step_sizes), unroll=unroll)
    return error, pair


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SARSAMeanField(_AgentTables, NoRandomness):
    """The noise-free version of a :class:`FederatedSARSA` problem: agent c's direction at theta is
    ``-g_c(theta)`` (:func:`mean_field`, one linear solve per call), with no randomness. Not affine
    in theta (``linear = False``): every algorithm runs it in its own kernel, which gives the
    deterministic mean path (:func:`fedsa_jax.theory.mean_path`); the exact linear recursions
    refuse it."""

    transitions: jax.Array
    rewards: jax.Array
    features: jax.Array
    gamma: jax.Array
    temperature: jax.Array
    epsilon: jax.Array
    A_bar: jax.Array
    b_bar: jax.Array
    theta_star: jax.Array
    local_theta_star: jax.Array
    policy: str = dataclasses.field(default="softmax", metadata=dict(static=True))

    linear = False

    def direction(self, c: jax.Array, obs: Any, theta: jax.Array) -> jax.Array:
        """``-g_c(theta)``."""
        del obs
        return -mean_field(
            self.transitions[c],
            self.rewards[c],
            self.features,
            self.gamma,
            theta,
            self.temperature,
            self.epsilon,
            self.policy,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "family": "sarsa_mean_field",
            "num_agents": self.num_agents,
            "dim": self.dim,
            "policy": self.policy,
        }


def _groups(P: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct agents' MDPs: ``(first index of each distinct (P_c, r_c), each agent's group)``."""
    seen: dict[bytes, int] = {}
    first, group = [], []
    for c in range(P.shape[0]):
        key = P[c].tobytes() + r[c].tobytes()
        if key not in seen:
            seen[key] = len(first)
            first.append(c)
        group.append(seen[key])
    return np.asarray(first), np.asarray(group)


def _check_mdp(P: np.ndarray, name: str, value: Any) -> None:
    """Row-stochastic, and the chain through every action (what a softmax policy gives) has one
    stationary law."""
    if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=1e-6):
        _validate.fail(name, value, "rows P[c, s, a, :] must be nonnegative and sum to 1 (row-stochastic)")
    for c in range(P.shape[0]):
        every_action = f"{name}[{c}] (its chain under a policy that tries every action)"
        stationary_distribution(P[c].mean(axis=1), every_action)


def sarsa(
    transitions,
    rewards,
    features,
    gamma: float,
    temperature: float = 2.0,
    policy: str = "softmax",
    epsilon: float = 0.1,
    dtype=None,
) -> FederatedSARSA:
    """Federated SARSA problem from per-agent MDPs (module docstring).

    Args:
      transitions: ``(N, S, A, S)`` kernels ``P_c(s' | s, a)`` (``(S, A, S)``: one agent).
      rewards: ``(N, S, A)`` rewards ``r_c(s, a)`` (``(S, A)`` is shared by all agents).
      features: ``(S, A, d)`` state-action features (full column rank as an ``(S A, d)`` matrix);
        ``np.eye(S * A).reshape(S, A, S * A)`` is tabular SARSA.
      gamma: discount in ``[0, 1)``.
      temperature: tau > 0 of the softmax policy ``pi(a | s) ∝ exp(phi(s, a)^T theta / tau)``.
      policy: ``"softmax"`` or ``"epsilon_greedy"`` (greedy in the current Q-estimate with
        probability ``1 - epsilon``, uniform otherwise; its mean field is not smooth, so the
        references may not exist: Newton's method then says so).
      epsilon: exploration of the epsilon-greedy policy, in ``(0, 1]``.
      dtype: ``float32`` or ``float64`` (needs x64); default follows ``features``.

    The references (``theta_star`` = theta_lim_fed, ``local_theta_star``, ``theta_avg`` =
    theta_lim_avg) are computed in float64 when the problem is built (module docstring).
    """
    policy = _validate.choice("policy", policy, POLICIES)
    dt = _validate.float_dtype(
        "dtype", dtype, default_from=getattr(features, "dtype", None), source="features"
    )
    P = _validate.array("transitions", transitions, (3, 4))
    if P.ndim == 3:
        P = P[None]
    N, S, A, S2 = P.shape
    if S != S2 or min(N, S, A) < 1:
        _validate.fail("transitions", transitions, "expected shape (num_agents, S, A, S)")
    _validate.table_size("transitions", transitions, N * S * A * S, "num_agents x S^2 x A")
    _check_mdp(P, "transitions", transitions)
    P = P / P.sum(-1, keepdims=True)
    r = _validate.array("rewards", rewards, (2, 3))
    if r.shape not in ((S, A), (1, S, A), (N, S, A)):
        _validate.fail("rewards", rewards, f"expected shape ({N}, {S}, {A}) or ({S}, {A})")
    r = np.broadcast_to(r, (N, S, A)).copy()
    Phi = _validate.array("features", features, 3)
    if Phi.shape[:2] != (S, A):
        _validate.fail("features", features, f"expected shape ({S}, {A}, d): one row per state-action pair")
    if np.linalg.matrix_rank(Phi.reshape(S * A, -1)) < Phi.shape[-1]:
        _validate.fail("features", features, "columns must be linearly independent (full column rank)")
    g = _validate.real("gamma", gamma, 0.0, 1.0, high_open=True)
    tau = _validate.real("temperature", temperature, 0.0, low_open=True)
    eps = _validate.real("epsilon", epsilon, 0.0, 1.0, low_open=policy == "epsilon_greedy")

    first, group = _groups(P, r)
    weights = np.bincount(group) / N
    theta_star = sarsa_limit(P[first], r[first], Phi, g, tau, eps, policy, weights)
    local = np.stack(
        [sarsa_limit(P[c][None], r[c][None], Phi, g, tau, eps, policy, start=theta_star) for c in first]
    )[group]
    theta_avg = sarsa_limit(P.mean(0)[None], r.mean(0)[None], Phi, g, tau, eps, policy, start=theta_star)
    with float64():
        systems = [frozen_system(P[c], r[c], Phi, g, theta_star, tau, eps, policy) for c in first]
        A_bar = np.stack([np.asarray(s[0]) for s in systems])[group]
        b_bar = np.stack([np.asarray(s[1]) for s in systems])[group]
    flat = Phi.reshape(S * A, -1)
    star = np.hstack([flat, (flat @ theta_star)[:, None]])
    _validate.fits("rewards", rewards, r, dt)
    _validate.fits("features", features, star, dt, "the features and the values Phi theta_star")
    P_prob, P_alias = alias_tables(P)
    f = lambda x: jnp.asarray(x, dtype=dt)  # noqa: E731
    return FederatedSARSA(
        transitions=f(P),
        rewards=f(r),
        features=f(Phi),
        gamma=f(g),
        temperature=f(tau),
        epsilon=f(eps),
        A_bar=f(A_bar),
        b_bar=f(b_bar),
        theta_star=f(theta_star),
        local_theta_star=f(local),
        theta_avg=f(theta_avg),
        P_prob=f(P_prob.ravel()),
        P_alias=jnp.asarray(P_alias.ravel(), jnp.int32),
        features_star=f(star),
        values_less_rewards=f((star[:, -1][None, :] - r.reshape(N, S * A)).ravel()),
        policy=policy,
        one_hot=Phi.shape[-1] == S * A and bool(np.array_equal(flat, np.eye(S * A))),
    )


def garnet_control_mdp(num_states: int, num_actions: int, branching: int, generation_seed: int):
    """One Garnet MDP drawn as the federated-SARSA paper's code draws it (``GarnetEnv``, draw for
    draw from ``numpy.random.default_rng(generation_seed)``): for each state s and action a in that
    order, ``branching`` distinct next states without replacement; then the probabilities, U(0, 1)
    of shape ``(S, A, B)`` normalised over the B next states; then the rewards U(0, 1) of shape
    ``(S, A)``. Returns ``(P (S, A, S), r (S, A))``."""
    rng = np.random.default_rng(generation_seed)
    S, A, B = num_states, num_actions, branching
    successors = np.array([[rng.choice(S, B, replace=False) for _ in range(A)] for _ in range(S)])
    probs = rng.uniform(size=(S, A, B))
    probs /= probs.sum(axis=2, keepdims=True)
    rewards = rng.uniform(low=0, high=1, size=(S, A))
    P = np.zeros((S, A, S))
    np.add.at(P, (np.arange(S)[:, None, None], np.arange(A)[None, :, None], successors), probs)
    return P, rewards


def garnet_control(
    num_agents: int = 2,
    num_states: int = 10,
    num_actions: int = 3,
    branching: int = 2,
    generation_seeds=(0, 1),
    heterogeneity: float = 1.0,
    gamma: float = 0.9,
    temperature: float = 2.0,
    dim: int | None = None,
    feature_seed: int = 0,
    policy: str = "softmax",
    epsilon: float = 0.1,
    dtype=None,
) -> FederatedSARSA:
    """The federated-SARSA paper's Garnet (arXiv:2512.17688, Sec. 6; its code's ``GarnetEnv``):
    MDPs from :func:`garnet_control_mdp`, agent c on generation seed
    ``generation_seeds[c mod len(generation_seeds)]`` (the paper: seeds 0 and 1, agents alternating),
    one-hot features (``dim=None``, d = S A) and the paper's defaults (S = 10, A = 3, branching 2,
    gamma 0.9, temperature 2).

    Heterogeneity ``h`` in [0, 1] mixes each agent's MDP with the average of the generated ones:
    ``P_c = (1 - h) P_bar + h P_{seed(c)}``, ``r_c = (1 - h) r_bar + h r_{seed(c)}``, so ``h = 1`` is
    the paper's agents, ``h = 0`` has every agent on the averaged MDP, and with the agents spread
    evenly over the seeds the averaged MDP (hence ``theta_avg``) is the same for every h.

    ``dim`` (an int): dense features instead, U(0, 1) entries from
    ``numpy.random.default_rng(feature_seed)``, each row divided by its sum (as :func:`garnet`)."""
    N = _validate.integer("num_agents", num_agents, maximum=_validate.INDEX_MAX)
    S = _validate.integer("num_states", num_states, maximum=2**15)
    A = _validate.integer("num_actions", num_actions, maximum=2**10)
    B = _validate.integer("branching", branching, maximum=S)
    _validate.table_size("num_agents", num_agents, N * S * A * S, "num_agents x num_states^2 x num_actions")
    seeds = [generation_seeds] if np.ndim(generation_seeds) == 0 else list(generation_seeds)
    integers = all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in seeds)
    if not seeds or not integers:
        _validate.fail("generation_seeds", generation_seeds, "expected nonnegative integers (one MDP each)")
    h = _validate.real("heterogeneity", heterogeneity, 0.0, 1.0)
    mdps = [garnet_control_mdp(S, A, B, int(seed)) for seed in seeds]
    P_gen = np.stack([m[0] for m in mdps])
    r_gen = np.stack([m[1] for m in mdps])
    which = np.arange(N) % len(seeds)
    P = (1.0 - h) * P_gen.mean(0) + h * P_gen[which]
    r = (1.0 - h) * r_gen.mean(0) + h * r_gen[which]
    if dim is None:
        Phi = np.eye(S * A).reshape(S, A, S * A)
    else:
        d = _validate.integer("dim", dim, maximum=S * A)
        Phi = np.random.default_rng(feature_seed).uniform(size=(S * A, d))
        Phi = (Phi / Phi.sum(1, keepdims=True)).reshape(S, A, d)
    return sarsa(P, r, Phi, gamma, temperature, policy=policy, epsilon=epsilon, dtype=dtype)


def _garnet_control_from_options(key, args):
    """``--problem sarsa-garnet``: :func:`garnet_control` from the options. The generation seeds draw
    the MDPs (not ``key``); ``--problem-seed`` draws the dense features of ``--dim``."""
    del key
    S, B = args.states or 10, args.branching
    if B > S:  # named after --states where --branching is its default (the one given, most likely)
        name, value = ("num_states", S) if B == registry.BRANCHING.default else ("branching", B)
        reason = f"each state-action pair moves to branching={B} distinct states, more than num_states={S}"
        _validate.fail(name, value, reason)
    level = {"homogeneous": 0.0, "heterogeneous": 1.0}.get(args.heterogeneity, args.heterogeneity)
    return garnet_control(
        num_agents=args.agents,
        num_states=S,
        num_actions=args.actions or 3,
        branching=B,
        generation_seeds=[int(s) for s in args.generation_seeds.split(",")],
        heterogeneity=level,  # pyright: ignore[reportArgumentType]
        gamma=0.9 if args.gamma is None else args.gamma,
        temperature=args.temperature,
        dim=args.dim,
        feature_seed=args.problem_seed,
        dtype=args.dtype,
    )


registry.register_problem(
    "sarsa-garnet",
    _garnet_control_from_options,
    options=(
        registry.HETEROGENEITY,
        registry.STATES,
        registry.ACTIONS,
        registry.BRANCHING,
        registry.TEMPERATURE,
        registry.GENERATION_SEEDS,
        registry.GAMMA,
    ),
    note="federated SARSA (control) on the FedSARSA paper's Garnet MDPs",
    order=3,
)
