"""Throughput of fedsa_jax as the problem grows: seeds, agents, dimension, states.

Federated TD(0) FedLSA on Garnet MRPs (generative sampling), H=10 local steps,
float32, from the base point N=10, S=20, d=10, 1000 seeds; one factor varies at
a time (on the dim axis S = max(20, 2 d), since features need full column
rank; the states axis shows that S itself does not matter). Reported: agent-local-steps per
second of ``fj.simulate`` (best of
``--repeats`` after a warm-up call that compiles), and the cost per step
relative to the base point. With alias sampling the cost of a step must not
grow with the number of states S. JAX runs on one CPU device per core
(``fj.use_cpu_cores``; ``--cpu-devices 1``: JAX's single device).

    python benchmarks/scaling.py [--json out.json] [--quick] [--cpu-devices N]
"""

from __future__ import annotations

import argparse
import math
import time

import jax
from _bench import add_cpu_devices_option, use_cpu_devices, write_json

import fedsa_jax as fj

BASE = dict(seeds=1000, agents=10, dim=10, states=20)
AXES = {
    "seeds": [1, 10, 100, 1000, 10_000, 100_000],
    "agents": [1, 10, 100, 1000],
    "dim": [2, 10, 50, 200],
    "states": [20, 200, 2000],
}


def measure(seeds, agents, dim, states, H=10, target_steps=2e7, repeats=3):
    """Best-of-``repeats`` agent-steps per second at one size (about ``target_steps`` steps)."""
    # Enough successors for a random Garnet chain on many states to be irreducible (no state without
    # an incoming edge: S exp(-2 b) small); a draw costs O(1) whatever the branching.
    branching = min(states, max(2, math.ceil(math.log(10 * states) / 2) + 1))
    problem = fj.problems.garnet(
        jax.random.key(0), num_agents=agents, num_states=states, dim=dim, branching=branching
    )
    # at least 10 rounds: each call also draws the block of the round after its last one
    rounds = max(10, int(target_steps // (seeds * agents * H)))
    alg = fj.fedlsa(0.1, H)
    run = lambda: fj.simulate(
        jax.random.key(1),
        problem,
        alg,
        rounds,
        seeds,
        record_every=rounds,  # noqa: E731
        progress=False,
    )
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    best = min(_timed(run) for _ in range(repeats))
    steps = seeds * agents * H * rounds
    return {
        "rounds": rounds,
        "agent_steps": steps,
        "seconds": best,
        "first_call_s": first,
        "steps_per_s": steps / best,
    }


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (for a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    devices = use_cpu_devices(args.cpu_devices)  # before any JAX computation
    axes = {k: (v[:3] if args.quick else v) for k, v in AXES.items()}
    target = 2e6 if args.quick else 2e7
    base = measure(**BASE, target_steps=target, repeats=args.repeats)
    out = {
        "base": {**BASE, **base},
        "axes": {},
        "platform": jax.default_backend(),
        "devices": jax.device_count(),
    }
    print(f"base {BASE}, {devices}: {base['steps_per_s']:.3g} agent-steps/s")
    for axis, values in axes.items():
        rows = []
        for v in values:
            point = {**BASE, axis: v}
            if axis == "dim":
                point["states"] = max(BASE["states"], 2 * v)
            m = measure(**point, target_steps=target, repeats=args.repeats)
            m["cost_per_step_vs_base"] = base["steps_per_s"] / m["steps_per_s"]
            rows.append({axis: v, **m})
            print(
                f"  {axis:7s}={v:>7}: {m['steps_per_s']:10.3g} agent-steps/s  "
                f"(cost/step x{m['cost_per_step_vs_base']:.2f}, {m['seconds']:.3f} s, "
                f"compile+run {m['first_call_s']:.1f} s)"
            )
        out["axes"][axis] = rows
    return write_json(args.json, out)


if __name__ == "__main__":
    main()
