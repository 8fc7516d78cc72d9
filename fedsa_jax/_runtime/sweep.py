"""Sweeps over problems, algorithms and hyperparameter grids, resumable.

Configurations are plain dictionaries (:func:`grid` builds their Cartesian
product); ``build(config) -> (problem, algorithm)`` turns one into objects.
Configurations whose problem is the same and whose algorithms share their
structure (name, H, skip, quantizer, aggregation, whether erasures are on) and
whose rounds agree differ only in continuous hyperparameters (step size,
success probability): they run side by side, vmapped along a config axis of one
compiled kernel. Structural options (H, N, bits, ...) make separate groups, run
one after the other.

With ``out_dir`` every finished configuration is written at once, atomically,
to ``out_dir/<name>.npz`` (its config stored in ``result.config["sweep"]``), and
``out_dir/sweep.json`` indexes them; rerunning the same sweep loads finished
configurations instead of running them again (only if the saved run used the
same rounds, seeds, key, theta0, threshold, dtype and code; otherwise it reruns; a
damaged file, or one that :func:`fedsa_jax.load` refuses for its schema, is
recomputed, with a warning; a folder or anything but a file where a result goes is
refused, naming it, once every other configuration is done). ``shard=(k, n)`` runs one
part of the grid, so the tasks of a cluster job array fill one shared folder. :func:`grid` refuses more
than :data:`MAX_GRID` configurations before expanding them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from fedsa_jax import _io, _paths, _validate
from fedsa_jax._io import DamagedFileError
from fedsa_jax._runtime import checkpoint as _checkpoint
from fedsa_jax._runtime.driver import execute
from fedsa_jax._runtime.options import Execution, Recording, Until, grouped
from fedsa_jax._runtime.run import Run, validate_run
from fedsa_jax.result import SimulationResult, load

__all__ = ["MAX_GRID", "SweepEntry", "config_name", "grid", "sweep"]

MAX_GRID = 100_000  # most configurations grid() expands: fj.sweep.MAX_GRID = N (CLI: --max-grid N) raises it


def grid(**axes: Any) -> list[dict[str, Any]]:
    """Cartesian product of the list-valued axes; other values are held fixed.

    A product of more than :data:`MAX_GRID` configurations is refused before it is
    expanded (each one is a dictionary, a result file and a row of the index); set
    ``fj.sweep.MAX_GRID`` to allow more.

    >>> grid(step_size=[0.01, 0.1], num_local_steps=[1, 10], algorithm="fedlsa")[1]
    {'step_size': 0.01, 'num_local_steps': 10, 'algorithm': 'fedlsa'}
    """
    return _grid(axes, sweep.MAX_GRID)


def _grid(axes: Mapping[str, Any], limit: int) -> list[dict[str, Any]]:
    names = list(axes)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in axes.values()]
    for name, v in zip(names, values):
        if len(v) == 0:
            _validate.fail(name, v, "expected a value or a non-empty list of values")
    size = math.prod(len(v) for v in values)
    if size > limit:
        shape = " x ".join(f"{len(v)} {name}" for name, v in zip(names, values) if len(v) > 1)
        raise ValueError(
            f"grid of {size} configurations ({shape}) is invalid: more than MAX_GRID = {limit}; "
            "split the sweep, or raise the limit (fj.sweep.MAX_GRID = N, or --max-grid N on the "
            "command line)"
        )
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def config_name(config: Mapping[str, Any]) -> str:
    """A readable, portable, unique file name: ``key-value`` pairs (sorted, joined by
    ``__``, shortened to 120 characters of ``A-Z a-z 0-9 . _ -``) and a hash of the exact
    configuration (so ``"x/y"`` and ``"x_y"``, ``0.1`` and ``"0.1"`` differ).

    >>> config_name({"step_size": 0.1, "algorithm": "fedlsa"})
    'algorithm-fedlsa__step_size-0.1__f31be4a47ce2'
    """
    text = "__".join(f"{k}-{config[k]}" for k in sorted(config))
    return f"{_paths.safe_name(text)}__{_digest(config)}"


def varying_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys, in first-seen order, whose values differ between ``configs``."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    return [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]


def config_label(config: Mapping[str, Any], keys: Sequence[str]) -> str:
    """``config``'s values of ``keys`` for a reader (console lines, legends): ``key=value`` pairs,
    keys set to None left out and ``params.`` dropped from names; ``""`` when none is set."""
    shown = [(k.removeprefix("params."), config.get(k)) for k in keys]
    return ", ".join(f"{k}={v}" for k, v in shown if v is not None)


def _digest(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def _legacy_name(config: Mapping[str, Any]) -> str:
    """The name of earlier versions (``key=value`` pairs joined by commas): still loaded."""
    text = ",".join(f"{k}={config[k]}" for k in sorted(config))
    return f"{re.sub(r'[^A-Za-z0-9_.,=+-]', '_', text)[:120]},{_digest(config)}"


def _same_run(result: SimulationResult, config, run, problem) -> bool:
    """Whether a saved result is this configuration run with these settings."""
    c = result.config
    return (
        c.get("sweep") == json.loads(json.dumps(config))
        and c.get("num_rounds") == run.num_rounds
        and c.get("num_seeds") == run.num_seeds
        and c.get("record_every") == run.record_every
        and c.get("prng", {}).get("key_data") == jax.random.key_data(run.key).tolist()
        and c.get("theta0") == [float(x) for x in run.theta0]
        and c.get("divergence_threshold") == run.divergence_threshold
        and c.get("dtype") == str(np.dtype(problem.dtype))
        and c.get("metrics", []) == [name for name, _ in run.metrics]
        and c.get("keep_seeds", 0) == run.keep_seeds
        and c.get("code", run.code) == run.code  # the same code (files of earlier versions lack the digest)
        and (not run.quantiles or not np.all(np.isnan(result.mse_quantiles)))  # quantiles asked for: there
    )


@dataclasses.dataclass(frozen=True)
class SweepEntry:
    """One configuration of a sweep and its result.

    ``status``: ``"ran"``, ``"loaded"`` (a finished file), ``"recomputed"`` (its
    file was damaged, so it ran again), ``"missing"`` (not finished, and the
    sweep was asked not to compute: ``result`` and ``path`` are None) or ``"blocked"``
    (something other than a file, a folder say, stands at ``path``: not computed, since its
    result could not be saved; it is listed so in ``sweep.json`` and the sweep then raises a
    ``ValueError`` naming it, after every other configuration is done and saved).
    """

    config: dict[str, Any]
    result: SimulationResult | None
    path: Path | None
    seconds: float  # 0 when loaded from a finished file
    status: str = "ran"


def _per_config(value, config):
    return value(config) if callable(value) else value


def _shard(shard) -> tuple[int, int] | None:
    if shard is None:
        return None
    try:
        k, n = (int(x) for x in shard)
        ok = (k, n) == tuple(shard) and 0 <= k < n
    except (TypeError, ValueError):
        ok = False
    if not ok:
        _validate.fail("shard", shard, "expected (k, n) with integers 0 <= k < n")
    return k, n


def _finished(
    out: Path, config, run, problem, warn: bool = True, compute: bool = True
) -> tuple[SweepEntry | None, str]:
    """``(entry, state)``: the saved result of ``config`` if it is this run's, and ``state``:
    ``"damaged"`` when a file was there but damaged or of another schema (:func:`fedsa_jax.load`
    refuses it: it is then recomputed and replaced, or without ``compute`` counted as missing, with a
    warning), ``"blocked"`` when something other than a file (a folder, a FIFO) stands where the
    result goes (it can be neither read nor replaced: the configuration is refused), else ``""``."""
    primary = out / f"{config_name(config)}.npz"
    for path in (primary, out / f"{_legacy_name(config)}.npz"):
        if not path.exists():
            continue
        if not path.is_file():
            if path == primary:
                return None, "blocked"
            continue  # an old name that is not a file: nothing of ours to load
        try:
            done = load(path)
        except DamagedFileError as err:
            if warn:
                what = (
                    "recomputing a damaged sweep result"
                    if compute
                    else "a damaged sweep result counts as missing (nothing is computed)"
                )
                warnings.warn(f"{what}: {err}", RuntimeWarning, stacklevel=3)
            return None, "damaged"
        if _same_run(done, config, run, problem):
            return SweepEntry(config, done, path, 0.0, "loaded"), ""
    return None, ""


def _refuse_blocked(out: Path, entries: list[SweepEntry]) -> None:
    """After every other configuration is done and indexed: refuse those whose result path holds
    something other than a file, naming the first."""
    blocked = [e for e in entries if e.status == "blocked"]
    if blocked:
        done = sum(e.result is not None for e in entries)
        raise ValueError(
            f"{str(out / f'{config_name(blocked[0].config)}.npz')!r} is not a file (a folder?), so the "
            f"result of its configuration can be neither read nor written: {len(blocked)} "
            f"configuration(s) not computed ({done} of {len(entries)} done and saved); move it away "
            "and rerun the sweep"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Settings:
    """The options of a sweep's runs; rounds and ``record_every`` may be functions of the configuration."""

    key: Any
    num_rounds: int | Callable[[Mapping[str, Any]], int]
    num_seeds: int
    theta0: Any
    divergence_threshold: float
    recording: Recording
    execution: Execution

    def run(self, config: Mapping[str, Any], problem, algorithm) -> Run:
        """The validated run of one configuration."""
        if isinstance(self.num_seeds, Until):  # the configurations of a group would stop at one count
            _validate.fail("num_seeds", self.num_seeds, "expected a count; fj.until(...) is for fj.simulate")
        every = _per_config(self.recording.record_every, config)
        recording = dataclasses.replace(self.recording, record_every=every)
        return validate_run(
            self.key,
            problem,
            algorithm,
            _per_config(self.num_rounds, config),
            self.num_seeds,
            theta0=self.theta0,
            divergence_threshold=self.divergence_threshold,
            recording=recording,
            execution=self.execution,
        )


