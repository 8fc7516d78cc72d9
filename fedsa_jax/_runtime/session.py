"""A run's checkpoint session and tally: what the finished seed batches produced (:class:`Tally`) and
the checkpoint that holds it between calls (:class:`CheckpointSession`: its own file, named after the
fingerprint of the configuration, :func:`configuration_fingerprint`, and of the code; locked for the
run, loaded once, saved after each chunk). ``setup`` is the driver's plan of the run
(:mod:`fedsa_jax._runtime.driver`)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import jax
import numpy as np

from fedsa_jax._runtime import checkpoint as _checkpoint
from fedsa_jax._runtime.kernel import Carry
from fedsa_jax._version import __version__
from fedsa_jax.stats import Moments

__all__ = ["Tally", "CheckpointSession", "configuration_fingerprint"]


@dataclasses.dataclass
class Tally:
    """What the seed batches produced so far (restored from a checkpoint, then extended)."""

    first_batch: int = 0  # the first batch this call runs
    done: Moments | None = None  # finished batches, merged as they finish: arrays (num_configs, R, ...)
    finals: list[np.ndarray] = dataclasses.field(default_factory=list)  # per batch, (num_configs, seeds, d)
    resumed_from: dict | None = None  # where a checkpoint let this run start: seed batch and round
    seed_rounds_run: int = 0  # the work this call did itself


class CheckpointSession:
    """A run's checkpoint: its own file in the folder (named after the fingerprint of the configuration
    and of the code that runs it), locked while the run uses it, loaded once, saved after each chunk."""

    def __init__(self, directory: Path, fingerprint: str, configuration: str, saved: dict | None):
        self.directory, self.fingerprint, self.configuration = directory, fingerprint, configuration
        self.saved = saved  # the checkpoint found at the start, or None

    @classmethod
    def open(cls, stack: contextlib.ExitStack, setup) -> CheckpointSession | None:
        """The session of ``setup``'s checkpoint folder (None without one), locked until ``stack`` closes."""
        if setup.run.execution.checkpoint_dir is None:
            return None
        directory = Path(setup.run.execution.checkpoint_dir)
        configuration = configuration_fingerprint(setup)  # hashes every leaf: only when needed
        fingerprint = _checkpoint.fingerprint(configuration=configuration, code=setup.codes)
        stack.enter_context(_checkpoint.lock(directory, fingerprint))
        saved = _checkpoint.load(directory, fingerprint)
        if saved is None:
            _checkpoint.notice_other_code(directory, fingerprint, configuration)
        else:
            first = int(saved["batch"])
            _checkpoint.require(
                saved,
                [f"final{b}" for b in range(first)] + [f"done_{f}" for f in Moments._fields if first],
                directory,
                fingerprint,
            )
        return cls(directory, fingerprint, configuration, saved)

    def tally(self) -> Tally:
        """The finished seed batches of the checkpoint."""
        if self.saved is None:
            return Tally()
        first = int(self.saved["batch"])
        done = Moments(*(self.saved[f"done_{f}"] for f in Moments._fields)) if first else None
        return Tally(
            first_batch=first,
            done=done,
            finals=[self.saved[f"final{b}"] for b in range(first)],
            resumed_from={"seed_batch": first, "round": 0},
        )

    def restore(self, carry: Carry) -> tuple[Carry, list[Moments]] | None:
        """The unfinished batch's carry and recorded rows (None if the checkpoint ended on a batch)."""
        if self.saved is None or "carry0" not in self.saved:
            return None
        _checkpoint.require(
            self.saved,
            [f"cur_{f}" for f in Moments._fields] + [f"carry{i}" for i in range(len(jax.tree.leaves(carry)))],
            self.directory,
            self.fingerprint,
        )
        carry = _checkpoint.arrays_to_tree("carry", self.saved, carry)
        return carry, [Moments(*(self.saved[f"cur_{f}"] for f in Moments._fields))]

    def save(self, batch: int, tally: Tally, *, current: Moments | None = None, carry: Carry | None = None):
        """Batches before ``batch`` finished; with ``carry``, batch ``batch`` under way (``current``: its
        rows so far)."""
        arrays: dict[str, np.ndarray] = {
            "fingerprint": np.array(self.fingerprint),
            "configuration": np.array(self.configuration),
            "batch": np.array(batch),
        }
        if tally.done is not None:
            arrays.update({f"done_{f}": np.asarray(getattr(tally.done, f)) for f in Moments._fields})
        for b, theta in enumerate(tally.finals):
            arrays[f"final{b}"] = theta
        if carry is not None:
            arrays.update({f"cur_{f}": np.asarray(getattr(current, f)) for f in Moments._fields})
            arrays.update(_checkpoint.tree_to_arrays("carry", carry))
        _checkpoint.save(self.directory, self.fingerprint, arrays)


def configuration_fingerprint(setup) -> str:
    """The fingerprint of everything a checkpoint's numbers depend on, but the code."""
    run, problem, plan = setup.run, setup.problem, setup.plan
    return _checkpoint.fingerprint(
        problem,
        setup.stacked,
        jax.random.key_data(run.key),
        run.theta0,
        problem_structure=problem.describe(),
        algorithm_structure=[a.describe() for a in setup.algorithms],
        num_rounds=run.num_rounds,
        num_seeds=run.num_seeds,
        record_every=run.record_every,
        threshold=run.divergence_threshold,
        batch=plan.batch_size,
        padded=plan.padded_batch,
        devices=setup.num_devices,
        dtype=str(np.dtype(problem.dtype)),
        statistics=Moments._fields,
        quantiles=run.quantiles,
        version=__version__,  # other statistics: refused
        metrics=[name for name, _ in run.metrics],
        keep_seeds=run.keep_seeds,
        **({"pairs": [list(p) for p in setup.pairs]} if setup.joint else {}),  # joint runs only
        # unrolling can change a step's rounding (Scaffnew): a resume keeps the program it started with
        **({"local_unroll": setup.reduction.unroll} if setup.reduction.unroll is not None else {}),
        # the fused kernels sum in another order than the scan: a resume keeps the one it started with
        **({"fused_local_steps": setup.reduction.fused} if setup.reduction.fused is not None else {}),
        # a resume runs the seeds in the slices it started with (rounding can depend on them)
        **({"seed_slices": plan.seed_slices} if plan.seed_slices > 1 else {}),
    )
