"""Statistics over the seed axis: mergeable moments computed in the kernel, combined on the host.

At every recorded round the kernel reduces one batch of seeds (possibly sharded
over devices) to :class:`Moments`: the number of non-diverged seeds, their mean
and sum of squared deviations (two-pass, so float32 stays accurate) of the
squared error and of each coordinate of theta. Batches run one after the other
are merged on the host in float64 with Chan et al.'s pairwise update, so the
statistics do not depend on how the seeds were split.

For quantile bands the kernel also counts the squared errors in a fixed
log-spaced histogram (``HIST_PER_DECADE`` bins per decade between
``10**HIST_LOW`` and ``10**HIST_HIGH``; values outside fall in the end bins) and
keeps their minimum and maximum. Counts add across batches and devices, so
quantiles are mergeable too; they are read off the cumulative counts with
geometric interpolation inside a bin and clipped to [min, max], so inside the
range they are exact up to one bin width, a factor ``10**(1/HIST_PER_DECADE)``
(15 %; for smooth distributions the interpolation does much better). The
histogram costs ``4 HIST_BINS`` bytes per recorded round, so it can be turned
off (``simulate(..., quantiles=False)``).

Diverged seeds (non-finite iterate, or squared error above the threshold) are
counted and left out of every mean, so one exploding seed never turns a curve
into NaN. Padding seeds (``valid == False``) are ignored entirely.

Reference: T. F. Chan, G. H. Golub, R. J. LeVeque, "Updating formulae and a
pairwise algorithm for computing sample variances", 1979.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate

__all__ = [
    "QUANTILE_LEVELS",
    "Fit",
    "Moments",
    "bca_interval",
    "divergence",
    "finalize",
    "merge",
    "rate",
    "speedup",
    "t_interval",
    "wilson_interval",
]


HIST_LOW, HIST_HIGH, HIST_PER_DECADE = -40, 20, 16
HIST_BINS = (HIST_HIGH - HIST_LOW) * HIST_PER_DECADE
QUANTILE_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)


# A field of Moments is a jax.Array inside the kernel and a numpy array once merged on the host.
_HostOrDevice = Any


class Moments(NamedTuple):
    """One recorded round's statistics of a batch of seeds. The per-seed *values* are the
    squared error ``|theta - theta_star|^2`` (column 0) and the recorded metrics."""

    n_ok: _HostOrDevice  # () int32, non-diverged valid seeds
    val_mean: _HostOrDevice  # (V,) mean of each value over non-diverged seeds
    val_m2: _HostOrDevice  # (V,) sum of squared deviations
    theta_mean: _HostOrDevice  # (d,)
    theta_m2: _HostOrDevice  # (d,)
    num_diverged: _HostOrDevice  # () int32
    count_digits: _HostOrDevice  # (C, 8) uint32: base-256 digits of the valid seeds' summed 64-bit counters
    val_hist: _HostOrDevice  # (V, HIST_BINS) or (V, 0) int32 counts of non-diverged values per log bin
    val_min: _HostOrDevice  # (V,) smallest non-diverged value (+inf if none)
    val_max: _HostOrDevice  # (V,) largest (-inf if none)
    kept: _HostOrDevice  # (K, V) the values of the batch's first K seeds (``keep_seeds``)


_COUNTER_DIGITS = 8  # a 64-bit counter as 8 base-256 digits; a digit's sum over 2**24 seeds fits in uint32


def add_counts(counters: jax.Array, increments: jax.Array) -> jax.Array:
    """Add ``increments (..., C)`` (int32, >= 0) to 64-bit counters ``(..., C, 2)`` held as uint32
    ``(low, high)`` words: exact for any number of rounds, without ``jax_enable_x64``."""
    inc = increments.astype(jnp.uint32)
    low = counters[..., 0] + inc
    high = counters[..., 1] + (low < inc).astype(jnp.uint32)  # carry on wrap-around
    return jnp.stack([low, high], axis=-1)


def _counter_digits(counters: jax.Array, valid: jax.Array) -> jax.Array:
    """``(C, 8)`` uint32 sums over valid seeds of the base-256 digits of ``counters (B, C, 2)``."""
    shifts = jnp.arange(4, dtype=jnp.uint32) * 8
    digits = (counters[..., None] >> shifts) & jnp.uint32(0xFF)  # (B, C, 2, 4)
    digits = digits.reshape(counters.shape[:-1] + (_COUNTER_DIGITS,))
    return jnp.sum(jnp.where(valid[:, None, None], digits, jnp.uint32(0)), axis=0, dtype=jnp.uint32)


def counter_totals(count_digits) -> np.ndarray:
    """Exact float64 totals ``(..., C)`` from :class:`Moments`' ``count_digits`` (summed over batches)."""
    d = np.asarray(count_digits, np.float64)
    return np.sum(d * 256.0 ** np.arange(_COUNTER_DIGITS), axis=-1)


