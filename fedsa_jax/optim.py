"""optax inside the kernel: step-size schedules and server optimizers.

**Step-size schedules.** ``step_size`` of :func:`~fedsa_jax.fedlsa`,
:func:`~fedsa_jax.scafflsa`, :func:`~fedsa_jax.qfedtd` and :func:`~fedsa_jax.scaffnew`
is a float or a schedule: any optax schedule (a function of an integer count), or
``fj.schedule(factory, **hyperparameters)``. The count is the **global local-step
index** ``k = t H + h`` (0-based: round t, local step h < H), as optax counts
updates; ``fj.schedule(fn, per_round=True)`` counts rounds instead (every local step of
round t uses ``eta_t``, e.g. ``fj.schedule(fj.optim.inverse_power, eta0=1.0, t0=100.0,
power=0.6, per_round=True)``, ``eta_t = eta0 (t + t0)^-power``). Otherwise every local step of
round t uses its own ``eta_k``.

**Local steps that change with the round.** ``num_local_steps`` is an integer H or a
table ``H_t`` over the run's rounds (:func:`local_steps`, :func:`growing_local_steps`;
a list of integers is taken as one): round t runs ``H_t`` local steps, the local-step index
of its step h is ``k = K_t + h`` with ``K_t = sum_{s<t} H_s``. In the kernel every round has
``H_max = max_t H_t`` steps, those past ``H_t`` with step size 0 and no observation drawn from
a Markov chain (their random numbers are drawn and left unused): one compiled program for
the whole run, whose useful fraction is ``mean_t H_t / H_max``. A table is static: another
table compiles again. SCAFFLSA's control-variate update divides by the sum of the
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

**Descriptions.** ``describe()`` (``result.config``, checkpoint fingerprints, the code
digest) reads public things only: the factory's public name and hyperparameters
(``{"name": "optax.sgd", "learning_rate": 0.5}``), or for an object passed built, a
name and its behavioural :func:`fingerprint`; never optax's private closures, so a
release of optax that computes the same describes the same.

References: Polyak and Juditsky, "Acceleration of stochastic approximation by
averaging", SIAM J. Control Optim. 1992 (decreasing steps, averaging); Reddi et al.,
ICLR 2021, arXiv:2003.00295 (server optimizers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import numbers
import reprlib
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax._describe import describe_value
from fedsa_jax._digest import _library, code_digest

__all__ = [
    "LocalSteps",
    "Schedule",
    "ServerOptimizer",
    "fingerprint",
    "growing_local_steps",
    "init_server",
    "inverse_power",
    "inverse_time",
    "local_steps",
    "optimizer",
    "schedule",
    "server_optimizer_arg",
    "server_step",
    "step_size_arg",
    "step_sizes",
]

_MAX_COUNT = 2**31 - 1  # local-step indices are int32, as in optax


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
        elif (
            isinstance(value, (np.ndarray, jax.Array))
            and np.ndim(value) == 0
            and np.issubdtype(np.asarray(value).dtype, np.floating)
        ):
            traced[name] = float(value)
        else:
            static.append((name, _Static(value)))
    return traced, tuple(sorted(static, key=lambda kv: kv[0]))


# --- descriptions ---------------------------------------------------------------------------------
# A description enters result configs, the checkpoint fingerprint and the code digest (through
# _Built._digest_parts), so it is read from public things only: a factory's public name and the
# hyperparameters it was given, or, for an object passed built, what it computes on fixed probes.

_PROBE_COUNTS = np.unique(np.concatenate([np.arange(17), np.geomspace(17, _MAX_COUNT, 48).astype(np.int64)]))
_PROBE_STEPS = 8  # updates of a transformation from its initial state
_PROBE_SIZES = (3, *range(1, 3), *range(4, 17))  # the first length a transformation runs on is probed
_PROBE_DIGITS = 10  # significant digits hashed: below the differences of a library's rounding


def _probe_vector(i: int, d: int) -> np.ndarray:
    """Fixed probe values (exact binary fractions, none 0): ``i = -1`` the initial parameters, else
    the i-th pseudo-gradient."""
    j = np.arange(d)
    return ((5 * j) % 7 - 3.5) / 2 if i < 0 else ((7 * i + 3 * j) % 11 - 5.5) / 4


def _digits(values) -> str:
    """``values`` to ``_PROBE_DIGITS`` significant digits; entries below ``1e-12`` of the largest
    (a residue of rounding, ``-0.0``) as 0."""
    v = np.asarray(values, np.float64).ravel()
    big = np.max(np.abs(v[np.isfinite(v)]), initial=0.0)
    v = np.where(np.abs(v) <= 1e-12 * big, 0.0, v)
    return ",".join(f"{x:.{_PROBE_DIGITS - 1}e}" for x in v)


@contextlib.contextmanager
def _host_float64():
    """JAX in float64 on the host CPU (the default device where a process has no CPU backend)."""
    try:
        cpu = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        cpu = None
    with jax.enable_x64(True), jax.default_device(cpu):
        yield


def _transformation_probe(tx, d: int) -> str:
    """The updates of ``_PROBE_STEPS`` steps from ``tx.init(params)``, each on a probe gradient with
    the parameters moved by the previous updates."""
    params = jnp.asarray(_probe_vector(-1, d))
    state, updates = tx.init(params), []
    for i in range(_PROBE_STEPS):
        u, state = tx.update(jnp.asarray(_probe_vector(i, d)), state, params)
        if jnp.shape(u) != (d,):
            raise ValueError(f"updates of shape {jnp.shape(u)} for parameters of shape {(d,)}")
        updates.append(np.asarray(u, np.float64))
        params = params + u
    return f"transformation{d}:{_digits(updates)}"


def _probe(obj) -> str:
    """:func:`fingerprint` of ``obj`` (uncached)."""
    with _host_float64():
        if _is_transformation(obj):
            for d in _PROBE_SIZES:
                try:
                    text = _transformation_probe(obj, d)
                    break
                except Exception:  # noqa: BLE001 (a transformation made for other shapes: try the next)
                    continue
            else:
                return f"unprobed:{code_digest(obj)}"
        else:
            try:
                text = "schedule:" + _digits(jax.vmap(obj)(jnp.asarray(_PROBE_COUNTS, jnp.int32)))
            except Exception:  # noqa: BLE001 (not a schedule: known by its code)
                return f"unprobed:{code_digest(obj)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _cached_probe(obj) -> str:
    return _probe(obj)


def fingerprint(obj) -> str:
    """What a built optax object does, as 16 hex digits: a behavioural fingerprint, independent of
    how the object is written (optax's private closures, wrappers such as ``optax.chain(t)`` or
    ``optax.with_extra_args_support``).

    Computed in float64 on the host: for a schedule, its values at the counts ``_PROBE_COUNTS``
    (0..16, then 48 log-spaced counts up to ``2**31 - 1``); for an ``optax.GradientTransformation``,
    the updates of ``_PROBE_STEPS`` steps from ``init(params)``, on fixed pseudo-gradients, the
    parameters moving by the updates (on vectors of length 3, or of the first length in
    ``_PROBE_SIZES`` it runs on); each value to ``_PROBE_DIGITS`` significant digits. **Two objects
    with the same fingerprint give the same outputs, to 10 significant digits, on these probes**:
    they are taken for the same schedule or optimizer. Objects that differ only elsewhere (a
    schedule between the probed counts, an optimizer after its eighth step or on other values) are
    not told apart; pass them as ``fj.schedule(factory, ...)`` / ``fj.optimizer(factory, ...)``,
    described by their hyperparameters. An object the probes cannot run on gets ``"unprobed:"`` and
    the digest of its code (library code by name)."""
    try:
        return _cached_probe(obj)
    except TypeError:  # unhashable
        return _probe(obj)


def _is_transformation(obj) -> bool:
    """Whether ``obj`` is an ``optax.GradientTransformation`` (none exists before optax is imported)."""
    optax = sys.modules.get("optax")
    return optax is not None and isinstance(obj, optax.GradientTransformation)


def _unwrap(fn):
    """The function a ``functools.partial`` calls."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _library_code(fn) -> bool:
    """Whether ``fn`` is a library's code (optax, jax, ...: :mod:`fedsa_jax._digest`), not your own."""
    return _library(getattr(_unwrap(fn), "__module__", None))


