"""Local steps that change with the round: a table ``H_t`` (:func:`local_steps`,
:func:`growing_local_steps`), each round's count and active steps, and the run's horizon."""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
from typing import Any

import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate

__all__ = ["LocalSteps", "growing_local_steps", "local_steps"]


@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """``H_t``, the local steps of round t (0-based), for the run's first ``num_rounds`` rounds: a
    static part of a configuration (hashable, compared by value). See the module docstring for how
    the kernel runs it; build it with :func:`local_steps` or :func:`growing_local_steps`."""

    table: tuple[int, ...]

    @property
    def max(self) -> int:
        """``H_max``: the steps every round of the compiled kernel has."""
        return max(self.table)

    @property
    def num_rounds(self) -> int:
        """The rounds the table covers (a run may not be longer)."""
        return len(self.table)

    def total(self, num_rounds: int) -> int:
        """``K_T = sum_{t<T} H_t``: the local steps of the first ``num_rounds`` rounds."""
        return int(sum(self.table[:num_rounds]))

    def at(self, count):
        """``H_t`` at the traced round count ``t`` (int32)."""
        return jnp.asarray(self.table, jnp.int32)[count]

    def before(self, count):
        """``K_t = sum_{s<t} H_s`` at the traced round count ``t`` (int32): the local-step index of
        round t's first step."""
        return jnp.asarray(np.concatenate([[0], np.cumsum(self.table)[:-1]]), jnp.int32)[count]

    def describe(self) -> list[int]:
        return list(self.table)


def local_steps(steps: Any, num_rounds: int | None = None) -> int | LocalSteps:
    """``num_local_steps`` that change with the round: ``steps`` a sequence of integers ``H_t``
    (round t runs ``steps[t]`` local steps), or a function ``t -> H_t`` tabulated over
    ``t = 0..num_rounds-1``, e.g. ``fj.local_steps(lambda t: math.ceil(5 * (t + 1) ** 0.2), 1000)``.
    Every ``H_t`` is an integer ``>= 1``; a table whose entries are all one H is that integer H
    (the same kernel and numbers as ``num_local_steps=H``, without a horizon)."""
    if callable(steps):
        n = _validate.integer("num_rounds", num_rounds)
        try:
            values = [steps(t) for t in range(n)]
        except Exception as e:  # noqa: BLE001 (any failure of user code is reported as a bad argument)
            _validate.fail(
                "num_local_steps", steps, f"calling it on a round t failed: {type(e).__name__}: {e}"
            )
    else:
        if num_rounds is not None:
            _validate.fail("num_rounds", num_rounds, "given with a table of H_t, which has its own length")
        if isinstance(steps, (str, bytes)) or not hasattr(steps, "__len__") or np.ndim(steps) != 1:
            _validate.fail(
                "num_local_steps", steps, "expected an integer >= 1, a sequence of them or t -> H_t"
            )
        values = list(steps)
    if not values:
        _validate.fail("num_local_steps", steps, "expected at least one round's H_t")
    table = []
    for t, h in enumerate(values):
        if isinstance(h, (float, np.floating)) and float(h).is_integer():
            h = int(h)
        if isinstance(h, (bool, np.bool_)) or not isinstance(h, (numbers.Integral, np.integer)) or h < 1:
            _validate.fail(
                "num_local_steps",
                reprlib.repr(values),
                f"H_t = {h!r} at round t={t}: every H_t must be an integer >= 1",
            )
        table.append(_validate.integer("num_local_steps", int(h)))
    _validate.integer("num_local_steps", sum(table))  # the local-step index is int32
    if len(set(table)) == 1:
        return table[0]
    return LocalSteps(tuple(table))


