"""Result files that always reload, sweeps that survive bad files and huge grids, plugins that ask
permission, metrics that fail clearly.

Every metric name ``fj.simulate`` accepts round-trips through ``save``/``fj.load``, the others are
refused before compiling; a metric that raises or returns a non-scalar is a one-line error naming it;
``fj.load`` refuses (``DamagedFileError`` naming the field) a file whose configuration lacks keys, whose
arrays disagree with each other or with the configuration, or whose metrics are incomplete; a sweep
(and ``--collect``) treats such a file like a damaged one; grids above ``MAX_GRID`` are refused before
they are expanded; a sweep file naming ``module:factory`` needs ``--allow-plugins``; a plugin that
calls ``sys.exit`` is an error, not a silent exit.
"""

import dataclasses
import importlib
import json
import sys
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax import cli
from fedsa_jax._io import DamagedFileError

sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")
sweep_mod = importlib.import_module("fedsa_jax._runtime.sweep")


@pytest.fixture(scope="module")
def problem():
    return fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=2, dim=2)


def norm(state, problem):
    return jnp.sum(state.theta**2)


@pytest.fixture(scope="module")
def saved(problem, tmp_path_factory):
    """A result with a metric, saved: (result, path, its arrays)."""
    res = fj.simulate(1, problem, fj.fedlsa(0.1, 2), 3, 4, keep_seeds=2, metrics={"m1": norm})
    path = tmp_path_factory.mktemp("saved") / "r.npz"
    res.save(path)
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    return res, path, arrays


def assert_same(a, b):
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name == "metrics":
            assert list(x) == list(y)
            for name in x:
                for f in ("mean", "sem", "quantiles", "seeds"):
                    np.testing.assert_array_equal(getattr(x[name], f), getattr(y[name], f))
        elif field.name == "config":
            assert json.loads(json.dumps(x)) == y
        else:
            np.testing.assert_array_equal(x, y)


def rename(res, name):
    config = {**res.config, "metrics": [name]}
    return dataclasses.replace(res, metrics={name: res.metrics["m1"]}, config=config)


def test_a_metric_named_with_double_underscores_reloads_and_so_do_older_files(saved, tmp_path):
    res, path, arrays = saved
    assert_same(res, fj.load(path))
    fj.metrics.resolve({"a__b": norm})  # accepted by fj.simulate, so it must load back
    rename(res, "a__b").save(tmp_path / "r.npz")
    assert_same(rename(res, "a__b"), fj.load(tmp_path / "r.npz"))
    # a file written before counts, quantiles, kept seeds and metrics were recorded still loads
    old = {
        k: v
        for k, v in arrays.items()
        if k not in ("communications", "messages_delivered", "samples", "mse_quantiles", "seed_mse")
        and "metric" not in k
    }
    config = {k: v for k, v in _config(arrays).items() if k not in ("metrics", "keep_seeds")}
    np.savez(tmp_path / "old.npz", **{**old, "config_json": np.array(json.dumps(config))})
    back = fj.load(tmp_path / "old.npz")
    np.testing.assert_array_equal(back.samples, res.samples)  # FedLSA's formula: t N H
    assert back.metrics == {} and back.seed_mse.shape == (len(res.rounds), 0)


@settings(max_examples=30, deadline=None)
@given(
    name=st.one_of(
        st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,110}", fullmatch=True),
        st.text(max_size=12),
        st.sampled_from(
            ["x__mean", "A__B__sem", "a_", "b___", "mse", "metric__c", "q__seeds__", "_a", "a-b"]
        ),
    )
)
@example(name="a__b")
def test_every_accepted_metric_name_round_trips_and_others_are_refused_before_compiling(saved, problem, name):
    res, path, _ = saved
    try:
        fj.metrics.resolve({name: norm})
    except ValueError as err:
        assert str(err).startswith("metrics=") and "\n" not in str(err)
        before = sim_mod._num_traces
        with pytest.raises(ValueError, match=r"^metrics="):
            fj.simulate(1, problem, fj.fedlsa(0.1, 2), 3, 4, metrics={name: norm})
        assert sim_mod._num_traces == before  # refused before anything was traced
        return
    renamed = rename(res, name)
    out = path.with_name("renamed.npz")
    renamed.save(out)
    assert_same(renamed, fj.load(out))


