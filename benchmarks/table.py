"""Throughput table: every algorithm x problem family x sampling x channel, side by side in one run.

Rows: FedLSA, SCAFFLSA, QFedTD (one local step per round) and Scaffnew, on federated TD
(Garnet MRPs, S=20, generative and Markov sampling), Gaussian LSA and least squares
(`fj.problems.least_squares`, 100 rows per agent), each over the exact channel and over
4-bit stochastic uniform quantization with erasures (p = 0.6). N=10 agents, d=10, H=10
local steps (QFedTD: 1), 1000 seeds, about 3e6 agent-steps per timed call, float32.
Then the QFedTD setting of the performance issue (N=40, S=20, Markov, 4 bits, p = 0.6), and the
extra groups on TD Garnet (generative): ``downlink``, FedLSA with a compressed downlink (top-2
broadcast; exact or lossy uplink); ``error-feedback``, the biased compressors with error feedback
(FedLSA and QFedTD with top-2 and EF14, FedLSA with scaled sign and EF21 and with unscaled rand-2
and EF14); ``cohort``, partial participation (``clients_per_round = 5`` of the 10 agents, exact
channel), FedLSA and Scaffnew, whose rate counts the cohort's local steps only (the steps done);
``local-work``, heterogeneous and random local work (``fj.local_work``: uniform counts, fixed
counts spread over 1..H with FedNova, stragglers, and through the lossy channel), whose rate counts
the steps done, ``sum_c E[H_c]`` a round, while the kernel runs H steps for every agent; ``delays``,
delayed updates (``fj.delays``: a fixed delay of 4 rounds, uniform on 0..8, and through the lossy
channel; SCAFFLSA uniform on 0..8); ``fedbuff``, buffered asynchronous aggregation
(``fj.fedbuff``, stragglers on the clock, buffers of 1, N/2 and N, and 4-bit quantization), whose
rate counts the K agents' local steps of a server step.

Columns: warm agent-local steps per second (best of ``--repeats`` calls after the first),
its ratio to TD FedLSA (generative, exact; the first row), and the first call's wall time,
which includes tracing and compiling (in its own column, never mixed into the rate).

JAX runs on one CPU device per core (``fj.use_cpu_cores``; ``--cpu-devices 1``: JAX's single device).

    python benchmarks/table.py [--seeds 1000] [--json out.json] [--cpu-devices N]  # ~6 min, 2 CPU cores
    python benchmarks/table.py --only cohort   # the first row and one extra group
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import numpy as np
from _bench import add_cpu_devices_option, use_cpu_devices, write_json

import fedsa_jax as fj


def problems(N: int, d: int, S: int):
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(100, d)) for _ in range(N)]
    y = [x @ rng.normal(size=d) + 0.5 * rng.normal(size=100) for x in X]
    return {
        ("TD Garnet", "generative"): fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=S, dim=d),
        ("TD Garnet", "markov"): fj.problems.garnet(
            jax.random.key(0), num_agents=N, num_states=S, dim=d, sampling="markov"
        ),
        ("Gaussian LSA", "generative"): fj.problems.random_gaussian_lsa(
            jax.random.key(0), num_agents=N, dim=d
        ),
        ("least squares", "generative"): fj.problems.least_squares(X, y, dtype="float32"),
    }


def algorithms(H: int, lossy: bool):
    ch = dict(quantizer=fj.channel.stochastic_uniform(4), success_prob=0.6) if lossy else {}
    return {
        "FedLSA": (fj.fedlsa(0.05, H, **ch), H),
        "SCAFFLSA": (fj.scafflsa(0.05, H, **ch), H),
        "QFedTD": (fj.qfedtd(0.1, **ch), 1),
        "Scaffnew": (fj.scaffnew(0.05, 0.2, H, **ch), H),
    }


def extra_rows(H: int, N: int) -> dict:
    """The extra groups: ``group -> {label: (algorithm, agent-steps per round, channel label)}``."""
    top, sign, rand = fj.channel.top_k(2), fj.channel.scaled_sign(), fj.channel.rand_k(2, unbiased=False)
    down = fj.channel.channel(top)
    lossy = dict(quantizer=fj.channel.stochastic_uniform(4), success_prob=0.6)
    m = N // 2  # partial participation: the cohort's steps are the work done
    uniform = fj.local_work.uniform(1, H)
    shared = fj.local_work.uniform(1, H, shared=True)
    counts = [1 + c * (H - 1) // max(1, N - 1) for c in range(N)]  # 1..H over the agents
    spread = fj.local_work.fixed(counts, normalization="fednova")
    slow = fj.local_work.straggler(H, 0.3, 0.5, normalization="fednova")  # SCAFFLSA refuses plain
    late = fj.delays.uniform(8)
    clock = fj.clock.straggler(1, 0.1, 20.0)
    return {
        "downlink": {
            "FedLSA": (fj.fedlsa(0.05, H, downlink=down), N * H, "top-2 down"),
            "FedLSA lossy": (fj.fedlsa(0.05, H, downlink=down, **lossy), N * H, "4-bit + top-2"),
        },
        "error-feedback": {
            "FedLSA top": (fj.fedlsa(0.05, H, quantizer=top, error_feedback="ef14"), N * H, "top-2, EF14"),
            "FedLSA sign": (fj.fedlsa(0.05, H, quantizer=sign, error_feedback="ef21"), N * H, "sign, EF21"),
            "FedLSA rand": (fj.fedlsa(0.05, H, quantizer=rand, error_feedback="ef14"), N * H, "rand-2, EF14"),
            "QFedTD top": (fj.qfedtd(0.1, top, error_feedback="ef14"), N, "top-2, EF14"),
        },
        "cohort": {
            "FedLSA": (fj.fedlsa(0.05, H, clients_per_round=m), m * H, f"exact, m={m}/{N}"),
            "Scaffnew": (fj.scaffnew(0.05, 0.2, H, clients_per_round=m), m * H, f"exact, m={m}/{N}"),
        },
        "local-work": {  # the rate counts the steps done, sum_c E[H_c] a round (the kernel runs H_max)
            "FedLSA uniform": (fj.fedlsa(0.05, uniform), N * (1 + H) / 2, f"H_c ~ U{{1..{H}}}"),
            "FedLSA fixed": (fj.fedlsa(0.05, spread), sum(spread.mean_steps(N)), "H_c fixed, FedNova"),
            "SCAFFLSA straggler": (fj.scafflsa(0.05, slow), N * slow.tau(N), "straggler 0.3, 1/2, FedNova"),
            "SCAFFLSA lossy": (fj.scafflsa(0.05, shared, **lossy), N * (1 + H) / 2, "U shared, 4-bit, p=0.6"),
        },
        "delays": {
            "FedLSA fixed": (fj.fedlsa(0.05, H, delays=fj.delays.fixed(4)), N * H, "delay 4"),
            "FedLSA uniform": (fj.fedlsa(0.05, H, delays=late), N * H, "delay U{0..8}"),
            "FedLSA lossy": (fj.fedlsa(0.05, H, delays=late, **lossy), N * H, "U, 4-bit p=0.6"),
            "SCAFFLSA uniform": (fj.scafflsa(0.05, H, delays=late), N * H, "delay U{0..8}"),
        },
        "fedbuff": {  # a round is one server step: K agents' H local steps
            "FedBuff K=1": (fj.fedbuff(0.05, H, 1, clock), H, "K=1, straggler"),
            "FedBuff K=N/2": (fj.fedbuff(0.05, H, N // 2, clock), N // 2 * H, f"K={N // 2}, straggler"),
            "FedBuff K=N": (fj.fedbuff(0.05, H, N, clock), N * H, f"K={N}, straggler"),
            "FedBuff 4-bit": (
                fj.fedbuff(0.05, H, N // 2, clock, quantizer=fj.channel.stochastic_uniform(4)),
                N // 2 * H,
                f"K={N // 2}, 4-bit",
            ),
        },
    }


def measure(problem, alg, steps_per_round, seeds, target_steps, repeats):
    rounds = max(1, int(round(target_steps / (seeds * steps_per_round))))
    run = lambda: fj.simulate(1, problem, alg, rounds, seeds, record_every=rounds, quantiles=False)  # noqa: E731
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return seeds * rounds * steps_per_round / best, first


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--states", type=int, default=20)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--steps", type=float, default=3e6, help="agent-local steps per timed call")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--only",
        choices=("downlink", "error-feedback", "cohort", "local-work", "delays", "fedbuff"),
        default=None,
        help="the first row and this extra group only",
    )
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    devices = use_cpu_devices(args.cpu_devices)  # before any JAX computation
    N, H, n = args.agents, args.local_steps, args.seeds
    print(
        f"N={N} d={args.dim} S={args.states} H={H} (QFedTD 1), {n} seeds, ~{args.steps:.0e} agent-steps per "
        f"call, float32, {devices}, {os.cpu_count()} cores, jax {jax.__version__}"
    )
    print(
        f"{'algorithm':9s} {'problem':14s} {'sampling':10s} {'channel':13s} {'agent-steps/s':>13s} "
        f"{'vs TD FedLSA':>12s} {'first call s':>12s}"
    )
    rows, reference = [], None

    def report(alg_name, fam, sampling, channel, rate, first):
        nonlocal reference
        reference = reference or rate
        rows.append(
            dict(
                algorithm=alg_name,
                problem=fam,
                sampling=sampling,
                channel=channel,
                agent_steps_per_s=rate,
                ratio=rate / reference,
                first_call_s=first,
            )
        )
        print(
            f"{alg_name:9s} {fam:14s} {sampling:10s} {channel:13s} {rate:13.3g} {rate / reference:12.2f} "
            f"{first:12.2f}",
            flush=True,
        )

    families = problems(N, args.dim, args.states)
    for (fam, sampling), problem in families.items():
        for lossy in (False, True):
            for alg_name, (alg, h) in algorithms(H, lossy).items():
                if args.only and rows:
                    continue
                rate, first = measure(problem, alg, N * h, n, args.steps, args.repeats)
                report(alg_name, fam, sampling, "4-bit, p=0.6" if lossy else "exact", rate, first)
    if not args.only:
        q = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40)  # the QFedTD setting
        alg = fj.qfedtd(0.6, fj.channel.stochastic_uniform(4), 0.6)
        rate, first = measure(q, alg, 40, n, args.steps, args.repeats)
        report("QFedTD", "QFedTD MDP N=40", "markov", "4-bit, p=0.6", rate, first)
    garnet = families["TD Garnet", "generative"]
    for group, entries in extra_rows(H, N).items():
        if args.only not in (None, group):
            continue
        for label, (alg, steps_per_round, channel) in entries.items():
            rate, first = measure(garnet, alg, steps_per_round, n, args.steps, args.repeats)
            report(label.split()[0], "TD Garnet", "generative", channel, rate, first)
    machine = {
        "platform": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "device_count": jax.device_count(),
        "processor": platform.processor() or platform.machine(),
        "jax": jax.__version__,
    }
    return write_json(args.json, {"config": vars(args), "machine": machine, "rows": rows})


if __name__ == "__main__":
    main()
