"""Newer features against single plausible bugs: statistics merged across seed batches, checkpoints
and sweeps that must not reuse another run's work, and the default CPU device count.

Each test here was shown to fail on a hand-made breakage listed in ``tests/mutations.py`` (section
"newer features"). Per-seed values come from a single-batch run that keeps every seed
(``keep_seeds``) or from ``result.final_theta``; the statistics of a batched run are compared with
what those values give directly.
"""

import importlib
import math
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cpu import fresh_env

import fedsa_jax as fj
from fedsa_jax.stats import HIST_BINS, HIST_LOW, HIST_PER_DECADE, QUANTILE_LEVELS

sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")
KEY = jax.random.key(11)


def squared_errors(theta, theta_star):
    return np.sum((np.asarray(theta, np.float64) - np.asarray(theta_star, np.float64)) ** 2, axis=-1)


def quantiles_from_values(values, levels=QUANTILE_LEVELS):
    """The documented quantiles, read off the sorted values: the level-q quantile lies in the log bin
    of the ceil(q n)-th smallest value, the fraction (q n - values in lower bins) / (values in its bin)
    of the way across it (geometrically), clipped to [min, max]."""
    x = np.sort(np.asarray(values, np.float64))
    n = len(x)
    bins = np.clip(np.floor((np.log10(x) - HIST_LOW) * HIST_PER_DECADE), 0, HIST_BINS - 1)
    out = []
    for q in levels:
        k = bins[math.ceil(q * n) - 1]
        frac = (q * n - np.sum(bins < k)) / np.sum(bins == k)
        out.append(min(max(10.0 ** (HIST_LOW + (k + frac) / HIST_PER_DECADE), x[0]), x[-1]))
    return np.asarray(out)


def test_kept_seeds_extremes_and_quantiles_across_batches(het_gaussian):
    """7 seeds in batches of 3 (the last one padded): the kept seeds are seeds 0..2, and the
    quantiles (interpolated in their bins, clipped to the merged minimum and maximum) are those
    of all 7 seeds' values, which a single batch keeping every seed gives round by round."""
    alg, T, n = fj.fedlsa(0.3, 2), 12, 7
    one = fj.simulate(KEY, het_gaussian, alg, T, n, keep_seeds=n, seed_batch_size=n)
    many = fj.simulate(KEY, het_gaussian, alg, T, n, keep_seeds=3, seed_batch_size=3)
    assert many.config["execution"]["num_batches"] == 3 and one.config["execution"]["num_batches"] == 1
    values = one.seed_mse  # (R, 7): every seed's squared error at every round
    np.testing.assert_allclose(values[-1], squared_errors(one.final_theta, one.theta_star), rtol=1e-12)
    np.testing.assert_array_equal(many.seed_mse, values[:, :3])
    np.testing.assert_allclose(
        many.seed_mse[-1], squared_errors(many.final_theta[:3], many.theta_star), rtol=1e-12
    )

    expected = np.stack([quantiles_from_values(v) for v in values])
    for res in (one, many):
        np.testing.assert_allclose(res.mse_quantiles, expected, rtol=1e-9)
    # the documented resolution: within one bin of the ceil(q n)-th smallest value
    order = np.sort(values, axis=1)[:, [math.ceil(q * n) - 1 for q in QUANTILE_LEVELS]]
    assert np.all(np.abs(np.log10(many.mse_quantiles / order)) <= 1 / HIST_PER_DECADE + 1e-12)
    # power: the merged extremes matter (the range clips a quantile where the smallest value lies
    # outside the first batch, and the largest outside the last) and interpolation moves a quantile
    low = (expected[:, 0] == values.min(1)) & (values.argmin(1) >= 3)
    high = (expected[:, -1] == values.max(1)) & (values.argmax(1) < 6)
    inside = (expected > values.min(1, keepdims=True)) & (expected < values.max(1, keepdims=True))
    assert low[1:].any() and high[1:].any() and inside.sum() >= 10


def seed_0_diverged(base):
    """``base`` whose seed 0 starts at infinity (its init key is seed 0's): every other seed runs
    ``base`` unchanged, so seed 0 is diverged at every recorded round."""
    init_keys, _ = sim_mod.seed_keys(KEY, 1)
    seed_0 = np.asarray(jax.random.key_data(init_keys[0]))

    def init(key, problem, theta0, config):
        state = base.init_fn(key, problem, theta0, config)
        hit = jnp.all(jax.random.key_data(key) == seed_0)
        error = jnp.where(hit, jnp.inf, state.error)
        return state._replace(theta=problem.theta_star + error, error=error)

    return fj.Algorithm(base.config, "fedlsa_seed0_inf", init, base.step_fn)