@pytest.mark.parametrize(
    "fn,says",
    [
        (lambda s, p: 1 / 0, "it raised ZeroDivisionError: division by zero"),
        (lambda s, p: "x", "returned a str"),
        (lambda s: 1.0, "it raised TypeError"),
        (
            lambda s, p: (_ for _ in ()).throw(RuntimeError("line one\nline two")),
            "it raised RuntimeError: line one",
        ),
        (lambda s, p: bool(s.theta[0] > 0), "it raised TracerBoolConversionError"),
    ],
    ids=["raises", "string", "arity", "multi-line", "python-if"],
)
def test_metrics_that_raise_or_return_non_scalars_are_one_line_errors_naming_them(problem, fn, says):
    with pytest.raises(ValueError, match=r"^metrics\['m'\]='m' is invalid: ") as err:
        fj.simulate(1, problem, fj.fedlsa(0.1, 2), 3, 4, metrics={"m": fn})
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def _config(arrays):
    return json.loads(str(arrays["config_json"]))


def _json(config):
    return np.array(json.dumps(config))


def _with_config(arrays, **changes):
    return {**arrays, "config_json": _json({**_config(arrays), **changes})}


def _without(arrays, *names):
    return {k: v for k, v in arrays.items() if k not in names}


def _set(**arrays):
    return lambda a: {**a, **{k: v(a) for k, v in arrays.items()}}


def _shorter(a):  # every per-round array two rounds long, rounds included
    return {k: v if k in ("config_json", "final_theta", "theta_star") else v[:2] for k, v in a.items()}


DAMAGES = {  # label -> (arrays -> arrays, what the message says)
    "empty config": (_set(config_json=lambda a: np.array("{}")), "config_json has no dict 'problem'"),
    "config not a string": (_set(config_json=lambda a: np.arange(3)), "config_json is an array of int"),
    "num_rounds a string": (lambda a: _with_config(a, num_rounds="3"), "config_json's 'num_rounds' is '3'"),
    "no record_every": (
        _set(config_json=lambda a: _json(_without(_config(a), "record_every"))),
        "config_json has no int 'record_every'",
    ),
    "dtype float16": (lambda a: _with_config(a, dtype="float16"), "'dtype' is 'float16'"),
    "short mse_mean": (_set(mse_mean=lambda a: a["mse_mean"][:2]), "mse_mean has shape (2,), expected (4,)"),
    "long num_diverged": (_set(num_diverged=lambda a: np.zeros(61, int)), "num_diverged has shape (61,)"),
    "theta_mean of another d": (_set(theta_mean=lambda a: a["theta_mean"][:, :1]), "theta_mean has shape"),
    "final_theta of other seeds": (_set(final_theta=lambda a: a["final_theta"][:3]), "final_theta has shape"),
    "seed_mse of other K": (_set(seed_mse=lambda a: a["seed_mse"][:, :1]), "seed_mse has shape"),
    "rounds not the recorded rounds": (_set(rounds=lambda a: a["rounds"][::-1].copy()), "rounds is not 0, 1"),
    "rounds and everything shorter": (_shorter, "rounds is not 0, 1, 2, ..., 3"),
    "text mse_sem": (_set(mse_sem=lambda a: a["mse_sem"].astype(str)), "mse_sem has dtype <U"),
    "float num_diverged": (_set(num_diverged=lambda a: a["num_diverged"] * 0.5), "num_diverged has dtype f"),
    "complex theta_star": (_set(theta_star=lambda a: a["theta_star"] + 0j), "theta_star has dtype complex"),
    "metric missing a field": (lambda a: _without(a, "metric__m1__sem"), "no 'metric__m1__sem' array"),
    "listed metric absent": (lambda a: _with_config(a, metrics=["m1", "c"]), "no 'metric__c__mean' array"),
    "unlisted metric": (_set(metric__z__mean=lambda a: a["mse_mean"]), "'metric__z__mean' is of no metric"),
    "odd metric array": (_set(metric__m1__median=lambda a: a["mse_mean"]), "'metric__m1__median'"),
    "short metric": (_set(metric__m1__mean=lambda a: a["mse_mean"][:1]), "metric__m1__mean has shape"),
    "counts half there": (lambda a: _without(a, "samples"), "no 'samples' array"),
    "no counts, no bits_per_message": (
        lambda a: _without(
            _with_config(a, bits_per_message=None), "communications", "messages_delivered", "samples"
        ),
        "'bits_per_message'",
    ),
}


