"""Privacy-utility: the MSE at the last round against epsilon (delta = 1e-5), Monte Carlo and exact.

Heterogeneous Garnet TD (generative, S = 10, d = 4, N = 10), float64, ``--rounds`` rounds (one
release each), clipping norm C = 1. For each target epsilon the noise multiplier is the one that
spends it (``fj.accounting.noise_multiplier``, dp-accounting's RDP accountant), and the runs are:

* FedLSA (eta = 0.5, H = 5), central and local noise, every agent; central with a cohort of 5 of 10
  (amplification by sampling without replacement, relation *replace one*);
* FedLSA central with adaptive clipping (Andrew et al. 2021: C follows the median message norm from
  C = 1, count noise sigma_b = sigma, the sum's multiplier sigma_Delta = 1.15 sigma);
* SCAFFLSA (the same, local noise: central noise is refused for control variates);
* QFedTD (alpha = 0.5, one step a round), central noise;
* beside FedLSA central and local, the exact MSE of the same noise without clipping
  (``clip=False``, ``exact_mse``): the gap is what clipping changes, and the Lyapunov noise floor
  (``fj.theory.privacy_noise_floor``) added to the noise-free stationary MSE.

    python benchmarks/privacy.py [--seeds 500] [--rounds 200] [--json out.json]   # about 2 min
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import matplotlib
import numpy as np
from _bench import save_figure

import fedsa_jax as fj

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0, 64.0)
C = 1.0


def _adaptive(p):
    """``p`` with adaptive clipping from C (Andrew et al. 2021): the median norm, count noise sigma_b =
    sigma (above sigma / 2, as their accounting needs; their m / 20 is for hundreds of agents)."""
    return fj.channel.privacy(
        p.noise_multiplier, p.clip_norm, "central", target_quantile=0.5, count_noise=p.noise_multiplier
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--figures", type=Path, default=Path("benchmarks/figures"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    problem = fj.problems.garnet(
        jax.random.key(0), num_agents=10, num_states=10, dim=4, heterogeneity="heterogeneous", dtype="float64"
    )
    N, T = problem.num_agents, args.rounds
    runs = {  # label -> (algorithm factory of the privacy mechanism, mode, cohort, color)
        "FedLSA central": (lambda p: fj.fedlsa(0.5, 5, privacy=p), "central", None, "C0"),
        "FedLSA local": (lambda p: fj.fedlsa(0.5, 5, privacy=p), "local", None, "C1"),
        "FedLSA central, cohort 5/10": (
            lambda p: fj.fedlsa(0.5, 5, clients_per_round=5, privacy=p),
            "central",
            5,
            "C2",
        ),
        "FedLSA central, adaptive C": (
            lambda p: fj.fedlsa(0.5, 5, privacy=_adaptive(p)),
            "central",
            None,
            "C5",
        ),
        "SCAFFLSA local": (lambda p: fj.scafflsa(0.5, 5, privacy=p), "local", None, "C3"),
        "QFedTD central": (lambda p: fj.qfedtd(0.5, privacy=p), "central", None, "C4"),
    }
    report: dict = {"rounds": T, "clip_norm": C, "epsilons": list(EPSILONS), "runs": {}}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for label, (make, mode, m, color) in runs.items():
        rows = []
        t0 = time.perf_counter()
        for eps in EPSILONS:
            sigma = fj.accounting.noise_multiplier(eps, T, N, 1e-5, mode, m)
            res = fj.simulate(
                1, problem, make(fj.channel.privacy(sigma, C, mode)), T, args.seeds, record_every=T
            )
            row = dict(
                epsilon=float(res.privacy["epsilon"]),
                sigma=sigma,
                mse=float(res.mse_mean[-1]),
                sem=float(res.mse_sem[-1]),
                diverged=int(res.num_diverged[-1]),
            )
            if label in ("FedLSA central", "FedLSA local"):  # the same noise without clipping, exactly
                unclipped = make(fj.channel.privacy(sigma, C, mode, clip=False))
                row["exact_unclipped"] = float(fj.theory.exact_mse(problem, unclipped, T)[-1])
                floor = fj.theory.privacy_noise_floor(
                    problem, 0.5, 5, fj.channel.privacy(sigma, C, mode, clip=False)
                )
                row["floor_added"] = floor
            rows.append(row)
        report["runs"][label] = rows
        mse = np.array([r["mse"] for r in rows])
        sem = np.array([r["sem"] for r in rows])
        ax.errorbar(
            EPSILONS, mse, yerr=2 * sem, fmt="o-", color=color, ms=4, capsize=2, label=f"{label} (MC)"
        )
        if "exact_unclipped" in rows[0]:
            ax.plot(EPSILONS, [r["exact_unclipped"] for r in rows], "--", color=color, lw=1,
                    label=f"{label}: same noise, no clipping (exact)")  # fmt: skip
        cells = ", ".join(f"eps {r['epsilon']:.3g}: sigma {r['sigma']:.3g} MSE {r['mse']:.4g}" for r in rows)
        print(f"{label:28s} {cells} ({time.perf_counter() - t0:.1f} s)", flush=True)
        for r in rows:
            if "exact_unclipped" in r:
                print(f"    eps {r['epsilon']:.3g}: unclipped exact {r['exact_unclipped']:.4g}, "
                      f"Lyapunov floor added {r['floor_added']:.4g}")  # fmt: skip
    free = float(fj.theory.exact_mse(problem, fj.fedlsa(0.5, 5), T)[-1])
    report["fedlsa_no_privacy_exact"] = free
    ax.axhline(free, color="k", ls=":", lw=1, label="FedLSA without privacy (exact)")
    ax.set(xscale="log", yscale="log", xlabel=r"$\varepsilon$ at $\delta = 10^{-5}$ (RDP accountant)",
           ylabel=f"MSE at round {T}")  # fmt: skip
    ax.set_ylim(0.05, 3e6)  # adaptive clipping with 10 agents blows up at epsilon <= 4 (printed)
    ax.set_title(f"Garnet TD, N={N}, C={C:g}, {T} releases: privacy against utility", fontsize=9)
    ax.legend(fontsize=6)
    print(f"FedLSA without privacy: exact MSE at round {T} {free:.4g}")
    return save_figure(fig, args.figures, "privacy.png", args.json, report)


if __name__ == "__main__":
    main()
