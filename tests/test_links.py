"""No write through a planted link (locks, temporaries, checkpoints, results), and error messages
of bounded length.

A shared folder (a sweep's output, a checkpoint folder) may hold a file planted by someone else:
a symbolic or hard link named like one of our lock files or temporaries, pointing at a victim file.
Every test here plants one and checks that the victim's bytes are unchanged afterwards.
"""

import os
import tracemalloc

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax import _io, _validate, cli
from fedsa_jax._runtime import checkpoint as _checkpoint
from fedsa_jax._runtime.sweep import config_name

VICTIM = b"precious bytes, not ours to write\n"
needs_locks = pytest.mark.skipif(_io.fcntl is None, reason="no file locks on this platform")


@pytest.fixture(scope="module")
def tiny():
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    return problem, fj.fedlsa(0.1, 2)


def run_tiny(tiny, folder):
    return fj.simulate(jax.random.key(1), *tiny, 4, 3, chunk_rounds=2, checkpoint_dir=folder)


@pytest.fixture()
def victim(tmp_path):
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM)
    return path


def plant(kind, path, victim):
    """Put at ``path`` what a hostile user sharing the folder could: a link to ``victim``, a link to
    a file that does not exist yet, a second name of ``victim`` (hard link), a named pipe."""
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "dangling symlink":
        victim.unlink()
        path.symlink_to(victim)
    elif kind == "hard link":
        os.link(victim, path)
    else:
        os.mkfifo(path)


def assert_untouched(victim, kind="symlink"):
    if kind == "dangling symlink":
        assert not victim.exists(), "a file was created through a dangling link"
    else:
        assert victim.read_bytes() == VICTIM


def assert_refused(err, path, what="a symbolic link"):
    message = str(err.value)
    assert "\n" not in message and repr(str(path)) in message, message
    assert what in message and "remove it" in message, message


# ----------------------------------------------------------------------------------------------- locks


@needs_locks
@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "hard link", "fifo"])
def test_a_planted_lock_file_is_refused_and_the_victim_untouched(tmp_path, victim, kind):
    lock = tmp_path / ".config.lock"
    plant(kind, lock, victim)
    with pytest.raises(ValueError) as err:
        with _io.file_lock(lock):
            raise AssertionError("locked through a planted file")
    what = {
        "symlink": "a symbolic link",
        "dangling symlink": "a symbolic link",
        "hard link": "a hard link",
        "fifo": "not a regular file",
    }[kind]
    assert_refused(err, lock, what)
    assert_untouched(victim, kind)
    assert os.path.lexists(lock)  # refused, left for its owner to look at


@needs_locks
def test_a_checkpoint_lock_link_is_refused(tiny, tmp_path, victim):
    run_tiny(tiny, tmp_path)
    finger = str(_checkpoint.load(tmp_path)["fingerprint"])
    lock = tmp_path / f".{_checkpoint.filename(finger)[:-4]}.lock"
    lock.symlink_to(victim)
    with pytest.raises(ValueError) as err:
        run_tiny(tiny, tmp_path)
    assert_refused(err, lock)
    assert_untouched(victim)


@needs_locks
def test_a_sweep_lock_link_is_refused(tiny, tmp_path, victim):
    problem, alg = tiny
    lock = tmp_path / f".{config_name({'step': 1})}.lock"
    lock.symlink_to(victim)
    with pytest.raises(ValueError) as err:
        fj.sweep(jax.random.key(1), [{"step": 1}], lambda c: (problem, alg), 4, 3, out_dir=tmp_path)
    assert_refused(err, lock)
    assert_untouched(victim)


# ------------------------------------------------------------------------------------------ temporaries


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink"])
def test_a_link_named_like_a_temporary_is_never_written_through(tmp_path, victim, kind, monkeypatch):
    """``O_EXCL``: a link at the temporary's name is an existing file; the write takes another name."""
    planted = tmp_path / f".r.json~{_io._host()}~{os.getpid()}~00ff{_io.TEMP_SUFFIX}"
    plant(kind, planted, victim)
    names = iter([planted])
    real = _io._temp_path
    monkeypatch.setattr(_io, "_temp_path", lambda folder, target: next(names, None) or real(folder, target))
    _io.write_json(tmp_path / "r.json", {"a": 1})
    assert (tmp_path / "r.json").read_text() == '{\n  "a": 1\n}\n'
    assert_untouched(victim, kind)
    assert planted.is_symlink()


def test_removing_a_stale_temporary_link_removes_the_link_only(tmp_path, victim):
    planted = tmp_path / f".r.npz~{_io._host()}~999999999~00ff{_io.TEMP_SUFFIX}"  # no such process
    planted.symlink_to(victim)
    os.utime(planted, (0, 0), follow_symlinks=False)
    assert _io.remove_stale_temporaries(tmp_path) == [planted]
    assert not os.path.lexists(planted)
    assert_untouched(victim)