def seed_moments(
    theta, theta_star, threshold, valid, values, counters, quantiles: bool = True, keep: int = 0
) -> Moments:
    """Moments over the leading (seed) axis of ``theta (n, d)`` and ``values (n, V)`` (column 0:
    the squared error, which decides divergence), valid seeds only; ``counters (n, C, 2)``;
    ``quantiles=False``: empty histograms; ``keep``: the first ``keep`` seeds' values."""
    err = values[:, 0]
    ok = valid & jnp.isfinite(err) & (err <= threshold)
    n = jnp.sum(ok)
    n_f = jnp.maximum(n, 1).astype(err.dtype)
    okv = ok[:, None]

    first = jnp.argmax(ok)  # deviations from one seed's value: identical seeds give a mean exactly

    def mean_m2(x):  # equal to it and a sum of squared deviations of exactly 0
        shift = jnp.where(n > 0, x[first], 0.0)
        mean = shift + jnp.sum(jnp.where(okv, x - shift, 0.0), axis=0) / n_f
        return mean, jnp.sum(jnp.where(okv, (x - mean) ** 2, 0.0), axis=0)

    val_mean, val_m2 = mean_m2(values)
    theta_mean, theta_m2 = mean_m2(theta)
    diverged = jnp.sum(valid & ~ok).astype(jnp.int32)
    V = values.shape[1]
    if quantiles:
        log_v = jnp.log10(jnp.maximum(jnp.where(okv, values, 1.0), jnp.finfo(values.dtype).tiny))
        idx = jnp.clip(jnp.floor((log_v - HIST_LOW) * HIST_PER_DECADE), 0, HIST_BINS - 1).astype(jnp.int32)
        rows = jnp.broadcast_to(jnp.arange(V), idx.shape)
        hist = jnp.zeros((V, HIST_BINS), jnp.int32).at[rows, idx].add(okv.astype(jnp.int32))
    else:
        hist = jnp.zeros((V, 0), jnp.int32)
    val_min = jnp.min(jnp.where(okv, values, jnp.inf), axis=0)
    val_max = jnp.max(jnp.where(okv, values, -jnp.inf), axis=0)
    return Moments(
        n.astype(jnp.int32),
        val_mean,
        val_m2,
        theta_mean,
        theta_m2,
        diverged,
        _counter_digits(counters, valid),
        hist,
        val_min,
        val_max,
        values[:keep],
    )


