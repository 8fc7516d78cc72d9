"""Shared pieces of the problem families: exact fixed points and alias sampling.

A federated LSA problem is a frozen dataclass registered as a JAX pytree (arrays
are leaves, structural options are static), with this interface used by the
algorithms, all written for **one agent** (the algorithms vmap over agents):

* ``agent_params()``: pytree of per-agent arrays, leading axis ``num_agents``;
* ``init_sampler(key, params)``: the agent's observation-stream state (the Markov
  chain's current state; a dummy for i.i.d. sampling);
* ``randomness(key, num_agents, num_obs, skip)``: all agents' random numbers for
  one round, drawn in one block (no per-step or per-agent key splitting);
* ``observe(params, sampler, rand, skip)``: one agent's observations for the
  round from its random numbers, and the new sampler state;
* ``direction(params, obs, theta)``: ``A_c(Z) theta - b_c(Z)`` for one observation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate


def fixed_points(A_bar: np.ndarray, b_bar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``theta_star`` of the averaged system and each agent's ``local_theta_star``.

    Raises ``ValueError`` if ``mean_c A_bar[c]`` is singular. A singular local
    system gives NaN in that agent's row of ``local_theta_star``.
    """
    A_mean = A_bar.mean(axis=0)
    cond = np.linalg.cond(A_mean)
    if not np.isfinite(cond) or cond > 1e12:
        _validate.fail(
            "A_bar",
            A_bar,
            f"mean over agents of A_bar is singular (condition number {cond:.3g}); "
            "the averaged system must have a unique solution theta_star",
        )
    theta_star = np.linalg.solve(A_mean, b_bar.mean(axis=0))
    local = np.full_like(b_bar, np.nan)
    for c in range(A_bar.shape[0]):
        if np.linalg.cond(A_bar[c]) < 1e12:
            local[c] = np.linalg.solve(A_bar[c], b_bar[c])
    return theta_star, local


def alias_tables(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias tables for each row of ``probs (..., S)``.

    Drawing ``i = floor(S u)``, then ``i`` if ``S u - i < prob[i]`` else ``alias[i]``,
    samples the row's law exactly with one uniform and O(1) work, whatever S.
    """
    probs = np.asarray(probs, dtype=np.float64)
    flat = probs.reshape(-1, probs.shape[-1])
    S = flat.shape[-1]
    prob = np.ones_like(flat)
    alias = np.tile(np.arange(S, dtype=np.int32), (flat.shape[0], 1))
    for r, row in enumerate(flat):
        q = row / row.sum() * S
        small = [i for i in range(S) if q[i] < 1.0]
        large = [i for i in range(S) if q[i] >= 1.0]
        while small and large:
            lo, hi = small.pop(), large.pop()
            prob[r, lo] = q[lo]
            alias[r, lo] = hi
            q[hi] = q[hi] + q[lo] - 1.0
            (small if q[hi] < 1.0 else large).append(hi)
        # Leftovers have q == 1 up to rounding.
    return prob.reshape(probs.shape), alias.reshape(probs.shape)


def alias_draw(prob: jax.Array, alias: jax.Array, offset: jax.Array, u: jax.Array, S: int) -> jax.Array:
    """Draw from the alias table stored at ``prob[offset:offset+S]``, ``alias[...]``.

    ``prob`` and ``alias`` are flat tables shared by all agents and rows (not
    vmapped): under vmap only the indices are batched, so XLA emits one plain
    gather instead of a batched one (several times faster on CPU).
    """
    x = u * S
    i = jnp.minimum(x.astype(jnp.int32), S - 1)
    j = offset + i
    return jnp.where(x - i < prob[j], i, alias[j])


def stationary_distribution(P: np.ndarray, name: str = "transitions") -> np.ndarray:
    """Stationary law of a row-stochastic ``P (S, S)`` by one linear solve.

    Solves ``mu^T (I - P) = 0``, ``sum(mu) = 1``; raises if it is not unique.
    """
    S = P.shape[0]
    M = np.vstack([(np.eye(S) - P).T, np.ones((1, S))])
    rhs = np.zeros(S + 1)
    rhs[-1] = 1.0
    mu, _, rank, _ = np.linalg.lstsq(M, rhs, rcond=None)
    if rank < S or not np.allclose(M @ mu, rhs, atol=1e-10):
        _validate.fail(name, P, "the chain must have a unique stationary law (one recurrent class)")
    return np.clip(mu, 0.0, None) / np.clip(mu, 0.0, None).sum()
