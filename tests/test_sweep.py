"""Sweeps: the same numbers as single runs, one compile per structural group, resume by skipping."""

import importlib
import json
import re

import jax
import numpy as np
import pytest

import fedsa_jax as fj

sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")
sweep_mod = importlib.import_module("fedsa_jax._runtime.sweep")


@pytest.fixture(scope="module")
def problem():
    return fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=2)


def build_for(problem):
    def build(c):
        make = {"fedlsa": fj.fedlsa, "scafflsa": fj.scafflsa}[c["algorithm"]]
        return problem, make(c["step_size"], c["H"], success_prob=c.get("p", 1.0))

    return build


def test_grid():
    g = fj.grid(a=[1, 2], b="x", c=[True, False])
    assert g == [
        {"a": 1, "b": "x", "c": True},
        {"a": 1, "b": "x", "c": False},
        {"a": 2, "b": "x", "c": True},
        {"a": 2, "b": "x", "c": False},
    ]
    with pytest.raises(ValueError, match="^a="):
        fj.grid(a=[])


def test_sweep_equals_single_runs_and_batches_continuous_parameters(problem, tmp_path):
    configs = fj.grid(algorithm=["fedlsa", "scafflsa"], step_size=[0.2, 0.4, 0.8], H=[2, 3], p=[0.5, 0.9])
    key = jax.random.key(4)
    rounds = lambda c: 12 // c["H"]  # noqa: E731  (a structural function of the config)
    before = sim_mod._num_traces
    entries = fj.sweep(key, configs, build_for(problem), rounds, 6, out_dir=tmp_path, record_every=2)
    # 2 algorithms x 2 H = 4 structural groups (step size and p are batched): 2 kernels each
    assert sim_mod._num_traces - before == 4 * 2
    assert [e.config for e in entries] == configs
    for e in entries[::5]:
        problem_, alg = build_for(problem)(e.config)
        single = fj.simulate(key, problem_, alg, rounds(e.config), 6, record_every=2)
        np.testing.assert_allclose(e.result.final_theta, single.final_theta, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(e.result.mse_mean, single.mse_mean, rtol=1e-12)
        assert e.result.config["sweep"] == e.config
        assert e.result.config["algorithm"]["step_size"] == e.config["step_size"]
    index = json.loads((tmp_path / "sweep.json").read_text())
    assert len(index) == len(configs) and all((tmp_path / row["file"]).exists() for row in index)


def test_rerun_skips_finished_configurations(problem, tmp_path, monkeypatch):
    configs = fj.grid(algorithm="fedlsa", step_size=[0.2, 0.4], H=[2, 3])
    first = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    (tmp_path / f"{sweep_mod.config_name(configs[3])}.npz").unlink()  # one unfinished

    ran = []
    real = sweep_mod.execute

    def counting(run, problem_, algorithms):
        ran.append(len(algorithms))
        return real(run, problem_, algorithms)

    monkeypatch.setattr(sweep_mod, "execute", counting)
    again = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    assert ran == [1]  # only the missing configuration ran
    for a, b in zip(first, again):
        np.testing.assert_allclose(a.result.final_theta, b.result.final_theta, rtol=1e-12)
    assert [e.seconds == 0 for e in again] == [True, True, True, False]


def test_names_unique_and_stale_results_rerun(problem, tmp_path):
    name = sweep_mod.config_name
    assert name({"a": "x/y"}) != name({"a": "x_y"}) and name({"a": 0.1}) != name({"a": "0.1"})
    configs = [{"algorithm": "fedlsa", "step_size": 0.2, "H": 2}]
    a = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)[0]
    b = fj.sweep(jax.random.key(1), configs, build_for(problem), 6, 7, out_dir=tmp_path)[0]  # other settings
    assert b.seconds > 0 and b.result.num_seeds == 7 and b.result.rounds[-1] == 6
    c = fj.sweep(jax.random.key(2), configs, build_for(problem), 6, 7, out_dir=tmp_path)[0]  # other key
    assert c.seconds > 0 and not np.array_equal(c.result.final_theta, b.result.final_theta)
    assert a.result.num_seeds == 5


