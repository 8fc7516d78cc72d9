"""One JAX CPU device per core: the fast default for simulations on a CPU.

By default JAX's CPU backend exposes a single device, which runs each operation
of a kernel multi-threaded. Our kernels are many small fused operations (one
round of local steps for a batch of seeds), which that threading speeds up
little. :func:`fedsa_jax.simulate` shards the seed axis over every device in
``jax.devices()``, so with one CPU device per core each core runs its own share
of the seeds instead. Measured on a 2-core machine with
``benchmarks/kernel_paths.py`` (1000 seeds, warm agent-steps/s, 1 -> 2 devices):
TD FedLSA 4.08e7 -> 6.4e7, TD SCAFFLSA 3.77e7 -> 5.6e7, QFedTD (4 bits, p = 0.6)
2.19e7 -> 2.8e7, Gaussian FedLSA 2.49e7 -> 2.7e7 (its normal draw already used
both cores); ``benchmarks/README.md`` ("Throughput").

Per-seed results do not depend on the device count (means differ at float
rounding only, from the different batch shape; see "What is reproducible"
in ``docs/guide/precision.md``).

JAX fixes the number of CPU devices when its backends start (the first array,
``jax.devices()``, the first computation), so :func:`use_cpu_cores` must run
before that: right after ``import fedsa_jax``. The command line
(``fedsa-jax run``, ``fedsa-jax sweep``) calls it at start (``--cpu-devices N``
chooses the count); importing :mod:`fedsa_jax` never does.

How JAX behaves (checked with JAX 0.10): ``jax.config.update("jax_num_cpu_devices", n)``
after the backends started raises JAX's own ``RuntimeError`` unless ``n`` is the value
already set, whatever the actual device count; before, it takes precedence over
``XLA_FLAGS=--xla_force_host_platform_device_count``. So :func:`use_cpu_cores` reads that
flag first (the user's choice wins), and asks ``jax._src.xla_bridge.backends_are_initialized``
whether the backends started (then it compares with ``len(jax.devices("cpu"))``).

Example:
  >>> import fedsa_jax as fj
  >>> fj.use_cpu_cores()  # doctest: +SKIP
  2
"""

from __future__ import annotations

import os
import re
import warnings

from fedsa_jax import _validate
from fedsa_jax.registry import XLA_FLAG  # --cpu-devices' help names it too

__all__ = ["XLA_FLAG", "use_cpu_cores"]

_XLA_FLAG_RE = re.compile(rf"(?:^|\s)--?{XLA_FLAG}=(\S*)")
_ours: int | None = None  # the jax_num_cpu_devices value use_cpu_cores set (not the user's own)

# With several CPU devices the seeds' moments are summed across them (an all-reduce at each recorded
# round). A device thread that reaches it first waits for the others: past 20 s XLA logs "This thread has
# been waiting for `all reduce ...` for 20 seconds and may be stuck", and 40 s later it aborts the
# process (exit status 134). On a loaded machine the scheduler can leave one device's thread that far
# behind the other over a long chunk (a suspended laptop too): nothing is stuck, the run would finish
# with the same numbers. Measured (JAX 0.10, two CPU devices, one held back in a callback before a
# psum): a 25 s or 45 s stall logs the line and finishes, a 130 s stall aborts at 60 s; with these
# flags at STUCK_SECONDS and TERMINATE_SECONDS the 25 s stall logs nothing.
STUCK_FLAG = "xla_cpu_collective_call_warn_stuck_timeout_seconds"
TERMINATE_FLAG = "xla_cpu_collective_call_terminate_timeout_seconds"
STUCK_SECONDS = 600
TERMINATE_SECONDS = 86400
STUCK_FLAG_SINCE = (0, 9, 0)  # jaxlib knows the flags (XLA, October 2025); an unknown flag aborts XLA


