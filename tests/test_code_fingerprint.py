"""Checkpoints and sweep results belong to the code that made them; names never leave their folder.

A checkpoint made by other code (an edited step function, problem method, metric, or a
closure holding another constant) is never resumed: the run starts from round 0, warns
once, and equals a fresh run of the new code. The same code in another process finds its
checkpoint. Names that become paths stay inside the folder the user chose.
"""

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax import cli

# One user module, in versions: an algorithm (its step scaled by STEP), a problem whose noise
# comes from a method it inherits (scaled by NOISE; the rest from test_problem_protocol.Scalar,
# inherited too) and a metric (METRIC).
USER_CODE = """
import dataclasses
import jax
import jax.numpy as jnp
import fedsa_jax as fj
from fedsa_jax.algorithms import init_samplers, initial_theta, round_info, run_agents, server_update
from typing import NamedTuple

import test_problem_protocol


class State(NamedTuple):
    theta: jax.Array
    sampler: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Config:
    step_size: float
    num_local_steps: int = dataclasses.field(default=2, metadata=dict(static=True))


def init(key, problem, theta0, config):
    return State(initial_theta(problem, theta0), init_samplers(key, problem))


def step(rand, state, problem, config):
    eta = jnp.asarray(STEP * config.step_size, problem.dtype)
    local, sampler = run_agents(rand.obs, problem, state.sampler, state.theta, eta)
    mean, delivery = server_update(rand.channel, state.theta, local, fj.channel.channel())
    return State(mean, sampler), round_info(local, mean, delivery, config, problem)


class Noise:
    def direction(self, params, z, theta):
        return params[0] @ theta - params[1] - NOISE * z


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Scalar(Noise, test_problem_protocol.Scalar):  # the protocol's example, its noise edited here
    pass


def metric(state, problem):
    return METRIC


def build():
    a = jnp.array([[[1.0]], [[2.0]]])
    b = jnp.array([[1.0], [-1.0]])
    problem = Scalar(a, b, jnp.array([1.0 / 3.0]), jnp.array([[1.0], [-0.5]]))
    return problem, fj.Algorithm(Config(0.1), "mine", init, step), {"m": metric}
"""
VERSIONS = {
    "STEP": ("1.0", "0.3"),
    "NOISE": ("1.0", "3.0"),
    "METRIC": ("jnp.sum(state.theta ** 2)", "jnp.sum(jnp.abs(state.theta))"),
}


def user_code(changed=None):
    """The user module's text, with ``changed`` (a key of VERSIONS) in its edited version."""
    text = USER_CODE
    for name, (old, new) in VERSIONS.items():
        text = text.replace(name, new if name == changed else old)
    return text


def load(text, module="user_code"):
    namespace = {"__name__": module}
    exec(compile(text, f"<{module}>", "exec"), namespace)  # noqa: S102 (the test's own source text)
    return namespace


class Stop(Exception):
    pass


def stop_after(round_):
    def on_record(record):
        if record.rounds[-1] >= round_:
            raise Stop

    return on_record


def run(problem, alg, metrics, folder=None, **kw):
    return fj.simulate(
        jax.random.key(1), problem, alg, 6, 8, metrics=metrics, chunk_rounds=2, checkpoint_dir=folder, **kw
    )


def same(a, b):
    np.testing.assert_array_equal(a.mse_mean, b.mse_mean)
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    np.testing.assert_array_equal(a.metrics["m"].mean, b.metrics["m"].mean)


@pytest.mark.parametrize("changed", ["STEP", "NOISE", "METRIC"])
def test_edited_code_never_resumes_an_old_checkpoint(tmp_path, changed):
    """The reported case (interrupt, edit the step function, rerun) and the same for a problem's
    inherited method and a metric: a fresh start with one warning, equal to a fresh run."""
    old = load(user_code())["build"]()
    with pytest.raises(Stop):  # the old code, interrupted at round 4 of 6
        run(*old, tmp_path, on_record=stop_after(4))
    new = load(user_code(changed))["build"]()
    with pytest.warns(
        RuntimeWarning,
        match=r"holds a checkpoint \(checkpoint-\w+\.npz\) of this "
        r"configuration made by other code.*starts from round 0",
    ) as caught:
        rerun = run(*new, tmp_path)
    assert len(caught) == 1 and rerun.config["execution"]["resumed_from"] is None
    fresh = run(*new)
    same(rerun, fresh)
    from fedsa_jax._runtime.run import run_code

    old_code = run_code(old[0], old[1], fj.metrics.resolve(old[2]))
    assert rerun.config["code"] == fresh.config["code"] != old_code


