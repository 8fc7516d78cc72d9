"""One JAX CPU device per core: ``fj.use_cpu_cores`` and the command line's ``--cpu-devices``.

JAX fixes its CPU device count when its backends start, so what a fresh process gets is
checked in subprocesses (a JAX import each: a few seconds); this process's JAX already
runs (conftest), which is the case of the errors.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import cli, cpu

ROOT = Path(__file__).resolve().parents[1]
ERROR = "its backends are already initialised in this process"


def fresh_env(**extra):
    """This environment without any device count of its own (XLA_FLAGS, JAX_NUM_CPU_DEVICES)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(PYTHONPATH=str(ROOT), FEDSA_JAX_COMPILE_CACHE="off", **extra)
    return env


def run_python(code, **env):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=fresh_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_sets_the_count_in_a_fresh_process_then_refuses_another():
    run_python("""
        import jax, fedsa_jax as fj
        assert jax.config.jax_num_cpu_devices == -1  # importing fedsa_jax changed nothing
        assert fj.use_cpu_cores(2) == 2
        assert len(jax.devices("cpu")) == 2 == jax.device_count()
        jax.numpy.ones(3).block_until_ready()
        assert fj.use_cpu_cores(2) == 2  # the count it already has: nothing to do
        try:
            fj.use_cpu_cores(1)
        except RuntimeError as err:
            assert "already initialised" in str(err) and "right after `import fedsa_jax`" in str(err), err
        else:
            raise AssertionError("no RuntimeError")
    """)


def test_default_is_one_device_per_usable_core():
    out = run_python("""
        import os, jax, fedsa_jax as fj
        n = fj.use_cpu_cores()
        print(n, len(jax.devices("cpu")), len(os.sched_getaffinity(0)))
    """)
    n, devices, cores = map(int, out.split())
    assert n == devices == cores == cpu.usable_cores()


