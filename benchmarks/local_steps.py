"""Local steps that grow with the round: the padded kernel against constant H at equal work.

A table ``H_t = ceil(5 (t + 1)^gamma_H)`` runs in one compiled program whose rounds all have
``H_max`` local steps, those past ``H_t`` with step size 0 (``fedsa_jax.optim``). This script
measures what the padding costs, on the Garnet of the FedLSA multiplier-bootstrap paper (30 states,
2 actions, branching 2, 5 features, gamma 0.95, 5 agents; the authors' instance, rebuilt by
``_bench.bootstrap_garnet``), federated TD(0) FedLSA with
the step sizes of the round ``eta_t = (t + 100)^-0.6``, float32, ``--seeds`` seeds, for
``gamma_H`` in {0, 0.2, 0.5, 1}, side by side in one run:

  growing H_t     fj.simulate with the table over ``--rounds`` rounds (K = sum_t H_t local steps)
  constant H      fj.simulate with H = round(mean_t H_t) over K // H rounds: the same work
  numpy           the same growing-H_t FedLSA in numpy, vectorised over seeds and agents (alias
                  sampling, one block of uniforms per round: benchmarks/throughput.py's tuned loop)
  draws only      drawing the random numbers the growing kernel consumes (H_max per round)

Reported per useful agent-local step (seeds x agents x K): the growing kernel's speed as a fraction
of the constant-H kernel's (the goal: >= 0.7), the padding's useful fraction mean_t H_t / H_max,
numpy's time over the kernel's, and the kernel's time over the draws'. Generative sampling, and
under ``--markov`` Markov sampling (a chain moves only on the H_t steps: one block per step).
Every timing is the best of ``--repeats`` warm calls.

    python benchmarks/local_steps.py [--seeds 1000] [--rounds 300] [--markov] [--powers 0 0.2]
"""

from __future__ import annotations

import argparse
import platform

import jax
import jax.numpy as jnp
import numpy as np
from _bench import add_cpu_devices_option, best_of, bootstrap_garnet, use_cpu_devices, write_json
from throughput import numpy_fedlsa_td

import fedsa_jax as fj
from fedsa_jax._runtime.kernel import seed_keys

POWERS = (0.0, 0.2, 0.5, 1.0)
H0 = 5


def draws_only(problem, H: int, T: int, n: int):
    """A jitted function drawing every seed's T rounds of ``problem.randomness(k, N, H)`` (summed, so
    that nothing is optimised away), from the kernel's per-seed keys."""
    keys = jax.random.key_data(seed_keys(jax.random.key(1), n)[1])

    @jax.jit
    def run(kd):
        rk = jax.random.wrap_key_data(kd)

        def body(acc, t):
            ks = jax.vmap(jax.random.fold_in, in_axes=(0, None))(rk, t)
            u = jax.vmap(lambda k: problem.randomness(k, problem.num_agents, H))(ks)
            return acc + jnp.sum(u, axis=tuple(range(1, u.ndim))).astype(jnp.float32), None

        return jax.lax.scan(body, jnp.zeros((n,), jnp.float32), jnp.arange(T, dtype=jnp.uint32))[0]

    return lambda: run(keys).block_until_ready()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markov", action="store_true", help="Markov sampling instead of generative")
    ap.add_argument("--powers", type=float, nargs="+", default=list(POWERS), help="the gamma_H to run")
    ap.add_argument("--json", default=None)
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    devices = use_cpu_devices(args.cpu_devices)
    sampling = "markov" if args.markov else "generative"
    problem = bootstrap_garnet(sampling, dtype="float32")
    n, T, N = args.seeds, args.rounds, problem.num_agents
    eta = fj.schedule(fj.optim.inverse_power, eta0=1.0, t0=100.0, power=0.6, per_round=True)
    print(
        f"FedLSA TD(0), the paper's Garnet (S=30, A=2, d=5, N={N}), {sampling}, eta_t=(t+100)^-0.6, "
        f"H_t=ceil({H0}(t+1)^g), T={T}, {n} seeds, float32, {devices}, {platform.processor() or 'cpu'}"
    )
    rows = []
    for power in args.powers:
        table = fj.growing_local_steps(H0, power, T)
        steps = table.table if isinstance(table, fj.optim.LocalSteps) else (table,) * T
        K, H_max = int(sum(steps)), max(steps)
        H = max(1, round(K / T))
        T_const = K // H
        work = n * N * K  # useful agent-local steps
        growing, constant = fj.fedlsa(eta, table), fj.fedlsa(eta, H)
        run_growing = lambda: fj.simulate(2, problem, growing, T, n)  # noqa: E731
        run_const = lambda: fj.simulate(2, problem, constant, T_const, n)  # noqa: E731
        run_growing(), run_const()  # compile
        t_grow = best_of(run_growing, args.repeats)
        t_const = best_of(run_const, args.repeats) * K / (T_const * H)  # per the same work
        draw = draws_only(problem, H_max, T, n)
        draw()
        t_draw = best_of(draw, args.repeats)
        rng = np.random.default_rng(0)
        t_numpy = best_of(lambda: numpy_fedlsa_td(problem, 0.01, steps, T, n, rng, np.float32), 1)
        row = dict(
            power=power,
            total_local_steps=K,
            h_max=H_max,
            useful_fraction=K / (T * H_max),
            constant_h=H,
            growing_s=t_grow,
            constant_s=t_const,
            speed_vs_constant=t_const / t_grow,
            numpy_s=t_numpy,
            numpy_over_kernel=t_numpy / t_grow,
            draws_s=t_draw,
            kernel_over_draws=t_grow / t_draw,
            agent_steps_per_s=work / t_grow,
        )
        rows.append(row)
        print(
            f"  gamma_H={power:<4g} K={K:6d} H_max={H_max:3d} useful {row['useful_fraction']:.2f}  "
            f"growing {t_grow:.3f} s ({row['agent_steps_per_s']:.3g} steps/s)  "
            f"constant H={H} {t_const:.3f} s  speed vs constant {row['speed_vs_constant']:.2f}x  "
            f"numpy/kernel {row['numpy_over_kernel']:.1f}x  "
            f"kernel/draws {row['kernel_over_draws']:.2f}x",
            flush=True,
        )
    write_json(args.json, dict(sampling=sampling, seeds=n, rounds=T, devices=devices, rows=rows))


if __name__ == "__main__":
    main()
