"""The run command's options: those of every run (below) and those the registered algorithms,
problems and quantizers read (:mod:`fedsa_jax.registry`), in one list of
:class:`~fedsa_jax.registry.Option` that the parser, the sweep file and the checks all read."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import fedsa_jax.algorithms  # noqa: F401  (these register the built-in algorithms, problems and quantizers)
import fedsa_jax.channel  # noqa: F401
import fedsa_jax.problems  # noqa: F401
from fedsa_jax import registry
from fedsa_jax.channel import downlink, dp, erasures, quantizers
from fedsa_jax.registry import (
    GROUPS,
    Option,
    name_or_number,
    nonnegative_int,
    positive_int,
    positive_real,
    real,
    seed,
)
from fedsa_jax.result import X_AXES

SCHEDULES = ("constant", "inverse-time")
SERVER_OPTIMIZERS = ("none", "sgd", "adam")
_FACTORY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BUILT_IN_CHANNEL = "the built-in algorithms (a factory builds its own channel)"


def algorithm(text: str) -> str:
    name, names = text.strip(), registry.algorithms()
    if name not in names and not _FACTORY_RE.match(name):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(names)} or a factory 'package.module:function', got {text!r}"
        )
    return name


def algorithm_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    known = ", ".join(registry.algorithms())
    if not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list from {known} or 'module:factory', got {text!r}"
        )
    try:
        return [algorithm(n) for n in names]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list from {known} or 'package.module:factory' entries, got {text!r}"
        ) from None


def _param_value(text: str):
    """A JSON number, string or boolean; anything else is kept as the string given."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    ok = isinstance(value, (bool, int, str)) or (
        isinstance(value, float) and value == value and abs(value) != float("inf")
    )
    return value if ok else text


def param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not PARAM_RE.match(key.strip()):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (NAME a Python identifier), got {text!r}")
    return key.strip(), _param_value(value.strip())


def unit_interval(text: str) -> float:
    return name_or_number(text, (), lambda v: 0.0 < v < 1.0, "a number in (0, 1)")  # pyright: ignore[reportReturnType]


def direction(text: str) -> str:
    """A coordinate's index or comma-separated finite numbers (their count is checked against the
    problem's dimension when it is built)."""
    parts = [t.strip() for t in text.split(",")]
    try:
        values = [float(t) for t in parts]
    except ValueError:
        values = None
    if (
        not values
        or not all(math.isfinite(v) for v in values)
        or (len(values) == 1 and not parts[0].isdigit())
    ):
        raise argparse.ArgumentTypeError(
            f"expected a coordinate's index (0, 1, ...) or comma-separated numbers, got {text!r}"
        )
    return text.strip()


def x_axis(text: str) -> str:
    return "bits_delivered" if text == "bits" else text  # 'bits': the name before the x axes matched Python's


def default_algorithms() -> str:
    return ",".join(name for name, entry in registry.algorithms().items() if entry.default)


def _listing(entries) -> str:
    return "; ".join(f"{e.name}: {e.note}" if e.note else e.name for e in entries.values())


def _algorithm_names() -> str:
    return ", ".join(f"{e.name} ({e.note})" if e.note else e.name for e in registry.algorithms().values())


def _common() -> list[Option]:
    """The options of every run, in ``--help`` order within each group."""
    return [
        Option(
            ("--problem",),
            "problem",
            _listing(registry.problems()),
            default="garnet",
            choices=tuple(registry.problems()),
            group="problem",
        ),
        Option(
            ("--agents", "-N"),
            "agents",
            "number of agents N",
            positive_int,
            10,
            group="problem",
            params=("num_agents",),
        ),
        Option(
            ("--dim", "-d"),
            "dim",
            "dimension d (garnet default 8, qfedtd-mdp 10, gaussian 5; sarsa-garnet: one-hot features, "
            "d = S A, by default, else dense ones drawn from --problem-seed)",
            positive_int,
            group="problem",
            params=("dim",),
        ),
        Option(
            ("--problem-seed",), "problem_seed", "PRNG seed of the random problem", seed, 0, group="problem"
        ),
        Option(
            ("--algorithms", "--algorithm"),
            "algorithms",
            f"comma-separated from {_algorithm_names()}, or "
            "your own algorithm as 'package.module:factory': a function returning a fedsa_jax.Algorithm, "
            "imported with the current folder on the import path",
            algorithm_list,
            default_algorithms(),
            group="algorithms",
            grid=False,
        ),
        Option(
            ("--param",),
            "param",
            "keyword argument of every 'module:factory' algorithm (repeat the option); VALUE is read as a "
            "JSON number, string or true/false, else kept as text. A factory also gets step_size and "
            "num_local_steps (from --step-size, --local-steps) if its signature has them and no --param "
            "gives them",
            param,
            metavar="NAME=VALUE",
            action="append",
            group="algorithms",
            grid=False,
        ),
        Option(
            ("--step-size", "--eta"),
            "step_size",
            "step size eta",
            real,
            0.05,
            group="algorithms",
            params=("step_size", "eta0"),
        ),
        *_schedule(),
        *_inference(),
        *quantizers.options(BUILT_IN_CHANNEL),
        *erasures.options(BUILT_IN_CHANNEL),
        *downlink.options(BUILT_IN_CHANNEL),
        *dp.options(BUILT_IN_CHANNEL),
        *_simulation(),
        *_execution(),
        *_statistics(),
    ]


