"""optax inside the kernel: step-size schedules and server optimizers.

**Step-size schedules.** ``step_size`` of :func:`~fedsa_jax.fedlsa`,
:func:`~fedsa_jax.scafflsa`, :func:`~fedsa_jax.qfedtd` and :func:`~fedsa_jax.scaffnew`
is a float or a schedule: any optax schedule (a function of an integer count), or
``fj.schedule(factory, **hyperparameters)``. The count is the **global local-step
index** ``k = t H + h`` (0-based: round t, local step h < H), as optax counts
updates; a schedule per round is ``lambda k: f(k // H)``. Every local step of round t
uses its own ``eta_k``. SCAFFLSA's control-variate update divides by the sum of the
round's steps, ``sum_{h<H} eta_{tH+h}`` (``eta H`` for a constant step); Scaffnew's
by ``eta_k / p`` at the local step k that communicates. The exact theory
(:mod:`fedsa_jax.theory`) follows the same definitions.

A float keeps the constant-step kernel. A schedule given as a plain function is a
static part of the configuration (each new function object compiles once);
``fj.schedule(factory, **hyperparameters)`` builds it inside the kernel from its
**float hyperparameters, which are traced**: a sweep over ``eta0`` of
``fj.schedule(fj.optim.inverse_time, eta0=..., k0=100.0)`` compiles once.
Integer, boolean and string hyperparameters are static.

**Server optimizers.** ``server_optimizer=`` an ``optax.GradientTransformation``
(or ``fj.optimizer(factory, **hyperparameters)``, whose float hyperparameters are
traced) turns the server step into an optimizer step on the pseudo-gradient

    g_t = theta_t - aggregate_t,        (updates, s_{t+1}) = update(g_t, s_t, theta_t),
    theta_{t+1} = theta_t + updates     (optax.apply_updates),

where ``aggregate_t`` is the channel's aggregate of the agents' messages (the new
iterate without an optimizer). ``None`` is the plain update, bitwise;
``optax.sgd(1.0)`` equals it up to rounding; ``optax.sgd(lr, momentum=beta)`` is
FedAvgM (Hsu, Qi, Brown, 2019) and ``optax.adam(lr)`` FedAdam (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021). The optimizer state ``s_t`` lives in
the algorithm's state (``state.opt_state``, per seed). The optimizer runs in error
coordinates (``theta - theta_star``: the differences are the same) and gets
``params = theta_t``.

References: Polyak and Juditsky, "Acceleration of stochastic approximation by
averaging", SIAM J. Control Optim. 1992 (decreasing steps, averaging); Reddi et al.,
ICLR 2021, arXiv:2003.00295 (server optimizers).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax._digest import code_digest

MAX_COUNT = 2**31 - 1  # local-step indices are int32, as in optax


class _Static:
    """A hashable holder for a static hyperparameter (dicts and lists included), compared by value."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Static) and repr(self.value) == repr(other.value)

    def __hash__(self):
        return hash(repr(self.value))

    def __repr__(self):
        return repr(self.value)


def _split(hyperparams: dict) -> tuple[dict, tuple]:
    """Float hyperparameters (traced leaves) and the others (static)."""
    traced, static = {}, []
    for name, value in hyperparams.items():
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral, np.integer)):
            traced[name] = float(value)
        elif isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0 and \
                np.issubdtype(np.asarray(value).dtype, np.floating):
            traced[name] = float(value)
        else:
            static.append((name, _Static(value)))
    return traced, tuple(sorted(static, key=lambda kv: kv[0]))


def _owner(fn) -> str:
    """The name that says what ``fn`` is: the optax factory that made a closure
    (``polynomial_schedule.<locals>.schedule`` -> ``polynomial_schedule``), a lambda's full name."""
    q = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return q if q.endswith("<lambda>") else q.split(".<locals>")[0]


_GLUE = ("with_extra_args_support", "init_empty_state")


