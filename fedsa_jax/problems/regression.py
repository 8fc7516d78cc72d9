"""Federated linear regression (least squares) as a federated LSA problem.

Agent c holds ``n_c`` rows ``x_i (d,)`` with targets ``y_i``, i.e. ``X_c (n_c, d)``
and ``y_c (n_c,)``. One observation is a uniformly random row i of agent c:

    A_c(Z) = x_i x_i^T,    b_c(Z) = y_i x_i,

so the direction ``A_c(Z) theta - b_c(Z) = (x_i^T theta - y_i) x_i`` is the
stochastic gradient of the squared loss ``(x_i^T theta - y_i)^2 / 2`` (FedLSA on
this problem is local SGD / FedAvg). It costs O(d); the ``d x d`` matrix is never
formed. The means are the normal equations of each agent,

    A_bar[c] = X_c^T X_c / n_c,    b_bar[c] = X_c^T y_c / n_c,

``local_theta_star[c]`` is agent c's least-squares solution (NaN if ``X_c`` has
rank < d) and ``theta_star`` solves ``mean_c(A_bar[c]) theta = mean_c(b_bar[c])``:
the minimiser of ``mean_c |X_c theta - y_c|^2 / n_c``, every agent weighted
equally whatever its ``n_c``.

Storage: the rows of all agents are stacked in one ``(sum_c n_c, d)`` table with
per-agent offsets and counts, so the arrays are rectangular for any sizes and,
under the algorithms' vmap over agents, each agent gathers its rows from the one
shared (unbatched) table. A round draws one uniform per observation for all
agents in one block; row ``offset_c + floor(n_c u)``. A float32 uniform has 2^23
levels, so with float32 each row's probability is ``1/n_c`` up to a relative
``n_c 2^-23`` (float64: ``2^-52``).

This file is the example of a user-written problem: the sampler, the direction
and the exact theory (:meth:`LeastSquares.finite_support`) use only public
pieces (:func:`fedsa_jax.problems.fixed_points`,
:class:`fedsa_jax.problems.FiniteSupport`, ``jax.random``); only the argument
checks use the package's private validation helpers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.problems._base import fixed_points
from fedsa_jax.problems.protocol import FiniteSupport

__all__ = ["LeastSquares", "least_squares"]


class RowTable(NamedTuple):
    """One agent's slice of the shared row table (the problem's ``agent_params``)."""

    offset: jax.Array  # () int32, first row of the agent
    count: jax.Array  # () int32, n_c


class Row(NamedTuple):
    """One observation: a row and its target (leading axis H inside a round)."""

    x: jax.Array  # (d,)
    y: jax.Array  # ()
    residual_star: jax.Array  # () x^T theta_star - y (from float64)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LeastSquares:
    """Federated least-squares problem (see module docstring); build it with
    :func:`least_squares`."""

    rows: jax.Array  # (sum_c n_c, d) every agent's rows, agent after agent
    targets: jax.Array  # (sum_c n_c,)
    offsets: jax.Array  # (N,) int32, first row of each agent
    counts: jax.Array  # (N,) int32, n_c
    A_bar: jax.Array  # (N, d, d)
    b_bar: jax.Array  # (N, d)
    theta_star: jax.Array  # (d,)
    local_theta_star: jax.Array  # (N, d)
    residuals_star: jax.Array  # (sum_c n_c,) x_i^T theta_star - y_i, computed in float64

    @property
    def num_agents(self) -> int:
        return self.offsets.shape[0]

    @property
    def dim(self) -> int:
        return self.rows.shape[1]

    @property
    def dtype(self):
        return self.rows.dtype

    def agent_params(self) -> RowTable:
        return RowTable(self.offsets, self.counts)

    def init_sampler(self, key: jax.Array, params: RowTable) -> jax.Array:
        del key, params
        return jnp.zeros((), jnp.int32)  # i.i.d. observations carry no state

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> jax.Array:
        """One uniform per observation, all agents in one block ``(num_agents, num_obs)``."""
        del skip  # i.i.d. rows: discarding skip-1 of every skip leaves the law unchanged
        return jax.random.uniform(key, (num_agents, num_obs), self.dtype)

    def observe(self, params: RowTable, sampler: jax.Array, u: jax.Array, skip: int = 1):
        """The agent's rows ``offset + floor(n_c u)`` and their targets, ``(H, d)`` and ``(H,)``."""
        del skip
        i = jnp.minimum((u * params.count.astype(u.dtype)).astype(jnp.int32), params.count - 1)
        i = params.offset + i
        return Row(self.rows[i], self.targets[i], self.residuals_star[i]), sampler

    def direction(self, params: RowTable, obs: Row, theta: jax.Array) -> jax.Array:
        """``A_c(Z) theta - b_c(Z) = (x^T theta - y) x``."""
        del params
        return (jnp.dot(obs.x, theta) - obs.y) * obs.x

    def error_direction(self, params: RowTable, obs: Row, error: jax.Array) -> jax.Array:
        """The direction at ``theta_star + error``, accurate in ``error``:
        ``(x^T error + (x^T theta_star - y)) x``."""
        del params
        return (jnp.dot(obs.x, error) + obs.residual_star) * obs.x

    def finite_support(self) -> FiniteSupport:
        """Each row with probability ``1/n_c``, ``A = x x^T`` in rank-one form,
        ``b = y x``; agents padded to ``max_c n_c`` points with weight 0
        (memory O(N max_c n_c d))."""
        rows = np.asarray(self.rows, np.float64)
        y = np.asarray(self.targets, np.float64)
        offsets, counts = np.asarray(self.offsets), np.asarray(self.counts)
        k = np.arange(counts.max())
        idx = offsets[:, None] + np.minimum(k[None], counts[:, None] - 1)  # (N, K); padding repeats a row
        weights = np.where(k[None] < counts[:, None], 1.0 / counts[:, None], 0.0)
        x = rows[idx]
        return FiniteSupport(weights, b=y[idx][..., None] * x, left=x, right=x)

    def describe(self) -> dict[str, Any]:
        return {
            "family": "least_squares",
            "num_agents": self.num_agents,
            "dim": self.dim,
            "rows_per_agent": [int(n) for n in np.asarray(self.counts)],
        }


