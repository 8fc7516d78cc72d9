"""Files never lose work: permissions, stale temporaries, damaged files, locks, output folders,
strict JSON."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import _io
from fedsa_jax._runtime import checkpoint as _checkpoint
from fedsa_jax.result import ARRAY_FIELDS

IO_FILE = Path(_io.__file__)


@pytest.fixture(scope="module")
def tiny():
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    return problem, fj.fedlsa(0.1, 2)


def run_tiny(tiny, folder, **kw):
    problem, alg = tiny
    return fj.simulate(jax.random.key(1), problem, alg, 4, 3, chunk_rounds=2, checkpoint_dir=folder, **kw)


@pytest.fixture()
def umask():
    old = os.umask(0o022)
    try:
        yield lambda mask: os.umask(mask)
    finally:
        os.umask(old)


def test_files_follow_the_umask(tiny, tmp_path, umask):
    res = fj.simulate(jax.random.key(1), *tiny, 2, 3)
    for mask in (0o022, 0o002, 0o077):
        umask(mask)
        folder = tmp_path / f"m{mask:o}"
        res.save(folder / "r.npz")
        res.to_csv(folder / "r.csv")
        _io.write_json(folder / "s.json", {"a": 1})
        for name in ("r.npz", "r.csv", "s.json"):
            assert (folder / name).stat().st_mode & 0o777 == 0o666 & ~mask, (name, oct(mask))


def temp_name(target, host, pid):
    return f".{target}~{host}~{pid}~00ff{_io.TEMP_SUFFIX}"


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_are_removed_by_the_next_write(tmp_path, monkeypatch):
    here, dead = _io._host(), dead_pid()
    now = time.time()
    files = {
        temp_name("a.npz", here, dead): (now - 120, False),  # killed writer on this host: removed
        temp_name("b.npz", here, dead): (now - 5, True),  # too recent to judge
        temp_name("c.npz", here, os.getpid()): (now - 120, True),  # a live writer
        temp_name("d.npz", "elsewhere", 1): (now - 2 * 3600, False),  # another host, long untouched
        temp_name("e.npz", "elsewhere", 1): (now - 600, True),
        ".f.npz.abc123.tmp": (now - 3600, True),  # not ours
        "g.npz": (now - 3600, True),
    }
    for name, (mtime, _) in files.items():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (mtime, mtime))
    monkeypatch.setattr(_io, "_last_clean", {})
    _io.atomic_write(tmp_path / "new.txt", lambda f: f.write("ok"), mode="w")
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {name for name, (_, kept) in files.items() if kept} | {"new.txt"}


def test_a_write_killed_midway_leaves_only_a_temporary_the_next_write_removes(tmp_path, monkeypatch):
    # the writer loads _io.py alone (numpy only), so the subprocess starts in a fraction of a second
    code = f"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("fedsa_io", {str(IO_FILE)!r})
io = importlib.util.module_from_spec(spec); spec.loader.exec_module(io)
def write(f):
    f.write(b"half")
    f.flush()
    print("writing", flush=True)
    time.sleep(120)
io.atomic_write({str(tmp_path / "r.npz")!r}, write)
"""
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline().strip() == "writing"
        finally:
            proc.kill()  # SIGKILL: no cleanup runs
    (tmp,) = [p for p in tmp_path.iterdir()]
    assert (
        tmp.name.startswith(".r.npz~")
        and tmp.name.endswith(_io.TEMP_SUFFIX)
        and not (tmp_path / "r.npz").exists()
    )
    os.utime(tmp, (time.time() - 120,) * 2)
    monkeypatch.setattr(_io, "_last_clean", {})
    _io.atomic_write(tmp_path / "other.txt", lambda f: f.write("ok"), mode="w")
    assert [p.name for p in tmp_path.iterdir()] == ["other.txt"]


