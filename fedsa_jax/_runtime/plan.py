"""How a run is cut into work: seeds per batch (what fits in memory, :func:`make_plan`), seed slices
per device (:func:`_seed_slices`), rounds per chunk; the memory check of one seed."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate
from fedsa_jax._runtime import kernel as _kernel
from fedsa_jax._runtime.options import CACHE_BYTES, MIN_SLICE_AGENTS
from fedsa_jax._runtime.run import Run
from fedsa_jax.algorithms._base import Algorithm

__all__ = ["STEPS_PER_CHUNK", "MAX_BLOCKS_PER_CHUNK", "MAX_BATCH", "UNTIL_BATCHES", "Plan", "make_plan"]

STEPS_PER_CHUNK = 5e7  # default chunk: about this many agent-local steps (seconds on a CPU)


MAX_BLOCKS_PER_CHUNK = 256  # recorded rounds per chunk at most (the kernel's statistics buffer)


MAX_BATCH = 2**24  # seeds per batch at most (the per-batch sums of counter digits are uint32)


UNTIL_BATCHES = 64  # a precision-targeted run's default seed batch: max_seeds / this (min_seeds at least)


class Plan(NamedTuple):
    batch_size: int  # seeds per batch (before padding)
    padded_batch: int  # per batch, a multiple of the device count
    num_batches: int
    chunk_rounds: int  # a multiple of record_every
    max_blocks: int  # recorded rounds per chunk at most
    seed_slices: int = 1  # a round runs its seeds in this many slices (_kernel.by_slices)

    def seeds_done(self, batch: int, num_seeds: int) -> int:
        """Seeds run once seed batch ``batch`` is finished (the last batch may be partly padding)."""
        return min(num_seeds, (batch + 1) * self.batch_size)


def _check_one_seed_fits(algorithms, carry_bytes, budget: float) -> None:
    """Refuse, before compiling, bootstrap replicates (``trajectories > 1``) one seed of which needs
    more than the memory budget (about 4 copies of its state): named as their number. (A plain
    algorithm runs one seed per batch instead.)"""
    for a in algorithms:
        if a.trajectories == 1:
            continue
        need = 4 * carry_bytes(a)
        if need > budget:
            _validate.fail(
                "num_replicates",
                a.trajectories - 1,
                f"one seed of {a.name} needs about {need / 2**30:.3g} GiB ({a.trajectories} trajectories, "
                f"4 copies of its state), more than memory_budget = {budget / 2**30:.3g} GiB; fewer "
                "replicates or a larger fj.Execution(memory_budget=...)",
            )


def _seed_slices(per_device: int, per_seed: int, num_agents: int, cache: int) -> int:
    """In how many slices a round runs a device's ``per_device`` seeds (:func:`_kernel.by_slices`):
    the divisor of ``per_device`` nearest to the count whose slices take ``cache`` bytes of states,
    each slice holding at least ``MIN_SLICE_AGENTS`` agents. A divisor, so that the seed batch (and
    the statistics reduced over it) is the same with and without slices: results are bitwise
    equal."""
    if not cache:
        return 1
    target = per_device * per_seed / cache
    fits = [k for k in range(1, per_device + 1) if per_device % k == 0]
    fits = [k for k in fits if k == 1 or (per_device // k) * num_agents >= MIN_SLICE_AGENTS]
    return min(fits, key=lambda k: abs(math.log(k / target)) if target > 1 else k)


def make_plan(problem, algorithms: list[Algorithm], run: Run, *, num_configs: int, num_devices: int) -> Plan:
    """Seed batches and chunks for ``num_configs`` algorithms run side by side, each costing at most
    what the costliest of ``algorithms`` costs."""
    execution = run.execution

    def carry_bytes(algorithm):
        # one module-level function, the problem and algorithm as arguments: JAX's trace cache
        # answers repeated calls (a closure made here would be traced anew at every call, ~70 ms)
        shapes = jax.eval_shape(
            _kernel._initial_carry,
            jax.ShapeDtypeStruct((2,), jnp.uint32),
            jax.ShapeDtypeStruct((1,), jnp.uint32),
            problem,
            algorithm,
            jnp.asarray(run.theta0, problem.dtype),
        )
        return sum(math.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(shapes))

    per_seed = max(carry_bytes(a) for a in algorithms)
    if execution.seed_batch_size is None:
        _check_one_seed_fits(algorithms, carry_bytes, execution.memory_budget * num_devices)
        # carry in, carry out and the round's temporaries: about 4 copies
        batch_size = max(1, int(execution.memory_budget * num_devices // (4 * per_seed * num_configs)))
        if run.until is not None:  # a precision target checks after each batch: 64 batches at most
            batch_size = min(batch_size, max(run.until.min_seeds, -(-run.num_seeds // UNTIL_BATCHES)))
    else:
        batch_size = execution.seed_batch_size
    batch_size = min(batch_size, run.num_seeds, MAX_BATCH)
    padded_batch = -(-batch_size // num_devices) * num_devices
    cache = (
        CACHE_BYTES.get(jax.default_backend(), 0) if execution.cache_bytes is None else execution.cache_bytes
    )
    slices = _seed_slices(padded_batch // num_devices, per_seed * num_configs, problem.num_agents, cache)
    num_batches = -(-run.num_seeds // batch_size)
    every = run.record_every
    if execution.chunk_rounds is None:
        # Not capped by num_rounds, so that the number of rounds never changes the compiled program.
        steps = max(a.num_local_steps * a.skip * a.trajectories for a in algorithms)
        per_round = padded_batch * problem.num_agents * steps
        per_round *= num_configs
        blocks = min(MAX_BLOCKS_PER_CHUNK, max(1, int(STEPS_PER_CHUNK // max(per_round * every, 1))))
    else:
        blocks = min(MAX_BLOCKS_PER_CHUNK, -(-execution.chunk_rounds // every))  # whole recorded blocks
    return Plan(batch_size, padded_batch, num_batches, blocks * every, blocks, slices)
