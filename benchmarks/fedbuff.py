"""Buffered asynchronous aggregation (FedBuff) against synchronous FedLSA at equal wall-clock.

Garnet TD (generative, S = 10, d = 4, N = 10), float64, started at ``theta = 0``, H = 5 local steps,
eta = 0.5, on the simulated clock of ``fj.clock`` (integer ticks). Three panels, stacked (readable at
a column's width; panels 1 and 2 share one legend):

1. **Stragglers, homogeneous agents.** Every job takes 1 tick, except with probability 0.1 it takes
   20 (``fj.clock.straggler(1, 0.1, 20)``). Synchronous FedLSA waits for its slowest agent: a round
   lasts ``E[max_c D_c]`` ticks (``Durations.sync_round_time``, 13.4 here), and its MSE is the exact
   ``exact_mse`` (with Monte Carlo) drawn at ``t E[max_c D_c]``. FedBuff with buffers K = 1, 5, 10
   (weights ``1/sqrt(1 + staleness)``, and K = 5 without weights) is drawn at the mean simulated
   clock of each server step (the metric ``"wall_clock"``). Printed: the MSE of each at equal
   wall-clock (``--ticks``), and the mean staleness.
2. **Stragglers, heterogeneous agents.** The same on the heterogeneous Garnet, with K = 10 also
   under a server learning rate 0.3 (``optax.sgd(0.3)``): a buffer holds the updates of whichever
   agents arrived, each pulling to its own local solution, and that sampling leaves a floor.
3. **Agents of different speeds.** Agent c's jobs are geometric with mean ``1 + c`` ticks (at most
   40). Every agent always busy, agent c contributes at the rate ``r_c = 1 / E[D_c]`` per tick
   (renewal theorem): without staleness weights FedBuff's limit is, as eta -> 0, the fixed point of
   the rate-weighted problem ``theta_r = [sum_c r_c A_c]^{-1} sum_c r_c b_c`` (to first order in
   eta, the same objective inconsistency as unequal local work). The panel draws FedBuff's MSE
   (heterogeneous agents, K = 5, eta = 0.1, no weights) against wall-clock beside
   ``|theta_r - theta*|^2`` and FedLSA's exact limit; printed: ``|E theta_T - theta_r|`` against
   ``|E theta_T - theta*|``.

    python benchmarks/fedbuff.py [--seeds 1000] [--ticks 1500] [--json out.json]   # about 2 min
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import matplotlib
import numpy as np
import optax
from _bench import save_figure

import fedsa_jax as fj

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

H = 5
ETA = 0.5


def _fedbuff_curve(ax, problem, alg, ticks: int, seeds: int, color, label: str) -> dict:
    """Run ``alg`` for as many server steps as ``ticks`` allow on average, draw its MSE band against
    the mean clock, and return its figures at the last step before ``ticks``."""
    law = alg.config.durations
    steps = int(np.ceil(1.1 * ticks * law.throughput(problem.num_agents) / alg.config.buffer_size))
    every = max(1, steps // 60)
    t0 = time.perf_counter()
    res = fj.simulate(
        jax.random.key(1), problem, alg, steps, seeds, record_every=every, metrics=["wall_clock", "staleness"]
    )
    wall = time.perf_counter() - t0
    clock = res.metrics["wall_clock"].mean
    band = 2 * res.mse_sem
    ax.fill_between(clock, res.mse_mean - band, res.mse_mean + band, color=color, alpha=0.3)
    ax.plot(clock, res.mse_mean, color=color, lw=1, label=label)
    at = int(np.searchsorted(clock, ticks, side="right")) - 1
    return dict(
        run=label,
        server_steps=int(res.rounds[at]),
        ticks=float(clock[at]),
        mse=float(res.mse_mean[at]),
        sem=float(res.mse_sem[at]),
        staleness=float(res.metrics["staleness"].mean[at]),
        diverged=int(res.num_diverged[-1]),
        mean_theta=res.theta_mean[at].tolist(),
        seconds=wall,
    )


def _sync_curve(ax, problem, law, ticks: int, seeds: int, eta: float) -> dict:
    """Synchronous FedLSA: exact MSE and Monte Carlo against ``t E[max_c D_c]``."""
    per_round = law.sync_round_time(problem.num_agents)
    rounds = int(ticks // per_round)
    alg = fj.fedlsa(eta, H)
    res = fj.simulate(jax.random.key(1), problem, alg, rounds, seeds, record_every=max(1, rounds // 40))
    exact = fj.theory.exact_mse(problem, alg, rounds)
    band = 2 * res.mse_sem
    ax.fill_between(res.rounds * per_round, res.mse_mean - band, res.mse_mean + band, color="k", alpha=0.2)
    ax.plot(np.arange(rounds + 1) * per_round, exact, "k", lw=1, label="synchronous FedLSA (exact)")
    z = np.abs(res.mse_mean[1:] - exact[res.rounds][1:]) / res.mse_sem[1:]
    return dict(
        run="synchronous FedLSA",
        rounds=rounds,
        ticks=rounds * per_round,
        round_ticks=per_round,
        mse=float(res.mse_mean[-1]),
        sem=float(res.mse_sem[-1]),
        exact=float(exact[-1]),
        max_z=float(z.max()),
    )


def rate_weighted_fixed_point(problem, law) -> np.ndarray:
    """``theta_r = [sum_c r_c A_c]^{-1} sum_c r_c b_c``, ``r_c = 1 / E[D_c]``."""
    r = 1.0 / law.mean_durations(problem.num_agents)
    A, b = np.asarray(problem.A_bar, np.float64), np.asarray(problem.b_bar, np.float64)
    return np.linalg.solve(np.einsum("c,cij->ij", r, A), r @ b)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=1500)
    ap.add_argument("--figures", type=Path, default=Path("benchmarks/figures"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)

    def garnet(heterogeneity):
        return fj.problems.garnet(
            jax.random.key(0),
            num_agents=10,
            num_states=10,
            dim=4,
            heterogeneity=heterogeneity,
            dtype="float64",
        )

    plt.rcParams.update({"font.size": 11})
    fig = plt.figure(figsize=(7.5, 15), dpi=110)
    grid = fig.add_gridspec(4, 1, height_ratios=[1, 1, 0.16, 1])  # (a), (b), their legend, (c)
    axes, key = [fig.add_subplot(grid[i]) for i in (0, 1, 3)], fig.add_subplot(grid[2])
    report: dict = {"homogeneous": [], "heterogeneous": [], "speeds": {}}
    law = fj.clock.straggler(1, 0.1, 20.0)
    runs = [(1, 0.5, None, "C0"), (5, 0.5, None, "C2"), (10, 0.5, None, "C3"), (5, 0.0, None, "C1")]
    for ax, kind in zip(axes[:2], ("homogeneous", "heterogeneous")):
        problem = garnet(kind)
        sync = _sync_curve(ax, problem, law, args.ticks, args.seeds, ETA)
        report[kind].append(sync)
        print(
            f"{kind} agents, stragglers (a job 20 ticks w.p. 0.1): synchronous round "
            f"{sync['round_ticks']:.2f} ticks; at {args.ticks} ticks: sync {sync['rounds']} rounds, "
            f"MSE {sync['mse']:.4g} +- {sync['sem']:.2g} (exact {sync['exact']:.4g}, "
            f"max |z| {sync['max_z']:.2f})"
        )
        extra = [(10, 0.5, 0.3, "C4")] if kind == "heterogeneous" else []
        for K, a, lr, color in runs + extra:
            label = f"FedBuff K={K}" + (", 1/sqrt(1+staleness)" if a else ", no weights")
            label += "" if lr is None else f", server lr {lr:g}"
            opt = None if lr is None else optax.sgd(lr)
            alg = fj.fedbuff(ETA, H, K, law, staleness=a, server_optimizer=opt)
            row = _fedbuff_curve(ax, problem, alg, args.ticks, args.seeds, color, label)
            report[kind].append(row)
            print(
                f"  {label:52s} {row['server_steps']:5d} server steps by tick {row['ticks']:.0f}: MSE "
                f"{row['mse']:.4g} +- {row['sem']:.2g}, mean staleness {row['staleness']:.2f}, "
                f"{row['diverged']} diverged, {row['seconds']:.1f} s"
            )
        ax.set(yscale="log", xlabel="simulated wall-clock (ticks)", ylabel=r"$E|\theta - \theta^\star|^2$")
        letter = "a" if kind == "homogeneous" else "b"
        ax.set_title(f"({letter}) {kind} agents, stragglers: H={H}, $\\eta$={ETA:g}", fontsize=12)
    # one legend for (a) and (b), below (b): (b) draws every run of (a) and one more
    key.axis("off")
    key.legend(*axes[1].get_legend_handles_labels(), loc="upper center", ncol=2, fontsize=9.5, frameon=False)

    star = np.asarray(problem.theta_star)
    N = problem.num_agents
    speeds = fj.clock.geometric([1.0 + c for c in range(N)], 40)
    theta_r = rate_weighted_fixed_point(problem, speeds)
    eta = 0.1
    ax = axes[2]
    row = _fedbuff_curve(
        ax,
        problem,
        fj.fedbuff(eta, H, 5, speeds, staleness=0.0),
        4 * args.ticks,
        args.seeds,
        "C2",
        "FedBuff K=5, no weights",
    )
    fedlsa_limit = float(fj.theory.exact_mse(problem, fj.fedlsa(eta, H), 4000)[-1])
    bias_r = float(np.sum((theta_r - star) ** 2))
    mean = np.asarray(row["mean_theta"])
    report["speeds"] = dict(
        row,
        theta_r_squared_bias=bias_r,
        fedlsa_limit_mse=fedlsa_limit,
        distance_to_theta_r=float(np.linalg.norm(mean - theta_r)),
        distance_to_theta_star=float(np.linalg.norm(mean - star)),
    )
    ax.axhline(bias_r, color="C2", ls="--", lw=1, label=r"$|\theta_r - \theta^\star|^2$ (rate-weighted)")
    ax.axhline(fedlsa_limit, color="k", ls=":", lw=1, label="synchronous FedLSA's exact limit MSE")
    ax.set(yscale="log", xlabel="simulated wall-clock (ticks)", ylabel=r"$E|\theta - \theta^\star|^2$")
    ax.set_title(
        f"(c) mean job times 1..{N} ticks ($\\eta$={eta:g}): the limit moves to $\\theta_r$", fontsize=12
    )
    ax.legend(fontsize=9.5, loc="center right")
    print(
        f"speeds 1..{N}: FedBuff K=5 MSE {row['mse']:.4g} +- {row['sem']:.2g} by tick {row['ticks']:.0f}; "
        f"|theta_r - theta*|^2 = {bias_r:.4g}; |E theta - theta_r| = "
        f"{report['speeds']['distance_to_theta_r']:.4g} vs |E theta - theta*| = "
        f"{report['speeds']['distance_to_theta_star']:.4g}; "
        f"synchronous FedLSA's limit MSE {fedlsa_limit:.4g}"
    )
    return save_figure(fig, args.figures, "fedbuff.png", args.json, report)


if __name__ == "__main__":
    main()
