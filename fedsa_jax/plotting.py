"""Figures: Monte Carlo MSE curves with uncertainty bands, theory overlays, speed-up plots.

* :func:`plot_mse`: MSE against rounds, communications, samples or bits, mean
  with a standard-error band (``band="sem"``, mean +- 2 s.e.) or a quantile band
  over seeds (``band="quantiles"``: 5-95 % shaded, 25-75 % darker), exact
  theory curves (:func:`fedsa_jax.theory.exact_mse`) drawn black dotted over
  each simulated curve, and dashed reference levels (e.g. FedLSA's squared bias).
* :func:`plot_final_mse_vs_agents`: final MSE against the number of agents N
  on log-log axes, +- 2 s.e. error bars, exact values as open markers, and a
  ``1/N`` reference line (linear speed-up).

Defaults aim at print: 6.4 x 4.2 in at 130 dpi, 9-10 pt text, light grid,
colour-blind-safe Matplotlib ``tab10`` cycle; every function takes an ``ax`` so
figures compose into panels. The module keeps the active backend (inline in a
notebook); the command line switches to the headless Agg backend.
"""

from __future__ import annotations

from typing import Mapping

import matplotlib.pyplot as plt
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.result import X_AXES, SimulationResult

BAND_Z = 2.0  # standard-error bands are mean +- 2 standard errors
BANDS = ("sem", "quantiles", None)
X_LABELS = {
    "rounds": "communication round $t$",
    "communications": "uplink messages (all agents)",
    "samples": "observations drawn (all agents)",
    "bits_sent": "uplink bits sent (all agents)",
    "bits_delivered": "uplink bits delivered (all agents)",
}
MSE_LABEL = r"$\mathbb{E}\,\|\theta_t - \theta_\star\|^2$"


def _axes(ax, figsize=(6.4, 4.2)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, dpi=130)
        return fig, ax
    return ax.figure, ax


def _tiny(y):
    return np.maximum(y, np.finfo(float).tiny)


