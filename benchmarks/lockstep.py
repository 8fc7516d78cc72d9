"""Agents out of lockstep: heterogeneous local work, its objective inconsistency and its removal.

Heterogeneous Gaussian LSA (``random_gaussian_lsa``, N = 10, d = 4, heterogeneity 0.5, noise_A 0.1,
noise_b 0.3), float64, started at ``theta = 0``.
Agent c runs ``H_c`` local steps, ``H_c = (1, 1, 2, 2, 4, 4, 8, 8, 16, 16)`` (``fj.local_work.fixed``;
mean 6.2), eta = 0.05. Three panels:

1. MSE against rounds (``--seeds`` seeds, mean +- 2 s.e.) of FedLSA and SCAFFLSA with plain and
   FedNova averaging, with ``fj.theory.exact_mse`` and the closed-form squared limit bias of each
   (``fj.theory.fedlsa_bias`` with the law; SCAFFLSA plain: ``|theta_H - theta*|^2`` exactly,
   FedNova: 0); the largest |MC - exact| in standard errors over the recorded rounds is printed.
2. The squared limit bias against eta (closed forms, exact mean's limit as points): FedLSA plain
   (tends to the objective inconsistency ``|theta_H - theta*|^2``), FedNova (O(eta^2), FedLSA's
   heterogeneity bias with each agent's own (H_c - 1) / 2), lockstep FedLSA with H = 6 (for scale),
   SCAFFLSA plain (``theta_H``, flat), SCAFFLSA FedNova (0).
3. Random work with the same law per agent, uniform on {1..11} (mean 6): independent counts vs
   one count shared by every agent, FedLSA, Monte Carlo against the exact MSE: same mean, different
   second moments.

    python benchmarks/lockstep.py [--seeds 2000] [--rounds 200] [--json out.json]   # about 3 min
"""

from __future__ import annotations

import jax
import matplotlib
import numpy as np
from _bench import exact_figure_args, mc_against_exact, save_figure

import fedsa_jax as fj

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COUNTS = (1, 1, 2, 2, 4, 4, 8, 8, 16, 16)
ETA = 0.05


def theta_H(problem, law):
    """The H_c-weighted solution ``(sum_c E[H_c] A_c)^{-1} sum_c E[H_c] b_c``."""
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    w = law.mean_steps(problem.num_agents)
    return np.linalg.solve(np.einsum("c,cij->ij", w, A), w @ b)


