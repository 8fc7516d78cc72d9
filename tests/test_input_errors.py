"""Inputs a careless or hostile user gives: each is a one-line ValueError naming the argument
(the option, on the command line: exit status 2) and saying what is allowed, raised before
anything compiles; options nothing reads are refused rather than silently ignored."""

import importlib
import re

import jax
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax import cli

sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")
FEW = settings(max_examples=20, deadline=None)
BIG = 2**31  # one past the largest size or index (int32)


def raises_one_line(make, name: str, *says: str) -> str:
    """``make()`` raises a one-line ValueError starting ``name=`` and containing ``says``."""
    before = sim_mod._num_traces
    with pytest.raises(ValueError) as info:
        make()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{name}=") and " is invalid: " in msg, msg
    for text in says:
        assert text in msg, msg
    assert sim_mod._num_traces == before  # refused before tracing anything
    return msg


SMALL = ("--agents", "2", "--rounds", "1", "--seeds", "2", "--no-plot")  # quick, should a run start


def cli_error(capsys, *argv: str) -> str:
    """The command fails with exit status 2 and one line on stderr (an argparse error or ours)."""
    try:
        rc = cli.main([*argv, *SMALL] if argv[0] == "run" else list(argv))
    except SystemExit as exit_:
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, (rc, err)
    return err


# ------------------------------------------------------------------------------------------------
# least squares: products that overflow


def test_least_squares_rows_of_1e200_name_features_without_lapack_noise(capfd):
    X = np.random.default_rng(0).normal(size=(20, 3)) * 1e200
    raises_one_line(
        lambda: fj.problems.least_squares([X], [np.ones(20)]),
        "features[0]",
        "expected at most sqrt(max float64 / n_0)",
    )
    assert capfd.readouterr().err == ""  # LAPACK never saw an infinite matrix


@FEW
@given(
    n=st.integers(1, 50),
    dtype=st.sampled_from(["float32", "float64"]),
    which=st.sampled_from(["features", "targets"]),
)
def test_least_squares_refuses_exactly_above_the_stated_magnitude(n, dtype, which):
    """Entries at 0.99 ``sqrt(max(dtype) / n_c)`` give finite ``A_bar``, ``b_bar``; at 1.01 times
    it they are refused naming the argument, with that bound in the message."""
    limit = np.sqrt(np.finfo(dtype).max / n)

    def make(scale):
        X, y = np.ones((n, 1)), np.ones(n)
        if which == "features":
            X = X * scale * limit
        else:
            y = y * scale * limit
        return fj.problems.least_squares([X], [y], dtype=dtype)

    ok = make(0.99)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in (ok.A_bar, ok.b_bar, ok.theta_star))
    msg = raises_one_line(lambda: make(1.01), f"{which}[0]", f"= {limit:.3g}", dtype)
    assert f"{1.01 * limit:.3g}" in msg


def test_least_squares_float32_overflowing_fixed_point_names_targets():
    X = np.random.default_rng(1).normal(size=(10, 2)) * 1e-30  # A_bar tiny, theta_star = 1e40 > max float32
    y = X @ np.array([1e40, 1e40])
    raises_one_line(
        lambda: fj.problems.least_squares([X], [y], dtype="float32"),
        "targets",
        "theta_star",
        "float32",
        "float64",
    )
    assert np.isfinite(fj.problems.least_squares([X], [y], dtype="float64").theta_star).all()


# ------------------------------------------------------------------------------------------------
# integer and bool arguments of the problem factories

FACTORIES = {
    "garnet": (
        fj.problems.garnet,
        ("num_agents", "num_states", "num_actions", "branching", "dim", "max_tries"),
    ),
    "random_gaussian_lsa": (fj.problems.random_gaussian_lsa, ("num_agents", "dim")),
    "qfedtd_mdp": (fj.problems.qfedtd_mdp, ("num_agents", "num_states", "dim")),
}
CASES = [(f, p) for f, (_, params) in FACTORIES.items() for p in params]


@FEW
@given(
    case=st.sampled_from(CASES),
    value=st.one_of(
        st.booleans(),
        st.integers(max_value=0),
        st.integers(min_value=BIG),
        st.just(2**70),
        st.just(np.int64(2**62)),
    ),
)
def test_factory_integers_out_of_range_name_the_parameter(case, value):
    factory, param = case
    make = FACTORIES[factory][0]
    raises_one_line(
        lambda: make(jax.random.key(0), **{param: value}), param, f"expected an integer in [1, {BIG - 1}]"
    )


