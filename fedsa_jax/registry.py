"""The built-in algorithms, problems and quantizers by name, each with the options it reads.

Each factory's file registers it once, beside the factory::

    register_algorithm("fedlsa", _from_options, options=(LOCAL_STEPS, SKIP), title="FedLSA")

An :class:`Option` is everything the command line and sweep files need to know about one
setting: its flag, how text is checked and converted, its default and help, whether a sweep
grid may vary it, and the library parameters it feeds (so that a library error
``num_states=1 is invalid`` is reported as ``--states=1 is invalid``). The command line builds
its parser, its sweep-file keys and grid axes, its "read only with" checks and its figure titles
from these entries, and names no algorithm itself. A new algorithm registers in its own file and
appears on the command line with its options.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "Entry",
    "Option",
    "algorithms",
    "problems",
    "quantizers",
    "register_algorithm",
    "register_problem",
    "register_quantizer",
    "positive_int",
    "nonnegative_int",
    "real",
    "positive_real",
    "discount",
    "seed",
    "seed_list",
    "LOCAL_STEPS",
    "SKIP",
    "STATES",
    "SAMPLING",
    "HETEROGENEITY",
    "ACTIONS",
    "BRANCHING",
    "TEMPERATURE",
    "GENERATION_SEEDS",
    "GAMMA",
]

XLA_FLAG = "xla_force_host_platform_device_count"  # JAX's CPU device count (fedsa_jax.cpu, --cpu-devices)
SEED_MAX = 2**32 - 1  # larger seeds collide in 32-bit mode (JAX keeps the low 32 bits)


# --- how option text is checked and converted (argparse types; sweep files use them too) -------------------


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {SEED_MAX}], got {text!r}")
    return value


def name_or_number(text: str, names: tuple[str, ...], accept, expected: str):
    """``text`` if it is one of ``names``, else a float that ``accept`` takes."""
    if text in names:
        return text
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not accept(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def law_spec(text: str, laws: dict, expected: str) -> str:
    """``none`` or ``LAW:NUMBERS`` with ``laws[LAW]`` numbers (None: any), checked for its form (the
    values are checked by the library when the law is built)."""
    if text == "none":
        return text
    law, sep, rest = text.partition(":")
    try:
        values = [float(v) for v in rest.split(",")] if sep else []
    except ValueError:
        values = []
    count = laws.get(law, -1)
    if not values or count == -1 or (count is not None and len(values) != count):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return text


def nonnegative_real(text: str) -> float:
    return name_or_number(text, (), lambda v: v >= 0.0, "a finite real number >= 0")  # pyright: ignore[reportReturnType]


def real(text: str) -> float:
    return name_or_number(text, (), lambda v: True, "a finite real number")  # pyright: ignore[reportReturnType]


def positive_real(text: str) -> float:
    return name_or_number(text, (), lambda v: v > 0.0, "a finite real number > 0")  # pyright: ignore[reportReturnType]


def discount(text: str) -> float:
    return name_or_number(text, (), lambda v: 0.0 <= v < 1.0, "a number in [0, 1)")  # pyright: ignore[reportReturnType]


def seed_list(text: str) -> str:
    """Comma-separated nonnegative integers, as the text ``"0,1"`` (spaces and leading zeros dropped, so
    that equal lists are equal option values)."""
    parts = [t.strip() for t in text.split(",")]
    if not all(t.isascii() and t.isdigit() for t in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 (e.g. 0,1), got {text!r}")
    return ",".join(str(int(t)) for t in parts)


# --- options and entries -----------------------------------------------------------------------------------

# an option's ``group``: its section of ``fedsa-jax run --help``, in this order, with these titles
GROUPS = {
    "problem": "problem",
    "algorithms": "algorithms",
    "schedule": "step sizes, server optimizer, averaging (every built-in algorithm)",
    "channel": "uplink channel (every built-in algorithm)",
    "inference": "confidence sets for theta* from one run (multiplier bootstrap, plug-in)",
    "simulation": "simulation",
}


@dataclasses.dataclass(frozen=True)
class Option:
    """One command-line option (and sweep-file key ``dest``).

    ``flags``: its spellings (the first names it in messages); ``group``: its ``--help`` section
    (problem, algorithms, schedule, channel, simulation); ``params``: the library parameters it
    feeds; ``grid``: whether a sweep's ``[grid]`` may vary it; ``read_by``: who reads it, for the
    message refusing it where nothing does (default: the entries that list it); ``plugins``: a
    ``module:factory`` algorithm may read it too; ``needs``: ``(dest, laws)``, read only where the
    option ``dest`` names one of these laws (the text before its ``:``), as ``--local-work-shared``
    needs a random ``--local-work``."""

    flags: tuple[str, ...]
    dest: str
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple | None = None
    metavar: str | None = None
    action: Any = None
    group: str = "simulation"
    params: tuple[str, ...] = ()
    grid: bool = True
    read_by: str | None = None
    plugins: bool = False
    needs: tuple[str, tuple[str, ...]] | None = None


@dataclasses.dataclass(frozen=True)
class Entry:
    """A registered algorithm, problem or quantizer.

    ``build``: algorithm ``(step_size, args, **channel) -> Algorithm``, problem ``(key, args) ->
    Problem``, quantizer ``(args) -> Quantizer | None``, where ``args`` holds the options by ``dest``;
    ``options``: the entry-specific options it reads; ``title``: its name in figures and printed
    lines; ``caption``: a function of ``args`` adding to a figure's title; ``bias``: the name of a
    :mod:`fedsa_jax.theory` function ``(problem, step_size, num_local_steps) -> bias`` whose squared
    norm the command line reports as a reference line; ``note``: a remark after its name in ``--help``;
    ``order``: its place in lists (then registration order); ``default``: run when no
    algorithm is named."""

    kind: str
    name: str
    build: Callable
    options: tuple[Option, ...] = ()
    title: str = ""
    caption: Callable | None = None
    bias: str | None = None
    note: str = ""
    order: int = 100
    default: bool = False

    def reads(self, dest: str) -> bool:
        return any(o.dest == dest for o in self.options)


_ENTRIES: dict[str, dict[str, Entry]] = {"algorithm": {}, "problem": {}, "quantizer": {}}


def _register(kind: str, name: str, build: Callable, **fields) -> Entry:
    entry = Entry(kind, name, build, **fields)
    table = _ENTRIES[kind]
    if name in table and table[name] != entry:
        raise ValueError(f"{kind}={name!r} is invalid: already registered")
    table[name] = entry
    return entry


def register_algorithm(name: str, build: Callable, **fields) -> Entry:
    return _register("algorithm", name, build, **fields)


def register_problem(name: str, build: Callable, **fields) -> Entry:
    return _register("problem", name, build, **fields)


def register_quantizer(name: str, build: Callable, **fields) -> Entry:
    return _register("quantizer", name, build, **fields)


def _listed(kind: str) -> dict[str, Entry]:
    table = _ENTRIES[kind]
    ranked = sorted(enumerate(table.values()), key=lambda item: (item[1].order, item[0]))
    return {entry.name: entry for _, entry in ranked}


def algorithms() -> dict[str, Entry]:
    return _listed("algorithm")


def problems() -> dict[str, Entry]:
    return _listed("problem")


def quantizers() -> dict[str, Entry]:
    return _listed("quantizer")


# --- options that several entries read (declared once) -----------------------------------------------------

LOCAL_STEPS = Option(
    ("--local-steps", "-H"),
    "local_steps",
    "local steps H per round",
    positive_int,
    1000,
    group="algorithms",
    params=("num_local_steps",),
    plugins=True,
    read_by="algorithms with local steps (qfedtd takes one step per round)",
)
LOCAL_STEPS_GROWTH = Option(
    ("--local-steps-growth",),
    "local_steps_growth",
    "local steps that grow with the round: H_t = ceil(H (t + 1)^GAMMA), H from --local-steps "
    "(default 0: H every round)",
    real,
    0.0,
    metavar="GAMMA",
    group="algorithms",
    params=("power",),
    plugins=True,
    read_by="algorithms with local steps (qfedtd takes one step per round)",
)


def shared_flag(name: str, what: str, read_by: str, laws: tuple[str, ...]) -> Option:
    """``--NAME-shared``: one random count drawn each round for every agent (read with a random law)."""
    return Option(
        (f"--{name.replace('_', '-')}-shared",),
        f"{name}_shared",
        f"one random {what} drawn each round for every agent (default: one per agent)",
        action="store_true",
        default=False,
        group="algorithms",
        params=("shared",),
        grid=False,
        read_by=read_by,
        needs=(name, laws),
    )


SKIP = Option(
    ("--skip",),
    "skip",
    "keep one observation out of SKIP (Markovian sampling)",
    positive_int,
    1,
    group="algorithms",
    params=("skip",),
)
HETEROGENEITY = Option(
    ("--heterogeneity",),
    "heterogeneity",
    "garnet, gaussian and sarsa-garnet: 'homogeneous', 'heterogeneous' or a level in "
    "[0, 1] (gaussian, sarsa-garnet: homogeneous = 0, heterogeneous = 1)",
    lambda text: name_or_number(
        text,
        ("homogeneous", "heterogeneous"),
        lambda v: 0.0 <= v <= 1.0,
        "'homogeneous', 'heterogeneous' or a number in [0, 1]",
    ),
    "heterogeneous",
    group="problem",
    params=("heterogeneity",),
)
STATES = Option(
    ("--states",),
    "states",
    "number of states S (garnet default 30, qfedtd-mdp default 20, sarsa-garnet default 10, q-learning 2)",
    positive_int,
    None,
    group="problem",
    params=("num_states",),
)
SAMPLING = Option(
    ("--sampling",),
    "sampling",
    "observation model (garnet default generative, qfedtd-mdp default markov; q-learning: generative is "
    "synchronous, markov (default) asynchronous)",
    choices=("generative", "markov"),
    group="problem",
    params=("sampling",),
)
# federated SARSA's control Garnet (sarsa-garnet)
ACTIONS = Option(
    ("--actions",),
    "actions",
    "number of actions A (sarsa-garnet default 3, q-learning default 2)",
    positive_int,
    None,
    group="problem",
    params=("num_actions",),
)
BRANCHING = Option(
    ("--branching",),
    "branching",
    "sarsa-garnet: next states that each state-action pair reaches, at most S",
    positive_int,
    2,
    group="problem",
    params=("branching",),
)
TEMPERATURE = Option(
    ("--temperature",),
    "temperature",
    "SARSA problems: temperature tau > 0 of the softmax policy, pi(a|s) proportional to exp(Q(s, a) / tau) "
    "(small: nearly greedy)",
    positive_real,
    2.0,
    metavar="TAU",
    group="problem",
    params=("temperature",),
)
GENERATION_SEEDS = Option(
    ("--generation-seeds",),
    "generation_seeds",
    "sarsa-garnet: comma-separated seeds of the generated MDPs, one MDP each; agent c runs on the "
    "seed c mod their count",
    seed_list,
    "0,1",
    metavar="SEEDS",
    group="problem",
    params=("generation_seeds",),
)
GAMMA = Option(
    ("--gamma",),
    "gamma",
    "discount factor gamma in [0, 1) (sarsa-garnet, q-learning and the classic-control problems default 0.9)",
    discount,
    None,
    group="problem",
    params=("gamma",),
)
