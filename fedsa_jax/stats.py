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

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


HIST_LOW, HIST_HIGH, HIST_PER_DECADE = -40, 20, 16
HIST_BINS = (HIST_HIGH - HIST_LOW) * HIST_PER_DECADE
QUANTILE_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)


class Moments(NamedTuple):
    n_ok: jax.Array  # () int32, non-diverged valid seeds
    err_mean: jax.Array  # () mean of |theta - theta_star|^2
    err_m2: jax.Array  # () sum of squared deviations
    theta_mean: jax.Array  # (d,)
    theta_m2: jax.Array  # (d,)
    num_diverged: jax.Array  # () int32
    delivered_sum: jax.Array  # () cumulative uplink messages delivered, summed over valid seeds
    err_hist: jax.Array  # (HIST_BINS,) or (0,) int32 counts of non-diverged squared errors per log bin
    err_min: jax.Array  # () smallest non-diverged squared error (+inf if none)
    err_max: jax.Array  # () largest (-inf if none)


def seed_moments(theta, theta_star, threshold, valid, delivered, quantiles: bool = True) -> Moments:
    """Moments over the leading (seed) axis of ``theta (n, d)``, valid seeds only
    (``quantiles=False``: an empty histogram)."""
    err = jnp.sum((theta - theta_star) ** 2, axis=-1)
    ok = valid & jnp.isfinite(err) & (err <= threshold)
    n = jnp.sum(ok)
    n_f = jnp.maximum(n, 1).astype(err.dtype)
    mean = jnp.sum(jnp.where(ok, err, 0.0)) / n_f
    m2 = jnp.sum(jnp.where(ok, (err - mean) ** 2, 0.0))
    okd = ok[:, None]
    theta_mean = jnp.sum(jnp.where(okd, theta, 0.0), axis=0) / n_f
    theta_m2 = jnp.sum(jnp.where(okd, (theta - theta_mean) ** 2, 0.0), axis=0)
    diverged = jnp.sum(valid & ~ok).astype(jnp.int32)
    delivered_sum = jnp.sum(jnp.where(valid, delivered, 0).astype(err.dtype))
    if quantiles:
        log_err = jnp.log10(jnp.maximum(jnp.where(ok, err, 1.0), jnp.finfo(err.dtype).tiny))
        idx = jnp.clip(jnp.floor((log_err - HIST_LOW) * HIST_PER_DECADE), 0, HIST_BINS - 1).astype(jnp.int32)
        hist = jnp.zeros(HIST_BINS, jnp.int32).at[idx].add(ok.astype(jnp.int32))
    else:
        hist = jnp.zeros(0, jnp.int32)
    err_min = jnp.min(jnp.where(ok, err, jnp.inf))
    err_max = jnp.max(jnp.where(ok, err, -jnp.inf))
    return Moments(n.astype(jnp.int32), mean, m2, theta_mean, theta_m2, diverged, delivered_sum, hist,
                   err_min, err_max)


def merge(parts: list[Moments]) -> Moments:
    """Combine batches' moments (numpy, float64; arrays may carry a leading round axis)."""
    n = sum(np.asarray(p.n_ok, np.float64) for p in parts)
    safe = np.maximum(n, 1.0)

    def pooled(mean_name, m2_name):
        means = [np.asarray(getattr(p, mean_name), np.float64) for p in parts]
        ns = [np.asarray(p.n_ok, np.float64).reshape(np.shape(p.n_ok) + (1,) * (m.ndim - np.ndim(p.n_ok)))
              for p, m in zip(parts, means)]
        tot = safe.reshape(safe.shape + (1,) * (means[0].ndim - safe.ndim))
        mean = sum(k * m for k, m in zip(ns, means)) / tot
        m2 = sum(np.asarray(getattr(p, m2_name), np.float64) + k * (m - mean) ** 2
                 for p, k, m in zip(parts, ns, means))
        return mean, m2

    err_mean, err_m2 = pooled("err_mean", "err_m2")
    theta_mean, theta_m2 = pooled("theta_mean", "theta_m2")
    return Moments(
        n_ok=n, err_mean=err_mean, err_m2=err_m2, theta_mean=theta_mean, theta_m2=theta_m2,
        num_diverged=sum(np.asarray(p.num_diverged, np.int64) for p in parts),
        delivered_sum=sum(np.asarray(p.delivered_sum, np.float64) for p in parts),
        err_hist=sum(np.asarray(p.err_hist, np.int64) for p in parts),
        err_min=np.min([np.asarray(p.err_min, np.float64) for p in parts], axis=0),
        err_max=np.max([np.asarray(p.err_max, np.float64) for p in parts], axis=0),
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
        out[..., j] = np.where(total > 0, 10.0 ** log_q, np.nan)[..., 0]
    with np.errstate(invalid="ignore"):
        return np.clip(out, np.asarray(lo)[..., None], np.asarray(hi)[..., None])


def finalize(m: Moments) -> dict[str, np.ndarray]:
    """Means and standard errors; NaN where no seed is left."""
    n = np.asarray(m.n_ok, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mse_sem = np.sqrt(m.err_m2 / (n - 1) / n)
        nd = n.reshape(n.shape + (1,) * (np.ndim(m.theta_mean) - n.ndim))
        theta_sem = np.sqrt(m.theta_m2 / (nd - 1) / nd)
    none = n == 0
    mse_mean = np.where(none, np.nan, m.err_mean)
    theta_mean = np.where(none.reshape(nd.shape), np.nan, m.theta_mean)
    return {
        "mse_mean": mse_mean,
        "mse_sem": np.where(n > 1, mse_sem, np.nan),  # undefined from fewer than 2 seeds
        "theta_mean": theta_mean,
        "theta_sem": np.where(nd > 1, theta_sem, np.nan),
        "num_diverged": np.asarray(m.num_diverged, np.int64),
        "mse_quantiles": hist_quantiles(m.err_hist, m.err_min, m.err_max),
    }