def plot_mse(
    results: Mapping[str, SimulationResult],
    ax=None,
    x: str = "rounds",
    band: str | None = "sem",
    theory: Mapping[str, np.ndarray] | None = None,
    reference_lines: Mapping[str, float] | None = None,
    logx: bool | None = None,
    logy: bool = True,
    title: str | None = None,
    legend: bool = True,
    metric: str | None = None,
    max_seed_curves: int = 100,
):
    """MSE ``E|theta_t - theta_star|^2`` (or a recorded metric) of each result, one colour per result.

    Args:
      results: label -> result.
      ax: matplotlib axes (a new figure if None).
      x: ``"rounds"``, ``"communications"`` (t N), ``"samples"`` (t N H skip),
        ``"bits_sent"`` or ``"bits_delivered"`` (cumulative uplink bits).
      band: ``"sem"`` (mean +- 2 standard errors), ``"quantiles"`` (5-95 % and
        25-75 % of the seeds' squared errors) or None.
      theory: label -> exact curve for rounds ``0..T`` (e.g. from
        :func:`fedsa_jax.theory.exact_mse`), drawn black dotted over the result
        with the same label and mapped to that result's x axis; a curve with no
        result of its label is drawn against round indices, with its own legend entry.
      reference_lines: label -> level, dashed horizontal lines (e.g. FedLSA's
        predicted squared bias ``|fedlsa_bias|^2``).
      logx: log x axis; default on for the bit axes only.
      logy: log MSE axis.
      legend: draw the legend.
      metric: plot this recorded metric (``simulate(..., metrics=...)``) instead of the MSE.
      max_seed_curves: results run with ``keep_seeds=K`` also show their first
        ``min(K, max_seed_curves)`` seeds' curves, faint, under the mean.

    Returns:
      The matplotlib figure.
    """
    _validate.choice("x", x, X_AXES)
    if band not in BANDS:
        _validate.fail("band", band, "expected 'sem', 'quantiles' or None")
    fig, ax = _axes(ax)
    colors = {}
    scale = {}
    for i, (label, res) in enumerate(results.items()):
        color = colors[label] = f"C{i}"
        xs = np.asarray(getattr(res, x), dtype=float)
        last = res.rounds[-1]
        scale[label] = xs[-1] / last if last else 1.0
        n_ok = res.num_seeds - int(res.num_diverged[-1])
        if metric is None:
            mean, sem, q, seeds = res.mse_mean, res.mse_sem, res.mse_quantiles, res.seed_mse
        elif metric in res.metrics:
            m = res.metrics[metric]
            mean, sem, q, seeds = m.mean, m.sem, m.quantiles, m.seeds
        else:
            _validate.fail("metric", metric, f"result {label!r} recorded the metrics {sorted(res.metrics)}")
        ax.plot(xs, mean, color=color, lw=1.6, label=f"{label} ({n_ok} seeds)")
        for k in range(min(seeds.shape[1], max_seed_curves)):
            ax.plot(xs, seeds[:, k], color=color, lw=0.5, alpha=0.2, zorder=1)
        if band == "sem":
            lower = mean - BAND_Z * sem
            ax.fill_between(xs, _tiny(lower) if logy else lower, mean + BAND_Z * sem, color=color, alpha=0.25, lw=0)
        elif band == "quantiles":
            if np.all(np.isnan(q)):
                _validate.fail("band", band, f"result {label!r} has no quantiles (simulate(..., quantiles=True))")
            ax.fill_between(xs, q[:, 0], q[:, 4], color=color, alpha=0.12, lw=0)
            ax.fill_between(xs, q[:, 1], q[:, 3], color=color, alpha=0.22, lw=0)
    named = False  # one legend entry "exact" for the curves drawn over results
    for label, curve in (theory or {}).items():
        curve = np.asarray(curve, dtype=float)
        xs = np.arange(curve.shape[0]) * scale.get(label, 1.0)
        ax.plot(xs, curve, color="k", ls=":", lw=1.3, zorder=3,
                label=label if label not in colors else (None if named else "exact"))
        named = named or label in colors
    for j, (label, level) in enumerate((reference_lines or {}).items()):
        ax.axhline(level, color=f"C{len(results) + j}", ls="--", lw=1.2, label=label)
    if logy:
        ax.set_yscale("log")
    if logx if logx is not None else x.startswith("bits"):
        ax.set_xscale("log")
    ax.set_xlabel(X_LABELS[x], fontsize=9)
    ax.set_ylabel(MSE_LABEL if metric is None else metric, fontsize=9)
    ax.tick_params(labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if legend:
        note = {"sem": rf"mean $\pm$ {BAND_Z:g} s.e.", "quantiles": "mean; 5-95%, 25-75% of seeds",
                None: "mean"}[band]
        ax.legend(fontsize=8, title=note, title_fontsize=8)
    fig.tight_layout()
    return fig


def plot_final_mse_vs_agents(
    series: Mapping[str, Mapping[int, SimulationResult]],
    ax=None,
    theory: Mapping[str, Mapping[int, float]] | None = None,
    reference: bool = True,
    title: str | None = None,
):
    """Final-round MSE against the number of agents N (log-log), one line per series.

    Args:
      series: label -> {N: result}.
      theory: label -> {N: exact final MSE}, drawn as open markers.
      reference: draw ``C / N`` through the first series' smallest-N point: parallel
        to it means linear speed-up.

    Returns:
      The matplotlib figure.
    """
    fig, ax = _axes(ax)
    all_n = []
    for i, (label, by_n) in enumerate(series.items()):
        ns = np.array(sorted(by_n), dtype=float)
        all_n.extend(ns)
        final = np.array([by_n[n].mse_mean[-1] for n in sorted(by_n)])
        sem = np.array([by_n[n].mse_sem[-1] for n in sorted(by_n)])
        ax.errorbar(ns, final, yerr=BAND_Z * sem, fmt="o-", color=f"C{i}", ms=4, lw=1.4, capsize=3, label=label)
        exact = (theory or {}).get(label, {})
        if exact:
            ks = sorted(exact)
            ax.plot(ks, [exact[k] for k in ks], "s", mfc="none", color=f"C{i}", ms=9, mew=1.2)
        if reference and i == 0:
            n0, y0 = ns[0], final[0]
    if reference and series:
        grid = np.array([min(all_n), max(all_n)])
        ax.plot(grid, y0 * n0 / grid, "k--", lw=1.0, label=r"$\propto 1/N$ (linear speed-up)")
    if theory:
        ax.plot([], [], "s", mfc="none", color="0.3", ms=9, label="exact")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of agents $N$", fontsize=9)
    ax.set_ylabel("final " + MSE_LABEL, fontsize=9)
    ax.tick_params(labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, title=rf"mean $\pm$ {BAND_Z:g} s.e.", title_fontsize=8)
    fig.tight_layout()
    return fig
