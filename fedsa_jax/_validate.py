"""Argument checks shared by every constructor.

Every public constructor validates its arguments in plain Python/numpy, before
anything is traced or compiled, and raises ``ValueError`` whose message names the
parameter, the value it got and what is allowed, in one line of at most 500 characters
(an array is shown by its shape; a long value or text has its middle elided).
"""

from __future__ import annotations

import numbers
from typing import Any, NoReturn

import jax
import numpy as np

from fedsa_jax._text import (
    MAX_ALLOWED_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_NAME_CHARS,
    _clip,
    one_line as one_line,  # re-exported: every message goes through it
)
from fedsa_jax.registry import SEED_MAX  # the command line's --seed allows the same


def _show(value: Any, limit: int = MAX_MESSAGE_CHARS) -> str:
    if not isinstance(value, (str, bytes)):
        try:
            arr = np.asarray(value)
        except Exception:  # noqa: BLE001 - a ragged list, an object refusing conversion: shown by repr
            arr = None
        if arr is not None and arr.ndim > 0:
            return f"array of shape {arr.shape}"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an int too long to print, a broken __repr__: the error must still show
        text = f"<{type(value).__name__} object>"
    return _clip(text, limit)


def fail(name: str, value: Any, allowed: str) -> NoReturn:
    """Raise the one-line ``ValueError`` ``"name=value is invalid: allowed"``, at most
    ``MAX_MESSAGE_CHARS`` long: a long name, text or value has its middle elided."""
    name, allowed = _clip(str(name), MAX_NAME_CHARS), _clip(str(allowed), MAX_ALLOWED_CHARS)
    room = MAX_MESSAGE_CHARS - len(name) - len(allowed) - len("= is invalid: ")  # >= 126
    raise ValueError(f"{name}={_show(value, room)} is invalid: {allowed}")


INDEX_MAX = 2**31 - 1  # sizes and indices are int32 inside the kernels


