"""What a user names becomes a path only through here: folders are checked, names sanitised.

A name (an algorithm's, a sweep configuration's) becomes one file or folder name
inside the folder the user chose, never a way out of it: :func:`safe_name` keeps
``A-Z a-z 0-9 . _ -`` and replaces every other character (``/``, ``\\``, NUL, spaces,
non-ASCII) by ``_``, replaces a leading ``.`` (so never ``.``, ``..`` nor a hidden
file) and an empty name by ``_``, and cuts the result to ``MAX_NAME`` characters, which
leaves room under the usual 255-byte limit for a prefix, a suffix and the temporary
files' ``~host~pid~random`` (see :mod:`fedsa_jax._io`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from fedsa_jax import _validate

MAX_NAME = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(text: str) -> str:
    """``text`` as one portable file name (module docstring); unchanged if it already is one.

    >>> safe_name("averaged_fedlsa"), safe_name("../x"), safe_name("a/b c")
    ('averaged_fedlsa', '_._x', 'a_b_c')
    """
    name = _UNSAFE.sub("_", str(text))[:MAX_NAME]
    return "_" + name[1:] if name.startswith(".") else name or "_"


def folder(name: str, value: Any) -> None:
    """Refuse a folder argument that is not a path (``checkpoint_dir=3``) with a one-line ``ValueError``."""
    if not isinstance(value, (str, os.PathLike)):
        _validate.fail(name, value, "expected a folder (a str or pathlib.Path)")
