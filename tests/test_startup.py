"""Start-up: ``fedsa-jax --help`` (and each command's) imports neither JAX, numpy nor matplotlib, and
prints exactly what the real parser prints; ``import fedsa_jax`` loads its names on first use."""

import json
import os
import re
import subprocess
import sys

import pytest

from fedsa_jax.cli import snapshot
from fedsa_jax.cli.parser import build_parser

HEAVY = ("jax", "numpy", "matplotlib", "scipy", "optax")


def _in_fresh_python(code: str, columns: int = 100) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return done.stdout


@pytest.mark.parametrize(
    "argv", [["--help"], ["run", "--help"], ["sweep", "-h"], ["run", "--seeds", "3", "-h"]]
)
def test_help_imports_nothing_heavy(argv):
    out = _in_fresh_python(
        "import sys\nfrom fedsa_jax.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])"
    )
    assert out.rstrip().endswith("LOADED []"), out[-300:]
    assert "usage: fedsa-jax" in out


@pytest.mark.parametrize("columns", [60, 100, 160])
@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["sweep", "--help"]])
def test_the_snapshot_prints_what_the_parser_prints(argv, columns, monkeypatch, capsys):
    """At every terminal width (argparse lays the text out from COLUMNS)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    texts = []
    for parser in (build_parser(), snapshot.help_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]


def test_the_snapshot_file_is_up_to_date(tmp_path):
    """help.json is what ``python -m fedsa_jax.cli.snapshot`` writes from today's options: an option
    added, renamed or documented differently fails here until the file is written again."""
    fresh = tmp_path / "help.json"
    snapshot.write(fresh)
    assert json.loads(snapshot.PATH.read_text()) == json.loads(fresh.read_text()), (
        "fedsa_jax/cli/help.json is stale: run `python -m fedsa_jax.cli.snapshot`"
    )


def test_the_real_parser_answers_once_the_algorithms_are_loaded(capsys):
    """In a process that imported the algorithms (where a user may have registered their own), help
    comes from the real parser, which lists what is registered now."""
    from fedsa_jax import cli, registry

    assert "fedsa_jax.algorithms" in sys.modules and not cli._asks_for_help(["run", "--help"])
    registry.register_algorithm("toy-registered", lambda step_size, args, **channel: None, title="Toy")
    try:
        with pytest.raises(SystemExit):
            cli.main(["run", "--help"])
        out = re.sub(r"-\s+", "-", capsys.readouterr().out)  # argparse may wrap the name at its hyphen
        assert "toy-registered" in out
    finally:
        del registry._ENTRIES["algorithm"]["toy-registered"]


def test_the_package_loads_its_names_on_first_use():
    out = _in_fresh_python(
        "import sys\nimport fedsa_jax as fj\nbefore = 'jax' in sys.modules\n"
        "fj.simulate, fj.theory.exact_mse, fj.fedlsa\nfrom fedsa_jax import SimulationResult, load\n"
        "missing = sorted(set(fj.__all__) - set(dir(fj)))\n"
        "print(before, 'jax' in sys.modules, 'matplotlib' in sys.modules, missing)"
    )
    assert out.split() == ["False", "True", "False", "[]"]
    import fedsa_jax as fj

    assert set(fj.__all__) == set(fj._PUBLIC)  # every public name has its module
