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
    assert files == ["mse.png", "result_fedlsa.csv", "result_fedlsa.npz", "result_scafflsa.csv",
                     "result_scafflsa.npz", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"fedlsa", "scafflsa"}
    assert summary["fedlsa_predicted_squared_bias"] > 0
    res = fj.load(out / "result_fedlsa.npz")
    assert res.final_theta.shape == (8, 8) and res.final_theta.dtype == np.float32
    assert res.config["algorithm"]["num_local_steps"] == 5
    assert (out / "mse.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "final MSE" in capsys.readouterr().out


def test_run_exact_overlay_and_axes(tmp_path):
    import jax

    out = tmp_path / "run"
    argv = ["run", "--agents", "3", "--local-steps", "4", "--step-size", "0.5", "--rounds", "6", "--seeds", "2000",
            "--states", "5", "--dim", "3", "--dtype", "float64", "--exact", "--band", "quantiles", "--x-axis", "samples",
            "--out", str(out)]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    args = cli.build_parser().parse_args(argv)
    problem = cli._make_problem(args, jax.random.key(args.problem_seed))
    for name in ("fedlsa", "scafflsa"):
        exact = fj.theory.exact_mse(problem, cli._make_algorithm(name, args), 6)
        assert summary["runs"][name]["exact_final_mse"] == pytest.approx(exact[-1], rel=1e-12)
        res = fj.load(out / f"result_{name}.npz")
        assert abs(res.mse_mean[-1] - exact[-1]) < 4.5 * res.mse_sem[-1]  # the run agrees with it
        csv = np.genfromtxt(out / f"result_{name}.csv", delimiter=",", names=True)
        np.testing.assert_array_equal(csv["mse_mean"], res.mse_mean)


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


def test_channel_options_and_qfedtd(tmp_path):
    rc = cli.main(["run", "--problem", "qfedtd-mdp", "--agents", "3", "--algorithms", "qfedtd,fedlsa",
                   "--local-steps", "2", "--step-size", "0.5", "--quantizer", "stochastic-uniform", "--bits", "3",
                   "--success-prob", "0.5", "--rounds", "5", "--seeds", "16", "--x-axis", "bits",
                   "--out", str(tmp_path)])
    assert rc == 0
    q = fj.load(tmp_path / "result_qfedtd.npz")
    ch = q.config["algorithm"]["channel"]
    assert ch["success_prob"] == 0.5 and ch["quantizer"] == {"kind": "stochastic_uniform", "bits_per_coordinate": 3}
    assert q.config["algorithm"]["num_local_steps"] == 1
    assert q.config["bits_per_message"] == 32 + 10 * 3
    assert 0 < q.bits_delivered[-1] < q.bits_sent[-1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"]["fedlsa"]["bits_sent"] == 5 * 3 * (32 + 30)
    for quant in ("qsgd", "rand-k", "natural"):
        assert cli.main(["run", "--problem", "gaussian", "--agents", "2", "--algorithms", "scafflsa",
                         "--local-steps", "2", "--rounds", "3", "--seeds", "4", "--quantizer", quant,
                         "--no-plot", "--out", str(tmp_path / quant)]) == 0


def test_checkpoint_dir_resumes(tmp_path, monkeypatch):
    import importlib

    sim_mod = importlib.import_module("fedsa_jax.simulate")
    args = ["run", "--agents", "3", "--local-steps", "2", "--rounds", "8", "--seeds", "6", "--states", "10",
            "--chunk-rounds", "2", "--no-plot", "--no-progress", "--checkpoint-dir", str(tmp_path / "ck")]
    assert cli.main(args + ["--out", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["fedlsa", "scafflsa"]
    def no_more_rounds(*a, **k):
        raise AssertionError("a finished checkpoint must not run any round again")

    with monkeypatch.context() as m:
        m.setattr(sim_mod, "_advance", no_more_rounds)
        assert cli.main(args + ["--out", str(tmp_path / "b")]) == 0  # resumes from the finished checkpoints
    a, b = fj.load(tmp_path / "a" / "result_scafflsa.npz"), fj.load(tmp_path / "b" / "result_scafflsa.npz")
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    rc = cli.main(args[:-2] + ["--step-size", "0.2", "--checkpoint-dir", str(tmp_path / "ck"),
                               "--out", str(tmp_path / "c")])
    assert rc == 2  # another configuration: refused with a clear error


SWEEP_TOML = """
[run]
seeds = 6
total_local_steps = 8
records = 2

[grid]
problem = "garnet"
states = 10
agents = 3
algorithm = ["fedlsa", "scafflsa"]
step_size = [0.1, 0.2]
local_steps = [2, 4]
"""


def test_sweep_command(tmp_path, capsys):
    cfg = tmp_path / "grid.toml"
    cfg.write_text(SWEEP_TOML)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    index = json.loads((out / "sweep.json").read_text())
    assert len(index) == 8
    row = next(r for r in index if r["config"] == {"problem": "garnet", "states": 10, "agents": 3,
                                                   "algorithm": "scafflsa", "step_size": 0.2, "local_steps": 4})
    res = fj.load(out / row["file"])
    assert res.rounds[-1] == 8 // 4 and res.config["algorithm"]["num_local_steps"] == 4
    capsys.readouterr()
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("(loaded)") == 8


@pytest.mark.parametrize("text,param", [
    ("[grid]\nagents = 3\n", "run.rounds"),
    ("[run]\nrounds = 3\n[grid]\nwarp = 9\n", "grid.warp"),
    ("[run]\nrounds = 3\nspeed = 1\n[grid]\nagents = 3\n", "run.speed"),
    ("[run]\nrounds = 3\n[grid]\nstep_size = -1.0\n", "step_size"),
    ("not toml [", "config"),
    ("[run]\nrounds = 3\n[grid]\nquantizer = \"qsgdd\"\n", "grid.quantizer"),
    ("[run]\nrounds = 3\n[grid]\nalgorithm = [\"fedlsa\", \"fedlsaa\"]\n", "grid.algorithm"),
    ("[run]\nrounds = 3\n[grid]\nproblem = \"gausian\"\n", "grid.problem"),
    ("[run]\nrounds = 3\nrecords = 0\n[grid]\nagents = 3\n", "run.records"),
])
def test_bad_sweep_files(tmp_path, capsys, text, param):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{param}=" in err or f"{param} is invalid" in err, err
