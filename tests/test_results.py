"""Result files, the per-round table, quantiles over seeds, and the figures."""

import dataclasses
import json

import jax
import matplotlib
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import plotting, stats


@pytest.fixture(scope="module")
def run(tiny_td):
    P, r, Phi = tiny_td
    problem = fj.problems.federated_td(P, r, Phi, 0.9)
    alg = fj.fedlsa(0.3, 3, quantizer=fj.channel.rand_k(1), success_prob=0.5)
    return problem, alg, fj.simulate(jax.random.key(4), problem, alg, 12, 3000, record_every=4)


def test_quantiles_match_the_seeds(run):
    _, _, res = run
    err = np.sum((res.final_theta - res.theta_star) ** 2, 1)
    exact = np.quantile(err, res.quantile_levels)
    width = 10 ** (1 / stats.HIST_PER_DECADE)  # one histogram bin
    ratio = res.mse_quantiles[-1] / exact
    assert np.all(ratio < width) and np.all(ratio > 1 / width), ratio
    assert np.all(np.diff(res.mse_quantiles, axis=1) >= 0)
    # round 0: every seed at theta0, so every quantile is that value exactly
    np.testing.assert_allclose(res.mse_quantiles[0], res.mse_mean[0], rtol=1e-12)
    np.testing.assert_array_equal(res.quantile(0.5), res.mse_quantiles[:, 2])
    with pytest.raises(ValueError, match="level=0.3 is invalid"):
        res.quantile(0.3)


def test_hist_quantiles_exact_to_a_bin():
    rng = np.random.default_rng(0)
    x = rng.lognormal(mean=-3, sigma=2, size=50_000)
    idx = np.clip(np.floor((np.log10(x) - stats.HIST_LOW) * stats.HIST_PER_DECADE), 0, stats.HIST_BINS - 1)
    hist = np.bincount(idx.astype(int), minlength=stats.HIST_BINS)
    got = stats.hist_quantiles(hist, x.min(), x.max())
    ratio = got / np.quantile(x, stats.QUANTILE_LEVELS)
    assert np.all(np.abs(np.log10(ratio)) < 1 / stats.HIST_PER_DECADE), ratio
    assert np.all(np.isnan(stats.hist_quantiles(np.zeros(stats.HIST_BINS), np.inf, -np.inf)))


def test_quantiles_independent_of_seed_batching(run):
    problem, alg, res = run
    split = fj.simulate(jax.random.key(4), problem, alg, 12, 3000, record_every=4, seed_batch_size=700)
    np.testing.assert_allclose(split.mse_quantiles, res.mse_quantiles, rtol=1e-12)


def test_table_and_csv(run, tmp_path):
    _, _, res = run
    table = res.table()
    R, d = len(res.rounds), res.theta_mean.shape[1]
    assert all(len(v) == R for v in table.values())
    assert list(table)[:7] == [
        "round",
        "communications",
        "samples",
        "bits_sent",
        "bits_delivered",
        "mse_mean",
        "mse_sem",
    ]
    np.testing.assert_array_equal(table["communications"], res.rounds * 3)
    np.testing.assert_array_equal(table["samples"], res.rounds * 3 * 3)
    np.testing.assert_array_equal(table["mse_q95"], res.mse_quantiles[:, 4])
    np.testing.assert_array_equal(table[f"theta_sem_{d - 1}"], res.theta_sem[:, d - 1])
    res.to_csv(tmp_path / "r.csv")
    back = np.genfromtxt(tmp_path / "r.csv", delimiter=",", names=True)
    for name, col in table.items():
        np.testing.assert_array_equal(back[name], col)  # full precision


