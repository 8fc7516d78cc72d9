"""Scale and fault tolerance: chunks, seed batches, devices, hosts, checkpoints, SIGKILL.

Per-seed results must be bitwise identical however the work is split; statistics
merged across batches or devices agree to float64 rounding.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import scale_worker

import fedsa_jax as fj
from fedsa_jax._runtime import checkpoint as _checkpoint

WORKER = str(Path(__file__).with_name("scale_worker.py"))


@pytest.fixture(scope="module")
def reference():
    return scale_worker.simulate()


def same(a, b, exact_stats=True):
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    if exact_stats:
        np.testing.assert_array_equal(a.mse_mean, b.mse_mean)
    else:
        np.testing.assert_allclose(a.mse_mean, b.mse_mean, rtol=1e-12)
        np.testing.assert_allclose(a.mse_sem, b.mse_sem, rtol=1e-9, atol=1e-14)
        np.testing.assert_allclose(a.theta_mean, b.theta_mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(a.rounds, b.rounds)


def last_carry_leaf(saved):
    """The carry's last leaf is its round counter."""
    return f"carry{sum(k.startswith('carry') for k in saved) - 1}"


def test_chunking_does_not_change_results(reference):
    for chunk in (1, 2, 5, 100):
        same(scale_worker.simulate(chunk_rounds=chunk), reference)


def test_seed_batches_give_identical_seeds(reference):
    for batch in (1, 3, 4):
        res = scale_worker.simulate(seed_batch_size=batch)
        assert res.config["execution"]["num_batches"] == -(-10 // batch)
        same(res, reference, exact_stats=False)
        np.testing.assert_allclose(res.bits_delivered, reference.bits_delivered, rtol=1e-12)


def test_checkpoint_resume_after_a_crash(tmp_path, reference, monkeypatch):
    sim_mod = sys.modules["fedsa_jax._runtime.kernel"]
    real = sim_mod._advance
    calls = {"n": 0}

    def crash_after_two(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:
            raise KeyboardInterrupt("simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(sim_mod, "_advance", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        scale_worker.simulate(checkpoint_dir=tmp_path, chunk_rounds=2, seed_batch_size=4)
    saved = _checkpoint.load(tmp_path)
    assert (
        int(saved["batch"]) == 0 and int(np.ravel(saved[last_carry_leaf(saved)])[0]) == 4
    )  # 2 chunks of 2 rounds
    monkeypatch.setattr(sim_mod, "_advance", real)
    resumed = scale_worker.simulate(checkpoint_dir=tmp_path, chunk_rounds=2, seed_batch_size=4)
    same(resumed, scale_worker.simulate(seed_batch_size=4))
    same(resumed, reference, exact_stats=False)
    # a finished checkpoint returns the result without running anything
    monkeypatch.setattr(sim_mod, "_advance", crash_after_two)
    calls["n"] = 100
    same(scale_worker.simulate(checkpoint_dir=tmp_path, chunk_rounds=2, seed_batch_size=4), resumed)


def test_configurations_share_a_checkpoint_folder(tmp_path, monkeypatch):
    first = scale_worker.simulate(checkpoint_dir=tmp_path, num_rounds=4)
    (path,) = _checkpoint.paths(tmp_path)
    before = path.read_bytes()
    p, alg = scale_worker.problem_and_alg()
    other = fj.simulate(jax.random.key(8), p, alg, 4, 10, record_every=2, checkpoint_dir=tmp_path)
    assert len(_checkpoint.paths(tmp_path)) == 2 and path.read_bytes() == before  # the first one untouched

    def no_more_rounds(*a, **k):
        raise AssertionError("a finished checkpoint must not run any round again")

    monkeypatch.setattr(sys.modules["fedsa_jax._runtime.kernel"], "_advance", no_more_rounds)
    same(scale_worker.simulate(checkpoint_dir=tmp_path, num_rounds=4), first)  # both still resume
    same(fj.simulate(jax.random.key(8), p, alg, 4, 10, record_every=2, checkpoint_dir=tmp_path), other)


def run_worker(*args, timeout=300):
    env = dict(
        os.environ, PYTHONPATH=str(Path(__file__).parent) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    return subprocess.run(
        [sys.executable, WORKER, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def load(path):
    return dict(np.load(path))


@pytest.mark.parametrize("devices", [2, 4])
def test_sharded_over_devices_equals_one_device(tmp_path, reference, devices):
    out = tmp_path / "r.npz"
    proc = run_worker("run", out, "--devices", devices)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = load(out)
    assert int(r["devices"]) == devices
    np.testing.assert_array_equal(r["final"], reference.final_theta)
    np.testing.assert_allclose(r["mse"], reference.mse_mean, rtol=1e-12)
    np.testing.assert_allclose(r["theta"], reference.theta_mean, rtol=1e-12, atol=1e-15)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_on_loopback_equal_one(tmp_path, reference):
    out = tmp_path / "hosts.npz"
    port = free_port()
    env = dict(
        os.environ, PYTHONPATH=str(Path(__file__).parent) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "host", str(i), str(port), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in (0, 1)
    ]
    try:
        logs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [log[1][-2000:] for log in logs]
    r = load(out)
    assert int(r["processes"]) == 2 and int(r["devices"]) == 4
    np.testing.assert_array_equal(r["final"], reference.final_theta)
    np.testing.assert_allclose(r["mse"], reference.mse_mean, rtol=1e-12)


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ckpt = tmp_path / "ckpt"
    rounds = 6000  # long enough that the kill lands mid-run even on a fast machine
    env = dict(
        os.environ, PYTHONPATH=str(Path(__file__).parent) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            WORKER,
            "run",
            str(tmp_path / "killed.npz"),
            "--checkpoint",
            str(ckpt),
            "--chunk",
            "20",
            "--rounds",
            str(rounds),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.time() + 240
    try:
        while time.time() < deadline:  # wait for a checkpoint from the middle of the run
            saved = _checkpoint.load(ckpt) if _checkpoint.paths(ckpt) else None
            if (
                saved is not None
                and "carry0" in saved
                and int(np.ravel(saved[last_carry_leaf(saved)])[0]) >= 200
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("no mid-run checkpoint appeared")
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed.npz").exists()
    resumed = scale_worker.simulate(checkpoint_dir=ckpt, chunk_rounds=20, num_rounds=rounds)
    same(resumed, scale_worker.simulate(num_rounds=rounds))
