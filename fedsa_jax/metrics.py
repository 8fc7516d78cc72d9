"""Quantities recorded next to the MSE: ``fj.simulate(..., metrics={"name": fn})``.

A metric is a function ``fn(state, problem) -> scalar`` of **one seed's** state
(the algorithm's state pytree, whose ``theta`` is the server iterate). At every
recorded round the driver evaluates it on every seed and records its mean,
standard error and (with quantiles on, for nonnegative metrics) quantiles over
the non-diverged seeds, exactly like the MSE: ``result.metrics["name"].mean``.

Built in, by name:

* ``"client_drift"``: ``mean_c |theta^c_{t,H} - theta_{t+1}|^2``, how far the
  agents' local iterates moved from the new server iterate in the last round
  (from :class:`~fedsa_jax.algorithms.RoundInfo`; 0 at round 0);
* ``"control_variate_error"``: ``mean_c |xi_c - xi_c*|^2`` with the ideal control
  variates ``xi_c* = A_bar[c] theta_star - b_bar[c]``, for algorithms whose state
  holds control variates ``xi (N, d)`` (SCAFFLSA, Scaffnew). With
  ``|theta_t - theta_star|^2`` it makes up the Lyapunov function of the SCAFFLSA
  analysis (Mangold et al., NeurIPS 2024, Sec. 5);
* ``"last_iterate_mse"``: ``|theta_t - theta_star|^2`` of the last iterate under
  :func:`fedsa_jax.averaged` (whose ``theta`` is the Polyak-Ruppert average) or
  :func:`fedsa_jax.richardson` (the run at ``eta``), reading through nested wrappers
  (``state.inner``); the MSE itself for other algorithms;
* ``"sup_error"``: ``max_i |theta_t - theta_star|_i``, the sup-norm error (accurate in float32: from the
  state's ``error``). The Q-learning papers plot ``(1 - gamma)`` times it for tabular Q-values
  (:func:`fedsa_jax.problems.q_learning`);
* ``"greedy_suboptimality"``: ``max_s (V*(s) - V^pi_t(s))``, the greedy policy of ``theta_t``
  evaluated exactly (one linear solve of its Bellman equation per seed and recorded round, S x S) on
  the MDP whose ``Q*`` is ``theta_star``, for a tabular control problem
  (:func:`fedsa_jax.problems.q_learning`); 0 once the greedy policy is optimal;
* ``"wall_clock"``: the simulated clock's tick at the round's server step, for algorithms on a
  clock (:func:`fedsa_jax.fedbuff`, whose state has ``clock``), through wrappers;
* ``"staleness"``: the mean staleness of the contributions of the round's server step (FedBuff);
* ``"clip_norm"``: the adaptive clipping norm ``C_t`` of the uplink's privacy mechanism
  (:func:`fedsa_jax.channel.privacy` with ``target_quantile``), carried in the channel's memory;
* ``"clipped_fraction"``: the fraction of the round's sent messages whose norm exceeds the privacy
  mechanism's clipping norm (``C``, or the round's ``C_t``), which the clipping shortens (at the
  agent in local mode; at the server, on arrival, in central mode); 0 without clipping. Near 1,
  every message is cut to norm C, whatever the step size: a bias, and a slow run (from
  :class:`~fedsa_jax.algorithms.RoundInfo`, counted by the channel; Scaffnew: over the round's
  communications; 0 at round 0).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fedsa_jax import _validate

__all__ = [
    "client_drift",
    "clip_norm",
    "clipped_fraction",
    "control_variate_error",
    "last_iterate_mse",
    "resolve",
    "staleness",
    "sup_error",
    "greedy_suboptimality",
    "wall_clock",
]


def client_drift(state, problem, info) -> jax.Array:
    del state, problem
    return info.client_drift


def control_variate_error(state, problem, info) -> jax.Array:
    del info
    xi_star = jnp.einsum("cij,j->ci", problem.A_bar, problem.theta_star) - problem.b_bar
    return jnp.mean(jnp.sum((state.xi - xi_star) ** 2, axis=-1))


def last_iterate_mse(state, problem, info) -> jax.Array:
    del info
    state = _innermost(state)
    error = getattr(state, "error", None)
    error = state.theta - problem.theta_star if error is None else error
    return jnp.sum(error**2)


def sup_error(state, problem, info) -> jax.Array:
    """``max_i |theta_t - theta_star|_i`` (from the state's ``error`` where it has one)."""
    del info
    error = getattr(state, "error", None)
    error = state.theta - problem.theta_star if error is None else error
    return jnp.max(jnp.abs(error))


def greedy_suboptimality(state, problem, info) -> jax.Array:
    """``max_s (V*(s) - V^pi(s))`` of the greedy policy of ``theta_t`` (a control problem's
    ``greedy_suboptimality``, e.g. :func:`fedsa_jax.problems.q_learning`'s)."""
    del info
    method = getattr(problem, "greedy_suboptimality", None)
    if method is None:
        raise ValueError(
            "the problem has no greedy policy to evaluate (a tabular control problem has: "
            "fj.problems.q_learning)"
        )
    return method(_innermost(state).theta)


def _innermost(state):
    while hasattr(state, "inner"):
        state = state.inner
    return state


def wall_clock(state, problem, info) -> jax.Array:
    """The simulated clock's tick at the round's server step (``state.clock``, through wrappers)."""
    del info
    return _innermost(state).clock.astype(problem.dtype)


def staleness(state, problem, info) -> jax.Array:
    """The mean staleness of the contributions of the round's server step (``state.staleness``)."""
    del problem, info
    return _innermost(state).staleness


def clip_norm(state, problem, info) -> jax.Array:
    """The adaptive clipping norm ``C_t`` (the second item of the channel's memory ``state.memory``)."""
    del problem, info
    return _innermost(state).memory[1]


def clipped_fraction(state, problem, info) -> jax.Array:
    """The fraction of the round's sent messages that the privacy clipping shortened
    (``info.clipped_fraction``, counted by :func:`fedsa_jax.channel.transmit`)."""
    del state, problem
    if info.clipped_fraction is None:
        raise ValueError(
            "this algorithm's rounds do not report it (RoundInfo.clipped_fraction: build the info with "
            "fj.algorithms.round_info)"
        )
    return info.clipped_fraction


_BUILTIN: dict[str, Callable] = {
    "client_drift": client_drift,
    "control_variate_error": control_variate_error,
    "last_iterate_mse": last_iterate_mse,
    "sup_error": sup_error,
    "greedy_suboptimality": greedy_suboptimality,
    "wall_clock": wall_clock,
    "staleness": staleness,
    "clip_norm": clip_norm,
    "clipped_fraction": clipped_fraction,
}
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}\Z")  # any of these round-trips through result files
_RESERVED = ("mse", "theta", "round", "rounds")


