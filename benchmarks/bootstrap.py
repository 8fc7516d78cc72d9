"""The multiplier bootstrap's cost: B replicates per seed against B more plain seeds.

``fj.bootstrap(alg, B)`` runs, per seed, the main trajectory and B weighted replicates on the same
observations (one vmapped axis more). Side by side in one run, on the Garnet of the FedLSA
multiplier-bootstrap paper (30 states, 2 actions, branching 2, 5 features, gamma 0.95, N = 5; the
authors' instance, rebuilt by ``_bench.bootstrap_garnet``),
FedLSA TD(0) with H = 5 and the step sizes of the round ``eta_t = (t + 100)^-0.6``, float32,
T = ``--rounds``:

  bootstrap       ``--seeds`` seeds of fj.bootstrap(alg, B): (1 + B) trajectories each
  plain           (1 + B) x ``--seeds`` seeds of alg: the same number of trajectories
  draws only      drawing the random numbers of the plain run (its observations)
  plug-in         fj.plug_in(alg) against alg on (1 + max B) x ``--seeds`` seeds: the cost of the plug-in's
                  running moments (A_c(Z) read as the direction's Jacobian at every observation)

Reported: the cost per replicate-agent-step of the bootstrap against the plain kernel's per
agent-step (the goal: at most 1.2x), and both against the draws. The replicates share the main
trajectory's observations, so they skip the sampling but draw B weights per local step and agent.
Generative sampling, and Markov sampling under ``--markov``. Best of ``--repeats`` warm calls.

    python benchmarks/bootstrap.py [--seeds 100] [--replicates 10 100] [--rounds 100] [--markov]
"""

from __future__ import annotations

import argparse

from _bench import add_cpu_devices_option, best_of, bootstrap_garnet, use_cpu_devices, write_json
from local_steps import draws_only

import fedsa_jax as fj


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--replicates", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--weights", default="beta")
    ap.add_argument("--markov", action="store_true")
    ap.add_argument("--json", default=None)
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    devices = use_cpu_devices(args.cpu_devices)
    sampling = "markov" if args.markov else "generative"
    problem = bootstrap_garnet(sampling, dtype="float32")
    eta = fj.schedule(fj.optim.inverse_power, eta0=1.0, t0=100.0, power=0.6, per_round=True)
    alg, H, T, n, N = fj.fedlsa(eta, 5), 5, args.rounds, args.seeds, problem.num_agents
    print(
        f"FedLSA TD(0) bootstrap, the paper's Garnet (S=30, d=5, N={N}), {sampling}, H={H}, T={T}, "
        f"{n} seeds, weights {args.weights}, float32, {devices}"
    )
    rows = []
    for B in args.replicates:
        boot = fj.bootstrap(alg, B, weights=args.weights)
        run_boot = lambda: fj.simulate(1, problem, boot, T, n, record_every=T)  # noqa: E731
        run_plain = lambda: fj.simulate(1, problem, alg, T, n * (1 + B), record_every=T)  # noqa: E731
        draw = draws_only(problem, H, T, n * (1 + B))
        for f in (run_boot, run_plain, draw):
            f()  # compile
        t_boot, t_plain, t_draw = (best_of(f, args.repeats) for f in (run_boot, run_plain, draw))
        steps = n * (1 + B) * T * N * H  # agent-local steps of every trajectory
        row = dict(
            replicates=B,
            bootstrap_s=t_boot,
            plain_s=t_plain,
            draws_s=t_draw,
            bootstrap_over_plain=t_boot / t_plain,
            plain_over_draws=t_plain / t_draw,
            bootstrap_steps_per_s=steps / t_boot,
            plain_steps_per_s=steps / t_plain,
        )
        rows.append(row)
        print(
            f"  B={B:<4d} bootstrap {t_boot:.3f} s ({row['bootstrap_steps_per_s']:.3g} steps/s)  "
            f"{1 + B} x seeds plain {t_plain:.3f} s ({row['plain_steps_per_s']:.3g} steps/s)  "
            f"bootstrap/plain {row['bootstrap_over_plain']:.2f}x  plain/draws {row['plain_over_draws']:.2f}x",
            flush=True,
        )
    # the plug-in's moments (fj.plug_in): per observation, A_c(Z) as the direction's Jacobian (d
    # forward products) and the running sums, against the plain run on the same seeds
    seeds = n * (1 + max(args.replicates))
    run_plug = lambda: fj.simulate(1, problem, fj.plug_in(alg), T, seeds, record_every=T)  # noqa: E731
    run_plain = lambda: fj.simulate(1, problem, alg, T, seeds, record_every=T)  # noqa: E731
    for f in (run_plug, run_plain):
        f()  # compile
    t_plug, t_plain = (best_of(f, args.repeats) for f in (run_plug, run_plain))
    plug = dict(seeds=seeds, plug_in_s=t_plug, plain_s=t_plain, plug_in_over_plain=t_plug / t_plain)
    print(
        f"  plug-in, {seeds} seeds: {t_plug:.3f} s against plain {t_plain:.3f} s: {t_plug / t_plain:.2f}x",
        flush=True,
    )
    write_json(
        args.json, dict(sampling=sampling, seeds=n, rounds=T, devices=devices, rows=rows, plug_in=plug)
    )


if __name__ == "__main__":
    main()