def _public_name(fn) -> str | None:
    """``package.qualname`` under which ``fn`` is reachable from its package without a private name
    (``optax.sgd`` for ``optax._src.alias.sgd``), else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        obj = sys.modules.get(".".join(parts[:i]))
        for attr in qualname.split("."):
            obj = getattr(obj, attr, None)
        path = [*parts[:i], *qualname.split(".")]
        if obj is fn and not any(p.startswith("_") for p in path):
            return ".".join(path)
    return None


def _name(fn, kind: str) -> str:
    """A function's name in a description: its public name; for code of your own ``module.qualname``;
    for a library's function without one (a closure), the library and ``kind``."""
    public = _public_name(fn)
    if public is not None:
        return public
    inner = _unwrap(fn)
    module = getattr(inner, "__module__", None) or ""
    if _library_code(fn):
        return f"{module.split('.')[0]} {kind}"
    return f"{module}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def _describe_built(obj) -> dict[str, Any]:
    """``{"name", "fingerprint", "code"}`` of a schedule or transformation passed built: a name
    (``optax.GradientTransformation``; a schedule's :func:`_name`), its :func:`fingerprint`, and,
    where it is code of your own (not a library's), ``code``, the digest of that code."""
    if _is_transformation(obj):
        name, functions = "optax.GradientTransformation", [obj.init, obj.update]
    else:
        name, functions = _name(obj, "schedule"), [obj]
    out = {"name": name, "fingerprint": fingerprint(obj)}
    own = [f for f in functions if not _library_code(f)]
    if own:
        out["code"] = code_digest(own[0] if len(own) == 1 else own)
    return out


