"""Coverage of the MSE intervals, measured against exact MSEs.

For a Gaussian LSA problem and a generative TD problem (3 agents, small d), FedLSA and SCAFFLSA
(eta=0.1, H=3) run ``REPLICATIONS x n`` seeds with every seed kept; seeds ``k n .. (k+1) n - 1`` are
replication k, an independent n-seed run (seed i depends only on (key, i)). For each replication and
each interval method of ``res.mse_interval`` (``"t"``, ``"bootstrap"``: BCa over the seeds), the
95 % interval of the MSE at an early and a late round either contains ``fj.theory.exact_mse`` or not;
the fraction that does is the coverage, with binomial standard error ``sqrt(0.95 0.05 / 400) = 0.011``.
Seed counts n = 16, 64, 256.

    python benchmarks/coverage.py            # about 2 minutes on 2 CPU cores
    python benchmarks/coverage.py --quick    # smoke run (writes to benchmarks/out/)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np

import fedsa_jax as fj
from fedsa_jax._io import write_json
from fedsa_jax.stats import bca_interval, t_interval

REPLICATIONS = 400
LEVEL = 0.95
ETA, H, T, EARLY = 0.1, 3, 20, 2
ALGS = {"FedLSA": fj.fedlsa, "SCAFFLSA": fj.scafflsa}


def problems() -> dict:
    """The two problems: heterogeneous Gaussian LSA (d=3) and generative TD (4 states, d=2)."""
    gauss = fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=1.0, noise_A=0.2, noise_b=0.5
    )
    rng = np.random.default_rng(0)
    P = rng.uniform(size=(3, 4, 4)) + 0.1
    P /= P.sum(-1, keepdims=True)
    td = fj.problems.federated_td(
        P, rng.uniform(-1, 1, size=(3, 4)), rng.uniform(size=(4, 2)), 0.9, sampling="generative"
    )
    return {"Gaussian LSA": gauss, "generative TD": td}


def coverage(values: np.ndarray, exact: float, n: int, replications: int) -> dict[str, float]:
    """Fraction of the ``replications`` n-seed intervals (values: every seed's squared error at one round)
    that contain ``exact``, per method."""
    reps = values[: replications * n].reshape(replications, n)
    mean, sem = reps.mean(axis=1), reps.std(axis=1, ddof=1) / np.sqrt(n)
    t_low, t_high = t_interval(mean, sem, n, LEVEL)
    b_low, b_high = bca_interval(reps, LEVEL)
    return {
        "t": float(np.mean((t_low <= exact) & (exact <= t_high))),
        "bootstrap": float(np.mean((b_low <= exact) & (exact <= b_high))),
    }


def run(problem, alg, seeds_per_run: list[int], replications: int) -> dict:
    """Coverage at the early and the late round for each seed count."""
    total = replications * max(seeds_per_run)
    res = fj.simulate(
        jax.random.key(7), problem, alg, T, total, record_every=EARLY, keep_seeds=total, seed_batch_size=total
    )
    exact = fj.theory.exact_mse(problem, alg, T)
    out = {}
    for t in (EARLY, T):
        i = int(np.searchsorted(res.rounds, t))
        out[f"round {t}"] = {
            str(n): coverage(res.seed_mse[i], float(exact[t]), n, replications) for n in seeds_per_run
        }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 40 replications of 16 seeds")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    replications, counts = (40, [16]) if args.quick else (REPLICATIONS, [16, 64, 256])
    out = Path(__file__).parent / ("out" if args.quick else "results")
    out.mkdir(exist_ok=True)
    report: dict = {
        "level": LEVEL,
        "replications": replications,
        "binomial_se": (LEVEL * (1 - LEVEL) / replications) ** 0.5,
    }
    for pname, problem in problems().items():
        for aname, make in ALGS.items():
            got = run(problem, make(ETA, H), counts, replications)
            report[f"{pname}, {aname}"] = got
            for when, by_n in got.items():
                for n, c in by_n.items():
                    label = f"{pname:14s} {aname:9s} {when:9s} n={n:>4s}"
                    print(f"{label}: t {c['t']:.3f}  BCa {c['bootstrap']:.3f}")
    write_json(out / "coverage.json", report)
    return report


if __name__ == "__main__":
    main()