@pytest.mark.parametrize(
    "make,param",
    [
        (lambda: fj.problems.garnet(jax.random.key(0), num_agents=2**22), "num_agents"),
        (lambda: fj.problems.garnet(jax.random.key(0), num_states=50_000, dim=2), "num_states"),
        (lambda: fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=2**23), "num_agents"),
        (lambda: fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=2**30), "num_agents"),
        (lambda: fj.problems.random_gaussian_lsa(jax.random.key(0), dim=50_000), "dim"),
    ],
)
def test_tables_beyond_int32_indexing_name_the_size(make, param):
    raises_one_line(make, param, "more than 2^31 - 1")


def test_branching_above_num_states_names_the_one_changed():
    raises_one_line(
        lambda: fj.problems.garnet(jax.random.key(0), num_states=1, dim=1),
        "num_states",
        "expected branching <= num_states",
    )
    raises_one_line(
        lambda: fj.problems.garnet(jax.random.key(0), branching=31),
        "branching",
        "expected branching <= num_states",
    )


REALS = [
    ("step_size", lambda v: fj.fedlsa(v, 2)),
    ("step_size", lambda v: fj.qfedtd(v)),
    ("success_prob", lambda v: fj.scafflsa(0.1, 2, success_prob=v)),
    ("comm_prob", lambda v: fj.scaffnew(0.1, v, 2)),
    ("heterogeneity", lambda v: fj.problems.garnet(jax.random.key(0), 2, heterogeneity=v)),
    ("perturbation", lambda v: fj.problems.garnet(jax.random.key(0), 2, perturbation=v)),
    ("gamma", lambda v: fj.problems.qfedtd_mdp(jax.random.key(0), gamma=v)),
    ("scale", lambda v: fj.schedule(lambda k: 0.1 / (1.0 + k), scale=v)),
]


@FEW
@given(case=st.sampled_from(REALS), value=st.sampled_from([True, False, np.bool_(True), np.array(True)]))
def test_bools_are_not_numbers(case, value):
    """``True`` is an int to Python; a real number argument refuses it, naming the argument."""
    name, make = case
    raises_one_line(lambda: make(value), name, "expected a finite real number", "not a bool")


# ------------------------------------------------------------------------------------------------
# server optimizers

SHRINK = optax.GradientTransformation(lambda params: (), lambda u, state, params=None: (u[:1], state))
GROW_STATE = optax.GradientTransformation(
    lambda params: (params,), lambda u, state, params=None: (-u, (state[0][:1],))
)


@pytest.mark.parametrize(
    "server,says",
    [
        (SHRINK, "its update must have the iterate's shape and dtype"),
        (GROW_STATE, "a state with the structure, shapes and dtypes"),
    ],
)
def test_server_optimizer_of_the_wrong_shape_is_refused(server, says):
    raises_one_line(lambda: fj.fedlsa(0.1, 2, server_optimizer=server), "server_optimizer", says)
    raises_one_line(lambda: fj.optimizer(server), "server_optimizer", says)


@pytest.mark.parametrize(
    "make",
    [
        lambda: fj.scafflsa(0.1, 2, server_optimizer=optax.sgd(-0.5)),
        lambda: fj.fedlsa(0.1, 2, server_optimizer=optax.adam(-0.01)),
        lambda: fj.fedlsa(0.1, 2, server_optimizer=optax.scale_by_adam()),  # no -lr scaling: it ascends
        lambda: fj.optimizer(optax.sgd, learning_rate=-1.0, momentum=0.5),
    ],
    ids=["sgd", "adam", "scale_by_adam", "factory"],
)
def test_server_optimizer_that_ascends_is_refused(make):
    raises_one_line(make, "server_optimizer", "learning rate >= 0", "away from the aggregate")
    for good in (
        optax.sgd(0.5),
        optax.sgd(1.5, momentum=0.9),
        optax.adam(0.01),
        optax.adamw(1e-3, weight_decay=0.1),
        optax.sgd(optax.linear_schedule(0.0, 1.0, 10)),
    ):  # a warm-up from 0 passes
        fj.scafflsa(0.1, 2, server_optimizer=good)


