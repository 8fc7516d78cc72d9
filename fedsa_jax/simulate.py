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

from fedsa_jax import _checkpoint, _io, _paths, _validate, optim
from fedsa_jax._digest import code_digest
from fedsa_jax._module import make_callable
from fedsa_jax.algorithms._base import COUNT_FIELDS, Algorithm
from fedsa_jax.result import COUNT_NAMES, MetricStats, SimulationResult
from fedsa_jax import __version__
from fedsa_jax.stats import Moments, add_counts, finalize, merge, seed_moments

_num_traces = 0  # incremented each time a kernel is traced (tests check no retrace)

STEPS_PER_CHUNK = 5e7  # default chunk: about this many agent-local steps (seconds on a CPU)
MAX_BLOCKS_PER_CHUNK = 256  # recorded rounds per chunk at most (the kernel's statistics buffer)
MAX_BATCH = 2**24  # seeds per batch at most (the per-batch sums of counter digits are uint32)
MEMORY_BUDGET = 2 * 2**30  # default bytes for one seed batch's states, per device
MAX_RECORDS = 10**7  # recorded rounds at most (host statistics are O(records x d))
QUANTILE_MAX_RECORDS = 10_000  # quantiles on by default up to this many recorded rounds (4 kB each)


class Carry(NamedTuple):
    states: Any  # the algorithm's per-seed states, leading axis = seeds
    counters: jax.Array  # (B, C, 2) uint32: each seed's RoundInfo counts summed so far (64-bit, low/high words)
    info: Any  # (B,) the last round's RoundInfo (zeros before the first round), for metrics
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


class Recording(NamedTuple):
    """What the kernel records at each recorded round (static: part of the compiled program)."""

    metrics: tuple = ()  # ((name, fn(state, problem, info) -> scalar), ...) for one seed
    quantiles: bool = True
    keep: int = 0  # per-seed values of the first `keep` seeds


def _moments(carry: Carry, problem, threshold, valid, rec: Recording) -> Moments:
    theta = carry.states.theta
    diff = theta - problem.theta_star
    error = getattr(carry.states, "error", None)  # theta - theta_star, accurate, where the algorithm carries it
    if error is not None:  # used where it agrees with theta to rounding (a wrapper may have moved theta only)
        eps = jnp.finfo(theta.dtype).eps
        tol = 4 * eps * (jnp.abs(problem.theta_star) + jnp.abs(error)) + jnp.finfo(theta.dtype).tiny
        agrees = jnp.all(jnp.abs(diff - error) <= tol, axis=-1, keepdims=True)
        diff = jnp.where(agrees, error, diff)
    err = jnp.sum(diff**2, axis=-1)
    columns = [err]
    for _, fn in rec.metrics:
        value = jax.vmap(fn, in_axes=(0, None, 0))(carry.states, problem, carry.info)
        columns.append(jnp.asarray(value, err.dtype))
    values = jnp.stack(columns, axis=1)
    return seed_moments(theta, problem.theta_star, threshold, valid, values, carry.counters, rec.quantiles,
                        rec.keep)


def _initial_carry(key_data, seed_ids, problem, algorithm, theta0) -> Carry:
    key = jax.random.wrap_key_data(key_data, impl="threefry2x32")
    init_keys, round_keys = per_seed_keys(key, seed_ids)
    states = jax.vmap(algorithm.init, in_axes=(0, None, None))(init_keys, problem, theta0)
    t0 = jnp.uint32(0)
    rand = _draw(algorithm, problem, round_keys, t0)
    info_like = jax.eval_shape(jax.vmap(algorithm.step_from, in_axes=(0, 0, None)), rand, states, problem)[1]
    info = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), info_like)
    counters = jnp.zeros(seed_ids.shape + (len(COUNT_FIELDS), 2), jnp.uint32)
    return Carry(states, counters, info, rand, t0)


