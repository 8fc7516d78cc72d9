"""Simulation results: arrays, the run's configuration, atomic save and load."""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from typing import Any

import numpy as np

from fedsa_jax import _validate
from fedsa_jax._io import DamagedFileError, atomic_savez, atomic_write, json_text, read_npz
from fedsa_jax.stats import QUANTILE_LEVELS, bca_interval, check_level, t_interval

__all__ = ["X_AXES", "MetricStats", "SimulationResult", "load"]

COUNT_NAMES = (
    "communications",
    "messages_delivered",
    "uplink_bits_sent",
    "uplink_bits_delivered",
    "samples",
    "downlink_bits_sent",
    "downlink_bits_delivered",
)  # RoundInfo sums, in its order
BIT_TOTALS = ("bits_sent", "bits_delivered")  # uplink + downlink
ARRAY_FIELDS = (
    "rounds",
    "mse_mean",
    "mse_sem",
    "theta_mean",
    "theta_sem",
    "num_diverged",
    "final_theta",
    "theta_star",
    "mse_quantiles",
    "seed_mse",
    *COUNT_NAMES,
    *BIT_TOTALS,
)
_METRIC_FIELDS = ("mean", "sem", "quantiles", "seeds")
_DAMAGED = "recompute it (a sweep recomputes its damaged results by itself) or restore it from a copy"
X_AXES = (
    "rounds",
    "communications",
    "samples",
    "bits_sent",
    "bits_delivered",
    "uplink_bits_sent",
    "uplink_bits_delivered",
    "downlink_bits_sent",
    "downlink_bits_delivered",
)


def short_repr(obj, summary: str) -> str:
    """``Name(summary; field shape, ...)``: a dataclass of arrays in one line, each array by its shape,
    each dict by its keys (``print(result)`` would otherwise print every array)."""
    parts = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, np.ndarray):
            parts.append(f"{field.name} {value.shape}")
        elif isinstance(value, dict) and field.name != "config":
            parts.append(f"{field.name} [{', '.join(map(str, value))}]")
    return f"{type(obj).__name__}({summary}; {', '.join(parts)})"