# ------------------------------------------------------------------------------------------------
# the command line: the option that set the parameter


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--states", "1"], "--states=1 is invalid: expected branching <= num_states"),
        (["--states", "50000"], "--states=50000 is invalid: num_agents x num_states^2"),
        (["--step-size", "-1"], "--step-size=-1.0 is invalid: expected a finite real number in (0.0"),
        (
            ["--problem", "gaussian", "--noise-A", "-1"],
            "--noise-A=-1.0 is invalid: noise levels must be >= 0",
        ),
        (
            ["--states", "5"],
            "--dim=8 (its default with --problem garnet) is invalid: expected dim <= --states=5",
        ),
        (
            ["--schedule", "inverse-time", "--decay-steps", "1e-300"],
            "--decay-steps=1e-300 is invalid: underflows",
        ),
    ],
)
def test_cli_errors_name_the_option_not_the_library_parameter(tmp_path, capsys, argv, says):
    err = cli_error(capsys, "run", *argv, "--out", str(tmp_path))
    assert err.startswith("fedsa-jax: error: ") and says in err, err


@pytest.mark.parametrize(
    "option,value",
    [("--decay-steps", "0"), ("--decay-steps", "-100"), ("--server-lr", "-1"), ("--server-lr", "0")],
)
def test_cli_positive_options(tmp_path, capsys, option, value):
    extra = ["--schedule", "inverse-time"] if option == "--decay-steps" else ["--server-optimizer", "sgd"]
    err = cli_error(capsys, "run", *extra, option, value, "--out", str(tmp_path))
    assert f"argument {option}: expected a finite real number > 0, got '{value}'" in err, err


def test_cli_bits_without_the_quantizer_that_reads_it(tmp_path, capsys):
    err = cli_error(capsys, "run", "--bits", "3", "--out", str(tmp_path))
    assert "--bits=3 is invalid: it is read only with --quantizer stochastic-uniform" in err, err
    assert "this run has --quantizer none" in err


def test_cli_qfedtd_local_steps(tmp_path, capsys):
    err = cli_error(capsys, "run", "--algorithms", "qfedtd", "--local-steps", "5", "--out", str(tmp_path))
    assert "--local-steps=5 is invalid: it is read only with algorithms with local steps" in err, err


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--quantizer", "qsgd", "--bits", "5"], "--bits"),
        (["--range", "1.5"], "--range"),
        (["--levels", "3"], "--levels"),
        (["--quantizer", "qsgd", "--k", "2"], "--k"),
        (["--decay-steps", "10"], "--decay-steps"),
        (["--algorithms", "fedlsa", "--comm-prob", "0.5"], "--comm-prob"),
        (["--algorithms", "qfedtd", "--skip", "2"], "--skip"),
        (["--problem", "gaussian", "--states", "4"], "--states"),
        (["--problem", "gaussian", "--sampling", "markov"], "--sampling"),
        (["--noise-b", "0.3"], "--noise-b"),
        (["--problem", "qfedtd-mdp", "--heterogeneity", "0.5"], "--heterogeneity"),
    ],
)
def test_cli_options_nothing_reads_are_refused(tmp_path, capsys, argv, option):
    err = cli_error(capsys, "run", *argv, "--out", str(tmp_path))
    pattern = rf"error: {option}=\S+ is invalid: it is read only with .+; drop {option}$"
    assert re.search(pattern, err.strip()), err


def test_sweep_total_local_steps_below_h_is_refused_before_running(tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        "[run]\ntotal_local_steps = 5\nseeds = 2\n[grid]\nagents = 2\nstates = 4\ndim = 2\n"
        "local_steps = [2, 10]\n"
    )
    err = cli_error(capsys, "sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-plot")
    assert "run.total_local_steps=5 is invalid" in err and "H = 10" in err
    assert "expected total_local_steps >= H" in err
    assert not list((tmp_path / "o").glob("*.npz"))  # nothing ran