def _start_one(key_data, seed_ids, valid, problem, algorithm, theta0, threshold, rec):
    carry = _initial_carry(key_data, seed_ids, problem, algorithm, theta0)
    return carry, _moments(carry, problem, threshold, valid, rec)


def _advance_one(key_data, seed_ids, valid, carry, problem, algorithm, threshold, end_round, record_every,
                 max_blocks, rec):
    """Run rounds ``carry.t .. end_round``, recording moments after every multiple of
    ``record_every`` and at ``end_round``. Returns the carry, a ``(max_blocks, ...)``
    buffer of moments and how many entries are filled."""
    key = jax.random.wrap_key_data(key_data, impl="threefry2x32")
    _, round_keys = per_seed_keys(key, seed_ids)

    def one_round(c: Carry) -> Carry:
        rand_next = _draw(algorithm, problem, round_keys, c.t + 1)
        states, info = jax.vmap(algorithm.step_from, in_axes=(0, 0, None))(c.rand, c.states, problem)
        counts = jnp.stack([getattr(info, f) for f in COUNT_FIELDS], axis=-1)
        return Carry(states, add_counts(c.counters, counts), info, rand_next, c.t + 1)

    def block(loop):
        c, i, buf = loop
        stop = jnp.minimum((c.t // record_every + 1) * record_every, end_round)
        c = jax.lax.while_loop(lambda c: c.t < stop, one_round, c)
        stats = _moments(c, problem, threshold, valid, rec)
        buf = jax.tree.map(lambda b, s: b.at[i].set(s), buf, stats)
        return c, i + 1, buf

    like = jax.eval_shape(lambda c: _moments(c, problem, threshold, valid, rec), carry)
    buf = jax.tree.map(lambda s: jnp.zeros((max_blocks,) + s.shape, s.dtype), like)
    carry, filled, buf = jax.lax.while_loop(lambda l: l[0].t < end_round, block, (carry, jnp.int32(0), buf))
    return carry, buf, filled


# Both kernels take algorithms stacked along a leading "config" axis (size 1 for
# simulate; the continuous hyperparameters of a sweep group otherwise) and vmap
# over it: a sweep over step sizes or success probabilities is one compile.


@functools.partial(jax.jit, static_argnames=("rec", "num_configs"))
def _start(key_data, seed_ids, valid, problem, algorithms, theta0, threshold, *, rec, num_configs):
    global _num_traces
    _num_traces += 1
    one = functools.partial(_start_one, key_data, seed_ids, valid, problem, rec=rec)
    # axis_size: a config without array leaves (all fields static) has nothing to map over
    return jax.vmap(one, in_axes=(0, None, None), axis_size=num_configs)(algorithms, theta0, threshold)


@functools.partial(jax.jit, static_argnames=("record_every", "max_blocks", "rec"))
def _advance(key_data, seed_ids, valid, carry, problem, algorithms, threshold, end_round, *,
             record_every, max_blocks, rec):
    global _num_traces
    _num_traces += 1

    def one(c, a):
        return _advance_one(key_data, seed_ids, valid, c, problem, a, threshold, end_round, record_every,
                            max_blocks, rec)

    return jax.vmap(one)(carry, algorithms)


def _check_problem(problem) -> None:
    from fedsa_jax.problems import missing_members

    missing = missing_members(problem)
    if missing:
        _validate.fail("problem", type(problem).__name__, f"lacks {', '.join(missing)} of the problem protocol "
                       "(fj.problems.Problem)")
    leaves = jax.tree.leaves(problem)
    if len(leaves) == 1 and leaves[0] is problem:
        _validate.fail("problem", type(problem).__name__, "must be a pytree (a frozen dataclass registered with "
                       "jax.tree_util.register_dataclass), so that its arrays enter the kernel as inputs")


def _check_algorithm(problem, algorithm: Algorithm, theta0: np.ndarray, metrics) -> None:
    """Trace one seed's init and one round (abstractly: nothing runs or compiles) and check the
    contract of :class:`~fedsa_jax.algorithms.Algorithm` and of the metrics."""
    from fedsa_jax import metrics as metrics_mod
    from fedsa_jax.algorithms._base import RoundInfo

    def signature(tree):
        leaves, treedef = jax.tree.flatten(tree)
        return treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__))) for x in leaves)

    seen = (signature(problem), signature(algorithm), theta0.shape, metrics)
    if seen in _checked:  # the same structures passed before (e.g. a sweep's configurations)
        return
    where = f"algorithm {algorithm.name!r} on problem {problem.describe().get('family', type(problem).__name__)!r}"
    d, dtype = problem.dim, jnp.dtype(problem.dtype)
    key = jax.random.key(0)
    state = jax.eval_shape(algorithm.init, key, problem, jnp.asarray(theta0, dtype))
    theta = getattr(state, "theta", None)
    if theta is None or getattr(theta, "shape", None) != (d,) or theta.dtype != dtype:
        got = "no field theta" if theta is None else f"theta {getattr(theta, 'shape', '?')} {theta.dtype}"
        _validate.fail("algorithm", algorithm.name, f"{where}: init_fn must return a state with a field theta of "
                       f"shape ({d},) and dtype {dtype} (the server iterate); got {got}")
    error = getattr(state, "error", None)
    if error is not None and (getattr(error, "shape", None) != (d,) or error.dtype != dtype):
        _validate.fail("algorithm", algorithm.name, f"{where}: the state's field error (theta - theta_star) must "
                       f"have shape ({d},) and dtype {dtype}")
    out = jax.eval_shape(algorithm.step, key, state, problem)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], RoundInfo)):
        _validate.fail("algorithm", algorithm.name, f"{where}: step_fn must return (state, RoundInfo) "
                       f"(build the info with fj.algorithms.round_info); got {type(out).__name__}")
    new_state, info = out
    same = jax.tree.structure(new_state) == jax.tree.structure(state) and all(
        (a.shape, a.dtype) == (b.shape, b.dtype) for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)))
    if not same:
        _validate.fail("algorithm", algorithm.name, f"{where}: step_fn must return a state with the structure, "
                       f"shapes and dtypes of its input; got {jax.tree.map(lambda a: a.shape, new_state)} "
                       f"for {jax.tree.map(lambda a: a.shape, state)}")
    bad = [f for f in RoundInfo._fields if getattr(info, f).shape != ()]
    if bad:
        _validate.fail("algorithm", algorithm.name, f"{where}: RoundInfo fields {bad} must be scalars (one seed)")
    metrics_mod.check(metrics, state, problem, info, where)
    _checked.add(seen)