# ------------------------------------------------------------------------------- checkpoints and results


def test_a_checkpoint_file_that_is_a_link(tiny, tmp_path, victim):
    """A link to another file is read (following a link changes nothing), found not to be a checkpoint
    and refused; a link to nothing is a fresh start whose checkpoints replace the link itself."""
    run_tiny(tiny, tmp_path)
    (path,) = _checkpoint.paths(tmp_path)
    path.unlink()
    path.symlink_to(victim)
    with pytest.raises(ValueError, match="is damaged or not a fedsa_jax checkpoint file"):
        run_tiny(tiny, tmp_path)
    assert_untouched(victim)
    path.unlink()
    victim.unlink()
    path.symlink_to(victim)
    fresh = run_tiny(tiny, tmp_path)
    assert fresh.config["execution"]["seed_rounds_run"] > 0
    assert not path.is_symlink() and not victim.exists()
    assert str(_checkpoint.read(path)["fingerprint"]).startswith(path.stem.split("-")[1])


def test_saving_a_result_onto_a_link_replaces_the_link(tiny, tmp_path, victim):
    res = fj.simulate(jax.random.key(1), *tiny, 4, 3)
    link = tmp_path / "r.npz"
    link.symlink_to(victim)
    res.save(link)
    assert_untouched(victim)
    assert not link.is_symlink()
    np.testing.assert_array_equal(fj.load(link).mse_mean, res.mse_mean)


def test_the_command_line_writes_no_result_through_a_link(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    (out / "result_fedlsa.npz").symlink_to(victim)
    assert (
        cli.main(
            [
                "run",
                "--algorithms",
                "fedlsa",
                "--agents",
                "2",
                "--states",
                "4",
                "--dim",
                "2",
                "--local-steps",
                "2",
                "--rounds",
                "3",
                "--seeds",
                "3",
                "--dtype",
                "float64",
                "--no-plot",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert_untouched(victim)
    assert not any(p.is_symlink() for p in out.iterdir())
    assert fj.load(out / "result_fedlsa.npz").config["num_seeds"] == 3


# ----------------------------------------------------------------------------------- bounded messages


def test_exact_mse_names_the_sizes_of_a_state_too_large_before_building_it():
    """N = 5000 agents, d = 2: SCAFFLSA's exact state has 20003 coordinates (a 3.2 GB covariance), and
    its factored form 10003 (the server's 3 and every agent's control variate: 800 MB)."""
    problem = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=5000, dim=2)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as err:
            fj.theory.exact_mse(problem, fj.scafflsa(0.1, 2), 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert len(message) < 500, message[:1000]
    assert "problem='N=5000, d=2' is invalid" in message and "20003 coordinates" in message
    assert "5000 x 2 (xi)" in message and "5000 x 2 (loc)" in message
    assert "MAX_AUGMENTED_DIM = 2000" in message
    assert "10003 factored coordinates > MAX_FACTORED_DIM = 8100" in message
    assert peak < 64e6, peak  # refused before building anything


names = st.from_regex(r"[a-z_][a-z0-9_]{0,30}(\[[0-9]{1,4}\])?", fullmatch=True)
values = st.one_of(
    st.text(max_size=3000),
    st.binary(max_size=3000),
    st.integers(),
    st.integers(min_value=10**4400),
    st.floats(),
    st.lists(st.integers(), max_size=3000),
    st.dictionaries(st.text(max_size=20), st.integers()),
    st.lists(st.one_of(st.integers(), st.lists(st.integers(), min_size=2, max_size=3)), max_size=50),
    st.tuples(st.text(max_size=2000), st.none()),
    st.integers(0, 5000).map(np.zeros),
)


@settings(max_examples=30, deadline=None)
@given(
    name=names,
    value=values,
    allowed=st.text(st.characters(blacklist_categories=("Cc", "Zl", "Zp")), max_size=2000),
)
def test_validation_messages_are_bounded_and_name_the_parameter(name, value, allowed):
    with pytest.raises(ValueError) as err:
        _validate.fail(name, value, allowed)
    message = str(err.value)
    assert len(message) <= 500 and "\n" not in message, message
    assert message.startswith(f"{name}=") and " is invalid: " in message
    shown_whole = isinstance(value, (str, bytes, float, dict)) or (
        isinstance(value, int) and abs(value) < 10**100
    )
    if shown_whole and len(repr(value)) <= 100:
        assert message.startswith(f"{name}={value!r} is invalid: ")  # short values are shown whole
