"""Coverage of confidence intervals for u^T theta* from one run: the FedLSA bootstrap paper's figure,
and what it could not run.

**The paper's experiment** (``--part paper``): Levin, Shuklin, Moulines, Mangold, Samsonov,
"Gaussian Approximation and Multiplier Bootstrap for Federated Linear Stochastic Approximation"
(arXiv:2605.19629, 2026), on their Garnet (30 states, 2 actions, branching 2, 5 features, gamma
0.95, N = 5 agents, kernel heterogeneity 0.02, reward heterogeneity 0.001: the authors' instance
``Garnet(gen_seed=10)``, rebuilt draw for draw by ``_bench.bootstrap_garnet`` from the same
generation seed), generative sampling, FedLSA with ``eta_t = (t + 100)^-0.6`` and
``H_t = ceil(5 (t + 1)^gamma_H)``, gamma_H in {0, 0.2}, a fixed random unit direction u, levels
0.80, 0.90, 0.95, started at ``theta*`` (from 0 the mean is still 26 sd from ``theta*`` at T = 2000
on this problem: no interval covers). For every seed and recorded round: the bootstrap's quantile
and normal intervals (B replicates, standardized Beta(1/2, 2) weights), the plug-in interval
(running estimates of A_bar and the noise covariance through the Lyapunov equation, the paper's
baseline) and the exact interval (the exact ``Cov(theta_t)`` of ``fj.theory.exact_covariance``);
their coverage of ``u^T theta*`` over ``--seeds`` seeds, with binomial standard errors. Figure
``confidence_sets.png``: coverage against T, one row per gamma_H, one panel per level, bands of
+-2 s.e.; ``confidence_sets_variance.png``: the seeds' mean bootstrap variance of ``u^T theta_t``
over its exact variance, against T (the approach to 1).

**Beyond it** (``--part beyond``), level 0.90, figure ``confidence_sets_beyond.png``:

* SCAFFLSA on that Garnet with the paper's schedule (gamma_H = 0.2);
* QFedTD (one TD step per round, ``alpha_t = (t + 100)^-0.6``) through an unbiased random-2
  sparsifier (2 of the 5 coordinates, rescaled) and erasures with delivery probability 0.8: a
  lossy, finite-rate uplink whose exact second moments fedsa_jax has (a stochastic uniform
  quantizer's error covariance is not linear in ``x x^T``, so it has no exact interval);
* FedLSA under Markov sampling, on a Garnet small enough (6 states, 3 agents, d = 3) for the exact
  Markov covariance (216 joint chain states);
* heterogeneity strong enough that FedLSA's bias breaks the intervals (a heterogeneous Gaussian LSA
  problem, N = 5, d = 5, little noise, u along FedLSA's limit bias; on the Garnets the bias is a few
  thousandths of a standard deviation): a constant step and H, FedLSA against SCAFFLSA; the
  coverage that the exact bias predicts, ``Phi(z - beta/sigma) - Phi(-z - beta/sigma)`` (``beta``
  the exact mean's bias along u, ``sigma`` the exact sd), drawn beside the measured one.

    python benchmarks/confidence_sets.py [--part paper|beyond|all] [--seeds 400] [--replicates 100]
        [--rounds 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import jax
import matplotlib
import numpy as np
from _bench import bootstrap_garnet, write_json
from scipy.stats import norm

import fedsa_jax as fj

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LEVELS = (0.8, 0.9, 0.95)
METHODS = ("quantile", "normal", "plug_in", "exact")
COLORS = {"quantile": "C0", "normal": "C1", "plug_in": "C3", "exact": "C2"}
TAG = {0.8: "8", 0.9: "9", 0.95: "95"}


def unit_direction(dim):
    u = np.random.default_rng(0).normal(size=dim)
    return u / np.linalg.norm(u)


def coverage(problem, alg, T, n, B, every, levels, theta0, u):
    """Run ``fj.plug_in(fj.bootstrap(alg, B))`` with every interval's metric; returns the result, the
    exact sd and bias of u^T theta_t for t = 0..T, and the seconds of the run and of the theory."""
    start = time.perf_counter()
    sd = fj.inference.exact_sd(problem, alg, T, u, theta0)
    bias = (fj.theory.exact_mean(problem, alg, T, theta0) - np.asarray(problem.theta_star)) @ u
    theory_s = time.perf_counter() - start
    metrics = fj.inference.intervals(u, levels=levels, methods=METHODS, exact_sd=sd, bounds=False)
    metrics["bootstrap_variance"] = fj.inference.bootstrap_variance(u)
    start = time.perf_counter()
    res = fj.simulate(
        1, problem, fj.plug_in(fj.bootstrap(alg, B)), T, n, theta0=theta0, metrics=metrics, record_every=every
    )
    return res, sd, bias, time.perf_counter() - start, theory_s


def report_run(label, res, sd, bias, run_s, theory_s, levels, n):
    """Print the coverage at the last round; return the run's numbers for the JSON report."""
    out = dict(label=label, seconds=run_s, theory_seconds=theory_s, rounds=res.rounds.tolist(), coverage={})
    T = int(res.rounds[-1])
    # the seeds' mean bootstrap variance of u^T theta_t over the exact Var(u^T theta_t)
    bv, exact = res.metrics["bootstrap_variance"], sd[res.rounds] ** 2
    with np.errstate(divide="ignore", invalid="ignore"):  # round 0: both 0
        out["variance_ratio"] = dict(mean=(bv.mean / exact).tolist(), sem=(bv.sem / exact).tolist())
    ratio = ", ".join(
        f"T={t}: {m:.3f} +- {e:.3f}"
        for t, m, e in zip(res.rounds, out["variance_ratio"]["mean"], out["variance_ratio"]["sem"])
        if t in (res.rounds[1], res.rounds[len(res.rounds) // 4], res.rounds[len(res.rounds) // 2], T)
    )
    print(f"{label}: bootstrap variance / exact variance of u^T theta_t: {ratio}")
    print(
        f"{label}: {run_s:.0f} s ({theory_s:.1f} s exact theory); exact bias of u^T theta_T {bias[-1]:.3g} = "
        f"{bias[-1] / sd[-1]:.2g} sd; coverage at T={T}:",
        flush=True,
    )
    for level in levels:
        cells = []
        for m in METHODS:
            stats = res.metrics[f"covers_{m}_{TAG[level]}"]
            out["coverage"][f"{m}_{level}"] = dict(mean=stats.mean.tolist(), sem=stats.sem.tolist())
            z = (stats.mean[-1] - level) / max(math.sqrt(level * (1 - level) / n), 1e-12)
            cells.append(f"{m} {stats.mean[-1]:.3f} +- {stats.sem[-1]:.3f} ({z:+.1f})")
        print(f"  level {level:.2f}: " + "; ".join(cells))
    return out


def draw(ax, run, level):
    """One run's coverage curves at ``level`` (from its report), bands of +-2 s.e."""
    r = np.asarray(run["rounds"][1:])
    for m in METHODS:
        stats = run["coverage"][f"{m}_{level}"]
        mean, sem = np.asarray(stats["mean"][1:]), np.asarray(stats["sem"][1:])
        ax.plot(r, mean, color=COLORS[m], label=m)
        ax.fill_between(r, mean - 2 * sem, mean + 2 * sem, color=COLORS[m], alpha=0.12)
    ax.axhline(level, color="k", lw=0.8)
    ax.set_xlabel("round T")


def paper(args, report):
    problem = bootstrap_garnet()
    u = unit_direction(problem.dim)
    T, n, B = args.rounds, args.seeds, args.replicates
    theta0 = np.asarray(problem.theta_star)
    every = max(1, T // args.records)
    eta = fj.schedule(fj.optim.inverse_power, eta0=1.0, t0=100.0, power=0.6, per_round=True)
    print(
        "the paper's Garnet (S=30, A=2, d=5, N=5), FedLSA eta_t=(t+100)^-0.6, "
        f"H_t=ceil(5 (t+1)^gamma_H), T={T}, "
        f"{n} seeds, B={B}, theta_0 = theta*, float64"
    )
    report["paper"] = dict(seeds=n, replicates=B, rounds=T, direction=u.tolist(), runs=[])
    for power in args.powers:
        alg = fj.fedlsa(eta, fj.growing_local_steps(5, power, T))
        res, sd, bias, run_s, theory_s = coverage(problem, alg, T, n, B, every, LEVELS, theta0, u)
        run = report_run(f"FedLSA gamma_H={power:g}", res, sd, bias, run_s, theory_s, LEVELS, n)
        run["gamma_H"] = power
        run["local_steps"] = int(fj.optim.total_local_steps(alg.config.num_local_steps, T))
        report["paper"]["runs"].append(run)


def paper_figure(report, figures):
    runs, n, B = report["runs"], report["seeds"], report["replicates"]
    fig, axes = plt.subplots(len(runs), 3, figsize=(15, 3.8 * len(runs)), dpi=110, squeeze=False)
    for row, run in zip(axes, runs):
        for ax, level in zip(row, LEVELS):
            draw(ax, run, level)
            ax.set_title(f"$\\gamma_H$={run['gamma_H']:g}, level {level:.2f}")
            ax.set_ylim(max(0.0, level - 0.2), min(1.0, level + 0.08))
        row[0].set_ylabel(r"coverage of $u^T\theta^*$ ($\pm$2 s.e.)")
    axes[0, -1].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"FedLSA, the paper's Garnet: bootstrap (B={B}), plug-in and exact intervals, {n} seeds, "
        r"$\theta_0=\theta^*$"
    )
    fig.tight_layout()
    save(fig, figures, "confidence_sets.png")


def variance_figure(report, figures):
    """The seeds' mean bootstrap variance of u^T theta_t over the exact one, against t."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for run, color in zip(report["runs"], ("C0", "C1", "C2")):
        r = np.asarray(run["rounds"][1:])
        mean, sem = (np.asarray(run["variance_ratio"][k][1:]) for k in ("mean", "sem"))
        ax.plot(r, mean, color=color, label=f"$\\gamma_H$={run['gamma_H']:g}")
        ax.fill_between(r, mean - 2 * sem, mean + 2 * sem, color=color, alpha=0.15)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xlabel="round T", ylabel="bootstrap variance / exact variance ($\\pm$2 s.e.)")
    ax.set_title(
        f"FedLSA, the paper's Garnet: B={report['replicates']}, {report['seeds']} seeds",
        fontsize=10,
    )
    ax.legend()
    fig.tight_layout()
    save(fig, figures, "confidence_sets_variance.png")


def beyond(args, report):
    level, n, B = 0.9, args.seeds, args.replicates
    T = args.beyond_rounds
    every = max(1, T // args.records)
    eta = fj.schedule(fj.optim.inverse_power, eta0=1.0, t0=100.0, power=0.6, per_round=True)
    report["beyond"] = dict(seeds=n, replicates=B, rounds=T, level=level, runs=[])
    garnet = bootstrap_garnet()
    small = fj.problems.garnet(
        jax.random.key(0), num_agents=3, heterogeneity="homogeneous", num_states=6, dim=3, sampling="markov"
    )
    strong = fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=5, dim=5, heterogeneity=1.0, noise_A=0.05, noise_b=0.1
    )
    along_bias = np.asarray(fj.theory.fedlsa_bias(strong, 0.1, 10))
    along_bias /= np.linalg.norm(along_bias)
    hetero = "Gaussian LSA, heterogeneity 1, eta=0.1, H=10,\nu along FedLSA's bias"
    cases = [
        (
            "SCAFFLSA",
            garnet,
            fj.scafflsa(eta, fj.growing_local_steps(5, 0.2, T)),
            "the paper's Garnet, $\\gamma_H$=0.2",
            None,
        ),
        (
            "QFedTD",
            garnet,
            fj.qfedtd(eta, fj.channel.rand_k(2), success_prob=0.8),
            "the paper's Garnet, random-2 of 5, delivery 0.8",
            None,
        ),
        ("FedLSA Markov", small, fj.fedlsa(eta, 5), "Markov sampling, 6 states, N=3, H=5", None),
        ("FedLSA heterogeneous", strong, fj.fedlsa(0.1, 10), hetero, along_bias),
        ("SCAFFLSA heterogeneous", strong, fj.scafflsa(0.1, 10), hetero, along_bias),
    ]
    for label, problem, alg, caption, u in cases:
        u = unit_direction(problem.dim) if u is None else u
        theta0 = np.asarray(problem.theta_star)
        res, sd, bias, run_s, theory_s = coverage(problem, alg, T, n, B, every, (level,), theta0, u)
        run = report_run(label, res, sd, bias, run_s, theory_s, (level,), n)
        z = norm.ppf(1 - (1 - level) / 2)
        with np.errstate(divide="ignore", invalid="ignore"):  # round 0: sd 0
            predicted = norm.cdf(z - bias / sd) - norm.cdf(-z - bias / sd)
        run["predicted_exact_coverage"] = predicted[res.rounds].tolist()
        run["caption"] = caption
        report["beyond"]["runs"].append(run)


def beyond_figure(report, figures):
    level, n, B = report["level"], report["seeds"], report["replicates"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), dpi=110)
    for ax, run in zip(axes.flat, report["runs"]):
        draw(ax, run, level)
        predicted = np.asarray(run["predicted_exact_coverage"][1:])
        if np.any(np.abs(predicted - level) > 0.01):
            ax.plot(run["rounds"][1:], predicted, "k:", label="exact interval,\npredicted by the exact bias")
        ax.set_title(f"{run['label']}\n{run['caption']}", fontsize=9)
        ax.set_ylim(0.0, 1.03)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"coverage of $u^T\\theta^*$ at level {level} ($\\pm$2 s.e.)")
    handles, labels = axes.flat[3].get_legend_handles_labels()
    axes.flat[-1].axis("off")
    axes.flat[-1].legend(handles, labels, loc="center", fontsize=10)
    fig.suptitle(f"Beyond the paper: B={B}, {n} seeds, level {level}, " + r"$\theta_0=\theta^*$")
    fig.tight_layout()
    save(fig, figures, "confidence_sets_beyond.png")


def save(fig, figures, name):
    figures.mkdir(parents=True, exist_ok=True)
    path = figures / name
    fig.savefig(path)
    print(f"figure -> {path}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("paper", "beyond", "all"), default="all")
    ap.add_argument("--seeds", type=int, default=400)
    ap.add_argument("--replicates", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2000, help="T of the paper's experiment")
    ap.add_argument("--beyond-rounds", type=int, default=1000, help="T of the experiments beyond it")
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--powers", type=float, nargs="+", default=[0.0, 0.2])
    ap.add_argument("--figures", type=Path, default=Path("benchmarks/figures"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, metavar="JSON", help="draw a saved report's figures; run nothing")
    args = ap.parse_args(argv)
    if args.plot:
        saved = json.loads(Path(args.plot).read_text())
        for part, figure in (("paper", paper_figure), ("paper", variance_figure), ("beyond", beyond_figure)):
            if part in saved and (
                figure is not variance_figure or "variance_ratio" in saved[part]["runs"][0]
            ):
                figure(saved[part], args.figures)
        return
    fj.use_cpu_cores()
    jax.config.update("jax_enable_x64", True)
    report = {}
    start = time.perf_counter()
    if args.part in ("paper", "all"):
        paper(args, report)
        paper_figure(report["paper"], args.figures)
        variance_figure(report["paper"], args.figures)
    if args.part in ("beyond", "all"):
        beyond(args, report)
        beyond_figure(report["beyond"], args.figures)
    report["seconds"] = time.perf_counter() - start
    print(f"total {report['seconds']:.0f} s")
    write_json(args.json, report)


if __name__ == "__main__":
    main()
