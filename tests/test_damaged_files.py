"""Damaged files never crash: every single-bit flip and every truncation of a result or
checkpoint file either loads (the flip was in bytes nothing reads) or raises
``DamagedFileError`` naming the file; a sweep recomputes a damaged result with its warning."""

import errno
import json
import os
import re
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax import _io
from fedsa_jax._io import DamagedFileError
from fedsa_jax._runtime import checkpoint as _checkpoint
from fedsa_jax._runtime.sweep import config_name

FUZZ = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


class Files(dict):
    def __repr__(self):  # hypothesis prints the arguments of a failing example: not the bytes
        return f"Files({', '.join(f'{k}: {len(v)} bytes' for k, v in self.items())})"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The bytes of a small result file and of a checkpoint file (FedLSA, 2 agents, d = 2)."""
    folder = tmp_path_factory.mktemp("good")
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    res = fj.simulate(
        jax.random.key(1), problem, fj.fedlsa(0.1, 2), 4, 3, chunk_rounds=2, checkpoint_dir=folder
    )
    res.save(folder / "result.npz")
    (checkpoint,) = _checkpoint.paths(folder)
    return Files(result=(folder / "result.npz").read_bytes(), checkpoint=checkpoint.read_bytes())


def flipped(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def read_back(kind: str, path: Path):
    return fj.load(path) if kind == "result" else _checkpoint.read(path)


def damaged_or_loads(kind: str, path: Path) -> None:
    """Loads, or raises DamagedFileError (a one-line ValueError) naming ``path``: nothing else."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            read_back(kind, path)
        except DamagedFileError as err:
            assert str(path) in str(err) and "\n" not in str(err)


@pytest.mark.parametrize("damage", ["bit flip", "truncation"])
@pytest.mark.parametrize("kind", ["result", "checkpoint"])
@FUZZ
@given(where=st.floats(0, 1, exclude_max=True))
def test_every_bit_flip_loads_or_is_damaged_and_every_truncation_is_damaged(
    files, tmp_path, kind, damage, where
):
    data = files[kind]
    path = tmp_path / f"{kind}.npz"
    if damage == "bit flip":
        path.write_bytes(flipped(data, int(where * 8 * len(data))))
        damaged_or_loads(kind, path)
        return
    path.write_bytes(data[: int(where * len(data))])
    with pytest.raises(DamagedFileError) as err:
        read_back(kind, path)
    assert str(path) in str(err.value)


def header_offsets(data: bytes) -> dict[str, int]:
    """Byte offsets, in an .npz archive, of the first central-directory entry's compression method
    and of the first npy header's dictionary (where the flips that once escaped as other errors hit)."""
    return {
        "zip compression method": data.index(b"PK\x01\x02") + 10,
        "npy header": data.index(b"{'descr'") + 2,
    }


@pytest.mark.parametrize("kind", ["result", "checkpoint"])
@pytest.mark.parametrize("place", ["zip compression method", "npy header"])
def test_flips_in_headers_are_damaged_files(files, tmp_path, kind, place):
    """A flip in a zip header's compression method once raised NotImplementedError, and one in an npy
    header tokenize.TokenError: both are damage, named as such."""
    data = files[kind]
    path = tmp_path / f"{kind}.npz"
    offset = header_offsets(data)[place]
    for bit in range(8):
        path.write_bytes(flipped(data, 8 * offset + bit))
        damaged_or_loads(kind, path)
    path.write_bytes(data[:offset] + b"\xff" + data[offset + 1 :])
    with pytest.raises(DamagedFileError, match="is damaged or not a fedsa_jax"):
        read_back(kind, path)


def test_a_sweep_recomputes_a_result_damaged_in_a_header(tmp_path):
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    configs = fj.grid(step_size=[0.1, 0.2])

    def build(c):
        return problem, fj.fedlsa(c["step_size"], 2)

    first = fj.sweep(jax.random.key(1), configs, build, 4, 3, out_dir=tmp_path)
    data = first[1].path.read_bytes()
    offset = header_offsets(data)["zip compression method"]
    first[1].path.write_bytes(data[:offset] + b"\xff" + data[offset + 1 :])
    with pytest.warns(RuntimeWarning, match="^recomputing a damaged sweep result: .* is damaged"):
        again = fj.sweep(jax.random.key(1), configs, build, 4, 3, out_dir=tmp_path)
    assert [e.status for e in again] == ["loaded", "recomputed"]
    np.testing.assert_array_equal(again[1].result.final_theta, first[1].result.final_theta)
    assert fj.load(first[1].path).num_seeds == 3
    assert [r["status"] for r in json.loads((tmp_path / "sweep.json").read_text())] == [
        "loaded",
        "recomputed",
    ]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".fedsa-tmp")]


