"""The host side of a Monte Carlo run: plan, seed batches and round chunks, checkpoints, results.

:func:`simulate` validates its options (:mod:`fedsa_jax._runtime.run`), then :func:`execute` runs the
compiled kernels of :mod:`fedsa_jax._runtime.kernel`:

- planning (:func:`fedsa_jax._runtime.plan.make_plan`): seeds per batch (what fits in memory) and
  rounds per chunk;
- the batch and chunk loop (:func:`_run_batches`): seed batches one after the other, each advanced
  by chunks of rounds, a progress bar per chunk; at each recorded round a batch is reduced to
  mergeable moments (:mod:`fedsa_jax.stats`) that the host combines, so neither chunking, batching
  nor the number of devices changes any seed's trajectory;
- the checkpoint session (:class:`fedsa_jax._runtime.session.CheckpointSession`): the
  configuration's file, locked for the run, loaded once, replaced atomically after each chunk;
- ``on_record`` reporting (:func:`_report`) and result assembly (:func:`_results`).

Memory: per-seed states ``O(seeds x agents x d)`` plus one round of random numbers, independent
of ``num_rounds``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm  # plain text bar: no widget dependency in notebooks

from fedsa_jax import _validate
from fedsa_jax._runtime import kernel as _kernel
from fedsa_jax._runtime.growth import mse_growth, settings
from fedsa_jax._runtime.kernel import KernelInputs, Reduction, SeedBatch
from fedsa_jax._runtime.options import (
    Execution,
    Record,
    Recording,
    Until,
    grouped,
)
from fedsa_jax._runtime.plan import Plan, make_plan
from fedsa_jax._runtime.run import Run, run_code, validate_run
from fedsa_jax._runtime.session import CheckpointSession, Tally
from fedsa_jax._version import __version__
from fedsa_jax.algorithms._base import Algorithm
from fedsa_jax.channel import accounting
from fedsa_jax.problems.protocol import fused_local_steps
from fedsa_jax.result import MetricStats, SimulationResult, count_arrays, recorded_rounds
from fedsa_jax.stats import Moments, finalize, merge

__all__ = [
    "execute",
    "execute_joint",
    "simulate",
    "simulation_run",
]


def simulate(
    key,
    problem,
    algorithm: Algorithm,
    num_rounds: int,
    num_seeds: int | Until,
    theta0=None,
    record_every: int = 1,
    divergence_threshold: float = 1e10,
    *,
    metrics=None,
    keep_seeds: int = 0,
    on_record: Callable[[Record], Any] | None = None,
    seed_batch_size: int | None = None,
    chunk_rounds: int | None = None,
    checkpoint_dir=None,
    progress: bool | None = None,
    quantiles: bool | None = None,
    recording: Recording | None = None,
    execution: Execution | None = None,
) -> SimulationResult:
    """Run ``num_seeds`` independent copies of ``algorithm`` on ``problem``.

    Args:
      key: JAX threefry PRNG key (or an int seed). ``rbg`` keys are refused.
      problem: a problem from :mod:`fedsa_jax.problems`, or any object following
        the protocol :class:`fedsa_jax.problems.Problem`.
      algorithm: e.g. ``fj.fedlsa(0.1, 10)``, ``fj.scafflsa(0.1, 10)``,
        ``fj.qfedtd(0.6, q, 0.6)``, or your own :class:`~fedsa_jax.Algorithm`.
      num_rounds: communication rounds T >= 1.
      num_seeds: independent runs >= 1, or a precision target ``fj.until(rel_sem=..., max_seeds=...)``
        (:func:`fedsa_jax.until`): seed batches until the MSE's relative standard error meets it.
      theta0: ``(d,)`` initial iterate (default 0).
      divergence_threshold: a seed counts as diverged at a recorded round if its
        iterate is non-finite or ``|theta - theta_star|^2`` exceeds this times
        ``1 + |theta_star|^2 + |theta0 - theta_star|^2``.
      record_every, metrics, quantiles, keep_seeds, on_record: what to record
        (every this many rounds; user metrics ``{"name": fn}``; quantiles over
        seeds; the first K seeds' curves; a function called after each chunk with
        a :class:`~fedsa_jax.Record`): see :class:`~fedsa_jax.Recording`.
      seed_batch_size, chunk_rounds, checkpoint_dir, progress: how to execute
        (seeds run together; rounds per kernel call; a folder of resumable
        checkpoints; a progress bar): see :class:`~fedsa_jax.Execution`. Results
        do not depend on them.
      recording, execution: the same options grouped, ``fj.Recording(...)`` and
        ``fj.Execution(...)`` (shared with :func:`fedsa_jax.sweep`); with a group,
        leave that group's flat keywords at their defaults (both together are
        refused). ``fj.Execution(memory_budget=...)`` is only there.

    Returns:
      :class:`~fedsa_jax.result.SimulationResult`. A ``RuntimeWarning`` says when seeds diverged,
      and when the MSE grew by orders of magnitude without any seed diverging (:func:`mse_growth`:
      the last recorded MSE over 100 times the first and 10 times the midpoint's) or settled far
      above its start with no seed diverged (5 times the larger of the first and ``|theta_star|^2``).

    Before anything compiles, one seed's ``init`` and one round are traced
    abstractly: a state without ``theta (d,)``, a step that does not return
    ``(state, RoundInfo)`` with the same state structure, a problem lacking part
    of the protocol or a metric that is not a real scalar raise a ``ValueError``
    naming the algorithm, the problem or the metric.

    The kernel is compiled once per (problem structure, algorithm structure,
    metrics, batch size, record_every, chunk size, dtype): the number of rounds
    and continuous hyperparameters such as the step size are traced values.
    """
    run = simulation_run(**locals())  # every argument, checked
    return execute(run, problem, [algorithm])[0]


def simulation_run(
    key,
    problem,
    algorithm,
    num_rounds,
    num_seeds,
    theta0,
    record_every,
    divergence_threshold,
    *,
    recording,
    execution,
    **flat,
) -> Run:
    """:func:`simulate`'s arguments (``flat``: its flat recording and execution keywords) validated."""
    recording, execution = grouped(recording, execution, **flat, record_every=record_every)
    return validate_run(
        key,
        problem,
        algorithm,
        num_rounds,
        num_seeds,
        theta0=theta0,
        divergence_threshold=divergence_threshold,
        recording=recording,
        execution=execution,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Setup:
    """A validated run of algorithms of one structure, placed on the devices and planned."""

    run: Run
    problem: Any
    algorithms: list[Algorithm]
    stacked: Any  # the algorithms' leaves stacked along a leading config axis (host arrays)
    inputs: KernelInputs  # replicated on every device
    reduction: Reduction
    plan: Plan
    seeds_sharding: NamedSharding
    num_devices: int
    codes: list[str]  # run_code of each algorithm
    rounds: np.ndarray  # the recorded rounds
    pairs: tuple = ()  # joint runs: the pairs (i, j) whose per-seed differences are recorded
    joint: bool = False  # algorithms of any structures, one carry each (fj.compare), not stacked
    until_report: dict | None = None  # a precision-targeted run that stopped: why (config["until"])

    @property
    def num_configs(self) -> int:
        """Rows of the recorded moments: the algorithms, then the pairs."""
        return len(self.algorithms) + len(self.pairs)


def _setup(run: Run, problem, algorithms: list[Algorithm], pairs: tuple | None = None) -> _Setup:
    dtype = problem.dtype
    if pairs is None:
        stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *algorithms)
    else:
        stacked = tuple(jax.tree.map(np.asarray, a) for a in algorithms)
    theta_star = np.asarray(problem.theta_star, np.float64)
    scale = 1.0 + theta_star @ theta_star + np.sum((run.theta0 - theta_star) ** 2)
    devices = np.asarray(jax.devices())
    mesh = jax.sharding.Mesh(devices, ("seeds",))
    put = functools.partial(jax.device_put, device=NamedSharding(mesh, P()))
    inputs = KernelInputs(
        key_data=put(np.asarray(jax.random.key_data(run.key))),
        problem=put(jax.tree.map(np.asarray, problem)),
        algorithms=put(stacked),
        theta0=put(run.theta0.astype(dtype)),
        threshold=put(np.asarray(min(run.divergence_threshold * scale, float(jnp.finfo(dtype).max)), dtype)),
    )
    plan = make_plan(
        problem,
        algorithms if pairs is not None else algorithms[:1],
        run,
        num_configs=len(algorithms),
        num_devices=devices.size,
    )
    if run.keep_seeds > plan.batch_size:
        _validate.fail(
            "keep_seeds",
            run.keep_seeds,
            f"expected at most the seed batch size ({plan.batch_size}); pass a larger seed_batch_size",
        )
    reduction = Reduction(
        run.metrics,
        run.quantiles,
        run.keep_seeds,
        run.execution.local_unroll,
        plan.seed_slices,
        run.execution.fused_local_steps,
    )
    codes = [run_code(problem, a, run.metrics) for a in algorithms]
    return _Setup(
        run=run,
        problem=problem,
        algorithms=algorithms,
        stacked=stacked,
        inputs=inputs,
        reduction=reduction,
        plan=plan,
        seeds_sharding=NamedSharding(mesh, P("seeds")),
        num_devices=devices.size,
        codes=codes,
        rounds=recorded_rounds(run.num_rounds, run.record_every),
        pairs=() if pairs is None else tuple(pairs),
        joint=pairs is not None,
    )


def execute(run: Run, problem, algorithms: list[Algorithm]) -> list[SimulationResult]:
    """Run algorithms of one structure (stacked along a config axis) on validated inputs."""
    setup = _setup(run, problem, algorithms)
    tally = _tally(setup)
    if run.until is not None:
        setup = _stopped(setup, tally)
    return _results(setup, tally)


def execute_joint(
    run: Run, problem, algorithms: list[Algorithm], pairs: tuple
) -> tuple[list[SimulationResult], list[dict[str, np.ndarray]]]:
    """Run algorithms of any structures together (:func:`fedsa_jax.compare`): each algorithm's result,
    and for each pair ``(i, j)`` the finalized statistics (:func:`fedsa_jax.stats.finalize`) of the
    per-seed differences of algorithm i's values (squared error, metrics) minus algorithm j's."""
    setup = _setup(run, problem, algorithms, pairs)
    tally = _tally(setup)
    n = len(algorithms)
    differences = [
        finalize(merge([_config_moments(tally.done, n + p)]), run.num_seeds)  # pyright: ignore[reportArgumentType]
        for p in range(len(pairs))
    ]
    return _results(setup, tally), differences


def _tally(setup: _Setup) -> Tally:
    with contextlib.ExitStack() as stack:  # holds the checkpoint's lock while the run uses it
        session = CheckpointSession.open(stack, setup)
        return _run_batches(setup, session)


def _concat(parts: list[Moments]) -> Moments:
    """Recorded rounds of one batch, chunk after chunk (axis 1: rounds)."""
    return Moments(*(np.concatenate([getattr(m, f) for m in parts], axis=1) for f in Moments._fields))


def _run_batches(setup: _Setup, session: CheckpointSession | None) -> Tally:
    """Every seed batch not finished yet, one after the other."""
    plan, num_rounds = setup.plan, setup.run.num_rounds
    tally = Tally() if session is None else session.tally()
    label = setup.algorithms[0].name + (f" x{len(setup.algorithms)}" if len(setup.algorithms) > 1 else "")
    progress = setup.run.execution.progress
    total = num_rounds * plan.num_batches
    if progress == "lines":
        bar = _Lines(total, label)
    else:
        bar = tqdm(
            total=total,
            unit="round",
            desc=label,
            dynamic_ncols=True,
            disable=None if progress is None else not progress,
        )  # None: off unless a terminal
    for batch in range(tally.first_batch, plan.num_batches):
        if _target_met(setup, tally, batch):
            break
        _run_batch(setup, session, tally, batch, bar)
    bar.close()
    return tally


class _Lines:
    """Progress as one line per chunk on standard error (``progress="lines"``: a log or a pipe, where a
    bar's carriage returns would pile up): rounds done of all batches, rate and time left."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.n = total, label, 0
        self.start = time.perf_counter()

    def update(self, k: int) -> None:
        self.n += k
        if k <= 0 or self.n <= 0:
            return
        elapsed = time.perf_counter() - self.start
        rate = self.n / max(elapsed, 1e-9)
        left = (self.total - self.n) / rate
        print(
            f"{self.label}: {self.n}/{self.total} rounds ({100 * self.n / self.total:.0f} %), "
            f"{elapsed:.1f} s, {rate:.3g} rounds/s, about {left:.0f} s left",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        pass


def _target_met(setup: _Setup, tally: Tally, batch: int) -> bool:
    """Whether the precision target (``num_seeds=fj.until(...)``) is met once ``batch`` batches ran."""
    until = setup.run.until
    if until is None or batch == 0:
        return False
    seeds = setup.plan.seeds_done(batch - 1, setup.run.num_seeds)
    stats = finalize(merge([_config_moments(tally.done, 0)]), seeds)  # pyright: ignore[reportArgumentType]
    return seeds >= until.min_seeds and until.met(
        setup.rounds, stats["val_mean"][:, 0], stats["val_sem"][:, 0]
    )


def _stopped(setup: _Setup, tally: Tally) -> _Setup:
    """A precision-targeted run's setup as the fixed-count run of the seeds it ran would have it, and
    why it stopped (``config["until"]``)."""
    until, batches = setup.run.until, len(tally.finals)
    assert until is not None
    seeds = setup.plan.seeds_done(batches - 1, setup.run.num_seeds)
    met = _target_met(setup, tally, batches)
    reason = {
        "rel_sem": until.rel_sem,
        "max_seeds": until.max_seeds,
        "min_seeds": until.min_seeds,
        "rounds": None if until.rounds is None else list(until.rounds),
        "stopped": "target met" if met else "max_seeds",
    }
    run = dataclasses.replace(setup.run, num_seeds=seeds, until=None)
    return dataclasses.replace(
        setup, run=run, plan=setup.plan._replace(num_batches=batches), until_report=reason
    )


def _seed_batch(setup: _Setup, batch: int) -> SeedBatch:
    plan = setup.plan
    ids = np.arange(batch * plan.batch_size, batch * plan.batch_size + plan.padded_batch, dtype=np.uint32)
    valid = ids < plan.seeds_done(batch, setup.run.num_seeds)
    return SeedBatch(_global_array(ids, setup.seeds_sharding), _global_array(valid, setup.seeds_sharding))


def _run_batch(setup: _Setup, session: CheckpointSession | None, tally: Tally, batch: int, bar) -> None:
    """Seed batch ``batch`` from round 0 (or from its checkpoint) to the last round, chunk by chunk."""
    run, plan = setup.run, setup.plan
    seeds = _seed_batch(setup, batch)
    if setup.joint:
        carry, first = _kernel._start_joint(setup.inputs, seeds, rec=setup.reduction, pairs=setup.pairs)
    else:
        carry, first = _kernel._start(
            setup.inputs, seeds, rec=setup.reduction, num_configs=len(setup.algorithms)
        )
    recorded = [jax.tree.map(lambda x: np.asarray(x)[:, None], first)]  # per chunk, (num_configs, rows, ...)
    restored = None if session is None or batch != tally.first_batch else session.restore(carry)
    if restored is not None:
        carry, recorded = restored
        tally.resumed_from = {"seed_batch": batch, "round": _rounds_done(setup, carry)}
    elif run.on_record is not None:
        _report(setup, tally.done, batch, slice(0, 1), _concat(recorded))
    seeds_in_batch = plan.seeds_done(batch, run.num_seeds) - batch * plan.batch_size
    t = _rounds_done(setup, carry)
    tally.seed_rounds_run += seeds_in_batch * (run.num_rounds - t)
    bar.update(batch * run.num_rounds + t - bar.n)
    while t < run.num_rounds:
        end = min(t + plan.chunk_rounds, run.num_rounds)
        advance = (
            functools.partial(_kernel._advance_joint, pairs=setup.pairs) if setup.joint else _kernel._advance
        )
        carry, buffer, filled = advance(
            setup.inputs,
            seeds,
            carry,
            jnp.uint32(end),
            record_every=run.record_every,
            max_blocks=plan.max_blocks,
            rec=setup.reduction,
        )
        new_rows = int(np.asarray(filled)[0])
        recorded.append(jax.tree.map(lambda x, rows=new_rows: np.asarray(x)[:, :rows], buffer))
        bar.update(end - t)
        t = end
        current = _concat(recorded)
        if session is not None:
            session.save(batch, tally, current=current, carry=carry if t < run.num_rounds else None)
        if run.on_record is not None:
            rows_so_far = current.n_ok.shape[1]
            _report(setup, tally.done, batch, slice(rows_so_far - new_rows, rows_so_far), current)
    tally.done = _concat(recorded) if tally.done is None else merge([tally.done, _concat(recorded)])
    tally.finals.append(_final_thetas(setup, carry)[:, :seeds_in_batch])
    if session is not None:
        session.save(batch + 1, tally)


def _rounds_done(setup: _Setup, carry) -> int:
    """Rounds done by a batch's carry: a stacked :class:`Carry`, or a joint run's tuple of them."""
    return int(np.asarray(carry[0].t if setup.joint else carry.t[0]))


def _final_thetas(setup: _Setup, carry) -> np.ndarray:
    """``(algorithms, padded seeds, d)``: every algorithm's last iterates of a batch."""
    if setup.joint:
        return np.stack([_to_host(c.states.theta) for c in carry])
    return _to_host(carry.states.theta)


def _global_array(values: np.ndarray, sharding) -> jax.Array:
    return jax.make_array_from_callback(values.shape, sharding, lambda idx: values[idx])


def _to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils  # multi-host runs only

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def _config_moments(moments: Moments, index: int, rows=slice(None)) -> Moments:
    """One config's moments (of the recorded rows ``rows``) out of a group's."""
    return Moments(*(getattr(moments, f)[index, rows] for f in Moments._fields))


def _report(setup: _Setup, done: Moments | None, batch: int, rows: slice, current: Moments) -> None:
    """Call on_record with the rows just recorded, merged with the finished batches."""
    run, plan = setup.run, setup.plan
    seeds = plan.seeds_done(batch, run.num_seeds)
    metric_names = [name for name, _ in run.metrics]
    for i, algorithm in enumerate(setup.algorithms):
        mine = _config_moments(current, i, rows)
        if done is not None:
            mine = merge([_config_moments(done, i, rows), mine])
        stats = finalize(merge([mine]), seeds)
        run.on_record(
            Record(  # pyright: ignore[reportOptionalCall]
                algorithm=algorithm.name,
                config_index=i,
                batch=batch,
                num_batches=plan.num_batches,
                num_seeds=seeds,
                rounds=setup.rounds[rows],
                mse_mean=stats["val_mean"][:, 0],
                mse_sem=stats["val_sem"][:, 0],
                num_diverged=stats["num_diverged"],
                metrics={
                    m: (stats["val_mean"][:, j + 1], stats["val_sem"][:, j + 1])
                    for j, m in enumerate(metric_names)
                },
                counts=count_arrays(stats["counts"].T),
            )
        )


def _results(setup: _Setup, tally: Tally) -> list[SimulationResult]:
    """One result per algorithm, with a warning for each whose seeds diverged and for each whose
    MSE grew by orders of magnitude (:func:`mse_growth`)."""
    results = []
    for i, algorithm in enumerate(setup.algorithms):
        result = _result(setup, tally, i)
        worst = int(result.num_diverged.max())
        if worst:
            first_round = int(result.rounds[np.argmax(result.num_diverged > 0)])
            warnings.warn(
                f"{settings(algorithm)}: up to {worst} of {setup.run.num_seeds} seeds "
                f"diverged (first at round {first_round}); they are counted in "
                "result.num_diverged and left out of mse_mean, mse_sem, theta_mean and the metrics. "
                "A smaller step_size usually fixes this.",
                RuntimeWarning,
                stacklevel=4,  # the caller of execute: simulate, or the sweep
            )
        star = np.asarray(setup.problem.theta_star, np.float64)  # settled too high: said if no seed diverged
        growth = mse_growth(result.rounds, result.mse_mean, reference=None if worst else float(star @ star))
        if growth is not None:
            warnings.warn(growth.message(algorithm), RuntimeWarning, stacklevel=4)
        results.append(result)
    return results


# a final MSE this many times the larger of its start and |theta_star|^2 (the estimate 0's): settled too high


def _result(setup: _Setup, tally: Tally, index: int) -> SimulationResult:
    run, problem, dtype = setup.run, setup.problem, setup.problem.dtype
    metric_names = [name for name, _ in run.metrics]
    stats = finalize(merge([_config_moments(tally.done, index)]), run.num_seeds)  # pyright: ignore[reportArgumentType]
    kept = stats["kept"]  # (R, K, V)
    q = stats["val_quantiles"]  # (R, V, 5)
    config = run_config(
        run,
        problem,
        setup.algorithms[index],
        plan=setup.plan,
        num_devices=setup.num_devices,
        code=setup.codes[index],
    )
    # how this call ran: resumed from a checkpoint (batch, round) or None, and the seed-rounds it computed
    config["execution"].update(resumed_from=tally.resumed_from, seed_rounds_run=tally.seed_rounds_run)
    if setup.until_report is not None:
        config["until"] = setup.until_report
    counts = count_arrays(stats["counts"].T)
    spent = accounting.report(setup.algorithms[index], problem.num_agents, counts["communications"][-1])
    if spent is not None:  # the epsilon of the run's releases (fedsa_jax.channel.accounting)
        config["privacy"] = spent
    return SimulationResult(
        rounds=setup.rounds,
        mse_mean=stats["val_mean"][:, 0],
        mse_sem=stats["val_sem"][:, 0],
        theta_mean=stats["theta_mean"],
        theta_sem=stats["theta_sem"],
        num_diverged=stats["num_diverged"],
        mse_quantiles=q[:, 0],
        final_theta=np.concatenate([f[index] for f in tally.finals]).astype(dtype),
        theta_star=np.asarray(problem.theta_star, np.float64).astype(dtype),
        config=config,
        seed_mse=kept[:, :, 0],
        metrics={
            m: MetricStats(
                stats["val_mean"][:, j + 1], stats["val_sem"][:, j + 1], q[:, j + 1], kept[:, :, j + 1]
            )
            for j, m in enumerate(metric_names)
        },
        **counts,
    )


def run_config(
    run: Run, problem, algorithm: Algorithm, *, plan: Plan, num_devices: int, code: str
) -> dict[str, Any]:
    """The configuration a result file records: enough to rerun it, and how it ran."""
    import jaxlib  # only its version

    return {
        "problem": problem.describe(),
        "algorithm": algorithm.describe(),
        "num_rounds": run.num_rounds,
        "num_seeds": run.num_seeds,
        "record_every": run.record_every,
        "quantiles": run.quantiles,
        "metrics": [name for name, _ in run.metrics],
        "keep_seeds": run.keep_seeds,
        "code": code,  # run_code: a digest of the algorithm's, problem's and metrics' code
        "theta0": [float(x) for x in run.theta0],
        "divergence_threshold": run.divergence_threshold,
        "dtype": str(np.dtype(problem.dtype)),
        "bits_per_message": algorithm.bits_per_message(problem.dim),
        "execution": {
            "seed_batch_size": plan.batch_size,
            "num_batches": plan.num_batches,
            "chunk_rounds": plan.chunk_rounds,
            "padded_batch": plan.padded_batch,
            "seed_slices": plan.seed_slices,
            # the fused local-step kernels, for a problem that has them (fedsa_jax.problems.fused)
            "fused_local_steps": fused_local_steps(run.execution.fused_local_steps),
        },
        "prng": {
            "impl": str(jax.random.key_impl(run.key)),
            "key_data": np.asarray(jax.random.key_data(run.key)).tolist(),
            "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable),  # pyright: ignore[reportAttributeAccessIssue]
        },
        "versions": {"fedsa_jax": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__},
        "device_count": num_devices,
        "process_count": jax.process_count(),
        "platform": jax.default_backend(),
    }