def test_a_closure_constant_is_part_of_the_code(tmp_path):
    """Two step functions of the same code closing over 0.5 and 0.6 are different code."""
    ns = load(user_code())
    problem, alg, metrics = ns["build"]()

    def scaled(c):
        return lambda rand, state, problem, config: ns["step"](
            rand, state, problem, dataclasses.replace(config, step_size=c)
        )

    with pytest.raises(Stop):
        run(
            problem, dataclasses.replace(alg, step_fn=scaled(0.5)), metrics, tmp_path, on_record=stop_after(2)
        )
    six = dataclasses.replace(alg, step_fn=scaled(0.6))
    with pytest.warns(RuntimeWarning, match="made by other code"):
        rerun = run(problem, six, metrics, tmp_path)
    same(rerun, run(problem, six, metrics))
    assert rerun.config["execution"]["resumed_from"] is None


def test_a_sweep_does_not_reuse_a_result_of_other_code(tmp_path):
    """A sweep reuses a saved result of the same code, and recomputes one of edited code."""

    def entry(text):
        problem, alg, _ = load(text)["build"]()
        (e,) = fj.sweep(1, [{"eta": 0.1}], lambda config: (problem, alg), 3, 4, out_dir=tmp_path)
        return e

    assert entry(user_code()).status == "ran" and entry(user_code()).status == "loaded"
    edited = entry(user_code("STEP"))
    assert edited.status == "ran" and edited.result.config["code"] == fj.load(edited.path).config["code"]


WORKER = """
import sys, warnings
import jax
jax.config.update("jax_enable_x64", True)
warnings.simplefilter("error")
sys.path[:0] = [sys.argv[1], sys.argv[3]]  # the user's module, and the tests' (the problem it imports)
import fedsa_jax as fj
from user_module import build_user
problem, alg, metrics = build_user()
fj.simulate(jax.random.key(1), problem, alg, 6, 8, metrics=metrics, chunk_rounds=2,
            checkpoint_dir=sys.argv[2])
"""


def test_the_same_code_in_another_process_resumes_and_other_code_does_not(tmp_path, monkeypatch):
    """The fingerprint is the same in a second process (another hash seed) for the same code: its
    finished checkpoint is loaded here without running a round; an edited copy starts afresh."""
    # things that would break a naive digest: a frozenset of strings (hash-seed order), a nested
    # lambda (a code object whose repr has an address), a closure over an object with an address,
    # functools.partial and a jitted helper
    extra = """
import functools
SENTINEL = object()
_scale = jax.jit(lambda x: x * 1.0)

def _kind(name, marker=SENTINEL):
    return (lambda: name in {"alpha", "beta", "gamma"})()

def build_user():
    problem, alg, metrics = build()
    step = functools.partial(_step, _kind("alpha"))
    return problem, fj.Algorithm(alg.config, "mine", alg.init_fn, step), metrics

def _step(flag, rand, state, problem, config):
    state, info = step(rand, state, problem, config)
    return state._replace(theta=_scale(state.theta)), info
"""
    folder = tmp_path / "ckpt"
    (tmp_path / "user_module.py").write_text(user_code() + extra)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    args = [sys.executable, str(worker), str(tmp_path), str(folder), os.path.dirname(__file__)]
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "123"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_module", raising=False)
    import user_module

    def no_more_rounds(*a, **k):
        raise AssertionError("a finished checkpoint must not run any round again")

    with monkeypatch.context() as m:
        m.setattr(sys.modules["fedsa_jax._runtime.kernel"], "_advance", no_more_rounds)
        loaded = run(*user_module.build_user(), folder)  # no warning: warnings are errors here
    assert loaded.config["execution"]["resumed_from"] == {"seed_batch": 1, "round": 0}
    edited = load(user_code("STEP") + extra, "user_module")["build_user"]()
    with pytest.warns(RuntimeWarning, match="made by other code"):
        fresh = run(*edited, folder)
    assert fresh.config["execution"]["resumed_from"] is None


