"""Step-size schedules and server optimizers inside the kernel (:mod:`fedsa_jax.optim`): the
configured objects, their argument checks, the round's step sizes and the server's optimizer step,
and the run's check that a schedule stays finite and positive."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.optim.fingerprints import _MAX_COUNT, _Built, _split
from fedsa_jax.optim.rounds import LocalSteps, active_steps, check_horizon, max_local_steps, total_local_steps

__all__ = [
    "Schedule",
    "ServerOptimizer",
    "init_server",
    "inverse_power",
    "inverse_time",
    "optimizer",
    "schedule",
    "server_optimizer_arg",
    "server_step",
    "step_size_arg",
    "step_sizes",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Schedule(_Built):
    """A step-size schedule ``k -> scale * schedule(k)`` (see the module docstring); with
    ``per_round`` its count is the round t, not the local step k."""

    scale: float = 1.0  # a traced leaf
    per_round: bool = dataclasses.field(default=False, metadata=dict(static=True))

    def __call__(self, count):
        return self.scale * self.build()(count)

    def scaled(self, factor: float) -> Schedule:
        return dataclasses.replace(self, scale=self.scale * factor)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schedule": super().describe()}
        if self.scale != 1.0:
            out["scale"] = float(self.scale)
        if self.per_round:
            out["per_round"] = True
        return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ServerOptimizer(_Built):
    """A server optimizer (an ``optax.GradientTransformation``, see the module docstring)."""


def inverse_time(eta0: float, k0: float) -> Callable:
    """The ``1/k`` schedule ``k -> eta0 / (1 + k / k0)`` (Robbins-Monro with an offset ``k0``)."""
    return lambda k: eta0 / (1.0 + k / k0)


def inverse_power(eta0: float, t0: float, power: float) -> Callable:
    """The polynomially decreasing schedule ``t -> eta0 (t + t0)^-power`` (with ``per_round=True``,
    the step sizes ``eta_t = eta (t + t0)^-gamma`` of Levin, Shuklin, Moulines, Mangold, Samsonov,
    "Gaussian Approximation and Multiplier Bootstrap for Federated Linear Stochastic
    Approximation", arXiv:2605.19629, 2026, Sec. 3)."""
    return lambda t: eta0 * (t + t0) ** (-power)


def _check_step_fn(sched: Schedule, name: str) -> Schedule:
    try:
        out = jax.eval_shape(sched, jax.ShapeDtypeStruct((), jnp.int32))
    except Exception as e:  # noqa: BLE001 (any failure of user code is reported as a bad argument)
        _validate.fail(
            name, sched.describe(), f"calling the schedule on an int32 count failed: {type(e).__name__}: {e}"
        )
    if not hasattr(out, "shape") or out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        _validate.fail(
            name,
            sched.describe(),
            "a schedule must map an integer count to a real scalar step size; "
            f"it returned {getattr(out, 'shape', type(out).__name__)} {getattr(out, 'dtype', '')}",
        )
    return sched


def schedule(fn: Callable, /, *, scale: float = 1.0, per_round: bool = False, **hyperparams) -> Schedule:
    """A step-size schedule for ``step_size=``.

    ``schedule(optax_schedule)`` wraps a function of the count;
    ``schedule(factory, **hyperparams)`` calls ``factory(**hyperparams)`` inside the kernel,
    with the float hyperparameters traced (a sweep over them compiles once), e.g.
    ``fj.schedule(optax.polynomial_schedule, init_value=0.5, end_value=0.01, power=1.0,
    transition_steps=10_000)`` or ``fj.schedule(fj.optim.inverse_time, eta0=0.5, k0=100.0)``.
    ``scale`` (traced) multiplies the schedule. ``per_round=True``: the count is the round t
    (every local step of round t uses ``eta_t``), not the local step k.
    """
    if not callable(fn):
        _validate.fail(
            "step_size", fn, "expected a function of an integer count (an optax schedule) or a factory"
        )
    traced, static = _split(hyperparams)
    scale = _validate.real("scale", scale, 0.0, low_open=True)
    if not isinstance(per_round, (bool, np.bool_)):
        _validate.fail("per_round", per_round, "expected True (count rounds) or False (count local steps)")
    sched = Schedule(traced, fn, static, bool(hyperparams), scale, bool(per_round))
    return _check_step_fn(sched, "step_size")


def optimizer(fn: Any, /, **hyperparams) -> ServerOptimizer:
    """A server optimizer built from ``fn(**hyperparams)`` inside the kernel (float hyperparameters
    traced), e.g. ``fj.optimizer(optax.sgd, learning_rate=1.0, momentum=0.9)``; or
    ``fj.optimizer(optax_transformation)``."""
    import optax

    if isinstance(fn, optax.GradientTransformation):
        if hyperparams:
            _validate.fail(
                "server_optimizer",
                fn,
                "hyperparameters go with a factory such as optax.sgd, not with a built transformation",
            )
        return _check_server(ServerOptimizer({}, fn, (), False))
    if not callable(fn):
        _validate.fail("server_optimizer", fn, "expected an optax.GradientTransformation or a factory of one")
    traced, static = _split(hyperparams)
    opt = ServerOptimizer(traced, fn, static, True)
    try:
        built = opt.build()
    except Exception as e:  # noqa: BLE001
        _validate.fail("server_optimizer", opt.describe(), f"building it failed: {type(e).__name__}: {e}")
    if not isinstance(built, optax.GradientTransformation):
        _validate.fail(
            "server_optimizer",
            opt.describe(),
            f"the factory returned {type(built).__name__}, expected an optax.GradientTransformation",
        )
    return _check_server(opt)


def _check_server(opt: ServerOptimizer) -> ServerOptimizer:
    """Refuse a server optimizer the kernel would misuse, as it will be called (built inside the
    trace, float hyperparameters traced, ``update(g, state, params=theta)``):

    * abstractly, for iterates of two sizes (so that no fixed size passes by chance): updates of
      the iterate's shape and dtype (a ``(1,)`` update would silently broadcast), and a state that
      keeps its structure, shapes and dtypes (the kernel carries it from round to round);
    * concretely, its first update from ``theta = 0`` on the pseudo-gradient ``g = (1, 1)``: finite,
      and not along ``g`` (``<update, g> > 0``: a negative learning rate, or a transformation
      without its ``-lr`` scaling, moves the server away from the aggregate). A first update of 0
      (a warm-up from 0) passes."""
    what = opt.describe()

    def first(o, g, params):
        tx = o.build()
        s0 = tx.init(params)
        u, s1 = tx.update(g, s0, params)
        return u, s0, s1

    def sig(tree):
        return jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]

    def refuse(reason):
        _validate.fail("server_optimizer", what, reason)

    try:
        shapes = [jax.eval_shape(first, opt, *[jax.ShapeDtypeStruct((d,), jnp.float32)] * 2) for d in (2, 3)]
        u = np.asarray(first(opt, jnp.ones(2, jnp.float32), jnp.zeros(2, jnp.float32))[0])
    except Exception as e:  # noqa: BLE001 (any failure of user code is reported as a bad argument)
        refuse(f"calling its init and update on a vector failed: {type(e).__name__}: {e}")
    for d, (step, s0, s1) in zip((2, 3), shapes):
        if not hasattr(step, "shape") or (step.shape, step.dtype) != ((d,), jnp.float32):
            got = f"{step.shape} {step.dtype}" if hasattr(step, "shape") else type(step).__name__
            refuse(
                f"its update must have the iterate's shape and dtype: for an iterate ({d},) float32 it "
                f"returned {got}"
            )
        if sig(s0) != sig(s1):
            refuse(
                "its update must return a state with the structure, shapes and dtypes of the state it was "
                "given (the kernel carries it across rounds)"
            )
    if not np.all(np.isfinite(u)) or float(np.sum(u)) > 0:
        refuse(
            f"its first update on the pseudo-gradient g = theta - aggregate = (1, 1) is {u.tolist()}: "
            "expected a finite step against g (<update, g> <= 0), as with a learning rate >= 0; a "
            "negative one moves the server away from the aggregate"
        )
    return opt


