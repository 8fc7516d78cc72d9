"""Bidirectional compression: uplink-only against both directions, MSE against total bits.

QFedTD on the QFedTD paper's MDP (20 states, d = 10, gamma = 0.5, Markovian sampling, alpha = 0.6),
N = 10 agents, the uplink's TD directions through a 4-bit stochastic uniform quantizer (72 bits a
message). Uplink-only: the server's broadcast goes down exact, counted at 32 bits a coordinate (320
bits per agent and round). Both directions: the broadcast is compressed too
(``downlink=fj.channel.channel(...)``, the difference to the agents' copy of the model): top-2
(72 bits), unscaled rand-2 (72 bits) and scaled sign (42 bits). The MSE is read against
the total bits sent (uplink plus downlink, every agent), at equal total bits (each run's MSE when its
total reaches the smallest final total of the runs) and as the bits each run needs to bring the
MSE below twice FedTD's final MSE.

An unbiased compressor whose variance constant is at least 1 (rand-k scaled by d/k with k <= d/2,
qsgd with few levels) is left out: sent as a difference to the copy, its error grows by that factor
at every broadcast (see fedsa_jax.channel.downlink).

    python benchmarks/bidirectional.py [--seeds 400] [--rounds 1000] [--out benchmarks/out/bidirectional]
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

ALPHA, N = 0.6, 10


def runs() -> dict:
    """label -> (uplink quantizer, downlink channel)."""
    up = fj.channel.stochastic_uniform(4)
    return {
        "FedTD (exact both ways)": (None, fj.channel.channel()),
        "uplink only: 4 bits up, exact down": (up, fj.channel.channel()),
        "both: 4 bits up, top-2 down": (up, fj.channel.channel(fj.channel.top_k(2))),
        "both: 4 bits up, rand-2 unscaled down": (
            up,
            fj.channel.channel(fj.channel.rand_k(2, unbiased=False)),
        ),
        "both: 4 bits up, scaled sign down": (up, fj.channel.channel(fj.channel.scaled_sign())),
    }


def mse_at(res, budget: float) -> tuple[float, float]:
    """Mean MSE and its s.e. at the first recorded round whose total bits reach ``budget``."""
    i = min(int(np.searchsorted(res.bits_sent, budget)), len(res.rounds) - 1)
    return float(res.mse_mean[i]), float(res.mse_sem[i])


def bits_to(res, level: float) -> float | None:
    """Total bits sent at the first recorded round whose mean MSE is below ``level`` (None: never)."""
    hit = np.nonzero(res.mse_mean <= level)[0]
    return float(res.bits_sent[hit[0]]) if hit.size else None


def main(argv=None):
    args = monte_carlo_args(
        argv, __doc__.split("\n")[0], seeds=400, rounds=1000, out="benchmarks/out/bidirectional"
    )
    problem = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=N)
    results = {}
    for label, (up, down) in runs().items():
        t0 = time.perf_counter()
        alg = fj.qfedtd(ALPHA, up, downlink=down)
        res = fj.simulate(
            jax.random.key(2023), problem, alg, args.rounds, args.seeds, record_every=args.record_every
        )
        results[label] = res
        res.save(args.out / f"{label.split(':')[0].replace(' ', '_')}_{len(results)}.npz")
        per_round = res.bits_sent[-1] / args.rounds / N
        print(
            f"  {label:46s} {per_round:5.0f} bits/agent/round, final MSE {res.mse_mean[-1]:.4g} "
            f"(+- {res.mse_sem[-1]:.1g}), {time.perf_counter() - t0:5.1f} s"
        )
    budget = min(float(r.bits_sent[-1]) for r in results.values())
    level = 2 * float(results["FedTD (exact both ways)"].mse_mean[-1])
    summary = {
        "config": {"alpha": ALPHA, "num_agents": N, "seeds": args.seeds, "rounds": args.rounds},
        "bits_per_agent_per_round": {
            k: {
                "uplink": float(r.uplink_bits_sent[-1] / args.rounds / N),
                "downlink": float(r.downlink_bits_sent[-1] / args.rounds / N),
            }
            for k, r in results.items()
        },
        "budget_bits": budget,
        "mse_at_budget": {k: mse_at(r, budget) for k, r in results.items()},
        "level": level,
        "bits_to_level": {k: bits_to(r, level) for k, r in results.items()},
        "final_mse": {k: (float(r.mse_mean[-1]), float(r.mse_sem[-1])) for k, r in results.items()},
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130)
    for j, (label, res) in enumerate(results.items()):
        style = dict(color=f"C{j}", lw=1.4, label=label)
        axes[0].plot(res.rounds, res.mse_mean, **style)
        axes[1].plot(res.bits_sent, res.mse_mean, **style)
    axes[1].axvline(budget, color="k", ls=":", lw=1.0, label="equal-bits budget")
    axes[0].set_xlabel("communication round $t$")
    axes[1].set_xlabel("bits sent, uplink + downlink (all agents)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylabel(r"$\mathbb{E}\,\|\theta_t - \theta_\star\|^2$")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"QFedTD on the QFedTD MDP, N={N}, alpha={ALPHA}, {args.seeds} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.figures / "bidirectional.png")
    atomic_write(args.out / "summary.json", lambda f: f.write(json.dumps(summary, indent=2)), mode="w")
    print(
        json.dumps(
            {k: summary[k] for k in ("budget_bits", "mse_at_budget", "level", "bits_to_level")}, indent=2
        )
    )


if __name__ == "__main__":
    main()
