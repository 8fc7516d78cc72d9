"""Reproduce the three experiments of the QFedTD paper with 1000+ seeds each.

Dal Fabbro, Mitra, Pappas, "Federated TD Learning over Finite-Rate Erasure
Channels: Linear Speedup under Markovian Sampling", IEEE L-CSS 2023, Sec. 5:
one MDP with 20 states shared by all agents, d=10 orthonormal features,
gamma=0.5, step size alpha=0.6, Markovian sampling (one trajectory per agent),
stochastic uniform quantization of the TD directions, Bernoulli erasures.

  (i)   N=1 vs N=40, FedTD vs QFedTD (4 bits, p=0.6)          -> fig1_speedup.png
  (ii)  N=40, 4 bits, p in {0.2, 0.4, 0.6, 0.8, 1.0}           -> fig2_erasures.png
  (iii) N=40, p=0.6, bits in {3, 4, 5}                         -> fig3_bits.png

Writes the PNGs, one result file per run and summary.json (floors, rounds to
reach a level, speed-up ratios) into --out, and prints the summary.

    python benchmarks/reproduce_qfedtd.py [--seeds 1000] [--rounds 1000] [--out benchmarks/out/qfedtd]
"""

from __future__ import annotations

import json
import time

import jax
import matplotlib.pyplot as plt
import numpy as np
from _bench import monte_carlo_args

import fedsa_jax as fj
from fedsa_jax._io import atomic_write
from fedsa_jax.plotting import plot_mse

ALPHA = 0.6


def floor(res, fraction=0.25):
    """Mean MSE over the last ``fraction`` of recorded rounds, and the s.e. at the last round."""
    k = max(1, int(len(res.rounds) * fraction))
    return float(np.mean(res.mse_mean[-k:])), float(res.mse_sem[-1])


def paired_increase(res, ref, theta_star):
    """Mean over seeds of the final squared error of ``res`` minus that of ``ref`` (same
    seeds, so the same observation streams), with its standard error."""
    diff = np.sum((res.final_theta - theta_star) ** 2, 1) - np.sum((ref.final_theta - theta_star) ** 2, 1)
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


def rounds_to(res, level):
    """First recorded round at which the mean MSE is below ``level`` (None if never)."""
    hit = np.nonzero(res.mse_mean <= level)[0]
    return int(res.rounds[hit[0]]) if hit.size else None