_checked: set = set()  # structures that passed _check_algorithm


def _check_underflow(algorithm: Algorithm, dtype) -> None:
    """Refuse a nonzero hyperparameter (step size, probability, ...) that is 0 in the working dtype."""
    tiny = float(np.finfo(dtype).tiny)
    for path, leaf in jax.tree_util.tree_flatten_with_path(algorithm.config)[0]:
        x = np.asarray(leaf)
        if x.dtype.kind == "f" and np.any((x != 0) & (x.astype(dtype) == 0)):
            name = ".".join(str(getattr(k, "name", getattr(k, "key", k))) for k in path)
            _validate.fail(name or "algorithm", leaf, f"underflows to 0 in {np.dtype(dtype)}; expected 0 or "
                           f"|value| >= {tiny:.3g} (or run in float64)")


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
    batch = min(batch, n, MAX_BATCH)
    padded = -(-batch // num_devices) * num_devices
    num_batches = -(-n // batch)
    if chunk_rounds is None:
        # Not capped by T, so that the number of rounds never changes the compiled program.
        per_round = padded * problem.num_agents * algorithm.num_local_steps * algorithm.skip
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
    metrics=None,
    keep_seeds: int = 0,
    on_record=None,
    seed_batch_size: int | None = None,
    chunk_rounds: int | None = None,
    checkpoint_dir=None,
    progress: bool | None = None,
    quantiles: bool | None = None,
) -> SimulationResult:
    """Run ``num_seeds`` independent copies of ``algorithm`` on ``problem``.

    Args:
      key: JAX threefry PRNG key (or an int seed). ``rbg`` keys are refused.
      problem: a problem from :mod:`fedsa_jax.problems`, or any object following
        the protocol :class:`fedsa_jax.problems.Problem`.
      algorithm: e.g. ``fj.fedlsa(0.1, 10)``, ``fj.scafflsa(0.1, 10)``,
        ``fj.qfedtd(0.6, q, 0.6)``, or your own :class:`~fedsa_jax.Algorithm`.
      num_rounds: communication rounds T >= 1.
      num_seeds: independent runs >= 1.
      theta0: ``(d,)`` initial iterate (default 0).
      record_every: record statistics every this many rounds (round 0 and the
        last round are always recorded).
      divergence_threshold: a seed counts as diverged at a recorded round if its
        iterate is non-finite or ``|theta - theta_star|^2`` exceeds this times
        ``1 + |theta_star|^2 + |theta0 - theta_star|^2``.
      metrics: ``{"name": fn}`` with ``fn(state, problem) -> scalar`` for one seed,
        or a built-in name (``"client_drift"``, ``"control_variate_error"``, see
        :mod:`fedsa_jax.metrics`); recorded at every recorded round like the MSE
        (``result.metrics["name"].mean``, ``.sem``, ``.quantiles``).
      keep_seeds: keep the squared error and the metrics of the first K seeds at
        every recorded round (``result.seed_mse (R, K)``, ``metrics[...].seeds``),
        for spaghetti plots and bootstrap intervals; at most
        ``KEEP_SEEDS_MAX_VALUES`` values in all.
      on_record: ``fn(record)`` called on the host after each chunk with a
        :class:`Record` of the rounds just recorded (statistics over every seed
        run so far), e.g. to stream curves to an experiment tracker.
      seed_batch_size: seeds run together (default: as many as fit in
        ``MEMORY_BUDGET`` bytes per device); more seeds run in batches, one after
        the other, with identical results.
      chunk_rounds: rounds per call of the compiled kernel (default: about
        ``STEPS_PER_CHUNK`` agent-steps; at most ``MAX_BLOCKS_PER_CHUNK`` recorded
        rounds); the progress bar, checkpoints and ``on_record`` advance per chunk.
        Results do not depend on it.
      checkpoint_dir: if given, an atomic checkpoint is written there after each
        chunk, and a call with the same arguments resumes from it (bit-identical
        to an uninterrupted run). The file is named after the configuration's
        fingerprint, so runs of different configurations can share the folder; a
        second run of the same configuration while the first is running, or a
        damaged checkpoint, is refused with a ``ValueError``. The fingerprint
        includes a digest of the algorithm's, problem's and metrics' code
        (:func:`run_code`): edited code starts from round 0, with a ``RuntimeWarning``
        when the folder holds a checkpoint of the same configuration made by other code.
        ``result.config["execution"]`` says where the run resumed
        (``resumed_from``) and how many seed-rounds it computed (``seed_rounds_run``).
      progress: show a progress bar (default: only on a terminal).
      quantiles: record quantiles over seeds of the squared error and the metrics
        (``result.mse_quantiles``, from a histogram of ``4 * HIST_BINS`` bytes per
        value and recorded round); default: when at most ``QUANTILE_MAX_RECORDS``
        rounds are recorded. Off, they are NaN.

    Returns:
      :class:`~fedsa_jax.result.SimulationResult`.

    Before anything compiles, one seed's ``init`` and one round are traced
    abstractly: a state without ``theta (d,)``, a step that does not return
    ``(state, RoundInfo)`` with the same state structure, a problem lacking part
    of the protocol or a metric that is not a real scalar raise a ``ValueError``
    naming the algorithm, the problem or the metric.

    The kernel is compiled once per (problem structure, algorithm structure,
    metrics, batch size, record_every, chunk size, dtype): the number of rounds
    and continuous hyperparameters such as the step size are traced values.
    """
    run = validate_run(key, problem, algorithm, num_rounds, num_seeds, theta0, record_every, divergence_threshold,
                       seed_batch_size, chunk_rounds, checkpoint_dir, progress, quantiles,
                       metrics=metrics, keep_seeds=keep_seeds, on_record=on_record)
    return _execute(run, problem, [algorithm])[0]


KEEP_SEEDS_MAX_VALUES = 2**24  # keep_seeds x recorded rounds x (1 + metrics), float64 on the host


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
    metrics: tuple = ()
    keep_seeds: int = 0
    on_record: Any = None
    code: str = ""  # run_code(problem, algorithm, metrics)


def run_code(problem, algorithm: Algorithm, metrics) -> str:
    """A digest of the code that shapes a run (:mod:`fedsa_jax._digest`): the algorithm's functions
    and config (wrapped algorithms, schedules, optimizers included), the problem's class and static
    fields (its arrays by shape: their values are hashed with the leaves) and the metric functions."""
    return code_digest((code_digest(problem, arrays=False), algorithm, [fn for _, fn in metrics]), length=16)


class Record(NamedTuple):
    """What ``on_record`` receives after each chunk: the rounds just recorded, with statistics
    over the ``num_seeds`` seeds run so far (all of them once the last seed batch runs)."""

    algorithm: str
    config_index: int  # position in a sweep group (0 for simulate)
    batch: int  # seed batch (0-based) of ``num_batches``
    num_batches: int
    num_seeds: int
    rounds: np.ndarray  # (k,)
    mse_mean: np.ndarray  # (k,)
    mse_sem: np.ndarray  # (k,)
    num_diverged: np.ndarray  # (k,)
    metrics: dict  # name -> (mean (k,), sem (k,))
    counts: dict  # communications, messages_delivered, bits_sent, bits_delivered, samples -> (k,) seed means


def validate_run(key, problem, algorithm, num_rounds, num_seeds, theta0=None, record_every=1,
                 divergence_threshold=1e10, seed_batch_size=None, chunk_rounds=None, checkpoint_dir=None,
                 progress=None, quantiles=None, *, metrics=None, keep_seeds=0, on_record=None) -> Run:
    """Check every argument of a run before anything is compiled."""
    from fedsa_jax import metrics as metrics_mod

    key = _validate.prng_key("key", key)
    _check_problem(problem)
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__,
                       "expected an fj.Algorithm (fj.fedlsa, fj.scafflsa, fj.qfedtd, ... or your own)")
    T = _validate.integer("num_rounds", num_rounds)
    n = _validate.integer("num_seeds", num_seeds)
    r = _validate.integer("record_every", record_every)
    if n >= 2**31:  # seed indices are uint32 fold_in data
        _validate.fail("num_seeds", num_seeds, "expected fewer than 2**31 seeds")
    if T >= 2**32 - 1:  # the round counter is uint32
        _validate.fail("num_rounds", num_rounds, "expected fewer than 2**32 - 1 rounds; split the run")
    if r > T:
        _validate.fail("record_every", record_every, f"expected an integer in [1, num_rounds={T}]")
    if T // r + 1 > MAX_RECORDS:
        _validate.fail("record_every", record_every, f"num_rounds / record_every = {T // r} recorded rounds is "
                       f"more than MAX_RECORDS = {MAX_RECORDS}; record less often")
    try:
        factor = float(divergence_threshold)
    except (TypeError, ValueError):
        factor = np.nan
    if not factor > 0:  # inf allowed: then only non-finite iterates count as diverged
        _validate.fail("divergence_threshold", divergence_threshold, "expected a real number > 0 (inf: no threshold)")
    if seed_batch_size is not None:
        _validate.integer("seed_batch_size", seed_batch_size)
    if chunk_rounds is not None:
        _validate.integer("chunk_rounds", chunk_rounds)
    if progress not in (None, True, False):
        _validate.fail("progress", progress, "expected True, False or None (on a terminal only)")
    if quantiles is not None and not isinstance(quantiles, bool):
        _validate.fail("quantiles", quantiles, "expected True, False or None (on when few rounds are recorded)")
    num_records = T // r + 1 + (T % r > 0)  # = len(recorded_rounds(T, r))
    if quantiles is None:
        quantiles = num_records <= QUANTILE_MAX_RECORDS
    d = problem.dim
    if theta0 is None:
        theta0_np = np.zeros(d)
    else:
        theta0_np = _validate.array("theta0", theta0, 1)
        if theta0_np.shape != (d,):
            _validate.fail("theta0", theta0, f"expected shape ({d},) to match the problem's dimension")
    algorithm.channel.quantizer.check_dim(d)
    _check_underflow(algorithm, problem.dtype)
    optim.check_run(algorithm, T, problem.dtype)
    resolved = metrics_mod.resolve(metrics)
    keep = _validate.integer("keep_seeds", keep_seeds, 0)
    if keep > n:
        _validate.fail("keep_seeds", keep_seeds, f"expected an integer in [0, num_seeds={n}]")
    if keep * num_records * (1 + len(resolved)) > KEEP_SEEDS_MAX_VALUES:
        _validate.fail("keep_seeds", keep_seeds, f"keep_seeds x recorded rounds ({num_records}) x (1 + metrics) "
                       f"must be <= {KEEP_SEEDS_MAX_VALUES}; record less often or keep fewer seeds")
    if on_record is not None and not callable(on_record):
        _validate.fail("on_record", on_record, "expected a function fn(record) or None")
    if checkpoint_dir is not None:
        _paths.folder("checkpoint_dir", checkpoint_dir)
    if checkpoint_dir is not None and jax.process_count() > 1:
        _validate.fail("checkpoint_dir", checkpoint_dir, "checkpoints are written by single-process runs only")
    _check_algorithm(problem, algorithm, theta0_np, resolved)
    if checkpoint_dir is not None:  # created and probed now, not after the first chunk
        _io.prepare_dir(checkpoint_dir, "checkpoint_dir")
    return Run(key, T, n, r, theta0_np, factor, seed_batch_size, chunk_rounds, checkpoint_dir, progress, quantiles,
               resolved, keep, on_record, run_code(problem, algorithm, resolved))


