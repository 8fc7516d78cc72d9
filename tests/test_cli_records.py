"""What the command line records and prints, against the library called directly.

* FedLSA's predicted squared bias (printed, in summary.json and drawn as a reference
  line) is ``|fedlsa_bias|^2`` of the problem built independently;
* the exact overlay is ``exact_mse`` at every round, and the Monte Carlo curve agrees
  with it at every round;
* a run with another problem, heterogeneity level, quantizer, channel and dtype saves
  what ``fj.simulate`` returns for the same objects, seed by seed;
* every quantizer, algorithm and problem option builds the object it names.
"""

import json

import jax
import numpy as np
import optax
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax import cli


def test_markov_runs_say_the_closed_form_bias_is_the_iid_one(tmp_path, capsys):
    """Under Markov sampling the printed closed-form bias comes with a note (and in summary.json)
    that the limit also carries a Markov bias; a generative run prints none."""
    common = ["run", "--agents", "2", "--states", "4", "--dim", "2", "--algorithms", "fedlsa"]
    common += ["--local-steps", "2", "--rounds", "2", "--seeds", "4", "--no-plot"]
    assert cli.main([*common, "--sampling", "markov", "--out", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert "note: the closed form assumes i.i.d. observations" in err
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert "Markov bias" in summary["fedlsa_predicted_squared_bias_note"]
    assert cli.main([*common, "--out", str(tmp_path / "g")]) == 0
    assert "closed form assumes" not in capsys.readouterr().err
    assert "fedlsa_predicted_squared_bias_note" not in json.loads(
        (tmp_path / "g" / "summary.json").read_text()
    )


def test_squared_bias_and_exact_curve_are_reported(tmp_path, monkeypatch, capsys):
    import fedsa_jax.plotting

    drawn = {}
    real = fedsa_jax.plotting.plot_mse

    def spy(results, **kwargs):
        drawn.update(kwargs)
        return real(results, **kwargs)

    monkeypatch.setattr(fedsa_jax.plotting, "plot_mse", spy)
    out = tmp_path / "run"
    assert (
        cli.main(
            [
                "run",
                "--agents",
                "3",
                "--states",
                "5",
                "--dim",
                "3",
                "--algorithms",
                "fedlsa",
                "--local-steps",
                "4",
                "--step-size",
                "0.5",
                "--rounds",
                "6",
                "--seeds",
                "1500",
                "--dtype",
                "float64",
                "--exact",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    problem = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=5, dim=3, dtype="float64")
    alg = fj.fedlsa(0.5, 4)
    bias = fj.theory.fedlsa_bias(problem, 0.5, 4)
    level = float(bias @ bias)
    assert abs(np.linalg.norm(bias) - level) > 0.1 * level  # |bias| and |bias|^2 are far apart here
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fedlsa_predicted_squared_bias"] == pytest.approx(level, rel=1e-12)
    assert f"= {level:.4g}" in printed
    stationary = fj.theory.stationary_mse(problem, alg)  # --exact also draws the floor
    assert list(drawn["reference_lines"].values()) == [
        pytest.approx(level, rel=1e-12),
        pytest.approx(stationary, rel=1e-12),
    ]
    exact = fj.theory.exact_mse(problem, alg, 6)
    np.testing.assert_allclose(drawn["theory"]["fedlsa"], exact, rtol=1e-12)
    run = summary["runs"]["fedlsa"]
    assert run["exact_final_mse"] == pytest.approx(exact[-1], rel=1e-12)
    res = fj.load(out / "result_fedlsa.npz")
    assert run["final_mse"] == res.mse_mean[-1] and run["final_mse_sem"] == res.mse_sem[-1]
    np.testing.assert_array_equal(res.rounds, np.arange(7))
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), z  # every round, not only the last
    assert exact[0] - exact[-1] > 20 * Z_TOL * res.mse_sem[-1]


RUNS = {
    "gaussian-level-qsgd-received-float64": (
        [
            "--problem",
            "gaussian",
            "--heterogeneity",
            "0.3",
            "--agents",
            "3",
            "--dim",
            "3",
            "--noise-A",
            "0.2",
            "--noise-b",
            "0.4",
            "--problem-seed",
            "5",
            "--algorithms",
            "scafflsa",
            "--local-steps",
            "3",
            "--step-size",
            "0.1",
            "--quantizer",
            "qsgd",
            "--levels",
            "3",
            "--success-prob",
            "0.7",
            "--aggregation",
            "divide_by_received",
            "--dtype",
            "float64",
        ],
        lambda: fj.problems.random_gaussian_lsa(
            jax.random.key(5),
            num_agents=3,
            dim=3,
            heterogeneity=0.3,
            noise_A=0.2,
            noise_b=0.4,
            dtype="float64",
        ),
        {
            "scafflsa": lambda: fj.scafflsa(
                0.1, 3, quantizer=fj.channel.qsgd(3), success_prob=0.7, aggregation="divide_by_received"
            )
        },
    ),
    "qfedtd-mdp-randk-float32": (
        [
            "--problem",
            "qfedtd-mdp",
            "--agents",
            "3",
            "--states",
            "6",
            "--dim",
            "3",
            "--sampling",
            "generative",
            "--algorithms",
            "qfedtd",
            "--step-size",
            "0.4",
            "--quantizer",
            "rand-k",
            "--k",
            "2",
            "--success-prob",
            "0.6",
        ],
        lambda: fj.problems.qfedtd_mdp(
            jax.random.key(0), num_agents=3, num_states=6, dim=3, sampling="generative", dtype="float32"
        ),
        {"qfedtd": lambda: fj.qfedtd(0.4, fj.channel.rand_k(2), success_prob=0.6)},
    ),
    "gaussian-schedule-momentum-averaged-float64": (
        [
            "--problem",
            "gaussian",
            "--agents",
            "3",
            "--dim",
            "2",
            "--algorithms",
            "scafflsa,scaffnew",
            "--local-steps",
            "2",
            "--step-size",
            "0.2",
            "--schedule",
            "inverse-time",
            "--decay-steps",
            "3",
            "--server-optimizer",
            "sgd",
            "--server-lr",
            "0.8",
            "--server-momentum",
            "0.4",
            "--average",
            "2",
            "--comm-prob",
            "0.5",
            "--dtype",
            "float64",
        ],
        lambda: fj.problems.random_gaussian_lsa(
            jax.random.key(0),
            num_agents=3,
            dim=2,
            heterogeneity=1.0,
            noise_A=0.1,
            noise_b=0.5,
            dtype="float64",
        ),
        {
            f"averaged_{name}": (
                lambda make=make: fj.averaged(
                    make(
                        fj.schedule(fj.optim.inverse_time, eta0=0.2, k0=3.0),
                        server_optimizer=fj.optimizer(optax.sgd, learning_rate=0.8, momentum=0.4),
                    ),
                    burn_in=2,
                )
            )
            for name, make in (
                ("scafflsa", lambda eta, **kw: fj.scafflsa(eta, 2, **kw)),
                ("scaffnew", lambda eta, **kw: fj.scaffnew(eta, 0.5, 2, **kw)),
            )
        },
    ),
}


@pytest.mark.parametrize("case", list(RUNS))
def test_run_saves_what_the_library_computes(tmp_path, case):
    argv, make_problem, algorithms = RUNS[case]
    out = tmp_path / "run"
    assert (
        cli.main(
            ["run", *argv, "--rounds", "5", "--seeds", "6", "--seed", "2", "--no-plot", "--out", str(out)]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    problem = make_problem()
    assert summary["problem"] == problem.describe()
    for name, make in algorithms.items():
        alg = make()
        metrics = ["last_iterate_mse"] if name.startswith("averaged_") else None  # what --average records
        direct = fj.simulate(jax.random.key(2), problem, alg, 5, 6, metrics=metrics)
        saved = fj.load(out / f"result_{name}.npz")
        assert saved.config["algorithm"] == alg.describe()
        assert saved.config["bits_per_message"] == alg.bits_per_message(problem.dim)
        assert saved.config["dtype"] == str(problem.dtype) == str(saved.final_theta.dtype)
        np.testing.assert_array_equal(saved.final_theta, direct.final_theta)
        np.testing.assert_array_equal(saved.mse_mean, direct.mse_mean)
        np.testing.assert_array_equal(saved.bits_delivered, direct.bits_delivered)
        assert summary["runs"][name]["final_mse"] == float(direct.mse_mean[-1])
        if metrics:
            np.testing.assert_array_equal(
                saved.metrics["last_iterate_mse"].mean, direct.metrics["last_iterate_mse"].mean
            )


@pytest.mark.parametrize(
    "options,expected",
    [
        ([], None),
        (["--quantizer", "stochastic-uniform", "--bits", "5"], fj.channel.stochastic_uniform(5)),
        (
            ["--quantizer", "stochastic-uniform", "--bits", "2", "--range", "1.5"],
            fj.channel.stochastic_uniform(2, 1.5),
        ),
        (["--quantizer", "qsgd", "--levels", "7", "--bits", "2"], fj.channel.qsgd(7)),
        (["--quantizer", "rand-k", "--k", "3"], fj.channel.rand_k(3)),
        (["--quantizer", "natural"], fj.channel.natural()),
    ],
)
def test_quantizer_options_build_the_named_quantizer(options, expected):
    args = cli.build_parser().parse_args(["run", *options])
    assert cli._make_quantizer(args) == expected


@pytest.mark.parametrize(
    "name,options,expected",
    [
        (
            "fedlsa",
            [
                "--step-size",
                "0.3",
                "--local-steps",
                "7",
                "--skip",
                "3",
                "--quantizer",
                "natural",
                "--success-prob",
                "0.4",
                "--aggregation",
                "divide_by_received",
            ],
            fj.fedlsa(
                0.3,
                7,
                skip=3,
                quantizer=fj.channel.natural(),
                success_prob=0.4,
                aggregation="divide_by_received",
            ),
        ),
        ("scafflsa", ["--eta", "0.2", "-H", "5", "-p", "0.9"], fj.scafflsa(0.2, 5, success_prob=0.9)),
        ("scaffnew", ["--eta", "0.2", "-H", "5", "--comm-prob", "0.3"], fj.scaffnew(0.2, 0.3, 5)),
        (
            "fedlsa",
            ["--eta", "0.2", "-H", "5", "--server-optimizer", "adam", "--server-lr", "0.01", "--richardson"],
            fj.richardson(fj.fedlsa(0.2, 5, server_optimizer=fj.optimizer(optax.adam, learning_rate=0.01))),
        ),
        (
            "fedlsa",
            ["--eta", "0.2", "-H", "5", "--server-optimizer", "sgd", "--average", "0", "--richardson"],
            fj.richardson(
                fj.averaged(fj.fedlsa(0.2, 5, server_optimizer=fj.optimizer(optax.sgd, learning_rate=1.0)))
            ),
        ),
        (
            "qfedtd",
            [
                "--step-size",
                "0.6",
                "--local-steps",
                "9",
                "--skip",
                "2",
                "--quantizer",
                "stochastic-uniform",
                "--bits",
                "2",
                "-p",
                "0.5",
            ],
            fj.qfedtd(0.6, fj.channel.stochastic_uniform(2), success_prob=0.5),
        ),
    ],
)
def test_algorithm_options_build_the_named_algorithm(name, options, expected):
    """(QFedTD takes one local step and no skip whatever --local-steps and --skip say.)"""
    args = cli.build_parser().parse_args(["run", *options])
    assert cli._make_algorithm(name, args).describe() == expected.describe()


@pytest.mark.parametrize(
    "options,make",
    [
        (
            ["--problem", "garnet", "--heterogeneity", "0.4", "--agents", "4", "--states", "7", "--dim", "2"],
            lambda: fj.problems.garnet(jax.random.key(0), 4, heterogeneity=0.4, num_states=7, dim=2),
        ),
        (
            ["--problem", "garnet", "--heterogeneity", "homogeneous", "--agents", "2", "--states", "10"],
            lambda: fj.problems.garnet(jax.random.key(0), 2, heterogeneity="homogeneous", num_states=10),
        ),
        (
            ["--problem", "garnet", "--agents", "3", "--states", "9", "--dim", "3", "--sampling", "markov"],
            lambda: fj.problems.garnet(jax.random.key(0), 3, num_states=9, dim=3, sampling="markov"),
        ),
        (
            [
                "--problem",
                "gaussian",
                "--heterogeneity",
                "0.6",
                "--agents",
                "3",
                "--dim",
                "2",
                "--problem-seed",
                "4",
            ],
            lambda: fj.problems.random_gaussian_lsa(jax.random.key(4), 3, 2, heterogeneity=0.6),
        ),
        (
            ["--problem", "qfedtd-mdp", "--agents", "2", "--states", "5", "--dim", "3"],
            lambda: fj.problems.qfedtd_mdp(jax.random.key(0), 2, num_states=5, dim=3),
        ),
    ],
)
def test_problem_options_build_the_named_problem(options, make):
    args = cli.build_parser().parse_args(["run", *options, "--dtype", "float64"])
    got, want = cli._make_problem(args, jax.random.key(args.problem_seed)), make()
    assert got.describe() == want.describe()
    np.testing.assert_array_equal(np.asarray(got.A_bar), np.asarray(want.A_bar))
    np.testing.assert_array_equal(np.asarray(got.b_bar), np.asarray(want.b_bar))
