"""Stationary values and stability bounds on the papers' problems, from the exact theory alone.

* The SCAFFLSA paper's Figure 2 (Garnet, 30 states, d = 8, gamma = 0.95, eta = 0.1, H = 100, runs
  started at theta_star): ``fj.theory.stationary_mse`` of FedLSA and SCAFFLSA for N in {1, 10, 100}
  (at N = 1000 the state is beyond the full recursion's size: refused with the sizes), beside
  ``exact_mse`` after the figure's T = 200 rounds for N in {1, 10, 100, 1000} (the factored
  recursion of many agents; the Monte Carlo values of the figure are in benchmarks/README.md),
  with the time each takes.
* The mean against the mean-square stability bound
  (``fj.theory.max_stable_step_size(..., kind="mean" | "mean_square")``): FedLSA with H = 10 and
  100 on the heterogeneous Garnet of the paper (N = 10), SCAFFLSA with H = 10 on the same Garnet
  with N = 3 (its mean-square bound assembles the second-moment operator at every bisection step:
  3320 unknowns at N = 10, 528 at N = 3), and QFedTD
  (H = 1, erasures p = 0.6, the exact channel) on the QFedTD paper's MDP with N = 40 agents,
  generative sampling (the paper's Markov chains have 20^40 joint states: beyond the exact Markov
  theory).

    python benchmarks/stationary_floors.py [--json benchmarks/results/stationary_floors.json]
                                           [--max-exact-agents 1000]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
from _bench import write_json

import fedsa_jax as fj

ETA, H_FIG2, T_FIG2 = 0.1, 100, 200


def _timed(fn):
    t0 = time.perf_counter()
    try:
        value = fn()
    except ValueError as err:  # refused by the theory: say why
        value = str(err).split(": ", 1)[-1][:90]
    return value, time.perf_counter() - t0


def figure2_floors(max_exact_agents: int) -> list[dict]:
    rows = []
    for het in ("homogeneous", "heterogeneous"):
        for N in (1, 10, 100, 1000):
            problem = fj.problems.garnet(jax.random.key(0), num_agents=N, heterogeneity=het)
            for name, make in (("FedLSA", fj.fedlsa), ("SCAFFLSA", fj.scafflsa)):
                alg = make(ETA, H_FIG2)
                floor, seconds = _timed(lambda: fj.theory.stationary_mse(problem, alg))
                row = dict(series=f"{name}, {het}", N=N, stationary_mse=floor, seconds=round(seconds, 2))
                if N <= max_exact_agents:
                    curve, seconds = _timed(
                        lambda: fj.theory.exact_mse(problem, alg, T_FIG2, theta0=problem.theta_star)
                    )
                    row["exact_mse_T200"] = float(curve[-1])
                    row["exact_seconds"] = round(seconds, 1)
                rows.append(row)
                print(row, flush=True)
    return rows


def stability_bounds() -> list[dict]:
    garnet = fj.problems.garnet(jax.random.key(0), num_agents=10, heterogeneity="heterogeneous")
    garnet3 = fj.problems.garnet(jax.random.key(0), num_agents=3, heterogeneity="heterogeneous")
    mdp = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40, sampling="generative")
    cases = [
        ("FedLSA, H = 10, Garnet N = 10", garnet, fj.fedlsa(ETA, 10)),
        ("FedLSA, H = 100, Garnet N = 10", garnet, fj.fedlsa(ETA, 100)),
        ("SCAFFLSA, H = 10, Garnet N = 3", garnet3, fj.scafflsa(ETA, 10)),
        ("QFedTD, p = 0.6, QFedTD MDP N = 40 (generative)", mdp, fj.qfedtd(ETA, success_prob=0.6)),
    ]
    rows = []
    for label, problem, alg in cases:
        mean, t_mean = _timed(lambda: fj.theory.max_stable_step_size(problem, alg, tol=1e-4))
        square, t_square = _timed(
            lambda: fj.theory.max_stable_step_size(problem, alg, tol=1e-4, kind="mean_square")
        )
        row = dict(case=label, mean=mean, mean_square=square, seconds=round(t_mean + t_square, 1))
        if isinstance(mean, float) and isinstance(square, float) and mean > 0:
            row["ratio"] = square / mean
        rows.append(row)
        print(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="write the report to this file")
    ap.add_argument("--skip-bounds", action="store_true", help="only the Figure-2 floors")
    ap.add_argument(
        "--max-exact-agents",
        type=int,
        default=1000,
        help="exact_mse after T = 200 rounds up to this N (SCAFFLSA at N = 1000: about 9 min each)",
    )
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    report = {"figure2": figure2_floors(args.max_exact_agents)}
    if not args.skip_bounds:
        report["bounds"] = stability_bounds()
    print(json.dumps(report, indent=2))
    return write_json(args.json, report)


if __name__ == "__main__":
    main()
