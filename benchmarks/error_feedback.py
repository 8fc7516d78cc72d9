"""EF-TD: federated TD(0) with top-k and scaled-sign compression, without and with error feedback.

Mitra, Pappas, Hassani, "Temporal Difference Learning with Compressed Updates: Error-Feedback
meets Reinforcement Learning", arXiv:2301.00944: TD(0) whose directions go through a biased
compressor (top-k, sign) with error feedback (EF14: the agent adds its compression error to the
next direction) converges like uncompressed TD, with a linear speed-up in the number of agents;
without error feedback it can stall away from the TD fixed point. Here QFedTD (one TD step per
round, the server averaging the N compressed directions) and FedLSA (H local TD steps, the model
difference compressed) run

  (i)  on the QFedTD paper's MDP (20 states, d = 10, gamma = 0.5, Markovian sampling, N = 10,
       QFedTD with alpha = 0.6) and on a heterogeneous Garnet (30 states, d = 8, gamma = 0.95,
       generative, N = 10; FedLSA with eta = 0.1 and H = 10 local TD steps per round, since one
       step of 0.1 per round would need thousands of rounds at gamma = 0.95): uncompressed;
       top-k (k = 2) and scaled sign, each without error feedback, with EF14 and with EF21:
       MSE curves and final MSE against the bits sent                  -> ef_td_curves.png
  (ii) top-k with EF14 on the MDP for N in {1, 2, 4, 8, 16}: final MSE against N, log-log slope
                                                                       -> ef_td_speedup.png

Writes the PNGs (into --figures) and summary.json (into --out), and prints the summary.

    python benchmarks/error_feedback.py [--seeds 500] [--rounds 600] [--out benchmarks/out/ef]
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

K = 2  # top-k's k
COMPRESSORS = {"top-2": lambda: fj.channel.top_k(K), "scaled sign": fj.channel.scaled_sign}
RULES = (None, "ef14", "ef21")
PROBLEMS = {  # name: (problem of N agents, algorithm from (quantizer, error_feedback), its description)
    "QFedTD MDP": (
        lambda N: fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=N),
        lambda q, ef: fj.qfedtd(0.6, q, error_feedback=ef),
        "QFedTD, alpha = 0.6",
    ),
    "heterogeneous Garnet": (
        lambda N: fj.problems.garnet(jax.random.key(1), num_agents=N),
        lambda q, ef: fj.fedlsa(0.1, 10, quantizer=q, error_feedback=ef),
        "FedLSA, eta = 0.1, H = 10",
    ),
}


def final(res, fraction=0.2):
    """Mean MSE over the last ``fraction`` of recorded rounds (the stationary level) and the s.e.
    at the last round."""
    k = max(1, int(len(res.rounds) * fraction))
    return float(np.mean(res.mse_mean[-k:])), float(res.mse_sem[-1])


def label(compressor, rule):
    return "uncompressed" if compressor is None else f"{compressor}, {rule.upper() if rule else 'no EF'}"


def curves(args, key, summary):
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for row, (name, (make, algorithm, what)) in enumerate(PROBLEMS.items()):
        problem = make(10)
        runs = {}
        for compressor, rule in [(None, None)] + [(c, r) for c in COMPRESSORS for r in RULES]:
            q = None if compressor is None else COMPRESSORS[compressor]()
            alg = algorithm(q, rule)
            t0 = time.perf_counter()
            res = fj.simulate(key, problem, alg, args.rounds, args.seeds, record_every=args.record_every)
            runs[label(compressor, rule)] = res
            level, se = final(res)
            print(
                f"  {name:22s} {label(compressor, rule):22s} final MSE {level:.4g} (+- {se:.1g}), "
                f"{res.bits_sent[-1] / problem.num_agents:.3g} bits/agent, {time.perf_counter() - t0:.1f} s"
            )
        summary[name] = {
            "algorithm": what,
            "final_mse": {k: final(r)[0] for k, r in runs.items()},
            "final_sem": {k: final(r)[1] for k, r in runs.items()},
            "bits_per_agent": {k: float(r.bits_sent[-1]) / problem.num_agents for k, r in runs.items()},
        }
        for col, compressor in enumerate(COMPRESSORS):
            ax = axes[row, col]
            for lab, res in runs.items():
                if lab == "uncompressed" or lab.startswith(compressor):
                    ax.semilogy(res.rounds, res.mse_mean, label=lab)
            ax.set(title=f"{name} ({what}): {compressor}", xlabel="round", ylabel="MSE")
            ax.legend(fontsize=8)
        ax = axes[row, 2]
        for lab, res in runs.items():
            ax.loglog(summary[name]["bits_per_agent"][lab], final(res)[0], "o", label=lab)
        ax.set(title=f"{name}: final MSE against bits sent", xlabel="bits sent per agent", ylabel="final MSE")
        ax.legend(fontsize=7)
    fig.suptitle(f"TD with compressed uplinks, N = 10, {args.seeds} seeds, {args.rounds} rounds")
    fig.tight_layout()
    return fig


def speedup(args, key, summary):
    make, algorithm, _ = PROBLEMS["QFedTD MDP"]
    Ns = (1, 2, 4, 8, 16)
    levels = {}
    for N in Ns:
        for lab, q, rule in (("uncompressed", None, None), ("top-2, EF14", fj.channel.top_k(K), "ef14")):
            res = fj.simulate(
                key, make(N), algorithm(q, rule), args.rounds, args.seeds, record_every=args.record_every
            )
            levels.setdefault(lab, []).append(final(res)[0])
    slopes = {lab: float(np.polyfit(np.log(Ns), np.log(v), 1)[0]) for lab, v in levels.items()}
    summary["speedup"] = {"N": list(Ns), "final_mse": levels, "log_log_slope": slopes}
    print(f"  final MSE against N: slopes {slopes}")
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for lab, v in levels.items():
        ax.loglog(Ns, v, "o-", label=f"{lab} (slope {slopes[lab]:.2f})")
    ax.loglog(Ns, levels["uncompressed"][0] / np.asarray(Ns), "k:", label="1/N")
    ax.set(title="QFedTD MDP: final MSE against N", xlabel="agents N", ylabel="final MSE")
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None):
    args = monte_carlo_args(argv, __doc__.split("\n")[0], seeds=500, rounds=600, out="benchmarks/out/ef")
    key = jax.random.key(2023)
    summary: dict = {"config": {"seeds": args.seeds, "rounds": args.rounds, "k": K, "N": 10}}
    print("(i) MSE curves and final MSE against bits, N = 10")
    fig = curves(args, key, summary)
    atomic_write(args.figures / "ef_td_curves.png", lambda f: fig.savefig(f, format="png", dpi=110))
    print("(ii) top-2 with EF14: final MSE against N on the MDP")
    fig = speedup(args, key, summary)
    atomic_write(args.figures / "ef_td_speedup.png", lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close("all")
    atomic_write(args.out / "summary.json", lambda f: f.write(json.dumps(summary, indent=2)), mode="w")
    return summary


if __name__ == "__main__":
    main()
