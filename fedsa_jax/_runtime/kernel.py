"""The compiled Monte Carlo kernels: one program for all seeds, rounds, agents and local steps.

Layout (innermost first): local steps are a ``lax.scan`` inside each agent;
agents are vmapped inside ``algorithm.step``; seeds are vmapped here and their
axis is sharded over every device (``jax.sharding.Mesh`` + ``NamedSharding``,
one mesh axis ``"seeds"``; multi-host after ``jax.distributed.initialize``);
rounds are a ``lax.while_loop`` whose bounds are traced values, so one compiled
program serves every number of rounds and every chunk. At each recorded round a
batch is reduced to mergeable moments (:mod:`fedsa_jax.stats`).

Randomness: seed ``i`` uses ``k_i = fold_in(key, i)``; ``(k_init, k_rounds) =
split(k_i)``; round ``t`` draws all agents' random numbers in one block from
``fold_in(k_rounds, t)``. Seed i's trajectory therefore depends only on
``(key, i)``, and two algorithms run with the same key see the same observations
(common random numbers).

Round t+1's block is drawn during round t and carried in the loop. As a loop
carry it is materialised once; drawn inside the round, XLA:CPU fuses (recomputes)
the elementwise threefry hash into each of the ~20 gathers that consume it
(measured: kernel CPU time 1.5 s -> 0.6 s). Memory: one extra block per seed.

The host side (seed batches, round chunks, checkpoints) is :mod:`fedsa_jax._runtime.driver`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax.algorithms._base import COUNT_FIELDS
from fedsa_jax.problems.protocol import unrolled
from fedsa_jax.stats import Moments, add_counts, seed_moments

__all__ = ["Carry", "KernelInputs", "Reduction", "SeedBatch", "per_seed_keys", "seed_keys"]

_num_traces = 0  # incremented each time a kernel is traced (tests check no retrace)


class Carry(NamedTuple):
    states: Any  # the algorithm's per-seed states, leading axis = seeds
    counters: jax.Array  # (B, C, 2) uint32: each seed's RoundInfo counts summed so far (64-bit: low, high)
    info: Any  # (B,) the last round's RoundInfo (zeros before the first round), for metrics
    rand: Any  # the next round's random numbers, drawn one round ahead
    t: jax.Array  # () uint32, rounds done


class KernelInputs(NamedTuple):
    """The kernels' inputs shared by every seed batch (replicated on every device)."""

    key_data: jax.Array  # (2,) uint32: the run's threefry key
    problem: Any
    algorithms: Any  # stacked along a leading config axis
    theta0: jax.Array  # (d,) in the problem's dtype
    threshold: jax.Array  # () squared error above which a seed counts as diverged


class SeedBatch(NamedTuple):
    """One batch of seeds (sharded over the devices along the seed axis)."""

    seed_ids: jax.Array  # (padded,) uint32: the seeds' indices
    valid: jax.Array  # (padded,) bool: False for the padding past the last seed


class Reduction(NamedTuple):
    """How the kernel reduces the seeds at each recorded round, how far it unrolls the local-step
    scans and in how many slices a round runs its seeds (static: part of the compiled program)."""

    metrics: tuple = ()  # ((name, fn(state, problem, info) -> scalar), ...) for one seed
    quantiles: bool = True
    keep: int = 0  # per-seed values of the first `keep` seeds
    unroll: int | None = None  # local steps per scan iteration (None: the backend's LOCAL_UNROLL)
    seed_slices: int = 1  # a round runs its seeds in this many interleaved slices, one after the other
    fused: bool | None = None  # fused local-step kernels (None: the backend's FUSED_LOCAL_STEPS)


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


def _values(carry: Carry, problem, rec: Reduction):
    """Each seed's values ``(B, V)``: the squared error ``|theta - theta_star|^2`` and the metrics."""
    theta = carry.states.theta
    diff = theta - problem.theta_star
    error = getattr(carry.states, "error", None)  # theta - theta_star, accurate, where the state carries it
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
    return jnp.stack(columns, axis=1)


def _moments(carry: Carry, problem, threshold, valid, rec: Reduction) -> Moments:
    return seed_moments(
        carry.states.theta,
        problem.theta_star,
        threshold,
        valid,
        _values(carry, problem, rec),
        counters=carry.counters,
        quantiles=rec.quantiles,
        keep=rec.keep,
    )


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


def _start_one(algorithm, theta0, threshold, *, inputs: KernelInputs, seeds: SeedBatch, rec: Reduction):
    carry = _initial_carry(inputs.key_data, seeds.seed_ids, inputs.problem, algorithm, theta0)
    return carry, _moments(carry, inputs.problem, threshold, seeds.valid, rec)


