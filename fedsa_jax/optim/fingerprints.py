"""Descriptions of schedules and server optimizers: a factory's public name and hyperparameters, or
for an object passed built its behavioural :func:`fingerprint` on fixed probes (``result.config``,
checkpoint fingerprints, the code digest). Read from public things only, so a release of optax that
computes the same describes the same."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import numbers
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax._describe import describe_value
from fedsa_jax._digest import _library, code_digest

__all__ = ["fingerprint"]

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
