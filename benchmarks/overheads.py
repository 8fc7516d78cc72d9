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
from fedsa_jax import moments, theory
from fedsa_jax.theory import _rounds as engine


def dense_exact_mse(problem, algorithm, T):
    """Baseline: the same recursion (the algorithm's own moment description) with a dense
    ``L S L^T`` product for every phase, local steps included (their noise added as in
    :class:`fedsa_jax.moments.LocalStep`)."""
    rec, etas = engine._recursion(moments.recursion_of(algorithm, problem), algorithm, T, second=True)
    y = rec.state
    m = y.initial()
    S = np.outer(m, m)
    dense = lambda L, S: L @ S @ L.T
    out = [np.trace(S[y["theta"], y["theta"]])]
    for t in range(T):
        for phase in engine._phases(rec, t, etas[t]):
            if isinstance(phase, moments.LocalStep):
                S = dense(phase.mean(), S) + local_noise(y, phase, S)
            else:
                S = phase.second(S, dense)
        out.append(np.trace(S[y["theta"], y["theta"]]))
    return np.asarray(out)


def local_noise(y, phase, S):
    """``E[w w^T]`` of one local step (zero outside the agents' diagonal blocks)."""
    N, d = y.N, y.d
    idx = y.indices(phase.iterates).reshape(N, d)
    m_e = S[0, idx]  # (N, d) E[e^c]
    X = S[idx[:, :, None], idx[:, None, :]] + y.theta_star[:, None] * m_e[:, None, :]
    X = X + m_e[:, :, None] * y.theta_star[None, :] + np.outer(y.theta_star, y.theta_star)
    cov = np.zeros_like(S)
    cov[idx[:, :, None], idx[:, None, :]] = phase.eta**2 * y.noise(m_e + y.theta_star, X)
    return cov


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
