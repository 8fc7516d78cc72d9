"""The Markov bias, exactly: how far the stationary mean under Markov sampling lies from the one under
generative (i.i.d.) sampling, as a function of the step size eta and of skip.

On a small Garnet problem (3 agents, 5 states, d = 2) both limits are solved directly
(``fj.theory.stationary_mean``: under Markov sampling the fixed point of the means conditioned on
the agents' joint chain state, ``fedsa_jax.theory.markov``), for FedLSA and SCAFFLSA with H local
steps. The Markov bias ``|| theta_inf(markov) - theta_inf(generative) ||`` is O(eta) for a chain that
mixes (the local steps see correlated observations: Mangold et al. 2024, Sec. 4; Srikant and Ying
2019 for TD(0)) and shrinks with skip as the kept observations decorrelate.

    python benchmarks/markov_bias.py   # -> figures/markov_bias.png, results/markov_bias.json
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

from _bench import write_json  # noqa: E402

import fedsa_jax as fj  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ETAS = np.logspace(-2.5, 0.0, 11)
SKIPS = (1, 2, 4, 8)
H = 4


def problem(sampling: str):
    key = jax.random.key(0)
    return fj.problems.garnet(key, num_agents=3, num_states=5, dim=2, gamma=0.8, sampling=sampling)


def bias_table(make, markov, generative) -> dict:
    """``{skip: [||theta_inf(markov) - theta_inf(generative)|| for eta in ETAS]}`` (NaN where the mean
    recursion does not contract), and the generative limit's distance to theta_star."""
    star = np.asarray(generative.theta_star, np.float64)
    table, heterogeneity = {}, []
    for skip in SKIPS:
        row = []
        for eta in ETAS:
            alg = make(float(eta), skip)
            try:
                gap = fj.theory.stationary_mean(markov, alg) - fj.theory.stationary_mean(generative, alg)
            except ValueError:  # spectral radius >= 1: no limit
                row.append(float("nan"))
                continue
            row.append(float(np.linalg.norm(gap)))
        table[str(skip)] = row
    for eta in ETAS:
        try:
            limit = fj.theory.stationary_mean(generative, make(eta, 1))
            heterogeneity.append(float(np.linalg.norm(limit - star)))
        except ValueError:
            heterogeneity.append(float("nan"))
    return {"markov_bias": table, "generative_bias": heterogeneity}


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, name in zip(axes, report["algorithms"]):
        rows = report["algorithms"][name]
        for skip in SKIPS:
            ax.loglog(ETAS, rows["markov_bias"][str(skip)], "o-", label=f"Markov bias, skip={skip}")
        if np.nanmax(rows["generative_bias"]) > 1e-10:  # SCAFFLSA's is 0 (rounding): not drawn
            ax.loglog(ETAS, rows["generative_bias"], "k--", label=r"$\|\theta_\infty^{gen} - \theta^\star\|$")
        ax.loglog(ETAS, ETAS * rows["markov_bias"]["1"][0] / ETAS[0], "k:", lw=0.8, label=r"$\propto \eta$")
        ax.set_title(f"{name}, H={H}")
        ax.set_xlabel(r"step size $\eta$")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(r"$\|\theta_\infty^{markov} - \theta_\infty^{gen}\|$")
    axes[0].legend(fontsize=8)
    fig.suptitle("Markov bias of the stationary mean (exact), Garnet N=3, S=5, d=2")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "markov_bias.json"))
    parser.add_argument("--figure", default=os.path.join(HERE, "figures", "markov_bias.png"))
    args = parser.parse_args(argv)
    markov, generative = problem("markov"), problem("generative")
    makers = {
        "FedLSA": lambda eta, skip: fj.fedlsa(eta, H, skip=skip),
        "SCAFFLSA": lambda eta, skip: fj.scafflsa(eta, H, skip=skip),
    }
    start = time.perf_counter()
    report = {
        "problem": markov.describe(),
        "H": H,
        "etas": ETAS.tolist(),
        "skips": list(SKIPS),
        "algorithms": {name: bias_table(make, markov, generative) for name, make in makers.items()},
    }
    report["seconds"] = time.perf_counter() - start
    for name, rows in report["algorithms"].items():
        print(name)
        print("  eta      " + " ".join(f"skip={k:<7d}" for k in SKIPS) + " gen. bias")
        for i, eta in enumerate(ETAS):
            cells = " ".join(f"{rows['markov_bias'][str(k)][i]:<12.3e}" for k in SKIPS)
            print(f"  {eta:<8.4f} {cells} {rows['generative_bias'][i]:.3e}")
    print(f"{report['seconds']:.1f} s")
    write_json(args.out, report)
    plot(report, args.figure)
    return report


if __name__ == "__main__":
    main()
