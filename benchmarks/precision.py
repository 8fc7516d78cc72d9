"""Precision table: Monte Carlo MSE against the exact MSE across step sizes, float32 vs float64.

For eta in {1e-1, ..., 1e-8}, dtype in {float32, float64} and FedLSA (H = 1),
SCAFFLSA (H = 2) on a heterogeneous Gaussian LSA problem (|theta_star| = 5.4) and
QFedTD (erasures, p = 0.6) on generative federated TD, every run starts at
theta_star and runs T rounds; the table shows the z-score
(MC - exact) / s.e. of the final MSE, with the exact value from
``fj.theory.exact_mse`` in float64. |z| well above 4 means a wrong number.

    python benchmarks/precision.py                       # writes benchmarks/results/precision.json
    python benchmarks/precision.py --exact-from F.json   # use the exact values stored in F.json
                                                         # (to score another version of the package)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _bench import add_cpu_devices_option, use_cpu_devices  # noqa: E402

import fedsa_jax as fj  # noqa: E402

ETAS = [10.0**-k for k in range(1, 9)]


def problems(dtype):
    rng = np.random.default_rng(0)
    N, d = 4, 3
    A = np.stack([np.eye(d) + 0.15 * rng.normal(size=(d, d)) for _ in range(N)])
    ts = np.array([3.0, -2.0, 4.0])
    b = np.einsum("cij,j->ci", A, ts) + 0.3 * rng.normal(size=(N, d))
    gauss = fj.problems.gaussian_lsa(A, b, 0.2, 0.5, dtype=dtype)
    td = fj.problems.garnet(jax.random.key(0), num_agents=4, num_states=10, dim=4, dtype=dtype)
    return {
        "fedlsa": (gauss, lambda eta: fj.fedlsa(eta, 1)),
        "scafflsa": (gauss, lambda eta: fj.scafflsa(eta, 2)),
        "qfedtd": (td, lambda eta: fj.qfedtd(eta, success_prob=0.6)),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20_000)
    ap.add_argument("--seeds", type=int, default=256)
    ap.add_argument("--exact-from", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "precision.json")
    add_cpu_devices_option(ap)
    args = ap.parse_args()
    use_cpu_devices(args.cpu_devices)
    stored = json.loads(args.exact_from.read_text())["exact"] if args.exact_from else {}
    rows, exact_all = [], {}
    t0 = time.perf_counter()
    for dtype in ("float64", "float32"):
        for name, (problem, make) in problems(dtype).items():
            theta0 = np.asarray(problem.theta_star, np.float64)
            for eta in ETAS:
                key = f"{name}/{eta:g}"
                if key not in stored and key not in exact_all:
                    ref = problems("float64")[name][0]
                    exact_all[key] = float(
                        fj.theory.exact_mse(ref, make(eta), args.rounds, theta0=np.asarray(ref.theta_star))[
                            -1
                        ]
                    )
                exact = stored.get(key, exact_all.get(key))
                res = fj.simulate(
                    jax.random.key(1),
                    problem,
                    make(eta),
                    args.rounds,
                    args.seeds,
                    theta0=theta0,
                    record_every=args.rounds,
                    quantiles=False,
                )
                z = (res.mse_mean[-1] - exact) / res.mse_sem[-1]
                rows.append(
                    {
                        "algorithm": name,
                        "dtype": dtype,
                        "eta": eta,
                        "mc": float(res.mse_mean[-1]),
                        "sem": float(res.mse_sem[-1]),
                        "exact": exact,
                        "z": float(z),
                        "ratio": float(res.mse_mean[-1] / exact),
                    }
                )
                print(
                    f"{name:9s} {dtype} eta={eta:7.0e}  MC/exact = {rows[-1]['ratio']:9.4f}  z = {z:8.2f}",
                    flush=True,
                )
    print(f"{time.perf_counter() - t0:.0f} s, fedsa_jax from {fj.__file__}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"rounds": args.rounds, "seeds": args.seeds, "rows": rows, "exact": {**stored, **exact_all}},
            indent=1,
        )
    )
    print("| algorithm | dtype | " + " | ".join(f"{e:.0e}" for e in ETAS) + " |")
    print("|---|---|" + "---|" * len(ETAS))
    for name in ("fedlsa", "scafflsa", "qfedtd"):
        for dtype in ("float32", "float64"):
            zs = [r["z"] for r in rows if r["algorithm"] == name and r["dtype"] == dtype]
            print(f"| {name} | {dtype} | " + " | ".join(f"{z:.1f}" for z in zs) + " |")


if __name__ == "__main__":
    main()
