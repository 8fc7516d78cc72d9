"""Federated TD(0) on gymnax's CartPole with a pole length per agent: the science and the speed.

* ``bias``: N = 4 agents with pole lengths 0.25, 0.5, 0.75, 1.0 (Fourier features of order 1,
  gamma 0.9, the default policy), a constant step, the same number of local steps per agent for
  every H: the long-run MSE against the Monte Carlo reference of FedLSA and SCAFFLSA for
  H in (1, 10, 100), and FedLSA with a 4-bit QSGD uplink. FedLSA's heterogeneity bias grows with H;
  SCAFFLSA's control variates remove it.
* ``sarsa``: federated SARSA on the same agents (softmax policy, temperature 2): FedSARSA and its
  drift-corrected version for H in (1, 10, 100) against the Monte Carlo deterministic limit (twice
  the default chains and iterations), itself checked against an independent one at the defaults.
* ``speedup``: homogeneous agents (every pole the default), FedLSA with H = 10: the long-run MSE
  against N = 1, 2, 4, 8 (linear speed-up: N x MSE constant, until the Markov bias of the constant
  step is reached).
* ``speed``: agent-steps/s of FedLSA (H = 10, N = 10, 1000 seeds) with Fourier features and with
  tile coding, and of FedSARSA (Fourier state-action features, each step's action drawn from the
  current iterate), beside stepping the environment with its default policy alone in the same run
  (the floor: no features, no update).

Each reference's own error ``tr Cov(theta_hat)`` is reported beside the MSEs it is measured against.

    python benchmarks/classic_control.py                  # all parts
    python benchmarks/classic_control.py --parts speed

Writes ``benchmarks/results/classic_control.json`` and ``benchmarks/figures/classic_control.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _bench import add_cpu_devices_option, best_of, save_figure, use_cpu_devices, write_json

HERE = Path(__file__).resolve().parent
LENGTHS = [0.25, 0.5, 0.75, 1.0]
STEPS = 20_000  # local steps per agent in every long run
ETA = 0.05
SARSA_ETA = 0.02


def _long_run(problem, alg, H: int, seeds: int) -> dict:
    """The MSE against the reference, averaged over the last quarter of the run's records, started at
    the reference (the slow directions of these ill-conditioned systems would otherwise keep the
    transient for far longer than the run: the MSE measures the stationary spread and bias)."""
    import jax

    import fedsa_jax as fj

    rounds = STEPS // H
    t0 = time.perf_counter()
    star = np.asarray(problem.theta_star)
    every = max(rounds // 40, 1)
    res = fj.simulate(
        jax.random.key(1), problem, alg, rounds, seeds, theta0=star, record_every=every, progress=False
    )
    return {
        "H": H,
        "mse": float(np.mean(res.mse_mean[-10:])),  # the last quarter
        "mse_se": float(np.mean(res.mse_sem[-10:])),  # the records are correlated: at most this
        "curve": np.asarray(res.mse_mean).tolist(),
        "steps": (np.asarray(res.rounds) * H).tolist(),
        "seconds": time.perf_counter() - t0,
    }


def bias_part(seeds: int, chains: int) -> dict:
    import fedsa_jax as fj

    t0 = time.perf_counter()
    problem = fj.problems.classic_control_td(
        "cartpole", 4, {"length": LENGTHS}, features="fourier:1", chains=chains, steps=4000, burn_in=1000
    )
    print(f"reference: {time.perf_counter() - t0:.1f} s, its error tr Cov = {problem.reference_mse:.3g}")
    star, local = np.asarray(problem.theta_star), np.asarray(problem.local_theta_star)
    out = {
        "reference_mse": problem.reference_mse,
        "local_distance": np.sum((local - star) ** 2, 1).tolist(),
        "runs": {},
    }
    algorithms = {
        "FedLSA": lambda H: fj.fedlsa(ETA, H),
        "SCAFFLSA": lambda H: fj.scafflsa(ETA, H),
        "FedLSA, 4-bit QSGD": lambda H: fj.fedlsa(ETA, H, quantizer=fj.channel.qsgd(4)),
    }
    for name, make in algorithms.items():
        out["runs"][name] = []
        for H in (1, 10, 100):
            row = _long_run(problem, make(H), H, seeds)
            out["runs"][name].append(row)
            print(
                f"{name:20s} H={H:3d}: long-run MSE {row['mse']:.4g} (s.e. {row['mse_se']:.2g}), "
                f"{row['seconds']:.1f} s"
            )
    return out


def sarsa_part(seeds: int) -> dict:
    """Federated SARSA on the same four pole lengths (softmax policy, temperature 2): the long-run
    MSE against the Monte Carlo deterministic limit of FedSARSA (``fedlsa``) and its drift-corrected
    version (``scafflsa``) for H in (1, 10, 100) at a constant step, against a reference of twice
    the default chains and iterations, checked against an independent one at the default sizes."""
    import fedsa_jax as fj

    build = lambda key, **sizes: fj.problems.classic_control_sarsa(  # noqa: E731
        "cartpole", 4, {"length": LENGTHS}, temperature=2.0, key=key, **sizes
    )
    t0 = time.perf_counter()
    problem = build(0, chains=256, iterations=16)  # the runs' reference: 4x the default's work
    seconds = time.perf_counter() - t0
    default = build(1)  # an independent one at the default sizes: the check
    star, check = np.asarray(problem.theta_star, np.float64), np.asarray(default.theta_star, np.float64)
    out = {
        "reference_mse": problem.reference_mse,
        "default_reference_mse": default.reference_mse,
        "reference_seconds": seconds,
        "check": {
            "distance2": float(np.sum((star - check) ** 2)),
            "expected": problem.reference_mse + default.reference_mse,
        },
        "local_distance": np.sum((np.asarray(problem.local_theta_star) - star) ** 2, 1).tolist(),
        "runs": {},
    }
    print(
        f"SARSA reference (256 chains, 16 iterations): {seconds:.1f} s, "
        f"tr Cov = {problem.reference_mse:.3g}; "
        f"against an independent one at the default sizes (tr Cov {default.reference_mse:.3g}): "
        f"|difference|^2 {out['check']['distance2']:.3g} (expected {out['check']['expected']:.3g})"
    )
    for name, make in {"FedSARSA": fj.fedlsa, "FedSARSA, drift-corrected": fj.scafflsa}.items():
        out["runs"][name] = []
        for H in (1, 10, 100):
            row = _long_run(problem, make(SARSA_ETA, H), H, seeds)
            out["runs"][name].append(row)
            print(f"{name:26s} H={H:3d}: long-run MSE {row['mse']:.4g} (s.e. {row['mse_se']:.2g})")
    return out


def speedup_part(seeds: int, chains: int) -> dict:
    """Homogeneous agents share one theta*: one reference of 8 agents (the best estimate of it), and
    the problems of N < 8 agents are its first N agents."""
    import dataclasses

    import jax

    import fedsa_jax as fj

    full = fj.problems.classic_control_td("cartpole", 8, features="fourier:1", chains=chains, steps=4000)
    rows = []
    for N in (1, 2, 4, 8):
        first = lambda x: x[:N]  # noqa: E731
        problem = dataclasses.replace(
            full,
            env_params=jax.tree.map(first, full.env_params),
            A_bar=full.A_bar[:N],
            b_bar=full.b_bar[:N],
            local_theta_star=full.local_theta_star[:N],
            local_theta_star_sem=full.local_theta_star_sem[:N],
        )
        row = {
            "N": N,
            "reference_mse": full.reference_mse,
            **_long_run(problem, fj.fedlsa(ETA, 10), 10, seeds),
        }
        rows.append(row)
        print(
            f"N={N}: long-run MSE {row['mse']:.4g}, N x MSE {N * row['mse']:.4g} "
            f"(reference {row['reference_mse']:.2g})"
        )
    return {"rows": rows}


def speed_part(seeds: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    import fedsa_jax as fj

    N, H, rounds = 10, 10, 20
    out = {}
    tiny = dict(chains=16, steps=100, burn_in=100, dtype="float32")  # the reference is not timed
    problems = {
        "fourier:1": lambda: fj.problems.classic_control_td("cartpole", N, features="fourier:1", **tiny),
        "tiles:4:4": lambda: fj.problems.classic_control_td("cartpole", N, features="tiles:4:4", **tiny),
        "SARSA, fourier:1": lambda: fj.problems.classic_control_sarsa("cartpole", N, iterations=2, **tiny),
    }
    for name, make in problems.items():
        some = make()
        alg = fj.fedlsa(0.05, H)
        run = lambda p=some: fj.simulate(0, p, alg, rounds, seeds, record_every=rounds, progress=False)  # noqa: E731
        run()
        t = best_of(run, repeats)
        out[name] = {"dim": some.dim, "agent_steps_per_s": N * H * rounds * seeds / t}
    problem = fj.problems.classic_control_td("cartpole", N, features="fourier:1", **tiny)

    @jax.jit
    def floor(key):  # the environment and its policy alone: N x seeds trajectories, H x rounds steps
        keys = jax.random.split(key, seeds * N)
        params = jax.tree.map(lambda x: jnp.tile(x, seeds), problem.agent_params())
        samplers = jax.vmap(problem.init_sampler)(keys, params)
        rand = problem.randomness(key, seeds * N, H * rounds)
        moves, _ = jax.vmap(problem.observe)(params, samplers, rand)
        return jnp.sum(moves.x) + jnp.sum(moves.reward)

    key = jax.random.key(0)
    floor(key).block_until_ready()
    t = best_of(lambda: floor(key).block_until_ready(), repeats)
    out["environment alone"] = {"agent_steps_per_s": N * H * rounds * seeds / t}
    for name, row in out.items():
        ratio = row["agent_steps_per_s"] / out["environment alone"]["agent_steps_per_s"]
        row["of_the_floor"] = ratio
        print(
            f"{name:18s} {row['agent_steps_per_s']:.3g} agent-steps/s ({ratio:.2f} of the environment alone)"
        )
    return out


def figure(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("bias", "sarsa", "speedup") if k in report]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), dpi=110, squeeze=False)
    axes = axes[0]
    for part, title in (("bias", "TD(0)"), ("sarsa", "SARSA, softmax tau = 2")):
        if part not in report:
            continue
        ax = axes[panels.index(part)]
        for name, rows in report[part]["runs"].items():
            H = [r["H"] for r in rows]
            ax.errorbar(
                H, [r["mse"] for r in rows], yerr=[2 * r["mse_se"] for r in rows], marker="o", label=name
            )
        ax.axhline(report[part]["reference_mse"], color="k", ls=":", label="reference's own error")
        ax.set(xscale="log", yscale="log", xlabel="local steps H", ylabel="long-run MSE")
        ax.set_title(f"CartPole {title}, pole lengths {LENGTHS}", fontsize=9)
        ax.legend(fontsize=8)
    if "speedup" in report:
        ax = axes[panels.index("speedup")]
        rows = report["speedup"]["rows"]
        N = np.array([r["N"] for r in rows])
        mse = np.array([r["mse"] for r in rows])
        ax.plot(N, mse, "o-", label="FedLSA H=10, homogeneous")
        ax.plot(N, mse[0] / N, "k--", label="1/N from N=1")
        ax.set(xscale="log", yscale="log", xlabel="agents N", ylabel="long-run MSE")
        ax.legend(fontsize=8)
    save_figure(fig, path.parent, path.name, None, report)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="bias,sarsa,speedup,speed")
    ap.add_argument("--seeds", type=int, default=256)
    ap.add_argument("--chains", type=int, default=512, help="reference chains per agent")
    ap.add_argument("--speed-seeds", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    print(use_cpu_devices(args.cpu_devices))
    import jax

    jax.config.update("jax_enable_x64", True)
    path = HERE / "results" / "classic_control.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    parts = args.parts.split(",")
    if "bias" in parts:
        report["bias"] = bias_part(args.seeds, args.chains)
    if "sarsa" in parts:
        report["sarsa"] = sarsa_part(args.seeds)
    if "speedup" in parts:
        report["speedup"] = speedup_part(args.seeds, args.chains)
    if "speed" in parts:
        report["speed"] = speed_part(args.speed_seeds, args.repeats)
    report["date"] = time.strftime("%Y-%m-%d")
    write_json(path, report)
    figure(report, HERE / "figures" / "classic_control.png")


if __name__ == "__main__":
    main()
