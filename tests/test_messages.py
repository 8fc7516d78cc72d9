"""Messages of the command line and sweep files are one line of at most about 500 characters, a
long value shortened in the middle (as the library's own errors are)."""

from __future__ import annotations

import pytest

from fedsa_jax.cli import main

LIMIT = 520  # "fedsa-jax: error: " or "fedsa-jax run: error: ... (see ...)" around the 500-character cap


def _lines(capsys) -> list[str]:
    captured = capsys.readouterr()
    return (captured.out + captured.err).splitlines()


@pytest.mark.parametrize(
    "grid",
    [
        'algorithm = "' + "a" * 30000 + '"',
        "agents = [[" + ", ".join(["1"] * 5000) + "]]",
        "k" * 20000 + " = 1",
    ],
    ids=["long-algorithm", "nested-agents", "long-grid-key"],
)
def test_sweep_file_errors_are_short(tmp_path, capsys, grid):
    config = tmp_path / "sweep.toml"
    config.write_text(f"[run]\nrounds = 2\nseeds = 2\n[grid]\n{grid}\n")
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and len(lines[0].encode()) <= LIMIT, [len(line) for line in lines]
    assert "..." in lines[0]


def test_argparse_errors_are_short(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--algorithms", "a" * 30000])
    assert exit_.value.code == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and len(lines[0].encode()) <= LIMIT, [len(line) for line in lines]
    assert lines[0].startswith("fedsa-jax run: error: argument --algorithms") and "..." in lines[0]