def step_size_arg(step_size: Any) -> float | Schedule:
    """Validated ``step_size``: a float ``> 0`` or a schedule."""
    if isinstance(step_size, Schedule):
        return step_size
    if callable(step_size):
        return schedule(step_size)
    if isinstance(step_size, (str, bytes)) or step_size is None or np.ndim(step_size) != 0:
        _validate.fail(
            "step_size",
            step_size,
            "expected a real number > 0 or an optax schedule (a function of the local-step count)",
        )
    return _validate.real("step_size", step_size, 0.0, low_open=True)


def server_optimizer_arg(value: Any) -> ServerOptimizer | None:
    """Validated ``server_optimizer``: None, an optax transformation or :func:`optimizer`."""
    if value is None or isinstance(value, ServerOptimizer):
        return value
    import optax

    if isinstance(value, optax.GradientTransformation):
        return optimizer(value)
    _validate.fail(
        "server_optimizer",
        value,
        "expected None, an optax.GradientTransformation (e.g. "
        "optax.sgd(1.0, momentum=0.9), optax.adam(1e-2)) or fj.optimizer(factory, **hyperparameters)",
    )


def is_constant(step_size) -> bool:
    return not isinstance(step_size, Schedule)


def step_sizes(step_size, count, num_local_steps, dtype):
    """The round's step sizes: a scalar for a constant step with an integer H; else ``(H_max,)``
    values, ``eta_{K_t + h}`` (``eta_t`` for a schedule of the round), 0 past ``H_t``."""
    active = active_steps(num_local_steps, count)
    H = max_local_steps(num_local_steps)
    if is_constant(step_size):
        eta = jnp.asarray(step_size, dtype)
        return eta if active is None else jnp.where(active, eta, jnp.zeros((), dtype))
    if step_size.per_round:
        k = jnp.broadcast_to(count, (H,)).astype(jnp.int32)
    else:
        start = num_local_steps.before(count) if active is not None else count * H
        k = start + jnp.arange(H, dtype=jnp.int32)
    etas = jnp.asarray(jax.vmap(step_size)(k), dtype)
    return etas if active is None else jnp.where(active, etas, jnp.zeros((), dtype))


