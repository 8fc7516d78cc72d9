"""Simulation results: arrays, the run's configuration, atomic save and load."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from fedsa_jax._io import DamagedFileError, atomic_savez, atomic_write, json_text, read_npz
from fedsa_jax.stats import QUANTILE_LEVELS

COUNT_NAMES = ("communications", "messages_delivered", "bits_sent", "bits_delivered", "samples")  # RoundInfo sums
ARRAY_FIELDS = (
    "rounds", "mse_mean", "mse_sem", "theta_mean", "theta_sem", "num_diverged", "final_theta", "theta_star",
    "mse_quantiles", "seed_mse", *COUNT_NAMES,
)
METRIC_FIELDS = ("mean", "sem", "quantiles", "seeds")
_DAMAGED = "recompute it (a sweep recomputes its damaged results by itself) or restore it from a copy"
X_AXES = ("rounds", "communications", "samples", "bits_sent", "bits_delivered")


@dataclasses.dataclass(frozen=True)
class MetricStats:
    """A recorded metric (``fj.simulate(..., metrics=...)``) over seeds, per recorded round."""

    mean: np.ndarray  # (R,) mean over non-diverged seeds
    sem: np.ndarray  # (R,) its standard error
    quantiles: np.ndarray  # (R, 5) at QUANTILE_LEVELS (NaN if off, or if the metric went negative)
    seeds: np.ndarray  # (R, K) the first K seeds' values (``keep_seeds``; K = 0 by default)


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """Monte Carlo statistics of one ``simulate`` call (numpy arrays).

    Attributes:
      rounds: ``(R,)`` recorded round indices; 0 and the last round included.
      mse_mean: ``(R,)`` mean over non-diverged seeds of ``|theta_t - theta_star|^2``.
      mse_sem: ``(R,)`` its standard error over seeds.
      theta_mean: ``(R, d)`` mean over non-diverged seeds of ``theta_t``.
      theta_sem: ``(R, d)`` its standard error, per coordinate.
      num_diverged: ``(R,)`` seeds whose iterate is non-finite or above the
        divergence threshold at that round (left out of the means).
      final_theta: ``(num_seeds, d)`` every seed's last iterate.
      theta_star: ``(d,)`` the problem's solution.
      communications, messages_delivered, bits_sent, bits_delivered, samples:
        ``(R,)`` uplink messages sent and delivered, bits sent and delivered, and
        observations drawn by all agents up to each recorded round, as the
        algorithm reported them round by round (:class:`~fedsa_jax.algorithms.RoundInfo`),
        mean over seeds (random when erasures or random communication make them so).
        For the built-in algorithms: ``t N`` messages of
        ``config["bits_per_message"]`` bits, ``t N H`` observations (times
        ``skip`` under Markov sampling).
      mse_quantiles: ``(R, 5)`` quantiles over non-diverged seeds of the squared
        error at levels ``QUANTILE_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)``, from a
        log-binned histogram (exact to one bin, a factor 1.15, between 1e-40 and
        1e20; :mod:`fedsa_jax.stats`); NaN if not recorded.
      config: problem, algorithm, run options, package/JAX versions, PRNG
        settings and device count.
      metrics: ``name -> MetricStats`` for the metrics recorded with ``simulate(..., metrics=...)``.
      seed_mse: ``(R, K)`` squared error of the first K seeds (``keep_seeds=K``; K = 0 by default).
    """

    rounds: np.ndarray
    mse_mean: np.ndarray
    mse_sem: np.ndarray
    theta_mean: np.ndarray
    theta_sem: np.ndarray
    num_diverged: np.ndarray
    final_theta: np.ndarray
    theta_star: np.ndarray
    mse_quantiles: np.ndarray
    config: dict[str, Any]
    communications: np.ndarray
    messages_delivered: np.ndarray
    bits_sent: np.ndarray
    bits_delivered: np.ndarray
    samples: np.ndarray
    seed_mse: np.ndarray
    metrics: dict[str, MetricStats] = dataclasses.field(default_factory=dict)

    quantile_levels = QUANTILE_LEVELS

    @property
    def num_seeds(self) -> int:
        return int(self.final_theta.shape[0])

    def quantile(self, level: float) -> np.ndarray:
        """``(R,)`` the recorded quantile of the squared error at ``level`` (one of ``quantile_levels``)."""
        if level not in self.quantile_levels:
            raise ValueError(f"level={level!r} is invalid: expected one of {self.quantile_levels}")
        return self.mse_quantiles[:, self.quantile_levels.index(level)]

    def save(self, path) -> None:
        """Write an ``.npz`` file (arrays + JSON config) atomically."""

        arrays = {k: np.asarray(getattr(self, k)) for k in ARRAY_FIELDS}
        for name, stats in self.metrics.items():
            arrays.update({f"metric__{name}__{f}": np.asarray(getattr(stats, f)) for f in METRIC_FIELDS})
        atomic_savez(path, config_json=np.array(json_text(self.config, indent=None, sort_keys=True)), **arrays)

    def table(self) -> dict[str, np.ndarray]:
        """A tidy per-round table: column name -> ``(R,)`` array, one row per recorded round.

        Columns: ``round``, ``communications``, ``samples``, ``bits_sent``,
        ``bits_delivered``, ``mse_mean``, ``mse_sem``, ``mse_q05`` .. ``mse_q95``,
        ``num_diverged``, ``theta_mean_<i>``, ``theta_sem_<i>``, then for each metric
        ``<name>_mean``, ``<name>_sem`` (and ``<name>_q05`` .. when recorded). ``pandas.DataFrame(result.table())``
        turns it into a data frame; :meth:`to_csv` writes it.
        """
        cols: dict[str, np.ndarray] = {
            "round": self.rounds,
            "communications": self.communications,
            "samples": self.samples,
            "bits_sent": self.bits_sent,
            "bits_delivered": self.bits_delivered,
            "mse_mean": self.mse_mean,
            "mse_sem": self.mse_sem,
        }
        for j, q in enumerate(self.quantile_levels):
            cols[f"mse_q{round(100 * q):02d}"] = self.mse_quantiles[:, j]
        cols["num_diverged"] = self.num_diverged
        for i in range(self.theta_mean.shape[1]):
            cols[f"theta_mean_{i}"] = self.theta_mean[:, i]
        for i in range(self.theta_mean.shape[1]):
            cols[f"theta_sem_{i}"] = self.theta_sem[:, i]
        for name, stats in self.metrics.items():
            cols[f"{name}_mean"] = stats.mean
            cols[f"{name}_sem"] = stats.sem
            if not np.all(np.isnan(stats.quantiles)):
                for j, q in enumerate(self.quantile_levels):
                    cols[f"{name}_q{round(100 * q):02d}"] = stats.quantiles[:, j]
        return {k: np.asarray(v) for k, v in cols.items()}

    def to_csv(self, path) -> None:
        """Write :meth:`table` as CSV (header row, full float precision), atomically."""
        cols = self.table()

        def write(f):
            f.write(",".join(cols) + "\n")
            for row in zip(*cols.values()):
                f.write(",".join(repr(v.item()) for v in row) + "\n")

        atomic_write(path, write, mode="w")


def load(path) -> SimulationResult:
    """Read a result written by :meth:`SimulationResult.save` (older files load too: NaN
    quantiles, counts from the built-in algorithms' formulas, no metrics).

    Raises ``FileNotFoundError`` for a missing file, and a ``ValueError``
    (:class:`fedsa_jax._io.DamagedFileError`) for a damaged file or one that
    fedsa_jax did not write, saying so and what to do.
    """
    required = ("config_json", "rounds", "mse_mean", "mse_sem", "theta_mean", "theta_sem", "num_diverged",
                "final_theta", "theta_star", "bits_sent", "bits_delivered")
    data = read_npz(path, "result", _DAMAGED, required=required)
    try:
        config = json.loads(str(data["config_json"]))
        if not isinstance(config, dict):
            raise ValueError("its configuration is not a JSON object")
    except ValueError as err:
        raise DamagedFileError(f"{str(path)!r} is damaged or not a fedsa_jax result file ({err}); {_DAMAGED}") from None
    arrays = {k: data[k] for k in ARRAY_FIELDS if k in data}
    names = sorted({k.split("__")[1] for k in data if k.startswith("metric__")})
    metrics = {m: MetricStats(*(data[f"metric__{m}__{f}"] for f in METRIC_FIELDS)) for m in names}
    R = len(arrays["rounds"])
    arrays.setdefault("mse_quantiles", np.full((R, len(QUANTILE_LEVELS)), np.nan))
    arrays.setdefault("seed_mse", np.zeros((R, 0)))
    if "communications" not in arrays:  # written before the algorithms reported their counts
        alg, prob = config["algorithm"], config["problem"]
        arrays["communications"] = arrays["rounds"] * int(prob["num_agents"])
        arrays["messages_delivered"] = arrays["bits_delivered"] / max(int(config["bits_per_message"]), 1)
        skip = int(alg.get("skip", 1)) if prob.get("sampling") == "markov" else 1
        arrays["samples"] = arrays["communications"] * int(alg.get("num_local_steps", 1)) * skip
    return SimulationResult(config=config, metrics=metrics, **arrays)
