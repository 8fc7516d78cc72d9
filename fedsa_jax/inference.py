"""Confidence sets for ``theta*`` from one run: the multiplier bootstrap, the plug-in, the exact one.

A run of ``fj.bootstrap(algorithm, B)`` carries, for every seed, the main iterate ``theta_t`` and B
replicates ``theta^b_t`` (:mod:`fedsa_jax.algorithms.bootstrap`). Given the data, the spread of
``u^T (theta^b_t - theta_t)`` over the replicates approximates the law of ``u^T (theta_t -
theta*)`` (Levin, Shuklin, Moulines, Mangold, Samsonov, arXiv:2605.19629, 2026). The metrics here
are functions of one seed's state (``fj.simulate(..., metrics={...})``): recorded at every recorded
round, their mean and standard error over seeds, and per seed with ``keep_seeds``.

**Confidence intervals for** ``u^T theta*`` at level ``1 - alpha``, for every seed and recorded
round t, with ``v = u^T theta_t`` and ``v_b = u^T theta^b_t`` (``u`` normalised to ``|u| = 1``: the
coverage does not depend on the scale of the direction given, in float32 as in float64):

* ``"quantile"``: the bootstrap's quantiles ``[q_{alpha/2}(v_b), q_{1-alpha/2}(v_b)]`` (the paper's
  percentile interval; ``jnp.quantile``'s linear interpolation);
* ``"normal"``: ``v -+ z_{1-alpha/2} sd_b(v_b)`` with the bootstrap's standard deviation;
* ``"plug_in"``: ``v -+ z_{1-alpha/2} sqrt(eta_t u^T Sigma_hat u)``, ``Sigma_hat`` solving the
  Lyapunov equation ``A_hat Sigma + Sigma A_hat^T = Sigma_eps_hat`` from the run's running estimates
  of ``A_bar`` and of the noise covariance (the paper's baseline; :func:`fedsa_jax.plug_in`);
* ``"exact"``: ``v -+ z_{1-alpha/2} sqrt(u^T Cov(theta_t) u)`` with the exact covariance of
  ``theta_t`` (:func:`fedsa_jax.theory.exact_covariance`): the interval a user who knew the true
  variance would build, the reference for the bootstrap's. It covers ``u^T theta*`` with
  probability ``1 - alpha`` exactly when ``u^T theta_t`` is Gaussian and unbiased: an algorithm with
  a bias (FedLSA under heterogeneity, :func:`fedsa_jax.theory.fedlsa_bias`) makes every interval
  centred at ``theta_t`` miss more often.

:func:`intervals` returns the metrics of one or more methods and levels: ``covers_<method>_<level>``
(1 when the interval covers ``u^T theta*``, 0 when not: its mean over seeds is the coverage, its
standard error the binomial one), and ``lower_...``, ``upper_...``, the interval itself (per seed
with ``keep_seeds``, in result files and tables like any metric). :func:`joint` returns the same for
joint sets of every coordinate at once: ellipsoids around ``theta_t`` with the bootstrap's, the
plug-in's or the exact covariance.
"""

from __future__ import annotations

import dataclasses
import reprlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import chi2  # a dependency of JAX itself

from fedsa_jax import _validate, theory
from fedsa_jax.algorithms.plug_in import gauss_jordan, plug_in_covariance

__all__ = [
    "METHODS",
    "BootstrapVariance",
    "Interval",
    "bootstrap_variance",
    "exact_sd",
    "intervals",
    "joint",
    "JointSet",
    "level_name",
]

METHODS = ("quantile", "normal", "plug_in", "exact")


def _find(state, field: str, how: str):
    """``state.<field>``, looked up through wrappers' ``inner`` states."""
    while getattr(state, field, None) is None:
        if not hasattr(state, "inner"):
            raise ValueError(f"the state has no {field}: run {how}")
        state = state.inner
    return getattr(state, field)


def _replicates(state):
    return _find(state, "replicates", "fj.bootstrap(algorithm, B)")


@dataclasses.dataclass(frozen=True)
class BootstrapVariance:
    """The metric ``(1/B) sum_b (u^T (theta^b_t - theta_t))^2``: the bootstrap's variance of
    ``u^T theta_t`` around the main iterate (compared by value: equal directions share a kernel)."""

    direction: tuple[float, ...]

    def check_run(self, problem, num_rounds: int) -> None:
        _check_dim(self.direction, problem.dim)

    def __call__(self, state, problem) -> jax.Array:
        del problem
        _check_dim(self.direction, state.theta.shape[-1])
        u = jnp.asarray(self.direction, state.theta.dtype)
        spread = (_replicates(state).theta - state.theta) @ u
        return jnp.mean(spread**2)


