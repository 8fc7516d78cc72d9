"""The option groups of :func:`fedsa_jax.simulate` and :func:`fedsa_jax.sweep`: what to record
(:class:`Recording`) and how to execute (:class:`Execution`), and what ``on_record`` receives
(:class:`Record`).

Both functions take every option as a flat keyword (``record_every=10, seed_batch_size=512``) or
grouped (``recording=fj.Recording(record_every=10), execution=fj.Execution(seed_batch_size=512)``);
:func:`grouped` turns the flat keywords into the groups, in this one place. A group and a flat
keyword of that group with another value than its default are refused together: one of them would
be silently ignored. Values are checked when a run is validated, before anything compiles.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedsa_jax import _validate

__all__ = ["Execution", "Record", "Recording", "Until", "until"]

MEMORY_BUDGET = 2 * 2**30  # default bytes for one seed batch's states, per device
# A round runs its seeds in slices whose states (the kernel's carry) take about CACHE_BYTES per device,
# and hold at least MIN_SLICE_AGENTS agents (smaller slices pay each operation's fixed cost): on a
# 2-core CPU, tabular SARSA and TD FedLSA (N = 10, H = 100) ran 1.3-1.5x faster with 256 KiB to 1 MiB
# slices than in one pass, and slower again from 2 MiB (benchmarks/README.md, "Seed slices").
CACHE_BYTES = {"cpu": 2**19}
MIN_SLICE_AGENTS = 512


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recording:
    """What a run records, and whom it tells.

    Attributes:
      record_every: record statistics every this many rounds (round 0 and the last round are always
        recorded). In :func:`fedsa_jax.sweep`, also a function of the configuration.
      metrics: ``{"name": fn}`` with ``fn(state, problem) -> scalar`` (or ``fn(state, problem, info)``)
        for one seed, or a built-in name (``"client_drift"``, ``"control_variate_error"``, see
        :mod:`fedsa_jax.metrics`); recorded at every recorded round like the MSE
        (``result.metrics["name"].mean``, ``.sem``, ``.quantiles``).
      quantiles: record quantiles over seeds of the squared error and the metrics
        (``result.mse_quantiles``, from a histogram of ``4 * HIST_BINS`` bytes per value and
        recorded round); default (None): when at most ``QUANTILE_MAX_RECORDS`` = 10,000 rounds are
        recorded. Off, they are NaN.
      keep_seeds: keep the squared error and the metrics of the first K seeds at every recorded
        round (``result.seed_mse (R, K)``, ``metrics[...].seeds``), for spaghetti plots and
        bootstrap intervals; at most ``KEEP_SEEDS_MAX_VALUES`` = 2**24 values in all.
      on_record: ``fn(record)`` called on the host after each chunk with a :class:`Record` of the
        rounds just recorded (statistics over every seed run so far), e.g. to stream curves to an
        experiment tracker.
    """

    record_every: int | Callable[[Mapping[str, Any]], int] = 1
    metrics: Mapping[str, Any] | Sequence[str] | None = None
    quantiles: bool | None = None
    keep_seeds: int = 0
    on_record: Callable[[Record], Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Execution:
    """How a run executes; results do not depend on it (bitwise for the same devices, except the
    float rounding that ``local_unroll`` and ``cache_bytes`` can change, and ``seed_batch_size``
    through the slices it sets).

    Attributes:
      seed_batch_size: seeds run together (default: as many as fit in ``memory_budget`` bytes per
        device); more seeds run in batches, one after the other, with the same results (bitwise,
        or to float rounding where the batch size changes the slices of ``cache_bytes``).
      chunk_rounds: rounds per call of the compiled kernel (default: about ``STEPS_PER_CHUNK`` = 5e7
        agent-steps; at most ``MAX_BLOCKS_PER_CHUNK`` = 256 recorded rounds); the progress bar,
        checkpoints and ``on_record`` advance per chunk.
      checkpoint_dir: if given, an atomic checkpoint is written there after each chunk, and a call
        with the same arguments resumes from it (bit-identical to an uninterrupted run). The file is
        named after the configuration's fingerprint, so runs of different configurations can share
        the folder; a second run of the same configuration while the first is running, or a damaged
        checkpoint, is refused with a ``ValueError``. The fingerprint includes a digest of the
        algorithm's, problem's and metrics' code: edited code starts from round 0, with a
        ``RuntimeWarning`` when the folder holds a checkpoint of the same configuration made by other
        code. ``result.config["execution"]`` says where the run resumed (``resumed_from``) and how
        many seed-rounds it computed (``seed_rounds_run``). :func:`fedsa_jax.simulate` only: a sweep
        resumes from its ``out_dir``.
      progress: show a progress bar (default: only on a terminal); ``"lines"``: one line per chunk on
        standard error instead (for a log file or a pipe; the command line's default off a terminal).
      memory_budget: bytes of per-seed states (about 4 copies of the kernel's carry) that the
        default seed batch fills on each device (default 2 GiB); raise it on a large accelerator.
      local_unroll: local steps per iteration of the compiled local-step scans (default: the
        backend's, ``fedsa_jax.problems.protocol.LOCAL_UNROLL``: 8 on CPU and GPU, the fastest
        measured). A speed setting: FedLSA's and SCAFFLSA's results do not change (bitwise),
        Scaffnew's only at rounding (XLA fuses its unrolled body differently); a checkpoint records
        a value given here, so a resume runs the same program.
      cache_bytes: bytes of per-seed states (the kernel's carry) that a round works on at a time, per
        device: a round runs its seeds in slices of about this size, one after the other, so that a
        slice's states and random numbers stay in the processor's cache through the round's local
        steps (default ``CACHE_BYTES``: 512 KiB on CPU, measured fastest; none on GPU, which wants
        every seed at once; 0: one slice). The slice count divides each device's seeds, so the seed
        batch is the same. A speed setting: values change at float rounding only (XLA may vectorise
        a slice's arithmetic differently: a few units in the last place); a checkpoint records the
        slices, so a resume runs the same program.
      fused_local_steps: run the local steps of a problem that has a fused kernel (federated TD with
        pair tables, Gaussian LSA) as one Pallas kernel per round, each agent's iterate kept on chip
        through its H steps (:mod:`fedsa_jax.problems.fused`; Triton on a GPU, interpret mode
        elsewhere; on a GPU with one device only: several keep the scan), instead of the compiled
        scan. Default: the backend's
        (``fedsa_jax.problems.protocol.FUSED_LOCAL_STEPS``: on only where measured faster; off on
        CPU, where interpret mode is slower, and on GPU until measured there). A speed setting: the
        same random numbers, results equal to float rounding; a checkpoint records a value given
        here, so a resume runs the same program. ``result.config["execution"]["fused_local_steps"]``
        is the setting; the kernel runs where the problem has one that fits (a TD problem with pair
        tables up to d = 40, Gaussian LSA up to d = 10 in float32), on one GPU or in interpret mode.
    """

    seed_batch_size: int | None = None
    chunk_rounds: int | None = None
    checkpoint_dir: str | os.PathLike | None = None
    progress: bool | str | None = None
    memory_budget: int = MEMORY_BUDGET
    local_unroll: int | None = None
    cache_bytes: int | None = None
    fused_local_steps: bool | None = None


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


def grouped(
    recording: Recording | None, execution: Execution | None, **flat: Any
) -> tuple[Recording, Execution]:
    """The option groups of a call: given ones, or built from the flat keywords (``flat``: each
    keyword of :class:`Recording` and :class:`Execution` that the function offers flat)."""
    return (_group("recording", Recording, recording, flat), _group("execution", Execution, execution, flat))


def _group(name: str, cls: type, given: Any, flat: dict[str, Any]):
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.name in flat}
    if given is None:
        return cls(**{k: flat[k] for k in fields})
    if not isinstance(given, cls):
        _validate.fail(name, given, f"expected fj.{cls.__name__}(...) or None")
    for key, default in fields.items():
        if not _is_default(flat[key], default):
            _validate.fail(
                key,
                flat[key],
                f"expected its default ({default!r}) when {name}= is given: pass "
                f"it inside fj.{cls.__name__}(...) or as a keyword, not both",
            )
    return given


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


@dataclasses.dataclass(frozen=True)
class Until:
    """A precision target in place of a seed count (:func:`until`)."""

    rel_sem: float
    max_seeds: int
    rounds: tuple[int, ...] | None = None
    min_seeds: int = 64

    def met(self, rounds: np.ndarray, mse_mean: np.ndarray, mse_sem: np.ndarray) -> bool:
        """Whether ``mse_sem <= rel_sem * mse_mean`` at every round checked (``rounds``: the recorded ones;
        a round whose MSE and standard error are both 0, such as a fixed start, meets any target)."""
        checked = np.ones(len(rounds), bool) if self.rounds is None else np.isin(rounds, self.rounds)
        m, s = mse_mean[checked], mse_sem[checked]
        return bool(np.all((s <= self.rel_sem * m) | ((s == 0) & (m == 0))))


def until(
    rel_sem: float = 0.01, max_seeds: int = 1_000_000, rounds=None, min_seeds: int | None = None
) -> Until:
    """``num_seeds=fj.until(...)``: run seed batches until the MSE's relative standard error
    ``mse_sem / mse_mean`` is at most ``rel_sem`` at every recorded round (or at the recorded rounds
    ``rounds`` only), with at least ``min_seeds`` (default ``min(64, max_seeds)``) and at most
    ``max_seeds`` seeds.

    The check happens after each seed batch (``seed_batch_size``; by default ``max_seeds / 64``, at
    least ``min_seeds``, at most what fits in memory; ``res.config["execution"]["seed_batch_size"]``).
    Seed batches are prefixes of the seed axis (seed ``i`` depends only on ``(key, i)`` and batches
    are merged in order), so the result is the fixed-count run with ``res.num_seeds`` seeds and the
    same ``seed_batch_size``, bitwise; ``res.config["until"]`` says why it stopped (``"target met"``
    or ``"max_seeds"``). Stopping on an estimated standard error biases the estimate a little
    towards runs whose spread looked small; ``min_seeds`` (and batches of some hundreds of seeds)
    keeps that well below the standard error.
    """
    rel = _validate.real("rel_sem", rel_sem, low=0.0, low_open=True)
    most = _validate.integer("max_seeds", max_seeds, 2, 2**31 - 1)
    least = min(64, most) if min_seeds is None else _validate.integer("min_seeds", min_seeds, 2, most)
    if rounds is not None:
        values = np.atleast_1d(np.asarray(rounds))
        if values.ndim != 1 or values.size == 0 or values.dtype.kind not in "iu" or np.any(values < 0):
            _validate.fail(
                "rounds", rounds, "expected None or a non-empty list of recorded rounds (integers >= 0)"
            )
        rounds = tuple(int(r) for r in values)
    return Until(rel_sem=rel, max_seeds=most, rounds=rounds, min_seeds=least)
