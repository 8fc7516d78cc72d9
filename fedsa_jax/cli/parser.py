"""The argument parser, built from the options' list (:func:`fedsa_jax.cli.options.run_options`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from fedsa_jax._text import one_line
from fedsa_jax._version import __version__
from fedsa_jax.registry import GROUPS, XLA_FLAG, Option, positive_int


class _Parser(argparse.ArgumentParser):
    """Errors in one line, without the usage block: ``fedsa-jax run: error: argument --x: ...``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


class _Help(argparse.HelpFormatter):
    """Shows a default once, where there is one to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text
            or action.default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if m is None or not int(m[1]) < int(m[2]):
        raise argparse.ArgumentTypeError(f"expected K/N with integers 0 <= K < N (e.g. 3/8), got {text!r}")
    return int(m[1]), int(m[2])


def add_option(group, option: Option) -> None:
    """``option`` as an argparse argument of ``group``."""
    kwargs = {"dest": option.dest, "default": option.default, "help": option.help}
    for name in ("type", "choices", "metavar", "action"):
        if getattr(option, name) is not None:
            kwargs[name] = getattr(option, name)
    group.add_argument(*option.flags, **kwargs)


def progress_mode(flag: bool | None) -> bool | str:
    """``--progress`` / ``--no-progress`` as given; by default a bar on a terminal and one line per chunk
    on standard error otherwise (a log or a pipe still shows how far a long run is)."""
    if flag is not None:
        return flag
    return True if sys.stderr.isatty() else "lines"


def build_parser(options: dict[str, Option] | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``options`` (default: :func:`~fedsa_jax.cli.options.run_options`,
    which imports the registered algorithms) are ``run``'s (the help's snapshot passes its own)."""
    if options is None:
        from fedsa_jax.cli.options import run_options

        options = run_options()
    parser = _Parser(
        prog="fedsa-jax",
        description="Monte Carlo simulation of federated linear stochastic approximation in JAX.",
    )
    parser.add_argument("--version", action="version", version=f"fedsa-jax {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="simulate algorithms on a problem; write result files and an MSE figure",
        description="Simulate FedLSA / SCAFFLSA on a federated problem over many independent seeds. "
        "Writes result_<algorithm>.npz (arrays + config + versions), result_<algorithm>.csv, summary.json "
        "and mse.png into --out. Defaults: heterogeneous Garnet (N=10), FedLSA vs SCAFFLSA, eta=0.05, "
        "H=1000, 60 rounds, 256 seeds (under a minute on 2 CPU cores).",
        formatter_class=_Help,
    )
    groups = {key: run.add_argument_group(title) for key, title in GROUPS.items()}
    for option in options.values():
        add_option(groups[option.group], option)
    _jax_options(groups["simulation"])
    _sweep_parser(sub)
    return parser


def _sweep_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep",
        help="run a grid of configurations from a TOML file; finished ones are skipped on rerun",
        description="Run every configuration of a TOML grid ([run], [grid] and [params] tables: see the "
        "documentation, docs/guide/cli.md). Step sizes and success probabilities of otherwise "
        "identical configurations run side by side in one compiled kernel. Each finished configuration "
        "is saved to OUT/<name>.npz at once; OUT/sweep.json indexes them and OUT/sweep.png plots their "
        "final MSE; rerunning skips what is done and recomputes damaged files.",
        formatter_class=_Help,
    )
    sw.add_argument("config", type=Path, help="the sweep's TOML file")
    sw.add_argument("--out", type=Path, default=None, help="output folder (default: [run] out)")
    sw.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="K/N",
        help="run only the configurations whose index is K mod N (0 <= K < N), into the shared "
        "output folder, e.g. one task of a cluster job array; a later run without --shard "
        "collects them and writes sweep.json and sweep.png",
    )
    sw.add_argument(
        "--collect",
        action="store_true",
        help="compute nothing: load the finished configurations, write sweep.json and sweep.png, "
        "list the missing ones (exit status 1 if any)",
    )
    sw.add_argument(
        "--allow-plugins",
        action="store_true",
        help="run the file's 'module:factory' algorithms: each is code that the sweep imports "
        "and calls, so allow it only for a file you trust (without it such a file is refused)",
    )
    sw.add_argument(
        "--max-grid",
        type=positive_int,
        default=None,
        metavar="N",
        help="refuse grids of more than N configurations (default: fedsa_jax.sweep.MAX_GRID)",
    )
    sw.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars (default: on a terminal only)",
    )
    sw.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    _jax_options(sw)


def _jax_options(group) -> None:
    group.add_argument(
        "--cpu-devices",
        type=positive_int,
        default=None,
        metavar="N",
        help="JAX CPU devices the seeds are sharded over, 1 to the cores this process may use "
        "(default: one per core, faster than JAX's single multi-threaded device; 1 restores that "
        f"device). An explicit XLA_FLAGS=--{XLA_FLAG}=N or JAX_NUM_CPU_DEVICES wins. No effect on GPUs",
    )
    group.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="do not keep compiled kernels on disk (default: kept in "
        "$XDG_CACHE_HOME/fedsa_jax/jax_compile_cache, ~/.cache without XDG_CACHE_HOME, so a "
        "repeated run does not compile again; FEDSA_JAX_COMPILE_CACHE=off disables it too, "
        "FEDSA_JAX_COMPILE_CACHE=FOLDER moves it)",
    )