def _schedule() -> list[Option]:
    return [
        Option(
            ("--schedule",),
            "schedule",
            "step size of local step k = t H + h: constant eta, or inverse-time "
            "eta / (1 + k / DECAY_STEPS) (the 1/k regime); any optax schedule from Python",
            default="constant",
            choices=SCHEDULES,
            group="schedule",
        ),
        Option(
            ("--decay-steps",),
            "decay_steps",
            "inverse-time: local steps k0 over which the step size halves",
            positive_real,
            1000.0,
            group="schedule",
            params=("k0",),
            read_by="--schedule inverse-time",
        ),
        Option(
            ("--server-optimizer",),
            "server_optimizer",
            "optax optimizer on the server's pseudo-gradient "
            "theta_t - aggregate_t: none (plain averaging), sgd (with --server-momentum: FedAvgM) or adam "
            "(FedAdam)",
            default="none",
            choices=SERVER_OPTIMIZERS,
            group="schedule",
        ),
        Option(
            ("--server-lr",),
            "server_lr",
            "server optimizer's learning rate",
            positive_real,
            1.0,
            group="schedule",
            params=("learning_rate",),
        ),
        Option(
            ("--server-momentum",),
            "server_momentum",
            "sgd: momentum beta in [0, 1) (0: none)",
            real,
            0.0,
            group="schedule",
            params=("momentum",),
        ),
        Option(
            ("--average",),
            "average",
            "report the Polyak-Ruppert average of the iterates after BURN_IN "
            "rounds (fj.averaged); the last iterate's MSE is kept as the metric last_iterate_mse",
            nonnegative_int,
            metavar="BURN_IN",
            group="schedule",
            params=("burn_in",),
        ),
        Option(
            ("--richardson",),
            "richardson",
            "Richardson-Romberg: report 2 theta(eta) - theta(2 eta), both "
            "runs on the same random numbers (fj.richardson; with --average, of the averaged iterates)",
            default=False,
            action="store_true",
            group="schedule",
            grid=False,
        ),
    ]


def _inference() -> list[Option]:
    return [
        Option(
            ("--bootstrap",),
            "bootstrap",
            "multiplier bootstrap (fj.bootstrap): B weighted replicate trajectories per seed on the "
            "main one's observations, for confidence sets from one run",
            positive_int,
            metavar="B",
            group="inference",
            params=("num_replicates",),
        ),
        Option(
            ("--bootstrap-weights",),
            "bootstrap_weights",
            "the bootstrap's weight law (mean 1, variance 1)",
            default="beta",
            choices=("beta", "rademacher", "exponential", "gaussian", "ones"),
            group="inference",
            params=("weights",),
            read_by="--bootstrap",
        ),
        Option(
            ("--plug-in",),
            "plug_in",
            "plug-in moments (fj.plug_in): running estimates of A_bar and the noise covariance, for the "
            "plug-in confidence interval (the Lyapunov equation's solution times eta_T)",
            default=False,
            action="store_true",
            group="inference",
            grid=False,
        ),
        Option(
            ("--level",),
            "level",
            "confidence level of the intervals for u^T theta* whose coverage over seeds is printed",
            unit_interval,
            0.95,
            group="inference",
            grid=False,
            read_by="--bootstrap or --plug-in",
        ),
        Option(
            ("--direction",),
            "direction",
            "u of the intervals for u^T theta*: a coordinate's index I (u = e_I) or d comma-separated "
            "numbers",
            direction,
            "0",
            metavar="U",
            group="inference",
            grid=False,
            read_by="--bootstrap or --plug-in",
        ),
    ]


