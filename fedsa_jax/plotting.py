"""Figures: Monte Carlo MSE curves with standard-error bands and theory lines."""

from __future__ import annotations

from typing import Mapping

X_AXES = ("rounds", "bits_sent", "bits_delivered")

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedsa_jax.result import SimulationResult  # noqa: E402

BAND_Z = 2.0  # bands are mean +- 2 standard errors


def plot_mse(
    results: Mapping[str, SimulationResult],
    ax=None,
    reference_lines: Mapping[str, float] | None = None,
    logy: bool = True,
    title: str | None = None,
    x: str = "rounds",
):
    """MSE ``E|theta_t - theta_star|^2`` vs communication rounds, one curve per result.

    Args:
      results: label -> result.
      ax: matplotlib axes (a new figure if None).
      reference_lines: label -> level, drawn as dashed horizontal lines (e.g.
        FedLSA's predicted squared bias).
      logy: log-scale MSE axis.
      x: ``"rounds"``, ``"bits_sent"`` or ``"bits_delivered"`` (cumulative uplink bits,
        all agents; log scale).

    Returns:
      The matplotlib figure.
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is invalid: expected one of {', '.join(repr(a) for a in X_AXES)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=130)
    else:
        fig = ax.figure
    for i, (label, res) in enumerate(results.items()):
        color = f"C{i}"
        lo = np.maximum(res.mse_mean - BAND_Z * res.mse_sem, np.finfo(float).tiny)
        hi = res.mse_mean + BAND_Z * res.mse_sem
        n_ok = res.num_seeds - int(res.num_diverged[-1])
        xs = np.asarray(getattr(res, x), dtype=float)
        ax.plot(xs, res.mse_mean, color=color, lw=1.6, label=f"{label} ({n_ok} seeds)")
        ax.fill_between(xs, lo, hi, color=color, alpha=0.25, lw=0)
    for j, (label, level) in enumerate((reference_lines or {}).items()):
        ax.axhline(level, color=f"C{len(results) + j}", ls="--", lw=1.2, label=label)
    if logy:
        ax.set_yscale("log")
    if x == "rounds":
        ax.set_xlabel("communication round $t$")
    else:
        ax.set_xscale("log")
        ax.set_xlabel(f"uplink bits {'delivered' if x == 'bits_delivered' else 'sent'} (all agents)")
    ax.set_ylabel(r"$\mathbb{E}\,\|\theta_t - \theta_\star\|^2$")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, title=rf"mean $\pm$ {BAND_Z:g} s.e.", title_fontsize=8)
    fig.tight_layout()
    return fig
