"""Shared pieces of the problem families: exact fixed points, alias sampling, per-agent MDP tables.

Public (exported from :mod:`fedsa_jax.problems`): :func:`fixed_points`,
:func:`alias_tables` and :func:`alias_draw`, the pieces a user-written problem
needs; the interface itself is :class:`fedsa_jax.problems.Problem`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate


def float64():
    """A context in which JAX computes in float64 (x64 on), whatever the global setting: the
    references that need autodiff (Newton's method on a nonlinear mean field) run in it."""
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    from jax.experimental import enable_x64  # older JAX  # pyright: ignore

    return enable_x64()


def fixed_points(
    A_bar, b_bar, name: str = "A_bar", value: Any = None, hint: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``theta_star`` of the averaged system and each agent's ``local_theta_star``.

    ``theta_star`` solves ``(mean_c A_bar[c]) theta = mean_c b_bar[c]``;
    ``local_theta_star[c]`` solves ``A_bar[c] theta = b_bar[c]``. Both by linear
    solves in float64 numpy (cast them to the problem's dtype afterwards).

    Args:
      A_bar: ``(N, d, d)`` mean matrices.
      b_bar: ``(N, d)`` mean vectors.
      name, value: the argument named in the error and the value shown (default:
        ``A_bar`` itself); a constructor names its own input, e.g. ``"features"``.
      hint: appended to the error message.

    Returns:
      ``(theta_star (d,), local_theta_star (N, d))``.

    Raises ``ValueError`` naming ``name`` if ``A_bar`` or ``b_bar`` has a NaN or an
    infinite entry, or if ``mean_c A_bar[c]`` is singular (condition number above
    1e12). A singular local system gives NaN in that
    agent's row of ``local_theta_star``.

    Example:
      >>> import numpy as np, fedsa_jax as fj
      >>> star, local = fj.problems.fixed_points(np.stack([np.eye(2), 3 * np.eye(2)]), np.ones((2, 2)))
      >>> star.tolist(), local.tolist()
      ([0.5, 0.5], [[1.0, 1.0], [0.3333333333333333, 0.3333333333333333]])
    """
    A_bar = np.asarray(A_bar, np.float64)
    b_bar = np.asarray(b_bar, np.float64)
    if not (np.all(np.isfinite(A_bar)) and np.all(np.isfinite(b_bar))):  # before LAPACK sees them
        _validate.fail(
            name,
            A_bar if value is None else value,
            "A_bar and b_bar must be finite (found Inf or NaN: an overflow?)" + hint,
        )
    A_mean = A_bar.mean(axis=0)
    cond = np.linalg.cond(A_mean)
    if not np.isfinite(cond) or cond > 1e12:
        _validate.fail(
            name,
            A_bar if value is None else value,
            f"mean over agents of A_bar is singular (condition number {cond:.3g}); "
            "the averaged system must have a unique solution theta_star" + hint,
        )
    theta_star = np.linalg.solve(A_mean, b_bar.mean(axis=0))
    local = np.full_like(b_bar, np.nan)
    for c in range(A_bar.shape[0]):
        if np.linalg.cond(A_bar[c]) < 1e12:
            local[c] = np.linalg.solve(A_bar[c], b_bar[c])
    return theta_star, local


def alias_tables(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias tables for each row of ``probs (..., S)`` (host side, numpy).

    Drawing ``i = floor(S u)`` from one uniform u, then ``i`` if ``S u - i < prob[i]``
    else ``alias[i]``, samples the row's law exactly with O(1) work, whatever S
    (:func:`alias_draw` does it in JAX). Rows need not be normalised.

    Returns:
      ``(prob, alias)``, both of shape ``probs.shape``: float64 thresholds and int32
      indices. Store them flat on the problem (``.ravel()``) and read row r at
      offset ``r * S`` with :func:`alias_draw`.

    Reference: M. D. Vose, "A linear algorithm for generating random numbers with a
    given distribution", IEEE Trans. Software Eng., 1991.
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
    """Draw from the alias table stored at ``prob[offset:offset+S]``, ``alias[...]``
    (tables from :func:`alias_tables`, flattened) with the uniform ``u`` in ``[0, 1)``.

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


class AgentMDPs:
    """What the control problems share: per-agent MDPs ``transitions (N, S, A, S)``, read with the
    agent index c as ``params`` (flat indices into tables shared by all agents, unbatched)."""

    transitions: jax.Array

    @property
    def num_agents(self) -> int:
        return self.transitions.shape[0]

    @property
    def num_states(self) -> int:
        return self.transitions.shape[1]

    @property
    def num_actions(self) -> int:
        return self.transitions.shape[2]

    def agent_params(self) -> jax.Array:
        """The agent index c: per-agent tables are read with flat indices, unbatched."""
        return jnp.arange(self.num_agents, dtype=jnp.int32)

    def mdp_description(self, family: str, **more: Any) -> dict[str, Any]:
        """``describe()``'s structure: the family, N, S, A, d and ``more``."""
        dim = self.dim  # pyright: ignore[reportAttributeAccessIssue]
        sizes = {
            "num_agents": self.num_agents,
            "num_states": self.num_states,
            "num_actions": self.num_actions,
        }
        return {"family": family, **sizes, "dim": dim, **more}
