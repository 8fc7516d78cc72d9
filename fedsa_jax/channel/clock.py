"""A simulated clock: how long an agent's job (download, H local steps, upload) takes.

Time runs in integer ticks. Each time agent c starts a job it takes ``D_c`` ticks, drawn from a law
with bounded support ``{1, ..., D_max}``, independently of everything else (of the state, the
observations, the other agents and its own earlier jobs); one law for every agent, or one per agent
(agents of different speeds):

* :func:`fixed` ``(D)`` or ``([D_1, ..., D_N])``: every job of agent c takes ``D_c`` ticks;
* :func:`uniform` ``(low, high)``: uniform on ``{low, ..., high}``;
* :func:`geometric` ``(mean, max)``: geometric on ``{1, 2, ...}`` with the given mean (one, or one per
  agent), conditioned on ``<= max`` (the discrete clock's memoryless law, as exponential times are
  in continuous time);
* :func:`straggler` ``(D, prob, slowdown)``: ``D`` ticks, except with probability ``prob`` a
  straggler's ``ceil(slowdown D)``;
* :func:`law` ``(pmf)``: ``P(D = k)`` for ``k = 1..D_max``, one row or one per agent.

Pass one as ``durations=`` of :func:`~fedsa_jax.fedbuff` (buffered asynchronous aggregation). A
synchronous round, where the server waits for every agent, lasts ``max_c D_c`` ticks; its expected
length :meth:`Durations.sync_round_time` is ``sum_{k >= 1} (1 - prod_c P(D_c < k))``, what
"synchronous rounds at equal wall-clock" are compared with.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

import jax
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.channel.local_work import (
    CountLaw,
    check_table,
    counts_law,
    fixed_pmf,
    from_option,
    geometric_pmf,
    probability,
    two_point_pmf,
    uniform_pmf,
)
from fedsa_jax.registry import Option, law_spec

__all__ = ["Durations", "fixed", "from_text", "geometric", "law", "straggler", "uniform"]

CLOCK_STREAM = 0x636C6B  # fold_in tag of the round's clock key ("clk"): a stream of its own


@dataclasses.dataclass(frozen=True)
class Durations(CountLaw):
    """A law of the agents' job durations in ticks (hashable, compared by value): ``pmf[c][k - 1] =
    P(D_c = k)``, ``k = 1..D_max``; one row or one per agent."""

    first = 1
    argument = "durations"

    @property
    def max(self) -> int:
        """``D_max``: the longest job."""
        return self.largest

    def mean_durations(self, num_agents: int) -> np.ndarray:
        """``E[D_c]`` per agent, ``(N,)``."""
        return self.mean_counts(num_agents)

    def sync_round_time(self, num_agents: int) -> float:
        """``E[max_c D_c]``: the expected length of a synchronous round (the server waits for all N
        agents, each drawing a duration)."""
        cdf = np.cumsum(self.table(num_agents), axis=1)  # P(D_c <= k), k = 1..D_max
        below = np.concatenate([np.zeros(1), np.prod(cdf, axis=0)[:-1]])  # P(max < k)
        return float(np.sum(1.0 - below))

    def check_ticks(self, num_rounds: int, x64: bool | None = None) -> None:
        """Refuse a run of ``num_rounds`` server steps whose ticks could pass ``2^31 - 1`` in int32
        (JAX without x64; ``x64`` None: JAX's setting). Every agent is always busy, so each finishes a
        job at least every ``D_max`` ticks: the n-th arrival comes by tick ``ceil(n / N) D_max``, the
        ``T K <= T N`` arrivals of T server steps by ``T D_max``, and the jobs then running end by
        ``(T + 1) D_max``. With x64 the ticks are int64."""
        if x64 is None:
            x64 = bool(jax.config.jax_enable_x64)  # pyright: ignore[reportAttributeAccessIssue]
        ticks = (num_rounds + 1) * self.max
        if not x64 and ticks > _validate.INDEX_MAX:
            _validate.fail(
                "durations",
                self.name,
                f"(num_rounds + 1) x D_max = ({num_rounds} + 1) x {self.max} = {ticks} ticks may pass "
                f"2^31 - 1, the int32 clock's largest tick: enable int64 ticks with "
                "jax.config.update('jax_enable_x64', True), or run fewer rounds or shorter jobs",
            )

    def throughput(self, num_agents: int) -> float:
        """Jobs finished per tick in the long run, every agent always busy: ``sum_c 1 / E[D_c]``
        (renewal theorem); FedBuff with buffer K makes ``throughput / K`` server updates per tick."""
        return float(np.sum(1.0 / self.mean_durations(num_agents)))


def _make(pmf, name: str) -> Durations:
    return counts_law(Durations, pmf, name, False)


def from_text(text: str, num_agents: int | None = None) -> Durations:
    """The law of the command line's ``--durations LAW:NUMBERS``, for ``num_agents`` agents where
    given; refusals name ``durations``."""

    def build(name: str, values: list[Any]) -> Durations:
        if name == "fixed":
            return fixed(values if len(values) > 1 else values[0])
        if name == "uniform":
            return uniform(values[0], values[1])
        if name == "geometric":
            return geometric(float(values[0]), values[1])
        return straggler(values[0], float(values[1]), float(values[2]))

    return from_option("durations", text, build, num_agents)


def law(pmf) -> Durations:
    """Any bounded law: ``pmf[k - 1] = P(D = k)`` for ``k = 1..D_max`` (one row, or one per agent)."""
    return _make(pmf, "law")


def fixed(durations) -> Durations:
    """Every job of agent c takes ``durations[c]`` ticks (one integer ``>= 1`` for every agent, or one
    per agent)."""
    values = [durations] if np.ndim(durations) == 0 else durations
    return _make(fixed_pmf(values, "durations"), "fixed")


def uniform(low: int, high: int) -> Durations:
    """Durations uniform on ``{low, ..., high}`` ticks (``1 <= low <= high``)."""
    return _make(uniform_pmf(low, high), "uniform")


def geometric(mean, max: int) -> Durations:
    """Durations geometric on ``{1, 2, ...}`` with mean ``mean`` (one real ``>= 1``, or one per agent),
    conditioned on ``<= max``."""
    return _make(geometric_pmf(mean, max), "geometric")


def straggler(duration: int, prob: float, slowdown: float) -> Durations:
    """``duration`` ticks, except with probability ``prob`` (each job) ``ceil(slowdown * duration)``
    (``slowdown >= 1``)."""
    D = _validate.integer("duration", duration)
    p = probability("prob", prob)
    if not isinstance(slowdown, (int, float)) or not math.isfinite(slowdown) or slowdown < 1:
        _validate.fail("slowdown", slowdown, "expected a real number >= 1")
    slow = math.ceil(slowdown * D)  # an exact Python int, however large
    check_table("duration" if slowdown == 1 else "slowdown", duration if slowdown == 1 else slowdown, 1, slow)
    return _make(two_point_pmf(D, slow, p), "straggler")


DURATION_LAWS = {"fixed": None, "uniform": 2, "geometric": 2, "straggler": 3}


def durations_spec(text: str) -> str:
    """``--durations``: ``LAW:NUMBERS`` (:mod:`fedsa_jax.channel.clock`)."""
    expected = "fixed:D or fixed:D1,...,DN, uniform:LOW,HIGH, geometric:MEAN,MAX or straggler:D,PROB,SLOWDOWN"
    if text == "none":
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return law_spec(text, DURATION_LAWS, expected)


DURATIONS = Option(
    ("--durations",),
    "durations",
    "the agents' job durations in clock ticks: fixed:D (or fixed:D1,...,DN, one per agent), "
    "uniform:LOW,HIGH, geometric:MEAN,MAX or straggler:D,PROB,SLOWDOWN",
    durations_spec,
    "fixed:1",
    metavar="LAW",
    group="algorithms",
    params=("durations",),
)