def _user(fn: Callable) -> Callable:
    """``fn(state, problem)`` as the driver's ``(state, problem, info)``; cached so that the same
    user function gives the same (hashable, equal) wrapper and the kernel is not recompiled."""
    wrapped = _wrappers.get(fn)  # pyright: ignore[reportAssignmentType]
    if wrapped is None:

        def wrapped(state, problem, info):
            del info
            return fn(state, problem)

        _wrappers[fn] = wrapped
    return wrapped


_wrappers: dict[Callable, Callable] = {}


def resolve(metrics: Mapping[str, Any] | Sequence[str] | None) -> tuple[tuple[str, Callable], ...]:
    """``{"name": fn or builtin name}`` (or a list of builtin names) -> ``((name, fn3), ...)``."""
    if metrics is None:
        return ()
    if isinstance(metrics, (list, tuple)):
        metrics = {m: m for m in metrics}
    if not isinstance(metrics, Mapping):
        _validate.fail(
            "metrics",
            metrics,
            "expected a dict {name: fn(state, problem) -> scalar} or a list of "
            f"built-in names ({', '.join(_BUILTIN)})",
        )
    out = []
    for name, fn in metrics.items():
        if not isinstance(name, str) or not NAME.match(name) or name in _RESERVED:
            _validate.fail(
                "metrics",
                name,
                "metric names are up to 100 letters, digits and '_' starting with "
                f"a letter (not {', '.join(_RESERVED)})",
            )
        if isinstance(fn, str):
            if fn not in _BUILTIN:
                _validate.fail(
                    f"metrics[{name!r}]",
                    fn,
                    f"expected a function or a built-in metric: {', '.join(_BUILTIN)}",
                )
            out.append((name, _BUILTIN[fn]))
        elif callable(fn):
            out.append((name, _user(fn)))
        else:
            _validate.fail(
                f"metrics[{name!r}]",
                fn,
                "expected a function fn(state, problem) -> scalar "
                f"or a built-in name ({', '.join(_BUILTIN)})",
            )
    return tuple(out)


def check_run(metrics, problem, num_rounds: int) -> None:
    """Before compiling: a metric object with a method ``check_run(problem, num_rounds)`` (the
    intervals of :mod:`fedsa_jax.inference`: a direction's length, a per-round table's rows) refuses a
    run it cannot describe, in one line."""
    fns = metrics.values() if isinstance(metrics, Mapping) else ()
    for fn in fns:
        check = getattr(fn, "check_run", None)
        if callable(check):
            check(problem, num_rounds)


class _NotAnArray(Exception):
    """A metric returned something that is not a number or an array (its type's name)."""


def _as_array(fn: Callable) -> Callable:
    def traced(state, problem, info):
        out = fn(state, problem, info)
        try:
            return jnp.asarray(out)
        except (TypeError, ValueError):
            raise _NotAnArray(type(out).__name__) from None

    return traced


def _first_line(err: BaseException, limit: int = 200) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check(metrics, state_like, problem, info_like, where: str) -> None:
    """Trace every metric on one seed's abstract state: it must give a real scalar. A metric that
    raises while traced, or returns anything else, is a one-line ``ValueError`` naming it."""
    for name, fn in metrics:
        what = f"metrics[{name!r}]"
        try:
            out = jax.eval_shape(_as_array(fn), state_like, problem, info_like)
        except _NotAnArray as e:
            _validate.fail(
                what, name, f"must return a real scalar for one seed; on {where} it returned a {e}"
            )
        except Exception as e:  # the user's function failed: say how, in one line
            _validate.fail(what, name, f"cannot be evaluated on {where}: it raised {_first_line(e)}")
        if (
            out.shape != ()
            or not jnp.issubdtype(out.dtype, jnp.number)
            or jnp.issubdtype(out.dtype, jnp.complexfloating)
        ):
            _validate.fail(
                what,
                name,
                f"must return a real scalar for one seed; on {where} it returned {out.shape} {out.dtype}",
            )
