"""Warm agent-steps/s of four paths, for comparing two versions of the package side by side:

    PYTHONPATH=/path/to/old/checkout python benchmarks/kernel_paths.py
    PYTHONPATH=. python benchmarks/kernel_paths.py [--cpu-devices N] [--seeds 1000]

1000 seeds; best of 3 warm calls each (compile excluded). JAX runs on one CPU device per core
(``fj.use_cpu_cores``; ``--cpu-devices 1``: JAX's single device), for both versions alike.
"""

import argparse
import time

import jax
from _bench import add_cpu_devices_option, use_cpu_devices

import fedsa_jax as fj

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--seeds", type=int, default=1000)
ap.add_argument(
    "--scale", type=float, default=1.0, help="multiplies the number of rounds (a smoke run: 0.01)"
)
add_cpu_devices_option(ap)
args = ap.parse_args()
print(f"{use_cpu_devices(args.cpu_devices)}, {args.seeds} seeds, fedsa_jax from {fj.__file__}")
N, S, d, H, T, n = 10, 20, 10, 10, max(1, round(100 * args.scale)), args.seeds
td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=S, dim=d)
g = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=N, dim=d)
q = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40)
cases = {
    "TD FedLSA": (td, fj.fedlsa(0.1, H), T, N * H),
    "TD SCAFFLSA": (td, fj.scafflsa(0.1, H), T, N * H),
    "Gaussian FedLSA": (g, fj.fedlsa(0.05, H), T, N * H),
    "QFedTD 4-bit p=0.6": (q, fj.qfedtd(0.6, fj.channel.stochastic_uniform(4), 0.6), 10 * T, 40),
}
for name, (p, a, rounds, per_round) in cases.items():
    fj.simulate(1, p, a, rounds, n, record_every=rounds, quantiles=False)
    best = min(
        (
            lambda t0: (
                fj.simulate(1, p, a, rounds, n, record_every=rounds, quantiles=False),
                time.perf_counter() - t0,
            )[1]
        )(time.perf_counter())
        for _ in range(3)
    )
    print(f"{name:20s} {n * rounds * per_round / best:.3g} agent-steps/s")
