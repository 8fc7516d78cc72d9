"""Federated SARSA: the paper's Garnet experiment at 100x its seeds, beside the peer's own code, and the
kernel's speed.

Mangold, Berthier, Moulines, "Convergence guarantees for federated SARSA with local training and
heterogeneous agents" (arXiv:2512.17688), Sec. 6: Garnet MDPs (S = 10, A = 3, branching 2, one-hot
features, temperature 2, gamma 0.9, step 0.01), agents alternating between the MDPs of generation
seeds 0 and 1, theta0 = theta_lim_fed + U(-10/sqrt(SA), 10/sqrt(SA)) (drawn from
``default_rng(42)``, as the paper's script), N in {2, 10, 20, 50, 100}, H in {1, 100, 10^4}, 10^6
local steps; its code runs 10 repetitions. Here FedSARSA (``fj.fedlsa``) and the drift-corrected
variant (``fj.scafflsa``), the MSE to theta_lim_fed and to theta_lim_avg with error bands, beside
the noise-free limits (``fj.theory.mean_path_limit``).

Parts (``--parts``, default all):

* ``speed``: agent-steps/s side by side in one run: FedSARSA one-hot (d = 30) and with dense features
  (d = 8), federated TD FedLSA at the same d (Garnet MRPs), drawing the kernel's uniforms alone, a
  numpy loop vectorised over seeds and agents, and the peer's code (one process) when its folder is
  given;
* ``peer``: the peer's code (``--peer``, the ``garnet`` folder of ``pmangold/fed-sarsa``; skipped
  without it): the same MDPs from the same generation seeds, its mean field at our theta_lim_fed,
  and the final MSE law of FedSARSA at a reduced size (its code with fresh environments per seed,
  ours on the same schedule of local steps: one step, then rounds of H, as its ``t % H == 0``);
* ``experiment``: the grid (``--steps``, ``--seeds``, ``--seeds-large`` for N >= 20).

    python benchmarks/fed_sarsa.py --peer PATH/fed-sarsa/garnet   # all parts
    python benchmarks/fed_sarsa.py --parts experiment --steps 1000000 --seeds 1000 --seeds-large 100
    python benchmarks/fed_sarsa.py --parts experiment ... --resume   # after an interrupted grid

The grid writes the result file after each run (keeping its other parts); ``--resume`` keeps the
runs it already holds at the same steps and seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from _bench import add_cpu_devices_option, save_figure, use_cpu_devices, write_json

HERE = Path(__file__).resolve().parent
S, A, B = 10, 3, 2
ALPHA, TAU, GAMMA = 0.01, 2.0, 0.9
N_LIST = (2, 10, 20, 50, 100)
H_LIST = (1, 100, 10_000)
VARIANTS = {"fedlsa": "FedSARSA", "scafflsa": "drift-corrected"}


def theta0(problem) -> np.ndarray:
    """The paper's start: theta_lim_fed + U(-10/sqrt(SA), 10/sqrt(SA)) from ``default_rng(42)``."""
    star = np.asarray(problem.theta_star, np.float64)
    half = 10 / np.sqrt(S * A)
    return star + np.random.default_rng(42).uniform(-half, half, size=star.shape)


def mse_to_avg(state, problem):
    """``|theta_t - theta_lim_avg|^2`` (a metric: the problem carries theta_avg)."""
    return ((state.theta - problem.theta_avg) ** 2).sum()


# --- speed -------------------------------------------------------------------------------------------