def test_a_folder_where_a_sweep_result_goes_refuses_that_entry_alone(tmp_path):
    """The others are recomputed (a damaged one, with its warning) or loaded and saved, the index lists
    the blocked entry; then one error names it. No warning promises to recompute it."""
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    configs = fj.grid(step_size=[0.1, 0.2, 0.3])

    def build(c):
        return problem, fj.fedlsa(c["step_size"], 2)

    first = fj.sweep(jax.random.key(1), configs, build, 4, 3, out_dir=tmp_path)
    first[0].path.write_bytes(first[0].path.read_bytes()[:300])
    first[1].path.unlink()
    first[1].path.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            ValueError, match="is not a file .*1 configuration.* not computed .*2 of 3 done"
        ) as err:
            fj.sweep(jax.random.key(1), configs, build, 4, 3, out_dir=tmp_path)
    assert str(first[1].path) in str(err.value) and "\n" not in str(err.value)
    assert [str(w.message).split(":")[0] for w in caught] == ["recomputing a damaged sweep result"]
    assert str(first[0].path) in str(caught[0].message)
    np.testing.assert_array_equal(fj.load(first[0].path).final_theta, first[0].result.final_theta)
    assert [r["status"] for r in json.loads((tmp_path / "sweep.json").read_text())] == [
        "recomputed",
        "blocked",
        "loaded",
    ]
    assert first[1].path.is_dir()  # left as it was


def test_a_folder_where_a_lock_file_goes_is_refused_in_one_line(tmp_path):
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    configs = fj.grid(step_size=[0.1])
    name = config_name(configs[0])
    (tmp_path / f".{name}.lock").mkdir()
    with pytest.raises(ValueError, match=r"lock file .* is a folder .*remove it and rerun") as err:
        fj.sweep(
            jax.random.key(1),
            configs,
            lambda c: (problem, fj.fedlsa(c["step_size"], 2)),
            4,
            3,
            out_dir=tmp_path,
        )
    assert "\n" not in str(err.value)


def test_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    _io.write_json(target, {"old": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_io.os, "fsync", full)
    with pytest.raises(OSError) as err:
        _io.write_json(target, {"new": 2})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert json.loads(target.read_text()) == {"old": 1}  # the finished file is untouched
    assert os.listdir(tmp_path) == ["r.json"]  # no temporary left


def test_a_full_disk_under_out_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from fedsa_jax import cli

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_io.os, "fsync", full)
    args = ["run", "--problem", "gaussian", "--algorithms", "fedlsa", "--rounds", "2", "--seeds", "2"]
    assert cli.main([*args, "--local-steps", "2", "--no-plot", "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(rf"fedsa-jax: error: No space left on device: {re.escape(str(tmp_path))}/\S+", err), (
        err
    )
    assert not [p for p in os.listdir(tmp_path) if p.endswith(_io.TEMP_SUFFIX)]


def edited(files, tmp_path, **change) -> Path:
    """The good result file with some arrays replaced (``change[name](array) -> new array``), as a
    hand edit or another program would write it: a well-formed archive."""
    with np.load(_bytes_file(tmp_path, files["result"])) as z:
        arrays = {k: z[k] for k in z.files}
    for key, edit in change.items():
        arrays[key] = edit(arrays[key])
    path = tmp_path / "edited.npz"
    np.savez(path, **arrays)
    return path


def _bytes_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "good.npz"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"mse_mean": np.negative}, r"mse_mean is negative at round 0"),
        ({"mse_quantiles": lambda x: x - 1e9}, r"mse_quantiles is negative"),
        ({"mse_sem": lambda x: np.full_like(x, np.nan)}, r"mse_sem is NaN at round 0, where 3 seeds"),
        ({"num_diverged": lambda x: x + 4}, r"num_diverged is 4 at round 0, expected a count in \[0, 3\]"),
        ({"num_diverged": lambda x: x - 1}, r"num_diverged is -1"),
        ({"samples": np.negative}, r"samples is -?\d.* expected a count >= 0"),
    ],
    ids=[
        "mse-negated",
        "quantiles-negative",
        "sem-nan",
        "diverged-above-seeds",
        "diverged-negative",
        "counts",
    ],
)
def test_values_no_run_writes_are_a_damaged_file(files, tmp_path, change, named):
    """A well-formed file whose values were edited to ones no run produces (a negative MSE, a
    standard error NaN where three seeds define it, a diverged count outside [0, seeds], a negative
    count) is a DamagedFileError naming the file and the field; the unedited file loads."""
    fj.load(_bytes_file(tmp_path, files["result"]))
    path = edited(files, tmp_path, **change)
    with pytest.raises(DamagedFileError, match=named) as err:
        fj.load(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
