"""Federated TD(0) with linear features as a federated LSA problem.

Agent ``c`` evaluates a fixed policy on its own Markov reward process
``(P_c, r_c)`` with shared features ``Phi (S, d)`` and discount ``gamma``. With
``mu_c`` the stationary law of ``P_c`` and ``D_c = diag(mu_c)``:

    A_bar[c] = Phi^T D_c (I - gamma P_c) Phi,      b_bar[c] = Phi^T D_c r_c.

One observation ``Z = (s, s')`` gives ``A(Z) = phi(s) (phi(s) - gamma phi(s'))^T``
and ``b(Z) = r_c(s) phi(s)``, so ``b(Z) - A(Z) theta`` is the TD(0) direction
``(r_c(s) + gamma phi(s')^T theta - phi(s)^T theta) phi(s)``. ``A(Z)`` is never
formed: an observation is ``(s, s', r_c(s))`` and the update reads two rows of Phi.

Sampling (alias tables, O(1) work per draw whatever S):

* ``"generative"``: ``s ~ mu_c``, ``s' ~ P_c(s, .)``, i.i.d. across steps;
* ``"markov"``: one trajectory per agent and seed, started from ``mu_c`` and
  carried across rounds; observation k is ``(s_k, s_{k+1})``. With ``skip > 1``
  the chain moves ``skip`` steps per kept observation.

Pair tables (when ``S^2 <= 2^16`` and ``S^2 2d <= PAIR_TABLE_MAX``, e.g. ``S <= 256`` at
``d = 10``): a generative observation is one draw of the pair ``(s, s')`` from
the joint law ``mu_c(s) P_c(s, s')`` (an alias table over ``S^2`` outcomes read
with one 32-bit word, :func:`pair_draw`), and a step reads one row
``[phi(s) | phi(s) - gamma phi(s')]`` and one constant
``v(s) - gamma v(s') - r_c(s)`` (``v = Phi theta_star``, from float64) indexed by
the pair: about 1.8x faster than two dependent draws and two feature rows (same
law, another random stream; Markov observations use the same rows, same
stream). Larger S keeps per-state tables (``S^2`` rows would not fit in cache).

References: Mangold et al., SCAFFLSA, NeurIPS 2024, arXiv:2402.04114, Sec. 2;
Dal Fabbro, Mitra, Pappas, "Federated TD Learning over Finite-Rate Erasure
Channels: Linear Speedup under Markovian Sampling", IEEE L-CSS 2023, Sec. 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate
from fedsa_jax.problems import fused
from fedsa_jax.problems._base import (
    alias_draw,
    alias_tables,
    fixed_points,
    stationary_distribution,
)
from fedsa_jax.problems.protocol import direction_second_moment

__all__ = ["FederatedTD", "MarkovObservations", "federated_td"]

SAMPLING_MODES = ("generative", "markov")
# Pair tables (one row per (s, s'): phi(s) and phi(s) - gamma phi(s')) when they hold at most this
# many values (8 MB in float32) and S^2 <= 2^16: S <= 256 at d = 10. Larger S reads two rows of
# [Phi | Phi theta_star] per step.
PAIR_TABLE_MAX = 2**21


class TDObservation(NamedTuple):
    state: jax.Array  # () int32, s
    next_state: jax.Array  # () int32, s'
    reward: jax.Array  # () r_c(s)
    pair: jax.Array  # () int32, s * S + s'


class MarkovObservations(NamedTuple):
    """Observations along per-agent Markov chains as a function of the transition (float64):
    ``initial (N, S)`` the law of each chain's first state, ``transitions (N, S, S)`` the
    kernels, ``A (N, S, S, d, d)`` and ``b (N, S, S, d)`` the observation ``(A_c(s, s'),
    b_c(s, s'))`` of agent c's transition ``s -> s'``. Chains of different agents are
    independent."""

    initial: np.ndarray
    transitions: np.ndarray
    A: np.ndarray
    b: np.ndarray


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FederatedTD:
    """Federated TD(0) problem (see module docstring); build with :func:`federated_td`."""

    transitions: jax.Array  # (N, S, S)
    rewards: jax.Array  # (N, S)
    features: jax.Array  # (S, d)
    gamma: jax.Array  # ()
    stationary: jax.Array  # (N, S)
    A_bar: jax.Array  # (N, d, d)
    b_bar: jax.Array  # (N, d)
    theta_star: jax.Array  # (d,)
    local_theta_star: jax.Array  # (N, d)
    mu_prob: jax.Array  # (N*S,) alias tables of mu_c, flat (see alias_draw)
    mu_alias: jax.Array  # (N*S,)
    P_prob: jax.Array  # (N*S*S,) alias tables of the rows of P_c, flat
    P_alias: jax.Array  # (N*S*S,)
    features_star: jax.Array  # (S, d + 1) [Phi | Phi theta_star], the values from float64 (error_direction)
    pair_threshold: jax.Array  # (N*S*S,) uint32 alias tables of the pair laws mu_c(s) P_c(s, s') (pair_draw)
    pair_alias: jax.Array  # (N*S*S,)
    pair_rows: (
        jax.Array
    )  # (S*S, 2d) [phi(s) | phi(s) - gamma phi(s')] at row s*S + s' ((0, 2d) without pair tables)
    pair_const: (
        jax.Array
    )  # (N*S*S,) v(s) - gamma v(s') - r_c(s), v = Phi theta_star, from float64 ((0,) without)
    sampling: str = dataclasses.field(default="generative", metadata=dict(static=True))
    pair_tables: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def num_agents(self) -> int:
        return self.transitions.shape[0]

    @property
    def num_states(self) -> int:
        return self.transitions.shape[-1]

    @property
    def dim(self) -> int:
        return self.features.shape[-1]

    @property
    def dtype(self):
        return self.features.dtype

    def agent_params(self) -> jax.Array:
        """The agent index c: per-agent tables are read with flat indices, unbatched."""
        return jnp.arange(self.num_agents, dtype=jnp.int32)

    def init_sampler(self, key: jax.Array, c: jax.Array) -> jax.Array:
        """Initial chain state ``s_0 ~ mu_c`` (unused under generative sampling)."""
        u = jax.random.uniform(key, (), self.dtype)
        return alias_draw(self.mu_prob, self.mu_alias, c * self.num_states, u, self.num_states)

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> jax.Array:
        """All agents' random numbers for one round, drawn in one block: with pair tables one
        uint32 word per generative observation ``(N, H)``, else uniforms ``(N, 2, H)``
        (generative) or ``(N, H skip)`` (Markov)."""
        if self.sampling == "generative":
            # i.i.d. observations: discarding skip-1 of every skip leaves the law unchanged.
            if self.pair_tables:  # one uint32 word per observation (pair_draw)
                return _prng.bits(key, (num_agents, num_obs))
            return _prng.uniform(key, (num_agents, 2, num_obs), self.dtype)
        return _prng.uniform(key, (num_agents, num_obs * skip), self.dtype)

    def observe(self, c: jax.Array, sampler: jax.Array, u: jax.Array, skip: int = 1):
        """Agent c's observations ``(s, s')`` from its uniforms (alias sampling)."""
        S = self.num_states

        def move(state, u_t):
            return alias_draw(self.P_prob, self.P_alias, (c * S + state) * S, u_t, S)

        if self.sampling == "generative" and self.pair_tables:
            pair = pair_draw(self.pair_threshold, self.pair_alias, c * (S * S), u, S * S)
            s = pair // S
            s_next = pair - s * S
            return TDObservation(s, s_next, self.rewards.reshape(-1)[c * S + s], pair), sampler
        if self.sampling == "generative":
            s = alias_draw(self.mu_prob, self.mu_alias, c * S, u[0], S)
            s_next = move(s, u[1])
        else:

            def chain(state, u_t):
                nxt = move(state, u_t)
                return nxt, nxt

            last, path = jax.lax.scan(chain, sampler, u)
            path = jnp.concatenate([sampler[None], path])  # s_0 .. s_{H skip}
            s, s_next = path[:-1:skip], path[1::skip]
            sampler = last
        return TDObservation(s, s_next, self.rewards.reshape(-1)[c * S + s], s * S + s_next), sampler

    def direction(self, c: jax.Array, obs: TDObservation, theta: jax.Array) -> jax.Array:
        """``A(Z) theta - b(Z) = ((phi(s) - gamma phi(s'))^T theta - r(s)) phi(s)``."""
        phi = self.features[obs.state]
        psi = phi - self.gamma * self.features[obs.next_state]
        return (jnp.dot(psi, theta) - obs.reward) * phi  # dot: batched GEMV, faster than sum(*)

    def error_direction(self, c: jax.Array, obs: TDObservation, error: jax.Array) -> jax.Array:
        """The direction at ``theta_star + error``, accurate in ``error``:
        ``(psi^T error + v(s) - gamma v(s') - r(s)) phi(s)`` with the TD error at the optimum
        from ``v = Phi theta_star`` (computed in float64)."""
        d = self.dim
        if self.pair_tables:  # one row gather and one scalar gather per step
            S = self.num_states
            pair = obs.pair
            row = self.pair_rows[pair]
            return (jnp.dot(row[d:], error) + self.pair_const[c * (S * S) + pair]) * row[:d]
        row = self.features_star[obs.state]  # one gather gives phi(s) and v(s)
        full = row - self.gamma * self.features_star[obs.next_state]  # (psi, v(s) - gamma v(s'))
        return (jnp.dot(full[:d], error) + (full[d] - obs.reward)) * row[:d]

    def error_local_steps(self, c, obs: TDObservation, error, step_sizes, control):
        """One agent's H local steps in error coordinates as the fused kernel
        (:func:`fedsa_jax.problems.fused.td_local_steps`) when the run uses it and the problem has
        pair tables; ``None`` otherwise (the algorithms then scan :meth:`error_direction`)."""
        # kept through the steps: the iterate, the control and the step's row [phi | psi]
        if (
            not (self.pair_tables and fused.usable(4 * self.dim, self.dtype))
            or type(self).error_direction is not FederatedTD.error_direction
        ):
            return None
        return fused.td_local_steps(self, c, obs.pair, error, step_sizes, control)

    def noise_second_moment(self):
        """The protocol's ``noise_second_moment``: ``cov(m, X) -> (N, d, d)``, float64 numpy.

        With ``Z = (s, s')``, ``s ~ mu_c``, ``s' ~ P_c(s, .)`` and ``u = phi(s) - gamma phi(s')``,
        ``E[(b(Z) - A(Z) x)(...)^T] = sum_s mu_c(s) phi(s) phi(s)^T E_{s'|s}[(r_c(s) - u^T x)^2]``,
        from which the mean part is removed; the inner expectation needs only ``E[u | s]`` and
        ``E[u u^T | s]`` (finite support, enumerated once). Exact for generative sampling."""
        A = np.asarray(self.A_bar, np.float64)
        b = np.asarray(self.b_bar, np.float64)
        N, d, _ = A.shape
        mean_part = direction_second_moment(np.ones((N, 1)), A[:, None], b[:, None])
        P = np.asarray(self.transitions, np.float64)  # (N, S, S)
        r = np.asarray(self.rewards, np.float64)  # (N, S)
        phi = np.asarray(self.features, np.float64)  # (S, d)
        mu = np.asarray(self.stationary, np.float64)  # (N, S)
        g = float(self.gamma)
        next_phi = P @ phi  # (N, S, d): E[phi(s') | s]
        next_phi2 = np.einsum("cst,ti,tj->csij", P, phi, phi)  # E[phi(s') phi(s')^T | s]
        pp = np.einsum("si,sj->sij", phi, phi)
        u1 = phi[None] - g * next_phi  # E[u | s]
        u2 = (
            pp[None]
            - g * (np.einsum("si,csj->csij", phi, next_phi) + np.einsum("csi,sj->csij", next_phi, phi))
            + g * g * next_phi2
        )  # E[u u^T | s]
        S = P.shape[-1]
        weight = (mu[:, :, None, None] * pp[None]).reshape(N, S, d * d)  # mu_c(s) phi(s) phi(s)^T
        u2 = u2.reshape(N, S, d * d)

        def cov(m, X):  # batched matmuls over agents (einsum is several times slower here)
            q = r**2 - 2 * r * (u1 @ m[:, :, None])[..., 0] + (u2 @ X.reshape(N, d * d, 1))[..., 0]  # (N, S)
            second = (q[:, None, :] @ weight).reshape(N, d, d)
            return second - mean_part(m, X)

        return cov

    def markov_observations(self) -> MarkovObservations:
        """The law of the observations along the agents' chains, float64 numpy (the optional
        protocol member read by the exact recursions under Markov sampling): each chain starts from
        ``mu_c`` (:meth:`init_sampler`), moves by ``P_c``, and the observation of the transition
        ``s -> s'`` is ``A(s, s') = phi(s) (phi(s) - gamma phi(s'))^T``, ``b(s, s') = r_c(s) phi(s)``
        (:meth:`observe`: with ``skip = k`` the local step reads the transition
        ``(s_{hk}, s_{hk+1})`` and the chain moves on to ``s_{(h+1)k}``)."""
        P = np.asarray(self.transitions, np.float64)  # (N, S, S)
        r = np.asarray(self.rewards, np.float64)  # (N, S)
        phi = np.asarray(self.features, np.float64)  # (S, d)
        g = float(self.gamma)
        N, S = r.shape
        psi = phi[:, None, :] - g * phi[None, :, :]  # (S, S, d): phi(s) - gamma phi(s')
        A = np.broadcast_to(np.einsum("si,stj->stij", phi, psi)[None], (N, S, S) + 2 * (phi.shape[1],))
        b = np.broadcast_to((r[:, :, None] * phi[None])[:, :, None, :], (N, S, S, phi.shape[1]))
        return MarkovObservations(np.asarray(self.stationary, np.float64), P, A, b)

    def describe(self) -> dict[str, Any]:
        return {
            "family": "federated_td",
            "num_agents": self.num_agents,
            "num_states": self.num_states,
            "dim": self.dim,
            "sampling": self.sampling,
            # which generative sampler ran (same law, different random streams): pair tables or per-state
            "sampler": "pair_tables" if self.pair_tables and self.sampling == "generative" else "per_state",
        }


def pair_draw(threshold: jax.Array, alias: jax.Array, offset: jax.Array, w: jax.Array, K: int) -> jax.Array:
    """Alias draw over ``K < 2^16`` outcomes from one uint32 word ``w``: with ``w K = i 2^32 + f``
    (``i = floor(w K / 2^32)`` the column, ``f`` the remainder), keep ``i`` if
    ``f < threshold[offset + i]`` (``prob * 2^32``, uint32), else ``alias[offset + i]``.

    Integer arithmetic, not a float uniform ``u`` with ``floor(K u)``: float32's 23 bits
    would give the ``K`` columns unequal masses (relative error ``K / 2^23``, 1e-4 at
    ``K = 900``); 32-bit words err by at most ``K / 2^32`` (1e-7 at ``K = 400``) in any dtype.
    """
    k = np.uint32(K)
    # i = floor(w K / 2^32) from 16-bit halves (no uint64 without x64); f = w K mod 2^32 wraps.
    i = ((w >> np.uint32(16)) * k + (((w & np.uint32(0xFFFF)) * k) >> np.uint32(16))) >> np.uint32(16)
    i = i.astype(jnp.int32)
    j = offset + i
    return jnp.where(w * k < threshold[j], i, alias[j])


def td_system(P: np.ndarray, r: np.ndarray, Phi: np.ndarray, gamma: float, mu: np.ndarray):
    """Exact ``(A_bar, b_bar)`` of one agent: ``Phi^T D (I - gamma P) Phi``, ``Phi^T D r``."""
    D = np.diag(mu)
    A = Phi.T @ D @ (np.eye(P.shape[0]) - gamma * P) @ Phi
    b = Phi.T @ D @ r
    return A, b


def federated_td(transitions, rewards, features, gamma, sampling="generative", dtype=None) -> FederatedTD:
    """Federated TD(0) problem from per-agent Markov reward processes.

    Args:
      transitions: ``(N, S, S)`` row-stochastic kernels under the evaluated policy
        (``(S, S)`` is shared by one agent).
      rewards: ``(N, S)`` per-state rewards (``(S,)`` is shared by all agents).
      features: ``(S, d)`` feature matrix ``Phi`` (full column rank).
      gamma: discount in ``[0, 1)``.
      sampling: ``"generative"`` or ``"markov"``.
      dtype: ``float32`` or ``float64`` (needs x64); default follows ``features``.

    Stationary laws, ``A_bar``, ``b_bar`` and the fixed points are computed exactly
    in float64 (linear solves), then cast to ``dtype``.
    """
    sampling = _validate.choice("sampling", sampling, SAMPLING_MODES)
    dt = _validate.float_dtype(
        "dtype", dtype, default_from=getattr(features, "dtype", None), source="features"
    )
    P = _validate.array("transitions", transitions, (2, 3))
    if P.ndim == 2:
        P = P[None]
    N, S, S2 = P.shape
    if N < 1 or S != S2 or S < 1:
        _validate.fail("transitions", transitions, "expected shape (num_agents, S, S)")
    _validate.table_size("transitions", transitions, N * S * S, "num_agents x S^2")
    if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=1e-6):
        _validate.fail("transitions", transitions, "rows must be nonnegative and sum to 1 (row-stochastic)")
    P = P / P.sum(-1, keepdims=True)
    r = _validate.array("rewards", rewards, (1, 2))
    r = np.broadcast_to(r, (N, S)).copy() if r.shape in ((S,), (1, S), (N, S)) else None
    if r is None:
        _validate.fail("rewards", rewards, f"expected shape ({N}, {S}) or ({S},)")
    Phi = _validate.array("features", features, 2)
    if Phi.shape[0] != S:
        _validate.fail("features", features, f"expected shape ({S}, d): one row per state")
    if np.linalg.matrix_rank(Phi) < Phi.shape[1]:
        _validate.fail("features", features, "columns must be linearly independent (full column rank)")
    g = _validate.real("gamma", gamma, 0.0, 1.0, high_open=True)

    mu = np.stack([stationary_distribution(P[c], f"transitions[{c}]") for c in range(N)])
    systems = [td_system(P[c], r[c], Phi, g, mu[c]) for c in range(N)]
    A = np.stack([s[0] for s in systems])
    b = np.stack([s[1] for s in systems])
    theta_star, local = fixed_points(A, b)
    _validate.fits("rewards", rewards, r, dt)
    _validate.fits(
        "features",
        features,
        np.hstack([Phi, (Phi @ theta_star)[:, None]]),
        dt,
        "the features and the values Phi theta_star",
    )
    _validate.fits("rewards", rewards, theta_star, dt, "the fixed point theta_star's entries")
    mu_prob, mu_alias = alias_tables(mu)
    P_prob, P_alias = alias_tables(P)
    d = Phi.shape[1]
    pair_tables = S * S * 2 * d <= PAIR_TABLE_MAX and S * S <= 2**16
    if pair_tables:
        v = Phi @ theta_star
        pair_rows = np.concatenate(
            [np.repeat(Phi, S, axis=0), (Phi[:, None] - g * Phi[None]).reshape(S * S, d)], 1
        )
        pair_const = (v[:, None] - g * v[None, :])[None] - r[:, :, None]  # (N, S, S)
        pair_prob, pair_alias = alias_tables((mu[:, :, None] * P).reshape(N, S * S))
        pair_threshold = np.minimum(np.floor(pair_prob * 2.0**32), 2.0**32 - 1).astype(np.uint32)
    else:
        pair_rows, pair_const = np.zeros((0, 2 * d)), np.zeros((0,))
        pair_threshold, pair_alias = np.zeros((0,), np.uint32), np.zeros((0,), np.int32)
    f = lambda x: jnp.asarray(x, dtype=dt)  # noqa: E731
    i = lambda x: jnp.asarray(x, dtype=jnp.int32)  # noqa: E731
    return FederatedTD(
        transitions=f(P),
        rewards=f(r),
        features=f(Phi),
        gamma=f(g),
        stationary=f(mu),
        A_bar=f(A),
        b_bar=f(b),
        theta_star=f(theta_star),
        local_theta_star=f(local),
        mu_prob=f(mu_prob.ravel()),
        mu_alias=i(mu_alias.ravel()),
        P_prob=f(P_prob.ravel()),
        P_alias=i(P_alias.ravel()),
        features_star=f(np.hstack([Phi, (Phi @ theta_star)[:, None]])),
        pair_threshold=jnp.asarray(pair_threshold.ravel(), jnp.uint32),
        pair_alias=i(pair_alias.ravel()),
        pair_rows=f(pair_rows),
        pair_const=f(pair_const.ravel()),
        sampling=sampling,
        pair_tables=pair_tables,
    )