def test_seed_0_diverged_and_on_record_counts_valid_seeds_only(het_gaussian):
    """Seed 0 diverged: the means (computed as deviations from one seed's value) come from the
    other seeds; ``on_record`` counts the seeds run so far, not the padding of the last batch, and
    its statistics over them leave seed 0 out, as the final result does."""
    records = []
    T, n = 4, 7
    with pytest.warns(RuntimeWarning, match="1 of 7 seeds diverged"):
        res = fj.simulate(
            KEY,
            het_gaussian,
            seed_0_diverged(fj.fedlsa(0.3, 2)),
            T,
            n,
            keep_seeds=3,
            seed_batch_size=3,
            on_record=records.append,
        )
    assert res.config["execution"]["num_batches"] == 3
    assert np.all(res.num_diverged == 1) and not np.isfinite(res.final_theta[0]).any()
    ok = res.final_theta[1:]
    assert np.isfinite(ok).all()
    err = squared_errors(ok, res.theta_star)
    np.testing.assert_allclose(res.mse_mean[-1], err.mean(), rtol=1e-10)
    np.testing.assert_allclose(res.mse_sem[-1], err.std(ddof=1) / math.sqrt(len(err)), rtol=1e-9)
    np.testing.assert_allclose(res.theta_mean[-1], ok.mean(0), rtol=1e-10)
    np.testing.assert_allclose(res.theta_sem[-1], ok.std(0, ddof=1) / math.sqrt(len(ok)), rtol=1e-9)

    by_batch = {}
    for r in records:
        b = by_batch.setdefault(r.batch, {"rounds": [], "mse": [], "seeds": set(), "div": []})
        b["rounds"] += list(r.rounds)
        b["mse"] += list(r.mse_mean)
        b["seeds"].add(r.num_seeds)
        b["div"] += list(r.num_diverged)
    assert sorted(by_batch) == [0, 1, 2]
    assert [by_batch[b]["seeds"] for b in range(3)] == [{3}, {6}, {7}]  # seeds run so far, padding left out
    for b in by_batch.values():
        assert b["rounds"] == list(res.rounds) and set(b["div"]) == {1}
    # batch 0: seeds 1 and 2, round by round (kept); batch 1: seeds 1..5 at the last round
    np.testing.assert_allclose(by_batch[0]["mse"], res.seed_mse[:, 1:].mean(1), rtol=1e-10)
    np.testing.assert_allclose(by_batch[1]["mse"][-1], err[:5].mean(), rtol=1e-10)
    np.testing.assert_allclose(by_batch[2]["mse"], res.mse_mean, rtol=1e-12)
    last = [r for r in records if r.batch == 2][-1]
    np.testing.assert_allclose(last.counts["samples"], res.samples[-len(last.rounds) :], rtol=1e-12)


class Interrupted(Exception):
    pass


def interrupted_run(problem, alg, theta0, directory):
    """Run 6 rounds in chunks of 2 with checkpoints; stop after the first chunk's checkpoint."""
    calls = []

    def stop(record):
        calls.append(record)
        if len(calls) == 2:  # round 0, then the first chunk (reported after its checkpoint)
            raise Interrupted

    with pytest.raises(Interrupted):
        fj.simulate(
            KEY, problem, alg, 6, 4, theta0=theta0, chunk_rounds=2, checkpoint_dir=directory, on_record=stop
        )


@pytest.mark.parametrize("change", ["theta0", "problem"])
def test_checkpoint_does_not_resume_another_theta0_or_problem(het_gaussian, tmp_path, change):
    """A run interrupted with a checkpoint; the same call with another theta0, or with a problem
    of the same structure and other values, starts at round 0 and equals a fresh run, and leaves
    the first run's checkpoint to resume."""
    alg, theta0 = fj.fedlsa(0.3, 2), np.zeros(3)
    interrupted_run(het_gaussian, alg, theta0, tmp_path)
    problem, other_theta0 = het_gaussian, theta0
    if change == "theta0":
        other_theta0 = np.array([1.0, -0.5, 0.25])
    else:
        problem = fj.problems.random_gaussian_lsa(
            jax.random.key(4), num_agents=3, dim=3, heterogeneity=1.0, noise_A=0.2, noise_b=0.5
        )
        assert problem.describe() == het_gaussian.describe()  # the same structure: only the values differ
        assert not np.allclose(problem.A_bar, het_gaussian.A_bar)
    with warnings.catch_warnings():  # a notice about the folder's other checkpoint is allowed
        warnings.simplefilter("ignore")
        other = fj.simulate(
            KEY, problem, alg, 6, 4, theta0=other_theta0, chunk_rounds=2, checkpoint_dir=tmp_path
        )
    assert other.config["execution"]["resumed_from"] is None
    assert other.config["execution"]["seed_rounds_run"] == 6 * 4
    fresh = fj.simulate(KEY, problem, alg, 6, 4, theta0=other_theta0, chunk_rounds=2)
    np.testing.assert_array_equal(other.final_theta, fresh.final_theta)
    np.testing.assert_array_equal(other.mse_mean, fresh.mse_mean)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = fj.simulate(
            KEY, het_gaussian, alg, 6, 4, theta0=theta0, chunk_rounds=2, checkpoint_dir=tmp_path
        )
    assert resumed.config["execution"]["resumed_from"] == {"seed_batch": 0, "round": 2}  # power: it resumes
    np.testing.assert_array_equal(
        resumed.final_theta, fj.simulate(KEY, het_gaussian, alg, 6, 4, theta0=theta0).final_theta
    )
    assert not np.allclose(resumed.final_theta, other.final_theta)


