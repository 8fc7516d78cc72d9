"""The driver: recorded rounds, determinism, seed-prefix invariance, no retrace,
divergence accounting, result files."""

import importlib
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import fedsa_jax as fj

sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")


@pytest.fixture(scope="module")
def garnet():
    return fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=2)


def test_recorded_rounds_and_shapes(garnet):
    res = fj.simulate(jax.random.key(0), garnet, fj.fedlsa(0.5, 2), 10, 5, record_every=4)
    np.testing.assert_array_equal(res.rounds, [0, 4, 8, 10])
    assert res.mse_mean.shape == res.mse_sem.shape == res.num_diverged.shape == (4,)
    assert res.theta_mean.shape == res.theta_sem.shape == (4, 2)
    assert res.final_theta.shape == (5, 2)
    # round 0 is theta0 for every seed: zero spread
    assert res.mse_sem[0] == 0.0
    np.testing.assert_allclose(res.mse_mean[0], float(np.sum(np.asarray(garnet.theta_star) ** 2)))
    # recording does not change the run
    full = fj.simulate(jax.random.key(0), garnet, fj.fedlsa(0.5, 2), 10, 5)
    np.testing.assert_array_equal(full.final_theta, res.final_theta)
    np.testing.assert_array_equal(full.mse_mean[[0, 4, 8, 10]], res.mse_mean)


def test_determinism_and_seed_prefix_invariance(garnet):
    alg = fj.scafflsa(0.5, 3)
    a = fj.simulate(jax.random.key(9), garnet, alg, 7, 12)
    b = fj.simulate(jax.random.key(9), garnet, alg, 7, 12)
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    np.testing.assert_array_equal(a.mse_mean, b.mse_mean)
    for n in (1, 5):
        prefix = fj.simulate(jax.random.key(9), garnet, alg, 7, n)
        np.testing.assert_array_equal(prefix.final_theta, a.final_theta[:n])
    other = fj.simulate(jax.random.key(10), garnet, alg, 7, 12)
    assert not np.array_equal(other.final_theta, a.final_theta)
    # seeds differ from each other
    assert len(np.unique(a.final_theta[:, 0])) == 12


def test_no_retrace(garnet):
    key = jax.random.key(0)
    fj.simulate(key, garnet, fj.fedlsa(0.5, 2), 4, 3)
    before = sim_mod._num_traces
    # a new but equal algorithm, another step size, another key, a new problem of the same structure
    fj.simulate(key, garnet, fj.fedlsa(0.5, 2), 4, 3)
    fj.simulate(jax.random.key(5), garnet, fj.fedlsa(0.25, 2), 4, 3)
    same_shape = fj.problems.garnet(jax.random.key(1), num_agents=3, num_states=6, dim=2)
    fj.simulate(key, same_shape, fj.fedlsa(0.1, 2), 4, 3, theta0=np.ones(2))
    assert sim_mod._num_traces == before
    # and neither do more rounds (the round count is traced, not static)
    fj.simulate(key, garnet, fj.fedlsa(0.5, 2), 40, 3)
    assert sim_mod._num_traces == before
    # a structural change does compile again (the start and the advance kernels)
    fj.simulate(key, garnet, fj.fedlsa(0.5, 3), 4, 3)
    assert sim_mod._num_traces == before + 2
    # chunks of 3 rounds compile their kernel once: not again for the last, shorter chunk (10 = 3 + 3
    # + 3 + 1), nor for another count of rounds, nor across seed batches (7 = 3 + 3 + 1)
    fj.simulate(key, garnet, fj.fedlsa(0.5, 2), 10, 3, chunk_rounds=3)
    chunked = sim_mod._num_traces
    fj.simulate(key, garnet, fj.fedlsa(0.5, 2), 11, 7, chunk_rounds=3, seed_batch_size=3)
    assert sim_mod._num_traces == chunked


def test_diverged_seeds_are_counted_and_excluded():
    # a scalar LSA whose multiplicative noise makes some seeds explode and others converge
    p = fj.problems.gaussian_lsa([[[1.0]]], [[1.0]], noise_A=2.0, noise_b=0.1)
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = fj.simulate(jax.random.key(0), p, fj.fedlsa(0.9, 1), 400, 500, record_every=50)
    final = res.final_theta[:, 0]
    bad = ~np.isfinite(final) | ((final - 1.0) ** 2 > 1e10 * (1 + 1 + 1))
    assert 0 < res.num_diverged[-1] == bad.sum() < 500
    assert np.all(np.isfinite(res.mse_mean))
    np.testing.assert_allclose(res.mse_mean[-1], np.mean((final[~bad] - 1.0) ** 2), rtol=1e-10)
    assert res.num_diverged[0] == 0 and res.num_diverged.max() > 0


