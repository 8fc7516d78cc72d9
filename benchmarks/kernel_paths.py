"""Warm agent-steps/s of four paths, for comparing two versions of the package side by side:

    PYTHONPATH=/path/to/old/checkout python benchmarks/kernel_paths.py
    PYTHONPATH=. python benchmarks/kernel_paths.py [--cpu-devices N] [--seeds 1000]
    python benchmarks/kernel_paths.py --cache-bytes 0,262144,default   # the seed slices, side by side
    python benchmarks/kernel_paths.py --fused --block-rows 0,4096,256      # scan against the fused kernel
    python benchmarks/kernel_paths.py --fused --layouts rows,columns        # its two layouts

``--cache-bytes``: one column per value of ``fj.Execution(cache_bytes=...)`` (``default``: the
backend's); with it, three more paths at H = 100 whose rounds' states outgrow the cache: TD FedLSA
under Markov sampling (d = 8) and federated SARSA on the SARSA paper's Garnet (one-hot, d = 30, and
dense, d = 8), N = 10.

``--fused``: two columns, the compiled local-step scan and the fused local-step kernel
(``fj.Execution(fused_local_steps=...)``, :mod:`fedsa_jax.problems.fused`; on a CPU in Pallas's
interpret mode), for the paths that have one (TD and Gaussian); ``--block-rows`` adds a fused column
per block size (rows per program; 0: one program of every row, the default off a GPU) and
``--layouts`` per layout of the per-row arrays (``rows`` or ``columns``, ``fedsa_jax.problems.fused.LAYOUT``).

1000 seeds; best of 3 warm calls each (compile excluded). JAX runs on one CPU device per core
(``fj.use_cpu_cores``; ``--cpu-devices 1``: JAX's single device), for both versions alike.
``benchmarks/gpu.py`` runs the same four paths on a GPU (:func:`cases`, :func:`measure`).
"""

import argparse
import time

import jax
from _bench import add_cpu_devices_option, use_cpu_devices

import fedsa_jax as fj


def cases(scale: float = 1.0):
    """``name -> (problem, algorithm, rounds, agent-steps per seed and round)``: TD FedLSA and
    SCAFFLSA (Garnet, N=10, S=20, d=10, H=10), Gaussian FedLSA (N=10, d=10, H=10), QFedTD (the QFedTD
    paper's MDP, N=40, 4-bit quantizer, success probability 0.6); 100 rounds (1000 for QFedTD)
    times ``scale``."""
    N, S, d, H, T = 10, 20, 10, 10, max(1, round(100 * scale))
    td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=S, dim=d)
    g = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=N, dim=d)
    q = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40)
    return {
        "TD FedLSA": (td, fj.fedlsa(0.1, H), T, N * H),
        "TD SCAFFLSA": (td, fj.scafflsa(0.1, H), T, N * H),
        "Gaussian FedLSA": (g, fj.fedlsa(0.05, H), T, N * H),
        "QFedTD 4-bit p=0.6": (q, fj.qfedtd(0.6, fj.channel.stochastic_uniform(4), 0.6), 10 * T, 40),
    }


def measure(problem, alg, rounds, seeds, repeats=3, execution=None):
    """``(first call's seconds, best warm call's seconds)`` of ``fj.simulate`` at one size."""
    run = lambda: fj.simulate(  # noqa: E731
        1, problem, alg, rounds, seeds, record_every=rounds, quantiles=False, execution=execution
    )
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return first, best


def long_round_cases(scale: float = 1.0):
    """:func:`cases`' layout for three paths with H = 100 (20 rounds times ``scale``)."""
    N, H, T = 10, 100, max(1, round(20 * scale))
    td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=30, dim=8, sampling="markov")
    return {
        "TD Markov d=8 H=100": (td, fj.fedlsa(0.01, H), T, N * H),
        "SARSA one-hot H=100": (fj.problems.garnet_control(num_agents=N), fj.fedlsa(0.01, H), T, N * H),
        "SARSA d=8 H=100": (fj.problems.garnet_control(num_agents=N, dim=8), fj.fedlsa(0.01, H), T, N * H),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument(
        "--scale", type=float, default=1.0, help="multiplies the number of rounds (a smoke run: 0.01)"
    )
    ap.add_argument("--cache-bytes", default=None, help="comma-separated values, 'default' for the backend's")
    ap.add_argument("--fused", action="store_true", help="the scan against the fused local-step kernel")
    ap.add_argument("--block-rows", default=None, help="with --fused: comma-separated rows per program")
    ap.add_argument("--layouts", default=None, help="with --fused: comma-separated layouts (rows, columns)")
    add_cpu_devices_option(ap)
    args = ap.parse_args()
    print(f"{use_cpu_devices(args.cpu_devices)}, {args.seeds} seeds, fedsa_jax from {fj.__file__}")
    paths = cases(args.scale)
    columns: list[tuple[str, fj.Execution | None, tuple | None]] = [("default", None, None)]
    if args.cache_bytes is not None:
        paths.update(long_round_cases(args.scale))
        columns = [
            (
                ("cache_bytes=" + v) if v != "default" else v,
                None if v == "default" else fj.Execution(cache_bytes=int(v)),
                None,
            )
            for v in args.cache_bytes.split(",")
        ]
    if args.fused:
        paths = {k: v for k, v in paths.items() if not k.startswith("QFedTD")}  # one step a round: no kernel
        blocks = [None] if args.block_rows is None else [int(b) for b in args.block_rows.split(",")]
        layouts = [None] if args.layouts is None else args.layouts.split(",")
        columns = [("scan", fj.Execution(fused_local_steps=False), None)]
        columns += [
            (
                "fused"
                + ("" if b is None else " all rows" if b == 0 else f" {b} rows")
                + ("" if lay is None else f" {lay}"),
                fj.Execution(fused_local_steps=True),
                (b, lay),
            )
            for b in blocks
            for lay in layouts
        ]
    print(f"{'':20s} " + " ".join(f"{label:>18s}" for label, _, _ in columns))
    for name, (p, a, rounds, per_round) in paths.items():
        rates = []
        for _, execution, setting in columns:
            with fused_settings(*(setting or (None, None))):
                _, best = measure(p, a, rounds, args.seeds, execution=execution)
            rates.append(args.seeds * rounds * per_round / best)
        print(f"{name:20s} " + " ".join(f"{r:18.3g}" for r in rates) + " agent-steps/s", flush=True)


class fused_settings:
    """Within the block, the fused kernel's rows per program (``rows``) and layout (``layout``) on this
    backend are those given (None: as set); JAX's caches are cleared on the way in and out, since the
    kernel reads them as it traces and a compiled program would be reused."""

    def __init__(self, rows=None, layout=None):
        from fedsa_jax.problems import fused

        self.tables = ((fused.BLOCK_ROWS, rows), (fused.LAYOUT, layout))
        self.backend = jax.default_backend()

    def __enter__(self):
        self.saved = [dict(table) for table, _ in self.tables]
        for table, value in self.tables:
            if value is not None:
                table[self.backend if self.backend in table else "cpu"] = value
        jax.clear_caches()

    def __exit__(self, *exc):
        for (table, _), saved in zip(self.tables, self.saved):
            table.clear()
            table.update(saved)
        jax.clear_caches()


if __name__ == "__main__":
    main()