def integer(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools are refused (``True`` is an ``int`` to
    Python, never a count). Without ``maximum`` the bound is ``INDEX_MAX = 2**31 - 1`` (counts and sizes
    are int32 inside the kernels), named only to a value above it: an int Python holds but JAX cannot
    (``2**64``) is this one-line error, never an ``OverflowError`` from the conversion."""
    allowed = (
        f"expected an integer >= {minimum}"
        if maximum is None
        else f"expected an integer in [{minimum}, {maximum}]"
    )
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        fail(name, value, allowed)
    if value < minimum or (maximum is not None and value > maximum):  # pyright: ignore[reportOperatorIssue]
        fail(name, value, allowed)
    if maximum is None and value > INDEX_MAX:  # pyright: ignore[reportOperatorIssue]
        fail(name, value, f"expected an integer in [{minimum}, 2**31 - 1] (an int32 inside the kernels)")
    return int(value)


def table_size(
    name: str,
    value: Any,
    count: int,
    what: str,
    limit: int = INDEX_MAX,
    why: str = f"2^31 - 1 = {INDEX_MAX} (tables are indexed with int32)",
) -> None:
    """Refuse a table of ``count > limit`` values (``what`` says which product of sizes it is;
    ``why`` the limit and its reason), before it is allocated: by default ``INDEX_MAX``, where flat
    int32 indices would wrap around (and the table would not fit in memory anyway)."""
    if count > limit:
        fail(name, value, f"{what} = {count} values, more than {why}")


def real(
    name: str,
    value: Any,
    low: float = -np.inf,
    high: float = np.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    lo = "(" if low_open or low == -np.inf else "["
    hi = ")" if high_open or high == np.inf else "]"
    allowed = f"expected a finite real number in {lo}{low}, {high}{hi}"
    if isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_:
        # float(True) is 1.0: a flag is never meant as a number
        fail(name, value, f"{allowed}, not a bool")
    try:
        x = float(value)
    except (TypeError, ValueError):
        fail(name, value, "expected a real number")
    if not np.isfinite(x):
        fail(name, value, allowed)
    if (x < low) or (low_open and x == low) or (x > high) or (high_open and x == high):
        fail(name, value, allowed)
    return x


DTYPES_ALLOWED = (
    "expected a real array of float32 or float64 (integers and bools are converted; "
    "float16, bfloat16 and complex values are refused: too coarse, or not real)"
)


def check_dtype(name: str, value: Any) -> None:
    """Refuse arrays of float16, bfloat16, complex or non-numeric dtype, naming ``name``."""
    dt = getattr(value, "dtype", None)
    if dt is None:
        try:
            dt = np.asarray(value).dtype
        except (TypeError, ValueError):
            fail(name, value, DTYPES_ALLOWED)
    dt = np.dtype(dt)
    if dt.kind in "biu" or dt in (np.dtype(np.float32), np.dtype(np.float64)):
        return
    if dt.kind == "f" and dt.itemsize > 8:  # long double: converted to float64 like a Python float
        return
    fail(name, f"array of dtype {dt}", DTYPES_ALLOWED)


def array(name: str, value: Any, ndim: int | tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """Convert to a finite numpy array with the given number of dimensions (refusing
    float16, bfloat16, complex and non-numeric values, see :func:`check_dtype`)."""
    check_dtype(name, value)
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        fail(name, value, "expected a numeric array")
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in ndims:
        fail(name, value, f"expected {' or '.join(str(n) for n in ndims)} dimensions, got {arr.ndim}")
    if not np.all(np.isfinite(arr)):
        fail(name, value, "entries must be finite (found NaN or Inf)")
    return arr


def fits(name: str, value: Any, values: np.ndarray, dtype, what: str = "entries") -> None:
    """Refuse ``values`` (float64, derived from the argument ``name``, shown as ``value``) that are
    not finite in the working ``dtype``: a float32 overflow would otherwise surface mid-run as a
    diverged or NaN iterate. NaN in ``values`` is allowed (a documented "undefined")."""
    dt = np.dtype(dtype)
    values = np.asarray(values, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(dt)
    if np.all(np.isfinite(cast) | np.isnan(values)):
        return
    biggest = float(np.nanmax(np.abs(values)))
    advice = "rescale the data" + ("" if dt == np.float64 else " or use float64")
    fail(
        name,
        value,
        f"{what} reach {biggest:.3g} in magnitude, beyond the largest {dt} "
        f"({float(np.finfo(dt).max):.3g}); {advice}",
    )


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        fail(name, value, f"expected one of {', '.join(repr(a) for a in allowed)}")
    return value


def float_dtype(name: str, value: Any, default_from: Any = None, source: str | None = None) -> np.dtype:
    """Resolve a floating dtype; float64 needs ``jax_enable_x64``. Inferred from the array
    argument ``source`` (its dtype ``default_from``) when ``value`` is None."""
    if value is None:
        if default_from is not None and source is not None:
            check_dtype(source, np.empty(0, default_from))
        base = np.result_type(default_from) if default_from is not None else np.float64
        if not np.issubdtype(base, np.floating):
            base = np.float64
        return np.dtype(jax.dtypes.canonicalize_dtype(base))
    try:
        dt = np.dtype(value)
    except TypeError:
        fail(name, value, "expected 'float32' or 'float64'")
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        fail(name, value, "expected 'float32' or 'float64'")
    if dt == np.float64 and not jax.config.jax_enable_x64:  # pyright: ignore[reportAttributeAccessIssue]
        fail(name, value, "float64 needs jax.config.update('jax_enable_x64', True) first")
    return dt


def prng_key(name: str, key: Any) -> jax.Array:
    """Return a typed threefry key; refuse rbg/unsafe_rbg and non-keys."""
    if isinstance(key, (numbers.Integral, np.integer)) and not isinstance(key, bool):
        if not 0 <= int(key) <= SEED_MAX:
            fail(name, key, f"expected an int seed in [0, {SEED_MAX}] or a JAX PRNG key")
        return jax.random.key(int(key))
    try:
        impl = str(jax.random.key_impl(key))
    except (TypeError, ValueError, AttributeError):
        fail(name, key, "expected a JAX PRNG key (jax.random.key(seed)) or an int seed")
    if impl != "threefry2x32":
        fail(
            name,
            impl,
            "only threefry2x32 keys are accepted: rbg/unsafe_rbg keys are not independent "
            "under vmap; use jax.random.key(seed, impl='threefry2x32')",
        )
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key, impl="threefry2x32")
    if key.shape != ():
        fail(name, f"key array of shape {key.shape}", "expected a single key (shape ())")
    return key


def rng_from_key(key: Any) -> np.random.Generator:
    """A numpy generator seeded deterministically from a JAX key (for problem generators)."""
    key = prng_key("key", key)
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