class _Member(NamedTuple):
    """A configuration to compute, in a group of configurations that run side by side."""

    index: int  # position in the configurations given
    config: dict[str, Any]
    problem: Any
    algorithm: Any
    run: Run


def sweep(
    key,
    configs: Sequence[Mapping[str, Any]],
    build: Callable[[Mapping[str, Any]], tuple[Any, Any]],
    num_rounds: int | Callable[[Mapping[str, Any]], int],
    num_seeds: int,
    out_dir=None,
    record_every: int | Callable[[Mapping[str, Any]], int] = 1,
    theta0=None,
    divergence_threshold: float = 1e10,
    seed_batch_size: int | None = None,
    chunk_rounds: int | None = None,
    progress: bool | str | None = None,
    quantiles: bool | None = None,
    *,
    shard: tuple[int, int] | None = None,
    compute: bool = True,
    recording: Recording | None = None,
    execution: Execution | None = None,
) -> list[SweepEntry]:
    """Simulate every configuration; batch the continuous hyperparameters by vmap.

    Args:
      key: PRNG key shared by all configurations (common random numbers).
      configs: list of dicts, e.g. from :func:`grid`; values must be JSON-friendly.
      build: ``config -> (problem, algorithm)``.
      num_rounds, record_every: ints, or functions of the config (e.g. rounds = 5e5 / H).
      num_seeds, theta0, divergence_threshold, seed_batch_size, chunk_rounds, progress, quantiles:
        as in :func:`fedsa_jax.simulate`.
      out_dir: where finished configurations are saved; a rerun skips them, and
        recomputes (with a warning) those whose file is damaged.
      shard: ``(k, n)``: only the configurations whose index is ``k`` mod ``n``
        (one task of a cluster job array; all tasks share ``out_dir``). A shard
        writes its results but not ``sweep.json``: a run without ``shard`` then
        loads them all, computes what is missing and writes the index.
      compute: False loads finished configurations and computes nothing: the
        others come back with ``status="missing"``.
      recording, execution: the options grouped, as in :func:`fedsa_jax.simulate`
        (``fj.Recording(metrics=..., keep_seeds=..., on_record=...)`` too); a finished
        file is reused only if it recorded the same metrics and kept seeds. A sweep
        resumes from ``out_dir``: ``Execution(checkpoint_dir=...)`` is refused.

    Returns:
      One :class:`SweepEntry` per configuration (of the shard), in the order given.

    With ``out_dir``, the folder is created and checked before anything runs;
    each configuration is computed under a lock on ``.<name>.lock`` there, so
    processes sharing the folder (shards, a collecting run) never compute one
    configuration twice: a process that finds a configuration locked waits, then
    loads the other's result.
    """
    if not configs:
        _validate.fail("configs", configs, "expected at least one configuration")
    shard = _shard(shard)
    recording, execution = grouped(
        recording,
        execution,
        record_every=record_every,
        quantiles=quantiles,
        seed_batch_size=seed_batch_size,
        chunk_rounds=chunk_rounds,
        progress=progress,
    )
    if execution.checkpoint_dir is not None:
        _validate.fail(
            "checkpoint_dir",
            execution.checkpoint_dir,
            "expected None in a sweep: it resumes from out_dir, where every finished configuration is saved",
        )
    if out_dir is not None:
        _paths.folder("out_dir", out_dir)
    out = None if out_dir is None else _io.prepare_dir(out_dir, "out_dir")
    settings = _Settings(
        key=key,
        num_rounds=num_rounds,
        num_seeds=num_seeds,
        theta0=theta0,
        divergence_threshold=divergence_threshold,
        recording=recording,
        execution=execution,
    )
    entries: dict[int, SweepEntry] = {}
    damaged: set[int] = set()
    groups = _groups(
        configs, build, settings, shard=shard, out=out, compute=compute, entries=entries, damaged=damaged
    )
    for members in groups:
        _run_locked(members, out, entries, damaged)
        if out is not None and shard is None:
            _write_index(out, [entries[j] for j in sorted(entries)])
    ordered = [entries[i] for i in sorted(entries)]
    if out is not None and shard is None:
        _write_index(out, ordered)
    if out is not None:
        _refuse_blocked(out, ordered)
    return ordered


