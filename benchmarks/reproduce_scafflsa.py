"""Reproduce the SCAFFLSA paper's Figures 1 and 2 with many more seeds, and overlay theory.

Mangold, Samsonov, Labbi, Levin, Alami, Naumov, Moulines, "SCAFFLSA: Taming
Heterogeneity in Federated Linear Stochastic Approximation and TD Learning",
NeurIPS 2024, Sec. 6: federated TD(0) on Garnet problems (30 states, 2 actions,
branching 2, d=8, gamma=0.95), generative sampling, step size eta=0.1, theta_0=0.

  Figure 1: MSE vs communication rounds, homogeneous vs heterogeneous agents,
            N in {10, 100}, H in {10, 1000}, FedLSA vs SCAFFLSA, T H = 1e5 local
            steps, with FedLSA's predicted squared bias |fedlsa_bias|^2 and, for
            N=10, the exact MSE curves of both algorithms (fj.theory.exact_mse).
                                                                 -> scafflsa_fig1.png
  Figure 2: final MSE vs N in {1, 10, 100, 1000}, H=100, T H = 2e4 local steps
            started at theta_star (the stationary regime), with a 1/N reference
            and the exact values for N <= 10.                    -> scafflsa_fig2.png

Results are saved per configuration (``fj.sweep``, so a rerun only computes what
is missing), and summary.json reports: FedLSA's limit against theta_star +
fedlsa_bias (z-scores per coordinate), SCAFFLSA's limit against theta_star, the
Monte Carlo MSE against the exact MSE, and the fitted speed-up slopes.

    python benchmarks/reproduce_scafflsa.py [--seeds 200] [--out benchmarks/out/scafflsa]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np
from _bench import add_cpu_devices_option, use_cpu_devices

import fedsa_jax as fj
from fedsa_jax import plotting
from fedsa_jax._io import atomic_savez, atomic_write

ETA = 0.1
FIG1_STEPS = 100_000
FIG2_STEPS = 20_000
FIG2_H = 100
EXACT_MAX_AGENTS = 10  # exact second-moment curves are drawn where N <= this (cost ~ N^2 per step)
LABELS = {"fedlsa": "FedLSA", "scafflsa": "SCAFFLSA"}


def build(config):
    problem = fj.problems.garnet(
        jax.random.key(config["problem_seed"]),
        num_agents=config["agents"],
        heterogeneity=config["heterogeneity"],
    )
    make = fj.fedlsa if config["algorithm"] == "fedlsa" else fj.scafflsa
    return problem, make(ETA, config["local_steps"])


def z_scores(res, target):
    """Final ``theta_mean - target`` in units of its standard error, per coordinate."""
    return (res.theta_mean[-1] - target) / res.theta_sem[-1]


def cached(path: Path, compute):
    """``compute()`` (a dict of arrays), saved to / loaded from ``path`` (whose name carries every
    parameter the value depends on)."""
    if path.exists():
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    value = compute()
    atomic_savez(path, **value)
    return value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--records", type=int, default=200, help="recorded rounds per curve (about)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/scafflsa"))
    ap.add_argument("--figures", type=Path, default=Path("benchmarks/figures"))
    ap.add_argument("--no-exact", action="store_true", help="skip the exact second-moment curves")
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    use_cpu_devices(args.cpu_devices)
    args.out.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(2024)
    summary = {
        "config": {
            "eta": ETA,
            "seeds": args.seeds,
            "garnet": "S=30, 2 actions, branching 2, d=8, gamma=0.95, generative sampling",
            "fig1_local_steps": FIG1_STEPS,
            "fig2_local_steps": FIG2_STEPS,
            "fig2_H": FIG2_H,
        }
    }
    t0 = time.perf_counter()

    # ---------------- Figure 1 ----------------
    het_levels = ("homogeneous", "heterogeneous")
    configs = fj.grid(
        problem_seed=0,
        heterogeneity=list(het_levels),
        agents=[10, 100],
        local_steps=[10, 1000],
        algorithm=["fedlsa", "scafflsa"],
    )
    rounds = lambda c: FIG1_STEPS // c["local_steps"]  # noqa: E731
    every = lambda c: max(1, rounds(c) // args.records)  # noqa: E731
    print(f"Figure 1: {len(configs)} runs, {args.seeds} seeds")
    fig1 = fj.sweep(key, configs, build, rounds, args.seeds, out_dir=args.out / "fig1", record_every=every)
    print(f"  simulated in {time.perf_counter() - t0:.0f} s")
    fig, axes = plt.subplots(2, 4, figsize=(16, 7.2), dpi=110, sharey="row")
    summary["fig1"] = []
    for i, het in enumerate(het_levels):
        for j, (N, H) in enumerate([(10, 10), (10, 1000), (100, 10), (100, 1000)]):
            panel = {
                e.config["algorithm"]: e.result
                for e in fig1
                if (e.config["heterogeneity"], e.config["agents"], e.config["local_steps"]) == (het, N, H)
            }
            problem, _ = build(
                {
                    "problem_seed": 0,
                    "agents": N,
                    "heterogeneity": het,
                    "algorithm": "fedlsa",
                    "local_steps": H,
                }
            )
            bias = fj.theory.fedlsa_bias(problem, ETA, H)
            theta_star = np.asarray(problem.theta_star, np.float64)
            exact = {}
            if N <= EXACT_MAX_AGENTS and not args.no_exact:
                for name in panel:
                    tag = f"exact_{name}_{het}_N{N}_H{H}_eta{ETA}_T{rounds({'local_steps': H})}.npz"
                    exact[name] = cached(
                        args.out / tag,
                        lambda: {
                            "mse": fj.theory.exact_mse(
                                problem,
                                build(
                                    {
                                        "problem_seed": 0,
                                        "agents": N,
                                        "heterogeneity": het,
                                        "algorithm": name,
                                        "local_steps": H,
                                    }
                                )[1],
                                rounds({"local_steps": H}),
                            )
                        },
                    )["mse"]
            row = {"heterogeneity": het, "N": N, "H": H, "predicted_squared_bias": float(bias @ bias)}
            for name, res in panel.items():
                target = theta_star + (bias if name == "fedlsa" else 0.0)
                z = z_scores(res, target)
                row[name] = {
                    "final_mse": float(res.mse_mean[-1]),
                    "final_mse_sem": float(res.mse_sem[-1]),
                    "final_squared_error_of_mean": float(np.sum((res.theta_mean[-1] - theta_star) ** 2)),
                    "max_abs_z_limit_vs_prediction": float(np.max(np.abs(z))),
                    "num_diverged": int(res.num_diverged[-1]),
                }
                if name in exact:
                    e = exact[name][res.rounds]
                    with np.errstate(divide="ignore", invalid="ignore"):  # round 0: no spread
                        zc = (res.mse_mean - e) / res.mse_sem
                    half = len(e) // 2
                    row[name]["exact_final_mse"] = float(e[-1])
                    row[name]["max_abs_z_mse_vs_exact"] = float(np.nanmax(np.abs(zc[1:])))
                    row[name]["mean_z_mse_vs_exact_second_half"] = float(np.mean(zc[half:]))
                    row[name]["mc_over_exact_second_half"] = float(
                        res.mse_mean[half:].mean() / e[half:].mean()
                    )
            summary["fig1"].append(row)
            ax = axes[i, j]
            level = float(bias @ bias)
            floor = min(float(np.min(r.mse_mean)) for r in panel.values())
            # a bias far below every mean curve would squash the axis: say it in the title instead
            shown = level > 0.1 * floor
            plotting.plot_mse(
                {LABELS[k]: panel[k] for k in ("fedlsa", "scafflsa")},
                ax=ax,
                band="quantiles",
                theory={LABELS[k]: v for k, v in exact.items()},
                reference_lines={r"FedLSA bias $\|\theta_\infty - \theta_\star\|^2$": level}
                if shown
                else None,
                title=f"{het}, N={N}, H={H}" + ("" if shown else f"\nFedLSA bias$^2$ = {level:.1g}"),
                legend=(i, j) == (1, 1),
            )
            if j:
                ax.set_ylabel("")
    fig.suptitle(
        f"SCAFFLSA Figure 1: federated TD(0) on Garnet, $\\eta$={ETA}, {args.seeds} seeds "
        "(mean; bands: 5-95% and 25-75% of seeds; dotted: exact MSE, N=10)",
        fontsize=11,
    )
    fig.tight_layout()
    for folder in (args.out, args.figures):
        atomic_write(folder / "scafflsa_fig1.png", lambda f: fig.savefig(f, format="png"))
    plt.close(fig)

    # ---------------- Figure 2 ----------------
    agents = [1, 10, 100, 1000]
    configs = fj.grid(
        problem_seed=0,
        heterogeneity=list(het_levels),
        agents=agents,
        local_steps=FIG2_H,
        algorithm=["fedlsa", "scafflsa"],
    )
    t1 = time.perf_counter()
    print(f"Figure 2: {len(configs)} runs, {args.seeds} seeds")
    T2 = FIG2_STEPS // FIG2_H

    def theta_star_of(c):
        return np.asarray(build(c)[0].theta_star, np.float64)

    # Start every run at its own theta_star: fj.sweep takes one theta0, so run per N.
    fig2 = []
    for N in agents:
        group = [c for c in configs if c["agents"] == N]
        stars = {c["heterogeneity"]: theta_star_of(c) for c in group}
        for het in het_levels:
            sub = [c for c in group if c["heterogeneity"] == het]
            fig2 += fj.sweep(
                key,
                sub,
                build,
                T2,
                args.seeds,
                out_dir=args.out / "fig2" / f"{het}_N{N}",
                record_every=max(1, T2 // args.records),
                theta0=stars[het],
            )
    print(f"  simulated in {time.perf_counter() - t1:.0f} s")
    series, exact2, summary["fig2"] = {}, {}, {}
    for het in het_levels:
        for name in ("fedlsa", "scafflsa"):
            label = f"{LABELS[name]}, {het}"
            series[label] = {
                e.config["agents"]: e.result
                for e in fig2
                if (e.config["heterogeneity"], e.config["algorithm"]) == (het, name)
            }
            final = np.array([series[label][N].mse_mean[-1] for N in agents])
            sem = np.array([series[label][N].mse_sem[-1] for N in agents])
            # weighted least squares of log10(MSE) on log10(N); N=1 is a single agent, heterogeneous or
            # not, so the fit over N >= 10 is the speed-up among heterogeneous agents
            slope = np.polyfit(np.log10(agents), np.log10(final), 1, w=final / sem)[0]
            slope10 = np.polyfit(np.log10(agents[1:]), np.log10(final[1:]), 1, w=(final / sem)[1:])[0]
            pair = np.diff(np.log10(final)) / np.diff(np.log10(agents))
            bias2 = [
                float(
                    np.sum(
                        fj.theory.fedlsa_bias(
                            build(
                                dict(
                                    problem_seed=0,
                                    agents=N,
                                    heterogeneity=het,
                                    algorithm=name,
                                    local_steps=FIG2_H,
                                )
                            )[0],
                            ETA,
                            FIG2_H,
                        )
                        ** 2
                    )
                )
                for N in agents
            ]
            row = {
                "final_mse": final.tolist(),
                "final_mse_sem": sem.tolist(),
                "slope_fit": float(slope),
                "slope_fit_N10_to_1000": float(slope10),
                "slope_per_decade": pair.tolist(),
                "fedlsa_predicted_squared_bias": bias2,
            }
            if not args.no_exact:
                ex = {}
                for N in agents:
                    if N <= EXACT_MAX_AGENTS:
                        c = {
                            "problem_seed": 0,
                            "agents": N,
                            "heterogeneity": het,
                            "algorithm": name,
                            "local_steps": FIG2_H,
                        }
                        problem, alg = build(c)
                        ex[N] = float(
                            cached(
                                args.out / f"exact2_{name}_{het}_N{N}_H{FIG2_H}_eta{ETA}_T{T2}_star.npz",
                                lambda: {
                                    "mse": fj.theory.exact_mse(problem, alg, T2, theta0=problem.theta_star)
                                },
                            )["mse"][-1]
                        )
                exact2[label] = ex
                row["exact_final_mse"] = {str(k): v for k, v in ex.items()}
                row["z_mc_vs_exact"] = {
                    str(k): float((series[label][k].mse_mean[-1] - v) / series[label][k].mse_sem[-1])
                    for k, v in ex.items()
                }
            summary["fig2"][label] = row
    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=130)
    plotting.plot_final_mse_vs_agents(
        series,
        ax=ax,
        theory=exact2,
        title=f"SCAFFLSA Figure 2: final MSE after {T2} rounds (H={FIG2_H}, "
        f"$\\eta$={ETA}), {args.seeds} seeds",
    )
    het_bias = summary["fig2"]["FedLSA, heterogeneous"]["fedlsa_predicted_squared_bias"]
    ax.plot(agents[1:], het_bias[1:], ":", color="C2", lw=1.5, label=r"FedLSA heterogeneous: $\|$bias$\|^2$")
    ax.legend(fontsize=8, title=r"mean $\pm$ 2 s.e.", title_fontsize=8)
    for folder in (args.out, args.figures):
        atomic_write(folder / "scafflsa_fig2.png", lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    summary["wall_seconds"] = time.perf_counter() - t0
    atomic_write(args.out / "summary.json", lambda f: f.write(json.dumps(summary, indent=2)), mode="w")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