@pytest.mark.parametrize("label", list(DAMAGES))
def test_load_refuses_inconsistent_files_naming_the_field(saved, tmp_path, label):
    _, _, arrays = saved
    damage, field = DAMAGES[label]
    path = tmp_path / "bad.npz"
    np.savez(path, **damage(arrays))
    with pytest.raises(DamagedFileError, match=r"is damaged or not a fedsa_jax result file \(") as err:
        fj.load(path)
    message = str(err.value)
    assert field in message and str(path) in message and "\n" not in message, message


def build(problem):
    return lambda c: (problem, fj.fedlsa(c["step_size"], 2))


def test_sweep_treats_a_wrong_schema_file_like_a_damaged_one(problem, tmp_path):
    configs = fj.grid(step_size=[0.1, 0.2])
    first = fj.sweep(jax.random.key(1), configs, build(problem), 3, 3, out_dir=tmp_path)
    with np.load(first[1].path) as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(first[1].path, **{**arrays, "config_json": np.array("{}")})  # valid .npz, another schema
    says = r"a damaged sweep result counts as missing \(nothing is computed\): .*config_json has no"
    with pytest.warns(RuntimeWarning, match=says):
        listed = fj.sweep(jax.random.key(1), configs, build(problem), 3, 3, out_dir=tmp_path, compute=False)
    assert [e.status for e in listed] == ["loaded", "missing"]
    says = r"^recomputing a damaged sweep result: .*config_json has no"
    with pytest.warns(RuntimeWarning, match=says) as seen:
        again = fj.sweep(jax.random.key(1), configs, build(problem), 3, 3, out_dir=tmp_path)
    assert len(seen) == 1 and [e.status for e in again] == ["loaded", "recomputed"]
    np.testing.assert_array_equal(fj.load(first[1].path).final_theta, first[1].result.final_theta)


SWEEP_TOML = """
[run]
seeds = 3
rounds = 3
dtype = "float64"

[grid]
problem = "gaussian"
agents = 2
dim = 2
local_steps = 2
step_size = [0.1, 0.2, 0.3]
"""


def test_collect_reports_wrong_schema_files_without_a_traceback(tmp_path, capsys):
    cfg, out = tmp_path / "grid.toml", tmp_path / "out"
    cfg.write_text(SWEEP_TOML)
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    files = sorted(out.glob("*.npz"))
    with np.load(files[0]) as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(files[0], **{**arrays, "config_json": np.array("{}")})
    legacy = {k: v for k, v in arrays.items() if k not in ("communications", "messages_delivered", "samples")}
    np.savez(files[1], **{**legacy, "config_json": np.array("{}")})  # an older layout, and no configuration
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # shown by the command line, one line each
        assert cli.main(["sweep", str(cfg), "--out", str(out), "--collect", "--no-plot"]) == 1
    printed, err = capsys.readouterr()
    lines = err.splitlines()
    warned = [x.startswith("fedsa-jax: warning: a damaged sweep result counts as missing") for x in lines]
    assert warned == [True, True, False], err
    assert "config_json has no dict 'problem'" in lines[0] and "Traceback" not in err
    assert printed.count(": missing") == 2 and "2 configurations missing" in lines[2]