sweep.MAX_GRID = MAX_GRID  # type: ignore[attr-defined]  # fj.sweep.MAX_GRID = N: the limit grid() applies


def _groups(
    configs,
    build,
    settings: _Settings,
    *,
    shard,
    out: Path | None,
    compute: bool,
    entries: dict[int, SweepEntry],
    damaged: set[int],
) -> list[list[_Member]]:
    """Validate every configuration (of the shard); enter the finished and, without ``compute``, the
    missing ones in ``entries``; group the others that can run side by side (one compiled kernel)."""
    groups: dict[Any, list[_Member]] = {}
    for i, config in enumerate(configs):
        if shard is not None and i % shard[1] != shard[0]:
            continue
        config = dict(config)
        problem, algorithm = build(config)
        run = settings.run(config, problem, algorithm)
        if out is not None:
            entry, state = _finished(out, config, run, problem, compute=compute)
            if state == "blocked":
                entry = SweepEntry(config, None, out / f"{config_name(config)}.npz", 0.0, "blocked")
            if entry is not None:
                entries[i] = entry
                continue
            if state == "damaged":
                damaged.add(i)
        if not compute:
            entries[i] = SweepEntry(config, None, None, 0.0, "missing")
            continue
        problem_id = _checkpoint.fingerprint(problem, structure=problem.describe())
        group = (problem_id, jax.tree.structure(algorithm), run.num_rounds, run.record_every)
        groups.setdefault(group, []).append(_Member(i, config, problem, algorithm, run))
    return list(groups.values())