def _describe_hyperparameter(value) -> Any:
    """A hyperparameter's description: a schedule or transformation (e.g. ``learning_rate=`` an optax
    schedule) by :func:`_describe_built`, anything else by :func:`describe_value`."""
    if isinstance(value, (tuple, list)) and not _is_transformation(value):
        return [_describe_hyperparameter(v) for v in value]
    if _is_transformation(value) or (
        callable(value) and not isinstance(value, type) and not hasattr(value, "describe")
    ):
        return _describe_built(value)
    return describe_value(value)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Built:
    """An optax object built inside the kernel: ``fn`` itself (``factory=False``) or
    ``fn(**hyperparams, **static)`` with the float hyperparameters traced leaves."""

    hyperparams: dict  # float hyperparameters: traced (sweeping them does not recompile)
    fn: Any = dataclasses.field(metadata=dict(static=True))  # a factory, or a built transformation
    static: tuple = dataclasses.field(metadata=dict(static=True))  # ((name, _Static), ...)
    factory: bool = dataclasses.field(metadata=dict(static=True))

    def build(self):
        if not self.factory:
            return self.fn
        return self.fn(**self.hyperparams, **{k: v.value for k, v in self.static})

    def describe(self) -> dict[str, Any]:
        """What it is, from public things only. Built by a factory: ``name``, the factory's public
        name (``optax.sgd``, ``fedsa_jax.optim.inverse_time``; ``module.qualname`` for a factory of
        your own, with ``code``, the digest of its code), and the hyperparameters. Passed built:
        :func:`_describe_built` (a name and the behavioural :func:`fingerprint`)."""
        if not self.factory:
            return _describe_built(self.fn)
        out: dict[str, Any] = {"name": _name(self.fn, "factory")}
        for k, v in sorted([*self.hyperparams.items(), *((k, v.value) for k, v in self.static)]):
            out[k] = _describe_hyperparameter(v)
        if not _library_code(self.fn):
            out["code"] = code_digest(self.fn)
        elif _public_name(self.fn) is None:  # a library's closure: what it builds
            try:
                built = self.build()
            except Exception:  # noqa: BLE001 (the error that reports it describes it)
                built = None
            out["fingerprint"] = "unbuilt" if built is None else fingerprint(built)
        return out

    def _digest_parts(self) -> list:
        """What :func:`fedsa_jax._digest.code_digest` hashes besides the class: the description
        (never optax's code)."""
        return [self.describe()]


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


