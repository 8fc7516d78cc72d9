"""Simulation results: arrays, the run's configuration, atomic save and load."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import numpy as np

from fedsa_jax._io import atomic_write

ARRAY_FIELDS = (
    "rounds", "mse_mean", "mse_sem", "theta_mean", "theta_sem", "num_diverged", "final_theta", "theta_star",
    "bits_sent", "bits_delivered",
)


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
      bits_sent: ``(R,)`` uplink bits sent by all agents up to each recorded round
        (every agent sends one message of ``config["bits_per_message"]`` per round).
      bits_delivered: ``(R,)`` uplink bits delivered up to each recorded round,
        mean over seeds (erasures make it random).
      config: problem, algorithm, run options, package/JAX versions, PRNG
        settings and device count.
    """

    rounds: np.ndarray
    mse_mean: np.ndarray
    mse_sem: np.ndarray
    theta_mean: np.ndarray
    theta_sem: np.ndarray
    num_diverged: np.ndarray
    final_theta: np.ndarray
    theta_star: np.ndarray
    bits_sent: np.ndarray
    bits_delivered: np.ndarray
    config: dict[str, Any]

    @property
    def num_seeds(self) -> int:
        return int(self.final_theta.shape[0])

    def save(self, path) -> None:
        """Write an ``.npz`` file (arrays + JSON config) atomically."""

        def write(f):
            buf = io.BytesIO()
            arrays = {k: np.asarray(getattr(self, k)) for k in ARRAY_FIELDS}
            np.savez(buf, config_json=np.array(json.dumps(self.config, sort_keys=True)), **arrays)
            f.write(buf.getvalue())

        atomic_write(path, write)

    def table(self) -> list[dict[str, Any]]:
        """One row per recorded round: round, mse_mean, mse_sem, num_diverged."""
        return [
            {
                "round": int(r),
                "mse_mean": float(m),
                "mse_sem": float(s),
                "num_diverged": int(n),
            }
            for r, m, s, n in zip(self.rounds, self.mse_mean, self.mse_sem, self.num_diverged)
        ]


def load(path) -> SimulationResult:
    """Read a result written by :meth:`SimulationResult.save`."""
    with np.load(path, allow_pickle=False) as data:
        config = json.loads(str(data["config_json"]))
        arrays = {k: data[k] for k in ARRAY_FIELDS}
    return SimulationResult(config=config, **arrays)