def _run_locked(
    members: list[_Member], out: Path | None, entries: dict[int, SweepEntry], damaged: set[int]
) -> None:
    """Run a group under the locks of its configurations, leaving out those another process finished."""
    with contextlib.ExitStack() as locks:
        if out is not None:  # sorted, so processes taking several locks never deadlock
            for name in sorted(config_name(m.config) for m in members):
                locks.enter_context(_io.file_lock(out / f".{name}.lock", blocking=True))
            todo = []
            for m in members:  # another process may have finished some while we waited
                entry, _ = _finished(out, m.config, m.run, m.problem, warn=False)
                if entry is not None:
                    entries[m.index] = entry
                else:
                    todo.append(m)
            members = todo
        if members:
            _run_group(members, out, entries, damaged)


def _run_group(
    members: list[_Member], out: Path | None, entries: dict[int, SweepEntry], damaged: set[int]
) -> None:
    first = members[0]
    t0 = time.perf_counter()
    results = execute(first.run, first.problem, [m.algorithm for m in members])
    seconds = (time.perf_counter() - t0) / len(members)
    for m, res in zip(members, results):
        res = dataclasses.replace(res, config={**res.config, "sweep": json.loads(json.dumps(m.config))})
        path = None
        if out is not None:
            path = out / f"{config_name(m.config)}.npz"
            res.save(path)
        status = "recomputed" if m.index in damaged else "ran"
        entries[m.index] = SweepEntry(m.config, res, path, seconds, status)


def _write_index(out: Path, entries: list[SweepEntry]) -> None:
    """``sweep.json``: one row per configuration (strict JSON: a diverged MSE is ``null``,
    and ``num_diverged`` says how many seeds diverged)."""
    rows = []
    for e in entries:
        row = {"config": e.config, "status": e.status, "file": e.path.name if e.path else None}
        if e.result is not None:
            row.update(
                final_mse=float(e.result.mse_mean[-1]),
                final_mse_sem=float(e.result.mse_sem[-1]),
                num_diverged=int(e.result.num_diverged[-1]),
                num_rounds=int(e.result.rounds[-1]),
                seconds=e.seconds,
            )
        rows.append(row)
    _io.write_json(out / "sweep.json", rows)