# --- local steps that change with the round -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """``H_t``, the local steps of round t (0-based), for the run's first ``num_rounds`` rounds: a
    static part of a configuration (hashable, compared by value). See the module docstring for how
    the kernel runs it; build it with :func:`local_steps` or :func:`growing_local_steps`."""

    table: tuple[int, ...]

    @property
    def max(self) -> int:
        """``H_max``: the steps every round of the compiled kernel has."""
        return max(self.table)

    @property
    def num_rounds(self) -> int:
        """The rounds the table covers (a run may not be longer)."""
        return len(self.table)

    def total(self, num_rounds: int) -> int:
        """``K_T = sum_{t<T} H_t``: the local steps of the first ``num_rounds`` rounds."""
        return int(sum(self.table[:num_rounds]))

    def at(self, count):
        """``H_t`` at the traced round count ``t`` (int32)."""
        return jnp.asarray(self.table, jnp.int32)[count]

    def before(self, count):
        """``K_t = sum_{s<t} H_s`` at the traced round count ``t`` (int32): the local-step index of
        round t's first step."""
        return jnp.asarray(np.concatenate([[0], np.cumsum(self.table)[:-1]]), jnp.int32)[count]

    def describe(self) -> list[int]:
        return list(self.table)


def local_steps(steps: Any, num_rounds: int | None = None) -> int | LocalSteps:
    """``num_local_steps`` that change with the round: ``steps`` a sequence of integers ``H_t``
    (round t runs ``steps[t]`` local steps), or a function ``t -> H_t`` tabulated over
    ``t = 0..num_rounds-1``, e.g. ``fj.local_steps(lambda t: math.ceil(5 * (t + 1) ** 0.2), 1000)``.
    Every ``H_t`` is an integer ``>= 1``; a table whose entries are all one H is that integer H
    (the same kernel and numbers as ``num_local_steps=H``, without a horizon)."""
    if callable(steps):
        n = _validate.integer("num_rounds", num_rounds)
        try:
            values = [steps(t) for t in range(n)]
        except Exception as e:  # noqa: BLE001 (any failure of user code is reported as a bad argument)
            _validate.fail(
                "num_local_steps", steps, f"calling it on a round t failed: {type(e).__name__}: {e}"
            )
    else:
        if num_rounds is not None:
            _validate.fail("num_rounds", num_rounds, "given with a table of H_t, which has its own length")
        if isinstance(steps, (str, bytes)) or not hasattr(steps, "__len__") or np.ndim(steps) != 1:
            _validate.fail(
                "num_local_steps", steps, "expected an integer >= 1, a sequence of them or t -> H_t"
            )
        values = list(steps)
    if not values:
        _validate.fail("num_local_steps", steps, "expected at least one round's H_t")
    table = []
    for t, h in enumerate(values):
        if isinstance(h, (float, np.floating)) and float(h).is_integer():
            h = int(h)
        if isinstance(h, (bool, np.bool_)) or not isinstance(h, (numbers.Integral, np.integer)) or h < 1:
            _validate.fail(
                "num_local_steps",
                reprlib.repr(values),
                f"H_t = {h!r} at round t={t}: every H_t must be an integer >= 1",
            )
        table.append(_validate.integer("num_local_steps", int(h)))
    _validate.integer("num_local_steps", sum(table))  # the local-step index is int32
    if len(set(table)) == 1:
        return table[0]
    return LocalSteps(tuple(table))