def _agent_arrays(name: str, value: Any, ndim: int) -> list[np.ndarray]:
    """A list of finite float64 arrays with ``ndim`` dimensions, one per agent."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        _validate.fail(name, type(value).__name__, "expected a list of arrays, one per agent")
    return [_validate.array(f"{name}[{c}]", v, ndim) for c, v in enumerate(value)]


def least_squares(features, targets, dtype=None) -> LeastSquares:
    """Federated linear regression: agent c's observations are the rows of
    ``(X_c, y_c)``, drawn uniformly (module docstring).

    Args:
      features: list of N arrays ``X_c (n_c, d)``; the ``n_c >= 1`` may differ,
        d may not. Integer arrays are converted.
      targets: list of N arrays ``y_c (n_c,)``.
      dtype: ``float32`` or ``float64`` (needs x64); default follows the features
        (float64, or float32 without x64, for integer features).

    Returns:
      :class:`LeastSquares`, with ``A_bar[c] = X_c^T X_c / n_c``,
      ``b_bar[c] = X_c^T y_c / n_c`` and the fixed points computed in float64.

    Raises ``ValueError`` naming the argument for NaN/Inf entries, lists of
    different lengths, ``X_c`` and ``y_c`` with different row counts, arrays of the
    wrong number of dimensions, an agent without rows, different d across agents,
    entries above ``sqrt(max(dtype) / n_c)`` in magnitude (whose products would overflow),
    a singular mean system ``mean_c X_c^T X_c / n_c``, or fixed points and residuals that
    overflow in ``dtype``.

    Example:
      >>> import numpy as np, fedsa_jax as fj
      >>> rng = np.random.default_rng(0)
      >>> X = [rng.normal(size=(n, 3)) for n in (50, 80)]
      >>> p = fj.problems.least_squares(X, [x @ np.ones(3) for x in X])
      >>> np.allclose(p.theta_star, 1.0)
      True
    """
    Xs = _agent_arrays("features", features, 2)  # refuses float16, bfloat16, complex, non-numeric
    ys = _agent_arrays("targets", targets, 1)
    dt = _validate.float_dtype(
        "dtype",
        dtype,
        default_from=np.result_type(*(getattr(X, "dtype", np.float64) for X in features))
        if isinstance(features, (Sequence, np.ndarray)) and len(features)
        else None,
    )
    N = len(Xs)
    if N < 1:
        _validate.fail("features", "[]", "expected at least one agent")
    if len(ys) != N:
        _validate.fail(
            "targets", f"list of {len(ys)} arrays", f"expected {N} arrays, one per agent like features"
        )
    d = Xs[0].shape[1]
    for c, (X, y) in enumerate(zip(Xs, ys)):
        if X.shape[0] < 1:
            _validate.fail(f"features[{c}]", X, "every agent needs at least one row")
        if X.shape[1] != d or d < 1:
            _validate.fail(
                f"features[{c}]", X, f"expected shape (n_{c}, {max(d, 1)}): the same d >= 1 for every agent"
            )
        if y.shape[0] != X.shape[0]:
            _validate.fail(
                f"targets[{c}]", y, f"expected shape ({X.shape[0]},): one target per row of features[{c}]"
            )
    _check_magnitudes(Xs, ys, dt)
    counts = np.array([X.shape[0] for X in Xs])
    A = np.stack([X.T @ X / n for X, n in zip(Xs, counts)])
    b = np.stack([X.T @ y / n for X, y, n in zip(Xs, ys, counts)])
    theta_star, local = fixed_points(
        A,
        b,
        name="features",
        value=f"list of {N} arrays",
        hint=" (the stacked rows of all agents must have full column rank d)",
    )
    residuals = np.concatenate(Xs) @ theta_star - np.concatenate(ys)
    shown = f"list of {N} arrays"
    _validate.fits("targets", shown, theta_star, dt, "the least-squares solution theta_star's entries")
    _validate.fits("targets", shown, local, dt, "the agents' least-squares solutions' entries")
    _validate.fits("targets", shown, residuals, dt, "the residuals x_i^T theta_star - y_i")
    f = lambda x: jnp.asarray(x, dtype=dt)  # noqa: E731
    return LeastSquares(
        rows=f(np.concatenate(Xs)),
        targets=f(np.concatenate(ys)),
        offsets=jnp.asarray(np.cumsum(counts) - counts, jnp.int32),
        counts=jnp.asarray(counts, jnp.int32),
        A_bar=f(A),
        b_bar=f(b),
        theta_star=f(theta_star),
        local_theta_star=f(local),
        residuals_star=f(residuals),
    )


def _check_magnitudes(Xs: list[np.ndarray], ys: list[np.ndarray], dt: np.dtype) -> None:
    """Refuse entries above ``sqrt(max(dt) / n_c)`` in magnitude: below it every product
    ``x_i x_j`` or ``x_i y`` is at most ``max(dt) / n_c``, so the sums ``X_c^T X_c`` and
    ``X_c^T y_c`` (float64) and the means ``A_bar[c]``, ``b_bar[c]`` (``dt``) are finite."""
    for c, (X, y) in enumerate(zip(Xs, ys)):
        limit = float(np.sqrt(np.finfo(dt).max / X.shape[0]))
        for name, arr in ((f"features[{c}]", X), (f"targets[{c}]", y)):
            biggest = float(np.max(np.abs(arr)))
            if biggest > limit:
                _validate.fail(
                    name,
                    arr,
                    f"its largest entry is {biggest:.3g} in magnitude; expected at "
                    f"most sqrt(max {dt} / n_{c}) = {limit:.3g}, so that X_{c}^T X_{c} / n_{c} "
                    f"and X_{c}^T y_{c} / n_{c} are finite in {dt} (rescale the data)",
                )
