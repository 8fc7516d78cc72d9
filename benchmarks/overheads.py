"""What the science layer costs: the quantile histogram in the kernel, and the exact MSE recursion.

(a) ``fj.simulate`` with ``quantiles=True`` vs ``False``, recording every round:
    the worst case (QFedTD, N=1, H=1: one agent-step per recorded round) and a
    typical one (Garnet FedLSA, N=10, H=10).
(b) ``fj.theory.exact_mse`` (row-sparse updates) vs the same recursion with
    dense ``L S L^T`` products (the baseline), and vs one Monte Carlo run of the
    same rounds with 1000 seeds, for generative Garnet TD with N agents.

    python benchmarks/overheads.py [--json out.json]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from _bench import add_cpu_devices_option, best_of, use_cpu_devices, write_json

import fedsa_jax as fj
from fedsa_jax import theory


def dense_exact_mse(problem, algorithm, T):
    """Baseline: the exact recursion with dense D x D conjugations at every step."""
    L_b, L_s, L_a, H, eta, th, loc = theory._round_maps(problem, algorithm)
    noise = theory._noise_model(problem)
    theta_star = np.asarray(problem.theta_star, np.float64)
    S = np.zeros(L_b.shape)
    S[0, 0] = 1.0
    out = [theta_star @ theta_star]
    for _ in range(T):
        S = L_b @ S @ L_b.T
        for _ in range(H):
            X = np.stack([S[l, l] for l in loc])
            cov = eta**2 * noise(np.stack([S[0, l] for l in loc]), X)
            S = L_s @ S @ L_s.T
            for c, l in enumerate(loc):
                S[l, l] += cov[c]
        S = L_a @ S @ L_a.T
        out.append(np.trace(S[th, th]) - 2 * theta_star @ S[0, th] + theta_star @ theta_star)
    return np.asarray(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    use_cpu_devices(args.cpu_devices)
    report = {"backend": jax.default_backend(), "devices": jax.device_count()}

    print("(a) quantile histogram, recording every round, 1000 seeds")
    cases = {
        "worst: QFedTD N=1 H=1, 5000 rounds": (
            fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=1),
            fj.qfedtd(0.6),
            5000,
        ),
        "typical: Garnet FedLSA N=10 H=10, 300 rounds": (
            fj.problems.garnet(jax.random.key(0), num_agents=10),
            fj.fedlsa(0.1, 10),
            300,
        ),
    }
    report["quantiles"] = {}
    for label, (problem, alg, T) in cases.items():
        row = {}
        for q in (False, True):
            fj.simulate(0, problem, alg, 10, 1000, record_every=1, quantiles=q)  # compile
            row[q] = best_of(lambda: fj.simulate(1, problem, alg, T, 1000, record_every=1, quantiles=q))
        report["quantiles"][label] = {"off_s": row[False], "on_s": row[True], "ratio": row[True] / row[False]}
        print(
            f"  {label:46s} off {row[False]:.3f} s   on {row[True]:.3f} s   "
            f"on/off {row[True] / row[False]:.2f}x"
        )

    print("(b) exact_mse: generative Garnet TD, eta=0.1 H=10, 50 rounds (500 local steps), float64")
    jax.config.update("jax_enable_x64", True)
    report["exact_mse"] = {}
    for name, N in [(n, N) for n in ("fedlsa", "scafflsa") for N in (2, 10, 30)]:
        problem = fj.problems.garnet(jax.random.key(0), num_agents=N)
        alg = getattr(fj, name)(0.1, 10)
        T = 50
        fast = theory.exact_mse(problem, alg, T)
        t_fast = best_of(lambda: theory.exact_mse(problem, alg, T), 2)
        t_dense = best_of(lambda: dense_exact_mse(problem, alg, T), 1)
        err = float(np.max(np.abs(dense_exact_mse(problem, alg, T) - fast) / fast))
        fj.simulate(0, problem, alg, T, 1000)
        t_mc = best_of(lambda: fj.simulate(1, problem, alg, T, 1000), 2)
        D = 1 + problem.dim * (1 + N * (2 if name == "scafflsa" else 1))
        report["exact_mse"][f"{name} N={N}"] = {
            "state_dim": D,
            "exact_s": t_fast,
            "dense_s": t_dense,
            "dense_over_exact": t_dense / t_fast,
            "max_rel_diff": err,
            "mc_1000_seeds_s": t_mc,
        }
        print(
            f"  {name:8s} N={N:3d} (D={D:4d})  exact_mse {t_fast:.3f} s   "
            f"dense {t_dense:.3f} s ({t_dense / t_fast:5.1f}x)   "
            f"max rel diff {err:.1e}   Monte Carlo, 1000 seeds {t_mc:.3f} s"
        )
    return write_json(args.json, report)


if __name__ == "__main__":
    main()
