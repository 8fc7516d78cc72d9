"""Figures: Monte Carlo MSE curves with uncertainty bands, theory overlays, speed-up plots.

* :func:`plot_mse`: MSE against rounds, communications, samples or bits, mean
  with a standard-error band (``band="sem"``, mean +- 2 s.e.) or a quantile band
  over seeds (``band="quantiles"``: 5-95 % shaded, 25-75 % darker), exact
  theory curves (:func:`fedsa_jax.theory.exact_mse`) drawn black dotted over
  each simulated curve, and dashed reference levels (e.g. FedLSA's squared bias).
* :func:`plot_final_mse_vs_agents`: final MSE against the number of agents N
  on log-log axes, +- 2 s.e. error bars, exact values as open markers, and a
  ``1/N`` reference line (linear speed-up).
* :func:`plot_sweep`: a sweep's final MSE against one swept option, one line
  per combination of the others (``fedsa-jax sweep`` draws it as ``sweep.png``).

Defaults aim at print: 6.4 x 4.2 in at 130 dpi, 9-10 pt text, light grid,
colour-blind-safe Matplotlib ``tab10`` cycle; every function takes an ``ax`` so
figures compose into panels. The module keeps the active backend (inline in a
notebook); the command line switches to the headless Agg backend.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np

from fedsa_jax import _validate
from fedsa_jax._runtime.sweep import config_label
from fedsa_jax.result import X_AXES, SimulationResult

__all__ = ["plot_difference", "plot_final_mse_vs_agents", "plot_mse", "plot_sweep"]

_BAND_Z = 2.0  # standard-error bands are mean +- 2 standard errors
_BANDS = ("sem", "quantiles", "t", "bootstrap", None)
_BAND_NOTES = {  # the legend's title
    "sem": rf"mean $\pm$ {_BAND_Z:g} s.e.",
    "quantiles": "mean; 5-95%, 25-75% of seeds",
    "t": "mean; 95% t interval",
    "bootstrap": "mean; 95% BCa bootstrap interval",
    None: "mean",
}
_X_LABELS = {
    "rounds": "communication round $t$",
    "communications": "uplink messages (all agents)",
    "samples": "observations drawn (all agents)",
    "bits_sent": "uplink bits sent (all agents)",
    "bits_delivered": "uplink bits delivered (all agents)",
    "uplink_bits_sent": "uplink bits sent (all agents)",
    "uplink_bits_delivered": "uplink bits delivered (all agents)",
    "downlink_bits_sent": "downlink bits sent (to all agents)",
    "downlink_bits_delivered": "downlink bits delivered (to all agents)",
}
# bits_sent and bits_delivered are uplink plus downlink: so labelled when a result has downlink bits
_TOTAL_LABELS = {
    "bits_sent": "bits sent, uplink + downlink (all agents)",
    "bits_delivered": "bits delivered, uplink + downlink (all agents)",
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
        25-75 % of the seeds' squared errors), ``"t"`` or ``"bootstrap"`` (the 95 % interval of
        :meth:`~fedsa_jax.SimulationResult.mse_interval`; the MSE only) or None.
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
    if band not in _BANDS:
        _validate.fail("band", band, "expected 'sem', 'quantiles', 't', 'bootstrap' or None")
    if band in ("t", "bootstrap") and metric is not None:
        _validate.fail("band", band, f"intervals are drawn for the MSE; with metric={metric!r} use 'sem'")
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
        if band is not None:
            _band(ax, xs, band, label, color, logy, mean=mean, sem=sem, q=q, res=res)
    named = False  # one legend entry "exact" for the curves drawn over results
    for label, curve in (theory or {}).items():
        curve = np.asarray(curve, dtype=float)
        xs = np.arange(curve.shape[0]) * scale.get(label, 1.0)
        ax.plot(
            xs,
            curve,
            color="k",
            ls=":",
            lw=1.3,
            zorder=3,
            label=label if label not in colors else (None if named else "exact"),
        )
        named = named or label in colors
    for j, (label, level) in enumerate((reference_lines or {}).items()):
        ax.axhline(level, color=f"C{len(results) + j}", ls="--", lw=1.2, label=label)
    if logy:
        ax.set_yscale("log")
    if logx if logx is not None else x.startswith("bits"):
        ax.set_xscale("log")
    both = x in _TOTAL_LABELS and any(np.any(r.downlink_bits_sent) for r in results.values())
    ax.set_xlabel((_TOTAL_LABELS if both else _X_LABELS)[x], fontsize=9)
    ax.set_ylabel(MSE_LABEL if metric is None else metric, fontsize=9)
    ax.tick_params(labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if legend:
        note = _BAND_NOTES[band]
        ax.legend(fontsize=8, title=note, title_fontsize=8)
    fig.tight_layout()
    return fig


def _band(ax, xs, band: str, label: str, color: str, logy: bool, *, mean, sem, q, res) -> None:
    """One result's band under its curve: mean +- 2 s.e., the quantiles, or an MSE interval."""
    if band == "sem":
        lower = mean - _BAND_Z * sem
        ax.fill_between(
            xs, _tiny(lower) if logy else lower, mean + _BAND_Z * sem, color=color, alpha=0.25, lw=0
        )
    elif band == "quantiles":
        if np.all(np.isnan(q)):
            _validate.fail("band", band, f"result {label!r} has no quantiles (simulate(..., quantiles=True))")
        ax.fill_between(xs, q[:, 0], q[:, 4], color=color, alpha=0.12, lw=0)
        ax.fill_between(xs, q[:, 1], q[:, 3], color=color, alpha=0.22, lw=0)
    else:
        low, high = res.mse_interval(method=band)
        ax.fill_between(xs, _tiny(low) if logy else low, high, color=color, alpha=0.25, lw=0)


