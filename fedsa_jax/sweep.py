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
same rounds, seeds, key, theta0, threshold and dtype; otherwise it reruns).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from fedsa_jax import _checkpoint, _validate
from fedsa_jax._module import make_callable
from fedsa_jax._io import atomic_write
from fedsa_jax.result import SimulationResult, load
from fedsa_jax.simulate import _execute, validate_run


def grid(**axes: Any) -> list[dict[str, Any]]:
    """Cartesian product of the list-valued axes; other values are held fixed.

    >>> grid(step_size=[0.01, 0.1], num_local_steps=[1, 10], algorithm="fedlsa")[1]
    {'step_size': 0.01, 'num_local_steps': 10, 'algorithm': 'fedlsa'}
    """
    names = list(axes)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in axes.values()]
    for name, v in zip(names, values):
        if len(v) == 0:
            _validate.fail(name, v, "expected a value or a non-empty list of values")
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def config_name(config: Mapping[str, Any]) -> str:
    """A readable, file-safe, unique name: ``key=value`` pairs (sorted, shortened) and a
    hash of the exact configuration (so ``"x/y"`` and ``"x_y"``, ``0.1`` and ``"0.1"`` differ)."""
    text = ",".join(f"{k}={config[k]}" for k in sorted(config))
    safe = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)[:120]
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return f"{safe},{digest}"


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
        and (not run.quantiles or not np.all(np.isnan(result.mse_quantiles)))  # quantiles asked for, and there
    )


@dataclasses.dataclass(frozen=True)
class SweepEntry:
    config: dict[str, Any]
    result: SimulationResult
    path: Path | None
    seconds: float  # 0 when loaded from a finished file


def _per_config(value, config):
    return value(config) if callable(value) else value


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
    progress: bool | None = None,
    quantiles: bool | None = None,
) -> list[SweepEntry]:
    """Simulate every configuration; batch the continuous hyperparameters by vmap.

    Args:
      key: PRNG key shared by all configurations (common random numbers).
      configs: list of dicts, e.g. from :func:`grid`; values must be JSON-friendly.
      build: ``config -> (problem, algorithm)``.
      num_rounds, record_every: ints, or functions of the config (e.g. rounds = 5e5 / H).
      num_seeds, theta0, divergence_threshold, seed_batch_size, chunk_rounds, progress, quantiles:
        as in :func:`fedsa_jax.simulate`.
      out_dir: where finished configurations are saved; a rerun skips them.

    Returns:
      One :class:`SweepEntry` per configuration, in the order given.
    """
    if not configs:
        _validate.fail("configs", configs, "expected at least one configuration")
    out = None if out_dir is None else Path(out_dir)
    entries: dict[int, SweepEntry] = {}
    groups: dict[Any, list[tuple[int, Any, Any, Any]]] = {}
    for i, config in enumerate(configs):
        config = dict(config)
        problem, algorithm = build(config)
        run = validate_run(key, problem, algorithm, _per_config(num_rounds, config), num_seeds,
                           theta0, _per_config(record_every, config), divergence_threshold,
                           seed_batch_size, chunk_rounds, None, progress, quantiles)
        path = None if out is None else out / f"{config_name(config)}.npz"
        if path is not None and path.exists():
            done = load(path)
            if _same_run(done, config, run, problem):
                entries[i] = SweepEntry(config, done, path, 0.0)
                continue
        problem_id = _checkpoint.fingerprint(problem, structure=problem.describe())
        group = (problem_id, jax.tree.structure(algorithm), run.num_rounds, run.record_every)
        groups.setdefault(group, []).append((i, config, problem, algorithm, run))
    for members in groups.values():
        _, _, problem, _, run = members[0]
        t0 = time.perf_counter()
        results = _execute(run, problem, [m[3] for m in members])
        seconds = (time.perf_counter() - t0) / len(members)
        for (i, config, _, _, _), res in zip(members, results):
            res = dataclasses.replace(res, config={**res.config, "sweep": json.loads(json.dumps(config))})
            path = None
            if out is not None:
                path = out / f"{config_name(config)}.npz"
                res.save(path)
            entries[i] = SweepEntry(config, res, path, seconds)
        if out is not None:
            _write_index(out, [entries[j] for j in sorted(entries)])
    ordered = [entries[i] for i in range(len(configs))]
    if out is not None:
        _write_index(out, ordered)
    return ordered


def _write_index(out: Path, entries: list[SweepEntry]) -> None:
    rows = [
        {
            "config": e.config,
            "file": e.path.name if e.path else None,
            "final_mse": float(e.result.mse_mean[-1]),
            "final_mse_sem": float(e.result.mse_sem[-1]),
            "num_diverged": int(e.result.num_diverged[-1]),
            "num_rounds": int(e.result.rounds[-1]),
            "seconds": e.seconds,
        }
        for e in entries
    ]
    atomic_write(out / "sweep.json", lambda f: f.write(json.dumps(rows, indent=2)), mode="w")


make_callable(__name__, sweep)  # fj.sweep(...) calls sweep; `import fedsa_jax.sweep` is this module
