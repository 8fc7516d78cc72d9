"""The Monte Carlo driver: one compiled kernel for all seeds, rounds, agents and local steps.

Layout (innermost first): local steps are a ``lax.scan`` inside each agent;
agents are vmapped inside ``algorithm.step``; seeds are vmapped here and their
axis is sharded over every device (``jax.sharding.Mesh`` + ``NamedSharding``,
one mesh axis ``"seeds"``; multi-host after ``jax.distributed.initialize``);
rounds are a ``lax.while_loop`` whose bounds are traced values, so one compiled
program serves every number of rounds and every chunk.

Execution: the host runs the rounds in chunks of that kernel (a progress bar
per chunk, an atomic checkpoint after each one when ``checkpoint_dir`` is
given) and the seeds in batches when they do not fit in memory. At each
recorded round a batch is reduced to mergeable moments (:mod:`fedsa_jax.stats`)
that the host combines, so neither chunking, batching nor the number of devices
changes any seed's trajectory. Memory: per-seed states ``O(seeds x agents x d)``
plus one round of random numbers, independent of ``num_rounds``.

Randomness: seed ``i`` uses ``k_i = fold_in(key, i)``; ``(k_init, k_rounds) =
split(k_i)``; round ``t`` draws all agents' random numbers in one block from
``fold_in(k_rounds, t)``. Seed i's trajectory therefore depends only on
``(key, i)``, and two algorithms run with the same key see the same observations
(common random numbers).

Round t+1's block is drawn during round t and carried in the loop. As a loop
carry it is materialised once; drawn inside the round, XLA:CPU fuses (recomputes)
the elementwise threefry hash into each of the ~20 gathers that consume it
(measured: kernel CPU time 1.5 s -> 0.6 s). Memory: one extra block per seed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fedsa_jax import _checkpoint, _io, _validate
from fedsa_jax.algorithms._base import Algorithm
from fedsa_jax.result import SimulationResult
from fedsa_jax import __version__
from fedsa_jax.stats import Moments, finalize, merge, seed_moments

_num_traces = 0  # incremented each time a kernel is traced (tests check no retrace)

STEPS_PER_CHUNK = 5e7  # default chunk: about this many agent-local steps (seconds on a CPU)
MAX_BLOCKS_PER_CHUNK = 256  # recorded rounds per chunk at most (the kernel's statistics buffer)
MEMORY_BUDGET = 2 * 2**30  # default bytes for one seed batch's states, per device
QUANTILE_MAX_RECORDS = 10_000  # quantiles on by default up to this many recorded rounds (4 kB each)


class Carry(NamedTuple):
    states: Any  # the algorithm's per-seed states, leading axis = seeds
    delivered: jax.Array  # (B,) int32, uplink messages delivered so far
    rand: Any  # the next round's random numbers, drawn one round ahead
    t: jax.Array  # () uint32, rounds done


def recorded_rounds(num_rounds: int, record_every: int) -> np.ndarray:
    """``0, r, 2r, ...`` and always the last round."""
    rounds = list(range(0, num_rounds + 1, record_every))
    if rounds[-1] != num_rounds:
        rounds.append(num_rounds)
    return np.asarray(rounds, dtype=np.int64)


def per_seed_keys(key: jax.Array, seed_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(init_keys, round_keys)`` of the given seeds: seed i's keys from ``(key, i)`` only."""
    per_seed = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(key, i)))(seed_ids)
    return per_seed[:, 0], per_seed[:, 1]


def seed_keys(key: jax.Array, num_seeds: int) -> tuple[jax.Array, jax.Array]:
    """``(init_keys, round_keys)`` of seeds ``0..num_seeds-1``."""
    return per_seed_keys(key, jnp.arange(num_seeds, dtype=jnp.uint32))


def _draw(algorithm, problem, round_keys, t):
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(round_keys, t)
    return jax.vmap(algorithm.randomness, in_axes=(0, None))(keys, problem)


def _moments(carry: Carry, problem, threshold, valid, quantiles) -> Moments:
    return seed_moments(carry.states.theta, problem.theta_star, threshold, valid, carry.delivered, quantiles)