def plot_difference(comparison, pairs=None, ax=None, title: str | None = None, level: float = 0.95):
    """The paired differences ``MSE_A - MSE_B`` of a :func:`fedsa_jax.compare` run against the rounds,
    each with its t interval (``level``) over the seeds, and a dashed zero line: a band that leaves
    zero is a difference the seeds resolve.

    Args:
      comparison: what :func:`fedsa_jax.compare` returned.
      pairs: ``[(name_a, name_b), ...]`` (default: the first algorithm against each other one).
    """
    names = list(comparison.results)
    pairs = [(names[0], other) for other in names[1:]] if pairs is None else list(pairs)
    differences = [comparison.difference(a, b) for a, b in pairs]
    fig, ax = _axes(ax)
    for i, d in enumerate(differences):
        low, high = d.interval(level)
        ax.plot(d.rounds, d.mean, color=f"C{i}", lw=1.6, label=f"{d.name_a} - {d.name_b}")
        ax.fill_between(d.rounds, low, high, color=f"C{i}", alpha=0.25, lw=0)
    ax.axhline(0.0, color="k", ls="--", lw=0.8)
    ax.set_xlabel(_X_LABELS["rounds"], fontsize=9)
    ax.set_ylabel(r"paired difference of $\|\theta_t - \theta_\star\|^2$", fontsize=9)
    ax.tick_params(labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, title=f"mean; {100 * level:g}% t interval (paired)", title_fontsize=8)
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
        ax.errorbar(
            ns, final, yerr=_BAND_Z * sem, fmt="o-", color=f"C{i}", ms=4, lw=1.4, capsize=3, label=label
        )
        exact = (theory or {}).get(label, {})
        if exact:
            ks = sorted(exact)
            ax.plot(ks, [exact[k] for k in ks], "s", mfc="none", color=f"C{i}", ms=9, mew=1.2)
        if reference and i == 0:
            n0, y0 = ns[0], final[0]
    if reference and series:
        grid = np.array([min(all_n), max(all_n)])
        ax.plot(grid, y0 * n0 / grid, "k--", lw=1.0, label=r"$\propto 1/N$ (linear speed-up)")  # pyright: ignore[reportOperatorIssue]
    if theory:
        ax.plot([], [], "s", mfc="none", color="0.3", ms=9, label="exact")
    ax.set_xscale("log")
    return _final_mse_axes(fig, ax, "number of agents $N$", title, legend_size=8)


