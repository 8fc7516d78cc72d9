"""Heterogeneous and random local work: agent c runs ``H_{c,t}`` local steps in round t.

In lockstep every agent runs the same H local steps every round. Here agent c's count
``H_{c,t}`` in ``{1, ..., H_max}`` is fixed per agent, or drawn each round from a law with bounded
support, independently of the state and of the observations (per agent, or one draw shared by every
agent):

* :func:`fixed` ``([H_1, ..., H_N])``: agent c always runs ``H_c`` steps;
* :func:`uniform` ``(low, high)``: uniform on ``{low, ..., high}``;
* :func:`geometric` ``(mean, max)``: geometric on ``{1, 2, ...}`` with the given mean, truncated
  (conditioned) to ``{1, ..., max}``;
* :func:`straggler` ``(H, prob, fraction)``: ``H`` steps, except with probability ``prob`` the agent
  is a straggler and finishes only ``ceil(fraction H)`` of them;
* :func:`law` ``(pmf)``: any law, a table ``P(H_c = h)`` for ``h = 1..H_max`` (one row, or one per
  agent).

Pass one as ``num_local_steps`` of :func:`~fedsa_jax.fedlsa` or :func:`~fedsa_jax.scafflsa`:
``fj.fedlsa(0.1, fj.local_work.uniform(1, 10))``. The compiled round runs ``H_max`` steps for every
agent, agent c's steps past ``H_{c,t}`` at step size 0 (under Markov sampling its chain moves only
on the steps it runs); the counts report the observations actually drawn, ``sum_c H_{c,t}`` per
round. A law whose every agent runs the same fixed H is that integer H: the same kernel and the same
numbers as ``num_local_steps=H``.

**Aggregation.** With ``normalization="none"`` the server averages the agents' updates as they are
(plain averaging): agent c's update carries the weight of its ``H_c`` steps, and the fixed point
moves to that of the H_c-weighted problem (objective inconsistency; Wang et al., "Tackling the
objective inconsistency problem in heterogeneous federated optimization", NeurIPS 2020). In error
coordinates the mean round is ``E e_{t+1} = Gamma_bar E e_t + rho_bar`` with
``Gamma_c = E (I - eta A_c)^{H_c}``, ``Gamma_bar = mean_c Gamma_c``, and the limit

    theta_inf = [sum_c (I - Gamma_c)]^{-1} sum_c (I - Gamma_c) theta_c*
              = theta_H - eta P^{-1} sum_c E[H_c (H_c - 1) / 2] A_c (b_c - A_c theta_H) + O(eta^2),
    theta_H   = P^{-1} sum_c E[H_c] b_c,   P = sum_c E[H_c] A_c,

so ``theta_H - theta* = P^{-1} sum_c (E H_c - mean_j E H_j)(b_c - A_c theta*)`` does not vanish as
``eta -> 0`` (:func:`fedsa_jax.theory.fedlsa_bias` with the law). With ``normalization="fednova"`` each agent
sends its update divided by its own ``H_c`` and the server multiplies the average by
``tau = mean_c E[H_c]`` (FedNova's normalised averaging, Wang et al. 2020, Eq. (6), with the expected
``tau``: the realised one for fixed counts, a constant for random ones, so that agents' weights stay
independent). The ``H_c`` weighting goes, and what is left is FedLSA's heterogeneity bias with
``(H - 1) / 2`` moved inside the sum:

    theta_inf - theta* = -eta [sum_c A_c]^{-1} sum_c (E[H_c] - 1) / 2 A_c^2 (theta_c* - theta*) + O(eta^2).

The exact mean and second moments of both are those of :func:`fedsa_jax.moments.random_stop` (a
round is a mixture over each agent's count), under i.i.d. sampling; for SCAFFLSA with fixed counts
or FedNova's normalisation (plain averaging with random counts is refused: not linear in the state).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate, moments, optim
from fedsa_jax.registry import Option, law_spec, shared_flag

__all__ = ["CountLaw", "LocalWork", "fixed", "from_text", "geometric", "law", "straggler", "uniform"]

NORMALIZATIONS = ("none", "fednova")
WORK_STREAM = 0x776B  # fold_in tag of the round's local-work key ("wk"): a stream of its own
# The most probabilities a law's table may hold (agents' rows x counts): 2^24, 128 MiB in float64. The
# compiled round runs H_max steps, the state keeps tau_max iterates, the clock a table of D_max: a
# larger support is a typo (or a law no run could use), refused before the table is allocated.
MAX_LAW_TABLE = 2**24


def check_table(name: str, value: Any, rows: int, largest: int) -> None:
    """Refuse a law whose table of ``rows x largest`` probabilities exceeds :data:`MAX_LAW_TABLE`,
    naming the parameter ``name`` that set it (shown as ``value``), before anything is allocated."""
    _validate.table_size(
        name,
        value,
        rows * largest,
        "the law's table (rows x counts)",
        MAX_LAW_TABLE,
        f"2^24 = {MAX_LAW_TABLE} (one probability per count: a support this long is no law a run can use)",
    )


@dataclasses.dataclass(frozen=True)
class CountLaw:
    """A law of a small count per agent and round, drawn independently of the state (a static part of
    a configuration: hashable, compared by value). ``pmf[c][k] = P(count_c = first + k)``: one row
    (every agent's law) or one per agent; ``shared``: one count drawn per round for every agent (one
    row only). The local work's counts start at 1 (:class:`LocalWork`), delays at 0
    (:class:`fedsa_jax.channel.delays.Delays`)."""

    pmf: tuple[tuple[float, ...], ...]
    shared: bool = False
    name: str = "law"

    first: ClassVar[int] = 1  # the smallest count
    argument: ClassVar[str] = "num_local_steps"  # the parameter that takes it, for messages

    @property
    def largest(self) -> int:
        """The largest count with positive probability."""
        return self.first + len(self.pmf[0]) - 1

    def table(self, num_agents: int) -> np.ndarray:
        """``(N, K)`` float64: each agent's ``P(count_c = first + k)``."""
        p = np.asarray(self.pmf, np.float64)
        return np.broadcast_to(p, (num_agents, p.shape[1])).copy()

    @property
    def deterministic(self) -> bool:
        return all(max(row) == 1.0 for row in self.pmf)

    def mean_counts(self, num_agents: int) -> np.ndarray:
        """``E[count_c]`` per agent, ``(N,)``."""
        return self.table(num_agents) @ np.arange(self.first, self.largest + 1)

    def check(self, num_agents: int) -> None:
        """Refuse a table with one row per agent for another number of agents."""
        if len(self.pmf) not in (1, num_agents):
            _validate.fail(
                self.argument,
                f"{self.name} with {len(self.pmf)} agents' laws",
                f"expected one law, or one per agent ({num_agents})",
            )
        check_table(self.argument, self.name, num_agents, len(self.pmf[0]))

    def draw(self, key: jax.Array, num_agents: int) -> jax.Array:
        """``(N,) int32``: this round's counts (inverse CDF of one uniform per agent, or of one shared
        by all)."""
        u = jax.random.uniform(key, (1 if self.shared else num_agents,), jnp.float32)  # any precision mode
        agents = jnp.zeros((1,), jnp.int32) if self.shared else jnp.arange(num_agents, dtype=jnp.int32)
        return jnp.broadcast_to(self.inverse(u, agents, num_agents), (num_agents,))

    def inverse(self, u: jax.Array, agents: jax.Array, num_agents: int) -> jax.Array:
        """``int32`` counts of the given ``agents`` from uniforms ``u`` in ``[0, 1)`` (same shape): the
        inverse CDF of each agent's law (float32 comparisons whatever the precision mode)."""
        cdf = jnp.asarray(np.cumsum(self.table(num_agents), axis=1)[:, :-1], jnp.float32)  # (N, K - 1)
        idx = jnp.sum(u[..., None] >= cdf[agents], axis=-1).astype(jnp.int32)
        return self.first + idx

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"law": self.name, "pmf": [list(r) for r in self.pmf]}
        if self.shared:
            out["shared"] = True
        return out