def count_arrays(columns) -> dict[str, np.ndarray]:
    """The counts of a result from the driver's sums ``columns`` (one per :data:`COUNT_NAMES`), with
    the totals ``bits_sent`` and ``bits_delivered`` (uplink plus downlink)."""
    counts: dict[str, np.ndarray] = dict(zip(COUNT_NAMES, columns, strict=True))
    for total in BIT_TOTALS:
        counts[total] = counts[f"uplink_{total}"] + counts[f"downlink_{total}"]
    return counts


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
        ``(R,)`` uplink messages sent and delivered, bits sent and delivered (uplink plus
        downlink: ``uplink_bits_sent + downlink_bits_sent``, beside them, and the same for
        delivered; the downlink's are 0 without a compressed downlink, and a broadcast counts once
        per receiving agent), and observations drawn by all agents up to each recorded round, as the
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
    uplink_bits_sent: np.ndarray = None  # pyright: ignore[reportAssignmentType] (filled in __post_init__)
    uplink_bits_delivered: np.ndarray = None  # pyright: ignore[reportAssignmentType]
    downlink_bits_sent: np.ndarray = None  # pyright: ignore[reportAssignmentType]
    downlink_bits_delivered: np.ndarray = None  # pyright: ignore[reportAssignmentType]

    quantile_levels = QUANTILE_LEVELS

    def __repr__(self) -> str:
        """One line: the algorithm, the seeds, the rounds, the final MSE, each array's shape."""
        name = self.config.get("algorithm", {}).get("algorithm", "?") if self.config else "?"
        return short_repr(
            self,
            f"{name}, {self.num_seeds} seeds ({int(self.num_diverged[-1])} diverged), rounds "
            f"0..{int(self.rounds[-1])} ({len(self.rounds)} recorded), final MSE "
            f"{self.mse_mean[-1]:.4g} +- {self.mse_sem[-1]:.2g}",
        )

    def __post_init__(self):
        """Counts per direction left out (a result of an older version): all uplink, no downlink."""
        for total in BIT_TOTALS:
            if getattr(self, f"downlink_{total}") is None:
                object.__setattr__(self, f"downlink_{total}", np.zeros_like(getattr(self, total)))
            if getattr(self, f"uplink_{total}") is None:
                up = getattr(self, total) - getattr(self, f"downlink_{total}")
                object.__setattr__(self, f"uplink_{total}", up)

    @property
    def num_seeds(self) -> int:
        return int(self.final_theta.shape[0])

    @property
    def privacy(self) -> dict[str, Any] | None:
        """The run's privacy loss with a privacy mechanism on the uplink
        (:mod:`fedsa_jax.channel.accounting`):
        ``epsilon`` at ``delta`` of its ``releases``, the ``mechanism``, the neighbouring ``relation``,
        the ``event`` composed and the ``accountant``; None without one (``config["privacy"]``)."""
        return self.config.get("privacy")

    def quantile(self, level: float) -> np.ndarray:
        """``(R,)`` the recorded quantile of the squared error at ``level`` (one of ``quantile_levels``)."""
        if level not in self.quantile_levels:
            raise ValueError(f"level={level!r} is invalid: expected one of {self.quantile_levels}")
        return self.mse_quantiles[:, self.quantile_levels.index(level)]

    def mse_interval(self, level: float = 0.95, method: str = "t") -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)``, each ``(R,)``: a confidence interval for the MSE at every recorded round.

        ``method="t"``: Student's ``mse_mean -+ t_{n-1} mse_sem`` over the ``n`` non-diverged seeds,
        from the streamed statistics (any run). ``method="bootstrap"``: the BCa bootstrap over seeds
        (:func:`fedsa_jax.stats.bca_interval`, 2000 resamples, a fixed generator), from the kept
        seeds, so it needs every seed kept (``keep_seeds=num_seeds``). Which one covers at which
        seed count is measured against exact MSEs in ``benchmarks/coverage.py``.
        """
        level = check_level(level)
        method = _validate.choice("method", method, ("t", "bootstrap"))
        if method == "t":
            return t_interval(self.mse_mean, self.mse_sem, self.num_seeds - self.num_diverged, level)
        if self.seed_mse.shape[1] != self.num_seeds:
            _validate.fail(
                "method",
                method,
                f"the bootstrap resamples every seed's values: {self.seed_mse.shape[1]} of "
                f"{self.num_seeds} seeds kept; run with keep_seeds=num_seeds, or use method='t'",
            )
        return bca_interval(self.seed_mse, level)

    def save(self, path) -> None:
        """Write an ``.npz`` file (arrays + JSON config) atomically, with the 95 % t interval of the
        MSE (``mse_low``, ``mse_high``; recomputed on load)."""

        arrays = {k: np.asarray(getattr(self, k)) for k in ARRAY_FIELDS}
        arrays["mse_low"], arrays["mse_high"] = self.mse_interval()
        for name, stats in self.metrics.items():
            arrays.update({f"metric__{name}__{f}": np.asarray(getattr(stats, f)) for f in _METRIC_FIELDS})
        atomic_savez(
            path, config_json=np.array(json_text(self.config, indent=None, sort_keys=True)), **arrays
        )

    def table(self) -> dict[str, np.ndarray]:
        """A tidy per-round table: column name -> ``(R,)`` array, one row per recorded round.

        Columns: ``round``, ``communications``, ``samples``, ``bits_sent``,
        ``bits_delivered`` (uplink plus downlink), ``mse_mean``, ``mse_sem``, ``mse_low``,
        ``mse_high`` (the 95 % t interval, :meth:`mse_interval`), ``mse_q05`` .. ``mse_q95``,
        ``num_diverged``, ``theta_mean_<i>``, ``theta_sem_<i>``, then for each metric
        ``<name>_mean``, ``<name>_sem`` (and ``<name>_q05`` .. when recorded), and last
        ``uplink_bits_sent``, ``uplink_bits_delivered``, ``downlink_bits_sent``,
        ``downlink_bits_delivered``.
        ``pandas.DataFrame(result.table())`` turns it into a data frame; :meth:`to_csv` writes it.
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
        cols["mse_low"], cols["mse_high"] = self.mse_interval()
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
        for way in ("uplink", "downlink"):  # last: the columns before them keep their places
            for total in BIT_TOTALS:
                cols[f"{way}_{total}"] = getattr(self, f"{way}_{total}")
        return {k: np.asarray(v) for k, v in cols.items()}

    def to_csv(self, path) -> None:
        """Write :meth:`table` as CSV (header row, full float precision), atomically."""
        write_csv(path, self.table())