def test_save_load_round_trip_and_old_files(run, tmp_path):
    _, _, res = run
    res.save(tmp_path / "r.npz")
    back = fj.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(back.mse_quantiles, res.mse_quantiles)
    assert back.config["algorithm"]["channel"]["quantizer"] == {"kind": "rand_k", "k": 1}
    # a file written before quantiles were recorded still loads
    with np.load(tmp_path / "r.npz") as f:
        old = {k: f[k] for k in f.files if k != "mse_quantiles"}
    np.savez(tmp_path / "old.npz", **old)
    legacy = fj.load(tmp_path / "old.npz")
    assert legacy.mse_quantiles.shape == res.mse_quantiles.shape and np.all(np.isnan(legacy.mse_quantiles))
    assert json.loads(json.dumps(legacy.config)) == back.config


@pytest.mark.parametrize("x", ["rounds", "communications", "samples", "bits_sent", "bits_delivered"])
@pytest.mark.parametrize("band", ["sem", "quantiles", None])
def test_plot_mse(run, x, band):
    problem, alg, res = run
    exact = fj.theory.exact_mse(problem, alg, 12)
    fig = plotting.plot_mse({"a": res}, x=x, band=band, theory={"a": exact}, reference_lines={"level": 0.1})
    ax = fig.axes[0]
    mean_line, exact_line = ax.lines[0], ax.lines[1]
    np.testing.assert_array_equal(mean_line.get_ydata(), res.mse_mean)
    np.testing.assert_allclose(mean_line.get_xdata(), getattr(res, x))
    # the exact curve lands on the same x axis: its point at recorded round t is at the result's x
    assert exact_line.get_linestyle() == ":" and exact_line.get_label() == "exact"
    # (delivered bits are random: the curve uses their average rate, within 2 % of each recorded value)
    np.testing.assert_allclose(
        exact_line.get_xdata()[res.rounds], getattr(res, x), rtol=0.02 if x == "bits_delivered" else 1e-12
    )
    np.testing.assert_array_equal(exact_line.get_ydata()[res.rounds], exact[res.rounds])
    assert len(ax.collections) == {"sem": 1, "quantiles": 2, None: 0}[band]
    assert ax.get_xscale() == ("log" if x.startswith("bits") else "linear")
    matplotlib.pyplot.close(fig)


def test_plot_final_mse_vs_agents(run):
    _, _, res = run
    fig = plotting.plot_final_mse_vs_agents({"a": {1: res, 10: res}}, theory={"a": {1: 0.5}})
    ax = fig.axes[0]
    ref = [line for line in ax.lines if line.get_linestyle() == "--"][0]
    x, y = ref.get_xdata(), ref.get_ydata()
    np.testing.assert_allclose(y[0] * x[0], y[-1] * x[-1])  # slope -1 on log-log
    assert ax.get_xscale() == ax.get_yscale() == "log"
    matplotlib.pyplot.close(fig)


def test_plot_bad_input(run):
    _, _, res = run
    with pytest.raises(ValueError, match="x='time' is invalid"):
        plotting.plot_mse({"a": res}, x="time")
    with pytest.raises(ValueError, match="band='ci' is invalid"):
        plotting.plot_mse({"a": res}, band="ci")
    none = dataclasses.replace(res, mse_quantiles=np.full_like(res.mse_quantiles, np.nan))
    with pytest.raises(ValueError, match="band='quantiles' is invalid: result 'a' has no quantiles"):
        plotting.plot_mse({"a": none}, band="quantiles")


def test_quantiles_off_and_default(run):
    problem, alg, res = run
    off = fj.simulate(jax.random.key(4), problem, alg, 12, 3000, record_every=4, quantiles=False)
    assert np.all(np.isnan(off.mse_quantiles)) and off.config["quantiles"] is False
    np.testing.assert_array_equal(off.mse_mean, res.mse_mean)  # nothing else changes
    assert res.config["quantiles"] is True
    assert (
        fj.simulate(0, problem, alg, 20_000, 2, record_every=1, chunk_rounds=20_000).config["quantiles"]
        is False
    )
    with pytest.raises(ValueError, match="quantiles='yes' is invalid"):
        fj.simulate(0, problem, alg, 2, 2, quantiles="yes")
    with pytest.raises(ValueError, match="quantiles=1 is invalid"):
        fj.simulate(0, problem, alg, 2, 2, quantiles=1)


