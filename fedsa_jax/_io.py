"""Atomic file writes: a reader never sees a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np


def atomic_write(path: str | os.PathLike, write: Callable[[object], None], mode: str = "wb") -> Path:
    """Write through ``write(fileobj)`` into a temporary file beside ``path``, fsync,
    then ``os.replace`` it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_savez(path: str | os.PathLike, **arrays) -> Path:
    """``np.savez`` into ``path`` atomically (the archive is written straight to the temporary file)."""
    return atomic_write(path, lambda f: np.savez(f, **arrays))