def counts_law(cls, pmf, name: str, shared: bool, **fields):
    """A :class:`CountLaw` of class ``cls`` from a checked table ``pmf`` (rows normalised to sum to
    1, impossible counts past the last possible one dropped)."""
    if not isinstance(shared, bool):
        _validate.fail("shared", shared, "expected True or False")
    try:
        p = np.asarray(pmf, np.float64)
    except (TypeError, ValueError):
        p = np.zeros((0,))
    if p.ndim not in (1, 2) or p.size == 0:
        _validate.fail("pmf", pmf, "expected a table of probabilities, one row or one per agent")
    p = np.atleast_2d(p)
    check_table("pmf", pmf, p.shape[0], p.shape[1])
    if not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(p.sum(axis=1) <= 0):
        _validate.fail("pmf", pmf, "expected finite probabilities >= 0, each row with a positive sum")
    p = p / p.sum(axis=1, keepdims=True)
    p = p[:, : int(np.max(np.nonzero(p.any(axis=0))[0])) + 1]  # no trailing impossible counts
    if shared and p.shape[0] != 1:
        _validate.fail("shared", shared, "a shared count needs one law for every agent, not one per agent")
    rows = tuple(tuple(float(x) for x in r) for r in p)
    return cls(rows, shared and max(rows[0]) < 1.0, name, **fields)


