"""What a new user reads against what the code does: a cohort run says so in its figure's title and on
its console line; the README's sample output of ``fedsa-jax run`` has the lines the command prints,
in order; the README and the docs say how to run the notebooks, with an extra that installs it."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from fedsa_jax import cli
from fedsa_jax.cli.parser import build_parser
from fedsa_jax.cli.titles import run_title

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--agents", "4", "--states", "6", "--dim", "2", "--local-steps", "2", "--rounds", "3", "--seeds", "4"]


def test_a_cohort_run_says_so_in_its_title_and_console_line(tmp_path, capsys):
    """``--clients-per-round 5`` of N = 10 looked like a full run: the title and the algorithm's
    console line name the cohort; M = N (the full round) and no option name none."""
    problem = SimpleNamespace(num_agents=10, dim=8)
    title = lambda *argv: run_title(build_parser().parse_args(["run", *argv]), problem)  # noqa: E731
    assert "cohort 5 of 10 agents" in title("--clients-per-round", "5")
    assert "cohort" not in title() and "cohort" not in title("--clients-per-round", "10")
    argv = ["run", *TINY, "--algorithms", "fedlsa", "--no-plot", "--out", str(tmp_path / "run")]
    assert cli.main([*argv, "--clients-per-round", "2"]) == 0
    (line,) = [x.split(" -> ")[0] for x in capsys.readouterr().out.splitlines() if "final MSE" in x]
    assert "(s.e.), cohort 2 of 4 agents, 0 diverged" in line, line
    assert cli.main(argv) == 0
    (line,) = [x.split(" -> ")[0] for x in capsys.readouterr().out.splitlines() if "final MSE" in x]
    assert "cohort" not in line, line


def shape(line: str) -> str:
    """A console line without its values: the timing part, then every number, replaced."""
    line = re.sub(r"diverged, .* -> ", "diverged, TIMING -> ", line)
    return re.sub(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", "#", line)


def readme_sample_output() -> list[str]:
    """The block that follows the README's "`fedsa-jax run` prints" sentence."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index("`fedsa-jax run` prints") :]
    return re.search(r"```\n(.*?)```", after, re.S).group(1).strip().splitlines()


def test_the_readme_sample_output_is_what_the_command_prints(tmp_path, monkeypatch, capsys):
    """Line for line, in order (values aside): the README left out the problem line and the
    figure's path."""
    monkeypatch.chdir(tmp_path)  # the default --out, fedsa_run, as in the README
    assert cli.main(["run", *TINY]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert [shape(x) for x in readme_sample_output()] == [shape(x) for x in printed]
    # power: the block as it was, without the problem line and the figure's path, differs
    assert [shape(x) for x in readme_sample_output()[1:-1]] != [shape(x) for x in printed]


def test_the_notebooks_can_be_run_as_documented():
    """``nbconvert`` was in no extra but the docs' (through mkdocs-jupyter) and nothing said how to
    run the notebooks: the ``notebooks`` extra installs what the README's and the home page's
    commands use, and the notebooks they name exist."""
    from test_docs import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    needed = {re.match(r"[\w-]+", r).group(0) for r in extras["notebooks"]}
    assert {"jupyterlab", "nbconvert", "ipykernel"} <= needed
    for page in ("README.md", "docs/index.md"):
        text = (ROOT / page).read_text()
        assert "pip install '.[notebooks]'" in text, page
        assert "jupyter lab notebooks/" in text, page
        executed = re.findall(r"jupyter nbconvert --to notebook --execute .*? (notebooks/\S+\.ipynb)", text)
        assert executed and all((ROOT / notebook).is_file() for notebook in executed), page
