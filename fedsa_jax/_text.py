"""Messages in one line of bounded length (standard library only: the command line's help and
argument errors use it without importing JAX)."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 500  # a message of fail(): the name and the text are cut first, the value gets the rest
MAX_NAME_CHARS, MAX_ALLOWED_CHARS = 60, 300


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, its middle elided with ``...``."""
    if len(text) <= limit:
        return text
    head = (limit - 3) * 2 // 3
    return f"{text[:head]}...{text[len(text) - (limit - 3 - head) :]}"


MAX_WORD_CHARS = 120  # a run of non-space characters (a value, a path) before its middle is elided


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` in one line of at most ``limit`` characters (whitespace runs made one space): each
    run of more than ``MAX_WORD_CHARS`` non-space characters, then the whole, has its middle elided."""
    words = [_clip(word, MAX_WORD_CHARS) for word in str(text).split()]
    return _clip(" ".join(words), limit)