def test_damaged_result_is_recomputed_with_a_warning(problem, tmp_path):
    configs = fj.grid(algorithm="fedlsa", step_size=[0.2, 0.4], H=2)
    first = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    first[1].path.write_bytes(first[1].path.read_bytes()[:200])  # truncated, as by a full disk
    with pytest.warns(RuntimeWarning, match="recomputing a damaged sweep result: .* is damaged"):
        again = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    assert [e.status for e in again] == ["loaded", "recomputed"]
    np.testing.assert_array_equal(again[1].result.final_theta, first[1].result.final_theta)
    assert fj.load(first[1].path).num_seeds == 5  # replaced by a good file
    assert [r["status"] for r in json.loads((tmp_path / "sweep.json").read_text())] == [
        "loaded",
        "recomputed",
    ]


def test_shards_cover_the_grid_and_a_plain_run_collects_them(problem, tmp_path):
    configs = fj.grid(algorithm=["fedlsa", "scafflsa"], step_size=[0.2, 0.4], H=2)
    parts = [
        fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path, shard=(k, 3))
        for k in range(2)
    ]  # shard 2 of 3 never ran
    assert [[configs.index(e.config) for e in p] for p in parts] == [[0, 3], [1]]
    assert not (tmp_path / "sweep.json").exists()  # shards leave the index to the collecting run
    listed = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path, compute=False)
    assert [e.status for e in listed] == ["loaded", "loaded", "missing", "loaded"]
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert rows[2] == {"config": configs[2], "status": "missing", "file": None}
    done = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    assert [e.status for e in done] == ["loaded", "loaded", "ran", "loaded"]
    np.testing.assert_array_equal(done[0].result.final_theta, parts[0][0].result.final_theta)
    with pytest.raises(ValueError, match=r"^shard=.* is invalid: expected \(k, n\)"):
        fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, shard=(3, 3))


def test_results_of_earlier_versions_names_still_load(problem, tmp_path):
    configs = [{"algorithm": "fedlsa", "step_size": 0.2, "H": 2}]
    (first,) = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    assert re.fullmatch(r"[A-Za-z0-9_.-]+\.npz", first.path.name)  # portable: no '=' or ','
    first.path.rename(tmp_path / f"{sweep_mod._legacy_name(configs[0])}.npz")
    (again,) = fj.sweep(jax.random.key(1), configs, build_for(problem), 4, 5, out_dir=tmp_path)
    assert again.status == "loaded" and "=" in again.path.name


def test_plot_sweep_draws_final_mse_against_the_richest_numeric_axis():
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from fedsa_jax.plotting import plot_sweep

    def entry(config, mse):
        return SimpleNamespace(
            config=config,
            result=SimpleNamespace(mse_mean=np.array([1.0, mse]), mse_sem=np.array([0.0, 0.01])),
        )

    entries = [
        entry({"algorithm": a, "step_size": s, "H": 10}, s * (1 if a == "fedlsa" else 2))
        for a in ("fedlsa", "scafflsa")
        for s in (0.3, 0.1, 0.01)
    ]
    ax = plot_sweep(entries).axes[0]
    assert ax.get_xlabel() == "step_size" and ax.get_xscale() == "log"
    assert [c.get_label() for c in ax.containers] == ["algorithm=fedlsa", "algorithm=scafflsa"]  # H is fixed
    line = ax.containers[1].lines[0]
    np.testing.assert_allclose(line.get_xdata(), [0.01, 0.1, 0.3])  # sorted along x
    np.testing.assert_allclose(line.get_ydata(), [0.02, 0.2, 0.6])
    ax = plot_sweep(entries, x="algorithm").axes[0]  # categories
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fedlsa", "scafflsa"]
    plt.close("all")


