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
    rc = cli.main(
        [
            "run",
            "--agents",
            "4",
            "--local-steps",
            "5",
            "--step-size",
            "0.5",
            "--rounds",
            "6",
            "--seeds",
            "8",
            "--states",
            "10",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "mse.png",
        "result_fedlsa.csv",
        "result_fedlsa.npz",
        "result_scafflsa.csv",
        "result_scafflsa.npz",
        "summary.json",
    ]
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
    argv = [
        "run",
        "--agents",
        "3",
        "--local-steps",
        "4",
        "--step-size",
        "0.5",
        "--rounds",
        "6",
        "--seeds",
        "2000",
        "--states",
        "5",
        "--dim",
        "3",
        "--dtype",
        "float64",
        "--exact",
        "--band",
        "quantiles",
        "--x-axis",
        "samples",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    args = cli.build_parser().parse_args(argv)
    problem = cli._make_problem(args, jax.random.key(args.problem_seed))
    for name in ("fedlsa", "scafflsa"):
        alg = cli._make_algorithm(name, args)
        exact = fj.theory.exact_mse(problem, alg, 6)
        assert summary["runs"][name]["exact_final_mse"] == pytest.approx(exact[-1], rel=1e-12)
        floor = fj.theory.stationary_mse(problem, alg)  # the floor drawn with --exact
        assert summary["runs"][name]["stationary_mse"] == pytest.approx(floor, rel=1e-12)
        res = fj.load(out / f"result_{name}.npz")
        assert abs(res.mse_mean[-1] - exact[-1]) < 4.5 * res.mse_sem[-1]  # the run agrees with it
        csv = np.genfromtxt(out / f"result_{name}.csv", delimiter=",", names=True)
        np.testing.assert_array_equal(csv["mse_mean"], res.mse_mean)


@pytest.mark.parametrize("problem", ["gaussian", "qfedtd-mdp"])
def test_other_problems_and_float64(tmp_path, problem):
    rc = cli.main(
        [
            "run",
            "--problem",
            problem,
            "--algorithms",
            "scafflsa",
            "--agents",
            "2",
            "--local-steps",
            "2",
            "--step-size",
            "0.1",
            "--rounds",
            "3",
            "--seeds",
            "4",
            "--dtype",
            "float64",
            "--no-plot",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    res = fj.load(tmp_path / "result_scafflsa.npz")
    assert res.final_theta.dtype == np.float64


def test_help_documents_every_option(capsys):
    text = subprocess.run(
        [sys.executable, "-m", "fedsa_jax.cli", "run", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for opt in (
        "--problem",
        "--algorithms",
        "--step-size",
        "--local-steps",
        "--agents",
        "--rounds",
        "--seeds",
        "--seed",
        "--dtype",
        "--out",
        "--heterogeneity",
        "--sampling",
        "--skip",
        "--record-every",
        "--param",
    ):
        assert opt in text
    flat = " ".join(text.split())
    assert "(default: None)" not in flat and "(default: False)" not in flat and "['" not in flat
    assert flat.count("(default: on a terminal only)") == 1 and "(default: fedlsa,scafflsa)" in flat
    assert "bits_delivered" in flat and "a level in [0, 1]" in flat
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "--shard K/N" in flat and "--collect" in flat and "(default: None)" not in flat


def test_bad_options_give_clear_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--algorithms", "fedavg"])
    assert "fedlsa, scafflsa" in capsys.readouterr().err
    rc = cli.main(["run", "--step-size", "-1", "--out", str(tmp_path)])
    assert rc == 2
    assert "--step-size=-1.0 is invalid" in capsys.readouterr().err


def test_channel_options_and_qfedtd(tmp_path):
    rc = cli.main(
        [
            "run",
            "--problem",
            "qfedtd-mdp",
            "--agents",
            "3",
            "--algorithms",
            "qfedtd,fedlsa",
            "--local-steps",
            "2",
            "--step-size",
            "0.5",
            "--quantizer",
            "stochastic-uniform",
            "--bits",
            "3",
            "--success-prob",
            "0.5",
            "--rounds",
            "5",
            "--seeds",
            "16",
            "--x-axis",
            "bits",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    q = fj.load(tmp_path / "result_qfedtd.npz")
    ch = q.config["algorithm"]["channel"]
    assert ch["success_prob"] == 0.5 and ch["quantizer"] == {
        "kind": "stochastic_uniform",
        "bits_per_coordinate": 3,
    }
    assert q.config["algorithm"]["num_local_steps"] == 1
    assert q.config["bits_per_message"] == 32 + 10 * 3
    assert 0 < q.bits_delivered[-1] < q.bits_sent[-1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"]["fedlsa"]["bits_sent"] == 5 * 3 * (32 + 30)
    for quant in ("qsgd", "rand-k", "natural"):
        assert (
            cli.main(
                [
                    "run",
                    "--problem",
                    "gaussian",
                    "--agents",
                    "2",
                    "--algorithms",
                    "scafflsa",
                    "--local-steps",
                    "2",
                    "--rounds",
                    "3",
                    "--seeds",
                    "4",
                    "--quantizer",
                    quant,
                    "--no-plot",
                    "--out",
                    str(tmp_path / quant),
                ]
            )
            == 0
        )


def test_checkpoint_dir_resumes(tmp_path, monkeypatch):
    import importlib

    sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")
    args = [
        "run",
        "--agents",
        "3",
        "--local-steps",
        "2",
        "--rounds",
        "8",
        "--seeds",
        "6",
        "--states",
        "10",
        "--chunk-rounds",
        "2",
        "--no-plot",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    assert cli.main(args + ["--out", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["fedlsa", "scafflsa"]

    def no_more_rounds(*a, **k):
        raise AssertionError("a finished checkpoint must not run any round again")

    with monkeypatch.context() as m:
        m.setattr(sim_mod, "_advance", no_more_rounds)
        assert cli.main(args + ["--out", str(tmp_path / "b")]) == 0  # resumes from the finished checkpoints
    a, b = fj.load(tmp_path / "a" / "result_scafflsa.npz"), fj.load(tmp_path / "b" / "result_scafflsa.npz")
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    runs = json.loads((tmp_path / "b" / "summary.json").read_text())["runs"]
    assert runs["fedlsa"]["resumed"] and runs["fedlsa"]["agent_steps_run"] == 0
    assert runs["fedlsa"]["agent_steps_per_s"] is None  # nothing ran: no throughput to report
    # another configuration shares the folder: it runs beside the first, which stays resumable
    rc = cli.main(
        args[:-2]
        + ["--step-size", "0.2", "--checkpoint-dir", str(tmp_path / "ck"), "--out", str(tmp_path / "c")]
    )
    assert rc == 0 and len(list((tmp_path / "ck" / "fedlsa").glob("checkpoint-*.npz"))) == 2


def test_resumed_run_reports_what_it_ran(tmp_path, monkeypatch, capsys):
    import importlib

    sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")
    real, calls = sim_mod._advance, []

    def crash_after_two(*a, **k):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt("simulated crash")
        return real(*a, **k)

    args = [
        "run",
        "--algorithms",
        "fedlsa",
        "--agents",
        "3",
        "--local-steps",
        "2",
        "--rounds",
        "8",
        "--seeds",
        "6",
        "--states",
        "10",
        "--chunk-rounds",
        "2",
        "--no-plot",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--out",
        str(tmp_path / "o"),
    ]
    with monkeypatch.context() as m:
        m.setattr(sim_mod, "_advance", crash_after_two)
        with pytest.raises(KeyboardInterrupt):
            cli.main(args)
    capsys.readouterr()
    assert cli.main(args) == 0
    run = json.loads((tmp_path / "o" / "summary.json").read_text())["runs"]["fedlsa"]
    assert run["resumed"] and run["resumed_from"] == {"seed_batch": 0, "round": 4}
    assert run["agent_steps_run"] == 6 * (8 - 4) * 3 * 2  # only the rounds this run computed
    assert run["agent_steps_per_s"] > 0 and 0 <= run["compile_s"] <= run["seconds"]
    assert "resumed at seed batch 0 round 4 of 8: compile" in capsys.readouterr().out


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
    row = next(
        r
        for r in index
        if r["config"]
        == {
            "problem": "garnet",
            "states": 10,
            "agents": 3,
            "algorithm": "scafflsa",
            "step_size": 0.2,
            "local_steps": 4,
        }
    )
    res = fj.load(out / row["file"])
    assert res.rounds[-1] == 8 // 4 and res.config["algorithm"]["num_local_steps"] == 4
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("(loaded)") == 8
    (out / row["file"]).unlink()
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--collect"]) == 1  # computes nothing, lists it
    assert "1 configurations missing" in capsys.readouterr().err
    assert [r["status"] for r in json.loads((out / "sweep.json").read_text())].count("missing") == 1


@pytest.mark.parametrize(
    "text,param",
    [
        ("[grid]\nagents = 3\n", "run.rounds"),
        ("[run]\nrounds = 3\n[grid]\nwarp = 9\n", "grid.warp"),
        ("[run]\nrounds = 3\nspeed = 1\n[grid]\nagents = 3\n", "run.speed"),
        ("[run]\nrounds = 3\n[grid]\nstep_size = -1.0\n", "step_size"),
        ("not toml [", "config"),
        ('[run]\nrounds = 3\n[grid]\nquantizer = "qsgdd"\n', "grid.quantizer"),
        ('[run]\nrounds = 3\n[grid]\nalgorithm = ["fedlsa", "fedlsaa"]\n', "grid.algorithm"),
        ('[run]\nrounds = 3\n[grid]\nproblem = "gausian"\n', "grid.problem"),
        ("[run]\nrounds = 3\nrecords = 0\n[grid]\nagents = 3\n", "run.records"),
        ("[run]\nrounds = 3\nout = 5\n[grid]\nagents = 3\n", "run.out"),
        ("run = 5\n[grid]\nagents = 3\n", "run"),
        ("[run]\nrounds = 3\n[grid]\nstep_size = []\n", "grid.step_size"),
        ("[run]\nrounds = 3\nseed = 1.7\n[grid]\nagents = 3\n", "run.seed"),
        ("[run]\nrounds = 3\nseed = 99999999999999999999\n[grid]\nagents = 3\n", "run.seed"),
        ("[run]\nrounds = 3\nseed = 4294967296\n[grid]\nagents = 3\n", "run.seed"),
        ("[run]\nrounds = 3\nseeds = true\n[grid]\nagents = 3\n", "run.seeds"),
        ("[run]\nrounds = 3\n[grid]\nagents = [2, 2.5]\n", "grid.agents"),
        ('[run]\nrounds = 3\n[grid]\nheterogeneity = "foo"\n', "grid.heterogeneity"),
        ('[run]\nrounds = 3\n[grid]\nrange = "foo"\n', "grid.range"),
        ('[run]\nrounds = 3\n[grid]\nalgorithm = "fedlsa"\n[params]\nbeta = 1\n', "params"),
        ('[run]\nrounds = 3\n[grid]\nalgorithm = "m:f"\n[params]\nbeta = [[1]]\n', "params.beta"),
        ('[run]\nrounds = 3\nfigure_x = "agents"\n[grid]\nstep_size = [0.1, 0.2]\n', "run.figure_x"),
        ('[run]\nrounds = 3\n[grid]\nalgorithm = "nomodule_here:f"\n', "grid.algorithm"),
    ],
)
def test_bad_sweep_files(tmp_path, capsys, text, param):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{param}=" in err or f"{param} is invalid" in err, err
    assert err.count("\n") == 1 and err.startswith("fedsa-jax: error: "), err


def one_line_error(text: str) -> str:
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--seed", "99999999999999999999999"], "argument --seed: expected an integer in [0, 4294967295]"),
        (["--problem-seed", "-1"], "argument --problem-seed"),
        (
            ["--heterogeneity", "foo"],
            "argument --heterogeneity: expected 'homogeneous', 'heterogeneous' or a number",
        ),
        (["--range", "foo"], "argument --range: expected 'maxabs' or a number R > 0"),
        (["--step-size", "nan"], "argument --step-size/--eta: expected a finite real number"),
        (["--param", "beta"], "argument --param: expected NAME=VALUE"),
        (["--algorithms", "fedlsa,mod:"], "argument --algorithms/--algorithm"),
        (["--x-axis", "bitz"], "argument --x-axis: invalid choice"),
        (
            ["--problem", "sarsa-garnet", "--temperature", "0"],
            "argument --temperature: expected a finite real number > 0, got '0'",
        ),
        (
            ["--problem", "sarsa-garnet", "--temperature", "nan"],
            "argument --temperature: expected a finite real number > 0",
        ),
        (
            ["--problem", "sarsa-garnet", "--generation-seeds", "0,-1"],
            "argument --generation-seeds: expected comma-separated integers",
        ),
        (
            ["--problem", "sarsa-garnet", "--gamma", "1"],
            "argument --gamma: expected a number in [0, 1), got '1'",
        ),
        (["--problem", "sarsa-garnet", "--actions", "0"], "argument --actions: expected an integer >= 1"),
    ],
)
def test_bad_options_are_one_line_errors(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *argv])
    assert exit_.value.code == 2
    err = one_line_error(capsys.readouterr().err)
    assert says in err and err.startswith("fedsa-jax run: error: "), err


def test_unusable_output_folders_fail_before_any_simulation(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "file" / "sub"):
        for option, argv in [
            ("--out", ["--out", str(bad)]),
            ("--checkpoint-dir", ["--checkpoint-dir", str(bad), "--out", str(tmp_path / "o")]),
        ]:
            assert cli.main(["run", *argv]) == 2
            out, err = capsys.readouterr()
            assert f"fedsa-jax: error: {option}='{bad}' is invalid:" in one_line_error(err) and not out
    cfg = tmp_path / "grid.toml"
    cfg.write_text(SWEEP_TOML)
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "file")]) == 2
    assert "fedsa-jax: error: --out=" in one_line_error(capsys.readouterr().err)
    cfg.write_text(SWEEP_TOML.replace("records = 2", "records = 2\nout = 'file'"))
    with pytest.MonkeyPatch.context() as m:
        m.chdir(tmp_path)
        assert cli.main(["sweep", str(cfg)]) == 2
    assert "fedsa-jax: error: run.out='file' is invalid" in one_line_error(capsys.readouterr().err)
    # the real command, in its own process: no traceback, nothing simulated
    proc = subprocess.run(
        [sys.executable, "-m", "fedsa_jax.cli", "run", "--out", str(tmp_path / "file")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and not proc.stdout
    assert one_line_error(proc.stderr).startswith(
        f"fedsa-jax: error: --out='{tmp_path / 'file'}' is invalid: it is an existing file, expected a folder"
    )


FACTORY_MODULE = '''
"""FedLSA with a server step of size beta toward the agents' mean: theta + beta (mean - theta)."""
import dataclasses

import jax

import fedsa_jax as fj
from fedsa_jax.algorithms.fedlsa import init
from fedsa_jax.algorithms.fedlsa import step as fedlsa_step


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Config:
    step_size: float
    beta: float  # a traced leaf: a sweep over beta is one compile
    channel: object
    num_local_steps: int = dataclasses.field(metadata=dict(static=True))
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))


def step(rand, state, problem, config):
    new, info = fedlsa_step(rand, state, problem, config)
    error = state.error + config.beta * (new.error - state.error)  # FedLSA's state carries theta - theta_star
    return new._replace(theta=problem.theta_star + error, error=error), info


def relaxed_fedlsa(beta, step_size, num_local_steps):
    base = fj.fedlsa(step_size, num_local_steps).config
    config = Config(base.step_size, float(beta), base.channel, base.num_local_steps, base.skip)
    return fj.Algorithm(config, "relaxed_fedlsa", init, step)


def raises(beta=1.0):
    raise RuntimeError("beta must be\\nsmall")


def returns_int():
    return 3


not_callable = 3
'''

FACTORY_SWEEP = """
[run]
seeds = 5
rounds = 4
dtype = "float64"
out = "sweep"

[grid]
problem = "gaussian"
agents = 2
dim = 2
local_steps = 3
step_size = 0.1
algorithm = ["fedlsa", "{module}:relaxed_fedlsa"]

[params]
beta = [0.0, 1.0]
"""


def test_user_algorithm_runs_through_the_cli_files_and_sweeps(tmp_path, monkeypatch, capsys):
    module = "user_algs_run"  # a name of its own: the test process imports it too
    (tmp_path / f"{module}.py").write_text(FACTORY_MODULE)
    (tmp_path / "grid.toml").write_text(FACTORY_SWEEP.format(module=module))
    base = [sys.executable, "-m", "fedsa_jax.cli"]
    run = base + [
        "run",
        "--problem",
        "gaussian",
        "--agents",
        "2",
        "--dim",
        "2",
        "--local-steps",
        "3",
        "--step-size",
        "0.1",
        "--rounds",
        "4",
        "--seeds",
        "5",
        "--dtype",
        "float64",
        "--no-plot",
        "--algorithms",
        f"fedlsa,{module}:relaxed_fedlsa",
        "--param",
        "beta=1",
        "--out",
        "run",
    ]
    shards = [
        base + ["sweep", "grid.toml", "--shard", f"{k}/2", "--no-progress", "--allow-plugins"] for k in (0, 1)
    ]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in [run] + shards
    ]  # real CLI processes, side by side
    logs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [log[1][-2000:] for log in logs]
    # beta = 1 is FedLSA; the result file is named after the algorithm
    mine, ref = (
        fj.load(tmp_path / "run" / "result_relaxed_fedlsa.npz"),
        fj.load(tmp_path / "run" / "result_fedlsa.npz"),
    )
    np.testing.assert_allclose(mine.final_theta, ref.final_theta, rtol=1e-10, atol=1e-14)
    assert mine.config["algorithm"]["algorithm"] == "relaxed_fedlsa"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["runs"]) == {"fedlsa", "relaxed_fedlsa"}
    assert "shard 1/2: 1 of 3 configurations" in logs[2][0]
    # collect the shards: everything loads (fedlsa once: [params] do not apply to it), index and figure
    monkeypatch.chdir(tmp_path)
    try:
        assert cli.main(["sweep", "grid.toml", "--no-progress", "--allow-plugins"]) == 0
    finally:
        sys.modules.pop(module, None)
    assert capsys.readouterr().out.count("(loaded)") == 3
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    by_beta = {r["config"].get("params.beta"): fj.load(tmp_path / "sweep" / r["file"]) for r in rows}
    assert set(by_beta) == {None, 0.0, 1.0}
    theta_star = by_beta[0.0].theta_star
    np.testing.assert_allclose(
        by_beta[0.0].mse_mean, theta_star @ theta_star, rtol=1e-12
    )  # beta = 0: theta stays 0
    np.testing.assert_allclose(by_beta[1.0].final_theta, by_beta[None].final_theta, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(by_beta[1.0].final_theta, mine.final_theta, rtol=1e-12)
    assert (tmp_path / "sweep" / "sweep.png").exists()


@pytest.mark.parametrize(
    "spec,params,says",
    [
        (
            "absent_module_x:f",
            [],
            "--algorithms='absent_module_x:f' is invalid: no module named 'absent_module_x'",
        ),
        ("{m}:nothere", [], "--algorithms='{m}:nothere' is invalid: module '{m}' has no attribute 'nothere'"),
        ("{m}:not_callable", [], "is invalid: 'not_callable' is a int, expected a function"),
        ("{m}:raises", [], "{m}:raises() raised RuntimeError: beta must be small"),  # takes no step_size
        ("{m}:returns_int", [], "{m}:returns_int returned a int, expected a fedsa_jax.Algorithm"),
        (
            "{m}:relaxed_fedlsa",
            ["--param", "gamma=2"],
            "--param='gamma=2' is invalid: {m}:relaxed_fedlsa takes no argument 'gamma'",
        ),
        (
            "fedlsa",
            ["--param", "beta=2"],
            "--param is invalid: it applies to 'module:factory' algorithms only",
        ),
        (
            "{m}:relaxed_fedlsa,{m}:relaxed_fedlsa",
            ["--param", "beta=2"],
            "two algorithms are named 'relaxed_fedlsa'",
        ),
    ],
)
def test_user_algorithm_errors_name_the_option(tmp_path, monkeypatch, capsys, spec, params, says):
    module = f"user_algs_{abs(hash(spec + str(params))) % 10**8}"
    (tmp_path / f"{module}.py").write_text(FACTORY_MODULE)
    monkeypatch.chdir(tmp_path)
    try:
        rc = cli.main(["run", "--algorithms", spec.format(m=module), *params, "--out", str(tmp_path / "o")])
    finally:
        sys.modules.pop(module, None)
    assert rc == 2
    err = one_line_error(capsys.readouterr().err)
    assert says.format(m=module) in err, err


def test_param_values_are_json_or_text():
    assert (
        cli._param("a=0.9") == ("a", 0.9)
        and cli._param("a=3") == ("a", 3)
        and cli._param("a=true") == ("a", True)
    )
    assert cli._param('a="0.1"') == ("a", "0.1") and cli._param("a=adam") == ("a", "adam")
    assert cli._param("a=[1, 2]") == ("a", "[1, 2]") and cli._param("a=NaN") == ("a", "NaN")


def test_diverged_run_writes_strict_json(tmp_path, capsys):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("default")  # shown by the CLI, one line each
        # the kernel of test_other_problems_and_float64[gaussian], at a step size that diverges
        assert (
            cli.main(
                [
                    "run",
                    "--problem",
                    "gaussian",
                    "--algorithms",
                    "scafflsa",
                    "--agents",
                    "2",
                    "--local-steps",
                    "2",
                    "--step-size",
                    "5",
                    "--rounds",
                    "30",
                    "--seeds",
                    "4",
                    "--dtype",
                    "float64",
                    "--no-plot",
                    "--no-progress",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
    err = capsys.readouterr().err
    assert err.startswith("fedsa-jax: warning: scafflsa") and err.count("\n") == 1
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text
    run = json.loads(text)["runs"]["scafflsa"]
    assert run["final_mse"] is None and run["num_diverged"] == 4