def describe_closure(fn, depth: int = 0) -> dict[str, Any]:
    """``{"name": ..., <hyperparameter>: value, "parts": [...]}`` read from the closure of an optax
    function (schedule or ``update``): what optax exposes of its hyperparameters."""
    out: dict[str, Any] = {"name": _owner(fn)}
    parts: list = []
    code = getattr(fn, "__code__", None)
    if code is None or depth > 8:
        return out
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if value is None or isinstance(value, (bool, str)):
            out[name] = value
        elif isinstance(value, numbers.Number) or (hasattr(value, "shape") and np.shape(value) == ()):
            try:
                out[name] = float(value)
            except (TypeError, ValueError):
                continue
        else:
            inner = value if isinstance(value, (tuple, list)) else (value,)
            for item in inner:
                f = getattr(item, "update", item)
                if callable(f) and hasattr(f, "__code__"):
                    sub = describe_closure(f, depth + 1)
                    # optax's wrappers add nothing: keep what they wrap
                    parts.extend(sub.get("parts", []) if sub["name"] in _GLUE or sub["name"] == out["name"]
                                 else [sub])
    merged: dict[str, dict] = {}
    for p in parts:  # a transformation's init and update appear both: keep the fuller one
        if p["name"] not in _GLUE and len(p) >= len(merged.get(p["name"], {})):
            merged[p["name"]] = p
    if merged:
        out["parts"] = list(merged.values())
    return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Built:
    """An optax object built inside the kernel: ``fn`` itself (``factory=False``) or
    ``fn(**hyperparams, **static)`` with the float hyperparameters traced leaves."""

    hyperparams: dict  # float hyperparameters: traced (sweeping them does not recompile)
    fn: Callable = dataclasses.field(metadata=dict(static=True))
    static: tuple = dataclasses.field(metadata=dict(static=True))  # ((name, _Static), ...)
    factory: bool = dataclasses.field(metadata=dict(static=True))

    def build(self):
        if not self.factory:
            return self.fn
        return self.fn(**self.hyperparams, **{k: v.value for k, v in self.static})

    def describe(self) -> dict[str, Any]:
        """Name and hyperparameters (what optax exposes of a built object), and ``code``, a digest of
        the function's code and captured values."""
        if not self.factory:
            return {**describe_closure(getattr(self.fn, "update", self.fn)), "code": code_digest(self.fn)}
        from fedsa_jax.algorithms._base import describe_value

        out = {"name": _owner(self.fn), "code": code_digest(self.fn)}
        for k, v in sorted([*self.hyperparams.items(), *((k, v.value) for k, v in self.static)]):
            out[k] = describe_value(v)
        return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Schedule(_Built):
    """A step-size schedule ``k -> scale * schedule(k)`` (see the module docstring)."""

    scale: float = 1.0  # a traced leaf

    def __call__(self, count):
        return self.scale * self.build()(count)

    def scaled(self, factor: float) -> "Schedule":
        return dataclasses.replace(self, scale=self.scale * factor)

    def describe(self) -> dict[str, Any]:
        out = {"schedule": super().describe()}
        if self.scale != 1.0:
            out["scale"] = float(self.scale)
        return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ServerOptimizer(_Built):
    """A server optimizer (an ``optax.GradientTransformation``, see the module docstring)."""


def inverse_time(eta0: float, k0: float) -> Callable:
    """The ``1/k`` schedule ``k -> eta0 / (1 + k / k0)`` (Robbins-Monro with an offset ``k0``)."""
    return lambda k: eta0 / (1.0 + k / k0)


def _check_step_fn(sched: Schedule, name: str) -> Schedule:
    try:
        out = jax.eval_shape(sched, jax.ShapeDtypeStruct((), jnp.int32))
    except Exception as e:  # noqa: BLE001 (any failure of user code is reported as a bad argument)
        _validate.fail(name, sched.describe(), f"calling the schedule on an int32 count failed: "
                       f"{type(e).__name__}: {e}")
    if not hasattr(out, "shape") or out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        _validate.fail(name, sched.describe(), "a schedule must map an integer count to a real scalar step size; "
                       f"it returned {getattr(out, 'shape', type(out).__name__)} {getattr(out, 'dtype', '')}")
    return sched


