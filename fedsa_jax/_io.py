"""Files that never lose work: atomic writes, output folders checked up front, locks,
damaged files recognised, strict JSON.

* :func:`atomic_write` writes into a temporary file beside the target, fsyncs and
  renames it over the target, so a reader (or a resumed run) never sees a
  half-written file. The temporary file is created with mode ``0o666`` filtered
  by the umask (and the folder's default ACL), like any file the user creates:
  ``0644`` under umask ``022``. Its name, ``.<target>~<host>~<pid>~<random>.fedsa-tmp``,
  says who writes it, so a write also removes the temporary files that killed
  writers left in that folder (:func:`remove_stale_temporaries`).
* :func:`prepare_dir` creates an output folder and checks it is writable, before
  any simulation runs.
* :func:`file_lock` is an exclusive ``fcntl.flock`` on a lock file that is
  removed when released.
* No file is written through a symbolic link: temporary files are created with
  ``O_EXCL | O_NOFOLLOW`` and lock files are opened with ``O_NOFOLLOW`` and must be
  regular files with no other hard link, so a link planted in a shared folder under a
  lock's name (``.NAME.lock -> victim``), or a folder or FIFO there, is refused with a
  one-line ``ValueError``, never truncated. A target that is a link (a result or checkpoint file) is replaced
  by ``os.replace``: the link itself becomes the new file, the file it pointed to is
  left as it was. Reading follows links (it changes nothing).
* :func:`read_npz` reads a whole ``.npz`` archive and turns every sign of damage
  into :class:`DamagedFileError`, a ``ValueError`` saying what to do.
* :func:`json_text` is strict JSON (non-finite floats become ``null``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected from each other there
    fcntl = None

TEMP_SUFFIX = ".fedsa-tmp"
STALE_SECONDS = 60.0  # a temporary file of a dead writer on this host, this old, is removed
STALE_OTHER_HOST_SECONDS = 3600.0  # another host's writer cannot be asked: wait this long
CLEAN_EVERY_SECONDS = 60.0  # scan a folder for stale temporary files at most this often per process
_TEMP_RE = re.compile(
    r"^\.(?P<target>.*)~(?P<host>[^~]+)~(?P<pid>\d+)~[0-9a-f]+" + re.escape(TEMP_SUFFIX) + "$"
)
_last_clean: dict[str, float] = {}
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # Windows has none (nor locks); O_EXCL never follows a link


class DamagedFileError(ValueError):
    """A file that is damaged (truncated, corrupted) or was not written by fedsa_jax."""


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _temp_path(folder: Path, target: str) -> Path:
    return folder / f".{target}~{_host()}~{os.getpid()}~{os.urandom(6).hex()}{TEMP_SUFFIX}"


def _refuse(path: Path, what: str, why: str) -> None:
    raise ValueError(
        f"{what} {str(path)!r} is {why} (planted there?), not a file of ours: fedsa_jax does "
        "not write through it; remove it and rerun"
    ) from None


def _create_new(path: Path) -> int:
    """Create ``path`` for writing (``O_EXCL``: never an existing file, nor through a link)."""
    # 0o666 & ~umask, as open() would give (and the folder's default ACL); read no umask
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)


def _open_lock_file(path: Path) -> int:
    """Open (or create) the lock file ``path`` read-write, without following a link; a link, a
    folder, a non-regular file or a file with another hard link is refused with a ``ValueError``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o666)
    except OSError:
        if os.path.islink(path):  # ELOOP on Linux and macOS, EMLINK on FreeBSD
            _refuse(path, "lock file", "a symbolic link")
        if os.path.isdir(path):  # EISDIR: a folder cannot be opened for writing
            _refuse(path, "lock file", "a folder")
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        _refuse(
            path,
            "lock file",
            "not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else f"a hard link to a file with {st.st_nlink} names",
        )
    return fd


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike, now: float | None = None) -> list[Path]:
    """Remove temporary files of writes that were killed (SIGKILL, power loss) in ``folder``.

    A temporary file is stale when its writer is gone: on this host, its process
    no longer exists and the file is older than ``STALE_SECONDS``; from another
    host (a shared file system), the file is older than ``STALE_OTHER_HOST_SECONDS``
    (a live write keeps touching it). Other files are never touched. Returns the
    removed paths.
    """
    folder = Path(folder)
    now = time.time() if now is None else now
    host = _host()
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP_RE.match(entry.name)
        if m is None:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if m["host"] == host:
            stale = age > STALE_SECONDS and not _pid_alive(int(m["pid"]))
        else:
            stale = age > STALE_OTHER_HOST_SECONDS
        if stale:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _clean_now(folder: Path) -> None:
    key = str(folder.resolve())
    now = time.monotonic()
    if now - _last_clean.get(key, -math.inf) >= CLEAN_EVERY_SECONDS:
        _last_clean[key] = now
        remove_stale_temporaries(folder)