def write_csv(path, cols: dict[str, np.ndarray]) -> None:
    """Columns ``name -> (R,)`` as CSV (header row, full float precision), written atomically."""

    def write(f):
        f.write(",".join(cols) + "\n")
        for row in zip(*cols.values()):
            f.write(",".join(repr(v.item()) for v in row) + "\n")

    atomic_write(path, write, mode="w")


def recorded_rounds(num_rounds: int, record_every: int) -> np.ndarray:
    """``0, r, 2r, ...`` and always the last round: a result's ``rounds``."""
    rounds = list(range(0, num_rounds + 1, record_every))
    if rounds[-1] != num_rounds:
        rounds.append(num_rounds)
    return np.asarray(rounds, dtype=np.int64)


def load(path) -> SimulationResult:
    """Read a result written by :meth:`SimulationResult.save` (older files load too: NaN
    quantiles, counts from the built-in algorithms' formulas, no metrics).

    Raises ``FileNotFoundError`` for a missing file, and a ``ValueError``
    (its subclass ``DamagedFileError``) for a damaged file or one that
    fedsa_jax did not write, saying so, naming the field at fault and what to do.
    Every array is checked against the schema: its dtype, and its shape against
    the recorded rounds ``R``, the dimension ``d``, the seeds ``n`` and the kept
    seeds ``K`` (``rounds`` itself is ``0, r, 2r, ..., num_rounds``); the
    configuration has the keys every version wrote; each metric it lists has all
    its arrays; and no value is one a run cannot produce (:func:`_check_values`).
    """
    required = (
        "config_json",
        "rounds",
        "mse_mean",
        "mse_sem",
        "theta_mean",
        "theta_sem",
        "num_diverged",
        "final_theta",
        "theta_star",
        "bits_sent",
        "bits_delivered",
    )
    data = read_npz(path, "result", _DAMAGED, required=required)
    try:
        config = _config(data["config_json"])
        metrics = _metric_arrays(data, config)
        _check_shapes(data, config, metrics)
        arrays = {k: data[k] for k in ARRAY_FIELDS if k in data}
        R = len(arrays["rounds"])
        arrays.setdefault("mse_quantiles", np.full((R, len(QUANTILE_LEVELS)), np.nan))
        arrays.setdefault("seed_mse", np.zeros((R, 0)))
        arrays.update(_counts(arrays, config))
        _check_directions(arrays)
        _check_values(arrays, config["num_seeds"])
        _check_privacy(config.get("privacy"))
    except ValueError as err:
        raise DamagedFileError(
            f"{str(path)!r} is damaged or not a fedsa_jax result file ({err}); {_DAMAGED}"
        ) from None
    metrics = {m: MetricStats(**fields) for m, fields in metrics.items()}
    return SimulationResult(config=config, metrics=metrics, **arrays)


