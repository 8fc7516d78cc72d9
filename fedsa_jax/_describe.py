"""JSON-friendly descriptions of configuration values (``result.config``, checkpoint fingerprints).

Its own module so that :mod:`fedsa_jax.optim` and :mod:`fedsa_jax.algorithms` both use it
without importing each other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def describe_value(value: Any) -> Any:
    """A JSON-friendly description: objects with ``describe()`` use it, dataclasses
    become dicts of their fields (less those marked ``omit_none`` in their metadata while None, options
    added later that leave older descriptions as they were), numbers and arrays become floats and lists,
    functions their qualified names."""
    if hasattr(value, "describe") and callable(value.describe) and not isinstance(value, type):
        return value.describe()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: describe_value(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get("omit_none") and getattr(value, f.name) is None)
        }
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        return [describe_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe_value(v) for k, v in value.items()}
    if callable(value):
        return getattr(value, "__qualname__", None) or repr(value)
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 (anything else is described by its repr)
        return repr(value)
    if arr.dtype.kind in "biuf":
        return arr.item() if arr.ndim == 0 else arr.tolist()
    return repr(value)