def atomic_write(path: str | os.PathLike, write: Callable[[Any], object], mode: str = "wb") -> Path:
    """Write through ``write(fileobj)`` into a temporary file beside ``path``, fsync,
    then ``os.replace`` it onto ``path``. The file gets the umask's permissions. A ``path``
    that is a symbolic link is replaced itself; the file it pointed to is not written. On any
    failure the temporary file is removed and ``path`` is left as it was; an ``OSError`` that
    names no file (``ENOSPC`` from a write or ``fsync``) is raised again naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_now(path.parent)
    while True:
        tmp = _temp_path(path.parent, path.name)
        try:
            fd = _create_new(tmp)
            break
        except FileExistsError:  # also a link planted under this (random) name: never written through
            continue
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # a full disk: name the file being written
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    return path


def atomic_savez(path: str | os.PathLike, **arrays) -> Path:
    """``np.savez`` into ``path`` atomically (the archive is written straight to the temporary file)."""
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def prepare_dir(path: str | os.PathLike, name: str) -> Path:
    """Create the output folder ``path`` (with its parents) and check that files can be written
    there, before any work is done. Raises ``ValueError`` naming ``name`` and the path."""
    path = Path(path)

    def fail(reason: str):
        raise ValueError(f"{name}={str(path)!r} is invalid: {reason}") from None

    if path.exists() and not path.is_dir():
        fail("it is an existing file, expected a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        fail("a part of the path is an existing file, expected folders")
    except OSError as err:
        fail(f"cannot create the folder ({err.strerror or err})")
    probe = _temp_path(path, ".probe")
    try:
        os.close(_create_new(probe))
        os.unlink(probe)
    except OSError as err:
        fail(f"cannot write into the folder ({err.strerror or err}); choose a folder you can write to")
    return path


class LockHeld(Exception):
    """The lock is held by another process (``holder`` is what it wrote into the lock file)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, blocking: bool = False) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on the lock file ``path`` (created, and removed on release).

    Non-blocking, a lock held elsewhere raises :class:`LockHeld` with the holder's
    ``"pid <pid> on host <host>"``. The lock file is unlinked before it is unlocked,
    and a lock taken on a file unlinked meanwhile is retried, so removing it is
    safe. ``flock`` works across processes of one host, and across hosts on NFS
    (as POSIX locks) and most cluster file systems. Without ``fcntl`` (Windows)
    nothing is locked. A lock file that is a symbolic link, not a regular file, or has
    another hard link (planted to make us overwrite another file) raises ``ValueError``.
    """
    if fcntl is None:
        yield
        return
    path = Path(path)
    while True:
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise LockHeld(holder) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder removed it while we waited: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}".encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def read_npz(
    path: str | os.PathLike, what: str, remedy: str, required: tuple[str, ...] = ()
) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file ``path``, read in full (so damage anywhere shows now).

    A missing or unreadable file raises its ``OSError`` (``FileNotFoundError``,
    ``PermissionError``, ``IsADirectoryError``); anything else that goes wrong while
    decoding (a corrupted zip or npy header gives errors of many kinds: ``BadZipFile``,
    ``NotImplementedError`` for an unknown compression method, ``tokenize.TokenError`` or
    ``SyntaxError`` from the header's parser, ``zlib.error``...), or a missing
    ``required`` array, raises :class:`DamagedFileError` saying the file is damaged or
    not a fedsa_jax ``what`` file, then ``remedy``. This is the one place a file's bytes
    are decoded: what reads the arrays afterwards checks their values.
    """
    try:
        with open(path, "rb") as fh:  # ours to close, also when numpy fails half-way
            data = np.load(fh, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            with data:
                arrays = {k: data[k] for k in data.files}
        missing = [k for k in required if k not in arrays]
        if missing:
            raise KeyError(f"no {missing[0]!r} array")
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as err:  # zipfile's, numpy's header parser's (tokenize, SyntaxError), zlib's...
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "pickled" in detail:  # numpy's refusal to unpickle: random bytes or another program's file
            detail = "not a NumPy archive"
        raise DamagedFileError(
            f"{str(path)!r} is damaged or not a fedsa_jax {what} file ({detail}); {remedy}"
        ) from None
    return arrays


def _strict(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _strict(obj.tolist())
    if isinstance(obj, np.generic):
        return _strict(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def json_text(obj: Any, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Strict JSON (RFC 8259): NaN and infinities become ``null``; numpy values become numbers."""
    return json.dumps(_strict(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """:func:`json_text` written atomically."""
    text = json_text(obj) + "\n"
    return atomic_write(path, lambda f: f.write(text), mode="w")
