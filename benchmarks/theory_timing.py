"""Wall time of the exact recursions (``fj.theory.exact_mse``, ``exact_mean`` where the MSE does not
apply), best of 3, over a dozen configurations: every algorithm, channels, schedules, a server
optimizer, averaging, Richardson-Romberg and Scaffnew, on Gaussian LSA and generative TD.

    python benchmarks/theory_timing.py                      # the timings
    python benchmarks/theory_timing.py --save before.npz    # also keep every exact array
    python benchmarks/theory_timing.py --compare before.npz # and check them against a saved run (1e-12)

``--compare`` exits 1 if an array differs by more than 1e-12 relative (of its largest entry),
so the same script guards a change of the theory code for both its results and its speed.
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np
import optax
from _bench import best_of

import fedsa_jax as fj

T = 60  # rounds of every exact curve


def configurations():
    """``name -> (problem, algorithm, what)`` with ``what`` in ``("mse", "mean")``."""
    gauss = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=10, dim=5, heterogeneity=0.8)
    td = fj.problems.garnet(jax.random.key(1), num_agents=8, num_states=20, dim=6, gamma=0.9)
    sched = fj.schedule(fj.optim.inverse_time, eta0=0.1, k0=50.0)
    momentum = fj.optimizer(optax.sgd, learning_rate=0.5, momentum=0.6)
    return {
        "fedlsa_gauss": (gauss, fj.fedlsa(0.05, 10), "mse"),
        "scafflsa_gauss": (gauss, fj.scafflsa(0.05, 10), "mse"),
        "qfedtd_td_randk_erasures": (td, fj.qfedtd(0.3, fj.channel.rand_k(2), success_prob=0.7), "mse"),
        "fedlsa_td_randk_received": (
            td,
            fj.fedlsa(
                0.2, 4, quantizer=fj.channel.rand_k(3), success_prob=0.6, aggregation="divide_by_received"
            ),
            "mse",
        ),
        "scaffnew_gauss": (gauss, fj.scaffnew(0.05, 0.3, 8), "mse"),
        "fedlsa_gauss_schedule": (gauss, fj.fedlsa(sched, 10), "mse"),
        "scafflsa_td_schedule": (td, fj.scafflsa(sched, 4), "mse"),
        "fedlsa_gauss_momentum": (gauss, fj.fedlsa(0.05, 10, server_optimizer=momentum), "mse"),
        "averaged_scafflsa_td": (td, fj.averaged(fj.scafflsa(0.2, 4), burn_in=10), "mse"),
        "richardson_averaged_fedlsa_gauss": (
            gauss,
            fj.richardson(fj.averaged(fj.fedlsa(0.05, 10), 10)),
            "mean",
        ),
        "scaffnew_td_momentum_schedule": (td, fj.scaffnew(sched, 0.5, 4, server_optimizer=momentum), "mse"),
        "scafflsa_gauss_erasures_mean": (
            gauss,
            fj.scafflsa(0.05, 10, success_prob=0.6, aggregation="divide_by_received"),
            "mean",
        ),
        "qfedtd_gauss_received": (
            gauss,
            fj.qfedtd(0.1, fj.channel.rand_k(2), success_prob=0.5, aggregation="divide_by_received"),
            "mse",
        ),
    }


def exact(problem, algorithm, what):
    fn = fj.theory.exact_mse if what == "mse" else fj.theory.exact_mean
    return fn(problem, algorithm, T)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="write every exact array to this .npz")
    parser.add_argument("--compare", help="check every exact array against this .npz (1e-12 relative)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    saved = dict(np.load(args.compare)) if args.compare else {}
    arrays, bad = {}, []
    print(f"{'configuration':36s} {'seconds':>9s}")
    for name, (problem, algorithm, what) in configurations().items():
        arrays[name] = out = exact(problem, algorithm, what)
        seconds = best_of(lambda: exact(problem, algorithm, what), args.repeats)
        line = f"{name:36s} {seconds:9.4f}"
        if args.compare:
            ref = saved[name]
            err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
            line += f"   rel. diff {err:.1e}"
            if not err <= 1e-12:
                bad.append(name)
        print(line, flush=True)
    if args.save:
        np.savez(args.save, **arrays)
    if bad:
        print(f"differ by more than 1e-12: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