def damaged_variants(good: bytes, folder: Path):
    """(label, path) of files a user might find instead of a good ``.npz``."""
    variants = {
        "random bytes": os.urandom(300),
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "text": b"hello, world\n",
    }
    corrupt = bytearray(good)
    corrupt[len(good) // 3] ^= 0xFF  # inside a stored array: its CRC no longer matches
    variants["one flipped byte"] = bytes(corrupt)
    for label, data in variants.items():
        path = folder / f"{label}.npz"
        path.write_bytes(data)
        yield label, path
    np.save(folder / "single.npy", np.arange(3))
    yield "a .npy array", folder / "single.npy"


def test_damaged_result_files_are_named_as_such(tiny, tmp_path):
    res = fj.simulate(jax.random.key(1), *tiny, 2, 3)
    res.save(tmp_path / "good.npz")
    good = (tmp_path / "good.npz").read_bytes()
    cases = list(damaged_variants(good, tmp_path))
    with np.load(tmp_path / "good.npz") as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(tmp_path / "no_config.npz", **{k: v for k, v in arrays.items() if k != "config_json"})
    np.savez(tmp_path / "bad_json.npz", **{**arrays, "config_json": np.array("{not json")})
    np.savez(tmp_path / "other.npz", x=np.ones(2))  # someone else's archive
    cases += [(n, tmp_path / f"{n}.npz") for n in ("no_config", "bad_json", "other")]
    for label, path in cases:
        with pytest.raises(
            ValueError, match=r"is damaged or not a fedsa_jax result file .*recompute it"
        ) as err:
            fj.load(path)
        assert "\n" not in str(err.value), label
    with pytest.raises(FileNotFoundError):
        fj.load(tmp_path / "absent.npz")
    assert fj.load(tmp_path / "good.npz").num_seeds == 3


def test_damaged_checkpoint_is_refused_never_deleted(tiny, tmp_path):
    run_tiny(tiny, tmp_path)
    (path,) = _checkpoint.paths(tmp_path)
    saved = _checkpoint.load(tmp_path)
    for label, data in [("truncated", path.read_bytes()[:500]), ("random", os.urandom(500))]:
        path.write_bytes(data)
        with pytest.raises(
            ValueError, match=r"is damaged or not a fedsa_jax checkpoint file .*move it out"
        ) as err:
            run_tiny(tiny, tmp_path)
        assert path.read_bytes() == data, label  # refused, not deleted, not overwritten
        assert str(path) in str(err.value)
    # readable, but without the arrays a resume needs
    np.savez(path, fingerprint=saved["fingerprint"], batch=np.array(1))
    with pytest.raises(ValueError, match=r"no 'final0' array"):
        run_tiny(tiny, tmp_path)


def test_a_second_run_of_the_same_configuration_is_refused_while_the_first_runs(tiny, tmp_path):
    first = run_tiny(tiny, tmp_path)
    finger = str(_checkpoint.load(tmp_path)["fingerprint"])
    with _checkpoint.lock(tmp_path, finger):  # as if another process were running it
        with pytest.raises(
            ValueError,
            match=rf"^checkpoint_dir=.* another run of the same configuration "
            rf"\(pid {os.getpid()} on host .*\) is using its checkpoint",
        ):
            run_tiny(tiny, tmp_path)
    again = run_tiny(tiny, tmp_path)  # released: it resumes
    np.testing.assert_array_equal(again.final_theta, first.final_theta)
    assert again.config["execution"]["seed_rounds_run"] == 0
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".lock"]  # lock files go with their lock


def test_output_folders_are_checked_before_running(tiny, tmp_path):
    problem, alg = tiny
    (tmp_path / "file").write_text("x")
    for bad, reason in [
        (tmp_path / "file", "is an existing file"),
        (tmp_path / "file" / "sub", "part of the path"),
    ]:
        with pytest.raises(ValueError, match=rf"^checkpoint_dir=.* is invalid: .*{reason}"):
            fj.simulate(0, problem, alg, 2, 2, checkpoint_dir=bad)
        with pytest.raises(ValueError, match=rf"^out_dir=.* is invalid: .*{reason}"):
            fj.sweep(0, [{}], lambda c: (problem, alg), 2, 2, out_dir=bad)
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders: the permission case cannot be tested")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ValueError, match=r"^checkpoint_dir=.* is invalid: cannot write into the folder"):
        fj.simulate(0, problem, alg, 2, 2, checkpoint_dir=locked)


def test_strict_json():
    text = _io.json_text(
        {
            "a": math.nan,
            "b": [math.inf, 1.5],
            "c": np.float32("nan"),
            "d": np.int64(3),
            "e": np.array([1.0, np.nan]),
        }
    )

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    assert json.loads(text, parse_constant=refuse) == {
        "a": None,
        "b": [None, 1.5],
        "c": None,
        "d": 3,
        "e": [1.0, None],
    }


def test_saved_config_is_strict_json(tiny, tmp_path):
    res = fj.simulate(jax.random.key(1), *tiny, 2, 3)
    res = type(res)(**{k: getattr(res, k) for k in ARRAY_FIELDS}, config={**res.config, "x": math.nan})
    res.save(tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as f:
        assert "NaN" not in str(f["config_json"])
    assert fj.load(tmp_path / "r.npz").config["x"] is None


def test_lock_file_survives_neither_release_nor_a_race(tmp_path):
    path = tmp_path / ".x.lock"
    with _io.file_lock(path):
        with pytest.raises(_io.LockHeld, match=f"pid {os.getpid()}"):
            with _io.file_lock(path):
                pass
    assert not path.exists()
    with _io.file_lock(path):  # taken again after removal
        assert path.exists()
