"""Persistent compilation cache: a second run of the same kernel loads it from disk.

A simulation kernel takes seconds to compile on a CPU (more than the run itself
for short runs). JAX can keep compiled programs on disk
(``jax_compilation_cache_dir``); :func:`enable` turns that on, in a folder under
the user's cache directory by default, for every kernel however fast it
compiled (the thresholds ``jax_persistent_cache_min_compile_time_secs`` and
``jax_persistent_cache_min_entry_size_bytes`` set to 0).

The command line (``fedsa-jax run`` and ``fedsa-jax sweep``) calls it before
anything compiles, unless given ``--no-compile-cache`` or the environment
variable ``FEDSA_JAX_COMPILE_CACHE=off``; ``FEDSA_JAX_COMPILE_CACHE=/some/folder``
moves the cache. Importing :mod:`fedsa_jax` or calling :func:`fedsa_jax.simulate`
never changes JAX's configuration: library users opt in by calling
``fedsa_jax.compile_cache.enable()`` before their first simulation (JAX reads the
setting when it first compiles).

Example:
  >>> from fedsa_jax import compile_cache
  >>> compile_cache.default_dir().name
  'jax_compile_cache'
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

__all__ = ["enable"]

ENV = "FEDSA_JAX_COMPILE_CACHE"  # a folder, or off / 0 / false / no to disable
_OFF = ("", "0", "off", "false", "no", "none")


def _default_dir() -> Path:
    """``$XDG_CACHE_HOME/fedsa_jax/jax_compile_cache`` (``~/.cache`` without ``XDG_CACHE_HOME``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "fedsa_jax" / "jax_compile_cache"


def configured_dir(opt_out: bool = False) -> Path | None:
    """The folder the command line uses: None if ``opt_out`` (``--no-compile-cache``) or
    ``FEDSA_JAX_COMPILE_CACHE`` is off, the variable's folder if it names one, else
    :func:`_default_dir`."""
    if opt_out:
        return None
    value = os.environ.get(ENV)
    if value is None:
        return _default_dir()
    if value.strip().lower() in _OFF:
        return None
    return Path(value).expanduser()


def enable(path: str | os.PathLike | None = None) -> Path | None:
    """Keep every compiled kernel in ``path`` (default :func:`_default_dir`), created if needed.

    Call it before the first compilation of the process. Returns the folder, or None (with a
    warning; the run goes on without a cache) if it cannot be created.
    """
    import jax

    folder = Path(path).expanduser() if path is not None else _default_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        warnings.warn(
            f"compilation cache disabled: cannot create {folder} ({err.strerror or err})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # small kernels too
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
