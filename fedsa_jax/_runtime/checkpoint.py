"""Atomic checkpoints of a running simulation, and the fingerprint that guards them.

A checkpoint is one ``.npz`` file holding a fingerprint of the run's
configuration, the statistics recorded so far and the kernel's carry (every
seed's state, the next round's random numbers, the round counter). It is
replaced atomically after each chunk, so a run killed at any instant (SIGKILL
included) leaves the previous complete checkpoint; resuming restores the carry
exactly, so the resumed run is bit-identical to an uninterrupted one.

The file is named after the fingerprint, ``checkpoint-<first 16 hex digits>.npz``,
so runs of different configurations share a folder without touching each
other's checkpoints; while a run uses its checkpoint it holds an ``fcntl`` lock
on ``.checkpoint-<digits>.lock`` beside it, and a second run of the same
configuration is refused until the first ends. A damaged checkpoint is refused
with a message, never deleted nor silently restarted.

The fingerprint covers the code that shapes the run (``_run.run_code``: a digest of
the algorithm's, problem's and metrics' functions, :mod:`fedsa_jax._digest`), so a run of
edited code finds no checkpoint of its own and starts from round 0; :func:`notice_other_code`
then says so in one line when the folder holds a checkpoint of the same configuration.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedsa_jax import _io
from fedsa_jax._io import atomic_savez

LEGACY_FILENAME = "checkpoint.npz"  # before the fingerprint was in the name: still resumed
_DAMAGED = (
    "move it out of the folder to start this run again from round 0, or put back a copy of it to resume"
)


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
            leaf = jax.random.wrap_key_data(
                jax.device_put(arr, like.sharding), impl=jax.random.key_impl(like)
            )
        else:
            leaf = jax.device_put(arr.astype(like.dtype), like.sharding)
        if leaf.shape != like.shape:
            raise ValueError(f"checkpoint leaf {i} has shape {leaf.shape}, expected {like.shape}")
        restored.append(leaf)
    return jax.tree.unflatten(treedef, restored)


def filename(finger: str) -> str:
    """The checkpoint file of the configuration with fingerprint ``finger``."""
    return f"checkpoint-{finger[:16]}.npz"


def paths(directory) -> list[Path]:
    """Every checkpoint file in ``directory`` (any configuration)."""
    directory = Path(directory)
    found = sorted(directory.glob("checkpoint-*.npz"))
    legacy = directory / LEGACY_FILENAME
    return found + ([legacy] if legacy.exists() else [])


@contextlib.contextmanager
def lock(directory, finger: str):
    """Hold the lock of this configuration's checkpoint in ``directory`` for a run."""
    path = Path(directory) / f".{filename(finger)[:-4]}.lock"
    try:
        with _io.file_lock(path):
            yield
    except _io.LockHeld as held:
        raise ValueError(
            f"checkpoint_dir={str(directory)!r} is invalid: another run of the same configuration "
            f"({held.holder}) "
            "is using its checkpoint there; wait for it to finish (then rerun to load its result), or use "
            "another checkpoint_dir"
        ) from None


def save(directory: Path, finger: str, arrays: dict[str, np.ndarray]) -> None:
    atomic_savez(Path(directory) / filename(finger), **arrays)


def read(path) -> dict[str, np.ndarray]:
    """A checkpoint file's arrays; :class:`fedsa_jax._io.DamagedFileError` if it is damaged."""
    return _io.read_npz(path, "checkpoint", _DAMAGED, required=("fingerprint", "batch"))


def load(directory: Path, finger: str | None = None) -> dict[str, np.ndarray] | None:
    """The checkpoint of the configuration ``finger`` in ``directory`` (None if there is none).

    Without ``finger``, the folder's only checkpoint (for inspection). A file
    named ``checkpoint.npz`` (older versions) is used when its fingerprint matches.
    """
    directory = Path(directory)
    if finger is None:
        found = paths(directory)
        if len(found) > 1:
            raise ValueError(f"{str(directory)!r} holds {len(found)} checkpoints: pass the fingerprint")
        return read(found[0]) if found else None
    path = directory / filename(finger)
    if path.exists():
        saved = read(path)
        if str(saved["fingerprint"]) != finger:
            raise _io.DamagedFileError(
                f"{str(path)!r} is damaged or not a fedsa_jax checkpoint file "
                "(its fingerprint does not match "
                f"its name); {_DAMAGED}"
            )
        return saved
    legacy = directory / LEGACY_FILENAME
    if legacy.exists():
        saved = read(legacy)
        if str(saved["fingerprint"]) == finger:
            return saved
    return None


def notice_other_code(directory, finger: str, configuration: str) -> None:
    """Warn (one line) when ``directory`` holds a checkpoint of this configuration (same
    arguments, fingerprint ``configuration``) made by other code: the run the user expected to
    resume starts from round 0, because the algorithm's, problem's or metrics' functions changed.
    Checkpoints of other configurations (a folder shared by a sweep) are not mentioned."""
    own = filename(finger)
    for path in paths(directory):
        if path.name == own:
            continue
        try:
            with np.load(path, allow_pickle=False) as data:  # reads the one small array it needs
                theirs = str(data["configuration"]) if "configuration" in data.files else None
        except Exception:  # damaged (any decoding error, see _io.read_npz) or foreign: not ours to judge
            continue
        if theirs == configuration:
            warnings.warn(
                f"checkpoint_dir={str(directory)!r} holds a checkpoint ({path.name}) "
                "of this configuration made "
                f"by other code (the algorithm's, problem's or metrics' functions changed): this run starts "
                f"from round 0, checkpointed in {own}",
                RuntimeWarning,
                stacklevel=4,
            )
            return


def require(saved: dict[str, np.ndarray], keys, directory, finger: str) -> None:
    """Refuse a checkpoint that lacks arrays a resume needs (a hand-edited or truncated file)."""
    missing = [k for k in keys if k not in saved]
    if missing:
        raise _io.DamagedFileError(
            f"{str(Path(directory) / filename(finger))!r} is damaged or not a fedsa_jax checkpoint file "
            f"(no {missing[0]!r} array); {_DAMAGED}"
        )