def main(argv=None):
    args, every = exact_figure_args(argv, __doc__.split("\n")[0], seeds=2000, rounds=200)
    problem = fj.problems.random_gaussian_lsa(
        jax.random.key(0), num_agents=10, dim=4, heterogeneity=0.5, noise_A=0.1, noise_b=0.3
    )
    star = np.asarray(problem.theta_star)
    T = args.rounds
    plain, nova = fj.local_work.fixed(COUNTS), fj.local_work.fixed(COUNTS, normalization="fednova")
    gap = float(np.sum((theta_H(problem, plain) - star) ** 2))
    runs = {
        "FedLSA, plain": (
            fj.fedlsa(ETA, plain),
            float(np.sum(fj.theory.fedlsa_bias(problem, ETA, plain) ** 2)),
        ),
        "FedLSA, FedNova": (
            fj.fedlsa(ETA, nova),
            float(np.sum(fj.theory.fedlsa_bias(problem, ETA, nova) ** 2)),
        ),
        "SCAFFLSA, plain": (fj.scafflsa(ETA, plain), gap),
        "SCAFFLSA, FedNova": (fj.scafflsa(ETA, nova), 0.0),
    }
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), dpi=110)
    report = {"counts": COUNTS, "eta": ETA, "objective_inconsistency": gap, "runs": [], "uniform": []}
    ax = axes[0]
    for (name, (alg, bias)), color in zip(runs.items(), ("C3", "C1", "C0", "C2")):
        row = mc_against_exact(ax, problem, alg, T, args.seeds, every, color, name)
        limit = fj.theory.exact_mean(problem, alg, 20 * T)[-1]
        row.update(squared_bias_closed_form=bias, squared_bias_exact_mean=float(np.sum((limit - star) ** 2)))
        report["runs"].append(row)
        print(
            f"{name:18s} final MSE {row['final_mse']:.4g} +- {row['final_sem']:.2g} "
            f"(exact {row['exact_final']:.4g}, max |z| {row['max_z']:.2f}); squared limit bias {bias:.4g} "
            f"(exact mean's limit {row['squared_bias_exact_mean']:.4g}), {row['seconds']:.1f} s"
        )
        if bias > 0:
            ax.axhline(bias, color=color, ls=":", lw=1)
    ax.set(yscale="log", xlabel="round t", ylabel=r"$E|\theta_t - \theta^\star|^2$")
    ax.set_title(
        f"H_c = {COUNTS}, eta = {ETA}: MC (bands) vs exact;\ndotted: closed-form squared limit bias",
        fontsize=9,
    )
    ax.legend(fontsize=7)

    ax = axes[1]
    etas = np.geomspace(0.002, 0.1, 12)
    lock = fj.local_work.fixed([6] * 10)  # the integer 6: lockstep
    curves = {
        "FedLSA plain": [np.sum(fj.theory.fedlsa_bias(problem, e, plain) ** 2) for e in etas],
        "FedLSA FedNova": [np.sum(fj.theory.fedlsa_bias(problem, e, nova) ** 2) for e in etas],
        "FedLSA lockstep H=6": [np.sum(fj.theory.fedlsa_bias(problem, e, lock) ** 2) for e in etas],
    }
    for (name, values), color in zip(curves.items(), ("C3", "C1", "C7")):
        ax.plot(etas, values, color=color, marker="o", ms=3, label=name)
    ax.axhline(gap, color="C0", ls="--", label=r"SCAFFLSA plain: $|\theta_H - \theta^\star|^2$ (exact)")
    for e in etas[::3]:  # the exact mean's limits at a few step sizes, as points
        for alg, color in ((fj.fedlsa(float(e), plain), "C3"), (fj.scafflsa(float(e), plain), "C0")):
            limit = fj.theory.exact_mean(problem, alg, int(40 / e))[-1]
            ax.plot([e], [np.sum((limit - star) ** 2)], "x", color=color, ms=7)
    ax.set(
        xscale="log", yscale="log", xlabel=r"step size $\eta$", ylabel=r"$|\theta_\infty - \theta^\star|^2$"
    )
    ax.set_title(
        "squared limit bias (lines: closed forms; x: exact mean's limit)\nSCAFFLSA FedNova: 0", fontsize=9
    )
    ax.legend(fontsize=7)
    report["bias_vs_eta"] = {"eta": etas.tolist(), **{k: [float(v) for v in vs] for k, vs in curves.items()}}

    ax = axes[2]
    for shared, color in ((False, "C2"), (True, "C4")):
        law = fj.local_work.uniform(1, 11, shared=shared)
        label = "one count shared" if shared else "independent counts"
        row = mc_against_exact(ax, problem, fj.fedlsa(ETA, law), T, args.seeds, every, color, label, key=2)
        report["uniform"].append(dict(row, shared=shared))
        print(
            f"uniform{{1..11}}, {label:18s} final MSE {row['final_mse']:.4g} "
            f"(exact {row['exact_final']:.4g}, max |z| {row['max_z']:.2f})"
        )
    ax.set(yscale="log", xlabel="round t", ylabel=r"$E|\theta_t - \theta^\star|^2$")
    ax.set_title("FedLSA, H_c ~ U{1..11}: same mean, different second moments", fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, args.figures, "lockstep.png", args.json, report)


if __name__ == "__main__":
    main()