@dataclasses.dataclass(frozen=True)
class LocalWork(CountLaw):
    """A law of the local step counts: ``pmf[c][h - 1] = P(H_c = h)`` for ``h = 1..H_max``;
    ``normalization``: ``"none"`` (plain averaging) or ``"fednova"``."""

    normalization: str = "none"

    @property
    def max(self) -> int:
        """``H_max``: the steps every round of the compiled kernel has."""
        return self.largest

    def mean_steps(self, num_agents: int) -> np.ndarray:
        """``E[H_c]`` per agent, ``(N,)``."""
        return self.mean_counts(num_agents)

    def tau(self, num_agents: int) -> float:
        """FedNova's ``tau = mean_c E[H_c]``."""
        return float(np.mean(self.mean_steps(num_agents)))

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.normalization != "none":
            out["normalization"] = self.normalization
        return out


def _make(pmf, name: str, shared: bool, normalization: str) -> LocalWork | int:
    if normalization not in NORMALIZATIONS:
        _validate.fail("normalization", normalization, f"expected one of {NORMALIZATIONS}")
    out = counts_law(LocalWork, pmf, name, shared, normalization=normalization)
    if len(set(out.pmf)) == 1 and out.deterministic:  # every agent runs the same fixed H: lockstep
        return out.max
    return out


def fixed_pmf(values, name: str = "steps") -> np.ndarray:
    """``(N, max)`` table of a fixed count per agent: ``values`` one integer ``>= 1`` per agent."""
    if np.ndim(values) != 1 or len(values) == 0:
        _validate.fail(name, values, "expected one integer >= 1 per agent")
    H = [_validate.integer(f"{name}[{c}]", h) for c, h in enumerate(values)]
    check_table(name, values, len(H), max(H))
    pmf = np.zeros((len(H), max(H)))
    pmf[np.arange(len(H)), np.asarray(H) - 1] = 1.0
    return pmf


def uniform_pmf(low: int, high: int) -> np.ndarray:
    """Uniform on ``{low, ..., high}`` (``1 <= low <= high``), as a row ``P(count = 1..high)``."""
    lo = _validate.integer("low", low)
    hi = _validate.integer("high", high, minimum=lo)
    check_table("high", high, 1, hi)
    pmf = np.zeros(hi)
    pmf[lo - 1 :] = 1.0
    return pmf


