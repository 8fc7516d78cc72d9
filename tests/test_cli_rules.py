"""Rules the command line shares with the library: a run is checked whole before it prints anything,
and its options mean what the library's keywords mean (no silent clamping)."""

from __future__ import annotations

import pytest

from fedsa_jax import cli

SMALL = ["--rounds", "2", "--seeds", "2", "--no-plot"]


def _run(tmp_path, *options: str) -> list[str]:
    return ["run", *SMALL, "--out", str(tmp_path / "out"), *options]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--quantizer", "rand-k", "--k", "9"], "--k=9 is invalid: expected k <= d = 8"),
        (["--downlink-quantizer", "rand-k", "--k", "9"], "--k=9 is invalid: expected k <= d = 8"),
        (["--clients-per-round", "11"], "--clients-per-round=11 is invalid: expected at most N = 10"),
        (
            ["--compare", "--clients-per-round", "11"],
            "--clients-per-round=11 is invalid: expected at most N = 10",
        ),
    ],
    ids=["k-above-d", "downlink-k-above-d", "cohort-above-N", "compare-cohort-above-N"],
)
def test_run_checks_before_printing(tmp_path, capsys, options, named):
    """An option the problem refuses (k > d = 8, m > N = 10 on the default Garnet) is one line on
    stderr, with nothing on stdout before it (no "uplink channel:" or "problem:" line)."""
    assert cli.main(_run(tmp_path, *options)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [captured.err.strip()]
    assert captured.err.startswith(f"fedsa-jax: error: {named}")


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, (captured.out, captured.err)
    return captured.err.strip()


def test_run_refuses_record_every_above_rounds(tmp_path, capsys):
    """``--record-every 5 --rounds 2`` is refused as ``fj.simulate(..., 2, record_every=5)`` is, not
    clamped to 2."""
    assert cli.main(_run(tmp_path, "--record-every", "5")) == 2
    assert _one_error_line(capsys) == (
        "fedsa-jax: error: --record-every=5 is invalid: expected an integer in [1, --rounds=2]"
    )


def test_run_default_record_every_fits_any_rounds():
    """Left out, ``--record-every`` is 1, which every ``--rounds`` (>= 1) allows."""
    from fedsa_jax.cli.run import _run_options

    args = cli.build_parser().parse_args(["run", "--rounds", "1"])
    assert _run_options(args, "fedlsa")["record_every"] == 1
    given = cli.build_parser().parse_args(["run", "--rounds", "3", "--record-every", "3"])
    assert _run_options(given, "fedlsa")["record_every"] == 3


def _sweep(tmp_path, run: str, grid: str = "step_size = 0.1") -> list[str]:
    config = tmp_path / "sweep.toml"
    config.write_text(f"[run]\nseeds = 2\n{run}\n[grid]\n{grid}\n")
    return ["sweep", str(config), "--out", str(tmp_path / "out")]


@pytest.mark.parametrize(
    ("run", "grid", "message"),
    [
        (
            "rounds = 2\nrecord_every = 5",
            "step_size = 0.1",
            "run.record_every=5 is invalid: expected an integer in [1, num_rounds=2]",
        ),
        (
            "total_local_steps = 20\nrecord_every = 3",
            "local_steps = [5, 10]",
            "run.record_every=3 is invalid: expected an integer in [1, num_rounds=2] "
            "(configuration local_steps-10",
        ),
    ],
    ids=["rounds", "total-local-steps"],
)
def test_sweep_refuses_record_every_above_rounds(tmp_path, capsys, run, grid, message):
    """A sweep file's ``record_every`` above a configuration's rounds (given, or total_local_steps // H)
    is refused before anything is computed, as ``fj.simulate`` refuses it."""
    assert cli.main(_sweep(tmp_path, run, grid)) == 2
    assert _one_error_line(capsys).startswith(f"fedsa-jax: error: {message}")
    assert not list((tmp_path / "out").glob("*.npz"))


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ("rounds = 2", 1),
        ("rounds = 2\nrecords = 5", 1),
        ("rounds = 6\nrecords = 3", 2),
        ("rounds = 2\nrecord_every = 2", 2),
    ],
    ids=["default", "records-above-rounds", "records", "record-every-equal-rounds"],
)
def test_sweep_default_record_every_fits_the_rounds(tmp_path, run, expected):
    """Without ``record_every``, a sweep records every ``rounds // records`` rounds, at least 1 (so
    ``records`` above the rounds still runs); a ``record_every`` equal to the rounds is allowed."""
    from fedsa_jax.cli.sweep_file import _Grid, _sweep_spec

    config = tmp_path / "sweep.toml"
    config.write_text(f"[run]\nseeds = 2\n{run}\n[grid]\nstep_size = 0.1\n")
    spec, _, defaults = _sweep_spec(config)
    assert _Grid(spec, defaults).record_every({"step_size": 0.1}) == expected
