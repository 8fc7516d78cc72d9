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


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_os_errors_are_short(tmp_path, capsys, command):
    """An --out path too long for the file system: the OSError's message names the path, shortened."""
    out = tmp_path / ("x" * 6000)
    config = tmp_path / "sweep.toml"
    config.write_text("[run]\nrounds = 2\nseeds = 2\n[grid]\nstep_size = 0.1\n")
    argv = (
        ["run", "--rounds", "2", "--seeds", "2", "--no-plot"] if command == "run" else ["sweep", str(config)]
    )
    assert main([*argv, "--out", str(out)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and len(lines[0].encode()) <= LIMIT, [len(line) for line in lines]
    assert lines[0].startswith("fedsa-jax: error: ") and "..." in lines[0]
    assert str(tmp_path)[:20] in lines[0] and lines[0].endswith("xxxxxxxxxx")


def _with_filename2(error: OSError, name: str) -> OSError:
    error.filename2 = name  # the constructor keeps filename2 only beside a filename
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            OSError(28, "No space left on device", "/out/result.npz"),
            "No space left on device: /out/result.npz",
        ),
        (
            _with_filename2(OSError(28, "No space left on device"), "/out/b.npz"),
            "No space left on device: /out/b.npz",
        ),
        (OSError(18, "Invalid cross-device link", "/a", None, "/b"), "Invalid cross-device link: /a -> /b"),
        (OSError(28, "No space left on device"), "No space left on device"),
        (OSError(28, "No space left on device", ""), "No space left on device"),
    ],
    ids=["filename", "filename2", "both", "no-file", "empty-file"],
)
def test_os_error_names_the_file(monkeypatch, capsys, error, expected):
    """An OSError during a command names its file (never an empty name after a colon)."""
    import fedsa_jax.cli as cli

    def fail(args):
        raise error

    monkeypatch.setattr(cli, "cmd_run", fail)
    assert main(["run"]) == 2
    assert _lines(capsys) == [f"fedsa-jax: error: {expected}"]