def geometric_pmf(mean, max: int) -> np.ndarray:
    """Geometric on ``{1, 2, ...}`` with mean ``mean >= 1`` (one, or one per agent: one row each),
    conditioned on ``<= max``."""
    means = np.atleast_1d(np.asarray(mean, dtype=object))
    if (
        means.ndim != 1
        or means.size == 0
        or not all(isinstance(m, (int, float)) and math.isfinite(m) and m >= 1 for m in means)
    ):
        _validate.fail("mean", mean, "expected a real number >= 1 (or one per agent)")
    H = _validate.integer("max", max)
    check_table("max", max, means.size, H)
    h = np.arange(1, H + 1)
    rows = [(1.0 / float(m)) * (1 - 1.0 / float(m)) ** (h - 1) for m in means]
    return rows[0] if np.ndim(mean) == 0 else np.asarray(rows)


def probability(name: str, value) -> float:
    """``value`` checked to be a probability in ``[0, 1]``."""
    if not isinstance(value, (int, float)) or not 0 <= value <= 1:
        _validate.fail(name, value, "expected a probability in [0, 1]")
    return float(value)


def two_point_pmf(usual: int, other: int, prob: float) -> np.ndarray:
    """``usual`` with probability ``1 - prob``, ``other`` with probability ``prob``, as a row."""
    pmf = np.zeros(max(usual, other))
    pmf[usual - 1] += 1 - prob
    pmf[other - 1] += prob
    return pmf


_Law = TypeVar("_Law")


def from_option(
    option: str, text: str, build: Callable[[str, list], _Law], num_agents: int | None = None
) -> _Law:
    """The law ``build(name, numbers)`` of a command-line text ``NAME:NUMBERS`` (its form checked by
    the parser), checked for ``num_agents`` agents where given. Any refusal of its numbers is one
    line under ``option``, the parameter the command line reports under its flag or grid key, with
    the text and the law's own reason: ``delays='fixed:-1' is invalid: tau=-1: expected ...``."""
    name, _, rest = text.partition(":")
    try:
        out = build(name, [int(x) if x.is_integer() else x for x in (float(v) for v in rest.split(","))])
        if isinstance(out, CountLaw) and num_agents is not None:
            out.check(num_agents)
        return out
    except ValueError as err:
        _validate.fail(option, text, str(err).replace(" is invalid: ", ": ", 1))


def from_text(
    text: str, steps: int, shared: bool = False, normalization: str = "none", num_agents: int | None = None
) -> LocalWork | int:
    """The law of the command line's ``--local-work LAW:NUMBERS`` (``straggler:PROB,FRACTION`` of
    ``steps``), for ``num_agents`` agents where given: ``fixed:H1,...,HN`` has one count, or one per
    agent. Refusals name ``local_work``."""

    def build(name: str, values: list):
        if name == "fixed":
            if num_agents is not None and len(values) not in (1, num_agents):
                _validate.fail(
                    "steps",
                    text.partition(":")[2],
                    f"expected one count, or one per agent (N = {num_agents})",
                )
            return fixed(values, normalization)
        if name == "uniform":
            return uniform(*values, shared=shared, normalization=normalization)
        if name == "geometric":
            return geometric(float(values[0]), values[1], shared, normalization)
        return straggler(steps, values[0], values[1], shared, normalization)

    return from_option("local_work", text, build, num_agents)


def law(pmf, shared: bool = False, normalization: str = "none") -> LocalWork | int:
    """Any law with bounded support: ``pmf[h - 1] = P(H_c = h)`` for ``h = 1..H_max`` (a row for every
    agent, or an ``(N, H_max)`` table, one row per agent); normalised to sum to 1."""
    return _make(pmf, "law", shared, normalization)


def fixed(steps, normalization: str = "none") -> LocalWork | int:
    """Agent c runs ``steps[c]`` local steps every round (integers ``>= 1``)."""
    return _make(fixed_pmf(steps), "fixed", False, normalization)


def uniform(low: int, high: int, shared: bool = False, normalization: str = "none") -> LocalWork | int:
    """``H_c`` uniform on ``{low, ..., high}`` each round (``1 <= low <= high``)."""
    return _make(uniform_pmf(low, high), "uniform", shared, normalization)


