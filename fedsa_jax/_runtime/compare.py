"""Paired comparisons on common random numbers: :func:`compare`.

Why pair. To compare two algorithms A and B, the estimate of ``MSE_A - MSE_B`` from independent
seeds has variance ``(Var e_A + Var e_B) / n`` (``e = |theta_t - theta_star|^2`` of one seed). Run
on the same seeds, seed ``i`` of A and of B see the same observations, their errors are positively
correlated, and the mean of the per-seed differences ``d_i = e_A,i - e_B,i`` has variance
``Var(e_A - e_B) / n = (Var e_A + Var e_B - 2 Cov(e_A, e_B)) / n``: fewer seeds for the same
precision, by the factor ``(Var e_A + Var e_B) / Var(e_A - e_B)`` (``benchmarks/paired.py``
measures it).

When streams are shared. Seed ``i``'s round ``t`` draws its random numbers with
``algorithm.randomness(fold_in(k_rounds_i, t), problem)`` (:mod:`fedsa_jax._runtime.kernel`), the same key
for every algorithm. With the default :meth:`~fedsa_jax.Algorithm.randomness` (every built-in
algorithm) the observations are one block of shape ``(num_agents, H, ...)`` and the channel gets
its own key: algorithms with the same number of local steps ``H`` and ``skip`` on the same problem
see the same observations, and the same channel randomness where their channels draw alike
(FedLSA against SCAFFLSA, or against FedLSA with a server optimizer, a schedule or averaging).
Other ``H`` or ``skip`` draw blocks of another shape: the comparison is still valid, but the
streams are no longer common and the pairing gains little. The initial states share their keys too.

The per-seed differences are reduced in the kernel, like the algorithms' own statistics (one
compiled program runs every algorithm round by round): mergeable moments over the seeds where
neither algorithm diverged, so a difference is exact whatever the seed batches, and two identical
algorithms give a difference of exactly 0 with a standard error of 0.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from fedsa_jax import _validate
from fedsa_jax._runtime.driver import execute_joint, simulate, simulation_run
from fedsa_jax._runtime.options import Until
from fedsa_jax.algorithms._base import Algorithm
from fedsa_jax.result import SimulationResult, short_repr, write_csv

__all__ = ["Comparison", "Difference", "compare"]


@dataclasses.dataclass(frozen=True)
class Difference:
    """Per recorded round, the paired difference of two algorithms run on the same seeds.

    Attributes:
      name_a, name_b: the algorithms: differences are A minus B.
      rounds: ``(R,)`` the recorded rounds.
      mean: ``(R,)`` mean over seeds of ``d_i = |e_A,i|^2 - |e_B,i|^2`` (``e = theta_t - theta_star``),
        over the seeds where neither diverged.
      sem: ``(R,)`` its paired standard error ``std(d_i) / sqrt(n)`` (sample std, ``n - 1``).
      num_pairs: ``(R,)`` the seeds where neither diverged (``n``).
      seeds: ``(R, K)`` the first K seeds' differences (``keep_seeds=K``).
      mse_a, mse_b, sem_a, sem_b: ``(R,)`` each algorithm's MSE and standard error.
      metrics: ``name -> (mean (R,), sem (R,))``: the paired differences of the recorded metrics.
    """

    name_a: str
    name_b: str
    rounds: np.ndarray
    mean: np.ndarray
    sem: np.ndarray
    num_pairs: np.ndarray
    seeds: np.ndarray
    mse_a: np.ndarray
    mse_b: np.ndarray
    sem_a: np.ndarray
    sem_b: np.ndarray
    metrics: dict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: the pair, the pairs of seeds, the final difference, each array's shape."""
        return short_repr(
            self,
            f"{self.name_a} - {self.name_b}, {int(self.num_pairs[-1])} pairs, final MSE difference "
            f"{self.mean[-1]:.4g} +- {self.sem[-1]:.2g}",
        )

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)``: Student t interval ``mean -+ t_{n-1} sem`` for ``MSE_A - MSE_B``."""
        level = _level(level)
        with np.errstate(invalid="ignore"):
            t = scipy_stats.t.ppf((1 + level) / 2, np.maximum(self.num_pairs - 1, 1))
        return self.mean - t * self.sem, self.mean + t * self.sem

    @property
    def ratio(self) -> np.ndarray:
        """``(R,)`` ``MSE_A / MSE_B``."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.mse_a / self.mse_b

    def ratio_interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` for ``MSE_A / MSE_B``: the delta method on the log scale.

        With ``m_A, m_B`` the MSEs, ``s_A, s_B`` their standard errors and ``s_D`` the paired one,
        the covariance of the two means is ``c = (s_A^2 + s_B^2 - s_D^2) / 2`` (from
        ``Var(A - B) = Var A + Var B - 2 Cov(A, B)``), and
        ``Var log(m_A / m_B) ~ s_A^2 / m_A^2 + s_B^2 / m_B^2 - 2 c / (m_A m_B)``; the interval is
        ``ratio * exp(-+ z sqrt(Var))`` (normal quantile ``z``), positive like the ratio. Every
        term comes from the streamed statistics. Exact where a diverged seed is left out of
        neither or both algorithms; NaN where an MSE is 0 (the round 0 of a fixed start).
        """
        z = scipy_stats.norm.ppf((1 + _level(level)) / 2)
        ma, mb, sa, sb = self.mse_a, self.mse_b, self.sem_a, self.sem_b
        with np.errstate(invalid="ignore", divide="ignore"):
            cov = (sa**2 + sb**2 - self.sem**2) / 2
            var = np.maximum(sa**2 / ma**2 + sb**2 / mb**2 - 2 * cov / (ma * mb), 0.0)
            ratio = ma / mb
            return ratio * np.exp(-z * np.sqrt(var)), ratio * np.exp(z * np.sqrt(var))

    def table(self) -> dict[str, np.ndarray]:
        """Columns ``round``, ``difference_mean``, ``difference_sem``, ``difference_low``,
        ``difference_high`` (95 % t), ``ratio``, ``ratio_low``, ``ratio_high`` (95 % delta method)."""
        low, high = self.interval()
        r_low, r_high = self.ratio_interval()
        return {
            "round": self.rounds,
            "difference_mean": self.mean,
            "difference_sem": self.sem,
            "difference_low": low,
            "difference_high": high,
            "ratio": self.ratio,
            "ratio_low": r_low,
            "ratio_high": r_high,
        }

    def to_csv(self, path) -> None:
        """Write :meth:`table` as CSV (header row, full float precision), atomically."""
        write_csv(path, {k: np.asarray(v) for k, v in self.table().items()})


def _level(level) -> float:
    return _validate.real("level", level, low=0.0, high=1.0, low_open=True, high_open=True)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What :func:`compare` returns: ``results[name]`` (a usual
    :class:`~fedsa_jax.SimulationResult` per algorithm) and :meth:`difference`."""

    results: dict[str, SimulationResult]
    _pairs: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(repr=False)

    def difference(self, name_a: str, name_b: str) -> Difference:
        """The paired difference ``A - B`` of the algorithms named ``name_a`` and ``name_b``."""
        for name, which in ((name_a, "name_a"), (name_b, "name_b")):
            if name not in self.results:
                _validate.fail(which, name, f"expected one of {sorted(self.results)}")
        if name_a == name_b:
            _validate.fail("name_b", name_b, "expected another algorithm than name_a")
        sign = 1.0 if (name_a, name_b) in self._pairs else -1.0
        stats = self._pairs[(name_a, name_b) if sign > 0 else (name_b, name_a)]
        a, b = self.results[name_a], self.results[name_b]
        num_seeds = a.num_seeds
        return Difference(
            name_a=name_a,
            name_b=name_b,
            rounds=a.rounds,
            mean=sign * stats["val_mean"][:, 0] + 0.0,  # + 0.0: no -0.0
            sem=stats["val_sem"][:, 0],
            num_pairs=num_seeds - stats["num_diverged"],
            seeds=sign * stats["kept"][:, :, 0] + 0.0,
            mse_a=a.mse_mean,
            mse_b=b.mse_mean,
            sem_a=a.mse_sem,
            sem_b=b.mse_sem,
            metrics={
                m: (sign * stats["val_mean"][:, j + 1] + 0.0, stats["val_sem"][:, j + 1])
                for j, m in enumerate(a.metrics)
            },
        )


def compare(
    key, problem, algorithms: Mapping[str, Algorithm], num_rounds, num_seeds, **options
) -> Comparison:
    """Run several algorithms on the same problem and the same seeds, in one compiled program.

    Args:
      key, problem, num_rounds, num_seeds: as for :func:`fedsa_jax.simulate` (``num_seeds`` a count).
      algorithms: ``{name: algorithm}``, at least two, of any structures.
      options: any keyword of :func:`fedsa_jax.simulate` (``record_every``, ``keep_seeds``,
        ``metrics``, ``seed_batch_size``, ``checkpoint_dir``, ...), for every algorithm.

    Returns:
      a :class:`Comparison`: ``results[name]`` equals ``fj.simulate`` of that algorithm alone with the
      same key and options, up to float rounding (bitwise where the compiler emits the same code);
      ``difference(a, b)`` the per-seed paired statistics of every pair, recorded in the kernel.
      Seed ``i`` of every algorithm draws its observations from the same key: see this module's
      notes for when the streams coincide (same ``H`` and ``skip``: the built-in algorithms).
    """
    if not isinstance(algorithms, Mapping) or len(algorithms) < 2:
        _validate.fail("algorithms", algorithms, "expected a dict of at least two {name: fj.Algorithm}")
    for name in algorithms:
        if not isinstance(name, str) or not name:
            _validate.fail("algorithms", name, "expected non-empty names (str) as keys")
    if isinstance(num_seeds, Until):
        _validate.fail("num_seeds", num_seeds, "expected a count for compare (fj.until is for simulate)")
    try:
        bound = inspect.signature(simulate).bind(key, problem, None, num_rounds, num_seeds, **options)
    except TypeError as err:
        raise ValueError(f"options={sorted(options)} is invalid: {err}") from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    names = list(algorithms)
    runs = [simulation_run(**{**arguments, "algorithm": algorithms[n]}) for n in names]
    pairs = tuple((i, j) for i in range(len(names)) for j in range(i + 1, len(names)))
    results, differences = execute_joint(runs[0], problem, [algorithms[n] for n in names], pairs)
    for result in results:
        result.config["compare"] = {"algorithms": names}
    return Comparison(
        results=dict(zip(names, results)),
        _pairs={(names[i], names[j]): d for (i, j), d in zip(pairs, differences)},
    )