def test_builtin_code_digests_are_stable_and_discriminating():
    """Built-in algorithms (wrappers, schedules, optax optimizers), problems and metrics give
    the same description and digest in a fresh process (another hash seed); a closure's constant,
    a partial's argument, a default argument and a jitted function's body each change it; cycles
    and bound methods are handled."""
    script = textwrap.dedent("""
        import json, jax, optax, fedsa_jax as fj
        problem = fj.problems.garnet(jax.random.key(0), num_agents=3)
        algs = [fj.richardson(fj.averaged(fj.scafflsa(0.1, 2))),
                fj.fedlsa(0.1, 2, server_optimizer=optax.adam(0.1)),
                fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=0.1, k0=10.0), 2),
                fj.fedlsa(optax.cosine_decay_schedule(0.1, 100), 2), fj.qfedtd(0.5, fj.channel.qsgd(4), 0.6)]
        print(json.dumps([a.describe() for a in algs]))
        from fedsa_jax._runtime.run import run_code
        metrics = fj.metrics.resolve(["client_drift", "last_iterate_mse"])
        print(json.dumps([run_code(problem, a, metrics) for a in algs]))
    """)
    outs = [
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        for seed in ("1", "2")
    ]
    described = [o.stdout.splitlines()[0] for o in outs]
    assert described[0] == described[1]  # schedules and optimizers record the digest of their code
    assert [o.returncode for o in outs] == [0, 0], outs[0].stderr[-2000:]
    assert outs[0].stdout == outs[1].stdout and len(set(json.loads(outs[0].stdout.splitlines()[1]))) == 5
    from fedsa_jax._digest import code_digest
    from fedsa_jax._runtime.run import run_code

    def scale(c):
        return lambda k: c * k

    assert code_digest(scale(0.5)) != code_digest(scale(0.6)) == code_digest(scale(0.6))
    assert code_digest(functools.partial(max, 1)) != code_digest(functools.partial(max, 2))
    assert code_digest(jax.jit(lambda x: x + 1)) != code_digest(jax.jit(lambda x: x + 2))

    def with_default(x, c=1.0):
        return c * x

    other = with_default.__defaults__
    with_default.__defaults__ = (2.0,)
    changed = code_digest(with_default)
    with_default.__defaults__ = other
    assert changed != code_digest(with_default)

    class Node:
        def __init__(self):
            self.me = self

        def value(self):
            return 1

    assert code_digest(Node().value) == code_digest(Node().value)  # a cycle through the instance
    problem = fj.problems.garnet(jax.random.key(0), num_agents=3)
    assert run_code(problem, fj.fedlsa(0.1, 2), ()) != run_code(problem, fj.scafflsa(0.1, 2), ())


def test_a_name_never_places_a_file_outside_its_folder(tmp_path, monkeypatch):
    """An algorithm named '..' (through the command line's module:factory) writes its checkpoint
    inside --checkpoint-dir and its results inside --out."""
    (tmp_path / "dotdot_algs.py").write_text(
        textwrap.dedent("""
        import dataclasses, fedsa_jax as fj
        def dotdot():
            return dataclasses.replace(fj.fedlsa(0.1, 2), name="..")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "runs" / "ck"
    assert (
        cli.main(
            [
                "run",
                "--algorithms",
                "dotdot_algs:dotdot",
                "--agents",
                "2",
                "--states",
                "10",
                "--rounds",
                "2",
                "--seeds",
                "2",
                "--no-plot",
                "--no-progress",
                "--checkpoint-dir",
                str(ckpt),
                "--out",
                str(tmp_path / "runs" / "out"),
            ]
        )
        == 0
    )
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".npz"]
    assert sorted(str(p.parent) for p in written) == ["runs/ck/_.", "runs/out"], written


@settings(max_examples=30, deadline=None)
@given(name=st.text(max_size=300))
def test_any_name_stays_inside_its_folder(tmp_path_factory, name):
    """Every text (separators, NUL, '..', very long) becomes one portable name inside the folder,
    for a result, a checkpoint subfolder and a sweep configuration."""
    from fedsa_jax._paths import MAX_NAME, safe_name
    from fedsa_jax._runtime.sweep import config_name

    folder = tmp_path_factory.mktemp("names").resolve()
    for part in (safe_name(name), f"result_{safe_name(name)}.npz", f"{config_name({'algorithm': name})}.npz"):
        path = (folder / part).resolve()
        assert path.parent == folder and not part.startswith(".") and "\0" not in part
        assert len(part.encode()) <= MAX_NAME + 30
    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name) and len(name) <= MAX_NAME:
        assert safe_name(name) == name  # a portable name is kept as it is


def test_a_folder_argument_that_is_not_a_path_is_one_line_error():
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2)
    with pytest.raises(ValueError, match=r"^checkpoint_dir=3 is invalid: expected a folder"):
        fj.simulate(0, problem, fj.fedlsa(0.1, 2), 2, 2, checkpoint_dir=3)
    with pytest.raises(ValueError, match=r"^out_dir=3 is invalid: expected a folder"):
        fj.sweep(0, [{}], lambda c: (problem, fj.fedlsa(0.1, 2)), 2, 2, out_dir=3)