def test_sweep_reruns_a_result_saved_without_quantiles(run, tmp_path):
    problem, alg, _ = run
    build = lambda c: (problem, fj.fedlsa(c["eta"], 3))  # noqa: E731
    configs = fj.grid(eta=[0.1, 0.2])
    first = fj.sweep(0, configs, build, 4, 8, out_dir=tmp_path, quantiles=False)
    assert all(np.all(np.isnan(e.result.mse_quantiles)) for e in first)
    again = fj.sweep(0, configs, build, 4, 8, out_dir=tmp_path)  # default: quantiles on, so rerun
    assert all(e.seconds > 0 and not np.any(np.isnan(e.result.mse_quantiles)) for e in again)
    cached = fj.sweep(0, configs, build, 4, 8, out_dir=tmp_path)
    assert all(e.seconds == 0 for e in cached)


def test_cli_quantile_band_forces_quantiles(tmp_path, monkeypatch):
    import importlib

    from fedsa_jax import cli

    sim_mod = importlib.import_module("fedsa_jax._runtime.run")
    monkeypatch.setattr(sim_mod, "QUANTILE_MAX_RECORDS", 2)  # so the default would be off
    out = tmp_path / "run"
    assert (
        cli.main(
            [
                "run",
                "--agents",
                "2",
                "--local-steps",
                "2",
                "--rounds",
                "5",
                "--seeds",
                "8",
                "--states",
                "5",
                "--dim",
                "2",
                "--band",
                "quantiles",
                "--algorithms",
                "fedlsa",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert not np.any(np.isnan(fj.load(out / "result_fedlsa.npz").mse_quantiles))


def test_samples_count_skipped_observations_only_for_markov(tiny_td):
    P, r, Phi = tiny_td
    for sampling, factor in (("generative", 1), ("markov", 3)):
        problem = fj.problems.federated_td(P, r, Phi, 0.9, sampling=sampling)
        res = fj.simulate(0, problem, fj.fedlsa(0.1, 2, skip=3), 4, 2)
        np.testing.assert_array_equal(res.samples, res.rounds * 3 * 2 * factor)


def test_print_of_a_result_and_a_difference_is_one_short_line(het_gaussian):
    """``print(result)`` and ``print(difference)`` show the algorithm(s), the seeds, the rounds and
    the final MSE (difference) with its standard error, and each array by its shape: one line of a
    few hundred characters however many rounds and seeds (a dataclass's own repr prints every
    array: tens of thousands of characters here)."""
    algs = {"fedlsa": fj.fedlsa(0.1, 2), "scafflsa": fj.scafflsa(0.1, 2)}
    cmp = fj.compare(0, het_gaussian, algs, 400, 64, keep_seeds=8, metrics=["client_drift"])
    res, diff = cmp.results["fedlsa"], cmp.difference("fedlsa", "scafflsa")
    for obj, summary in [
        (
            res,
            f"SimulationResult(fedlsa, 64 seeds (0 diverged), rounds 0..400 (401 recorded), "
            f"final MSE {res.mse_mean[-1]:.4g} +- {res.mse_sem[-1]:.2g}; rounds (401,), mse_mean (401,)",
        ),
        (
            diff,
            f"Difference(fedlsa - scafflsa, 64 pairs, final MSE difference {diff.mean[-1]:.4g} "
            f"+- {diff.sem[-1]:.2g}; rounds (401,), mean (401,)",
        ),
    ]:
        text = repr(obj)
        assert text.startswith(summary) and "\n" not in text and len(text) < 600, text
    assert "seed_mse (401, 8)" in repr(res) and "metrics [client_drift]" in repr(res)
    assert "seeds (401, 8)" in repr(diff) and "metrics [client_drift]" in repr(diff)
