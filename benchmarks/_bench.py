"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import time


def bootstrap_garnet(
    sampling: str = "generative",
    dtype=None,
    seed=10,
    num_agents=5,
    num_states=30,
    dim=5,
    gamma=0.95,
    kernel=0.02,
    reward=0.001,
):
    """The Garnet of the experiment of Levin, Shuklin, Moulines, Mangold, Samsonov ("Gaussian
    Approximation and Multiplier Bootstrap for Federated Linear Stochastic Approximation", 2026):
    their code's generator (``Garnet(gen_seed=10)``, 30 states, 2 actions, branching 2, 5 features,
    gamma 0.95, 5 agents, kernel heterogeneity 0.02, reward heterogeneity 0.001), rewritten here draw
    for draw from one ``numpy.random.default_rng(seed)``: for each (s, a) in order, a row with
    ``branching`` ones shuffled; per-agent weights ``1 + U(0, kernel)`` on those entries, normalised;
    rewards ``U(0, 1)`` per state plus ``U(0, reward)`` per agent and state; features ``U(0, 1)`` with
    rows summing to 1; a policy playing one of the 2 actions in each state (a shuffled row). Its
    ``theta*`` is the authors' (first coordinate 8.397; ``tests`` do not depend on it, the benchmarks
    print it). The one builder of ``confidence_sets.py``, ``bootstrap.py`` and ``local_steps.py``."""
    import numpy as np

    import fedsa_jax as fj

    rng = np.random.default_rng(seed)
    S, A, N, branching = num_states, 2, num_agents, 2
    base = np.zeros((S, A, S))
    for s in range(S):
        for a in range(A):
            base[s, a, :branching] = 1.0
            rng.shuffle(base[s, a])
    kernels = base + rng.uniform(0.0, kernel, (N, S, A, S)) * (base != 0)
    kernels /= kernels.sum(-1, keepdims=True)
    rewards = rng.uniform(0.0, 1.0, S) + rng.uniform(0.0, reward, (N, S))
    features = rng.uniform(0.0, 1.0, (S, dim))
    features /= features.sum(1, keepdims=True)
    policy = np.zeros((S, A))
    for s in range(S):
        policy[s, : A - 1] = 1.0 / (A - 1)
        rng.shuffle(policy[s])
    P = np.einsum("sa,nsat->nst", policy, kernels)
    return fj.problems.federated_td(P, rewards, features, gamma, sampling=sampling, dtype=dtype)


def best_of(fn, repeats: int = 3) -> float:
    """Smallest wall time of ``repeats`` calls of ``fn()``, in seconds."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def write_json(path, report):
    """Write ``report`` to ``path`` (if given) and return it."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
    return report


def save_figure(fig, figures, name: str, json_path, report):
    """Lay out ``fig``, write it to ``figures/name`` (the folder created), say where, close it, and
    write ``report`` to ``json_path`` (if given): the tail of every figure script. Returns ``report``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    figures.mkdir(parents=True, exist_ok=True)
    fig.savefig(figures / name)
    print(f"figure -> {figures / name}")
    plt.close(fig)
    return write_json(json_path, report)


def add_cpu_devices_option(parser) -> None:
    """``--cpu-devices N``: JAX CPU devices the seeds are sharded over (default: one per core)."""
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="JAX CPU devices (default: one per core, fj.use_cpu_cores(); 1: JAX's single "
        "multi-threaded device; an explicit XLA_FLAGS device count wins)",
    )


def use_cpu_devices(num_devices: int | None) -> str:
    """``fj.use_cpu_cores(num_devices)`` before any JAX computation; returns the devices the
    kernels run on, for the header line (e.g. ``"2 cpu devices"``).

    A package without ``use_cpu_cores`` (an older checkout on ``PYTHONPATH``, for an A/B
    comparison) gets the same count through ``jax_num_cpu_devices``, so both sides run on
    equal devices."""
    import jax

    import fedsa_jax as fj

    if hasattr(fj, "use_cpu_cores"):
        fj.use_cpu_cores(num_devices)
    else:
        import os

        explicit = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
        if not explicit:
            jax.config.update("jax_num_cpu_devices", num_devices or len(os.sched_getaffinity(0)))
    n = jax.device_count()
    return f"{n} {jax.default_backend()} device{'s' * (n != 1)}"


def monte_carlo_args(argv, description: str, seeds: int, rounds: int, out: str):
    """Parse the options every Monte Carlo figure script shares (``--seeds``, ``--rounds``,
    ``--record-every``, ``--out``, ``--figures``, ``--cpu-devices``), set up the CPU devices and
    create both folders; returns the parsed arguments."""
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--seeds", type=int, default=seeds)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--record-every", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(out))
    ap.add_argument(
        "--figures",
        type=Path,
        default=Path("benchmarks/figures"),
        help="where the PNGs are copied for the README",
    )
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    use_cpu_devices(args.cpu_devices)
    args.out.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    return args


def exact_figure_args(argv, description: str, seeds: int, rounds: int, records: int = 40):
    """Parse the options of a script that draws Monte Carlo against exact curves (``--seeds``,
    ``--rounds``, ``--records``, ``--figures``, ``--json``) and turn float64 on; returns ``(args,
    record_every)``."""
    import argparse
    from pathlib import Path

    import jax

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--seeds", type=int, default=seeds)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--records", type=int, default=records)
    ap.add_argument("--figures", type=Path, default=Path("benchmarks/figures"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    return args, max(1, args.rounds // args.records)


def mc_against_exact(ax, problem, alg, rounds: int, seeds: int, every: int, color, label: str, key: int = 1):
    """Simulate ``alg`` and draw its MSE band (mean +- 2 s.e.) and ``exact_mse`` on ``ax``; returns the
    run's figures (final MSE and s.e., exact, largest |MC - exact| in s.e. over the recorded rounds,
    diverged seeds, seconds)."""
    import jax
    import numpy as np

    import fedsa_jax as fj

    t0 = time.perf_counter()
    res = fj.simulate(jax.random.key(key), problem, alg, rounds, seeds, record_every=every)
    wall = time.perf_counter() - t0
    exact = fj.theory.exact_mse(problem, alg, rounds)
    z = np.abs(res.mse_mean[1:] - exact[res.rounds][1:]) / res.mse_sem[1:]
    band = 2 * res.mse_sem
    ax.fill_between(res.rounds, res.mse_mean - band, res.mse_mean + band, color=color, alpha=0.3)
    ax.plot(np.arange(rounds + 1), exact, color=color, lw=1, label=f"{label} (exact)")
    return dict(
        run=label,
        final_mse=float(res.mse_mean[-1]),
        final_sem=float(res.mse_sem[-1]),
        exact_final=float(exact[-1]),
        max_z=float(z.max()),
        diverged=int(res.num_diverged[-1]),
        seconds=wall,
    )