def merge(parts: list[Moments]) -> Moments:
    """Combine batches' moments (numpy, float64; arrays may carry leading axes). ``kept`` comes
    from the first part (the batch holding the first seeds)."""
    n = sum(np.asarray(p.n_ok, np.float64) for p in parts)
    safe = np.maximum(n, 1.0)

    def pooled(mean_name, m2_name):
        means = [np.asarray(getattr(p, mean_name), np.float64) for p in parts]
        ns = [
            np.asarray(p.n_ok, np.float64).reshape(np.shape(p.n_ok) + (1,) * (m.ndim - np.ndim(p.n_ok)))
            for p, m in zip(parts, means)
        ]
        tot = safe.reshape(safe.shape + (1,) * (means[0].ndim - safe.ndim))
        base = np.where(ns[0] > 0, means[0], 0.0)  # pooled as deviations from one part's mean: equal means
        mean = base + sum(k * (m - base) for k, m in zip(ns, means)) / tot  # pool exactly
        m2 = sum(
            np.asarray(getattr(p, m2_name), np.float64) + k * (m - mean) ** 2
            for p, k, m in zip(parts, ns, means)
        )
        return mean, m2

    val_mean, val_m2 = pooled("val_mean", "val_m2")
    theta_mean, theta_m2 = pooled("theta_mean", "theta_m2")
    return Moments(
        n_ok=n,
        val_mean=val_mean,
        val_m2=val_m2,
        theta_mean=theta_mean,
        theta_m2=theta_m2,
        num_diverged=sum(np.asarray(p.num_diverged, np.int64) for p in parts),
        count_digits=sum(np.asarray(p.count_digits, np.float64) for p in parts),
        val_hist=sum(np.asarray(p.val_hist, np.int64) for p in parts),
        val_min=np.min([np.asarray(p.val_min, np.float64) for p in parts], axis=0),
        val_max=np.max([np.asarray(p.val_max, np.float64) for p in parts], axis=0),
        kept=np.asarray(parts[0].kept, np.float64),
    )


def hist_quantiles(hist: np.ndarray, lo: np.ndarray, hi: np.ndarray, levels=QUANTILE_LEVELS) -> np.ndarray:
    """Quantiles ``(..., len(levels))`` of the values counted in ``hist (..., HIST_BINS)``.

    The level-q quantile is the value below which a fraction q of the counts lie,
    interpolated geometrically inside its bin and clipped to the observed range
    ``[lo, hi]`` (so a constant sample gives its value exactly); NaN where nothing
    was counted.
    """
    hist = np.asarray(hist, np.float64)
    if hist.shape[-1] == 0:  # not recorded
        return np.full(hist.shape[:-1] + (len(levels),), np.nan)
    cum = np.cumsum(hist, axis=-1)
    total = cum[..., -1:]
    out = np.full(hist.shape[:-1] + (len(levels),), np.nan)
    for j, q in enumerate(levels):
        target = q * total
        k = np.minimum(np.sum(cum < target, axis=-1, keepdims=True), HIST_BINS - 1)
        below = np.take_along_axis(cum, k, -1) - np.take_along_axis(hist, k, -1)
        inside = np.take_along_axis(hist, k, -1)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.clip((target - below) / inside, 0.0, 1.0)
        log_q = HIST_LOW + (k + frac) / HIST_PER_DECADE
        out[..., j] = np.where(total > 0, 10.0**log_q, np.nan)[..., 0]
    with np.errstate(invalid="ignore"):
        return np.clip(out, np.asarray(lo)[..., None], np.asarray(hi)[..., None])


def finalize(m: Moments, num_seeds) -> dict[str, np.ndarray]:
    """Means and standard errors (NaN where no seed is left), per-value quantiles (NaN for a
    value that went negative: the histogram is logarithmic) and the counters' means over
    ``num_seeds`` seeds."""
    n = np.asarray(m.n_ok, np.float64)

    def with_sem(mean, m2):
        nd = n.reshape(n.shape + (1,) * (np.ndim(mean) - n.ndim))
        with np.errstate(invalid="ignore", divide="ignore"):
            sem = np.sqrt(m2 / (nd - 1) / nd)
        return np.where(nd == 0, np.nan, mean), np.where(nd > 1, sem, np.nan)

    val_mean, val_sem = with_sem(m.val_mean, m.val_m2)
    theta_mean, theta_sem = with_sem(m.theta_mean, m.theta_m2)
    quantiles = hist_quantiles(m.val_hist, m.val_min, m.val_max)
    quantiles = np.where((np.asarray(m.val_min) < 0)[..., None], np.nan, quantiles)
    return {
        "val_mean": val_mean,
        "val_sem": val_sem,  # undefined from fewer than 2 seeds
        "theta_mean": theta_mean,
        "theta_sem": theta_sem,
        "num_diverged": np.asarray(m.num_diverged, np.int64),
        "val_quantiles": quantiles,
        "counts": counter_totals(m.count_digits) / num_seeds,
        "kept": np.asarray(m.kept, np.float64),
    }