# keys every version of the file wrote, and their JSON types (an int is not a bool)
_CONFIG_KEYS = {
    "problem": dict,
    "algorithm": dict,
    "num_rounds": int,
    "num_seeds": int,
    "record_every": int,
    "theta0": list,
    "dtype": str,
    "prng": dict,
}
# array -> (kind: "f" float32/64, "i" integer, "r" either; shape in R recorded rounds, d dimension,
# n seeds, K kept seeds)
_Q = len(QUANTILE_LEVELS)
_SHAPES = {
    "rounds": ("i", ("R",)),
    "mse_mean": ("f", ("R",)),
    "mse_sem": ("f", ("R",)),
    "theta_mean": ("f", ("R", "d")),
    "theta_sem": ("f", ("R", "d")),
    "num_diverged": ("i", ("R",)),
    "final_theta": ("f", ("n", "d")),
    "theta_star": ("f", ("d",)),
    "mse_quantiles": ("f", ("R", _Q)),
    "seed_mse": ("f", ("R", "K")),
    **{name: ("r", ("R",)) for name in (*COUNT_NAMES, *BIT_TOTALS)},
    "mse_low": ("f", ("R",)),  # files written since intervals were recorded
    "mse_high": ("f", ("R",)),
}
_METRIC_SHAPES = {
    "mean": ("f", ("R",)),
    "sem": ("f", ("R",)),
    "quantiles": ("f", ("R", _Q)),
    "seeds": ("f", ("R", "K")),
}
_KINDS = {"f": "float32 or float64", "i": "integers", "r": "numbers"}


def _config(text: np.ndarray) -> dict[str, Any]:
    """The configuration stored in ``config_json``, with the keys and types the loader relies on."""
    if text.dtype.kind != "U" or text.ndim != 0:
        raise ValueError(f"config_json is an array of {text.dtype} and shape {text.shape}, expected a string")
    config = json.loads(str(text))
    if not isinstance(config, dict):
        raise ValueError("config_json is not a JSON object")
    for key, kind in _CONFIG_KEYS.items():
        value = config.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(
                f"config_json has no {kind.__name__} {key!r}"
                if key not in config
                else f"config_json's {key!r} is {reprlib.repr(value)}, expected a {kind.__name__}"
            )
    for key in ("num_rounds", "num_seeds", "record_every"):
        if config[key] < 1:
            raise ValueError(f"config_json's {key!r} is {config[key]!r}, expected an integer >= 1")
    if config["dtype"] not in ("float32", "float64"):
        raise ValueError(f"config_json's 'dtype' is {config['dtype']!r}, expected 'float32' or 'float64'")
    listed, keep = config.get("metrics", []), config.get("keep_seeds", 0)
    if not isinstance(listed, list) or not all(isinstance(m, str) for m in listed):
        raise ValueError(f"config_json's 'metrics' is {reprlib.repr(listed)}, expected a list of names")
    if not isinstance(keep, int) or isinstance(keep, bool) or not 0 <= keep <= config["num_seeds"]:
        raise ValueError(
            f"config_json's 'keep_seeds' is {reprlib.repr(keep)}, expected an integer in [0, num_seeds]"
        )
    return config


def _metric_arrays(data: dict[str, np.ndarray], config: dict) -> dict[str, dict[str, np.ndarray]]:
    """``name -> {field: array}`` from the ``metric__<name>__<field>`` arrays (a name may hold ``__``:
    the field is after the last one); every metric the configuration lists, and only those, complete."""
    found: dict[str, dict[str, np.ndarray]] = {}
    for key in data:
        if key.startswith("metric__"):
            name, _, field = key[len("metric__") :].rpartition("__")
            if not name or field not in _METRIC_FIELDS:
                raise ValueError(f"unexpected array {key!r}")
            found.setdefault(name, {})[field] = data[key]
    listed = config.get("metrics", sorted(found))  # files written before metrics were listed: as found
    for name in found:
        if name not in listed:
            raise ValueError(
                f"array 'metric__{name}__{next(iter(found[name]))}' is of no metric that "
                f"config_json lists ({reprlib.repr(listed)})"
            )
    for name in listed:
        for field in _METRIC_FIELDS:
            if field not in found.get(name, {}):
                raise ValueError(
                    f"no 'metric__{name}__{field}' array, for the metric {name!r} that config_json lists"
                )
    return {name: {f: found[name][f] for f in _METRIC_FIELDS} for name in listed}