def _execute(run: Run, problem, algorithms) -> list[SimulationResult]:
    """Run algorithms of one structure (stacked along a config axis) on validated inputs."""
    with contextlib.ExitStack() as stack:  # holds the checkpoint's lock while the run uses it
        return _execute_in(stack, run, problem, algorithms)


def _execute_in(stack: contextlib.ExitStack, run: Run, problem, algorithms) -> list[SimulationResult]:
    key, T, n, r, theta0_np, factor = run[:6]
    seed_batch_size, chunk_rounds, checkpoint_dir, progress, quantiles = run[6:11]
    rec = Recording(run.metrics, quantiles, run.keep_seeds)
    metric_names = [name for name, _ in run.metrics]
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
    if run.keep_seeds > plan.batch:
        _validate.fail("keep_seeds", run.keep_seeds, f"expected at most the seed batch size ({plan.batch}); "
                       "pass a larger seed_batch_size")

    codes = [run_code(problem, a, run.metrics) for a in algorithms]
    ckpt_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
    configuration = None if ckpt_dir is None else _checkpoint.fingerprint(  # hashes every leaf: only when needed
        problem, stacked, jax.random.key_data(key), theta0_np,
        problem_structure=problem.describe(), algorithm_structure=[a.describe() for a in algorithms],
        num_rounds=T, num_seeds=n, record_every=r, threshold=factor, batch=plan.batch,
        padded=plan.padded, devices=num_devices, dtype=str(np.dtype(dtype)),
        statistics=Moments._fields, quantiles=quantiles, version=__version__,  # other statistics: refused
        metrics=metric_names, keep_seeds=run.keep_seeds,
    )
    # the checkpoint's name: the configuration and the code that runs it
    finger = None if ckpt_dir is None else _checkpoint.fingerprint(configuration=configuration, code=codes)
    saved = None
    if ckpt_dir is not None:  # this configuration's own file (others share the folder untouched), locked
        stack.enter_context(_checkpoint.lock(ckpt_dir, finger))
        saved = _checkpoint.load(ckpt_dir, finger)
        if saved is None:
            _checkpoint.notice_other_code(ckpt_dir, finger, configuration)
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

    all_rounds = recorded_rounds(T, r)

    def report(b, rows, current):
        """Call on_record with the rows just recorded, merged with the finished batches."""
        seeds = min(n, (b + 1) * plan.batch)
        for i, algorithm in enumerate(algorithms):
            mine = Moments(*(getattr(current, f)[i, rows] for f in Moments._fields))
            if done is not None:
                mine = merge([Moments(*(getattr(done, f)[i, rows] for f in Moments._fields)), mine])
            stats = finalize(merge([mine]), seeds)
            run.on_record(Record(
                algorithm=algorithm.name, config_index=i, batch=b, num_batches=plan.num_batches, num_seeds=seeds,
                rounds=all_rounds[rows], mse_mean=stats["val_mean"][:, 0], mse_sem=stats["val_sem"][:, 0],
                num_diverged=stats["num_diverged"],
                metrics={m: (stats["val_mean"][:, j + 1], stats["val_sem"][:, j + 1])
                         for j, m in enumerate(metric_names)},
                counts=dict(zip(COUNT_NAMES, stats["counts"].T)),
            ))

    for b in range(first_batch, plan.num_batches):
        ids = np.arange(b * plan.batch, b * plan.batch + plan.padded, dtype=np.uint32)
        seed_ids = _global_array(ids, seeds_sharding)
        valid = _global_array((ids < min(n, (b + 1) * plan.batch)), seeds_sharding)
        carry, m0 = _start(key_data, seed_ids, valid, problem_r, algorithms_r, theta0_r, threshold, rec=rec,
                           num_configs=K)
        recorded = [jax.tree.map(lambda x: np.asarray(x)[:, None], m0)]
        if saved is not None and b == first_batch and "carry0" in saved:
            _checkpoint.require(saved, [f"cur_{f}" for f in Moments._fields]
                                + [f"carry{i}" for i in range(len(jax.tree.leaves(carry)))], ckpt_dir, finger)
            carry = _checkpoint.arrays_to_tree("carry", saved, carry)
            recorded = [Moments(*(saved[f"cur_{f}"] for f in Moments._fields))]
            resumed_from = {"seed_batch": b, "round": int(carry.t[0])}
        elif run.on_record is not None:
            report(b, slice(0, 1), concat(recorded))
        t = int(carry.t[0])
        seed_rounds_run += (min(n, (b + 1) * plan.batch) - b * plan.batch) * (T - t)
        bar.update(b * T + t - bar.n)
        while t < T:
            end = min(t + plan.chunk_rounds, T)
            carry, buf, filled = _advance(
                key_data, seed_ids, valid, carry, problem_r, algorithms_r, threshold, jnp.uint32(end),
                record_every=r, max_blocks=plan.max_blocks, rec=rec,
            )
            k = int(np.asarray(filled)[0])
            recorded.append(jax.tree.map(lambda x: np.asarray(x)[:, :k], buf))
            bar.update(end - t)
            t = end
            current = concat(recorded)
            if ckpt_dir is not None:
                _save(ckpt_dir, (finger, configuration), b, done, finals, current, carry if t < T else None)
            if run.on_record is not None:
                rows_so_far = current.n_ok.shape[1]
                report(b, slice(rows_so_far - k, rows_so_far), current)
        done = concat(recorded) if done is None else merge([done, concat(recorded)])
        theta = _to_host(carry.states.theta)
        finals.append(theta[:, : min(n, (b + 1) * plan.batch) - b * plan.batch])
        if ckpt_dir is not None:
            _save(ckpt_dir, (finger, configuration), b + 1, done, finals, None, None)
    bar.close()

    results = []
    for i, algorithm in enumerate(algorithms):
        stats = finalize(merge([Moments(*(getattr(done, f)[i] for f in Moments._fields))]), n)
        counts = dict(zip(COUNT_NAMES, stats["counts"].T))
        kept = stats["kept"]  # (R, K, V)
        q = stats["val_quantiles"]  # (R, V, 5)
        result = SimulationResult(
            rounds=all_rounds,
            mse_mean=stats["val_mean"][:, 0],
            mse_sem=stats["val_sem"][:, 0],
            theta_mean=stats["theta_mean"],
            theta_sem=stats["theta_sem"],
            num_diverged=stats["num_diverged"],
            mse_quantiles=q[:, 0],
            final_theta=np.concatenate([f[i] for f in finals]).astype(dtype),
            theta_star=theta_star.astype(dtype),
            config=run_config(key, problem, algorithm, T, n, r, theta0_np, factor, plan, num_devices, quantiles,
                              metric_names, run.keep_seeds, codes[i]),
            seed_mse=kept[:, :, 0],
            metrics={m: MetricStats(stats["val_mean"][:, j + 1], stats["val_sem"][:, j + 1], q[:, j + 1],
                                    kept[:, :, j + 1]) for j, m in enumerate(metric_names)},
            **counts,
        )
        # how this call ran: resumed from a checkpoint (batch, round) or None, and the seed-rounds it computed
        result.config["execution"].update(resumed_from=resumed_from, seed_rounds_run=seed_rounds_run)
        worst = int(result.num_diverged.max())
        if worst:
            warnings.warn(
                f"{algorithm.name} ({algorithm.describe()}): up to {worst} of {n} seeds diverged (first at round "
                f"{int(result.rounds[np.argmax(result.num_diverged > 0)])}); they are counted in "
                "result.num_diverged and left out of mse_mean, mse_sem, theta_mean and the metrics. "
                "A smaller step_size usually fixes this.",
                RuntimeWarning,
                stacklevel=3,
            )
        results.append(result)
    return results