def growing_local_steps(
    h0: int, power: float, num_rounds: int | None = None, *, total_local_steps: int | None = None
) -> int | LocalSteps:
    """``H_t = ceil(h0 (t + 1)^power)``: the increasing local steps of Levin et al.,
    arXiv:2605.19629 (2026), ``H_t = ceil(H_0 t^gamma_H)`` counted from t = 1 (``power = 0``: ``h0``
    steps every round). ``power`` in ``[0, 4]``. The table covers ``num_rounds`` rounds, or, given
    ``total_local_steps`` instead, the most rounds whose steps add up to at most that many."""
    h0 = _validate.integer("h0", h0)
    power = _validate.real("power", power, 0.0, 4.0)
    if (num_rounds is None) == (total_local_steps is None):
        _validate.fail("num_rounds", num_rounds, "give exactly one of num_rounds and total_local_steps")
    at = lambda t: math.ceil(h0 * (t + 1) ** power - 1e-9)  # noqa: E731 (1e-9: h0 t^0 is h0, not h0 + 1)
    if num_rounds is not None:
        return local_steps([at(t) for t in range(_validate.integer("num_rounds", num_rounds))])
    total = _validate.integer("total_local_steps", total_local_steps, minimum=h0)
    table, used = [], 0
    while used + at(len(table)) <= total:
        table.append(at(len(table)))
        used += table[-1]
    return local_steps(table)


def local_steps_arg(value: Any) -> int | LocalSteps:
    """Validated ``num_local_steps``: an integer ``>= 1``, a :class:`LocalSteps` or a sequence of
    ``H_t`` (:func:`local_steps`)."""
    if isinstance(value, LocalSteps):
        return value
    if callable(value):
        _validate.fail(
            "num_local_steps",
            value,
            "a function of the round needs its horizon: fj.local_steps(fn, num_rounds)",
        )
    if np.ndim(value) == 1 and not isinstance(value, (str, bytes)):
        return local_steps(value)
    return _validate.integer("num_local_steps", value)


def max_local_steps(num_local_steps) -> int:
    """``H`` or ``H_max`` (the steps every round of the kernel has)."""
    return num_local_steps.max if isinstance(num_local_steps, LocalSteps) else int(num_local_steps)


def round_local_steps(num_local_steps, count):
    """``H_t`` of the round at the traced count ``t`` (int32; a constant for an integer H)."""
    if isinstance(num_local_steps, LocalSteps):
        return num_local_steps.at(count)
    return jnp.int32(num_local_steps)


def active_steps(num_local_steps, count):
    """``(H_max,) bool``: which of the kernel's steps round t runs (``h < H_t``); None for an
    integer H (every step)."""
    if not isinstance(num_local_steps, LocalSteps):
        return None
    return jnp.arange(num_local_steps.max, dtype=jnp.int32) < num_local_steps.at(count)


def total_local_steps(num_local_steps, num_rounds: int) -> int:
    """Local steps of the first ``num_rounds`` rounds (``T H`` for an integer H)."""
    if isinstance(num_local_steps, LocalSteps):
        return num_local_steps.total(num_rounds)
    return int(num_rounds) * int(num_local_steps)


def rounds_within(num_local_steps, total: int) -> int:
    """The most rounds whose local steps add up to at most ``total`` (``total // H`` for an integer
    H; for a table, at most its length)."""
    if not isinstance(num_local_steps, LocalSteps):
        return int(total) // int(num_local_steps)
    return int(np.searchsorted(np.cumsum(num_local_steps.table), int(total), side="right"))


def check_horizon(config, num_rounds: int) -> None:
    """Refuse a run longer than its table of local steps (every field of ``config`` that is a
    :class:`LocalSteps`)."""
    H = getattr(config, "num_local_steps", 1)
    if isinstance(H, LocalSteps) and num_rounds > H.num_rounds:
        _validate.fail(
            "num_rounds",
            num_rounds,
            f"the table of local steps H_t covers {H.num_rounds} rounds; build it for at least "
            f"{num_rounds} (fj.local_steps(fn, num_rounds), fj.growing_local_steps(h0, power, num_rounds))",
        )


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