# ---- intervals and fits on the host (results of fj.simulate; numpy and scipy only) ----------------------


def check_level(level) -> float:
    """A confidence level in (0, 1)."""
    return _validate.real("level", level, low=0.0, high=1.0, low_open=True, high_open=True)


def t_interval(mean, sem, n, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``mean -+ t_{n-1, (1 + level)/2} sem``: Student's interval for a mean of ``n`` values."""
    from scipy import stats as scipy_stats

    with np.errstate(invalid="ignore"):
        t = scipy_stats.t.ppf((1 + level) / 2, np.maximum(np.asarray(n, np.float64) - 1, 1))
    return mean - t * sem, mean + t * sem


BOOTSTRAP_RESAMPLES = 2000


def bca_interval(
    values: np.ndarray, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
):
    """``(low, high)``, each ``(R,)``: the BCa bootstrap interval of the mean of ``values (R, n)``
    (rows: recorded rounds; columns: seeds; non-finite values left out).

    Efron's bias-corrected and accelerated percentile interval: with ``theta*_b`` the means of
    ``resamples`` resamples of the seeds (drawn with a fixed generator, so the interval is
    reproducible), ``z0 = Phi^-1(#{theta*_b < mean} / B)`` corrects the median bias and the
    jackknife acceleration of the mean, ``a = sum (x_i - m)^3 / (6 (sum (x_i - m)^2)^1.5)``, the
    skewness; the bounds are the ``Phi(z0 + (z0 + z) / (1 - a (z0 + z)))`` quantiles of
    ``theta*`` for ``z = -+ z_{(1+level)/2}``. Second-order accurate where the t interval is only
    first-order: it widens towards a long right tail, which the squared error of one seed has.
    """
    from scipy import stats as scipy_stats

    values = np.asarray(values, np.float64)
    rng = np.random.default_rng(seed)
    low, high = np.full(values.shape[0], np.nan), np.full(values.shape[0], np.nan)
    z = scipy_stats.norm.ppf((1 + level) / 2)
    for r, row in enumerate(values):
        x = row[np.isfinite(row)]
        n = x.size
        if n < 2:
            continue
        if np.all(x == x[0]):  # no spread: the interval is the value itself
            low[r] = high[r] = x[0]
            continue
        m = x.mean()
        dev = x - m
        ss = np.sum(dev**2)
        means = np.concatenate(
            [
                x[rng.integers(0, n, size=(k, n))].mean(axis=1)
                for k in np.diff(np.r_[0 : resamples : max(1, 2**22 // n), resamples])
                if k > 0
            ]
        )
        z0 = scipy_stats.norm.ppf(
            np.clip((np.sum(means < m) + 0.5 * np.sum(means == m)) / means.size, 1e-9, 1 - 1e-9)
        )
        a = np.sum(dev**3) / (6 * ss**1.5)
        alphas = [scipy_stats.norm.cdf(z0 + (z0 + s) / (1 - a * (z0 + s))) for s in (-z, z)]
        low[r], high[r] = np.quantile(means, alphas)
    return low, high


def wilson_interval(successes, trials, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval for a binomial proportion ``successes / trials``: the ``p`` with
    ``|p_hat - p| <= z sqrt(p (1 - p) / n)``, which stays inside [0, 1] and keeps its coverage for
    proportions near 0 or 1 (a handful of diverged seeds), unlike ``p_hat -+ z sqrt(p_hat(1 - p_hat)/n)``."""
    from scipy import stats as scipy_stats

    k, n = np.asarray(successes, np.float64), np.asarray(trials, np.float64)
    z = scipy_stats.norm.ppf((1 + level) / 2)
    p = k / n
    center = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return np.where(k == 0, 0.0, center - half), np.where(k == n, 1.0, center + half)


class Fit(NamedTuple):
    """A fitted slope with its interval (:func:`rate`, :func:`speedup`)."""

    slope: float
    interval: tuple[float, float]  # at ``level``
    level: float
    method: str  # how the interval was obtained
    x: np.ndarray  # the abscissae fitted: log(t + t0), or log N
    y: np.ndarray  # log MSE


def _ols_weights(x: np.ndarray) -> np.ndarray:
    """``w`` with ``slope = w @ y`` for the least-squares line through ``(x, y)``."""
    xc = x - x.mean()
    return xc / np.sum(xc**2)


def rate(
    res, rounds=None, *, t0: float = 0.0, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES
) -> Fit:
    """The slope of ``log MSE`` against ``log(t + t0)`` over the recorded rounds ``a <= t <= b``
    (``rounds=(a, b)``; default: every recorded round with ``t + t0 > 0``), least squares.

    The interval comes from the seeds. With every seed kept (``keep_seeds=num_seeds``): a percentile
    bootstrap over seeds (each resample refits the slope on its mean curve, so the correlation of a
    seed's errors across rounds is accounted for). Otherwise from the streamed standard errors: the
    slope is ``sum_r w_r log m_r``, ``Var log m_r ~ (s_r / m_r)^2``, and whatever the correlation
    across rounds ``Var(sum w_r log m_r) <= (sum |w_r| s_r / m_r)^2``; a normal interval with that
    bound: conservative (too wide where rounds are less than fully correlated).
    """
    level = check_level(level)
    resamples = _validate.integer("resamples", resamples, 100)
    t = np.asarray(res.rounds, np.float64) + _t0(t0)
    a, b = _rounds(rounds)
    pick = (res.rounds >= a) & (res.rounds <= b) & (t > 0)
    if pick.sum() < 2:
        _validate.fail("rounds", rounds, "expected at least two recorded rounds t with t + t0 > 0 in [a, b]")
    _check_fit_rounds(res, pick, rounds)
    x, y = np.log(t[pick]), np.log(res.mse_mean[pick])
    w = _ols_weights(x)
    slope = float(w @ y)
    kept = res.seed_mse[pick]
    if kept.shape[1] == res.num_seeds and res.num_seeds >= 2:
        rng = np.random.default_rng(0)
        slopes = np.array(
            [
                w @ np.log(np.nanmean(kept[:, rng.integers(0, kept.shape[1], kept.shape[1])], axis=1))
                for _ in range(resamples)
            ]
        )
        low, high = np.quantile(slopes, [(1 - level) / 2, (1 + level) / 2])
        method = "percentile bootstrap over the kept seeds"
    else:
        from scipy import stats as scipy_stats

        half = scipy_stats.norm.ppf((1 + level) / 2) * np.sum(
            np.abs(w) * res.mse_sem[pick] / res.mse_mean[pick]
        )
        low, high = slope - half, slope + half
        method = "normal, bound on the variance from the standard errors"
    return Fit(slope, (float(low), float(high)), level, method, x, y)


ROUNDING_FACTOR = 100.0  # an MSE below ROUNDING_FACTOR * d * (eps * max|theta*|)^2 is warned of


def _check_fit_rounds(res, pick: np.ndarray, rounds) -> None:
    """Refuse rounds whose mean MSE is not finite and positive (every seed diverged, or an error
    exactly 0: no logarithm), naming the first; warn, naming them, of rounds where seeds diverged (the
    fit is of the others' MSE) and of rounds at the dtype's rounding floor, an MSE below
    ``ROUNDING_FACTOR * d * (eps * max|theta*|)^2``: the updates' rounding, not the algorithm, can make
    such a curve, and its slope (with every seed alike, its interval of width 0) says nothing."""
    picked, m = np.asarray(res.rounds)[pick], np.asarray(res.mse_mean, np.float64)[pick]
    bad = ~(np.isfinite(m) & (m > 0))
    if bad.any():
        diverged = int(np.asarray(res.num_diverged)[pick][bad][0])
        _validate.fail(
            "rounds",
            rounds,
            f"the mean MSE is {m[bad][0]} at recorded round {int(picked[bad][0])} ({diverged} of "
            f"{res.num_seeds} seeds diverged there): no log-log slope through it; pass rounds=(a, b) "
            "where it is finite and positive",
        )
    diverged = np.asarray(res.num_diverged)[pick]
    if diverged.any():
        warnings.warn(
            f"{int(diverged.max())} of {res.num_seeds} seeds diverged by recorded round "
            f"{int(picked[diverged > 0][0])}: the slope is of the MSE of the others",
            RuntimeWarning,
            stacklevel=3,
        )
    star = np.asarray(res.theta_star, np.float64)
    eps = np.finfo(np.dtype(res.config.get("dtype", "float64"))).eps
    floor = ROUNDING_FACTOR * star.size * (eps * np.max(np.abs(star), initial=0.0)) ** 2
    low = m <= floor
    if low.any():
        warnings.warn(
            f"the mean MSE at recorded rounds {int(picked[low][0])}..{int(picked[low][-1])} "
            f"({int(low.sum())} of {low.size}) is at {res.config.get('dtype', 'float64')}'s rounding "
            f"floor (<= {floor:.1e}, {ROUNDING_FACTOR:g} d (eps max|theta*|)^2): the slope may measure "
            "rounding, not the algorithm; pass rounds=(a, b) before them",
            RuntimeWarning,
            stacklevel=3,
        )


def speedup(results, round=None, *, level: float = 0.95) -> Fit:
    """The slope of ``log MSE`` against ``log N`` at one recorded round (default: the last) over
    results ``{N: result}`` of independent runs (one per number of agents N); the speed-up
    exponent is minus the slope (1: linear speed-up, MSE ~ 1/N). The runs are independent, so
    ``Var(slope) = sum_N w_N^2 (s_N / m_N)^2`` (delta method) exactly; a normal interval."""
    from scipy import stats as scipy_stats

    level = check_level(level)
    if not isinstance(results, dict) or len(results) < 2:
        _validate.fail("results", results, "expected a dict {N: result} of at least two numbers of agents")
    ns = sorted(results)
    rows = [-1 if round is None else _row(results[n].rounds, round, n) for n in ns]
    m = np.array([results[n].mse_mean[r] for n, r in zip(ns, rows)])
    s = np.array([results[n].mse_sem[r] for n, r in zip(ns, rows)])
    x, y = np.log(np.asarray(ns, np.float64)), np.log(m)
    w = _ols_weights(x)
    slope = float(w @ y)
    half = float(scipy_stats.norm.ppf((1 + level) / 2)) * float(np.sqrt(np.sum(w**2 * (s / m) ** 2)))
    interval = (slope - half, slope + half)
    return Fit(slope, interval, level, "normal, delta method (independent runs)", x, y)


def divergence(res, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(p, low, high)``, each ``(R,)``: the fraction of seeds diverged at each recorded round and its
    Wilson interval."""
    level = check_level(level)
    p = np.asarray(res.num_diverged, np.float64) / res.num_seeds
    return (p, *wilson_interval(res.num_diverged, res.num_seeds, level))


def _row(rounds: np.ndarray, round, n) -> int:
    """The index of ``round`` among a result's recorded ``rounds``."""
    hits = np.flatnonzero(np.asarray(rounds) == round)
    if hits.size == 0:
        _validate.fail("round", round, f"expected a recorded round of every result (N={n} records {rounds})")
    return int(hits[0])


def _t0(t0) -> float:
    return _validate.real("t0", t0, low=0.0)


def _rounds(rounds) -> tuple[float, float]:
    if rounds is None:
        return -np.inf, np.inf
    try:
        a, b = (float(r) for r in rounds)
    except (TypeError, ValueError):
        _validate.fail("rounds", rounds, "expected None or a pair (a, b) of rounds, a < b")
    if not a < b:
        _validate.fail("rounds", rounds, "expected None or a pair (a, b) of rounds, a < b")
    return a, b
