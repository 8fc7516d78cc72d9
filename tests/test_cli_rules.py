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