def geometric(mean: float, max: int, shared: bool = False, normalization: str = "none") -> LocalWork | int:
    """``H_c`` geometric on ``{1, 2, ...}`` with mean ``mean`` (success probability ``1 / mean``),
    conditioned on ``H_c <= max``."""
    if np.ndim(mean) != 0:
        _validate.fail("mean", mean, "expected a real number >= 1")
    return _make(geometric_pmf(mean, max), "geometric", shared, normalization)


def straggler(
    steps: int, prob: float, fraction: float, shared: bool = False, normalization: str = "none"
) -> LocalWork | int:
    """``steps`` local steps, except with probability ``prob`` (each round, each agent) a straggler's
    ``ceil(fraction * steps)`` (at least 1)."""
    H = _validate.integer("steps", steps)
    p = probability("prob", prob)
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        _validate.fail("fraction", fraction, "expected a real number in (0, 1]")
    check_table("steps", steps, 1, H)
    slow = max(1, math.ceil(fraction * H))
    return _make(two_point_pmf(H, slow, p), "straggler", shared, normalization)


def round_work(rand, config, problem) -> jax.Array | None:
    """This round's local step counts ``H_{c,t}`` ``(N,) int32`` (:mod:`fedsa_jax.channel.local_work`), or
    None in lockstep."""
    work = getattr(config, "local_work", None)
    return None if work is None else work.draw(rand.work, problem.num_agents)


def work_weights(counts: jax.Array | None, weights, num_steps: int, dtype):
    """The multipliers of the agents' local updates ``(N, H_max)``: 1 on agent c's first ``H_c``
    steps, 0 past them, times the bootstrap's ``weights`` where given; ``weights`` in lockstep."""
    if counts is None:
        return weights
    mask = (jnp.arange(num_steps, dtype=jnp.int32)[None, :] < counts[:, None]).astype(dtype)
    return mask if weights is None else weights * mask


def control_denominator(config, etas, counts: jax.Array | None):
    """SCAFFLSA's control-variate denominator: ``sum_h eta_h`` over the round's steps in lockstep;
    under local work each agent's own ``D_c = sum_{h < H_c} eta_h`` ``(N, 1)`` (plain averaging),
    or ``tau mean_h eta_h`` (FedNova: the messages are normalised to ``tau / H_c`` times the update,
    :mod:`fedsa_jax.channel.local_work`)."""
    H = config.num_local_steps
    if counts is None:
        return optim.round_step_sum(etas, H)
    steps = jnp.broadcast_to(etas, (optim.max_local_steps(H),))
    if config.local_work.normalization == "fednova":
        return config.local_work.tau(counts.shape[0]) * jnp.mean(steps)
    mask = jnp.arange(steps.shape[0], dtype=jnp.int32)[None, :] < counts[:, None]
    return jnp.sum(jnp.where(mask, steps, 0.0), axis=1, keepdims=True)


def normalize_work(config, counts: jax.Array | None, start: jax.Array, local: jax.Array) -> jax.Array:
    """FedNova's normalised updates (``normalization="fednova"``): agent c's update since ``start``
    times ``tau / H_c``, ``tau = mean_c E[H_c]``; ``local`` otherwise."""
    work = getattr(config, "local_work", None)
    if counts is None or work is None or work.normalization == "none":
        return local
    scale = work.tau(local.shape[0]) / counts.astype(local.dtype)
    return start + scale[:, None] * (local - start)


def local_work_theory(y, config, steps: list, reference: str = "theta") -> list:
    """A round's local ``steps`` (phases, one per step) under the config's local work: the steps
    themselves in lockstep, else :func:`fedsa_jax.moments.random_stop` over them with the law of
    ``H_c`` (and FedNova's scaling of each outcome, :func:`fedsa_jax.moments.scale_updates`, from
    ``reference``, the agents' start)."""
    work = getattr(config, "local_work", None)
    if work is None:
        return steps
    work.check(y.N)
    finish = None
    if work.normalization == "fednova":
        tau = work.tau(y.N)
        finish = lambda k: y.memo(  # noqa: E731
            ("fednova", tau, k, reference), lambda: moments.scale_updates(y, tau / (k + 1), reference)
        )
    key = (work, tuple(getattr(s, "eta", None) for s in steps), reference)
    pmf = work.pmf if work.shared else work.table(y.N)  # a shared count: the one law's row
    return [moments.random_stop(y, steps, pmf, work.shared, finish, key=key)]


