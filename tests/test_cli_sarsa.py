"""Federated SARSA on the command line (``--problem sarsa-garnet``): a run writes its files, figure and a
line per algorithm; its options build ``fj.problems.garnet_control``; a bad value is a one-line error
naming its option; no closed-form bias is claimed, and ``--exact`` draws the noise-free limits; a sweep
varies the temperature, the agents and the local steps.

Sizes are tiny (S = 4 states, A = 2 actions: d = 8 with one-hot features), so each test takes seconds.
"""

import json

import jax
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import cli, registry
from fedsa_jax.cli.parser import build_parser

S, A = 4, 2
TINY = ["--problem", "sarsa-garnet", "--agents", "2", "--states", str(S), "--actions", str(A), "--seeds", "4"]


def _problem(*argv):
    """The problem that ``fedsa-jax run --problem sarsa-garnet ARGV`` builds."""
    args = build_parser().parse_args(["run", "--problem", "sarsa-garnet", *argv])
    return registry.problems()["sarsa-garnet"].build(jax.random.key(args.problem_seed), args)


def one_line(text: str) -> str:
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


def test_run_writes_results_figure_and_a_line_per_algorithm(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", *TINY, "--rounds", "3", "--local-steps", "2", "--algorithms", "fedlsa,scafflsa"]
    assert cli.main([*argv, "--step-size", "0.01", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == [
        "mse.png",
        "result_fedlsa.csv",
        "result_fedlsa.npz",
        "result_scafflsa.csv",
        "result_scafflsa.npz",
        "summary.json",
    ]
    lines = captured.out.splitlines()
    for name in ("fedlsa", "scafflsa"):
        assert sum(line.startswith(f"{name} ") and "final MSE" in line for line in lines) == 1, captured.out
    assert (out / "mse.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("fedlsa", "scafflsa"):
        res = fj.load(out / f"result_{name}.npz")
        assert res.theta_star.shape == (S * A,) and res.final_theta.shape == (4, S * A)
        assert np.all(np.isfinite(res.mse_mean)) and res.mse_mean[-1] < res.mse_mean[0]
        assert res.rounds[-1] == 3 and res.config["algorithm"]["num_local_steps"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problem"]["family"] == "sarsa" and set(summary["runs"]) == {"fedlsa", "scafflsa"}
    # the closed-form bias is for linear SA: not claimed, and said so
    assert "fedlsa_predicted_squared_bias" not in summary
    assert "follow the iterate" in summary["fedlsa_predicted_squared_bias_note"]
    assert "no closed form" in captured.err


def test_exact_draws_the_noise_free_limits(tmp_path, capsys):
    """``--exact``: no exact MSE on SARSA, the noise-free limit of each algorithm instead: FedSARSA's is
    biased (H > 1), the drift-corrected one's is theta* itself (no line drawn)."""
    out = tmp_path / "run"
    argv = ["run", *TINY, "--rounds", "2", "--local-steps", "2", "--algorithms", "fedlsa,scafflsa"]
    assert cli.main([*argv, "--step-size", "0.05", "--dtype", "float64", "--exact", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert runs["fedlsa"]["noise_free_limit_squared_error"] > 1e-9
    assert runs["scafflsa"]["noise_free_limit_squared_error"] < 1e-20
    assert "exact_final_mse" not in runs["fedlsa"]
    limits = {line.split()[0]: line for line in printed.splitlines() if "noise-free limit |" in line}
    assert "drawn dashed" in limits["fedlsa"] and "not drawn" in limits["scafflsa"], printed


def test_options_build_the_control_garnet():
    """The seeds' list is read as written, --dim draws dense features from --problem-seed, and
    'homogeneous' is the level 0: every agent on the averaged MDP, whose limit theta_lim_fed is then."""
    argv = ("--agents", "3", "--states", "3", "--actions", "2", "--dim", "3", "--problem-seed", "5")
    p = _problem(
        *argv,
        "--generation-seeds",
        "2, 07",
        "--gamma",
        "0.5",
        "--temperature",
        "1.5",
        "--heterogeneity",
        "homogeneous",
        "--dtype",
        "float64",
    )
    mdps = [fj.problems.garnet_control_mdp(3, 2, 2, seed) for seed in (2, 7)]
    for c in range(3):
        np.testing.assert_allclose(p.transitions[c], (mdps[0][0] + mdps[1][0]) / 2, rtol=1e-12)
        np.testing.assert_allclose(p.rewards[c], (mdps[0][1] + mdps[1][1]) / 2, rtol=1e-12)
    features = np.random.default_rng(5).uniform(size=(6, 3))
    np.testing.assert_allclose(p.features, (features / features.sum(1, keepdims=True)).reshape(3, 2, 3))
    assert float(p.gamma) == 0.5 and float(p.temperature) == 1.5
    np.testing.assert_allclose(p.theta_star, p.theta_avg, atol=1e-9)


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--problem", "garnet", "--temperature", "1"], "--temperature=1.0 is invalid: it is read only with"),
        (["--problem", "sarsa-garnet", "--sampling", "markov"], "--sampling='markov' is invalid"),
        (["--problem", "sarsa-garnet", "--branching", "9", "--states", "4"], "--branching=9 is invalid"),
        (["--problem", "sarsa-garnet", "--states", "1"], "--states=1 is invalid: each state-action pair"),
    ],
)
def test_options_nothing_reads_or_the_library_refuses_name_their_option(argv, says, tmp_path, capsys):
    assert cli.main(["run", *argv, "--rounds", "1", "--seeds", "2", "--out", str(tmp_path)]) == 2
    err = one_line(capsys.readouterr().err)
    assert says in err and err.startswith("fedsa-jax: error: "), err


def test_sweep_over_the_temperature(tmp_path, capsys):
    """Two temperatures, two problems: each configuration's theta* is its own problem's limit. The
    agents, the local steps and the temperature are grid axes; a bad temperature names its key."""
    cfg = tmp_path / "grid.toml"
    cfg.write_text(
        f'[run]\nrounds = 2\nseeds = 4\n[grid]\nproblem = "sarsa-garnet"\nstates = {S}\nactions = {A}\n'
        'agents = 2\nalgorithm = "fedlsa"\nstep_size = 0.05\nlocal_steps = 2\ntemperature = [1.0, 2.0]\n'
        'generation_seeds = "0,1"\n'
    )
    out = tmp_path / "out"
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    index = json.loads((out / "sweep.json").read_text())
    assert sorted(row["config"]["temperature"] for row in index) == [1.0, 2.0]
    stars = {}
    for row in index:
        res = fj.load(out / row["file"])
        assert res.theta_star.shape == (S * A,) and np.all(np.isfinite(res.mse_mean))
        stars[row["config"]["temperature"]] = res.theta_star
    assert not np.allclose(stars[1.0], stars[2.0])
    _, axes, _ = cli._sweep_spec(cfg)
    assert axes["temperature"] == [1.0, 2.0]
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[run]\nrounds = 2\n[grid]\nproblem = "sarsa-garnet"\nagents = [2, 3]\nlocal_steps = [1, 5]\n'
    )
    assert set(cli._sweep_spec(bad)[1]) == {"problem", "agents", "local_steps"}
    bad.write_text('[run]\nrounds = 2\n[grid]\nproblem = "sarsa-garnet"\ntemperature = [1.0, 0.0]\n')
    capsys.readouterr()
    assert cli.main(["sweep", str(bad), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "grid.temperature=0.0 is invalid: expected a finite real number > 0" in err, err
