"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import time


def best_of(fn, repeats: int = 3) -> float:
    """Smallest wall time of ``repeats`` calls of ``fn()``, in seconds."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def write_json(path, report):
    """Write ``report`` to ``path`` (if given) and return it."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
    return report


def add_cpu_devices_option(parser) -> None:
    """``--cpu-devices N``: JAX CPU devices the seeds are sharded over (default: one per core)."""
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="JAX CPU devices (default: one per core, fj.use_cpu_cores(); 1: JAX's single "
        "multi-threaded device; an explicit XLA_FLAGS device count wins)",
    )


def use_cpu_devices(num_devices: int | None) -> str:
    """``fj.use_cpu_cores(num_devices)`` before any JAX computation; returns the devices the
    kernels run on, for the header line (e.g. ``"2 cpu devices"``).

    A package without ``use_cpu_cores`` (an older checkout on ``PYTHONPATH``, for an A/B
    comparison) gets the same count through ``jax_num_cpu_devices``, so both sides run on
    equal devices."""
    import jax

    import fedsa_jax as fj

    if hasattr(fj, "use_cpu_cores"):
        fj.use_cpu_cores(num_devices)
    else:
        import os

        explicit = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
        if not explicit:
            jax.config.update("jax_num_cpu_devices", num_devices or len(os.sched_getaffinity(0)))
    n = jax.device_count()
    return f"{n} {jax.default_backend()} device{'s' * (n != 1)}"