def schedule(fn: Callable, /, *, scale: float = 1.0, **hyperparams) -> Schedule:
    """A step-size schedule for ``step_size=``.

    ``schedule(optax_schedule)`` wraps a function of the count;
    ``schedule(factory, **hyperparams)`` calls ``factory(**hyperparams)`` inside the kernel,
    with the float hyperparameters traced (a sweep over them compiles once), e.g.
    ``fj.schedule(optax.polynomial_schedule, init_value=0.5, end_value=0.01, power=1.0,
    transition_steps=10_000)`` or ``fj.schedule(fj.optim.inverse_time, eta0=0.5, k0=100.0)``.
    ``scale`` (traced) multiplies the schedule.
    """
    if not callable(fn):
        _validate.fail("step_size", fn, "expected a function of an integer count (an optax schedule) or a factory")
    traced, static = _split(hyperparams)
    scale = _validate.real("scale", scale, 0.0, low_open=True)
    return _check_step_fn(Schedule(traced, fn, static, bool(hyperparams), scale), "step_size")


def optimizer(fn: Callable, /, **hyperparams) -> ServerOptimizer:
    """A server optimizer built from ``fn(**hyperparams)`` inside the kernel (float hyperparameters
    traced), e.g. ``fj.optimizer(optax.sgd, learning_rate=1.0, momentum=0.9)``; or
    ``fj.optimizer(optax_transformation)``."""
    import optax

    if isinstance(fn, optax.GradientTransformation):
        if hyperparams:
            _validate.fail("server_optimizer", fn, "hyperparameters go with a factory such as optax.sgd, not with "
                           "a built transformation")
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
        _validate.fail("server_optimizer", opt.describe(), f"the factory returned {type(built).__name__}, expected "
                       "an optax.GradientTransformation")
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
            refuse(f"its update must have the iterate's shape and dtype: for an iterate ({d},) float32 it "
                   f"returned {got}")
        if sig(s0) != sig(s1):
            refuse("its update must return a state with the structure, shapes and dtypes of the state it was "
                   "given (the kernel carries it across rounds)")
    if not np.all(np.isfinite(u)) or float(np.sum(u)) > 0:
        refuse(f"its first update on the pseudo-gradient g = theta - aggregate = (1, 1) is {u.tolist()}: "
               "expected a finite step against g (<update, g> <= 0), as with a learning rate >= 0; a "
               "negative one moves the server away from the aggregate")
    return opt


def step_size_arg(step_size: Any) -> float | Schedule:
    """Validated ``step_size``: a float ``> 0`` or a schedule."""
    if isinstance(step_size, Schedule):
        return step_size
    if callable(step_size):
        return schedule(step_size)
    if isinstance(step_size, (str, bytes)) or step_size is None or np.ndim(step_size) != 0:
        _validate.fail("step_size", step_size, "expected a real number > 0 or an optax schedule "
                       "(a function of the local-step count)")
    return _validate.real("step_size", step_size, 0.0, low_open=True)


def server_optimizer_arg(value: Any) -> ServerOptimizer | None:
    """Validated ``server_optimizer``: None, an optax transformation or :func:`optimizer`."""
    if value is None or isinstance(value, ServerOptimizer):
        return value
    import optax

    if isinstance(value, optax.GradientTransformation):
        return optimizer(value)
    _validate.fail("server_optimizer", value, "expected None, an optax.GradientTransformation (e.g. "
                   "optax.sgd(1.0, momentum=0.9), optax.adam(1e-2)) or fj.optimizer(factory, **hyperparameters)")


def is_constant(step_size) -> bool:
    return not isinstance(step_size, Schedule)