def round_step_sum(etas, num_local_steps):
    """``sum_h eta_{K_t+h}``: ``eta H`` for a constant step (SCAFFLSA's control-variate
    denominator; the steps past ``H_t`` are 0)."""
    return etas * num_local_steps if etas.ndim == 0 else jnp.sum(etas)


def init_server(config, error):
    """The state of ``config.server_optimizer`` (``()`` without one; a config may lack the field)."""
    server_optimizer = getattr(config, "server_optimizer", None)
    return () if server_optimizer is None else server_optimizer.build().init(error)


def server_step(config, opt_state, error, aggregate, theta_star) -> tuple[Any, Any]:
    """``(error_{t+1}, opt_state)``: the aggregate itself without ``config.server_optimizer``, else
    ``error_t + updates`` with ``updates`` from the pseudo-gradient ``error_t - aggregate``."""
    server_optimizer = getattr(config, "server_optimizer", None)
    if server_optimizer is None:
        return aggregate, opt_state
    import optax

    updates, opt_state = server_optimizer.build().update(error - aggregate, opt_state, theta_star + error)
    return optax.apply_updates(error, updates), opt_state


def _schedules_in(tree) -> list[tuple[str, Schedule]]:
    """Every :class:`Schedule` in a configuration pytree, with its path."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Schedule))[
        0
    ]:
        if isinstance(leaf, Schedule):
            found.append((jax.tree_util.keystr(path), leaf))
    return found


_MAX_CHECKED = 2**22


def schedule_values(sched: Schedule, num_steps: int, dtype=None) -> np.ndarray:
    """``sched(k)`` for ``k = 0..num_steps-1`` (float64 where enabled)."""
    k = jnp.arange(num_steps, dtype=jnp.int32)
    out = jax.jit(jax.vmap(sched))(k)
    return np.asarray(out if dtype is None else out.astype(dtype), np.float64)


def check_run(algorithm, num_rounds: int, dtype) -> None:
    """Check ``algorithm`` over a run of ``num_rounds`` rounds: its table of local steps covers
    them (:func:`check_horizon`), and every step size its schedules give is finite and ``> 0`` in
    ``dtype`` (all of them up to ``_MAX_CHECKED`` counts, else the first ``_MAX_CHECKED / 2`` and a
    log-spaced sample of the rest), with the local-step count within int32."""
    check_horizon(algorithm.config, num_rounds)
    scheds = _schedules_in(algorithm.config)
    if not scheds:
        return
    H = getattr(algorithm.config, "num_local_steps", 1)
    steps = total_local_steps(H, num_rounds) if isinstance(H, LocalSteps) else num_rounds * max_local_steps(H)
    if steps > _MAX_COUNT:
        _validate.fail(
            "num_rounds",
            num_rounds,
            f"num_rounds x num_local_steps = {steps} local steps is more than "
            f"a schedule's int32 count allows ({_MAX_COUNT}); split the run",
        )
    for path, sched in scheds:
        name = "step_size" if path.endswith(".step_size") or path == "" else path.lstrip(".")
        n, unit = (num_rounds, "round t") if sched.per_round else (steps, "local step k")
        k = _checked_counts(n)
        values = np.asarray(jax.jit(jax.vmap(sched))(jnp.asarray(k, jnp.int32)).astype(dtype))
        bad = ~(np.isfinite(values) & (values > 0))
        if np.any(bad):
            i = int(np.argmax(bad))
            _validate.fail(
                name,
                sched.describe(),
                f"the schedule gives {float(values[i])!r} at {unit}={int(k[i])} "
                f"(in {np.dtype(dtype)}); step sizes must be finite and > 0 at every {unit[-1]} < {n}",
            )


def _checked_counts(n: int) -> np.ndarray:
    """The counts :func:`check_run` evaluates among ``0..n-1``."""
    if n <= _MAX_CHECKED:
        return np.arange(n)
    head = np.arange(_MAX_CHECKED // 2)
    return np.unique(
        np.concatenate([head, np.geomspace(_MAX_CHECKED // 2, n - 1, _MAX_CHECKED // 2).astype(np.int64)])
    )