def _check_shapes(data: dict[str, np.ndarray], config: dict, metrics: dict[str, dict]) -> None:
    """Every array's dtype and shape (:data:`_SHAPES`); ``rounds`` the recorded rounds of the configuration.
    A size is the configuration's (``d``, ``n``, ``K``) or that of the first array that has it (``R``:
    ``rounds``)."""
    fields = [(k, data[k], _SHAPES[k]) for k in _SHAPES if k in data]
    fields += [
        (f"metric__{m}__{f}", a, _METRIC_SHAPES[f]) for m, fs in metrics.items() for f, a in fs.items()
    ]
    sizes: dict[str, int | None] = {
        "R": None,
        "d": len(config["theta0"]),
        "n": config["num_seeds"],
        "K": config.get("keep_seeds"),
    }
    for key, a, (kind, shape) in fields:
        ok_kind = {
            "f": a.dtype in (np.float32, np.float64),
            "i": a.dtype.kind in "iu",
            "r": a.dtype.kind in "iu" or a.dtype in (np.float32, np.float64),
        }[kind]
        if not ok_kind:
            raise ValueError(f"{key} has dtype {a.dtype}, expected {_KINDS[kind]}")
        for axis, s in enumerate(shape):
            if isinstance(s, str) and sizes[s] is None and a.ndim == len(shape):
                sizes[s] = a.shape[axis]
        expected = tuple(sizes[s] if isinstance(s, str) else s for s in shape)
        if a.shape != expected:
            raise ValueError(
                f"{key} has shape {a.shape}, expected {expected} (R = {sizes['R']} recorded "
                f"rounds, d = {sizes['d']}, n = {sizes['n']} seeds)"
            )
    T, r, R = config["num_rounds"], config["record_every"], sizes["R"]
    if R != T // r + 1 + (T % r != 0) or not np.array_equal(data["rounds"], recorded_rounds(T, r)):
        raise ValueError(
            f"rounds is not 0, {r}, {2 * r}, ..., {T} (config_json's record_every and num_rounds)"
        )


def _check_directions(arrays: dict[str, np.ndarray]) -> None:
    """The bits per direction: all four or none (a file written before the downlink), and the uplink's
    plus the downlink's equal to the totals."""
    names = [f"{way}_{total}" for way in ("uplink", "downlink") for total in BIT_TOTALS]
    present = [k for k in names if k in arrays]
    if present and len(present) < len(names):
        missing = next(k for k in names if k not in arrays)
        raise ValueError(f"no {missing!r} array, though there is a {present[0]!r} array")
    for total in BIT_TOTALS if present else ():
        if not np.array_equal(arrays[f"uplink_{total}"] + arrays[f"downlink_{total}"], arrays[total]):
            raise ValueError(f"uplink_{total} + downlink_{total} is not {total}")