def test_grids_above_max_grid_are_refused_before_expanding(monkeypatch):
    def never(*args):
        raise AssertionError("the grid was expanded")

    monkeypatch.setattr(sweep_mod, "itertools", SimpleNamespace(product=never))
    axes = {f"a{i}": list(range(10)) for i in range(10)}  # 10^10 configurations
    with pytest.raises(
        ValueError,
        match=r"^grid of 10000000000 configurations \(10 a0 x 10 a1 x .*\) is "
        r"invalid: more than MAX_GRID = 100000; .*fj.sweep.MAX_GRID = N",
    ):
        fj.grid(**axes)
    with pytest.raises(ValueError, match=r"^grid of 100001 configurations"):
        fj.grid(a=list(range(100_001)), b=1)
    monkeypatch.undo()
    assert sweep_mod.MAX_GRID == fj.sweep.MAX_GRID == 100_000
    monkeypatch.setattr(fj.sweep, "MAX_GRID", 5)
    assert len(fj.grid(a=[1, 2, 3, 4, 5])) == 5
    with pytest.raises(ValueError, match=r"^grid of 6 configurations \(2 a x 3 b\) is invalid: .* = 5;"):
        fj.grid(a=[1, 2], b=[1, 2, 3], c="x")


def test_cli_refuses_grids_above_the_limit_before_anything_runs(tmp_path, capsys):
    cfg = tmp_path / "grid.toml"
    cfg.write_text(SWEEP_TOML)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(cfg), "--out", str(out), "--max-grid", "2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "fedsa-jax: error: grid of 3 configurations (3 step_size) is invalid: more than MAX_GRID = 2;"
        )
        and err.count("\n") == 1
        and not list(out.glob("*.npz"))
    ), err
    keys = ("agents", "dim", "local_steps", "skip", "problem_seed", "states", "bits")
    cfg.write_text("[run]\nrounds = 3\n[grid]\n" + "".join(f"{k} = {list(range(1, 11))}\n" for k in keys))
    assert cli.main(["sweep", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "grid of 10000000 configurations" in err and "MAX_GRID = 100000" in err and "--max-grid N" in err


PLUGINS = """
import sys

import fedsa_jax as fj


def exits(step_size, num_local_steps):
    raise SystemExit(0)


def fine(step_size, num_local_steps):
    return fj.fedlsa(step_size, num_local_steps)
"""


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch):
    (tmp_path / "plugins_ri.py").write_text(PLUGINS)
    (tmp_path / "exits_on_import_ri.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("plugins_ri", None)
    sys.modules.pop("exits_on_import_ri", None)


def test_a_sweep_file_naming_a_plugin_needs_allow_plugins(plugin_folder, capsys):
    marker = plugin_folder / "PWNED"
    (plugin_folder / "grid.toml").write_text(
        f'[run]\nrounds = 2\n[grid]\nalgorithm = "os:system"\n[params]\ncommand = "touch {marker}"\n'
    )
    assert cli.main(["sweep", "grid.toml", "--out", "o", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsa-jax: error: grid.algorithm='os:system' is invalid: ")
    assert "--allow-plugins" in err
    assert err.count("\n") == 1 and not marker.exists()  # nothing ran
    (plugin_folder / "grid.toml").write_text('[run]\nrounds = 2\n[grid]\nalgorithm = "absent_module_ri:f"\n')
    assert cli.main(["sweep", "grid.toml", "--out", "o", "--no-progress", "--allow-plugins"]) == 2
    assert "grid.algorithm='absent_module_ri:f' is invalid: no module named" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,says",
    [
        (
            ["run", "--algorithms", "plugins_ri:exits"],
            "--algorithms='plugins_ri:exits' is invalid: "
            "plugins_ri:exits(--step-size=0.05, --local-steps=1000) "
            "raised SystemExit: 0",
        ),
        (
            ["run", "--algorithms", "exits_on_import_ri:f"],
            "importing 'exits_on_import_ri' raised SystemExit: 0",
        ),
        (["sweep", "grid.toml", "--allow-plugins"], "grid.algorithm='plugins_ri:exits' is invalid: "),
    ],
)
def test_a_plugin_that_exits_is_an_error_not_a_silent_exit(plugin_folder, capsys, argv, says):
    (plugin_folder / "grid.toml").write_text('[run]\nrounds = 2\n[grid]\nalgorithm = "plugins_ri:exits"\n')
    assert cli.main([*argv, "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not list((plugin_folder / "o").glob("*.npz"))


@pytest.fixture(scope="module")
def two_seeds(problem, tmp_path_factory):
    """A 2-seed run with a privacy record, and a 2-seed run where every seed diverged: their arrays."""
    private = fj.fedlsa(0.1, 2, privacy=fj.channel.privacy(1.0, 1.0))
    with pytest.warns(RuntimeWarning, match="diverged"):
        blown = fj.simulate(1, problem, fj.fedlsa(50.0, 2), 4, 2)
    out = []
    for res in (fj.simulate(1, problem, private, 3, 2), blown):
        path = tmp_path_factory.mktemp("two") / "r.npz"
        res.save(path)
        with np.load(path) as f:
            out.append({k: f[k] for k in f.files})
    return out


def _edit(key, round_, value):
    def damage(a):
        arr = a[key].astype(np.float64).copy()
        arr[round_] = value
        return {**a, key: arr}

    return damage


def _privacy(**changes):
    return lambda a: _with_config(a, privacy={**_config(a)["privacy"], **changes})


TWO_SEED_DAMAGES = {
    "negative theta_sem": (_edit("theta_sem", 1, -0.5), "theta_sem is negative at round 1"),
    "NaN theta_sem, two seeds left": (_edit("theta_sem", 2, np.nan), "theta_sem is NaN at round 2, where 2"),
    "NaN mse_sem, two seeds left": (_edit("mse_sem", 3, np.nan), "mse_sem is NaN at round 3, where 2"),
    "negative epsilon": (_privacy(epsilon=-3), "privacy.epsilon is -3"),
    "text epsilon": (_privacy(epsilon="3"), "privacy.epsilon is '3'"),
    "NaN epsilon": (_privacy(epsilon=float("nan")), "privacy.epsilon is nan"),
    "delta 1": (_privacy(delta=1.0), "privacy.delta is 1.0"),
    "fractional releases": (_privacy(releases=2.5), "privacy.releases is 2.5"),
    "privacy a list": (lambda a: _with_config(a, privacy=[1]), "'privacy' is [1]"),
}


@pytest.mark.parametrize("label", list(TWO_SEED_DAMAGES))
def test_load_refuses_edited_two_seed_files_and_privacy_records(two_seeds, tmp_path, label):
    """Two seeds, none diverged: a standard error is defined (NaN refused), never negative; the privacy
    record as a run writes it (epsilon a number >= 0, delta in (0, 1), releases a count)."""
    damage, field = TWO_SEED_DAMAGES[label]
    path = tmp_path / "bad.npz"
    assert int(two_seeds[0]["num_diverged"].max()) == 0  # two seeds left at every round
    np.savez(path, **damage(two_seeds[0]))
    with pytest.raises(DamagedFileError, match=r"is damaged or not a fedsa_jax result file \(") as err:
        fj.load(path)
    assert field in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_load_accepts_runs_where_every_seed_diverged_and_names_a_folder(two_seeds, tmp_path):
    """A run whose every seed diverged (NaN standard errors there) is a result, loaded as saved; the
    unedited privacy record loads; a folder where a file is expected is reported as a folder."""
    ok, blown = two_seeds
    assert int(blown["num_diverged"][-1]) == 2 and np.isnan(blown["mse_sem"][-1])
    for arrays in (ok, blown):
        np.savez(tmp_path / "r.npz", **arrays)
        assert int(fj.load(tmp_path / "r.npz").num_diverged[-1]) == int(arrays["num_diverged"][-1])
    assert fj.load(tmp_path / "r.npz").num_seeds == 2
    (tmp_path / "folder.npz").mkdir()
    with pytest.raises(IsADirectoryError):
        fj.load(tmp_path / "folder.npz")