def test_sweep_errors_name_the_grid_key(tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text("[run]\nrounds = 2\nseeds = 2\n[grid]\nagents = 2\nstates = 1\ndim = 1\n")
    err = cli_error(capsys, "sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-plot")
    assert "error: grid.states=1 is invalid: expected branching <= num_states" in err, err


# ------------------------------------------------------------------------------------------------
# the count laws' options: named, bounded, read


LAW_CASES = [  # (argv, the line's start after "error: ") for the values the parser lets through
    (["--delays", "fixed:-1"], "--delays='fixed:-1' is invalid: tau=-1: expected an integer >= 0"),
    (["--delays", "uniform:-2"], "--delays='uniform:-2' is invalid: tau_max=-2: expected an integer >= 0"),
    (["--delays", "fixed:1.5"], "--delays='fixed:1.5' is invalid: tau=1.5: expected an integer >= 0"),
    (["--delays", "geometric:-1,3"], "--delays='geometric:-1,3' is invalid: mean=-1.0: expected a real"),
    (["--delays", "geometric:nan,3"], "--delays='geometric:nan,3' is invalid: mean=nan: expected a real"),
    (["--delays", "geometric:1,-1"], "--delays='geometric:1,-1' is invalid: tau_max=-1: expected an integer"),
    (["--delays", "uniform:1e12"], "--delays='uniform:1e12' is invalid: tau_max=1000000000000: expected"),
    (
        ["--local-work", "fixed:1,0"],
        "--local-work='fixed:1,0' is invalid: steps[1]=0: expected an integer >= 1",
    ),
    (["--local-work", "fixed:2.5,1"], "--local-work='fixed:2.5,1' is invalid: steps[0]=2.5: expected an"),
    (
        ["--local-work", "uniform:3,2"],
        "--local-work='uniform:3,2' is invalid: high=2: expected an integer >= 3",
    ),
    (
        ["--local-work", "uniform:0,2"],
        "--local-work='uniform:0,2' is invalid: low=0: expected an integer >= 1",
    ),
    (["--local-work", "geometric:0.5,4"], "--local-work='geometric:0.5,4' is invalid: mean=0.5: expected a"),
    (
        ["--local-work", "geometric:2,0"],
        "--local-work='geometric:2,0' is invalid: max=0: expected an integer",
    ),
    (
        ["--local-work", "straggler:1.5,0.5"],
        "--local-work='straggler:1.5,0.5' is invalid: prob=1.5: expected",
    ),
    (["--local-work", "straggler:0.5,0"], "--local-work='straggler:0.5,0' is invalid: fraction=0: expected"),
    (["--local-work", "straggler:0.5,inf"], "--local-work='straggler:0.5,inf' is invalid: fraction=inf:"),
    (
        ["--algorithms", "fedbuff", "--durations", "fixed:0"],
        "--durations='fixed:0' is invalid: durations[0]=0",
    ),
    (
        ["--algorithms", "fedbuff", "--durations", "uniform:2,1"],
        "--durations='uniform:2,1' is invalid: high=1",
    ),
    (
        ["--algorithms", "fedbuff", "--durations", "geometric:0,3"],
        "--durations='geometric:0,3' is invalid: mean=0",
    ),
    (
        ["--algorithms", "fedbuff", "--durations", "straggler:1,2,3"],
        "--durations='straggler:1,2,3' is invalid: prob",
    ),
    (
        ["--algorithms", "fedbuff", "--durations", "straggler:1,0.5,0.5"],
        "--durations='straggler:1,0.5,0.5' is invalid: slowdown",
    ),
    (
        ["--algorithms", "fedbuff", "--durations", "fixed:1,2,3"],
        "--durations='fixed:1,2,3' is invalid: durations=",
    ),
    (["--algorithms", "fedbuff", "--buffer-size", "3"], "--buffer-size=3 is invalid: expected at most N = 2"),
    (
        ["--local-work", "fixed:1,1,1"],
        "--local-work='fixed:1,1,1' is invalid: steps='1,1,1': expected one count, or one per agent (N = 2)",
    ),
    (
        ["--local-work", "uniform:1,2000000000"],
        "--local-work='uniform:1,2000000000' is invalid: high=2000000000: the law's table",
    ),
    (
        ["--algorithms", "fedbuff", "--durations", "straggler:1,0.5,1e12"],
        "--durations='straggler:1,0.5,1e12' is invalid: slowdown=1000000000000.0: the law's table",
    ),
    (
        ["--local-steps", "3000000000"],
        "--local-steps=3000000000 is invalid: expected an integer in [1, 2**31 - 1]",
    ),
]


@pytest.mark.parametrize("argv,says", LAW_CASES, ids=[" ".join(a) for a, _ in LAW_CASES])
def test_cli_law_errors_name_the_option_and_its_text(tmp_path, capsys, argv, says):
    """A bad law on the command line is one line naming the flag and its text, then the law's own
    parameter and reason (the library alone said ``tau=-1 is invalid``, naming no option); a law or
    buffer for other agents than --agents, and a table beyond 2^24, too, before anything runs."""
    err = cli_error(capsys, "run", *argv, "--out", str(tmp_path))
    assert err.startswith(f"fedsa-jax: error: {says}"), err
    assert not list(tmp_path.glob("*.npz"))


@pytest.mark.parametrize(
    "grid,says",
    [
        ('delays = "fixed:-1"', "grid.delays='fixed:-1' is invalid: tau=-1: expected"),
        (
            'local_work = ["none", "uniform:3,2"]',
            "grid.local_work='uniform:3,2' is invalid: high=2: expected",
        ),
        ('algorithm = "fedbuff"\nbuffer_size = 4', "grid.buffer_size=4 is invalid: expected at most N = 2"),
        (
            'algorithm = "fedbuff"\ndurations = "fixed:0"',
            "grid.durations='fixed:0' is invalid: durations[0]=0",
        ),
    ],
)
def test_sweep_law_errors_name_the_grid_key(tmp_path, capsys, grid, says):
    cfg = tmp_path / "s.toml"
    cfg.write_text(f"[run]\nrounds = 2\nseeds = 2\n[grid]\nagents = 2\nstates = 4\ndim = 2\n{grid}\n")
    err = cli_error(capsys, "sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-plot")
    assert f"error: {says}" in err, err


@pytest.mark.parametrize(
    "argv,option,has",
    [
        (["--local-work-shared"], "--local-work-shared", "--local-work none"),
        (
            ["--local-work", "fixed:1,2", "--local-work-shared"],
            "--local-work-shared",
            "--local-work fixed:1,2",
        ),
        (["--delays-shared"], "--delays-shared", "--delays none"),
        (["--delays", "fixed:1", "--delays-shared"], "--delays-shared", "--delays fixed:1"),
        (["--work-normalization", "fednova"], "--work-normalization", "--local-work none"),
    ],
)
def test_cli_law_options_without_their_law_are_refused(tmp_path, capsys, argv, option, has):
    err = cli_error(capsys, "run", *argv, "--out", str(tmp_path))
    read_only = rf"error: {option}=\S+ is invalid: it is read only with --\S+ .+"
    assert re.search(rf"{read_only}, and this run has {has}; drop {option}$", err.strip()), err


def test_sweep_leaves_out_the_keys_an_algorithm_does_not_read(tmp_path, capsys):
    """``delays`` beside FedBuff (which has no delays) and ``work_normalization`` without a local work
    law are out of that configuration's file name and record, as they are out of its run; the
    FedLSA configuration keeps its delays."""
    import json

    cfg = tmp_path / "s.toml"
    cfg.write_text(
        "[run]\nrounds = 2\nseeds = 2\n[grid]\nagents = 2\nstates = 4\ndim = 2\nlocal_steps = 2\n"
        'algorithm = ["fedlsa", "fedbuff"]\ndelays = "fixed:1"\nwork_normalization = ["none", "fednova"]\n'
    )
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--no-progress"]) == 0
    capsys.readouterr()
    records = json.loads((tmp_path / "o" / "sweep.json").read_text())
    configs = {r["config"]["algorithm"]: r for r in records}
    assert len(records) == 2 and set(configs) == {"fedlsa", "fedbuff"}
    assert configs["fedlsa"]["config"]["delays"] == "fixed:1" and "delays" in configs["fedlsa"]["file"]
    assert "delays" not in configs["fedbuff"]["config"] and "delays" not in configs["fedbuff"]["file"]
    assert all("work_normalization" not in r["config"] for r in records)
    res = fj.load(tmp_path / "o" / configs["fedlsa"]["file"])
    assert res.config["algorithm"]["delays"]["law"] == "fixed"
