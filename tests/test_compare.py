"""Paired comparisons and precision targets where the user looks: the command line (``--compare``,
``--rel-sem``), the figures (interval bands, the paired-difference panel)."""

import json

import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import cli

RUN = [
    "run",
    "--agents",
    "3",
    "--local-steps",
    "2",
    "--states",
    "5",
    "--dim",
    "2",
    "--rounds",
    "4",
    "--no-plot",
]


def test_run_compare_prints_and_records_the_paired_difference(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [a for a in RUN if a != "--no-plot"] + ["--algorithms", "fedlsa,scafflsa", "--seeds", "16"]
    assert cli.main([*argv, "--compare", "--band", "t", "--out", str(out)]) == 0
    assert (out / "mse.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "fedlsa - scafflsa: paired MSE difference" in printed and "ratio" in printed
    summary = json.loads((out / "summary.json").read_text())
    d = summary["differences"]["fedlsa - scafflsa"]
    a, b = (fj.load(out / f"result_{n}.npz") for n in ("fedlsa", "scafflsa"))
    assert d["ratio"] == pytest.approx(a.mse_mean[-1] / b.mse_mean[-1], rel=1e-12)
    assert d["interval"][0] <= d["mean"] <= d["interval"][1]
    table = np.genfromtxt(out / "difference_fedlsa__scafflsa.csv", delimiter=",", names=True)
    assert table["difference_mean"][-1] == d["mean"] and table["ratio_high"][-1] == d["ratio_interval"][1]
    assert a.config["compare"] == {"algorithms": ["fedlsa", "scafflsa"]}
    assert summary["runs"]["fedlsa"]["final_mse_interval"] == list(a.mse_interval()[i][-1] for i in (0, 1))


def test_run_rel_sem_stops_on_its_target(tmp_path, capsys):
    out = tmp_path / "rel"
    args = [*RUN, "--algorithms", "fedlsa", "--seeds", "4096", "--rel-sem", "0.3", "--dtype", "float64"]
    assert cli.main([*args, "--out", str(out)]) == 0
    res = fj.load(out / "result_fedlsa.npz")
    assert res.config["until"]["stopped"] == "target met" and res.num_seeds < 4096
    assert np.all(res.mse_sem <= 0.3 * res.mse_mean)
    assert f"{res.num_seeds} seeds (target met)" in capsys.readouterr().out
    with open(out / "result_fedlsa.csv") as f:
        assert "mse_low,mse_high" in f.readline()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--algorithms", "fedlsa", "--compare"], "--compare is invalid"),
        (["--algorithms", "fedlsa,scafflsa", "--compare", "--rel-sem", "0.1"], "--rel-sem=0.1 is invalid"),
        (
            ["--algorithms", "fedlsa", "--rel-sem", "0"],
            "argument --rel-sem: expected a finite real number > 0",
        ),
        (
            ["--algorithms", "fedlsa", "--rel-sem", "x"],
            "argument --rel-sem: expected a finite real number > 0",
        ),
    ],
)
def test_run_refuses_bad_statistics_options_in_one_line(tmp_path, capsys, extra, message):
    try:
        rc = cli.main([*RUN, *extra, "--out", str(tmp_path / "x")])
    except SystemExit as exit_info:  # refused by the parser
        rc = exit_info.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_plots_draw_intervals_and_the_paired_difference(het_gaussian):
    cmp = fj.compare(
        0,
        het_gaussian,
        {"A": fj.fedlsa(0.1, 2), "B": fj.scafflsa(0.1, 2)},
        6,
        12,
        record_every=2,
        keep_seeds=12,
    )
    res = cmp.results["A"]
    for band in ("t", "bootstrap"):
        fig = fj.plotting.plot_mse({"A": res}, band=band)
        poly = fig.axes[0].collections[0].get_paths()[0].vertices
        low, high = res.mse_interval(method=band)
        np.testing.assert_allclose(poly[:, 1].max(), high.max())
        assert fig.axes[0].get_legend().get_title().get_text().startswith("mean; 95%")
    with pytest.raises(ValueError, match="band='t' is invalid"):
        fj.plotting.plot_mse({"A": res}, band="t", metric="x")
    fig = fj.plotting.plot_difference(cmp)
    d = cmp.difference("A", "B")
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_ydata(), d.mean)
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    np.testing.assert_allclose([band.min(), band.max()], [d.interval()[0].min(), d.interval()[1].max()])
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "A - B"
