"""A run's options checked and resolved before anything compiles: :func:`validate_run` -> :class:`Run`.

Every bad value is a one-line ``ValueError`` naming the parameter; the algorithm and the metrics
are traced abstractly for one seed and one round (nothing runs), so a broken contract is named
before the first compile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _io, _paths, _validate, metrics as metrics_mod, optim
from fedsa_jax._digest import code_digest
from fedsa_jax._runtime.options import Execution, Recording, Until
from fedsa_jax.algorithms._base import Algorithm, RoundInfo, check_run
from fedsa_jax.channel import downlink
from fedsa_jax.problems import missing_members
from fedsa_jax.result import recorded_rounds

__all__ = ["Run", "run_code", "validate_run"]

MAX_RECORDS = 10**7  # recorded rounds at most (host statistics are O(records x d))
QUANTILE_MAX_RECORDS = 10_000  # quantiles on by default up to this many recorded rounds (4 kB each)
KEEP_SEEDS_MAX_VALUES = 2**24  # keep_seeds x recorded rounds x (1 + metrics), float64 on the host


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """A validated run of :func:`fedsa_jax.simulate` or one configuration of :func:`fedsa_jax.sweep`."""

    key: jax.Array
    num_rounds: int
    num_seeds: int
    theta0: np.ndarray  # (d,) float64
    divergence_threshold: float  # > 0, inf allowed
    record_every: int
    quantiles: bool  # the default resolved
    metrics: tuple  # ((name, fn), ...), resolved by fedsa_jax.metrics.resolve
    keep_seeds: int
    on_record: Callable | None
    execution: Execution
    code: str  # run_code(problem, algorithm, metrics)
    until: Until | None = None  # num_seeds=fj.until(...): num_seeds is then its max_seeds


def run_code(problem, algorithm: Algorithm, metrics) -> str:
    """A digest of the code that shapes a run (:mod:`fedsa_jax._digest`): the algorithm's functions
    and config (wrapped algorithms, schedules, optimizers included), the problem's class and static
    fields (its arrays by shape: their values are hashed with the leaves) and the metric functions."""
    return code_digest((code_digest(problem, arrays=False), algorithm, [fn for _, fn in metrics]), length=16)


def num_records(num_rounds: int, record_every: int) -> int:
    """``len(recorded_rounds(num_rounds, record_every))`` without building it."""
    return num_rounds // record_every + 1 + (num_rounds % record_every > 0)


def validate_run(
    key,
    problem,
    algorithm,
    num_rounds,
    num_seeds,
    *,
    theta0=None,
    divergence_threshold=1e10,
    recording: Recording = Recording(),
    execution: Execution = Execution(),
) -> Run:
    """Check every argument of a run before anything is compiled."""
    key = _validate.prng_key("key", key)
    _check_problem(problem)
    if not isinstance(algorithm, Algorithm):
        _validate.fail(
            "algorithm",
            type(algorithm).__name__,
            "expected an fj.Algorithm (fj.fedlsa, fj.scafflsa, fj.qfedtd, ... or your own)",
        )
    until = num_seeds if isinstance(num_seeds, Until) else None
    if until is not None:
        num_seeds = until.max_seeds
    num_rounds, num_seeds, record_every = _check_counts(num_rounds, num_seeds, recording.record_every)
    _check_until(until, num_rounds, record_every)
    threshold = _check_threshold(divergence_threshold)
    _check_execution(execution)
    quantiles = _check_quantiles(recording.quantiles, num_records(num_rounds, record_every))
    theta0 = _check_theta0(theta0, problem.dim)
    algorithm.channel.quantizer.check_dim(problem.dim)
    check_run(algorithm.config, problem.num_agents, num_rounds)
    downlink.check(algorithm.config, problem.dim)
    _check_underflow(algorithm, problem.dtype)
    optim.check_run(algorithm, num_rounds, problem.dtype)
    metrics = metrics_mod.resolve(recording.metrics)
    metrics_mod.check_run(recording.metrics, problem, num_rounds)
    keep_seeds = _check_keep_seeds(
        recording.keep_seeds, num_seeds, num_records(num_rounds, record_every), len(metrics)
    )
    if recording.on_record is not None and not callable(recording.on_record):
        _validate.fail("on_record", recording.on_record, "expected a function fn(record) or None")
    _check_checkpoint_dir(execution.checkpoint_dir)
    _check_algorithm(problem, algorithm, theta0, metrics)
    if execution.checkpoint_dir is not None:  # created and probed now, not after the first chunk
        _io.prepare_dir(execution.checkpoint_dir, "checkpoint_dir")
    return Run(
        key=key,
        num_rounds=num_rounds,
        num_seeds=num_seeds,
        theta0=theta0,
        divergence_threshold=threshold,
        record_every=record_every,
        quantiles=quantiles,
        metrics=metrics,
        keep_seeds=keep_seeds,
        on_record=recording.on_record,
        execution=execution,
        code=run_code(problem, algorithm, metrics),
        until=until,
    )


def _check_until(until: Until | None, num_rounds: int, record_every: int) -> None:
    """The rounds a precision target names must be recorded rounds."""
    if until is None or until.rounds is None:
        return
    recorded = set(recorded_rounds(num_rounds, record_every).tolist())
    missing = [r for r in until.rounds if r not in recorded]
    if missing:
        _validate.fail(
            "until.rounds",
            list(until.rounds),
            f"round {missing[0]} is not recorded (record_every={record_every}, num_rounds={num_rounds})",
        )


def _check_counts(num_rounds, num_seeds, record_every) -> tuple[int, int, int]:
    # at most 2**31 - 1 of each (integer's bound): the round counter and the seed indices are uint32
    rounds = _validate.integer("num_rounds", num_rounds)
    seeds = _validate.integer("num_seeds", num_seeds)
    every = _validate.integer("record_every", record_every)
    if every > rounds:
        _validate.fail("record_every", record_every, f"expected an integer in [1, num_rounds={rounds}]")
    if rounds // every + 1 > MAX_RECORDS:
        _validate.fail(
            "record_every",
            record_every,
            f"num_rounds / record_every = {rounds // every} "
            f"recorded rounds is more than MAX_RECORDS = {MAX_RECORDS}; record less often",
        )
    return rounds, seeds, every


def _check_threshold(divergence_threshold) -> float:
    try:
        threshold = float(divergence_threshold)
    except (TypeError, ValueError):
        threshold = np.nan
    if not threshold > 0:  # inf allowed: then only non-finite iterates count as diverged
        _validate.fail(
            "divergence_threshold", divergence_threshold, "expected a real number > 0 (inf: no threshold)"
        )
    return threshold


def _check_execution(execution: Execution) -> None:
    if execution.seed_batch_size is not None:
        _validate.integer("seed_batch_size", execution.seed_batch_size)
    if execution.chunk_rounds is not None:
        _validate.integer("chunk_rounds", execution.chunk_rounds)
    if execution.progress not in (None, True, False, "lines"):
        _validate.fail(
            "progress", execution.progress, "expected True, False, None (on a terminal only) or 'lines'"
        )
    _validate.integer("memory_budget", execution.memory_budget, maximum=2**63 - 1)  # bytes
    if execution.local_unroll is not None:
        _validate.integer("local_unroll", execution.local_unroll)
    if execution.cache_bytes is not None:
        _validate.integer("cache_bytes", execution.cache_bytes, minimum=0, maximum=2**63 - 1)
    if execution.fused_local_steps not in (None, True, False):
        _validate.fail(
            "fused_local_steps",
            execution.fused_local_steps,
            "expected True, False or None (the backend's default)",
        )


def _check_quantiles(quantiles, records: int) -> bool:
    if quantiles is not None and not isinstance(quantiles, bool):
        _validate.fail(
            "quantiles", quantiles, "expected True, False or None (on when few rounds are recorded)"
        )
    return records <= QUANTILE_MAX_RECORDS if quantiles is None else quantiles


def _check_theta0(theta0, dim: int) -> np.ndarray:
    if theta0 is None:
        return np.zeros(dim)
    theta0_np = _validate.array("theta0", theta0, 1)
    if theta0_np.shape != (dim,):
        _validate.fail("theta0", theta0, f"expected shape ({dim},) to match the problem's dimension")
    return theta0_np


def _check_keep_seeds(keep_seeds, num_seeds: int, records: int, num_metrics: int) -> int:
    keep = _validate.integer("keep_seeds", keep_seeds, 0)
    if keep > num_seeds:
        _validate.fail("keep_seeds", keep_seeds, f"expected an integer in [0, num_seeds={num_seeds}]")
    if keep * records * (1 + num_metrics) > KEEP_SEEDS_MAX_VALUES:
        _validate.fail(
            "keep_seeds",
            keep_seeds,
            f"keep_seeds x recorded rounds ({records}) x (1 + metrics) "
            f"must be <= {KEEP_SEEDS_MAX_VALUES}; record less often or keep fewer seeds",
        )
    return keep


def _check_checkpoint_dir(checkpoint_dir) -> None:
    if checkpoint_dir is not None:
        _paths.folder("checkpoint_dir", checkpoint_dir)
    if checkpoint_dir is not None and jax.process_count() > 1:
        _validate.fail(
            "checkpoint_dir", checkpoint_dir, "checkpoints are written by single-process runs only"
        )


def _check_problem(problem) -> None:
    missing = missing_members(problem)
    if missing:
        _validate.fail(
            "problem",
            type(problem).__name__,
            f"lacks {', '.join(missing)} of the problem protocol (fj.problems.Problem)",
        )
    leaves = jax.tree.leaves(problem)
    if len(leaves) == 1 and leaves[0] is problem:
        _validate.fail(
            "problem",
            type(problem).__name__,
            "must be a pytree (a frozen dataclass registered with "
            "jax.tree_util.register_dataclass), so that its arrays enter the kernel as inputs",
        )


def _check_algorithm(problem, algorithm: Algorithm, theta0: np.ndarray, metrics) -> None:
    """Trace one seed's init and one round (abstractly: nothing runs or compiles) and check the
    contract of :class:`~fedsa_jax.algorithms.Algorithm` and of the metrics."""

    def signature(tree):
        leaves, treedef = jax.tree.flatten(tree)
        return treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__))) for x in leaves)

    seen = (signature(problem), signature(algorithm), theta0.shape, metrics)
    if seen in _checked:  # the same structures passed before (e.g. a sweep's configurations)
        return
    family = problem.describe().get("family", type(problem).__name__)
    where = f"algorithm {algorithm.name!r} on problem {family!r}"
    d, dtype = problem.dim, jnp.dtype(problem.dtype)
    key = jax.random.key(0)
    state = jax.eval_shape(algorithm.init, key, problem, jnp.asarray(theta0, dtype))
    theta = getattr(state, "theta", None)
    if theta is None or getattr(theta, "shape", None) != (d,) or theta.dtype != dtype:
        got = "no field theta" if theta is None else f"theta {getattr(theta, 'shape', '?')} {theta.dtype}"
        _validate.fail(
            "algorithm",
            algorithm.name,
            f"{where}: init_fn must return a state with a field "
            f"theta of shape ({d},) and dtype {dtype} (the server iterate); got {got}",
        )
    error = getattr(state, "error", None)
    if error is not None and (getattr(error, "shape", None) != (d,) or error.dtype != dtype):
        _validate.fail(
            "algorithm",
            algorithm.name,
            f"{where}: the state's field error (theta - theta_star) must have shape ({d},) and dtype {dtype}",
        )
    out = jax.eval_shape(algorithm.step, key, state, problem)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], RoundInfo)):
        _validate.fail(
            "algorithm",
            algorithm.name,
            f"{where}: step_fn must return (state, RoundInfo) "
            f"(build the info with fj.algorithms.round_info); got {type(out).__name__}",
        )
    new_state, info = out
    same = jax.tree.structure(new_state) == jax.tree.structure(state) and all(
        (a.shape, a.dtype) == (b.shape, b.dtype)
        for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(state))
    )
    if not same:
        got, expected = jax.tree.map(lambda a: a.shape, new_state), jax.tree.map(lambda a: a.shape, state)
        _validate.fail(
            "algorithm",
            algorithm.name,
            f"{where}: step_fn must return a state with the "
            f"structure, shapes and dtypes of its input; got {got} for {expected}",
        )
    bad = [f for f in RoundInfo._fields if getattr(info, f) is not None and getattr(info, f).shape != ()]
    if bad:
        _validate.fail(
            "algorithm", algorithm.name, f"{where}: RoundInfo fields {bad} must be scalars (one seed)"
        )
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
            _validate.fail(
                name or "algorithm",
                leaf,
                f"underflows to 0 in {np.dtype(dtype)}; expected 0 or "
                f"|value| >= {tiny:.3g} (or run in float64)",
            )
