"""Federated Q-learning: the two papers' experiments at 100x their runs, and the kernel's speed.

* ``woo``: Woo, Joshi, Chi, "The blessing of heterogeneity in federated Q-learning" (JMLR 2025,
  arXiv:2305.10697), Sec. 5: asynchronous Q-learning on their two-state MDP
  (``fj.problems.two_state_q_learning``: r(s, a) = s, stay probabilities U[0.4, 0.6], gamma 0.9),
  20 agents, synchronisation period 50, behaviour policies that split the actions between the
  agents (heterogeneity 1: agent c takes only action c mod 2), Q0 = 0. Equal averaging
  (``fj.fedlsa``) against importance averaging (``fj.importance_averaging``): (1 - gamma)
  |Q_T - Q*|_inf against T at a constant step and at a decreasing one (eta_k = eta0 / (1 + k / k0)),
  then, with the decreasing step, at the last T against the number of agents (speed-up) and against
  the period.
* ``maze``: Wang, Yang, Su, "On the convergence rates of federated Q-learning across heterogeneous
  environments" (TMLR 2025, arXiv:2409.03897), Sec. 6: synchronous Q-learning, 20 agents on 5 x 5
  mazes with heterogeneous kernels (``fj.problems.maze_q_learning``: each agent its own wind),
  gamma 0.99, a constant step, E local steps; the Monte Carlo curves beside the exact noise-free
  path of each E (``fj.theory.mean_path``), whose plateau is the fixed point of the averaged E-fold
  local operator (``fj.theory.mean_path_limit``): the two-phase curve (a fall, then a rise to the
  plateau), the plateau growing with E.
* ``floor``: the same mazes' exact noise-free path with a decreasing step, eta_k = eta0 / (1 + k / k0),
  to T = 2 x 10^5: its error times T / E levels off, the E / ((1 - gamma) T) floor of heterogeneous
  kernels (a few seconds: one deterministic path per E).
* ``speed``: agent-steps/s side by side in one run: asynchronous Q-learning (d = 30), TD FedLSA
  under Markov sampling at the same d, synchronous Q-learning (reported per (s, a) update), and
  drawing the kernel's uniforms alone.

    python benchmarks/fed_q_learning.py                      # all parts, the sizes of the README
    python benchmarks/fed_q_learning.py --parts speed
    python benchmarks/fed_q_learning.py --seeds 200 --sweep-seeds 100 --maze-seeds 50   # a quick look

Writes ``benchmarks/results/fed_q_learning.json`` (each part replaces its own, keeping the others) and
``benchmarks/figures/fed_q_learning_woo.png``, ``fed_q_learning_maze.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from _bench import add_cpu_devices_option, best_of, save_figure, use_cpu_devices, write_json

HERE = Path(__file__).resolve().parent
GAMMA_WOO, N_WOO, TAU_WOO = 0.9, 20, 50
GAMMA_MAZE, N_MAZE = 0.99, 20
AVERAGING = {"fedlsa": "equal averaging", "importance_averaging": "importance averaging"}


def _sup_curve(res, gamma: float) -> dict:
    """``(1 - gamma) |Q_t - Q*|_inf``: mean and standard error over seeds, at the recorded rounds."""
    m = res.metrics["sup_error"]
    return {
        "error": ((1 - gamma) * np.asarray(m.mean)).tolist(),
        "error_se": ((1 - gamma) * np.asarray(m.sem)).tolist(),
        "diverged": int(np.max(np.asarray(res.num_diverged))),
        "seeds": int(res.num_seeds),
    }


def _run(problem, alg, steps: int, H: int, seeds: int, key: int, points: int, gamma: float) -> dict:
    import jax

    import fedsa_jax as fj

    rounds = max(steps // H, 1)
    t0 = time.perf_counter()
    res = fj.simulate(
        jax.random.key(key),
        problem,
        alg,
        rounds,
        seeds,
        theta0=np.zeros(problem.dim),
        record_every=max(rounds // points, 1),
        metrics=["sup_error"],
        progress=False,
    )
    out = {"steps": (np.asarray(res.rounds) * H).tolist(), **_sup_curve(res, gamma)}
    out["seconds"] = time.perf_counter() - t0
    return out


# --- Woo, Joshi, Chi -------------------------------------------------------------------------------


def woo(args) -> dict:
    import fedsa_jax as fj

    steps, seeds = args.woo_steps, args.seeds
    schedules = {
        f"constant {args.eta}": args.eta,
        f"eta0 {args.eta0} / (1 + k / {args.k0:g})": fj.schedule(
            fj.optim.inverse_time, eta0=args.eta0, k0=args.k0
        ),
    }
    decreasing = list(schedules.values())[1]
    out = {"steps": steps, "sweep_step": list(schedules)[1], "curves": {}, "agents": {}, "period": {}}
    problem = fj.problems.two_state_q_learning(N_WOO, heterogeneity=1.0, gamma=GAMMA_WOO)
    print(f"woo: two-state MDP, Q* = {np.asarray(problem.theta_star).round(4).tolist()}, T = {steps} steps")
    for label, eta in schedules.items():
        for name in AVERAGING:
            run = _run(
                problem, getattr(fj, name)(eta, TAU_WOO), steps, TAU_WOO, seeds, 1, args.points, GAMMA_WOO
            )
            out["curves"][f"{name}/{label}"] = run
            _say(f"{AVERAGING[name]}, {label}, N={N_WOO}, tau={TAU_WOO}", run)
    for N in args.woo_agents:
        problem = fj.problems.two_state_q_learning(N, heterogeneity=1.0, gamma=GAMMA_WOO)
        for name in AVERAGING:
            alg = getattr(fj, name)(decreasing, TAU_WOO)
            run = _run(problem, alg, steps, TAU_WOO, args.sweep_seeds, 2, 4, GAMMA_WOO)
            out["agents"][f"{name}/{N}"] = run
            _say(f"{AVERAGING[name]}, N={N}, tau={TAU_WOO}", run)
    problem = fj.problems.two_state_q_learning(N_WOO, heterogeneity=1.0, gamma=GAMMA_WOO)
    for tau in args.woo_periods:
        for name in AVERAGING:
            run = _run(
                problem, getattr(fj, name)(decreasing, tau), steps, tau, args.sweep_seeds, 3, 4, GAMMA_WOO
            )
            out["period"][f"{name}/{tau}"] = run
            _say(f"{AVERAGING[name]}, N={N_WOO}, tau={tau}", run)
    return out


def _say(what: str, run: dict) -> None:
    print(
        f"  {what:<58} (1-gamma)|Q_T - Q*|_inf = {run['error'][-1]:.3e} +- {run['error_se'][-1]:.1e}"
        f"  ({run['seeds']} runs, {run['seconds']:.0f} s)",
        flush=True,
    )


# --- Wang, Yang, Su ----------------------------------------------------------------------------------


def maze(args) -> dict:
    import fedsa_jax as fj

    problem = fj.problems.maze_q_learning(N_MAZE, wind=args.wind, gamma=GAMMA_MAZE)
    star = np.asarray(problem.theta_star, np.float64)
    out = {"steps": args.maze_steps, "eta": args.maze_eta, "wind": args.wind, "runs": {}}
    print(f"maze: S = {problem.num_states}, d = {problem.dim}, eta = {args.maze_eta}, T = {args.maze_steps}")
    for E in args.maze_e:
        alg = fj.fedlsa(args.maze_eta, E)
        rounds = max(args.maze_steps // E, 1)
        path = np.asarray(fj.theory.mean_path(problem, alg, rounds, theta0=np.zeros(problem.dim)), np.float64)
        limit = np.asarray(fj.theory.mean_path_limit(problem, alg), np.float64)
        run = _run(problem, alg, args.maze_steps, E, args.maze_seeds, 4, args.points, GAMMA_MAZE)
        exact = (1 - GAMMA_MAZE) * np.abs(path - star).max(-1)
        run["noise_free"] = exact[np.asarray(run["steps"]) // E].tolist()
        run["noise_free_min"] = float(exact.min())
        run["noise_free_min_step"] = int(exact.argmin() * E)
        run["plateau"] = float((1 - GAMMA_MAZE) * np.abs(limit - star).max())
        out["runs"][str(E)] = run
        _say(f"E={E}", run)
        print(
            f"    noise-free: min {run['noise_free_min']:.3e} at step {run['noise_free_min_step']}, "
            f"plateau (fixed point of the averaged E-fold operator) {run['plateau']:.3e}",
            flush=True,
        )
    return out


def floor(args) -> dict:
    """The E/((1 - gamma) T) floor on the mazes' exact noise-free path (float64), with a decreasing step
    ``eta_k = eta0 / (1 + k / k0)``: the error times T / E at the largest T's, per E."""
    import jax

    import fedsa_jax as fj

    jax.config.update("jax_enable_x64", True)
    problem = fj.problems.maze_q_learning(N_MAZE, wind=args.wind, gamma=GAMMA_MAZE, dtype="float64")
    star = np.asarray(problem.theta_star, np.float64)
    step = fj.schedule(fj.optim.inverse_time, eta0=args.eta0, k0=args.floor_k0)
    out = {"eta0": args.eta0, "k0": args.floor_k0, "runs": {}}
    print(
        f"floor: mazes' noise-free path, step {args.eta0} / (1 + k / {args.floor_k0:g}), "
        f"T up to {args.floor_steps}"
    )
    for E in args.floor_e:
        path = fj.theory.mean_path(
            problem, fj.fedlsa(step, E), args.floor_steps // E, theta0=np.zeros(problem.dim)
        )
        err = (1 - GAMMA_MAZE) * np.abs(np.asarray(path, np.float64) - star).max(-1)
        Ts = [T for T in (20_000, 50_000, 100_000, 200_000) if T <= args.floor_steps]
        out["runs"][str(E)] = {str(T): float(err[T // E]) for T in Ts}
        scaled = ", ".join(f"T={T}: {err[T // E]:.3e} (x T/E = {err[T // E] * T / E:.3g})" for T in Ts)
        print(f"  E={E}: {scaled}", flush=True)
    return out


# --- speed -------------------------------------------------------------------------------------------


def speed(args) -> dict:
    import jax
    import jax.numpy as jnp

    import fedsa_jax as fj

    N, H, T, seeds = 10, 100, args.speed_rounds, args.speed_seeds
    steps = N * H * T * seeds
    rng = np.random.default_rng(0)  # dense random MDPs, S = 10, A = 3, one per agent
    P = rng.uniform(size=(N, 10, 3, 10))
    P /= P.sum(-1, keepdims=True)
    r = rng.uniform(size=(N, 10, 3))
    asyn = fj.problems.q_learning(P, r, 0.9, sampling="asynchronous", dtype="float32")
    sync = fj.problems.q_learning(P, r, 0.9, dtype="float32")
    td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=30, dim=asyn.dim, sampling="markov")
    rows = {}
    print(f"speed: N={N} H={H} T={T} seeds={seeds} ({steps:.0e} agent-steps, float32, {args.devices})")
    for name, problem, alg in (
        ("Q-learning asynchronous (d=30)", asyn, fj.fedlsa(0.05, H)),
        ("Q-learning asynchronous, importance averaging", asyn, fj.importance_averaging(0.05, H)),
        (f"TD FedLSA Markov (d={asyn.dim})", td, fj.fedlsa(0.05, H)),
        ("Q-learning synchronous (30 updates a step)", sync, fj.fedlsa(0.05, H)),
    ):
        run = lambda: fj.simulate(jax.random.key(1), problem, alg, T, seeds, progress=False)  # noqa: E731, B023
        t0 = time.perf_counter()
        run()
        first = time.perf_counter() - t0
        best = best_of(run, 2)
        rows[name] = {"seconds": best, "steps_per_s": steps / best, "first_call": first}
        extra = f", {steps * sync.dim / best:.3g} (s, a)-updates/s" if problem is sync else ""
        print(f"  {name:<48} {best:7.3f} s  {steps / best:9.3g} agent-steps/s{extra}  (first {first:.1f} s)")
    rows["Q-learning synchronous (30 updates a step)"]["updates_per_s"] = (
        rows["Q-learning synchronous (30 updates a step)"]["steps_per_s"] * sync.dim
    )
    for name, problem in (("uniforms only, asynchronous", asyn), ("uniforms only, synchronous", sync)):
        keys = jax.random.split(jax.random.key(0), seeds)

        def rounds(k, p=problem):  # each round's block, as the kernel draws them
            total = lambda acc, t: (acc + p.randomness(jax.random.fold_in(k, t), N, H, 1).sum(), None)  # noqa: E731
            return jax.lax.scan(total, jnp.zeros((), p.dtype), jnp.arange(T))[0]

        block = jax.jit(jax.vmap(rounds))
        block(keys).block_until_ready()
        rows[name] = {"seconds": best_of(lambda b=block: b(keys).block_until_ready(), 3)}
        print(f"  {name:<48} {rows[name]['seconds']:7.3f} s")
    return rows


# --- figures -----------------------------------------------------------------------------------------


def plot_woo(report: dict, figures: Path, json_path) -> None:
    import matplotlib.pyplot as plt

    woo = report["woo"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    for k, (key, run) in enumerate(woo["curves"].items()):
        name, label = key.split("/", 1)
        x, y, se = np.asarray(run["steps"]), np.asarray(run["error"]), np.asarray(run["error_se"])
        color = f"C{k // 2}"
        style = "-" if name == "importance_averaging" else "--"
        ax.plot(x[1:], y[1:], style, color=color, label=f"{AVERAGING[name]}, {label}")
        ax.fill_between(x[1:], (y - 2 * se)[1:], (y + 2 * se)[1:], color=color, alpha=0.2)
    ax.set(xscale="log", yscale="log", xlabel="local steps T", ylabel=r"$(1-\gamma)\|Q_T - Q^*\|_\infty$")
    ax.set_title(
        f"N = {N_WOO}, period {TAU_WOO}, {next(iter(woo['curves'].values()))['seeds']} runs", fontsize=9
    )
    ax.legend(fontsize=6)
    for ax, part, xlabel in ((axes[1], "agents", "agents N"), (axes[2], "period", "synchronisation period")):
        for name in AVERAGING:
            keys = [k for k in woo[part] if k.startswith(name + "/")]
            x = np.array([int(k.split("/")[1]) for k in keys])
            y = np.array([woo[part][k]["error"][-1] for k in keys])
            se = np.array([woo[part][k]["error_se"][-1] for k in keys])
            ax.errorbar(x, y, 2 * se, marker="o", capsize=2, label=AVERAGING[name])
        ax.set(xscale="log", yscale="log", xlabel=xlabel)
        ax.set_xticks(x, [str(v) for v in x], minor=False)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_title(f"at T = {woo['steps']}, step {woo['sweep_step']}", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, figures, "fed_q_learning_woo.png", json_path, report)


def plot_maze(report: dict, figures: Path, json_path) -> None:
    import matplotlib.pyplot as plt

    maze = report["maze"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (E, run) in enumerate(maze["runs"].items()):
        x, y, se = np.asarray(run["steps"]), np.asarray(run["error"]), np.asarray(run["error_se"])
        ax.plot(x[1:], y[1:], color=f"C{k}", label=f"E = {E} ({run['seeds']} runs)")
        ax.fill_between(x[1:], (y - 2 * se)[1:], (y + 2 * se)[1:], color=f"C{k}", alpha=0.2)
        ax.plot(x[1:], np.asarray(run["noise_free"])[1:], ":", color=f"C{k}")
        ax.axhline(run["plateau"], color=f"C{k}", lw=0.8, ls="--")
    ax.set(xscale="log", yscale="log", xlabel="local steps T", ylabel=r"$(1-\gamma)\|Q_T - Q^*\|_\infty$")
    ax.set_title(
        f"mazes, N = {N_MAZE}, eta = {maze['eta']}, wind {maze['wind']}: Monte Carlo (solid), "
        "noise-free path (dotted), its plateau (dashed)",
        fontsize=7,
    )
    ax.legend(fontsize=7)
    save_figure(fig, figures, "fed_q_learning_maze.png", json_path, report)


def main(argv=None):
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="speed,woo,maze,floor")
    parser.add_argument("--seeds", type=int, default=10_000, help="runs of each woo curve")
    parser.add_argument("--sweep-seeds", type=int, default=2_000, help="runs of each woo sweep point")
    parser.add_argument("--woo-steps", type=int, default=20_000)
    parser.add_argument("--eta", type=float, default=0.05, help="woo's constant step")
    parser.add_argument("--eta0", type=float, default=0.5)
    parser.add_argument("--k0", type=float, default=100.0)
    parser.add_argument("--woo-agents", type=ints, default=[2, 5, 10, 20, 40])
    parser.add_argument("--woo-periods", type=ints, default=[1, 10, 50, 250])
    parser.add_argument("--maze-seeds", type=int, default=10_000)
    parser.add_argument("--maze-steps", type=int, default=10_000)
    parser.add_argument("--maze-eta", type=float, default=0.1)
    parser.add_argument("--maze-e", type=ints, default=[10, 50])
    parser.add_argument("--wind", type=float, default=0.2)
    parser.add_argument("--floor-e", type=ints, default=[10, 50, 200])
    parser.add_argument("--floor-steps", type=int, default=200_000)
    parser.add_argument("--floor-k0", type=float, default=1000.0)
    parser.add_argument("--points", type=int, default=60, help="recorded rounds per curve")
    parser.add_argument("--speed-rounds", type=int, default=20)
    parser.add_argument("--speed-seeds", type=int, default=1000)
    parser.add_argument("--json", default=str(HERE / "results" / "fed_q_learning.json"))
    add_cpu_devices_option(parser)
    args = parser.parse_args(argv)
    args.devices = use_cpu_devices(args.cpu_devices)
    parts = args.parts.split(",")
    report: dict = json.loads(Path(args.json).read_text()) if Path(args.json).exists() else {}
    report.update(devices=args.devices, date=time.strftime("%Y-%m-%d"))
    parts_fns = (
        ("speed", speed, None),
        ("woo", woo, plot_woo),
        ("maze", maze, plot_maze),
        ("floor", floor, None),
    )
    for part, fn, plot in parts_fns:
        if part not in parts:
            continue
        t0 = time.perf_counter()
        report[part] = fn(args)
        report[f"{part}_seconds"] = time.perf_counter() - t0
        print(f"{part}: {report[f'{part}_seconds']:.0f} s")
        write_json(args.json, report)
        if plot is not None:
            plot(report, HERE / "figures", args.json)


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