@pytest.mark.parametrize(
    "env",
    [{"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}, {"JAX_NUM_CPU_DEVICES": "3"}],
    ids=["XLA_FLAGS", "JAX_NUM_CPU_DEVICES"],
)
def test_an_explicit_count_wins(env):
    run_python(
        """
        import warnings, jax, fedsa_jax as fj
        assert fj.use_cpu_cores() == 3
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert fj.use_cpu_cores(2) == 3
        assert "set explicitly and wins" in str(caught[0].message), caught
        assert len(jax.devices("cpu")) == 3
    """,
        **env,
    )


def test_after_a_computation_another_count_raises_and_the_same_one_is_kept():
    have = len(jax.devices("cpu"))
    if cpu.explicit_count() is not None:
        pytest.skip("this process's device count was set explicitly (it wins over any request)")
    assert cpu.backends_initialized()
    assert fj.use_cpu_cores(have) == have
    with pytest.raises(RuntimeError, match=f"{ERROR}, with {have} CPU device"):
        fj.use_cpu_cores(have + 1)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_num_devices(bad):
    with pytest.raises(ValueError, match=r"num_devices=.* is invalid: expected an integer >= 1"):
        fj.use_cpu_cores(bad)


TINY = [
    "run",
    "--algorithms",
    "scafflsa",
    "--agents",
    "2",
    "--dim",
    "2",
    "--local-steps",
    "2",
    "--rounds",
    "3",
    "--seeds",
    "5",
    "--dtype",
    "float64",
    "--no-plot",
]
PROBLEM = {"garnet": ["--problem", "garnet", "--states", "4"], "gaussian": ["--problem", "gaussian"]}


@pytest.mark.parametrize("problem", ["garnet", "gaussian"])  # gaussian: its laid-out local steps, sharded
def test_cli_cpu_devices_recorded_and_results_equal(tmp_path, problem):
    """Two fresh CLI processes side by side: 2 devices and 1; seeds padded to the device count."""
    if cpu.usable_cores() < 2:
        pytest.skip("2 CPU devices need 2 usable cores")
    procs = {
        n: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fedsa_jax.cli",
                *TINY,
                *PROBLEM[problem],
                "--cpu-devices",
                str(n),
                "--out",
                str(tmp_path / str(n)),
            ],
            env=fresh_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (2, 1)
    }
    logs = {n: p.communicate(timeout=300) for n, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), {n: log[1][-2000:] for n, log in logs.items()}
    two, one = (fj.load(tmp_path / str(n) / "result_scafflsa.npz") for n in (2, 1))
    assert two.config["device_count"] == 2 and one.config["device_count"] == 1
    np.testing.assert_allclose(two.final_theta, one.final_theta, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(two.mse_mean, one.mse_mean, rtol=1e-12)
    np.testing.assert_allclose(two.mse_sem, one.mse_sem, rtol=1e-9)


def test_cli_in_a_running_process(tmp_path, capsys):
    """The default keeps this process's devices (the other CLI tests run so); an explicit count
    it cannot give is a one-line error with exit status 2, before anything runs."""
    if cpu.explicit_count() is not None:
        pytest.skip("this process's device count was set explicitly (it wins over --cpu-devices)")
    have = len(jax.devices("cpu"))
    assert cli.main([*TINY, "--rounds", "1", "--cpu-devices", str(have), "--out", str(tmp_path / "ok")]) == 0
    assert fj.load(tmp_path / "ok" / "result_scafflsa.npz").config["device_count"] == have
    capsys.readouterr()
    assert cli.main([*TINY, "--cpu-devices", str(have + 1), "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsa-jax: error: --cpu-devices={have + 1} is invalid: ") and ERROR in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "no" / "result_scafflsa.npz").exists()
    with pytest.raises(SystemExit):
        cli.main(["run", "--cpu-devices", "0"])
    assert "argument --cpu-devices: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_cpu_devices_is_no_grid_axis(tmp_path):
    for key in ("cpu_devices", "no_compile_cache"):
        (tmp_path / "g.toml").write_text(f"[run]\nrounds = 2\n[grid]\n{key} = 2\n")
        with pytest.raises(ValueError, match=f"grid.{key} is invalid"):
            cli._sweep_spec(tmp_path / "g.toml")


def test_more_devices_than_usable_cores_are_refused_before_jax_starts(tmp_path):
    """XLA gives a CPU device a thread of its own: 999 of them on 2 cores aborted (exit status 134,
    megabytes of logs) after a minute. Refused in one line, and nothing is set."""
    cores = cpu.usable_cores()
    run_python(f"""
        import jax, fedsa_jax as fj
        from fedsa_jax import cpu
        for bad in ({cores + 1}, 999):
            try:
                fj.use_cpu_cores(bad)
            except ValueError as err:
                assert str(err).startswith(f"num_devices={{bad}} is invalid: "
                                           f"expected an integer from 1 to {cores}, "
                                           "the cores this process may use"), err
                assert len(str(err).splitlines()) == 1, err
            else:
                raise AssertionError(f"{{bad}} CPU devices accepted on {cores} cores")
        assert jax.config.jax_num_cpu_devices == -1 and not cpu.backends_initialized()
    """)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsa_jax.cli",
            *TINY,
            "--cpu-devices",
            str(cores + 1),
            "--out",
            str(tmp_path),
        ],
        env=fresh_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(
        f"fedsa-jax: error: --cpu-devices={cores + 1} is invalid: expected an integer "
        f"from 1 to {cores}, the cores this process may use"
    ), proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


STALL = """
    import os, sys, time
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    from fedsa_jax import cpu
    cpu.STUCK_SECONDS, cpu.TERMINATE_SECONDS = int(sys.argv[1]), int(sys.argv[2])
    cpu.use_cpu_cores(2)
    print(os.environ.get("XLA_FLAGS", ""), flush=True)

    def held(i, x):  # device 0 reaches the all-reduce 4 s after device 1
        if int(i) == 0:
            time.sleep(4)
        return x

    def body(x):
        x = jax.pure_callback(held, jax.ShapeDtypeStruct(x.shape, x.dtype), jax.lax.axis_index("s"), x)
        return jax.lax.psum(x, "s")

    mesh = Mesh(np.array(jax.devices()), ("s",))
    print(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("s"), out_specs=P()))(jnp.arange(2.0)))
"""


@pytest.mark.skipif(cpu.usable_cores() < 2, reason="two CPU devices need two usable cores")
def test_two_devices_raise_xlas_stuck_thresholds_and_xla_reads_them():
    """With two CPU devices one device's thread waits for the other at the seeds' all-reduce; XLA logs
    "may be stuck" past 20 s and aborts the process 40 s later, which ``use_cpu_cores`` raises to
    ``STUCK_SECONDS`` and ``TERMINATE_SECONDS`` through ``XLA_FLAGS``. Shown read by XLA with the
    thresholds at 1 s and 2 s: a 4 s stall logs the line and aborts (exit status 134); at the defaults
    the same stall logs nothing and finishes."""

    def stalled(*seconds):
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(STALL), *map(str, seconds)],
            env=fresh_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        return proc.returncode, proc.stdout, proc.stderr

    code, out, err = stalled(1, 2)
    assert f"--{cpu.STUCK_FLAG}=1 --{cpu.TERMINATE_FLAG}=2" in out and "may be stuck" in err, (
        out,
        err[-2000:],
    )
    assert code == -6 or code == 134, (code, err[-2000:])  # SIGABRT
    code, out, err = stalled(cpu.STUCK_SECONDS, cpu.TERMINATE_SECONDS)
    assert code == 0 and f"--{cpu.STUCK_FLAG}=600 --{cpu.TERMINATE_FLAG}=86400" in out, (out, err[-2000:])
    assert "may be stuck" not in err and "[2.]" not in out and "[1.]" in out, (out, err[-2000:])


@pytest.mark.skipif(cpu.usable_cores() < 2, reason="two CPU devices need two usable cores")
def test_one_device_adds_no_flag_and_a_users_own_threshold_stays():
    code = """
        import os
        from fedsa_jax import cpu
        cpu.use_cpu_cores({})
        print(repr(os.environ.get("XLA_FLAGS")))
    """
    assert run_python(code.format(1)).strip() == "None"  # one device: no collective to wait at
    own = f"--{cpu.STUCK_FLAG}=5"
    assert run_python(code.format(2), XLA_FLAGS=own).strip() == repr(f"{own} --{cpu.TERMINATE_FLAG}=86400")
