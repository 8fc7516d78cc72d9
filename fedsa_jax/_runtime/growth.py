"""Warnings about runs whose MSE grows: :func:`mse_growth` reads a result's curve (a final MSE far
above its start and its midpoint, not settled), and :func:`settings` names the algorithm's settings
in one line for the warning."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.algorithms._base import Algorithm

__all__ = ["GROWTH_FACTOR", "SETTLED_FACTOR", "Growth", "settings", "mse_growth"]

GROWTH_FACTOR = 100.0  # a final MSE this many times its start, and sqrt(this) times its midpoint: growing


SETTLED_FACTOR = 5.0


class Growth(NamedTuple):
    """A recorded MSE curve that grew by orders of magnitude (:func:`mse_growth`)."""

    start_round: int
    start: float
    middle_round: int
    middle: float
    end_round: int
    end: float
    settled: float | None = None  # not blowing up: the second half's median, far above the start
    base: float = math.nan  # ... and what it is far above: the start, or |theta_star|^2 if larger
    reference: float = math.nan  # |theta_star|^2

    @property
    def factor(self) -> float:
        """``end / start`` (``inf`` from a start at 0)."""
        return _ratio(self.end, self.start)

    def summary(self) -> str:
        """``"grew 3.4e+03x from round 0 to 60"`` (settled: ``"stayed at 13x its start from round 30
        to 60"``): what the command line's console line adds."""
        if self.settled is not None:
            return (
                f"stayed at {self.settled / self.base:.2g}x {self._base_name()} from round "
                f"{self.middle_round} to {self.end_round}"
            )
        return f"grew {self.factor:.2g}x from round {self.start_round} to {self.end_round}"

    def _base_name(self) -> str:
        return "its start" if self.start >= 0.999 * self.base else "|theta_star|^2"  # (equal from 0)

    def note(self) -> str:
        """What the console line adds: ``"the MSE grew ...: blowing up"`` (or ``": settled too high"``)."""
        return f"the MSE {self.summary()}: " + ("too high" if self.settled is not None else "blowing up")

    def message(self, algorithm: Algorithm) -> str:
        """The warning, one line of at most about 500 characters."""
        name = settings(algorithm)
        if self.settled is not None:
            return (
                f"{name}: the MSE {self.summary()} (median {self.settled:.3g}; start {self.start:.3g}, "
                f"|theta_star|^2 {self.reference:.3g}): settled far from theta_star, worse than its start "
                "and the estimate 0. The step size or the local steps H are too large for this problem "
                "(FedBuff: or the staleness damping too weak; privacy: or the noise); no seed diverged."
            )
        return (
            f"{name}: the MSE {self.summary()} ({self.start:.3g} -> {self.end:.3g}, "
            f"{_ratio(self.end, self.middle):.2g}x since round {self.middle_round}): the iterates are "
            "blowing up; result.num_diverged counts only non-finite errors and errors above "
            "divergence_threshold. A smaller step_size, or no error feedback with control variates, may "
            "fix it (fj.theory.max_stable_step_size bounds the step where the exact theory applies)."
        )


def settings(algorithm: Algorithm, width: int = 160) -> str:
    """``"fedbuff (step_size=0.05, num_local_steps=1000, buffer_size=5, durations=straggler, ...)"``: the
    algorithm's name and its settings in a few words for a warning (a law by its name, a quantizer by
    its kind, a table by its length; the exact channel and defaults left out), at most ``width``
    characters. The full description is in the result's ``config``."""
    described = dict(algorithm.describe())
    described.pop("algorithm", None)
    channel = described.pop("channel", None) or {}
    parts = [f"{key}={_brief(value)}" for key, value in described.items() if value not in (None, 1, {})]
    quantizer = (channel.get("quantizer") or {}).get("kind", "identity")
    if quantizer != "identity":
        parts.append(f"quantizer={quantizer}")
    for key in ("error_feedback", "success_prob"):
        if channel.get(key) not in (None, 1.0):
            parts.append(f"{key}={channel[key]}")
    return _validate._clip(f"{algorithm.name} ({', '.join(parts)})", width)


def _brief(value: Any) -> str:
    """A setting in a few characters: a law or quantizer by its name (``straggler shared fednova``), a
    list by its length beyond 4 entries, a nested description by its keys' short forms."""
    if isinstance(value, dict):
        head = next((str(value[k]) for k in ("algorithm", "law", "kind", "name") if k in value), None)
        if head is not None:
            extras = [k for k in ("shared",) if value.get(k)] + [
                str(value[k]) for k in ("normalization",) if value.get(k) not in (None, "none")
            ]
            return " ".join([head, *extras])
        return "{" + ", ".join(f"{k}={_brief(v)}" for k, v in list(value.items())[:3]) + "}"
    if isinstance(value, list | tuple) and len(value) > 4:
        return f"[{len(value)} values]"
    return str(value)


def _ratio(end: float, start: float) -> float:
    return end / start if start > 0 else math.inf


def mse_growth(
    rounds, mse_mean, factor: float = GROWTH_FACTOR, reference: float | None = None
) -> Growth | None:
    """The growth of a recorded MSE curve, or None where it neither grew by orders of magnitude nor
    settled far above its start.

    A curve grows when its last value exceeds ``factor`` times its first (round 0 of the record) and
    ``sqrt(factor)`` times its value at the recorded round nearest the middle of the recorded span
    (a first value of 0, a start at ``theta_star``: ``factor`` times ``reference`` when it is given).
    The second condition keeps a run started at (or near) ``theta_star`` from counting: its MSE rises
    from 0 to its noise floor, and the variance a stable linear recursion accumulates over ``2t``
    rounds is at most about twice what it accumulates over ``t``, while a blow-up at rate ``rho > 1``
    multiplies it by ``rho^t`` over the second half. Needs a recorded round strictly inside the span;
    non-finite values (every seed diverged) never count as growth.

    With ``reference`` (``|theta_star|^2``, the MSE of the estimate 0), a curve that does not blow up
    but whose median over the second half (the records from the middle one on) is ``SETTLED_FACTOR``
    times or more the larger of its first value and ``reference`` (``> 0``) has settled too high
    (``settled``: that median): the run leaves the iterates farther from
    ``theta_star`` than its start and than the estimate 0 (a step or H too large, a FedBuff whose
    stale updates overshoot). A run started at or near ``theta_star`` rises to its noise floor; the
    reference keeps it from counting unless that floor is itself far above ``|theta_star|^2``.
    """
    rounds = np.asarray(rounds, np.float64)
    mse = np.asarray(mse_mean, np.float64)
    if mse.size < 3:
        return None
    middle = int(np.argmin(np.abs(rounds - (rounds[0] + rounds[-1]) / 2)))
    if not 0 < middle < mse.size - 1:
        return None
    start, mid, end = float(mse[0]), float(mse[middle]), float(mse[-1])
    found = (int(rounds[0]), start, int(rounds[middle]), mid, int(rounds[-1]), end)
    # a start at theta_star (MSE 0) says nothing of a scale: the curve must then also pass factor times
    # |theta_star|^2 (a run whose local steps grow with the round rises from 0 faster than sqrt(factor)
    # between its middle and its end, to its noise floor)
    floor = start if start > 0 or reference is None else reference
    if end > factor * floor and end > math.sqrt(factor) * mid:  # False on NaN
        return Growth(*found)
    base = max(start, reference or 0.0)
    level = float(np.median(mse[middle:]))  # the second half: robust to a heavy-tailed last record
    if reference is not None and base > 0 and level >= SETTLED_FACTOR * base:  # False on NaN
        return Growth(*found, settled=level, base=base, reference=reference)
    return None