def test_plot_sweep_panels_by_structural_option_and_legend_outside():
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from fedsa_jax.plotting import plot_sweep

    def entry(config, mse):
        return SimpleNamespace(
            config=config, result=SimpleNamespace(mse_mean=np.array([mse]), mse_sem=np.array([0.0]))
        )

    entries = [
        entry({"heterogeneity": h, "algorithm": a, "step_size": s, "params.beta": beta}, s * (1 + i) + j)
        for i, h in enumerate(("homogeneous", "heterogeneous"))
        for j, (a, beta) in enumerate((("fedlsa", None), ("mine", 0.5), ("mine", 1.0)))
        for s in (0.01, 0.1)
    ]
    fig = plot_sweep(entries, title="grid")
    assert [ax.get_title() for ax in fig.axes] == [
        "heterogeneity = homogeneous",
        "heterogeneity = heterogeneous",
    ]
    (legend,) = fig.legends  # one legend for every panel, outside them
    names = [t.get_text() for t in legend.get_texts()]
    assert names == ["algorithm=fedlsa", "algorithm=mine, beta=0.5", "algorithm=mine, beta=1.0"]
    for i, ax in enumerate(fig.axes):
        lines = [c.lines[0] for c in ax.containers]
        assert [c.get_label() for c in ax.containers] == names
        for j, line in enumerate(lines):  # the data of its panel and line, in its line's colour
            np.testing.assert_allclose(line.get_ydata(), np.array([0.01, 0.1]) * (1 + i) + j)
            assert line.get_color() == fig.axes[0].containers[j].lines[0].get_color()
    assert len({c.lines[0].get_color() for c in fig.axes[0].containers}) == 3
    with pytest.raises(ValueError, match="panels='step_size' is invalid"):
        plot_sweep(entries, panels="step_size")  # the x axis cannot also split the panels
    plt.close("all")


def test_plot_sweep_merges_identical_lines_and_keeps_near_ones_apart():
    """A grid key that an algorithm does not read (QFedTD's ``local_steps``: its rounds are one step)
    makes configurations that are the same run: one line, whose legend entry names them all (they
    were drawn over each other, 4 legend entries for 3 visible lines); a line equal to another up
    to float rounding (FedLSA with H = 1 against QFedTD) stays its own, with its own marker and dashes."""
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from fedsa_jax.plotting import plot_sweep

    def entry(config, mse):
        return SimpleNamespace(
            config=config,
            result=SimpleNamespace(mse_mean=np.array([1.0, mse]), mse_sem=np.array([0.0, 0.01])),
        )

    def mse(algorithm, H, s):  # QFedTD ignores H; FedLSA with H = 1 is QFedTD to float rounding
        return 0.5 - s if algorithm == "qfedtd" else 0.5 - s + (1e-15 if H == 1 else 0.1 * H)

    grid = [("fedlsa", 1), ("fedlsa", 4), ("qfedtd", 1), ("qfedtd", 4)]
    entries = [
        entry({"algorithm": a, "local_steps": H, "step_size": s}, mse(a, H, s))
        for a, H in grid
        for s in (0.05, 0.1)
    ]
    fig = plot_sweep(entries, x="step_size")
    ax, (legend,) = fig.axes[0], fig.legends
    names = [t.get_text() for t in legend.get_texts()]
    assert names == [
        "algorithm=fedlsa, local_steps=1",
        "algorithm=fedlsa, local_steps=4",
        "algorithm=qfedtd, local_steps=1\n= algorithm=qfedtd, local_steps=4",
    ]
    lines = [c.lines[0] for c in ax.containers]
    assert len(lines) == 3
    np.testing.assert_array_equal(lines[2].get_ydata(), [0.45, 0.4])
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) == 3
    plt.close("all")


def test_sweep_console_lines_name_every_varying_value(capsys):
    from types import SimpleNamespace

    from fedsa_jax.cli.sweep_file import _report

    long = {f"option_{i:02d}": "a-long-fixed-value" for i in range(12)}  # names are cut at 120 characters
    entries = [
        SimpleNamespace(
            config={**long, "step_size": s, "params.beta": None},
            result=SimpleNamespace(mse_mean=np.array([s]), mse_sem=np.array([0.0])),
            status="ran",
            seconds=0.1,
        )
        for s in (0.01, 0.05)
    ]
    _report(entries)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step_size=0.01", "step_size=0.05"]
    assert sweep_mod.config_name(entries[0].config)[:-14] == sweep_mod.config_name(entries[1].config)[:-14]


def test_an_empty_grid_has_its_one_point_and_console_line(capsys):
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from fedsa_jax.cli.sweep_file import _report
    from fedsa_jax.plotting import plot_sweep

    entry = SimpleNamespace(
        config={},
        result=SimpleNamespace(mse_mean=np.array([0.5]), mse_sem=np.array([0.0])),
        status="ran",
        seconds=0.1,
    )
    ax = plot_sweep([entry]).axes[0]
    np.testing.assert_array_equal(ax.containers[0].lines[0].get_ydata(), [0.5])
    plt.close("all")
    _report([entry])
    assert capsys.readouterr().out.startswith("configuration: final MSE 0.5")