def _direction(direction, name: str = "direction") -> tuple[float, ...]:
    """``direction / |direction|``, normalised in float64 (scaled by its largest entry first, so that
    neither 1e200 nor 1e-300 overflows or underflows): the intervals and their coverage do not depend
    on u's scale, in any dtype."""
    try:
        u = np.asarray(direction, np.float64)
    except (TypeError, ValueError):
        _validate.fail(name, direction, "expected a nonzero finite vector u of the iterate's dimension")
    if u.ndim != 1 or u.size == 0 or not np.all(np.isfinite(u)) or not np.any(u != 0):
        _validate.fail(name, direction, "expected a nonzero finite vector u of the iterate's dimension")
    u = u / np.max(np.abs(u))
    return tuple(float(x) for x in u / np.linalg.norm(u))


def _check_dim(direction: tuple[float, ...], dim: int) -> None:
    """Refuse, before compiling, a direction of another length than the iterate's ``dim``."""
    if len(direction) != dim:
        _validate.fail(
            "direction",
            list(direction),
            f"expected {dim} entries (the iterate's dimension d = {dim}), got {len(direction)}",
        )


def _check_table(name: str, table, num_rounds: int, what: str) -> None:
    """Refuse, before compiling, a per-round table with fewer than ``num_rounds + 1`` rows."""
    if len(table) < num_rounds + 1:
        _validate.fail(
            name,
            f"{len(table)} rows",
            f"it has {len(table)} rows (rounds t = 0..{len(table) - 1}), fewer than the run's "
            f"{num_rounds + 1} (num_rounds = {num_rounds}: t = 0..{num_rounds}); compute it for the "
            f"run's rounds, {what}",
        )


def bootstrap_variance(direction) -> BootstrapVariance:
    """The bootstrap's variance of ``u^T theta_t`` (``direction`` u, normalised to ``|u| = 1``), as a metric:
    ``fj.simulate(..., metrics={"boot_var": fj.inference.bootstrap_variance(u)})``."""
    return BootstrapVariance(_direction(direction))


def exact_sd(problem, algorithm, num_rounds: int, direction, theta0=None) -> np.ndarray:
    """``sqrt(u^T Cov(theta_t) u)`` for ``t = 0..num_rounds`` (:func:`fedsa_jax.theory.exact_covariance`
    of ``algorithm``, the main trajectory of a bootstrap), ``u`` normalised to ``|u| = 1`` as
    :func:`intervals` normalises it: what the ``"exact"`` interval uses."""
    u = np.asarray(_direction(direction))
    _check_dim(tuple(u), problem.dim)
    cov = theory.exact_covariance(problem, algorithm, num_rounds, theta0)
    return np.sqrt(np.maximum(np.einsum("i,tij,j->t", u, cov, u), 0.0))


@dataclasses.dataclass(frozen=True, eq=False)
class Interval:
    """One interval's metric (:func:`intervals`): ``part`` is ``"covers"``, ``"lower"`` or
    ``"upper"``."""

    direction: tuple[float, ...]
    method: str
    level: float
    part: str
    sd: Any = None  # (T+1,) exact standard deviations of u^T theta_t ("exact")

    def check_run(self, problem, num_rounds: int) -> None:
        """Before compiling (:func:`fedsa_jax.simulate`): the direction's length, the table's rounds."""
        _check_dim(self.direction, problem.dim)
        if self.sd is not None:
            _check_table("exact_sd", self.sd, num_rounds, "fj.inference.exact_sd(problem, algorithm, T, u)")

    def bounds(self, state, problem):
        _check_dim(self.direction, state.theta.shape[-1])
        u = jnp.asarray(self.direction, state.theta.dtype)
        v = state.theta @ u
        alpha = 1.0 - self.level
        z = jax.scipy.special.ndtri(jnp.asarray(1.0 - alpha / 2, state.theta.dtype))
        if self.method == "exact":
            sd = jnp.asarray(self.sd, state.theta.dtype)[jnp.minimum(state.count, len(self.sd) - 1)]
            return v - z * sd, v + z * sd
        if self.method == "plug_in":
            cov = plug_in_covariance(_find(state, "plug_in", "fj.plug_in(algorithm)"))
            sd = jnp.sqrt(jnp.maximum(u @ cov @ u, 0.0))
            return v - z * sd, v + z * sd
        vb = _replicates(state).theta @ u
        if self.method == "normal":
            sd = jnp.std(vb)
            return v - z * sd, v + z * sd
        return jnp.quantile(vb, alpha / 2), jnp.quantile(vb, 1 - alpha / 2)

    def __call__(self, state, problem) -> jax.Array:
        lo, hi = self.bounds(state, problem)
        if self.part == "lower":
            return lo
        if self.part == "upper":
            return hi
        target = jnp.asarray(problem.theta_star, state.theta.dtype) @ jnp.asarray(
            self.direction, state.theta.dtype
        )
        return ((lo <= target) & (target <= hi)).astype(state.theta.dtype)


