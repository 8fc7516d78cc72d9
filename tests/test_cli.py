"""The command line on small sizes: files written, options documented, errors clear."""

import json
import subprocess
import sys

import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import cli


def test_run_writes_results_summary_and_figure(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["run", "--agents", "4", "--local-steps", "5", "--step-size", "0.5", "--rounds", "6",
                   "--seeds", "8", "--states", "10", "--out", str(out)])
    assert rc == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["mse.png", "result_fedlsa.npz", "result_scafflsa.npz", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"fedlsa", "scafflsa"}
    assert summary["fedlsa_predicted_squared_bias"] > 0
    res = fj.load(out / "result_fedlsa.npz")
    assert res.final_theta.shape == (8, 8) and res.final_theta.dtype == np.float32
    assert res.config["algorithm"]["num_local_steps"] == 5
    assert (out / "mse.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "final MSE" in capsys.readouterr().out


@pytest.mark.parametrize("problem", ["gaussian", "qfedtd-mdp"])
def test_other_problems_and_float64(tmp_path, problem):
    rc = cli.main(["run", "--problem", problem, "--algorithms", "scafflsa", "--agents", "2", "--local-steps", "2",
                   "--step-size", "0.1", "--rounds", "3", "--seeds", "4", "--dtype", "float64", "--no-plot",
                   "--out", str(tmp_path)])
    assert rc == 0
    res = fj.load(tmp_path / "result_scafflsa.npz")
    assert res.final_theta.dtype == np.float64


def test_help_documents_every_option():
    text = subprocess.run([sys.executable, "-m", "fedsa_jax.cli", "run", "--help"], capture_output=True,
                          text=True, check=True).stdout
    for opt in ("--problem", "--algorithms", "--step-size", "--local-steps", "--agents", "--rounds", "--seeds",
                "--seed", "--dtype", "--out", "--heterogeneity", "--sampling", "--skip", "--record-every"):
        assert opt in text


def test_bad_options_give_clear_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--algorithms", "fedavg"])
    assert "fedlsa, scafflsa" in capsys.readouterr().err
    rc = cli.main(["run", "--step-size", "-1", "--out", str(tmp_path)])
    assert rc == 2
    assert "step_size=-1.0 is invalid" in capsys.readouterr().err