def _simulation() -> list[Option]:
    return [
        Option(
            ("--rounds", "-T"),
            "rounds",
            "communication rounds T",
            positive_int,
            60,
            params=("num_rounds",),
            grid=False,
        ),
        Option(
            ("--seeds",), "seeds", "independent runs", positive_int, 256, params=("num_seeds",), grid=False
        ),
        Option(("--seed",), "seed", "PRNG seed of the runs", seed, 1, grid=False),
        Option(
            ("--record-every",),
            "record_every",
            "record statistics every K rounds",
            positive_int,
            1,
            params=("record_every",),
            grid=False,
        ),
        Option(
            ("--dtype",),
            "dtype",
            "floating point type",
            default="float32",
            choices=("float32", "float64"),
            params=("dtype",),
            grid=False,
        ),
        Option(("--out",), "out", "output folder (created if needed)", Path, Path("fedsa_run"), grid=False),
        Option(
            ("--x-axis",),
            "x_axis",
            "figure's x axis: communication rounds, uplink messages, observations "
            "drawn, bits sent or delivered (uplink + downlink; uplink_bits_* or downlink_bits_* for "
            "one direction; 'bits' means bits_delivered, the uplink's alone without a downlink)",
            x_axis,
            "rounds",
            choices=X_AXES,
            grid=False,
        ),
        Option(
            ("--band",),
            "band",
            "figure's band: mean +- 2 standard errors, 5-95%% / 25-75%% quantiles over seeds, or the "
            "95%% t interval of the MSE",
            default="sem",
            choices=("sem", "quantiles", "t"),
            grid=False,
        ),
        Option(
            ("--exact",),
            "exact",
            "also compute the exact MSE curve (fj.theory.exact_mse; every algorithm "
            "with an exact description, plugins included, on Gaussian or generative TD problems, small N d, "
            "or Markov TD on small chains) "
            "and draw it dotted; on sarsa-garnet, whose observations follow the iterate, each algorithm's "
            "noise-free limit instead (fj.theory.mean_path_limit), its squared error dashed",
            default=False,
            action="store_true",
            grid=False,
        ),
        Option(
            ("--no-plot",), "no_plot", "skip the PNG figure", default=False, action="store_true", grid=False
        ),
    ]


def _execution() -> list[Option]:
    """How a run executes (``fj.Execution``): checkpoints, chunks, progress, the fused kernels."""
    return [
        Option(
            ("--checkpoint-dir",),
            "checkpoint_dir",
            "write an atomic checkpoint here after each chunk; "
            "rerunning the same command resumes (one subfolder per algorithm; other configurations may share "
            "the folder)",
            Path,
            params=("checkpoint_dir",),
            grid=False,
        ),
        Option(
            ("--chunk-rounds",),
            "chunk_rounds",
            "rounds per kernel call (progress and checkpoint granularity; default: automatic)",
            positive_int,
            params=("chunk_rounds",),
            grid=False,
        ),
        Option(
            ("--progress",),
            "progress",
            "progress bar (default: on a terminal only)",
            action=argparse.BooleanOptionalAction,
            grid=False,
        ),
        Option(
            ("--fused-local-steps",),
            "fused_local_steps",
            "run the local steps of TD (with pair tables) and Gaussian problems as one fused kernel per "
            "round (Pallas: Triton on one GPU, interpret mode elsewhere; same random numbers, results "
            "equal to float rounding); default: the backend's (off on CPU, where it is slower)",
            action=argparse.BooleanOptionalAction,
            grid=False,
        ),
    ]


def _statistics() -> list[Option]:
    """Options of the Monte Carlo statistics: precision targets and paired comparisons."""
    return [
        Option(
            ("--rel-sem",),
            "rel_sem",
            "run seed batches until the MSE's relative standard error is at most this at every recorded "
            "round, with at most --seeds seeds (fj.until; the result says how many ran and why it stopped)",
            positive_real,
            params=("rel_sem",),
            grid=False,
        ),
        Option(
            ("--compare",),
            "compare",
            "run the algorithms together on the same seeds (fj.compare: common random numbers) and print "
            "each pair's paired difference of the MSE and the ratio of MSEs at the last round, with 95%% "
            "intervals",
            default=False,
            action="store_true",
            grid=False,
        ),
    ]


def run_options() -> dict[str, Option]:
    """Every option of ``fedsa-jax run`` by ``dest``: those of every run, then the entries' own
    (each once, in registration order), sorted into their groups for ``--help``."""
    options = {o.dest: o for o in _common()}
    for table in (registry.problems(), registry.algorithms(), registry.quantizers()):
        for entry in table.values():
            for option in entry.options:
                if options.setdefault(option.dest, option) != option:
                    raise ValueError(f"{option.flags[0]} is invalid: two entries declare it differently")
    order = list(GROUPS)
    return dict(sorted(options.items(), key=lambda item: order.index(item[1].group)))


def library_options() -> dict[str, str]:
    """The library's name of a parameter -> the run option (``dest``) that sets it."""
    return {name: o.dest for o in run_options().values() for name in o.params}
