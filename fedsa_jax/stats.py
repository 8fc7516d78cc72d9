"""Statistics over the seed axis: mergeable moments computed in the kernel, combined on the host.

At every recorded round the kernel reduces one batch of seeds (possibly sharded
over devices) to :class:`Moments`: the number of non-diverged seeds, their mean
and sum of squared deviations (two-pass, so float32 stays accurate) of the
squared error and of each coordinate of theta. Batches run one after the other
are merged on the host in float64 with Chan et al.'s pairwise update, so the
statistics do not depend on how the seeds were split.

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


class Moments(NamedTuple):
    n_ok: jax.Array  # () int32, non-diverged valid seeds
    err_mean: jax.Array  # () mean of |theta - theta_star|^2
    err_m2: jax.Array  # () sum of squared deviations
    theta_mean: jax.Array  # (d,)
    theta_m2: jax.Array  # (d,)
    num_diverged: jax.Array  # () int32
    delivered_sum: jax.Array  # () cumulative uplink messages delivered, summed over valid seeds


def seed_moments(theta, theta_star, threshold, valid, delivered) -> Moments:
    """Moments over the leading (seed) axis of ``theta (n, d)``, valid seeds only."""
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
    return Moments(n.astype(jnp.int32), mean, m2, theta_mean, theta_m2, diverged, delivered_sum)


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
    )


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
    }