def _initial_carry(key_data, seed_ids, problem, algorithm, theta0) -> Carry:
    key = jax.random.wrap_key_data(key_data, impl="threefry2x32")
    init_keys, round_keys = per_seed_keys(key, seed_ids)
    states = jax.vmap(algorithm.init, in_axes=(0, None, None))(init_keys, problem, theta0)
    t0 = jnp.uint32(0)
    return Carry(states, jnp.zeros(seed_ids.shape, jnp.int32), _draw(algorithm, problem, round_keys, t0), t0)


def _start_one(key_data, seed_ids, valid, problem, algorithm, theta0, threshold, quantiles):
    carry = _initial_carry(key_data, seed_ids, problem, algorithm, theta0)
    return carry, _moments(carry, problem, threshold, valid, quantiles)


def _advance_one(key_data, seed_ids, valid, carry, problem, algorithm, threshold, end_round, record_every,
                 max_blocks, quantiles):
    """Run rounds ``carry.t .. end_round``, recording moments after every multiple of
    ``record_every`` and at ``end_round``. Returns the carry, a ``(max_blocks, ...)``
    buffer of moments and how many entries are filled."""
    key = jax.random.wrap_key_data(key_data, impl="threefry2x32")
    _, round_keys = per_seed_keys(key, seed_ids)

    def one_round(c: Carry) -> Carry:
        rand_next = _draw(algorithm, problem, round_keys, c.t + 1)
        states, info = jax.vmap(algorithm.step_from, in_axes=(0, 0, None))(c.rand, c.states, problem)
        return Carry(states, c.delivered + info.num_delivered, rand_next, c.t + 1)

    def block(loop):
        c, i, buf = loop
        stop = jnp.minimum((c.t // record_every + 1) * record_every, end_round)
        c = jax.lax.while_loop(lambda c: c.t < stop, one_round, c)
        stats = _moments(c, problem, threshold, valid, quantiles)
        buf = jax.tree.map(lambda b, s: b.at[i].set(s), buf, stats)
        return c, i + 1, buf

    like = jax.eval_shape(lambda c: _moments(c, problem, threshold, valid, quantiles), carry)
    buf = jax.tree.map(lambda s: jnp.zeros((max_blocks,) + s.shape, s.dtype), like)
    carry, filled, buf = jax.lax.while_loop(lambda l: l[0].t < end_round, block, (carry, jnp.int32(0), buf))
    return carry, buf, filled


# Both kernels take algorithms stacked along a leading "config" axis (size 1 for
# simulate; the continuous hyperparameters of a sweep group otherwise) and vmap
# over it: a sweep over step sizes or success probabilities is one compile.


@functools.partial(jax.jit, static_argnames=("quantiles",))
def _start(key_data, seed_ids, valid, problem, algorithms, theta0, threshold, *, quantiles):
    global _num_traces
    _num_traces += 1
    one = functools.partial(_start_one, key_data, seed_ids, valid, problem, quantiles=quantiles)
    return jax.vmap(one, in_axes=(0, None, None))(algorithms, theta0, threshold)


@functools.partial(jax.jit, static_argnames=("record_every", "max_blocks", "quantiles"))
def _advance(key_data, seed_ids, valid, carry, problem, algorithms, threshold, end_round, *,
             record_every, max_blocks, quantiles):
    global _num_traces
    _num_traces += 1

    def one(c, a):
        return _advance_one(key_data, seed_ids, valid, c, problem, a, threshold, end_round, record_every,
                            max_blocks, quantiles)

    return jax.vmap(one)(carry, algorithms)


def _check_problem(problem) -> None:
    for attr in ("agent_params", "randomness", "observe", "direction", "init_sampler", "theta_star"):
        if not hasattr(problem, attr):
            _validate.fail("problem", type(problem).__name__, "expected a problem from fedsa_jax.problems")


class _Plan(NamedTuple):
    batch: int  # seeds per batch (before padding)
    padded: int  # per batch, a multiple of the device count
    num_batches: int
    chunk_rounds: int  # a multiple of record_every
    max_blocks: int


def _plan(problem, algorithm, theta0, n, r, num_configs, seed_batch_size, chunk_rounds, num_devices) -> _Plan:
    """Seed batches and chunks for ``num_configs`` algorithms run side by side."""
    if seed_batch_size is None:
        shapes = jax.eval_shape(
            _initial_carry, jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((1,), jnp.uint32),
            problem, algorithm, theta0,
        )
        per_seed = sum(math.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(shapes))
        # carry in, carry out and the round's temporaries: about 4 copies
        batch = max(1, int(MEMORY_BUDGET * num_devices // (4 * per_seed * num_configs)))
    else:
        batch = seed_batch_size
    batch = min(batch, n)
    padded = -(-batch // num_devices) * num_devices
    num_batches = -(-n // batch)
    if chunk_rounds is None:
        # Not capped by T, so that the number of rounds never changes the compiled program.
        per_round = padded * problem.num_agents * algorithm.config.num_local_steps * algorithm.config.skip
        per_round *= num_configs
        blocks = min(MAX_BLOCKS_PER_CHUNK, max(1, int(STEPS_PER_CHUNK // max(per_round * r, 1))))
    else:
        blocks = min(MAX_BLOCKS_PER_CHUNK, -(-chunk_rounds // r))  # whole recorded blocks, bounded buffer
    return _Plan(batch, padded, num_batches, blocks * r, blocks)


def _seed_mesh():
    devices = np.asarray(jax.devices())
    mesh = jax.sharding.Mesh(devices, ("seeds",))
    return NamedSharding(mesh, P("seeds")), NamedSharding(mesh, P()), devices.size


def _global_array(values: np.ndarray, sharding) -> jax.Array:
    return jax.make_array_from_callback(values.shape, sharding, lambda idx: values[idx])


def _to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def simulate(
    key,
    problem,
    algorithm: Algorithm,
    num_rounds: int,
    num_seeds: int,
    theta0=None,
    record_every: int = 1,
    divergence_threshold: float = 1e10,
    *,
    seed_batch_size: int | None = None,
    chunk_rounds: int | None = None,
    checkpoint_dir=None,
    progress: bool | None = None,
    quantiles: bool | None = None,
) -> SimulationResult:
    """Run ``num_seeds`` independent copies of ``algorithm`` on ``problem``.

    Args:
      key: JAX threefry PRNG key (or an int seed). ``rbg`` keys are refused.
      problem: a problem from :mod:`fedsa_jax.problems`.
      algorithm: e.g. ``fj.fedlsa(0.1, 10)``, ``fj.scafflsa(0.1, 10)``, ``fj.qfedtd(0.6, q, 0.6)``.
      num_rounds: communication rounds T >= 1.
      num_seeds: independent runs >= 1.
      theta0: ``(d,)`` initial iterate (default 0).
      record_every: record statistics every this many rounds (round 0 and the
        last round are always recorded).
      divergence_threshold: a seed counts as diverged at a recorded round if its
        iterate is non-finite or ``|theta - theta_star|^2`` exceeds this times
        ``1 + |theta_star|^2 + |theta0 - theta_star|^2``.
      seed_batch_size: seeds run together (default: as many as fit in
        ``MEMORY_BUDGET`` bytes per device); more seeds run in batches, one after
        the other, with identical results.
      chunk_rounds: rounds per call of the compiled kernel (default: about
        ``STEPS_PER_CHUNK`` agent-steps; at most ``MAX_BLOCKS_PER_CHUNK`` recorded
        rounds); the progress bar and checkpoints advance per chunk. Results do
        not depend on it.
      checkpoint_dir: if given, an atomic checkpoint is written there after each
        chunk, and a call with the same arguments resumes from it (bit-identical
        to an uninterrupted run). The file is named after the configuration's
        fingerprint, so runs of different configurations can share the folder; a
        second run of the same configuration while the first is running, or a
        damaged checkpoint, is refused with a ``ValueError``.
        ``result.config["execution"]`` says where the run resumed
        (``resumed_from``) and how many seed-rounds it computed (``seed_rounds_run``).
      progress: show a progress bar (default: only on a terminal).
      quantiles: record quantiles of the squared error over seeds
        (``result.mse_quantiles``, from a histogram of ``4 * HIST_BINS`` bytes per
        recorded round); default: when at most ``QUANTILE_MAX_RECORDS`` rounds are
        recorded. Off, ``mse_quantiles`` is NaN.

    Returns:
      :class:`~fedsa_jax.result.SimulationResult`.

    The kernel is compiled once per (problem structure, algorithm structure,
    batch size, record_every, chunk size, dtype): the number of rounds and
    continuous hyperparameters such as the step size are traced values.
    """
    run = validate_run(key, problem, algorithm, num_rounds, num_seeds, theta0, record_every, divergence_threshold,
                       seed_batch_size, chunk_rounds, checkpoint_dir, progress, quantiles)
    return _execute(run, problem, [algorithm])[0]


class Run(NamedTuple):
    """Validated run options shared by :func:`simulate` and :func:`fedsa_jax.sweep`."""

    key: jax.Array
    num_rounds: int
    num_seeds: int
    record_every: int
    theta0: np.ndarray
    divergence_threshold: float
    seed_batch_size: int | None
    chunk_rounds: int | None
    checkpoint_dir: Any
    progress: bool | None
    quantiles: bool


def validate_run(key, problem, algorithm, num_rounds, num_seeds, theta0=None, record_every=1,
                 divergence_threshold=1e10, seed_batch_size=None, chunk_rounds=None, checkpoint_dir=None,
                 progress=None, quantiles=None) -> Run:
    """Check every argument of a run before anything is compiled."""
    key = _validate.prng_key("key", key)
    _check_problem(problem)
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__, "expected fj.fedlsa, fj.scafflsa or fj.qfedtd")
    T = _validate.integer("num_rounds", num_rounds)
    n = _validate.integer("num_seeds", num_seeds)
    r = _validate.integer("record_every", record_every)
    if T * problem.num_agents >= 2**31:  # the per-seed count of delivered messages is int32
        _validate.fail("num_rounds", num_rounds, f"expected num_rounds * num_agents < 2**31 "
                       f"(num_agents={problem.num_agents}); split the run")
    if n >= 2**31:  # seed indices are uint32 fold_in data
        _validate.fail("num_seeds", num_seeds, "expected fewer than 2**31 seeds")
    if r > T:
        _validate.fail("record_every", record_every, f"expected an integer in [1, num_rounds={T}]")
    factor = _validate.real("divergence_threshold", divergence_threshold, 0.0, low_open=True)
    if seed_batch_size is not None:
        _validate.integer("seed_batch_size", seed_batch_size)
    if chunk_rounds is not None:
        _validate.integer("chunk_rounds", chunk_rounds)
    if progress not in (None, True, False):
        _validate.fail("progress", progress, "expected True, False or None (on a terminal only)")
    if quantiles is not None and not isinstance(quantiles, bool):
        _validate.fail("quantiles", quantiles, "expected True, False or None (on when few rounds are recorded)")
    if quantiles is None:
        quantiles = T // r + 1 + (T % r > 0) <= QUANTILE_MAX_RECORDS  # = len(recorded_rounds(T, r))
    d = problem.dim
    if theta0 is None:
        theta0_np = np.zeros(d)
    else:
        theta0_np = _validate.array("theta0", theta0, 1)
        if theta0_np.shape != (d,):
            _validate.fail("theta0", theta0, f"expected shape ({d},) to match the problem's dimension")
    algorithm.config.channel.quantizer.check_dim(d)
    if checkpoint_dir is not None and jax.process_count() > 1:
        _validate.fail("checkpoint_dir", checkpoint_dir, "checkpoints are written by single-process runs only")
    if checkpoint_dir is not None:  # created and probed now, not after the first chunk
        _io.prepare_dir(checkpoint_dir, "checkpoint_dir")
    return Run(key, T, n, r, theta0_np, factor, seed_batch_size, chunk_rounds, checkpoint_dir, progress, quantiles)


def _execute(run: Run, problem, algorithms) -> list[SimulationResult]:
    """Run algorithms of one structure (stacked along a config axis) on validated inputs."""
    with contextlib.ExitStack() as stack:  # holds the checkpoint's lock while the run uses it
        return _execute_in(stack, run, problem, algorithms)


def _execute_in(stack: contextlib.ExitStack, run: Run, problem, algorithms) -> list[SimulationResult]:
    key, T, n, r, theta0_np, factor = run[:6]
    seed_batch_size, chunk_rounds, checkpoint_dir, progress, quantiles = run[6:]
    K = len(algorithms)
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *algorithms)
    theta_star = np.asarray(problem.theta_star, np.float64)
    scale = 1.0 + theta_star @ theta_star + np.sum((theta0_np - theta_star) ** 2)
    dtype = problem.dtype
    d = problem.dim

    seeds_sharding, replicated, num_devices = _seed_mesh()
    put = functools.partial(jax.device_put, device=replicated)
    key_data = put(np.asarray(jax.random.key_data(key)))
    problem_r = put(jax.tree.map(np.asarray, problem))
    algorithms_r = put(stacked)
    theta0_r = put(theta0_np.astype(dtype))
    threshold = put(np.asarray(min(factor * scale, float(jnp.finfo(dtype).max)), dtype))
    plan = _plan(problem, algorithms[0], jnp.asarray(theta0_np, dtype), n, r, K, seed_batch_size, chunk_rounds,
                 num_devices)

    ckpt_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
    finger = None if ckpt_dir is None else _checkpoint.fingerprint(  # hashes every leaf: only when needed
        problem, stacked, jax.random.key_data(key), theta0_np,
        problem_structure=problem.describe(), algorithm_structure=[a.describe() for a in algorithms],
        num_rounds=T, num_seeds=n, record_every=r, threshold=factor, batch=plan.batch,
        padded=plan.padded, devices=num_devices, dtype=str(np.dtype(dtype)),
        statistics=Moments._fields, quantiles=quantiles, version=__version__,  # other statistics: refused
    )
    saved = None
    if ckpt_dir is not None:  # this configuration's own file (others share the folder untouched), locked
        stack.enter_context(_checkpoint.lock(ckpt_dir, finger))
        saved = _checkpoint.load(ckpt_dir, finger)
        if saved is not None:
            first = int(saved["batch"])
            _checkpoint.require(saved, [f"final{b}" for b in range(first)]
                                + [f"done_{f}" for f in Moments._fields if first], ckpt_dir, finger)

    from tqdm import tqdm  # plain text bar: no widget dependency in notebooks

    label = algorithms[0].name + (f" x{K}" if K > 1 else "")
    bar = tqdm(total=T * plan.num_batches, unit="round", desc=label, dynamic_ncols=True,
               disable=None if progress is None else not progress)  # None: off unless a terminal
    done: Moments | None = None  # finished batches, merged as they finish: arrays (K, R, ...)
    finals: list[np.ndarray] = []  # per batch, (K, seeds in batch, d)
    first_batch = 0
    resumed_from = None  # where a checkpoint let this run start, and the work it did itself
    seed_rounds_run = 0
    if saved is not None:
        first_batch = int(saved["batch"])
        resumed_from = {"seed_batch": first_batch, "round": 0}
        if first_batch:
            done = Moments(*(saved[f"done_{f}"] for f in Moments._fields))
        finals = [saved[f"final{b}"] for b in range(first_batch)]

    def concat(parts):
        return Moments(*(np.concatenate([getattr(m, f) for m in parts], axis=1) for f in Moments._fields))

    for b in range(first_batch, plan.num_batches):
        ids = np.arange(b * plan.batch, b * plan.batch + plan.padded, dtype=np.uint32)
        seed_ids = _global_array(ids, seeds_sharding)
        valid = _global_array((ids < min(n, (b + 1) * plan.batch)), seeds_sharding)
        carry, m0 = _start(key_data, seed_ids, valid, problem_r, algorithms_r, theta0_r, threshold,
                           quantiles=quantiles)
        recorded = [jax.tree.map(lambda x: np.asarray(x)[:, None], m0)]
        if saved is not None and b == first_batch and "carry0" in saved:
            _checkpoint.require(saved, [f"cur_{f}" for f in Moments._fields]
                                + [f"carry{i}" for i in range(len(jax.tree.leaves(carry)))], ckpt_dir, finger)
            carry = _checkpoint.arrays_to_tree("carry", saved, carry)
            recorded = [Moments(*(saved[f"cur_{f}"] for f in Moments._fields))]
            resumed_from = {"seed_batch": b, "round": int(carry.t[0])}
        t = int(carry.t[0])
        seed_rounds_run += (min(n, (b + 1) * plan.batch) - b * plan.batch) * (T - t)
        bar.update(b * T + t - bar.n)
        while t < T:
            end = min(t + plan.chunk_rounds, T)
            carry, buf, filled = _advance(
                key_data, seed_ids, valid, carry, problem_r, algorithms_r, threshold, jnp.uint32(end),
                record_every=r, max_blocks=plan.max_blocks, quantiles=quantiles,
            )
            k = int(np.asarray(filled)[0])
            recorded.append(jax.tree.map(lambda x: np.asarray(x)[:, :k], buf))
            bar.update(end - t)
            t = end
            if ckpt_dir is not None:
                _save(ckpt_dir, finger, b, done, finals, concat(recorded), carry if t < T else None)
        done = concat(recorded) if done is None else merge([done, concat(recorded)])
        theta = _to_host(carry.states.theta)
        finals.append(theta[:, : min(n, (b + 1) * plan.batch) - b * plan.batch])
        if ckpt_dir is not None:
            _save(ckpt_dir, finger, b + 1, done, finals, None, None)
    bar.close()

    rounds = recorded_rounds(T, r)
    results = []
    for i, algorithm in enumerate(algorithms):
        mine = [Moments(*(getattr(done, f)[i] for f in Moments._fields))]
        merged = finalize(merge(mine))
        bits = algorithm.bits_per_message(d)
        delivered = sum(np.asarray(m.delivered_sum, np.float64) for m in mine) / n
        result = SimulationResult(
            rounds=rounds,
            mse_mean=merged["mse_mean"],
            mse_sem=merged["mse_sem"],
            theta_mean=merged["theta_mean"],
            theta_sem=merged["theta_sem"],
            num_diverged=merged["num_diverged"],
            mse_quantiles=merged["mse_quantiles"],
            final_theta=np.concatenate([f[i] for f in finals]).astype(dtype),
            theta_star=theta_star.astype(dtype),
            bits_sent=rounds.astype(np.float64) * problem.num_agents * bits,
            bits_delivered=delivered * bits,
            config=run_config(key, problem, algorithm, T, n, r, theta0_np, factor, plan, num_devices, quantiles),
        )
        # how this call ran: resumed from a checkpoint (batch, round) or None, and the seed-rounds it computed
        result.config["execution"].update(resumed_from=resumed_from, seed_rounds_run=seed_rounds_run)
        worst = int(result.num_diverged.max())
        if worst:
            warnings.warn(
                f"{algorithm.name} ({algorithm.describe()}): up to {worst} of {n} seeds diverged (first at round "
                f"{int(result.rounds[np.argmax(result.num_diverged > 0)])}); they are counted in "
                "result.num_diverged and left out of mse_mean, mse_sem and theta_mean. "
                "A smaller step_size usually fixes this.",
                RuntimeWarning,
                stacklevel=3,
            )
        results.append(result)
    return results


def _save(directory, finger, batch, done, finals, current, carry) -> None:
    arrays: dict[str, np.ndarray] = {"fingerprint": np.array(finger), "batch": np.array(batch)}
    if done is not None:
        arrays.update({f"done_{f}": np.asarray(getattr(done, f)) for f in Moments._fields})
    for b, th in enumerate(finals):
        arrays[f"final{b}"] = th
    if carry is not None:
        arrays.update({f"cur_{f}": np.asarray(getattr(current, f)) for f in Moments._fields})
        arrays.update(_checkpoint.tree_to_arrays("carry", carry))
    _checkpoint.save(directory, finger, arrays)


def run_config(key, problem, algorithm, T, n, r, theta0, factor, plan, num_devices, quantiles) -> dict[str, Any]:
    import jaxlib

    return {
        "problem": problem.describe(),
        "algorithm": algorithm.describe(),
        "num_rounds": T,
        "num_seeds": n,
        "record_every": r,
        "quantiles": quantiles,
        "theta0": [float(x) for x in theta0],
        "divergence_threshold": factor,
        "dtype": str(np.dtype(problem.dtype)),
        "bits_per_message": algorithm.bits_per_message(problem.dim),
        "execution": {"seed_batch_size": plan.batch, "num_batches": plan.num_batches,
                      "chunk_rounds": plan.chunk_rounds, "padded_batch": plan.padded},
        "prng": {
            "impl": str(jax.random.key_impl(key)),
            "key_data": np.asarray(jax.random.key_data(key)).tolist(),
            "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
        },
        "versions": {"fedsa_jax": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__},
        "device_count": num_devices,
        "process_count": jax.process_count(),
        "platform": jax.default_backend(),
    }
