"""Statistics over the seed axis, computed inside the kernel at recorded rounds.

Diverged seeds (non-finite iterate, or squared error above the threshold) are
counted and left out of every mean, so one exploding seed never turns a curve
into NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SeedStats(NamedTuple):
    mse_mean: jax.Array  # () mean over finite seeds of |theta - theta_star|^2
    mse_sem: jax.Array  # () its standard error
    theta_mean: jax.Array  # (d,) mean over finite seeds of theta
    theta_sem: jax.Array  # (d,) its standard error, per coordinate
    num_diverged: jax.Array  # () int32


def seed_statistics(theta: jax.Array, theta_star: jax.Array, threshold: jax.Array) -> SeedStats:
    """Two-pass mean and standard error over the leading (seed) axis of ``theta (n, d)``."""
    err = jnp.sum((theta - theta_star) ** 2, axis=-1)
    ok = jnp.isfinite(err) & (err <= threshold)
    n = jnp.sum(ok)
    n_f = n.astype(err.dtype)
    safe_err = jnp.where(ok, err, 0.0)
    mean = jnp.sum(safe_err) / n_f
    var = jnp.sum(jnp.where(ok, (err - mean) ** 2, 0.0)) / (n_f - 1.0)
    sem = jnp.sqrt(var / n_f)
    theta_mean = jnp.sum(jnp.where(ok[:, None], theta, 0.0), axis=0) / n_f
    theta_var = jnp.sum(jnp.where(ok[:, None], (theta - theta_mean) ** 2, 0.0), axis=0) / (n_f - 1.0)
    theta_sem = jnp.sqrt(theta_var / n_f)
    return SeedStats(mean, sem, theta_mean, theta_sem, (theta.shape[0] - n).astype(jnp.int32))