def numpy_fedsarsa(problem, seeds: int, H: int, rounds: int, rng) -> float:
    """FedSARSA in numpy vectorised over seeds and agents (alias sampling, one block of uniforms per
    round): seconds for ``rounds`` rounds."""
    import fedsa_jax as fj

    P = np.asarray(problem.transitions, np.float64)
    N, d = P.shape[0], problem.dim
    prob, alias = fj.problems.alias_tables(P)
    prob, alias = prob.reshape(N, S * A, S), alias.reshape(N, S * A, S)
    Phi = np.asarray(problem.features, np.float64).reshape(S * A, d)
    r = np.asarray(problem.rewards, np.float64).reshape(N, S * A)
    agents = np.arange(N)[None, :]
    theta = np.broadcast_to(np.asarray(problem.theta_star, np.float64), (seeds, d)).copy()
    pair = rng.integers(0, S * A, size=(seeds, N))
    t0 = time.perf_counter()
    for _ in range(rounds):
        local = np.repeat(theta[:, None, :], N, axis=1)
        u = rng.random((H, 2, seeds, N))
        for h in range(H):
            x = u[h, 0] * S
            i = np.minimum(x.astype(np.int64), S - 1)
            keep = x - i < prob[agents, pair, i]
            s2 = np.where(keep, i, alias[agents, pair, i])
            q = np.einsum("bnad,bnd->bna", Phi.reshape(S, A, d)[s2], local) / TAU
            p = np.exp(q - q.max(-1, keepdims=True))
            cdf = np.cumsum(p, -1)
            a2 = np.sum(cdf[..., :-1] <= u[h, 1][..., None] * cdf[..., -1:], axis=-1)
            nxt = s2 * A + a2
            phi = Phi[pair]
            td = r[agents, pair] + GAMMA * np.sum(Phi[nxt] * local, -1) - np.sum(phi * local, -1)
            local += ALPHA * td[..., None] * phi
            pair = nxt
        theta = local.mean(1)
    return time.perf_counter() - t0


def peer_speed(peer: Path, steps: int) -> float:
    """Agent-steps/s of the peer's ``fed_sarsa`` (one process, N = 2, H = 100)."""
    garnet, fed_algos = _peer_modules(peer)
    envs = [garnet.GarnetEnv(S, A, B, seed=i, generation_seed=i % 2) for i in range(2)]
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        fed_algos.fed_sarsa(np.zeros(S * A), envs, steps, H=100, alpha=ALPHA, gamma=GAMMA, temperature=TAU)
    return 2 * steps / (time.perf_counter() - t0)


