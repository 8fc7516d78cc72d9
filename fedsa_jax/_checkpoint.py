"""Atomic checkpoints of a running simulation, and the fingerprint that guards them.

A checkpoint is one ``.npz`` file holding a fingerprint of the run's
configuration, the statistics recorded so far and the kernel's carry (every
seed's state, the next round's random numbers, the round counter). It is
replaced atomically after each chunk, so a run killed at any instant (SIGKILL
included) leaves the previous complete checkpoint; resuming restores the carry
exactly, so the resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedsa_jax._io import atomic_savez

FILENAME = "checkpoint.npz"


def fingerprint(*trees: Any, **settings: Any) -> str:
    """SHA-256 of the pytrees' leaves (dtype, shape, bytes) and of the settings.

    Structure goes in through ``settings`` (e.g. ``describe()`` dictionaries):
    a treedef's text holds function addresses, which differ between processes.
    """
    h = hashlib.sha256()
    for tree in trees:
        for leaf in jax.tree.leaves(tree):
            if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            arr = np.asarray(leaf)
            h.update(f"{arr.dtype}{arr.shape}".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


def tree_to_arrays(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    """Host copies of a pytree's leaves (typed PRNG keys as their raw data)."""
    out = {}
    for i, leaf in enumerate(jax.tree.leaves(tree)):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out[f"{prefix}{i}"] = np.asarray(jax.device_get(leaf))
    return out


def arrays_to_tree(prefix: str, data, template: Any) -> Any:
    """Inverse of :func:`tree_to_arrays`, placed like ``template``'s leaves."""
    leaves, treedef = jax.tree.flatten(template)
    restored = []
    for i, like in enumerate(leaves):
        arr = data[f"{prefix}{i}"]
        if jax.dtypes.issubdtype(like.dtype, jax.dtypes.prng_key):
            leaf = jax.random.wrap_key_data(jax.device_put(arr, like.sharding), impl=jax.random.key_impl(like))
        else:
            leaf = jax.device_put(arr.astype(like.dtype), like.sharding)
        if leaf.shape != like.shape:
            raise ValueError(f"checkpoint leaf {i} has shape {leaf.shape}, expected {like.shape}")
        restored.append(leaf)
    return jax.tree.unflatten(treedef, restored)


def save(directory: Path, arrays: dict[str, np.ndarray]) -> None:
    atomic_savez(Path(directory) / FILENAME, **arrays)


def load(directory: Path) -> dict[str, np.ndarray] | None:
    path = Path(directory) / FILENAME
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
