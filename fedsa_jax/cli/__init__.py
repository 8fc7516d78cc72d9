"""Command line: ``fedsa-jax run`` simulates, writes result files and a figure;
``fedsa-jax sweep CONFIG.toml`` runs a grid of configurations.

    fedsa-jax run                      # heterogeneous Garnet, FedLSA vs SCAFFLSA
    fedsa-jax run --problem gaussian --algorithms fedlsa --step-size 0.1 --local-steps 10
    fedsa-jax run --algorithms fedlsa,mymodule:fedavgm --param beta=0.9   # a user's own algorithm
    fedsa-jax run --schedule inverse-time --average 20 --server-optimizer sgd --server-momentum 0.5
    fedsa-jax sweep CONFIG.toml        # a grid of configurations, resumable
    fedsa-jax sweep CONFIG.toml --shard 3/8   # one task of a cluster job array

The sweep file's format (``[run]``, ``[grid]`` and ``[params]`` tables) is
documented with a complete example in ``docs/guide/cli.md`` ("Sweeps from a TOML file").

The algorithms, problems and quantizers, and the options each reads, come from
:mod:`fedsa_jax.registry` (each registered in its own file); this package names none of them:
``options`` (the list of options), ``parser``, ``build`` (objects from options), ``checks``
(options nothing reads, library errors under their option), ``run``, ``sweep_file`` and ``titles``.

Nothing is lost to a bad path: every output folder is created and checked
before any simulation; errors are one line naming the option (exit status 2).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING

from fedsa_jax._text import one_line
from fedsa_jax.cli.parser import build_parser
from fedsa_jax.cli.snapshot import help_parser

if TYPE_CHECKING:
    from fedsa_jax.cli.run import cmd_run
    from fedsa_jax.cli.sweep_file import cmd_sweep

__all__ = ["build_parser", "cmd_run", "cmd_sweep", "main"]

# loaded on first use, so that ``fedsa-jax --help`` imports neither JAX nor matplotlib
_LAZY = {  # name here -> (module, its name there)
    "cmd_run": ("fedsa_jax.cli.run", "cmd_run"),
    "cmd_sweep": ("fedsa_jax.cli.sweep_file", "cmd_sweep"),
    "_make_algorithm": ("fedsa_jax.cli.build", "_make_algorithm"),
    "_make_problem": ("fedsa_jax.cli.build", "_make_problem"),
    "_make_quantizer": ("fedsa_jax.cli.build", "_make_quantizer"),
    "_param": ("fedsa_jax.cli.options", "param"),
    "_sweep_spec": ("fedsa_jax.cli.sweep_file", "_sweep_spec"),
}


def __getattr__(name: str):
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'fedsa_jax.cli' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def _loaded(name: str):
    """``name`` of this module: loaded now, or as replaced (a test's monkeypatch)."""
    return globals()[name] if name in globals() else __getattr__(name)


def _asks_for_help(argv: list[str]) -> bool:
    """``-h``/``--help`` before any ``--``, while the built-in algorithms are not imported yet (once
    they are, a user's own registered entries may be there too: the real parser then prints it)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return any(w in ("-h", "--help") for w in words) and "fedsa_jax.algorithms" not in sys.modules


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if _asks_for_help(argv):
        help_parser().parse_args(argv)  # prints the help and exits, from help.json alone
    args = build_parser().parse_args(argv)
    command = _loaded({"run": "cmd_run", "sweep": "cmd_sweep"}[args.command])
    shown = warnings.showwarning

    def one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"fedsa-jax: warning: {one_line(str(message))}", file=sys.stderr)

    warnings.showwarning = one_line_warning  # warnings (diverged seeds, damaged files) in one line
    try:
        return command(args)
    except ValueError as err:
        print(f"fedsa-jax: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except OSError as err:  # a folder that became unwritable during the run, a full disk
        print(f"fedsa-jax: error: {_os_error_message(err)}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown


def _os_error_message(err: OSError) -> str:
    """``err`` in one line of at most about 500 characters: its reason, then the file it names
    (``filename``, and ``filename2`` where both are set, as in a rename); an error naming no file
    (a ``write`` on an open file) is its reason alone, without a dangling colon."""
    reason = err.strerror or str(err) or type(err).__name__
    names = [_file_name(n) for n in (err.filename, err.filename2) if n is not None and _file_name(n)]
    return one_line(f"{reason}: {' -> '.join(names)}" if names else reason)


def _file_name(name) -> str:
    return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)
