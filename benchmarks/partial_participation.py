"""Partial participation: SCAFFLSA and Scaffnew with a cohort of m of N = 10 agents, MC against exact.

Heterogeneous Garnet TD (generative, S = 10, d = 4), N = 10 agents, started at ``theta = 0``,
float64. SCAFFLSA: eta = 0.2, H = 5 local steps per round; Scaffnew: eta = 0.2, p = 0.2, H = 5
(about one communication per round). For m in {1, 2, 5, 10} (``clients_per_round``; 10 is every
agent) each run's MSE curve (``--seeds`` seeds, mean +- 2 s.e.) is drawn with
``fj.theory.exact_mse`` and the largest |MC - exact| in standard errors over the recorded rounds is
printed; the right panel shows the final MSE against m (Monte Carlo points, exact line).

    python benchmarks/partial_participation.py [--seeds 1000] [--rounds 300] [--json out.json]
"""

from __future__ import annotations

import time

import jax
import matplotlib
import numpy as np
from _bench import exact_figure_args, save_figure

import fedsa_jax as fj

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COHORTS = (1, 2, 5, 10)
ALGORITHMS = {
    "SCAFFLSA": lambda m: fj.scafflsa(0.2, 5, clients_per_round=m),
    "Scaffnew": lambda m: fj.scaffnew(0.2, 0.2, 5, clients_per_round=m),
}


def main(argv=None):
    args, every = exact_figure_args(argv, __doc__.split("\n")[0], seeds=1000, rounds=300)
    problem = fj.problems.garnet(
        jax.random.key(0), num_agents=10, num_states=10, dim=4, heterogeneity="heterogeneous", dtype="float64"
    )
    T = args.rounds
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), dpi=110)
    rows = []
    for ax, (name, build) in zip(axes[:2], ALGORITHMS.items()):
        for m, color in zip(COHORTS, ("C3", "C1", "C2", "C0")):
            alg = build(m)
            t0 = time.perf_counter()
            res = fj.simulate(jax.random.key(1), problem, alg, T, args.seeds, record_every=every)
            wall = time.perf_counter() - t0
            exact = fj.theory.exact_mse(problem, alg, T)
            z = (res.mse_mean[1:] - exact[res.rounds][1:]) / res.mse_sem[1:]
            rows.append(
                dict(
                    algorithm=name,
                    m=m,
                    final_mse_mc=float(res.mse_mean[-1]),
                    final_mse_sem=float(res.mse_sem[-1]),
                    final_mse_exact=float(exact[-1]),
                    max_abs_z=float(np.max(np.abs(z))),
                    messages_per_round=float(res.communications[-1] / T),
                    simulate_s=wall,
                )
            )
            print(
                f"{name:8s} m={m:2d}  final MSE MC {res.mse_mean[-1]:.4g} +- {res.mse_sem[-1]:.2g}  exact "
                f"{exact[-1]:.4g}  max|z| {np.max(np.abs(z)):.2f}  messages/round "
                f"{res.communications[-1] / T:.2f}  ({wall:.1f} s)",
                flush=True,
            )
            band = 2 * res.mse_sem
            ax.fill_between(res.rounds, res.mse_mean - band, res.mse_mean + band, color=color, alpha=0.3)
            ax.plot(res.rounds, res.mse_mean, color=color, lw=1.2, label=f"m = {m} (MC)")
            ax.plot(np.arange(T + 1), exact, color="k", ls="--", lw=0.8)
        ax.set(yscale="log", xlabel="round t", ylabel="MSE", title=f"{name}, N = 10 (dashed: exact)")
        ax.legend(fontsize=8)
    ax = axes[2]
    for name, marker in zip(ALGORITHMS, ("o", "s")):
        sel = [r for r in rows if r["algorithm"] == name]
        ms = [r["m"] for r in sel]
        ax.errorbar(
            ms,
            [r["final_mse_mc"] for r in sel],
            yerr=[2 * r["final_mse_sem"] for r in sel],
            fmt=marker,
            label=f"{name} MC",
        )
        ax.plot(ms, [r["final_mse_exact"] for r in sel], ls="--", color="k", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xticks=COHORTS,
        xticklabels=[str(m) for m in COHORTS],
        xlabel="clients per round m",
        ylabel=f"MSE at round {T}",
        title="final MSE against m (dashed: exact)",
    )
    ax.legend(fontsize=8)
    report = {"config": vars(args) | {"figures": str(args.figures)}, "rows": rows}
    return save_figure(fig, args.figures, "partial_participation.png", args.json, report)


if __name__ == "__main__":
    main()