def step_sizes(step_size, count, num_local_steps: int, dtype):
    """The round's step sizes: a scalar for a constant step; ``(H,)`` values
    ``eta_{count H + h}`` for a schedule."""
    if is_constant(step_size):
        return jnp.asarray(step_size, dtype)
    k = count * num_local_steps + jnp.arange(num_local_steps, dtype=jnp.int32)
    return jnp.asarray(jax.vmap(step_size)(k), dtype)


def round_step_sum(etas, num_local_steps: int):
    """``sum_h eta_{tH+h}``: ``eta H`` for a constant step (SCAFFLSA's control-variate denominator)."""
    return etas * num_local_steps if etas.ndim == 0 else jnp.sum(etas)


def init_server(config, error):
    """The state of ``config.server_optimizer`` (``()`` without one; a config may lack the field)."""
    server_optimizer = getattr(config, "server_optimizer", None)
    return () if server_optimizer is None else server_optimizer.build().init(error)


def server_step(config, opt_state, error, aggregate, theta_star):
    """``(error_{t+1}, opt_state)``: the aggregate itself without ``config.server_optimizer``, else
    ``error_t + updates`` with ``updates`` from the pseudo-gradient ``error_t - aggregate``."""
    server_optimizer = getattr(config, "server_optimizer", None)
    if server_optimizer is None:
        return aggregate, opt_state
    import optax

    updates, opt_state = server_optimizer.build().update(error - aggregate, opt_state, theta_star + error)
    return optax.apply_updates(error, updates), opt_state


def schedules_in(tree) -> list[tuple[str, Schedule]]:
    """Every :class:`Schedule` in a configuration pytree, with its path."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Schedule))[0]:
        if isinstance(leaf, Schedule):
            found.append((jax.tree_util.keystr(path), leaf))
    return found


MAX_CHECKED = 2**22


def schedule_values(sched: Schedule, num_steps: int, dtype=None) -> np.ndarray:
    """``sched(k)`` for ``k = 0..num_steps-1`` (float64 where enabled)."""
    k = jnp.arange(num_steps, dtype=jnp.int32)
    out = jax.jit(jax.vmap(sched))(k)
    return np.asarray(out if dtype is None else out.astype(dtype), np.float64)


def check_run(algorithm, num_rounds: int, dtype) -> None:
    """Check the schedules of ``algorithm`` over a run of ``num_rounds`` rounds: every step size used is
    finite and ``> 0`` in ``dtype`` (all of them up to ``MAX_CHECKED`` local steps, else the first
    ``MAX_CHECKED / 2`` and a log-spaced sample of the rest), and the step count fits int32."""
    scheds = schedules_in(algorithm.config)
    if not scheds:
        return
    steps = num_rounds * algorithm.num_local_steps
    if steps > MAX_COUNT:
        _validate.fail("num_rounds", num_rounds, f"num_rounds x num_local_steps = {steps} local steps is more than "
                       f"a schedule's int32 count allows ({MAX_COUNT}); split the run")
    if steps <= MAX_CHECKED:
        k = np.arange(steps)
    else:
        k = np.unique(np.concatenate([np.arange(MAX_CHECKED // 2),
                                      np.geomspace(MAX_CHECKED // 2, steps - 1, MAX_CHECKED // 2).astype(np.int64)]))
    for path, sched in scheds:
        name = "step_size" if path.endswith(".step_size") or path == "" else path.lstrip(".")
        values = np.asarray(jax.jit(jax.vmap(sched))(jnp.asarray(k, jnp.int32)).astype(dtype))
        bad = ~(np.isfinite(values) & (values > 0))
        if np.any(bad):
            i = int(np.argmax(bad))
            _validate.fail(name, sched.describe(), f"the schedule gives {float(values[i])!r} at local step k={int(k[i])} "
                           f"(in {np.dtype(dtype)}); step sizes must be finite and > 0 at every k < {steps}")