def build_fedlsa(problem):
    return lambda config: (problem, fj.fedlsa(config["step_size"], 2))


def test_sweep_does_not_reuse_a_result_with_another_theta0(het_gaussian, tmp_path):
    configs = [{"step_size": 0.3}]
    build = build_fedlsa(het_gaussian)
    a, b = np.zeros(3), np.array([1.0, -0.5, 0.25])
    (first,) = fj.sweep(KEY, configs, build, 3, 4, out_dir=tmp_path, theta0=a)
    (other,) = fj.sweep(KEY, configs, build, 3, 4, out_dir=tmp_path, theta0=b)
    assert first.status == "ran" and other.status == "ran"
    assert other.result.config["theta0"] == b.tolist()
    single = fj.simulate(KEY, het_gaussian, fj.fedlsa(0.3, 2), 3, 4, theta0=b)
    np.testing.assert_array_equal(other.result.final_theta, single.final_theta)
    (again,) = fj.sweep(KEY, configs, build, 3, 4, out_dir=tmp_path, theta0=b)  # power: it does reuse
    assert again.status == "loaded"
    np.testing.assert_array_equal(again.result.final_theta, single.final_theta)


def test_sweep_groups_only_configurations_with_the_same_record_every(het_gaussian):
    """Two step sizes (one kernel call if they shared the rest) recorded every 1 and every 3 rounds:
    each configuration's recorded rounds and statistics are those of its own single run."""
    configs = [{"step_size": 0.3, "every": 1}, {"step_size": 0.2, "every": 3}]
    entries = fj.sweep(KEY, configs, build_fedlsa(het_gaussian), 6, 4, record_every=lambda c: c["every"])
    for e in entries:
        every = e.config["every"]
        np.testing.assert_array_equal(e.result.rounds, np.arange(0, 7, every))
        single = fj.simulate(KEY, het_gaussian, fj.fedlsa(e.config["step_size"], 2), 6, 4, record_every=every)
        np.testing.assert_allclose(e.result.final_theta, single.final_theta, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(e.result.mse_mean, single.mse_mean, rtol=1e-12)
        assert e.result.config["record_every"] == every


def device_count(prelude="", **env):
    """``fj.use_cpu_cores()`` and the CPU device count JAX then has, in a fresh process."""
    code = prelude + "\nimport jax, fedsa_jax as fj\nprint(fj.use_cpu_cores(), len(jax.devices('cpu')))"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=fresh_env(**env), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [int(x) for x in proc.stdout.split()]


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
    reason="needs CPU affinity and at least 2 cores (else one core is also the core count)",
)
def test_default_device_count_follows_the_cpu_affinity():
    """A process allowed on one core only gets one CPU device, whatever the machine's core count."""
    core = min(os.sched_getaffinity(0))
    assert device_count(f"import os; os.sched_setaffinity(0, {{{core}}})") == [1, 1]  # before JAX starts


@pytest.mark.parametrize(
    "env",
    [
        {"JAX_NUM_CPU_DEVICES": "3", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        {
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_cpu_enable_fast_math=false "
            "--xla_force_host_platform_device_count=3"
        },
    ],
    ids=["JAX_NUM_CPU_DEVICES-over-XLA_FLAGS", "last-XLA_FLAGS-occurrence"],
)
def test_explicit_count_precedence(env):
    """``JAX_NUM_CPU_DEVICES`` wins over ``XLA_FLAGS``, and in ``XLA_FLAGS`` the last occurrence of
    the flag wins: what ``use_cpu_cores`` reports is the count JAX gives (3)."""
    assert device_count(**env) == [3, 3]