def _check_values(arrays: dict[str, np.ndarray], num_seeds: int) -> None:
    """Values no run writes (a file edited by hand or by another program): a negative MSE (mean,
    quantile or kept seed's), a negative standard error, one that is NaN at a round where at least two
    seeds did not diverge (it is defined there; NaN only where fewer than two are left), a diverged
    count outside ``[0, num_seeds]``, a negative count of messages, bits or samples."""

    def first(bad: np.ndarray) -> int:
        return int(arrays["rounds"][np.argwhere(bad)[0][0]])

    diverged = arrays["num_diverged"]
    if np.any((diverged < 0) | (diverged > num_seeds)):
        bad = (diverged < 0) | (diverged > num_seeds)
        raise ValueError(
            f"num_diverged is {int(diverged[bad][0])} at round {first(bad)}, expected a count in "
            f"[0, {num_seeds}] (config_json's num_seeds)"
        )
    for key in ("mse_mean", "mse_quantiles", "seed_mse", "mse_sem", "theta_sem"):
        with np.errstate(invalid="ignore"):
            bad = arrays[key] < 0
        if np.any(bad):
            what = "standard error" if key.endswith("sem") else "MSE"
            raise ValueError(f"{key} is negative at round {first(bad)}, which no {what} can be")
    defined = (num_seeds - diverged) >= 2
    for key in ("mse_sem", "theta_sem"):
        nan = np.isnan(arrays[key]).reshape(len(diverged), -1).any(axis=1) & defined
        if np.any(nan):
            raise ValueError(
                f"{key} is NaN at round {first(nan)}, where {num_seeds - int(diverged[nan][0])} seeds "
                "did not diverge (a standard error is NaN only with fewer than two)"
            )
    for key in (k for k in (*COUNT_NAMES, *BIT_TOTALS) if k in arrays):  # older files lack some
        with np.errstate(invalid="ignore"):
            bad = ~(np.asarray(arrays[key]) >= 0)
        if np.any(bad):
            raise ValueError(f"{key} is {arrays[key][bad][0]} at round {first(bad)}, expected a count >= 0")


def _check_privacy(spent: Any) -> None:
    """The privacy record (``config["privacy"]``, :func:`fedsa_jax.channel.accounting.report`) as a run writes
    it: a table whose epsilon is a number >= 0 (or None, with the reason), whose delta is in (0, 1) and
    whose releases are a count."""
    if spent is None:
        return

    def number(value: Any, low: float, high: float = math.inf) -> bool:
        real = isinstance(value, (int, float)) and not isinstance(value, bool)
        return real and low <= value <= high  # NaN fails both

    if not isinstance(spent, dict):
        raise ValueError(f"config_json's 'privacy' is {reprlib.repr(spent)}, expected a table")
    eps, delta, releases = spent.get("epsilon"), spent.get("delta", 0.5), spent.get("releases")
    if eps is None and isinstance(spent.get("reason"), str):
        pass
    elif not number(eps, 0.0):
        raise ValueError(f"config_json's privacy.epsilon is {reprlib.repr(eps)}, expected a number >= 0")
    if not number(delta, 1e-300, 1.0 - 1e-16):
        raise ValueError(f"config_json's privacy.delta is {reprlib.repr(delta)}, expected a number in (0, 1)")
    if not (isinstance(releases, int) and not isinstance(releases, bool) and releases >= 0):
        raise ValueError(f"config_json's privacy.releases is {reprlib.repr(releases)}, expected a count >= 0")


def _counts(arrays: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """The counts a file holds, or for a file written before the algorithms reported their counts,
    those of the built-in algorithms' formulas."""
    present = [k for k in ("communications", "messages_delivered", "samples") if k in arrays]
    if present:
        missing = [k for k in ("communications", "messages_delivered", "samples") if k not in arrays]
        if missing:
            raise ValueError(f"no {missing[0]!r} array, though there is a {present[0]!r} array")
        return {}
    alg, prob, bits = config["algorithm"], config["problem"], config.get("bits_per_message")
    agents, local, skip = prob.get("num_agents"), alg.get("num_local_steps", 1), alg.get("skip", 1)
    for key, value in (
        ("bits_per_message", bits),
        ("problem.num_agents", agents),
        ("algorithm.num_local_steps", local),
        ("algorithm.skip", skip),
    ):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < np.inf:
            raise ValueError(
                f"config_json's {key!r} is {reprlib.repr(value)}, expected a number >= 0 (a "
                "file without 'communications' counts from it)"
            )
    communications = arrays["rounds"] * int(agents)
    skip = int(skip) if prob.get("sampling") == "markov" else 1
    # numbers, checked above
    local_steps, bits_per_message = int(local), int(bits)  # pyright: ignore[reportArgumentType]
    return {
        "communications": communications,
        "samples": communications * local_steps * skip,
        "messages_delivered": arrays["bits_delivered"] / max(bits_per_message, 1),
    }