def usable_cores() -> int:
    """Number of cores this process may run on: its CPU affinity where the platform has one
    (a job scheduler's allocation, ``taskset``), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def backends_initialized() -> bool:
    """True once JAX has started its backends (after which the CPU device count is fixed)."""
    from jax._src import xla_bridge

    check = getattr(xla_bridge, "backends_are_initialized", None)
    if check is not None:
        return bool(check())
    return bool(getattr(xla_bridge, "_backends", None))  # older JAX: the same dict, read directly


def explicit_count() -> tuple[str, int] | None:
    """The CPU device count the user set (not :func:`use_cpu_cores`), and where:
    ``jax_num_cpu_devices`` (config or ``JAX_NUM_CPU_DEVICES``; it takes precedence in JAX)
    or ``XLA_FLAGS=--xla_force_host_platform_device_count=N``. None if neither is set."""
    import jax

    configured = int(getattr(jax.config, "jax_num_cpu_devices", -1))
    if configured >= 0 and configured != _ours:
        return f"jax_num_cpu_devices={configured}", configured
    found = _XLA_FLAG_RE.findall(os.environ.get("XLA_FLAGS", ""))
    if found and found[-1].isdigit():  # the last occurrence is the one XLA keeps
        return f"XLA_FLAGS=--{XLA_FLAG}={found[-1]}", int(found[-1])
    return None


def use_cpu_cores(num_devices: int | None = None) -> int:
    """Give JAX's CPU backend ``num_devices`` devices (default: one per usable core).

    Sets ``jax.config.update("jax_num_cpu_devices", num_devices)``, so that
    :func:`fedsa_jax.simulate` shards its seeds over one device per core (measured 1.05x
    for Gaussian LSA to 1.6x for TD on 2 cores, against JAX's single multi-threaded device:
    see the module docstring). Call it right after ``import fedsa_jax``, before any JAX computation.

    A count set explicitly beforehand wins and is left as it is:
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` or ``jax_num_cpu_devices``
    (``JAX_NUM_CPU_DEVICES``); with ``num_devices`` given and different, a
    ``RuntimeWarning`` says so. GPU and TPU devices are not affected: on those machines
    the simulation runs on the accelerator as before.

    Args:
      num_devices: number of CPU devices, an integer from 1 to the number of cores this
        process may use (its CPU affinity, else ``os.cpu_count()``); None: that number.

    Returns:
      The number of CPU devices JAX has (or will have when its backends start).

    Raises:
      ValueError: ``num_devices`` is not an integer >= 1, or exceeds the usable cores
        (checked where it would be given to JAX: a count the backends already have, or
        an explicit count, is not refused; JAX honours an explicit count as it is).
      RuntimeError: JAX's backends are already running with another number of CPU
        devices (JAX cannot change it then) and no explicit count was set.

    Example:
      >>> import fedsa_jax as fj
      >>> n = fj.use_cpu_cores()  # doctest: +SKIP
      >>> res = fj.simulate(key, problem, alg, num_rounds=100, num_seeds=1000)  # doctest: +SKIP
      >>> res.config["device_count"] == n  # doctest: +SKIP
      True
    """
    if num_devices is not None:
        num_devices = _validate.integer("num_devices", num_devices)
    wanted = usable_cores() if num_devices is None else num_devices
    explicit = explicit_count()
    started = backends_initialized()
    if started:
        import jax

        have = len(jax.devices("cpu"))
        if have == wanted or explicit is not None:
            _warn_unused(num_devices, explicit, have)
            return have
        raise RuntimeError(
            f"cannot give JAX {wanted} CPU devices: its backends are already initialised in this process, "
            f"with {have} CPU device{'s' * (have != 1)}, and JAX fixes the count when they start. Call "
            "fedsa_jax.use_cpu_cores() right after `import fedsa_jax`, before any JAX computation (an array, "
            "jax.devices(), a simulation), or start a new process."
        )
    if explicit is not None:
        _warn_unused(num_devices, explicit, explicit[1])
        if explicit[1] > 1:
            quiet_collectives()
        return explicit[1]
    cores = usable_cores()
    if wanted > cores:  # XLA gives each CPU device a thread: 999 of them made it abort (exit status 134)
        _validate.fail(
            "num_devices",
            num_devices,
            f"expected an integer from 1 to {cores}, the cores this process "
            "may use (its CPU affinity): more CPU devices than cores do not run faster",
        )
    import jax

    global _ours
    jax.config.update("jax_num_cpu_devices", wanted)
    _ours = wanted
    if wanted > 1:
        quiet_collectives()
    return wanted


def quiet_collectives() -> None:
    """Raise XLA's thresholds on a CPU device waiting for another at a collective: "may be stuck"
    logged after ``STUCK_SECONDS``, the process aborted after ``TERMINATE_SECONDS`` (``--{STUCK_FLAG}``
    and ``--{TERMINATE_FLAG}`` added to ``XLA_FLAGS``, read when the backends start): a loaded
    machine's scheduler, not a deadlock, keeps one device waiting for another (see ``STUCK_FLAG``). A
    value the user set in ``XLA_FLAGS`` stays; a jaxlib older than ``STUCK_FLAG_SINCE`` is left alone."""
    import jaxlib

    version = tuple(int(p) for p in re.findall(r"\d+", jaxlib.__version__)[:3])
    if version < STUCK_FLAG_SINCE:
        return
    for flag, seconds in ((STUCK_FLAG, STUCK_SECONDS), (TERMINATE_FLAG, TERMINATE_SECONDS)):
        flags = os.environ.get("XLA_FLAGS", "")
        if flag not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --{flag}={seconds}".strip()


def _warn_unused(num_devices: int | None, explicit: tuple[str, int] | None, count: int) -> None:
    if num_devices is not None and num_devices != count and explicit is not None:
        warnings.warn(
            f"{num_devices} CPU devices asked for, but {explicit[0]} was set explicitly and wins "
            f"(JAX has {count} CPU devices)",
            RuntimeWarning,
            stacklevel=3,
        )