def test_save_load_round_trip(garnet, tmp_path):
    res = fj.simulate(jax.random.key(0), garnet, fj.scafflsa(0.5, 2), 6, 4, record_every=2)
    path = tmp_path / "sub" / "r.npz"
    res.save(path)
    assert os.listdir(path.parent) == ["r.npz"]  # no temporary file left behind
    back = fj.load(path)
    for field in (
        "rounds",
        "mse_mean",
        "mse_sem",
        "theta_mean",
        "theta_sem",
        "num_diverged",
        "final_theta",
        "bits_sent",
        "bits_delivered",
        "mse_quantiles",
    ):
        np.testing.assert_array_equal(getattr(back, field), getattr(res, field))
    assert back.config == json.loads(json.dumps(res.config))
    cfg = back.config
    assert cfg["algorithm"] == {
        "algorithm": "scafflsa",
        "step_size": 0.5,
        "num_local_steps": 2,
        "skip": 1,
        "server_optimizer": None,
        "channel": {"aggregation": "divide_by_n", "quantizer": {"kind": "identity"}, "success_prob": 1.0},
    }
    assert cfg["bits_per_message"] == 32 * 2
    np.testing.assert_array_equal(back.bits_sent, res.rounds * 3 * 64)
    np.testing.assert_array_equal(back.bits_delivered, back.bits_sent)  # exact channel: all delivered
    assert cfg["prng"]["impl"] == "threefry2x32" and cfg["versions"]["fedsa_jax"] == fj.__version__
    assert cfg["device_count"] >= 1 and cfg["num_seeds"] == 4
    assert cfg["prng"]["jax_threefry_partitionable"] in (True, False)
    assert set(cfg["versions"]) == {"fedsa_jax", "jax", "jaxlib"}


def test_memory_does_not_grow_with_rounds(garnet):
    """Ten times the rounds run the very same compiled kernels (hence the same device buffers)."""
    alg = fj.fedlsa(0.5, 4)
    fj.simulate(jax.random.key(0), garnet, alg, 100, 64, record_every=10, chunk_rounds=50)
    before = sim_mod._num_traces
    res = fj.simulate(jax.random.key(0), garnet, alg, 1000, 64, record_every=10, chunk_rounds=50)
    assert sim_mod._num_traces == before
    assert res.rounds.shape == (101,)


PEAK_RSS = """
import resource, sys, jax
import fedsa_jax as fj
p = fj.problems.garnet(jax.random.key(0), num_agents=10, num_states=20, dim=10)
T = int(sys.argv[1])
fj.simulate(jax.random.key(1), p, fj.fedlsa(0.1, 1), T, 2000, record_every=T // 10)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow  # a memory claim (two 2000-seed runs in subprocesses): run with -m slow
def test_peak_host_memory_flat_in_rounds():
    import subprocess
    import sys

    def peak(T):
        out = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(T)], capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[-1]) * 1024  # ru_maxrss is in KiB on Linux

    # Keeping every seed's trajectory would take 2000 seeds x d=10 x T rounds x 4 bytes:
    # 16 MB at T=200, 160 MB at T=2000; the allowed growth is well below the difference.
    small, large = peak(200), peak(2000)
    assert large <= 1.05 * small + 40 * 2**20, (small, large)


def test_progress_bar(garnet, capsys):
    fj.simulate(jax.random.key(0), garnet, fj.fedlsa(0.5, 2), 30, 4, chunk_rounds=10, progress=True)
    err = capsys.readouterr().err
    assert "fedlsa" in err and "30/30" in err and "round/s" in err
    fj.simulate(
        jax.random.key(0), garnet, fj.fedlsa(0.5, 2), 30, 4, chunk_rounds=10
    )  # not a terminal: silent
    assert capsys.readouterr().err == ""


def test_progress_lines_one_per_chunk(garnet, capsys):
    """``progress="lines"`` (the command line's default off a terminal): one line per chunk, with the
    rounds done of all seed batches, and nothing else."""
    fj.simulate(
        jax.random.key(0),
        garnet,
        fj.fedlsa(0.5, 2),
        30,
        6,
        chunk_rounds=10,
        seed_batch_size=3,
        progress="lines",
    )
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" rounds")[0] for line in lines] == [f"fedlsa: {n}/60" for n in range(10, 61, 10)]
    assert all("rounds/s" in line and "s left" in line for line in lines)
    with pytest.raises(ValueError, match="progress='bar' is invalid"):
        fj.simulate(jax.random.key(0), garnet, fj.fedlsa(0.5, 2), 30, 4, progress="bar")


def test_command_line_reports_progress_on_a_pipe(tmp_path):
    """Off a terminal, ``fedsa-jax run`` prints a line per chunk on standard error; ``--no-progress``
    none."""
    base = [sys.executable, "-m", "fedsa_jax.cli", "run", "--algorithms", "fedlsa", "--rounds", "20"]
    base += ["--seeds", "4", "--local-steps", "2", "--chunk-rounds", "10", "--no-plot"]
    for flag, expected in ((None, 2), ("--no-progress", 0)):
        out = subprocess.run(
            base + ["--out", str(tmp_path / str(flag))] + ([flag] if flag else []),
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        assert sum("rounds/s" in line for line in out.stderr.splitlines()) == expected, out.stderr