def main(argv=None):
    args = monte_carlo_args(
        argv, __doc__.split("\n")[0], seeds=1000, rounds=1000, out="benchmarks/out/qfedtd"
    )
    key = jax.random.key(2023)
    problems = {N: fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=N) for N in (1, 40)}
    results: dict[str, fj.SimulationResult] = {}

    def run(label, N, bits=None, p=1.0):
        q = None if bits is None else fj.channel.stochastic_uniform(bits)
        t0 = time.perf_counter()
        res = fj.simulate(
            key, problems[N], fj.qfedtd(ALPHA, q, p), args.rounds, args.seeds, record_every=args.record_every
        )
        res.save(args.out / f"{label}.npz")
        results[label] = res
        f, se = floor(res)
        print(f"  {label:28s} floor {f:.4g} (+- {se:.1g}), {time.perf_counter() - t0:5.1f} s")
        return res

    summary = {
        "config": {
            "alpha": ALPHA,
            "seeds": args.seeds,
            "rounds": args.rounds,
            "gamma": 0.5,
            "num_states": 20,
            "dim": 10,
            "sampling": "markov",
        }
    }

    print("(i) linear speed-up: N=1 vs N=40, FedTD vs QFedTD (4 bits, p=0.6)")
    exp1 = {}
    for N in (1, 40):
        exp1[f"FedTD, N={N}"] = run(f"fedtd_N{N}", N)
        exp1[f"QFedTD 4 bits p=0.6, N={N}"] = run(f"qfedtd_N{N}_b4_p0.6", N, bits=4, p=0.6)
    summary["speedup"] = {
        "floor_ratio_N1_over_N40_fedtd": floor(results["fedtd_N1"])[0] / floor(results["fedtd_N40"])[0],
        "floor_ratio_N1_over_N40_qfedtd": floor(results["qfedtd_N1_b4_p0.6"])[0]
        / floor(results["qfedtd_N40_b4_p0.6"])[0],
        "floors": {k: floor(v)[0] for k, v in exp1.items()},
    }

    print("(ii) erasures: N=40, 4 bits, p in {0.2, ..., 1.0}")
    exp2 = {}
    for p in (0.2, 0.4, 0.6, 0.8, 1.0):
        exp2[f"p={p:g}"] = results.get(f"qfedtd_N40_b4_p{p:g}") or run(
            f"qfedtd_N40_b4_p{p:g}", 40, bits=4, p=p
        )
    level = 4 * max(floor(r)[0] for r in exp2.values())
    summary["erasures"] = {
        "level": level,
        "rounds_to_level": {k: rounds_to(r, level) for k, r in exp2.items()},
        "rounds_to_level_times_p": {
            k: (rounds_to(r, level) or np.nan) * float(k[2:]) for k, r in exp2.items()
        },
        "floors": {k: floor(r)[0] for k, r in exp2.items()},
    }

    print("(iii) quantization: N=40, p=0.6, bits in {3, 4, 5}")
    exp3 = {}
    for b in (3, 4, 5):
        exp3[f"{b} bits"] = results.get(f"qfedtd_N40_b{b}_p0.6") or run(
            f"qfedtd_N40_b{b}_p0.6", 40, bits=b, p=0.6
        )
    exp3["no quantization"] = run("qfedtd_N40_nq_p0.6", 40, p=0.6)
    theta_star = np.asarray(problems[40].theta_star)
    increase = {b: paired_increase(exp3[f"{b} bits"], exp3["no quantization"], theta_star) for b in (3, 4, 5)}
    summary["bits"] = {
        "floors": {k: floor(r)[0] for k, r in exp3.items()},
        "final_mse_increase_over_no_quantization_paired": {f"{b} bits": v for b, v in increase.items()},
        "zeta": {f"{b} bits": fj.channel.stochastic_uniform(b).zeta(10) for b in (3, 4, 5)},
    }

    figures = [
        ("fig1_speedup.png", exp1, "(i) linear speed-up: FedTD vs QFedTD (4 bits, p=0.6)"),
        ("fig2_erasures.png", exp2, "(ii) QFedTD, N=40, 4 bits: success probability p"),
        ("fig3_bits.png", exp3, "(iii) QFedTD, N=40, p=0.6: bits per coordinate"),
    ]
    for name, curves, title in figures:
        full_title = title + f"\n20 states, d=10, $\\gamma$=0.5, $\\alpha$=0.6, {args.seeds} seeds"
        if name == "fig3_bits.png":
            fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130, width_ratios=(3, 2))
            plot_mse(curves, ax=ax, title=full_title)
            bits = np.array([3, 4, 5])
            mean = np.array([increase[b][0] for b in bits])
            se = np.array([increase[b][1] for b in bits])
            ax2.errorbar(
                bits, mean, yerr=2 * se, fmt="o-", capsize=4, label="paired over seeds, $\\pm$ 2 s.e."
            )
            ax2.axhline(0.0, color="k", lw=0.8)
            ax2.set_xticks(bits)
            ax2.set_xlabel("bits per coordinate")
            ax2.set_ylabel("final MSE increase over no quantization")
            ax2.set_title("floor raised by fewer bits", fontsize=10)
            ax2.grid(True, alpha=0.3)
            ax2.legend(fontsize=8)
            fig.tight_layout()
        else:
            fig = plot_mse(curves, title=full_title)
        for folder in (args.out, args.figures):
            atomic_write(folder / name, lambda f: fig.savefig(f, format="png"))
    atomic_write(args.out / "summary.json", lambda f: f.write(json.dumps(summary, indent=2)), mode="w")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
