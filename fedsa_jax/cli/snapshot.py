"""The command line's ``--help`` without importing JAX: a snapshot of ``run``'s options.

The parser (:func:`fedsa_jax.cli.parser.build_parser`) is built from the registry's options, which
register in the algorithms' own files, and those import JAX (seconds of start-up). ``help.json``
beside this file holds those options as plain data (flags, help, default, choices, group; not the
functions that convert their text), so that ``fedsa-jax --help``, ``fedsa-jax run --help`` and
``fedsa-jax sweep --help`` are printed by the same ``build_parser`` from the standard library alone:
the very same text at any terminal width. Such a parser converts and checks nothing; it only helps.

``python -m fedsa_jax.cli.snapshot`` writes the file again after an option changes; the test suite
fails until it is (``tests/test_startup.py`` compares the help of both and the file with a fresh one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from fedsa_jax.cli.parser import build_parser
from fedsa_jax.registry import Option

PATH = Path(__file__).with_name("help.json")
_HELP_ONLY = ("type", "params", "grid", "read_by", "plugins", "needs")  # what --help does not show


def _plain(value):
    """A default, choice or action as JSON holds it (a path as its text: ``%(default)s`` prints the
    same; an action class by its name in argparse)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, type) and getattr(argparse, value.__name__, None) is value:
        return f"argparse.{value.__name__}"
    return str(value)


def _option(spec: dict) -> Option:
    fields: dict = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
    action = fields["action"]
    if isinstance(action, str) and action.startswith("argparse."):
        fields["action"] = getattr(argparse, action.removeprefix("argparse."))
    return Option(**fields)


def describe(options: dict[str, Option]) -> list[dict]:
    """``options`` as plain data, what ``--help`` shows of each."""
    return [
        {f.name: _plain(getattr(o, f.name)) for f in dataclasses.fields(o) if f.name not in _HELP_ONLY}
        for o in options.values()
    ]


def help_parser(path: Path = PATH) -> argparse.ArgumentParser:
    """The command line's parser, built from ``help.json``: it prints the help, and nothing else it
    parses is converted or checked."""
    specs = json.loads(path.read_text(encoding="utf-8"))
    return build_parser({spec["dest"]: _option(spec) for spec in specs})


def write(path: Path = PATH) -> None:
    """``help.json`` from today's options (the one function here that imports the algorithms)."""
    from fedsa_jax.cli.options import run_options  # (imports JAX: here, not for --help)

    path.write_text(json.dumps(describe(run_options()), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write()
    print(f"wrote {PATH}")
