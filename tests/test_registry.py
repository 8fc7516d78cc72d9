"""The registry is the command line's single source of algorithms, problems, quantizers and their options.

Every registered option is in ``fedsa-jax run --help`` and is a sweep file's grid key; an algorithm
registered from outside the command line (here, in the test) gets its option, its "read only with"
check and its exact curve with no change to the command line's code; a ``module:factory`` plugin whose
algorithm has an exact description gets its exact curve too. The command line's own source names no
built-in algorithm in code, reads no argparse internals and has no function over 100 lines.
"""

import ast
import dataclasses
import json
import re
import textwrap
from pathlib import Path

import pytest

import fedsa_jax as fj
from fedsa_jax import cli, registry

TINY = ["--problem", "gaussian", "--agents", "2", "--dim", "2", "--rounds", "3", "--seeds", "4", "--no-plot"]


def _run_help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    return " ".join(capsys.readouterr().out.split())


def _entries():
    return [*registry.algorithms().values(), *registry.problems().values(), *registry.quantizers().values()]


def _sweep_file(tmp_path, grid: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f"[run]\nrounds = 2\n[grid]\n{grid}\n")
    return path


def test_every_registered_entry_and_option_is_in_help_and_a_grid_key(capsys, tmp_path):
    text = _run_help(capsys)
    for entry in _entries():
        assert entry.name in text, entry.name
        for option in entry.options:
            assert option.flags[0] in text and option.help.split()[0] in text, option.flags
            if option.grid and option.default is not None:
                grid = f"{option.dest} = {json.dumps(option.default)}"
                _, axes, _ = cli._sweep_spec(_sweep_file(tmp_path, grid))
                assert option.dest in axes, grid


@pytest.fixture
def toy():
    """An algorithm registered outside the command line: FedLSA named 'toy', its H from --toy-steps."""
    steps = registry.Option(
        ("--toy-steps",),
        "toy_steps",
        "toy: local steps per round",
        registry.positive_int,
        2,
        group="algorithms",
        params=("num_local_steps",),
    )

    def build(step_size, args, **channel):
        return dataclasses.replace(fj.fedlsa(step_size, args.toy_steps, **channel), name="toy")

    registry.register_algorithm("toy", build, options=(steps,), title="Toy")
    yield
    registry._ENTRIES["algorithm"].pop("toy")


def test_a_registered_algorithm_gets_its_option_check_grid_key_and_exact_curve(toy, tmp_path, capsys):
    assert "--toy-steps" in _run_help(capsys)
    out = tmp_path / "run"
    assert (
        cli.main(["run", *TINY, "--algorithms", "toy", "--toy-steps", "3", "--exact", "--out", str(out)]) == 0
    )
    run = json.loads((out / "summary.json").read_text())["runs"]["toy"]
    assert run["config"]["num_local_steps"] == 3 and run["exact_final_mse"] > 0
    assert cli.main(["run", *TINY, "--algorithms", "fedlsa", "--toy-steps", "3", "--out", str(out)]) == 2
    assert "--toy-steps=3 is invalid: it is read only with the algorithm toy" in capsys.readouterr().err
    _, axes, _ = cli._sweep_spec(_sweep_file(tmp_path, 'algorithm = "toy"\ntoy_steps = [2, 3]'))
    assert axes["toy_steps"] == [2, 3]


def test_a_plugin_with_an_exact_description_gets_an_exact_curve(tmp_path, monkeypatch):
    (tmp_path / "toyplugin.py").write_text(
        textwrap.dedent("""
        import dataclasses
        import fedsa_jax as fj

        def make(step_size, num_local_steps):
            return dataclasses.replace(fj.scafflsa(step_size, num_local_steps), name="mine")
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    argv = [
        "run",
        *TINY,
        "--algorithms",
        "toyplugin:make",
        "--local-steps",
        "2",
        "--exact",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    assert json.loads((out / "summary.json").read_text())["runs"]["mine"]["exact_final_mse"] > 0


def _cli_sources() -> list[Path]:
    path = Path(cli.__file__)
    return sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]


def _code_strings_and_names(tree: ast.AST):
    """Identifiers and string constants of the code, docstrings left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value
        elif isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr


def test_the_command_line_names_no_builtin_algorithm_and_reads_no_argparse_internals():
    builtin = re.compile(r"\b(fedlsa|scafflsa|qfedtd|scaffnew)\b(?!-mdp)")
    for path in _cli_sources():
        tree = ast.parse(path.read_text())
        named = [s for s in _code_strings_and_names(tree) if builtin.search(s)]
        assert not named, (path.name, named)
        assert not {"_actions", "_SubParsersAction"} & set(_code_strings_and_names(tree)), path.name


def test_no_function_of_the_command_line_is_over_100_lines():
    for path in _cli_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 100, (path.name, node.name)