def growing_local_steps(
    h0: int, power: float, num_rounds: int | None = None, *, total_local_steps: int | None = None
) -> int | LocalSteps:
    """``H_t = ceil(h0 (t + 1)^power)``: the increasing local steps of Levin et al.,
    arXiv:2605.19629 (2026), ``H_t = ceil(H_0 t^gamma_H)`` counted from t = 1 (``power = 0``: ``h0``
    steps every round). ``power`` in ``[0, 4]``. The table covers ``num_rounds`` rounds, or, given
    ``total_local_steps`` instead, the most rounds whose steps add up to at most that many."""
    h0 = _validate.integer("h0", h0)
    power = _validate.real("power", power, 0.0, 4.0)
    if (num_rounds is None) == (total_local_steps is None):
        _validate.fail("num_rounds", num_rounds, "give exactly one of num_rounds and total_local_steps")
    at = lambda t: math.ceil(h0 * (t + 1) ** power - 1e-9)  # noqa: E731 (1e-9: h0 t^0 is h0, not h0 + 1)
    if num_rounds is not None:
        return local_steps([at(t) for t in range(_validate.integer("num_rounds", num_rounds))])
    total = _validate.integer("total_local_steps", total_local_steps, minimum=h0)
    table, used = [], 0
    while used + at(len(table)) <= total:
        table.append(at(len(table)))
        used += table[-1]
    return local_steps(table)


def local_steps_arg(value: Any) -> int | LocalSteps:
    """Validated ``num_local_steps``: an integer ``>= 1``, a :class:`LocalSteps` or a sequence of
    ``H_t`` (:func:`local_steps`)."""
    if isinstance(value, LocalSteps):
        return value
    if callable(value):
        _validate.fail(
            "num_local_steps",
            value,
            "a function of the round needs its horizon: fj.local_steps(fn, num_rounds)",
        )
    if np.ndim(value) == 1 and not isinstance(value, (str, bytes)):
        return local_steps(value)
    return _validate.integer("num_local_steps", value)


def max_local_steps(num_local_steps) -> int:
    """``H`` or ``H_max`` (the steps every round of the kernel has)."""
    return num_local_steps.max if isinstance(num_local_steps, LocalSteps) else int(num_local_steps)


def round_local_steps(num_local_steps, count):
    """``H_t`` of the round at the traced count ``t`` (int32; a constant for an integer H)."""
    if isinstance(num_local_steps, LocalSteps):
        return num_local_steps.at(count)
    return jnp.int32(num_local_steps)


def active_steps(num_local_steps, count):
    """``(H_max,) bool``: which of the kernel's steps round t runs (``h < H_t``); None for an
    integer H (every step)."""
    if not isinstance(num_local_steps, LocalSteps):
        return None
    return jnp.arange(num_local_steps.max, dtype=jnp.int32) < num_local_steps.at(count)


def total_local_steps(num_local_steps, num_rounds: int) -> int:
    """Local steps of the first ``num_rounds`` rounds (``T H`` for an integer H)."""
    if isinstance(num_local_steps, LocalSteps):
        return num_local_steps.total(num_rounds)
    return int(num_rounds) * int(num_local_steps)


def rounds_within(num_local_steps, total: int) -> int:
    """The most rounds whose local steps add up to at most ``total`` (``total // H`` for an integer
    H; for a table, at most its length)."""
    if not isinstance(num_local_steps, LocalSteps):
        return int(total) // int(num_local_steps)
    return int(np.searchsorted(np.cumsum(num_local_steps.table), int(total), side="right"))


def check_horizon(config, num_rounds: int) -> None:
    """Refuse a run longer than its table of local steps (every field of ``config`` that is a
    :class:`LocalSteps`)."""
    H = getattr(config, "num_local_steps", 1)
    if isinstance(H, LocalSteps) and num_rounds > H.num_rounds:
        _validate.fail(
            "num_rounds",
            num_rounds,
            f"the table of local steps H_t covers {H.num_rounds} rounds; build it for at least "
            f"{num_rounds} (fj.local_steps(fn, num_rounds), fj.growing_local_steps(h0, power, num_rounds))",
        )