def _levels_methods(levels, methods, allowed: tuple[str, ...]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """Validated ``levels`` (one or a sequence, each in ``(0, 1)``, of distinct metric names) and
    ``methods`` (from ``allowed``)."""
    levels = tuple(levels) if isinstance(levels, (list, tuple)) else (levels,)
    methods = (methods,) if isinstance(methods, str) else tuple(methods)
    if not methods:
        _validate.fail("methods", methods, f"expected one or more of {', '.join(allowed)}")
    for m in methods:
        _validate.choice("methods", m, allowed)
    if not levels:
        _validate.fail("levels", levels, "expected one or more levels in (0, 1)")
    levels = tuple(
        _validate.real("level", level, 0.0, 1.0, low_open=True, high_open=True) for level in levels
    )
    named: dict[str, float] = {}
    for level in levels:
        other = named.get(level_name(level))
        named[level_name(level)] = level
        if other is not None:
            _validate.fail(
                "levels",
                levels,
                f"levels {other!r} and {level!r} share the metric name {level_name(level)!r} (a level is "
                "named by its 6 significant digits): give each level once, distinct to 6 digits",
            )
    return levels, methods


def level_name(level: float) -> str:
    """A level's tag in metric names: ``0.9`` is ``9``, ``0.95`` is ``95``."""
    return f"{level:.6g}".replace("0.", "", 1).replace(".", "_")


def intervals(
    direction, levels=(0.8, 0.9, 0.95), methods=("quantile", "normal"), exact_sd=None, bounds: bool = True
) -> dict[str, Interval]:
    """The metrics of confidence intervals for ``u^T theta*`` (module docstring), for
    ``fj.simulate(..., metrics=...)`` with a :func:`fedsa_jax.bootstrap` algorithm (the
    ``"exact"`` method alone needs no replicates).

    Args:
      direction: u, a nonzero finite vector of the iterate's dimension (``e_i`` for coordinate i),
        normalised to ``|u| = 1`` (the intervals are for ``(u / |u|)^T theta*``: their coverage does
        not depend on u's scale, in float32 too).
      levels: confidence levels in ``(0, 1)``, distinct to 6 significant digits (their names).
      methods: from :data:`METHODS`.
      exact_sd: ``(T+1,)`` the exact ``sqrt(u^T Cov(theta_t) u)`` of every round
        (:func:`exact_sd`), needed by ``"exact"``; a run of more than T rounds is refused before
        compiling.
      bounds: also record each interval's ``lower_`` and ``upper_`` bound (else only ``covers_``).

    Returns ``{"covers_<method>_<level>": metric, ...}`` (level 0.9 is named ``9``, 0.95 ``95``).
    """
    u = _direction(direction)
    levels, methods = _levels_methods(levels, methods, METHODS)
    sd = None
    if "exact" in methods:
        if exact_sd is None:
            _validate.fail(
                "exact_sd", None, "the exact interval needs fj.inference.exact_sd(problem, algorithm, T, u)"
            )
        sd = np.asarray(exact_sd, np.float64)
        if sd.ndim != 1 or not np.all(np.isfinite(sd) & (sd >= 0)):
            _validate.fail("exact_sd", reprlib.repr(sd), "expected (T+1,) finite standard deviations >= 0")
    out = {}
    for m in methods:
        for level in levels:
            tag = f"{m}_{level_name(level)}"
            parts = ("covers", "lower", "upper") if bounds else ("covers",)
            for part in parts:
                out[f"{part}_{tag}"] = Interval(u, m, level, part, sd if m == "exact" else None)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class JointSet:
    """One joint confidence set's metric (:func:`joint`): ``part`` is ``"covers"`` or ``"distance"``
    (the statistic ``D(theta*)``, to compare with ``threshold`` or the bootstrap's quantile)."""

    method: str
    level: float
    part: str
    chi2: float  # the chi-square quantile with d degrees of freedom at the level
    dim: int  # d
    cov: Any = None  # (T+1, d, d) the exact covariances ("exact")

    def check_run(self, problem, num_rounds: int) -> None:
        """Before compiling (:func:`fedsa_jax.simulate`): the exact table's rounds."""
        del problem
        if self.cov is not None:
            _check_table(
                "exact_cov", self.cov, num_rounds, "fj.theory.exact_covariance(problem, algorithm, T)"
            )

    def _covariance(self, state, problem):
        dtype = state.theta.dtype
        if self.method == "exact":
            return jnp.asarray(self.cov, dtype)[jnp.minimum(state.count, len(self.cov) - 1)]
        if self.method == "plug_in":
            return plug_in_covariance(_find(state, "plug_in", "fj.plug_in(algorithm)"))
        spread = _replicates(state).theta - state.theta  # (B, d)
        B, d = spread.shape
        if B <= d:  # shapes are static: refused when the metric is checked, before compiling
            raise ValueError(
                f"the joint {self.method!r} set needs more replicates than coordinates (B > d): "
                f"B = {B}, d = {d}"
            )
        return spread.T @ spread / B

    def __call__(self, state, problem) -> jax.Array:
        if state.theta.shape[-1] != self.dim:  # static: refused when the metric is checked
            raise ValueError(
                f"the joint set was built for dim = {self.dim}; the iterate has {state.theta.shape[-1]}"
            )
        cov = self._covariance(state, problem)

        def mahalanobis(e):  # a singular covariance (round 0: nothing observed) puts theta* at infinity
            distance = e @ gauss_jordan(cov, e)
            return jnp.where(jnp.isfinite(distance), distance, jnp.inf)

        distance = mahalanobis(state.theta - jnp.asarray(problem.theta_star, state.theta.dtype))
        if self.part == "distance":
            return distance
        threshold = jnp.asarray(self.chi2, state.theta.dtype)
        if self.method == "quantile":
            spread = _replicates(state).theta - state.theta
            threshold = jnp.quantile(jax.vmap(mahalanobis)(spread), self.level)
        return (distance <= threshold).astype(state.theta.dtype)


def joint(
    dim: int, levels=(0.8, 0.9, 0.95), methods=("quantile", "normal"), exact_cov=None
) -> dict[str, JointSet]:
    """The metrics of joint confidence sets for ``theta*`` (every coordinate at once), ellipsoids
    around the seed's ``theta_t``: ``{theta : D(theta) <= threshold}`` with
    ``D(theta) = (theta_t - theta)^T S^{-1} (theta_t - theta)``,

    * ``"quantile"``: ``S`` the bootstrap's covariance ``(1/B) sum_b (theta^b_t - theta_t)(...)^T``
      and the threshold the level's quantile of ``D`` over the replicates ``theta^b_t`` (needs
      ``B > d``);
    * ``"normal"``: the same ``S`` and the chi-square quantile ``chi2_d(level)``;
    * ``"plug_in"``: ``S = eta_t Sigma`` of the plug-in (:func:`fedsa_jax.plug_in`), ``chi2_d(level)``;
    * ``"exact"``: ``S = Cov(theta_t)`` exactly (``exact_cov``, :func:`fedsa_jax.theory.exact_covariance`),
      ``chi2_d(level)``: it covers at its level exactly when ``theta_t`` is Gaussian and unbiased.

    Args:
      dim: d, the iterate's dimension.
      levels: confidence levels in ``(0, 1)``.
      methods: from :data:`METHODS`.
      exact_cov: ``(T+1, d, d)`` covariances, needed by ``"exact"``; a run of more than T rounds is
        refused before compiling.

    Returns ``{"covers_joint_<method>_<level>": metric, "distance_joint_<method>": metric, ...}``:
    the mean over seeds of ``covers_`` is the coverage of ``theta*``. Where the covariance is
    singular (round 0, nothing observed yet) the distance is infinite (the set is the point
    ``theta_t``; the distance's mean over seeds is then undefined, NaN). A ``dim`` other than the
    iterate's, and a bootstrap set with ``B <= d`` replicates, are refused before compiling.
    """
    d = _validate.integer("dim", dim)
    levels, methods = _levels_methods(levels, methods, METHODS)
    cov = None
    if "exact" in methods:
        if exact_cov is None:
            _validate.fail(
                "exact_cov", None, "the exact set needs fj.theory.exact_covariance(problem, algorithm, T)"
            )
        cov = np.asarray(exact_cov, np.float64)
        if cov.ndim != 3 or cov.shape[1:] != (d, d) or not np.all(np.isfinite(cov)):
            _validate.fail("exact_cov", reprlib.repr(cov), f"expected (T+1, {d}, {d}) finite covariances")
    out: dict[str, JointSet] = {}
    for m in methods:
        for level in levels:
            q = float(chi2.ppf(level, d))
            out[f"covers_joint_{m}_{level_name(level)}"] = JointSet(m, level, "covers", q, d, cov)
        out[f"distance_joint_{m}"] = JointSet(m, levels[0], "distance", 0.0, d, cov)
    return out