def _save(directory, fingers, batch, done, finals, current, carry) -> None:
    finger, configuration = fingers
    arrays: dict[str, np.ndarray] = {"fingerprint": np.array(finger), "configuration": np.array(configuration),
                                     "batch": np.array(batch)}
    if done is not None:
        arrays.update({f"done_{f}": np.asarray(getattr(done, f)) for f in Moments._fields})
    for b, th in enumerate(finals):
        arrays[f"final{b}"] = th
    if carry is not None:
        arrays.update({f"cur_{f}": np.asarray(getattr(current, f)) for f in Moments._fields})
        arrays.update(_checkpoint.tree_to_arrays("carry", carry))
    _checkpoint.save(directory, finger, arrays)


def run_config(key, problem, algorithm, T, n, r, theta0, factor, plan, num_devices, quantiles, metrics=(),
               keep_seeds=0, code="") -> dict[str, Any]:
    import jaxlib

    return {
        "problem": problem.describe(),
        "algorithm": algorithm.describe(),
        "num_rounds": T,
        "num_seeds": n,
        "record_every": r,
        "quantiles": quantiles,
        "metrics": list(metrics),
        "keep_seeds": keep_seeds,
        "code": code,  # run_code: a digest of the algorithm's, problem's and metrics' code
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


make_callable(__name__, simulate)  # fj.simulate(...) calls simulate; `import fedsa_jax.simulate` is this module