def stepwise_observations(config, problem) -> bool:
    """Whether a round's observations are drawn one local step at a time (blocks ``(H_max, N,
    ...)``, :meth:`Algorithm.randomness`): local steps that change with the round
    (:class:`fedsa_jax.optim.LocalSteps`) or between agents (:mod:`fedsa_jax.channel.local_work`) under
    Markov sampling, so that a chain moves only on the steps its agent runs."""
    varies = isinstance(getattr(config, "num_local_steps", 1), optim.LocalSteps) or (
        getattr(config, "local_work", None) is not None
    )
    return varies and getattr(problem, "sampling", None) == "markov"


def stepwise_active(config, problem, count, counts=None):
    """The round's active steps where its observations are drawn step by step
    (:func:`stepwise_observations`): ``(H_max,) bool`` (``h < H_t``), or ``(H_max, N)`` with the
    agents' ``counts`` (``h < H_{c,t}``); else None (one block, every step drawn)."""
    if not stepwise_observations(config, problem):
        return None
    if counts is not None:
        return jnp.arange(config.num_local_steps, dtype=jnp.int32)[:, None] < counts[None, :]
    return optim.active_steps(config.num_local_steps, count)


def check(config, num_agents: int) -> None:
    """Refuses a law with one row per agent for another N (called before compiling)."""
    work = getattr(config, "local_work", None)
    if work is not None:
        work.check(num_agents)


def with_round_key(rand, key: jax.Array, config, problem):
    """``rand`` with the key of the round's step counts (``fold_in(key, WORK_STREAM)``) under random
    local work."""
    if getattr(config, "local_work", None) is None:
        return rand
    return rand._replace(work=jax.random.fold_in(key, WORK_STREAM))


LOCAL_WORK_LAWS = {"fixed": None, "uniform": 2, "geometric": 2, "straggler": 2}  # law -> its numbers


def local_work_spec(text: str) -> str:
    """``--local-work``: ``none`` or ``LAW:NUMBERS`` (:mod:`fedsa_jax.channel.local_work`)."""
    expected = "none, fixed:H1,...,HN, uniform:LOW,HIGH, geometric:MEAN,MAX or straggler:PROB,FRACTION"
    return law_spec(text, LOCAL_WORK_LAWS, expected)


LOCAL_WORK = Option(
    ("--local-work",),
    "local_work",
    "heterogeneous or random local work: agent c runs H_c steps a round, fixed:H1,...,HN (one per "
    "agent), uniform:LOW,HIGH, geometric:MEAN,MAX or straggler:PROB,FRACTION (of --local-steps; "
    "default none: H for every agent)",
    local_work_spec,
    "none",
    metavar="LAW",
    group="algorithms",
    params=("local_work",),
    read_by="fedlsa and scafflsa",
)


LOCAL_WORK_SHARED = shared_flag(
    "local_work", "H", "fedlsa and scafflsa", ("uniform", "geometric", "straggler")
)


WORK_NORMALIZATION = Option(
    ("--work-normalization",),
    "work_normalization",
    "how the server weighs unequal local work: none (plain averaging) or fednova (each update "
    "divided by its H_c, the mean times the mean E[H_c])",
    None,
    "none",
    choices=("none", "fednova"),
    group="algorithms",
    params=("normalization",),
    read_by="fedlsa and scafflsa",
    needs=("local_work", tuple(LOCAL_WORK_LAWS)),
)


OPTIONS = (LOCAL_WORK, LOCAL_WORK_SHARED, WORK_NORMALIZATION)  # the command line's options of the laws
