"""Delayed updates: FedLSA TD(0) with updates computed from stale iterates, Monte Carlo and exact.

Heterogeneous Garnet TD (generative, S = 10, d = 4, N = 10), float64, started at ``theta = 0``,
FedLSA with H = 5 local steps. Agent c's update of round t starts from ``theta_{t - tau_c}``
(``fj.delays``), per agent unless shared. Three panels:

1. MSE against rounds at eta = 1 (``--seeds`` seeds, mean +- 2 s.e., with ``exact_mse``): no
   delay, a fixed delay of 2 and of 6, delays uniform on {0..6} per agent and shared; the largest
   |MC - exact| in standard errors over the recorded rounds is printed.
2. The largest step size for which the exact mean recursion contracts
   (``fj.theory.engine.stable_step_size``) against tau_max, for a fixed delay tau_max and for
   delays uniform on {0..tau_max}: the stability budget is set by the maximal delay for a fixed
   delay and far less by it for spread delays (Adibi et al., "Stochastic approximation with delayed
   updates: finite-time rates under Markovian sampling", AISTATS 2024: rates in tau_max).
3. The exact MSE at round ``--rounds`` (eta = 1, the floor reached) against tau_max, fixed and
   uniform delays: what the delay costs once the transient is over.

    python benchmarks/delays.py [--seeds 2000] [--rounds 300] [--json out.json]   # about 2 min
"""

from __future__ import annotations

import jax
import matplotlib
import numpy as np
from _bench import exact_figure_args, mc_against_exact, save_figure

import fedsa_jax as fj
from fedsa_jax.theory.engine import stable_step_size

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

H = 5
ETA = 1.0
TAUS = (0, 1, 2, 4, 6, 8)


def main(argv=None):
    args, every = exact_figure_args(argv, __doc__.split("\n")[0], seeds=2000, rounds=300, records=50)
    problem = fj.problems.garnet(
        jax.random.key(0), num_agents=10, num_states=10, dim=4, heterogeneity="heterogeneous", dtype="float64"
    )
    T = args.rounds
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), dpi=110)
    report: dict = {"curves": [], "stable_step": {}, "final_mse": {}}

    runs = {
        "no delay": None,
        "fixed 2": fj.delays.fixed(2),
        "fixed 6": fj.delays.fixed(6),
        "uniform 0..6": fj.delays.uniform(6),
        "uniform 0..6 shared": fj.delays.uniform(6, shared=True),
    }
    ax = axes[0]
    for (name, law), color in zip(runs.items(), ("k", "C0", "C3", "C2", "C4")):
        row = mc_against_exact(ax, problem, fj.fedlsa(ETA, H, delays=law), T, args.seeds, every, color, name)
        report["curves"].append(row)
        print(
            f"{name:20s} final MSE {row['final_mse']:.4g} +- {row['final_sem']:.2g} (exact "
            f"{row['exact_final']:.4g}, max |z| {row['max_z']:.2f}, {row['diverged']} diverged), "
            f"{row['seconds']:.1f} s"
        )
    ax.set(yscale="log", xlabel="round t", ylabel=r"$E|\theta_t - \theta^\star|^2$")
    ax.set_title(f"FedLSA TD(0), H={H}, eta={ETA:g}, delayed updates: MC (bands) vs exact", fontsize=9)
    ax.legend(fontsize=7)

    for kind, make, color in (
        ("fixed", fj.delays.fixed, "C3"),
        ("uniform", fj.delays.uniform, "C2"),
    ):
        steps = [stable_step_size(problem, fj.fedlsa(0.1, H, delays=make(t))) for t in TAUS]
        report["stable_step"][kind] = steps
        axes[1].plot(
            TAUS,
            steps,
            "o-",
            color=color,
            label=f"{kind} delay" + (" tau_max" if kind == "fixed" else " on 0..tau_max"),
        )
        final = [float(fj.theory.exact_mse(problem, fj.fedlsa(ETA, H, delays=make(t)), T)[-1]) for t in TAUS]
        report["final_mse"][kind] = final
        axes[2].plot(TAUS, final, "o-", color=color, label=kind)
        print(
            f"{kind:8s} tau_max {TAUS}: largest stable eta {np.round(steps, 3).tolist()}, "
            f"MSE at round {T} {np.round(final, 4).tolist()}"
        )
    axes[1].set(xlabel=r"$\tau_{\max}$", ylabel=r"largest mean-stable $\eta$", yscale="log")
    axes[1].set_title("exact mean recursion: stability against the delay", fontsize=9)
    axes[1].legend(fontsize=7)
    axes[2].set(xlabel=r"$\tau_{\max}$", ylabel=f"exact MSE at round {T}")
    axes[2].set_title(f"eta = {ETA:g}: the floor against the delay", fontsize=9)
    axes[2].legend(fontsize=7)
    return save_figure(fig, args.figures, "delays.png", args.json, report)


if __name__ == "__main__":
    main()
