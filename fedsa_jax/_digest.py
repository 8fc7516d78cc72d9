"""A digest of code: what a function does, so that a checkpoint or a saved result made by
other code is never taken for this run's.

:func:`code_digest` hashes, recursively, everything a function's behaviour is made of
that Python can see:

* its bytecode, constants (nested functions and lambdas included), the names it
  uses, its default arguments and the values its closure holds;
* the functions and classes of its own module that it names (helpers it calls);
* ``functools.partial`` (function and bound arguments), bound methods (function and
  the object), decorated and jitted functions (``__wrapped__``);
* classes: their methods, properties and static/class methods, inherited ones included;
* data: numbers and strings by value, arrays by dtype, shape and bytes, containers and
  objects (their ``__dict__``, dataclass fields, slots) by their contents.

Library code (the standard library, numpy, jax, jaxlib, scipy, optax, chex) is described
by its name: its behaviour belongs to the library's version. An object whose class defines
``_digest_parts()`` is made of its class and what that returns: schedules and server
optimizers (:mod:`fedsa_jax.optim`) give their description, so that no name or code
private to optax enters a digest. Not seen: a module-level *value* a function reads when
it runs (``RATE = 0.1`` read by ``step``), attributes of modules, code in C extensions.
The digest is stable across processes for the same code: no object address or
hash-seed-dependent order enters it (a ``repr`` loses its ``0x...`` addresses; sets are
hashed in sorted order); Python's bytecode, and so the digest, changes with the Python
version. Cycles are cut, the depth is bounded, and each object
is hashed once per digest.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import sys
import types
from typing import Any

import numpy as np

MAX_DEPTH = 40  # deeper objects are described by their type only
_LIBRARIES = frozenset(sys.stdlib_module_names) | {
    "numpy",
    "jax",
    "jaxlib",
    "scipy",
    "ml_dtypes",
    "optax",
    "chex",
}
_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+|0x[0-9A-Fa-f]{6,}")
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_DESCRIPTORS = (staticmethod, classmethod, property, functools.cached_property)


def code_digest(obj: Any, length: int = 12, arrays: bool = True) -> str:
    """The first ``length`` hex digits of the SHA-256 digest of ``obj``'s code and values
    (module docstring). ``arrays=False`` describes arrays by dtype and shape only (for
    objects whose arrays are hashed elsewhere, e.g. a problem's leaves)."""
    return _Walker(arrays).digest(obj).hex()[:length]


def _library(module: Any) -> bool:
    return isinstance(module, str) and module.split(".")[0] in _LIBRARIES


def _name(obj: Any) -> str:
    """``module:qualname`` of a function or class (no address)."""
    module = getattr(obj, "__module__", None) or ""
    return f"{module}:{getattr(obj, '__qualname__', None) or getattr(obj, '__name__', type(obj).__name__)}"


def _repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 (a broken __repr__: the type says what there is)
        text = ""
    return f"{_name(type(obj))}:{_ADDRESS.sub('', text)}"


class _Walker:
    """One digest: ``seen`` memoises each object's digest (objects on the current path are
    cycles, described by their type); ``keep`` holds them alive so that ids stay unique."""

    def __init__(self, arrays: bool):
        self.arrays = arrays
        self.seen: dict[int, bytes] = {}
        self.keep: list[Any] = []
        self.depth = 0

    def digest(self, obj: Any) -> bytes:
        if isinstance(obj, _ATOMS):  # by value, never memoised: a constant may or may not be shared
            return hashlib.sha256(f"{type(obj).__name__}:{obj!r}".encode()).digest()
        key = id(obj)
        if key in self.seen:
            return self.seen[key]
        if self.depth >= MAX_DEPTH:
            return hashlib.sha256(f"deep:{_name(type(obj))}".encode()).digest()
        self.seen[key] = hashlib.sha256(f"cycle:{_name(type(obj))}".encode()).digest()
        self.keep.append(obj)
        self.depth += 1
        try:
            h = hashlib.sha256(_name(type(obj)).encode())
            try:
                parts = self._parts(obj)
            except Exception:  # noqa: BLE001 (an object that cannot be read is known by its type)
                parts = [b"unreadable"]
            for part in parts:
                h.update(part if isinstance(part, bytes) else self.digest(part))
        finally:
            self.depth -= 1
        self.seen[key] = h.digest()
        return self.seen[key]

    def _parts(self, obj: Any) -> list:
        """What ``obj`` is made of: bytes (hashed as they are) and objects (digested)."""
        if isinstance(obj, types.CodeType):
            return self._code(obj)
        if isinstance(obj, (np.ndarray, np.generic)) or type(obj).__module__.startswith("jax"):
            arr = _array(obj)
            if arr is not None:
                shape = f"{arr.dtype}{arr.shape}".encode()
                return [shape, np.ascontiguousarray(arr).tobytes()] if self.arrays else [shape]
        if isinstance(obj, (tuple, list)):
            return list(obj)
        if isinstance(obj, (set, frozenset)):
            return sorted(self.digest(x) for x in obj)
        if isinstance(obj, dict):
            return [x for kv in obj.items() for x in kv]
        if isinstance(obj, functools.partial):
            return [obj.func, obj.args, obj.keywords]
        if isinstance(obj, types.MethodType):
            return [obj.__func__, obj.__self__]
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, type):
            return self._class(obj)
        if isinstance(obj, types.ModuleType):
            return [obj.__name__.encode()]
        if isinstance(obj, _DESCRIPTORS):
            return [getattr(obj, a, None) for a in ("__func__", "fget", "fset", "fdel", "func")]
        own = getattr(type(obj), "_digest_parts", None)  # an object that says what it is made of
        if callable(own):
            return [type(obj), *own(obj)]  # pyright: ignore[reportGeneralTypeIssues]
        wrapped = getattr(obj, "__wrapped__", None)  # jax.jit, functools.lru_cache, ...
        if wrapped is not None and callable(obj):
            return [wrapped]
        if isinstance(obj, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodWrapperType)):
            return [_name(obj).encode()]
        return self._instance(obj)

    def _code(self, code: types.CodeType) -> list:
        return [
            code.co_code,
            getattr(code, "co_exceptiontable", b""),
            code.co_consts,
            code.co_names,
            code.co_freevars,
            f"{code.co_argcount},{code.co_kwonlyargcount},{code.co_flags}".encode(),
        ]

    def _function(self, fn: types.FunctionType) -> list:
        if _library(fn.__module__):
            return [_name(fn).encode()]
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # an empty cell
                cells.append(b"empty")
        helpers = []  # functions and classes of the same module that the code names
        for name in sorted(_names(fn.__code__)):
            value = fn.__globals__.get(name)
            own = getattr(value, "__module__", None) == fn.__module__
            if own and isinstance(value, (types.FunctionType, type)):
                helpers += [name.encode(), value]
        return [fn.__code__, fn.__defaults__, fn.__kwdefaults__, cells, *helpers, fn.__dict__]

    def _class(self, cls: type) -> list:
        if _library(cls.__module__):
            return [_name(cls).encode()]
        parts: list = []
        for base in cls.__mro__:
            parts.append(_name(base).encode())
            if base is object or _library(base.__module__):
                continue
            for name, value in sorted(vars(base).items()):
                if isinstance(value, (types.FunctionType, *_DESCRIPTORS)):
                    parts += [name.encode(), value]
        return parts

    def _instance(self, obj: Any) -> list:
        cls = type(obj)
        if _library(cls.__module__):
            return [_repr(obj).encode()]
        state = getattr(obj, "__dict__", None)
        if state is None and dataclasses.is_dataclass(obj):
            state = {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj)}
        if state is None:
            slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]
            state = {s: getattr(obj, s, None) for s in slots} if slots else None
        return [cls, _repr(obj).encode() if state is None else state]


def _names(code: types.CodeType) -> set[str]:
    """The names a code object and the code nested in it use (globals and attributes)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _array(obj: Any) -> np.ndarray | None:
    """A host copy of an array (typed PRNG keys as their raw data); None if ``obj`` is not one."""
    import jax

    if isinstance(obj, (np.ndarray, np.generic)):
        return np.asarray(obj)
    if not isinstance(obj, jax.Array):
        return None
    try:
        if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
            obj = jax.random.key_data(obj)
        return np.asarray(obj)
    except Exception:  # noqa: BLE001 (a tracer, a deleted or non-addressable array: not readable here)
        return None
