"""Paired comparisons on common random numbers against independent seeds, on the SCAFFLSA paper's
heterogeneous Garnet problem (N=10 agents, 30 states, d=8, generative sampling, float32).

Pairs: FedLSA against SCAFFLSA, and FedLSA against FedLSA with server momentum
(``optax.sgd(1.0, momentum=0.5)``); eta=0.1, H=10, theta_0 = 0. One ``fj.compare`` run records, per
round, each algorithm's MSE and standard error and the paired difference's standard error.

For n seeds the difference of MSEs has standard error ``s_D`` paired and ``sqrt(s_A^2 + s_B^2)`` from
independent seeds (two runs of n seeds each, other keys). The seeds the independent comparison needs
for the paired one's precision are ``n (s_A^2 + s_B^2) / s_D^2``: the variance-reduction factor
``(Var e_A + Var e_B) / Var(e_A - e_B)``. A second FedLSA run with another key checks the
independent standard error empirically (its difference to the first has standard error
``sqrt(2) s_A``).

    python benchmarks/paired.py            # about a minute on 2 CPU cores
    python benchmarks/paired.py --quick    # smoke run (writes to benchmarks/out/)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np
import optax
from _bench import add_cpu_devices_option, use_cpu_devices

import fedsa_jax as fj
from fedsa_jax._io import write_json

ETA, H, N = 0.1, 10, 10
MOMENTUM = 0.5


def algorithms():
    return {
        "FedLSA": fj.fedlsa(ETA, H),
        "SCAFFLSA": fj.scafflsa(ETA, H),
        "FedLSA+momentum": fj.fedlsa(ETA, H, server_optimizer=optax.sgd(1.0, momentum=MOMENTUM)),
    }


def pair_report(cmp, a: str, b: str, rounds: list[int]) -> list[dict]:
    d = cmp.difference(a, b)
    rows = []
    for t in rounds:
        i = int(np.searchsorted(d.rounds, t))
        independent = float(np.hypot(d.sem_a[i], d.sem_b[i]))
        rows.append(
            {
                "round": int(d.rounds[i]),
                "mse_a": float(d.mse_a[i]),
                "mse_b": float(d.mse_b[i]),
                "difference": float(d.mean[i]),
                "paired_sem": float(d.sem[i]),
                "independent_sem": independent,
                "seed_factor": float((independent / d.sem[i]) ** 2),
                "ratio": float(d.ratio[i]),
                "ratio_interval": [float(v[i]) for v in d.ratio_interval()],
            }
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few seeds and rounds")
    add_cpu_devices_option(parser)
    args = parser.parse_args(argv)
    devices = use_cpu_devices(args.cpu_devices)
    seeds, num_rounds = (64, 20) if args.quick else (2048, 200)
    rounds = [r for r in (10, 50, 100, 200) if r <= num_rounds]
    out = Path(__file__).parent / ("out" if args.quick else "results")
    out.mkdir(exist_ok=True)
    problem = fj.problems.garnet(jax.random.key(0), num_agents=N, heterogeneity="heterogeneous")
    start = time.perf_counter()
    cmp = fj.compare(jax.random.key(1), problem, algorithms(), num_rounds, seeds, record_every=10)
    seconds = time.perf_counter() - start
    other = fj.simulate(
        jax.random.key(2), problem, algorithms()["FedLSA"], num_rounds, seeds, record_every=10
    )
    first = cmp.results["FedLSA"]
    check = {  # the independent standard error, measured: two FedLSA runs on other keys
        "round": int(first.rounds[-1]),
        "difference_of_independent_runs": float(first.mse_mean[-1] - other.mse_mean[-1]),
        "its_sem": float(np.hypot(first.mse_sem[-1], other.mse_sem[-1])),
    }
    report = {
        "setting": {"eta": ETA, "H": H, "N": N, "momentum": MOMENTUM, "seeds": seeds, "rounds": num_rounds},
        "devices": devices,
        "seconds_compare": seconds,
        "FedLSA - SCAFFLSA": pair_report(cmp, "FedLSA", "SCAFFLSA", rounds),
        "FedLSA - FedLSA+momentum": pair_report(cmp, "FedLSA", "FedLSA+momentum", rounds),
        "independent_check": check,
    }
    for pair in ("FedLSA - SCAFFLSA", "FedLSA - FedLSA+momentum"):
        for row in report[pair]:
            print(
                f"{pair:26s} t={row['round']:4d} diff {row['difference']:+.4g} paired s.e. "
                f"{row['paired_sem']:.3g} independent s.e. {row['independent_sem']:.3g}: "
                f"{row['seed_factor']:.3g}x the seeds unpaired"
            )
    write_json(out / "paired.json", report)
    return report


if __name__ == "__main__":
    main()
