"""Federated Q-learning on the command line (``--problem q-learning``: the importance-averaging paper's
two-state MDP): a run of equal and importance averaging writes its files and a line per algorithm, no
closed-form bias is claimed, the options build ``fj.problems.two_state_q_learning``, and a bad value is
a one-line error naming its option."""

import json

import jax
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import cli, registry
from fedsa_jax.cli.parser import build_parser

TINY = ["--problem", "q-learning", "--agents", "4", "--seeds", "4", "--rounds", "3", "--local-steps", "5"]


def _problem(*argv):
    args = build_parser().parse_args(["run", "--problem", "q-learning", *argv])
    return registry.problems()["q-learning"].build(jax.random.key(args.problem_seed), args)


def test_run_writes_results_and_a_line_per_algorithm(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", *TINY, "--algorithms", "fedlsa,importance-averaging", "--step-size", "0.1"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    names = sorted(p.name for p in out.iterdir())
    assert "mse.png" in names and "summary.json" in names and "result_importance_averaging.npz" in names
    for name in ("fedlsa", "importance_averaging"):
        assert (
            sum(line.startswith(f"{name} ") and "final MSE" in line for line in captured.out.splitlines())
            == 1
        )
        res = fj.load(out / f"result_{name}.npz")
        assert res.theta_star.shape == (4,) and np.all(np.isfinite(res.mse_mean))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problem"]["family"] == "q_learning" and summary["problem"]["mode"] == "asynchronous"
    assert "not affine in theta" in summary["fedlsa_predicted_squared_bias_note"]
    assert "fedlsa_predicted_squared_bias" not in summary


def test_options_build_the_two_state_mdp():
    """Rewards r(s, a) = s, a stay probability in [0.4, 0.6] per (s, a) from --problem-seed; agent c
    prefers action c mod A with weight --heterogeneity; --sampling generative is synchronous."""
    p = _problem("--agents", "3", "--actions", "3", "--heterogeneity", "0.6", "--problem-seed", "7")
    assert p.mode == "asynchronous" and p.transitions.shape == (3, 2, 3, 2)
    P = np.asarray(p.transitions, np.float64)
    stay = np.random.default_rng(7).uniform(0.4, 0.6, size=(2, 3))
    np.testing.assert_allclose(P[:, 0, :, 0], np.broadcast_to(stay[0], (3, 3)), rtol=1e-6)
    np.testing.assert_allclose(P[:, 1, :, 1], np.broadcast_to(stay[1], (3, 3)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(p.rewards)[0], [[0, 0, 0], [1, 1, 1]])
    b = np.asarray(p.behaviour, np.float64)
    np.testing.assert_allclose(b[1, 0], [0.4 / 3, 0.4 / 3 + 0.6, 0.4 / 3], rtol=1e-6)
    assert _problem("--sampling", "generative").mode == "synchronous"
    assert _problem("--heterogeneity", "homogeneous").behaviour[0, 0, 0] == 0.5


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--states", "3"], "--states=3 is invalid: the q-learning problem has two states"),
        (["--agents", "1"], "--agents=1 is invalid: with --heterogeneity=1 each agent takes one action"),
        (["--algorithms", "importance-averaging", "--step-size", "1.5"], "--step-size=1.5 is invalid"),
        (["--problem", "garnet", "--algorithms", "importance-averaging"], "visits to it in the round"),
    ],
)
def test_bad_values_name_their_option(argv, says, tmp_path, capsys):
    argv = ["run", "--problem", "q-learning", *argv, "--rounds", "1", "--seeds", "2", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.startswith("fedsa-jax: error: "), err