def speed(args) -> dict:
    import jax

    import fedsa_jax as fj

    N, H, T, seeds = 10, 100, args.speed_rounds, args.speed_seeds
    steps = N * H * T * seeds
    rows = {}

    def timed(name, problem, alg):
        run = lambda: fj.simulate(jax.random.key(1), problem, alg, T, seeds, progress=False)  # noqa: E731
        t0 = time.perf_counter()
        run()
        first = time.perf_counter() - t0
        best = min(_seconds(run) for _ in range(2))
        rows[name] = {"seconds": best, "steps_per_s": steps / best, "first_call": first}
        print(f"  {name:<34} {best:7.3f} s  {steps / best:9.3g} agent-steps/s  (first call {first:.1f} s)")

    one_hot = fj.problems.garnet_control(num_agents=N)
    dense = fj.problems.garnet_control(num_agents=N, dim=8)
    print(f"speed: N={N} H={H} T={T} seeds={seeds} ({steps:.0e} agent-steps, float32, {args.devices})")
    timed("FedSARSA one-hot (d=30)", one_hot, fj.fedlsa(ALPHA, H))
    timed("drift-corrected one-hot (d=30)", one_hot, fj.scafflsa(ALPHA, H))
    timed("FedSARSA dense (d=8)", dense, fj.fedlsa(ALPHA, H))
    for d in (30, 8):
        td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=30, dim=d, sampling="markov")
        timed(f"TD FedLSA Markov (d={d})", td, fj.fedlsa(ALPHA, H))
    draw = jax.jit(lambda k: one_hot.randomness(k, N, H * T, 1), static_argnums=())
    key = jax.random.key(0)
    keys = jax.random.split(key, seeds)
    block = jax.jit(jax.vmap(lambda k: draw(k).sum()))
    block(keys).block_until_ready()
    uniforms = min(_seconds(lambda: block(keys).block_until_ready()) for _ in range(3))
    rows["uniforms only"] = {"seconds": uniforms}
    print(f"  {'uniforms only (the kernel draw)':<34} {uniforms:7.3f} s")
    numpy_seeds = max(seeds // 10, 1)
    t_np = numpy_fedsarsa(one_hot, numpy_seeds, H, T, np.random.default_rng(0)) * seeds / numpy_seeds
    rows["numpy"] = {"seconds": t_np, "steps_per_s": steps / t_np, "seeds_run": numpy_seeds}
    print(f"  {'numpy, vectorised (one core)':<34} {t_np:7.3f} s  {steps / t_np:9.3g} agent-steps/s")
    if args.peer:
        rate = peer_speed(args.peer, args.peer_speed_steps)
        rows["peer"] = {"steps_per_s": rate}
        print(f"  {'peer code (one process)':<34} {'':9}  {rate:9.3g} agent-steps/s")
    return rows


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- the peer's code -----------------------------------------------------------------------------


def _peer_modules(peer: Path):
    sys.path.insert(0, str(peer))
    import fed_algos  # pyright: ignore[reportMissingImports]
    import garnet  # pyright: ignore[reportMissingImports]

    return garnet, fed_algos


def peer(args) -> dict:
    import jax

    import fedsa_jax as fj

    garnet, fed_algos = _peer_modules(args.peer)
    problem = fj.problems.garnet_control(num_agents=2)
    envs = [garnet.GarnetEnv(S, A, B, seed=i, generation_seed=i % 2) for i in range(2)]
    mdps = [fj.problems.garnet_control_mdp(S, A, B, seed) for seed in (0, 1)]
    one_hot = np.eye(S * A).reshape(S, A, S * A)
    same = all(  # draw for draw: the same float64 values
        np.array_equal(mdps[c][1], envs[c].rewards)
        and all(
            np.array_equal(mdps[c][0][s, a, envs[c].transitions[s][a]], envs[c].probs[s][a])
            for s in range(S)
            for a in range(A)
        )
        for c in range(2)
    )
    star = fj.problems.federated_sarsa.sarsa_limit(
        [m[0] for m in mdps], [m[1] for m in mdps], one_hot, GAMMA, TAU
    )
    residual = np.linalg.norm(
        sum(fed_algos.det_sarsa_update(env, star, TAU, GAMMA, S, A) for env in envs) / 2
    )
    print(
        f"peer: same MDPs from generation seeds 0, 1: {same}; "
        f"|peer mean field at theta_lim_fed| = {residual:.2e}"
    )
    # the final MSE law at a reduced size: one step, then K rounds of H (the peer's t % H == 0)
    H, K, peer_seeds, seeds = args.peer_h, args.peer_rounds, args.peer_seeds, args.peer_our_seeds
    start = theta0(problem)
    finals = []
    t0 = time.perf_counter()
    for seed in range(peer_seeds):
        fresh = [garnet.GarnetEnv(S, A, B, seed=1000 * seed + i, generation_seed=i % 2) for i in range(2)]
        with contextlib.redirect_stderr(io.StringIO()):
            _, theta, _, _ = fed_algos.fed_sarsa(
                start, fresh, K * H + 1, H=H, alpha=ALPHA, gamma=GAMMA, temperature=TAU, seed=seed, num_logs=2
            )
        finals.append(np.sum((theta.mean(0) - star) ** 2))
    peer_time = time.perf_counter() - t0
    finals = np.asarray(finals)
    schedule = [1] + [H] * K
    res = fj.simulate(
        jax.random.key(0), problem, fj.fedlsa(ALPHA, schedule), K + 1, seeds, theta0=start, progress=False
    )
    ours, ours_se = float(res.mse_mean[-1]), float(res.mse_sem[-1])
    theirs, theirs_se = float(finals.mean()), float(finals.std(ddof=1) / np.sqrt(len(finals)))
    z = (theirs - ours) / np.hypot(theirs_se, ours_se)
    print(
        f"peer: final MSE after {K * H + 1} steps (N=2, H={H}): peer {theirs:.4g} +- {theirs_se:.2g} "
        f"({peer_seeds} seeds, {peer_time:.0f} s), ours {ours:.4g} +- {ours_se:.2g} ({seeds} seeds): "
        f"z = {z:+.2f}"
    )
    return {
        "same_mdps": bool(same),
        "peer_mean_field_at_theta_lim_fed": float(residual),
        "final_mse": {"peer": [theirs, theirs_se, peer_seeds], "ours": [ours, ours_se, seeds], "z": float(z)},
        "steps": K * H + 1,
        "H": H,
    }


# --- the experiment ------------------------------------------------------------------------------------


def experiment(args) -> dict:
    import jax

    import fedsa_jax as fj

    base = fj.problems.garnet_control(num_agents=2)
    start = theta0(base)
    star = np.asarray(base.theta_star, np.float64)
    avg = np.asarray(base.theta_avg, np.float64)
    out = {
        "theta_lim_fed_minus_avg": float(np.sum((star - avg) ** 2)),
        "steps": args.steps,
        "limits": {},
        "runs": {},
    }
    print(f"experiment: |theta_lim_fed - theta_lim_avg|^2 = {out['theta_lim_fed_minus_avg']:.4g}")
    for name in args.variants:
        for H in args.h:
            alg = getattr(fj, name)(ALPHA, H)
            limit = fj.theory.mean_path_limit(base, alg)  # N = 2: every even N alternates the same two MDPs
            out["limits"][f"{name}/{H}"] = {
                "to_fed": float(np.sum((limit - star) ** 2)),
                "to_avg": float(np.sum((limit - avg) ** 2)),
            }
            print(
                f"  noise-free limit {VARIANTS[name]}, H={H}: "
                f"|lim - theta_lim_fed|^2 = {out['limits'][f'{name}/{H}']['to_fed']:.3g}"
            )
    done = _finished_runs(args) if args.resume else {}
    for N in args.n:
        problem = fj.problems.garnet_control(num_agents=N)
        seeds = args.seeds if N <= 10 else args.seeds_large
        for name in args.variants:
            for H in args.h:
                key = f"{name}/{N}/{H}"
                if done.get(key, {}).get("seeds") == seeds:
                    out["runs"][key] = done[key]
                    print(f"  {VARIANTS[name]:<16} N={N:<3} H={H:<6} seeds={seeds:<5} kept from {args.json}")
                    continue
                rounds = max(args.steps // H, 1)
                every = max(rounds // args.points, 1)
                t0 = time.perf_counter()
                res = fj.simulate(
                    jax.random.key(N * 1000 + H),
                    problem,
                    getattr(fj, name)(ALPHA, H),
                    rounds,
                    seeds,
                    theta0=start,
                    record_every=every,
                    metrics={"mse_avg": mse_to_avg},
                    progress=False,
                )
                seconds = time.perf_counter() - t0
                out["runs"][key] = {
                    "steps": (np.asarray(res.rounds) * H).tolist(),
                    "mse_fed": np.asarray(res.mse_mean).tolist(),
                    "mse_fed_se": np.asarray(res.mse_sem).tolist(),
                    "mse_avg": np.asarray(res.metrics["mse_avg"].mean).tolist(),
                    "mse_avg_se": np.asarray(res.metrics["mse_avg"].sem).tolist(),
                    "seeds": seeds,
                    "diverged": int(np.max(np.asarray(res.num_diverged))),
                    "seconds": seconds,
                }
                _save_part(args.json, "experiment", out)  # what ran so far survives an interrupted run
                last = out["runs"][key]
                print(
                    f"  {VARIANTS[name]:<16} N={N:<3} H={H:<6} seeds={seeds:<5} "
                    f"MSE to fed {last['mse_fed'][-1]:.3e} +- {last['mse_fed_se'][-1]:.1e}, "
                    f"to avg {last['mse_avg'][-1]:.3e}  ({seconds:.0f} s)",
                    flush=True,
                )
    return out


def _finished_runs(args) -> dict:
    """``--resume``: the grid's runs already in ``--json`` at the same number of steps."""
    path = Path(args.json)
    if not path.exists():
        return {}
    old = json.loads(path.read_text()).get("experiment", {})
    return old.get("runs", {}) if old.get("steps") == args.steps else {}


def _save_part(path, part: str, value) -> None:
    """Write ``value`` as the ``part`` of the result file ``path``, keeping its other parts."""
    report = json.loads(Path(path).read_text()) if path and Path(path).exists() else {}
    report[part] = value
    write_json(path, report)


def plot(report: dict, figures: Path, json_path) -> None:
    import matplotlib.pyplot as plt

    runs = report["experiment"]["runs"]
    Ns = sorted({int(k.split("/")[1]) for k in runs})
    Hs = sorted({int(k.split("/")[2]) for k in runs})
    fig, axes = plt.subplots(2, len(Ns), figsize=(3.2 * len(Ns), 6), sharey="row", squeeze=False)
    colors = dict(zip(Hs, ("C0", "C1", "C2", "C3")))
    for j, N in enumerate(Ns):
        for i, which in enumerate(("fed", "avg")):
            ax = axes[i, j]
            for key, run in runs.items():
                name, n, H = key.split("/")
                if int(n) != N:
                    continue
                x = np.asarray(run["steps"])
                y, se = np.asarray(run[f"mse_{which}"]), np.asarray(run[f"mse_{which}_se"])
                style = "-" if name == "fedlsa" else "--"
                ax.plot(x[1:], y[1:], style, color=colors[int(H)], label=f"{VARIANTS[name]}, H={H}")
                ax.fill_between(x[1:], (y - 2 * se)[1:], (y + 2 * se)[1:], color=colors[int(H)], alpha=0.2)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"N = {N}: MSE to theta_lim_{which}", fontsize=9)
            ax.set_xlabel("local steps")
    axes[0, 0].legend(fontsize=6)
    save_figure(fig, figures, "fed_sarsa.png", json_path, report)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="speed,peer,experiment")
    parser.add_argument("--peer", type=Path, default=None, help="the garnet folder of pmangold/fed-sarsa")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, default=1000, help="seeds for N <= 10")
    parser.add_argument("--seeds-large", type=int, default=100, help="seeds for N >= 20")
    parser.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=list(N_LIST))
    parser.add_argument("--h", type=lambda s: [int(x) for x in s.split(",")], default=list(H_LIST))
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    parser.add_argument("--points", type=int, default=100, help="recorded rounds per curve")
    parser.add_argument("--speed-rounds", type=int, default=20)
    parser.add_argument("--speed-seeds", type=int, default=1000)
    parser.add_argument("--peer-speed-steps", type=int, default=20_000)
    parser.add_argument("--peer-h", type=int, default=10)
    parser.add_argument("--peer-rounds", type=int, default=100)
    parser.add_argument("--peer-seeds", type=int, default=50)
    parser.add_argument("--peer-our-seeds", type=int, default=10_000)
    parser.add_argument("--json", default=str(HERE / "results" / "fed_sarsa.json"))
    parser.add_argument("--plot", type=Path, default=None, help="only draw the figure from this result file")
    parser.add_argument(
        "--resume", action="store_true", help="keep the grid's runs already in --json (same steps and seeds)"
    )
    add_cpu_devices_option(parser)
    args = parser.parse_args(argv)
    args.devices = use_cpu_devices(args.cpu_devices)
    if args.plot is not None:
        plot(json.loads(args.plot.read_text()), HERE / "figures", None)
        return
    parts = args.parts.split(",")
    if args.peer is not None and not (args.peer / "fed_algos.py").exists():
        parser.error(f"--peer={args.peer}: no fed_algos.py there (the garnet folder of pmangold/fed-sarsa)")
    # the parts run now replace theirs in the result file; the others stay
    report: dict = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
    report.update(devices=args.devices, date=time.strftime("%Y-%m-%d"))
    if "speed" in parts:
        report["speed"] = speed(args)
    if "peer" in parts:
        if args.peer is None:
            print("peer: skipped (no --peer folder)")
        else:
            report["peer"] = peer(args)
    if "experiment" in parts:
        report["experiment"] = experiment(args)
        plot(report, HERE / "figures", args.json)
    else:
        write_json(args.json, report)


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