def by_slices(fn, num_slices: int, *args):
    """``fn(*args)`` for a function vmapped over the leading (seed) axis of every leaf of ``args``,
    run on ``num_slices`` interleaved slices of that axis one after the other (a ``lax.map``):
    slice i holds the seeds ``i, i + num_slices, ...``. Each seed's values are those of one call;
    a slice's working set stays in the CPU's cache through a round's local steps (a round of one
    call streams every seed's state and random numbers through memory at each local step). Under
    sharding the seed axis stays split over the devices: each slice takes its seeds from every
    device's block (the axis length must be a multiple of ``num_slices`` times the device count)."""
    if num_slices == 1:
        return fn(*args)

    def split(x):
        return jnp.swapaxes(x.reshape((x.shape[0] // num_slices, num_slices) + x.shape[1:]), 0, 1)

    def merge(x):
        return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])

    out = jax.lax.map(lambda a: fn(*a), jax.tree.map(split, args))
    return jax.tree.map(merge, out)


def _round(algorithm, problem, round_keys, seed_slices: int, c: Carry) -> Carry:
    """One communication round of every seed (in ``seed_slices`` slices, :func:`by_slices`); the
    next round's random numbers drawn ahead."""
    rand_next = _draw(algorithm, problem, round_keys, c.t + 1)
    step = jax.vmap(algorithm.step_from, in_axes=(0, 0, None))
    states, info = by_slices(lambda r, s: step(r, s, problem), seed_slices, c.rand, c.states)
    counts = jnp.stack([getattr(info, f) for f in COUNT_FIELDS], axis=-1)
    return Carry(states, add_counts(c.counters, counts), info, rand_next, c.t + 1)


def _recording_loop(carry, one_round, stats, rounds_done, *, end_round, record_every, max_blocks):
    """Run ``one_round`` until ``end_round``, recording ``stats(carry)`` after every multiple of
    ``record_every`` and at ``end_round``: ``(carry, (max_blocks, ...) buffer, entries filled)``."""

    def block(loop):
        c, i, buf = loop
        stop = jnp.minimum((rounds_done(c) // record_every + 1) * record_every, end_round)
        c = jax.lax.while_loop(lambda c: rounds_done(c) < stop, one_round, c)
        buf = jax.tree.map(lambda b, s: b.at[i].set(s), buf, stats(c))
        return c, i + 1, buf

    like = jax.eval_shape(stats, carry)
    buf = jax.tree.map(lambda s: jnp.zeros((max_blocks,) + s.shape, s.dtype), like)
    loop = (carry, jnp.int32(0), buf)
    carry, filled, buf = jax.lax.while_loop(lambda l: rounds_done(l[0]) < end_round, block, loop)
    return carry, buf, filled


def _advance_one(
    carry: Carry,
    algorithm,
    *,
    inputs: KernelInputs,
    seeds: SeedBatch,
    end_round,
    record_every,
    max_blocks,
    rec: Reduction,
):
    """Run rounds ``carry.t .. end_round``, recording moments after every multiple of
    ``record_every`` and at ``end_round``. Returns the carry, a ``(max_blocks, ...)``
    buffer of moments and how many entries are filled."""
    problem, threshold, valid = inputs.problem, inputs.threshold, seeds.valid
    key = jax.random.wrap_key_data(inputs.key_data, impl="threefry2x32")
    _, round_keys = per_seed_keys(key, seeds.seed_ids)
    return _recording_loop(
        carry,
        functools.partial(_round, algorithm, problem, round_keys, rec.seed_slices),
        lambda c: _moments(c, problem, threshold, valid, rec),
        lambda c: c.t,
        end_round=end_round,
        record_every=record_every,
        max_blocks=max_blocks,
    )


def _traced(kernel):
    """A kernel's tracing: counted (``_num_traces``) and with its ``rec.unroll`` in force."""

    @functools.wraps(kernel)
    def trace(*args, rec: Reduction, **kwargs):
        global _num_traces
        _num_traces += 1
        with unrolled(rec.unroll, rec.fused):
            return kernel(*args, rec=rec, **kwargs)

    return trace


# Both kernels take algorithms stacked along a leading "config" axis (size 1 for
# simulate; the continuous hyperparameters of a sweep group otherwise) and vmap
# over it: a sweep over step sizes or success probabilities is one compile.


@functools.partial(jax.jit, static_argnames=("rec", "num_configs"))
@_traced
def _start(inputs: KernelInputs, seeds: SeedBatch, *, rec: Reduction, num_configs: int):
    """Every config's initial carry and round-0 moments."""
    one = functools.partial(_start_one, inputs=inputs, seeds=seeds, rec=rec)
    # axis_size: a config without array leaves (all fields static) has nothing to map over
    return jax.vmap(one, in_axes=(0, None, None), axis_size=num_configs)(
        inputs.algorithms, inputs.theta0, inputs.threshold
    )


@functools.partial(jax.jit, static_argnames=("record_every", "max_blocks", "rec"))
@_traced
def _advance(
    inputs: KernelInputs,
    seeds: SeedBatch,
    carry: Carry,
    end_round,
    *,
    record_every: int,
    max_blocks: int,
    rec: Reduction,
):
    """Every config's rounds ``carry.t .. end_round``: ``(carry, moments buffer, filled)``."""
    one = functools.partial(
        _advance_one,
        inputs=inputs,
        seeds=seeds,
        end_round=end_round,
        record_every=record_every,
        max_blocks=max_blocks,
        rec=rec,
    )
    return jax.vmap(one)(carry, inputs.algorithms)


# Joint runs (fj.compare): algorithms of any structures, one carry each, advanced round by round in
# one loop, so that each round's per-seed values of every algorithm are at hand together and the
# paired differences are reduced to moments in the kernel, like the algorithms' own values.


def _joint_moments(carries, pairs, *, problem, threshold, valid, rec: Reduction) -> Moments:
    """The moments of every algorithm, then of every pair ``(i, j)``'s per-seed differences
    (values ``v_i - v_j``, theta ``theta_i - theta_j``), stacked along a leading config axis.

    A pair's seed counts as diverged where either algorithm's seed did (its differences are NaN
    there, so :func:`fedsa_jax.stats.seed_moments` leaves it out and counts it): the paired
    statistics are over the seeds both algorithms kept."""
    values = [_values(c, problem, rec) for c in carries]
    parts = [
        seed_moments(
            c.states.theta,
            problem.theta_star,
            threshold,
            valid,
            v,
            counters=c.counters,
            quantiles=rec.quantiles,
            keep=rec.keep,
        )
        for c, v in zip(carries, values)
    ]
    ok = [jnp.isfinite(v[:, 0]) & (v[:, 0] <= threshold) for v in values]
    for i, j in pairs:
        both = (ok[i] & ok[j])[:, None]
        parts.append(
            seed_moments(
                carries[i].states.theta - carries[j].states.theta,
                problem.theta_star,
                jnp.inf,
                valid,
                jnp.where(both, values[i] - values[j], jnp.nan),
                counters=jnp.zeros_like(carries[i].counters),
                quantiles=rec.quantiles,
                keep=rec.keep,
            )
        )
    return jax.tree.map(lambda *xs: jnp.stack(xs), *parts)


@functools.partial(jax.jit, static_argnames=("rec", "pairs"))
@_traced
def _start_joint(inputs: KernelInputs, seeds: SeedBatch, *, rec: Reduction, pairs: tuple):
    """Every algorithm's initial carry (a tuple) and the round-0 moments of the algorithms and pairs."""
    carries = tuple(
        _initial_carry(inputs.key_data, seeds.seed_ids, inputs.problem, a, inputs.theta0)
        for a in inputs.algorithms
    )
    moments = _joint_moments(
        carries,
        pairs,
        problem=inputs.problem,
        threshold=inputs.threshold,
        valid=seeds.valid,
        rec=rec,
    )
    return carries, moments


@functools.partial(jax.jit, static_argnames=("record_every", "max_blocks", "rec", "pairs"))
@_traced
def _advance_joint(
    inputs: KernelInputs,
    seeds: SeedBatch,
    carries,
    end_round,
    *,
    record_every: int,
    max_blocks: int,
    rec: Reduction,
    pairs: tuple,
):
    """Every algorithm's rounds ``t .. end_round`` together: ``(carries, moments buffer, filled)`` with
    the buffer's config axis first and ``filled`` of shape ``(1,)``, as :func:`_advance` returns them."""
    problem = inputs.problem
    key = jax.random.wrap_key_data(inputs.key_data, impl="threefry2x32")
    _, round_keys = per_seed_keys(key, seeds.seed_ids)

    def one_round(cs):
        return tuple(
            _round(a, problem, round_keys, rec.seed_slices, c) for a, c in zip(inputs.algorithms, cs)
        )

    def stats(cs):
        return _joint_moments(
            cs,
            pairs,
            problem=problem,
            threshold=inputs.threshold,
            valid=seeds.valid,
            rec=rec,
        )

    carries, buf, filled = _recording_loop(
        carries,
        one_round,
        stats,
        lambda cs: cs[0].t,
        end_round=end_round,
        record_every=record_every,
        max_blocks=max_blocks,
    )
    return carries, jax.tree.map(lambda b: jnp.moveaxis(b, 0, 1), buf), filled[None]