def _final_mse_axes(fig, ax, xlabel: str, title: str | None, legend_size: int | None):
    """Log final-MSE axis, labels, grid and (``legend_size`` not None) legend of the final-MSE figures."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel("final " + MSE_LABEL, fontsize=9)
    ax.tick_params(labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if legend_size is not None:
        ax.legend(fontsize=legend_size, title=rf"mean $\pm$ {_BAND_Z:g} s.e.", title_fontsize=8)
        fig.tight_layout()
    return fig


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def plot_sweep(
    entries,
    x: str | None = None,
    ax=None,
    title: str | None = None,
    max_lines: int = 20,
    panels: str | None = None,
):
    """Final-round MSE of a sweep's configurations against one swept option.

    One panel per value of a structural option (``panels``), in each one line per combination
    of the other options that vary, mean +- 2 standard errors; a line keeps its colour across
    panels and the legend, outside the panels, names only what varies (options left at None,
    such as ``params.beta`` of a built-in algorithm, are left out); lines that would be drawn over
    each other (the same final MSE and s.e. at every point: a grid key some algorithm does not read,
    or two configurations that are the same run) are one line whose legend entry names them all,
    one a line (``"a\\n= b"``); each line has its own marker and dash pattern besides its colour, so
    lines that nearly coincide stay apart. A numeric option is drawn
    on a linear axis (log when its positive values span a factor 10 or more); other values
    (algorithm names) as categories.

    Args:
      entries: :class:`fedsa_jax.SweepEntry` items (or anything with
        ``config`` and ``result``), e.g. the return value of :func:`fedsa_jax.sweep`.
      x: the option on the x axis; default: the varying option with the most
        distinct numeric values (or, if none is numeric, the first varying one).
      ax: draw into these axes (one panel, legend inside); default: a new figure.
      max_lines: lines drawn at most per panel; the rest are left out with a note in the legend.
      panels: the option whose values get one panel each; default (without ``ax``): the varying
        option, other than ``x`` and ``algorithm``, that is not numeric and has the fewest
        values (``heterogeneity``, ``problem``, ``sampling``), if any.

    Returns:
      The matplotlib figure.
    """
    entries = [e for e in entries if e.result is not None]
    if not entries:
        _validate.fail("entries", entries, "expected at least one finished configuration")
    keys = list(dict.fromkeys(k for e in entries for k in e.config)) or ["configuration"]  # {}: one point
    values = {k: list(dict.fromkeys(_json_key(e.config.get(k)) for e in entries)) for k in keys}
    varying = [k for k in keys if len(values[k]) > 1]
    numeric = [k for k in varying if all(_is_number(e.config.get(k)) for e in entries)]
    if x is None:
        x = max(numeric, key=lambda k: len(values[k])) if numeric else (varying[0] if varying else keys[0])
    elif x not in keys:
        _validate.fail("x", x, f"expected one of the configurations' keys ({', '.join(keys)})")
    others = [k for k in varying if k != x]
    if panels is None and ax is None:
        structural = [k for k in others if k != "algorithm" and k not in numeric]
        panels = min(structural, key=lambda k: len(values[k])) if structural else None
    elif panels is not None and (ax is not None or panels not in others):
        allowed = "a varying option other than x, without ax" if ax is None else "None when ax is given"
        _validate.fail("panels", panels, f"expected {allowed} ({', '.join(others) or 'none vary'})")
    in_line = [k for k in others if k != panels]
    label = _merged_labels(entries, lambda e: config_label(e.config, in_line) or "final MSE", panels, x)
    labels = list(dict.fromkeys(label(e) for e in entries))
    groups: dict[str, list] = {}
    for e in entries:
        groups.setdefault(_json_key(e.config.get(panels)) if panels else "", []).append(e)
    if ax is None:
        fig, grid = plt.subplots(
            1,
            len(groups),
            figsize=(3.6 * len(groups) + 3.0, 4.0),
            dpi=130,
            sharey=True,
            squeeze=False,
            layout="constrained",
        )
        axes = list(grid[0])
    else:
        fig, axes = ax.figure, [ax]
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    for (value, members), panel in zip(groups.items(), axes):
        _sweep_panel(panel, members, x, values[x], label, labels, cmap, max_lines)
        _final_mse_axes(fig, panel, str(x), f"{panels} = {json.loads(value)}" if panels else title, None)
        if panel is not axes[0]:
            panel.set_ylabel("")
    if ax is not None:
        ax.legend(fontsize=7, title=rf"mean $\pm$ {_BAND_Z:g} s.e.", title_fontsize=8)
    else:
        if panels and title:
            fig.suptitle(title, fontsize=10)
        handles, names = axes[0].get_legend_handles_labels()
        for panel in axes[1:]:  # a line absent from the first panel still gets its entry
            for h, n in zip(*panel.get_legend_handles_labels()):
                if n not in names:
                    handles.append(h)
                    names.append(n)
        fig.legend(
            handles,
            names,
            loc="outside right center",
            fontsize=7,
            title=rf"mean $\pm$ {_BAND_Z:g} s.e.",
            title_fontsize=8,
        )
    return fig


# each line of a sweep figure its own marker and dash pattern (with its colour): lines that nearly
# coincide (FedLSA with H = 1 and QFedTD on an exact channel, equal to float rounding) stay apart
_SWEEP_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
_SWEEP_DASHES = ("-", "--", "-.", ":")


def _merged_labels(entries, label, panels, x):
    """``label`` with the lines that would be drawn over each other given one entry: lines whose every
    point (panel, x, final MSE, its s.e.) is equal bit for bit, drawn once and labelled ``"a\\n= b"``.

    Identical lines arise where a grid key is one that some algorithm does not read (QFedTD's
    ``local_steps``: its rounds are one step; a parameter of another algorithm) or where two
    configurations are the same run (QFedTD on an exact channel is FedLSA with H = 1)."""
    points: dict[str, list] = {}
    for e in entries:
        point = (_json_key(e.config.get(panels)) if panels else "", _json_key(e.config.get(x)))
        points.setdefault(label(e), []).append(
            (*point, float(e.result.mse_mean[-1]), float(e.result.mse_sem[-1]))
        )
    same: dict[tuple, list[str]] = {}
    for name, line in points.items():
        same.setdefault(tuple(sorted(line)), []).append(name)
    merged = {n: "\n= ".join(names) for names in same.values() for n in names}
    return lambda e: merged[label(e)]


def _sweep_panel(ax, members, x, categories, label, labels, cmap, max_lines: int) -> None:
    """The lines of one panel of :func:`plot_sweep`, coloured by their index in ``labels``."""
    points: dict[str, dict] = {}  # a line's entries by x: one of identical ones (merged labels)
    for e in members:
        points.setdefault(label(e), {}).setdefault(_json_key(e.config.get(x)), e)
    lines = {name: list(line.values()) for name, line in points.items()}
    numeric_x = all(_is_number(e.config.get(x)) for e in members)
    for name, line in list(lines.items())[:max_lines]:
        if numeric_x:
            line = sorted(line, key=lambda e: e.config[x])
            xs = np.array([float(e.config[x]) for e in line])
        else:
            xs = np.array([categories.index(_json_key(e.config.get(x))) for e in line], dtype=float)
        final = np.array([e.result.mse_mean[-1] for e in line])
        sem = np.array([e.result.mse_sem[-1] for e in line])
        i = labels.index(name)
        style = dict(marker=_SWEEP_MARKERS[i % len(_SWEEP_MARKERS)], ls=_SWEEP_DASHES[i % len(_SWEEP_DASHES)])
        ax.errorbar(
            xs,
            final,
            yerr=_BAND_Z * sem,
            **style,
            color=cmap(i % cmap.N),
            ms=4,
            lw=1.4,
            capsize=3,
            label=name,
        )
    if len(lines) > max_lines:
        ax.plot([], [], " ", label=f"({len(lines) - max_lines} more not drawn)")
    if numeric_x:
        xs = np.array([float(e.config[x]) for e in members])
        if np.all(xs > 0) and xs.max() >= 10 * xs.min():
            ax.set_xscale("log")
    else:
        ax.set_xticks(range(len(categories)), [str(json.loads(c)) for c in categories], fontsize=8)


def _json_key(value) -> str:
    """A hashable, order-preserving key for a configuration value."""
    return json.dumps(value, sort_keys=True)
