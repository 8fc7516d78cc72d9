"""Step-size schedules, Polyak-Ruppert averaging, server optimizers and Richardson-Romberg
extrapolation on the SCAFFLSA paper's heterogeneous Garnet problem, with exact theory.

Setting of Mangold et al. (2024), Sec. 6 (as ``reproduce_scafflsa.py``): federated TD(0) on
heterogeneous Garnet problems (30 states, 2 actions, branching 2, d=8, gamma=0.95),
generative sampling, eta=0.1, H=10 local steps, float32 simulations (theory in float64),
one simulation key for every run (common random numbers across algorithms).

  1. Rates, N in {10, 100}: constant step eta vs the decreasing step
     eta_k = eta0 / (1 + k / k0) (k = t H + h, the local-step count) vs constant step with
     Polyak-Ruppert averaging (burn-in 10 % of the rounds), FedLSA and SCAFFLSA, started at
     theta_star (the stationary regime, see below); exact MSE curves for every panel (at N=100
     by the factored recursion of fj.theory.exact_mse, under a minute a curve).
                                                              -> averaging_rates.png
  2. Server optimizers, N=10: FedAvgM (optax.sgd(1.0, momentum=0.9)) and FedAdam
     (optax.adam(lr), lr picked on a short pilot) against plain FedLSA: MSE from theta_0 = 0,
     and the limit bias measured by the averaged iterate started at theta_star.
                                                              -> averaging_server_optimizers.png
  3. Richardson-Romberg 2 theta_bar(eta) - theta_bar(2 eta) of averaged FedLSA, N=10: the bias it
     removes and the variance it costs.                       -> averaging_richardson.png

Why start at theta_star: the slowest mode of mean(A_bar) decays by eta H lambda_min = 0.0028 per
round (a 362-round time constant), so from theta_0 = 0 an average over rounds 300..3000 still
carries the initial error (exactly: its mean is 0.061 away from FedLSA's limit, 9x |bias|;
reported in the JSON as ``transient_from_zero``). Started at theta_star the runs measure
variance and bias, which is what the rates are about (as Figure 2 of ``reproduce_scafflsa.py``).

    python benchmarks/averaging.py            # about 13 min on 2 busy CPU cores (exact curves cached)
    python benchmarks/averaging.py --quick    # smoke run, well under a minute (writes to benchmarks/out/)
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from _bench import add_cpu_devices_option, use_cpu_devices  # noqa: E402
from reproduce_scafflsa import cached  # noqa: E402

import fedsa_jax as fj  # noqa: E402
from fedsa_jax._io import atomic_write, write_json  # noqa: E402
from fedsa_jax.plotting import MSE_LABEL  # noqa: E402

ETA, H = 0.1, 10
# Decreasing step eta_k = ETA0 / (1 + k / K0) ~ c / k with c = ETA0 K0 = 400 local steps. The O(1/k)
# MSE rate needs c lambda_min(mean A_bar) > 1/2 (else the rate is k^(-2 c lambda_min)); here
# lambda_min = 0.00276, so c lambda_min = 1.1. ETA0 = 0.5 (5x the constant step; still stable, the
# constant-step MSE at 0.5 is 0.1 at N=10) keeps the offset K0 = 80 rounds short against the horizon,
# so the last decade of rounds is in the 1/k regime (a slope of 1/(k + K0) over that decade is -0.91).
ETA0, K0 = 0.5, 800.0
BURN_IN = 0.1  # burn-in of the averages, a fraction of the rounds
FEDAVGM = dict(learning_rate=1.0, momentum=0.9)
ADAM_LRS = (1e-3, 3e-3, 1e-2, 3e-2)
COLORS = {
    "constant": "C0",
    "decreasing": "C1",
    "averaged": "C2",
    "FedLSA": "C0",
    "FedAvgM": "C1",
    "FedAdam": "C3",
}
ALGS = {"FedLSA": fj.fedlsa, "SCAFFLSA": fj.scafflsa}


def garnet(N):
    return fj.problems.garnet(jax.random.key(0), num_agents=N, heterogeneity="heterogeneous")


def decreasing():
    return fj.schedule(fj.optim.inverse_time, eta0=ETA0, k0=K0)


def fit_slope(t, y, lo, hi, shift=0.0):
    """Least-squares slope of log y against log(t + shift) on about 25 recorded rounds log-spaced in
    [lo, hi] (uniformly recorded rounds would weigh the end of the decade most)."""
    t = np.asarray(t, float)
    want = np.geomspace(lo, hi, 25)
    idx = np.unique([int(np.argmin(np.abs(t - w))) for w in want])
    idx = idx[(t[idx] + shift > 0) & (y[idx] > 0)]
    return float(np.polyfit(np.log(t[idx] + shift), np.log(y[idx]), 1)[0])


def norm_with_sem(x, sem):
    """``|x|`` and its standard error (delta method) for a vector of independent estimates."""
    n = float(np.linalg.norm(x))
    return n, float(np.sqrt(np.sum((x / max(n, 1e-300)) ** 2 * sem**2)))


def mean_vs(res, target, i=-1):
    """The mean iterate at recorded round ``i`` against ``target``: per-coordinate z-scores and their sum
    of squares (chi^2 with d degrees of freedom when the mean is the target)."""
    z = (res.theta_mean[i] - target) / res.theta_sem[i]
    return {"max_abs_z": float(np.max(np.abs(z))), "chi2": float(np.sum(z**2)), "dof": int(z.size)}


def trace_cov(res, i=-1):
    """Trace of the covariance of the reported iterate across seeds, ``S sum(theta_sem^2)``."""
    return float(res.num_seeds * np.sum(res.theta_sem[i] ** 2))


def curve(ax, rounds, mean, sem, label, color, ls="-"):
    """Mean +- 2 s.e. against rounds >= 1 (log axes)."""
    keep = rounds >= 1
    r, m, s = rounds[keep], mean[keep], sem[keep]
    ax.plot(r, m, color=color, lw=1.5, ls=ls, label=label)
    ax.fill_between(r, np.maximum(m - 2 * s, m * 1e-3), m + 2 * s, color=color, alpha=0.2, lw=0)


def exact_line(ax, values, label=None):
    t = np.arange(len(values))
    ax.plot(t[1:], values[1:], color="k", ls=":", lw=1.3, zorder=3, label=label)


def finish(ax, title, legend=True):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("communication round t", fontsize=9)
    ax.set_ylabel(MSE_LABEL, fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.tick_params(labelsize=8)
    if legend:
        ax.legend(fontsize=7.5, title=r"mean $\pm$ 2 s.e.; dotted: exact", title_fontsize=7.5)


def save(fig, folder, name):
    fig.tight_layout()
    atomic_write(folder / name, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 200 rounds, 32 seeds, N=10 only, output to benchmarks/out/averaging-quick",
    )
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--seeds", type=int, default=400, help="seeds for N=10")
    ap.add_argument("--seeds-large", type=int, default=200, help="seeds for N=100")
    ap.add_argument("--records", type=int, default=600, help="recorded rounds per curve (about)")
    ap.add_argument(
        "--no-exact-averaged",
        action="store_true",
        help="skip the exact MSE curves of the averaged iterates (the costliest exact curves)",
    )
    ap.add_argument("--json", type=Path, default=None, help="default benchmarks/results/averaging.json")
    ap.add_argument("--figures", type=Path, default=None, help="default benchmarks/figures")
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path("benchmarks/out/averaging"),
        help="exact curves are cached here (file names carry their parameters)",
    )
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    use_cpu_devices(args.cpu_devices)
    if args.quick:
        args.rounds, args.seeds, args.seeds_large, args.records = 200, 32, 16, 100
        quick_dir = Path("benchmarks/out/averaging-quick")
        args.json = args.json or quick_dir / "averaging.json"
        args.figures = args.figures or quick_dir
        args.cache = quick_dir / "cache"
    args.json = args.json or Path("benchmarks/results/averaging.json")
    args.figures = args.figures or Path("benchmarks/figures")
    for folder in (args.figures, args.cache, args.json.parent):
        folder.mkdir(parents=True, exist_ok=True)

    T = args.rounds
    b = max(1, round(BURN_IN * T))
    every = max(1, T // args.records)
    key = jax.random.key(2024)
    seeds = {10: args.seeds, 100: args.seeds_large}
    timings = {}
    t_start = time.perf_counter()

    def run(problem, alg, num_seeds, theta0=None, metrics=None, record_every=None):
        t0 = time.perf_counter()
        res = fj.simulate(
            key,
            problem,
            alg,
            T,
            num_seeds,
            theta0=theta0,
            record_every=record_every or every,
            metrics=metrics,
            progress=False,
        )
        seconds = time.perf_counter() - t0
        timings["simulate"] = timings.get("simulate", 0.0) + seconds
        timings.setdefault("runs", []).append(
            f"{alg.name} N={problem.A_bar.shape[0]} seeds={num_seeds}: {seconds:.1f} s"
        )
        print(timings["runs"][-1], flush=True)
        return res

    def exact(tag, fn):
        t0 = time.perf_counter()
        out = cached(args.cache / f"{tag}_eta{ETA}_H{H}_T{T}_b{b}.npz", lambda: {"v": fn()})["v"]
        timings["exact"] = timings.get("exact", 0.0) + time.perf_counter() - t0
        return out

    agents = (10,) if args.quick else (10, 100)  # the quick run compiles fewer kernels
    problems = {N: garnet(N) for N in agents}
    bias = {N: fj.theory.fedlsa_bias(problems[N], ETA, H) for N in agents}
    stars = {N: np.asarray(problems[N].theta_star, np.float64) for N in agents}
    lam_min = float(np.min(np.linalg.eigvals(np.asarray(problems[10].A_bar, np.float64).mean(0)).real))
    report = {
        "config": {
            "problem": "garnet heterogeneous, S=30, 2 actions, branching 2, d=8, gamma=0.95, generative, "
            "problem key 0",
            "eta": ETA,
            "H": H,
            "rounds": T,
            "burn_in": b,
            "seeds": {str(k): v for k, v in seeds.items()},
            "record_every": every,
            "dtype": "float32",
            "decreasing_step": {"eta0": ETA0, "k0_local_steps": K0, "c_lambda_min": ETA0 * K0 * lam_min},
            "lambda_min_mean_A_bar": lam_min,
            "rounds_time_constant": 1.0 / (ETA * H * lam_min),
            "fedavgm": FEDAVGM,
            "theta0": "theta_star (parts 1, 3 and the bias runs of 2); 0 (MSE runs of 2)",
            "quick": args.quick,
        },
        "fedlsa_squared_bias": {str(N): float(bias[N] @ bias[N]) for N in agents},
    }

    # ---------------- 1. constant vs decreasing step vs averaging ----------------
    fig, axes = plt.subplots(2, len(agents), figsize=(6 * len(agents), 8.4), dpi=110, squeeze=False)
    part1, runs1 = [], {}
    for j, N in enumerate(agents):
        P, star = problems[N], problems[N].theta_star
        for i, (name, make) in enumerate(ALGS.items()):
            avg_alg = fj.averaged(make(ETA, H), burn_in=b)
            dec_alg = make(decreasing(), H)
            res_avg = run(P, avg_alg, seeds[N], star, metrics=["last_iterate_mse"])
            res_dec = run(P, dec_alg, seeds[N], star)
            runs1[name, N] = res_avg
            last = res_avg.metrics["last_iterate_mse"]
            series = {
                "constant": (last.mean, last.sem),
                "decreasing": (res_dec.mse_mean, res_dec.mse_sem),
                "averaged": (res_avg.mse_mean, res_avg.mse_sem),
            }
            ex = {}
            # N=100: the agents are independent given the server's state and their control variates
            # within a round (the factored recursion of fj.theory.exact_mse, under a minute a curve)
            n = "" if N == 10 else f"_N{N}"
            constant = make(ETA, H)
            ex["constant"] = exact(f"mse_{name}{n}_const", lambda: fj.theory.exact_mse(P, constant, T, star))
            ex["decreasing"] = exact(
                f"mse_{name}{n}_dec_eta0{ETA0}_k0{K0}", lambda: fj.theory.exact_mse(P, dec_alg, T, star)
            )
            if not args.no_exact_averaged:
                ex["averaged"] = exact(f"mse_{name}{n}_avg", lambda: fj.theory.exact_mse(P, avg_alg, T, star))
            ax = axes[i, j]
            labels = {
                "constant": rf"constant $\eta$={ETA}",
                "decreasing": rf"$\eta_k$={ETA0}/(1+k/{K0:g})",
                "averaged": rf"constant $\eta$={ETA}, averaged after t={b}",
            }
            rows = {}
            for kind, (mean, sem) in series.items():
                curve(ax, res_avg.rounds, mean, sem, labels[kind], COLORS[kind])
                shift = {"averaged": -b, "decreasing": K0 / H}.get(kind, 0.0)
                lo = T / 10 if kind != "averaged" else b + (T - b) / 10
                row = {
                    "final_mse": float(mean[-1]),
                    "final_mse_sem": float(sem[-1]),
                    "slope_last_decade": fit_slope(res_avg.rounds, mean, T / 10, T),
                }
                if shift:
                    row["slope_shifted"] = fit_slope(res_avg.rounds, mean, lo, T, shift)
                    row["shift"] = shift
                if kind in ex:
                    e = ex[kind]
                    row["exact_final_mse"] = float(e[-1])
                    row["z_final_vs_exact"] = float((mean[-1] - e[-1]) / sem[-1])
                    row["slope_last_decade_exact"] = fit_slope(np.arange(T + 1), e, T / 10, T)
                    if shift:
                        row["slope_shifted_exact"] = fit_slope(np.arange(T + 1), e, lo, T, shift)
                    exact_line(ax, e, "exact" if kind == "constant" else None)
                rows[kind] = row
            level = float(bias[N] @ bias[N])
            ax.axhline(level, color="C3", ls="--", lw=1.2, label=r"FedLSA $\|$bias$\|^2$ (fedlsa_bias)")
            finish(ax, f"{name}, heterogeneous Garnet, N={N}, H={H}, {seeds[N]} seeds", legend=True)
            part1.append({"algorithm": name, "N": N, **rows})
    fig.suptitle(f"From $\\theta_0=\\theta_\\star$, T={T}: constant, 1/k, averaged steps", fontsize=11)
    save(fig, args.figures, "averaging_rates.png")
    report["part1_rates"] = part1

    # speed-up and FedLSA's stall
    if 100 in agents:
        s10, s100 = runs1["SCAFFLSA", 10], runs1["SCAFFLSA", 100]
        ratio = s100.mse_mean[-1] / s10.mse_mean[-1]
        ratio_sem = ratio * math.hypot(
            s100.mse_sem[-1] / s100.mse_mean[-1], s10.mse_sem[-1] / s10.mse_mean[-1]
        )
        report["speedup_averaged_scafflsa"] = {
            "final_mse_ratio_N100_over_N10": float(ratio),
            "ratio_sem": float(ratio_sem),
            "trace_cov_ratio_N100_over_N10": trace_cov(s100) / trace_cov(s10),
            "linear_speedup_predicts": 0.1,
        }
    stall = {}
    for N in agents:
        res = runs1["FedLSA", N]
        dist, dist_sem = norm_with_sem(res.theta_mean[-1] - stars[N], res.theta_sem[-1])
        row = {
            "final_mse": float(res.mse_mean[-1]),
            "final_mse_sem": float(res.mse_sem[-1]),
            "squared_bias": float(bias[N] @ bias[N]),
            "final_mse_over_squared_bias": float(res.mse_mean[-1] / (bias[N] @ bias[N])),
            "trace_cov": trace_cov(res),
            "mean_distance_to_theta_star": dist,
            "mean_distance_sem": dist_sem,
            "bias_norm": float(np.linalg.norm(bias[N])),
            "mean_vs_theta_star_plus_bias": mean_vs(res, stars[N] + bias[N]),
            "mean_vs_theta_star": mean_vs(res, stars[N]),
        }
        if N == 10:
            m = exact(
                "mean_FedLSA_avg",
                lambda: fj.theory.exact_mean(
                    problems[10], fj.averaged(fj.fedlsa(ETA, H), burn_in=b), T, stars[10]
                ),
            )
            row["exact_mean_distance_to_limit"] = float(np.linalg.norm(m[-1] - stars[10] - bias[10]))
            row["mean_vs_exact_mean"] = mean_vs(res, m[-1])
        stall[str(N)] = row
    report["averaged_fedlsa_stall"] = stall
    # from theta_0 = 0 the average keeps the initial error: exact, plain iterates averaged in numpy
    m0 = exact("mean_FedLSA_from0", lambda: fj.theory.exact_mean(problems[10], fj.fedlsa(ETA, H), T))
    report["transient_from_zero"] = {
        "what": "exact E[theta_bar_T] of averaged FedLSA (burn-in b) from theta_0 = 0, N=10",
        "distance_to_theta_star_plus_bias": float(np.linalg.norm(m0[b + 1 :].mean(0) - stars[10] - bias[10])),
        "last_iterate_distance_to_theta_star_plus_bias": float(np.linalg.norm(m0[-1] - stars[10] - bias[10])),
        "bias_norm": float(np.linalg.norm(bias[10])),
    }

    # ---------------- 2. server optimizers (N = 10) ----------------
    P, star = problems[10], problems[10].theta_star
    zero = np.zeros_like(np.asarray(star))
    # Every optimizer runs wrapped in fj.averaged, so one kernel gives the last iterate from theta_0 = 0
    # (metric last_iterate_mse) and the averaged iterate from theta_star; hyperparameters are traced
    # (fj.optimizer), so the pilot's learning rates share one kernel.
    adam = lambda lr: fj.optimizer(optax.adam, learning_rate=lr)  # noqa: E731
    pilot = {}
    for lr in ADAM_LRS:  # FedAdam's lr: the smallest final MSE of the last iterate from theta_0 = 0
        res = run(
            P,
            fj.averaged(fj.fedlsa(ETA, H, server_optimizer=adam(lr)), burn_in=b),
            min(64, args.seeds),
            zero,
            metrics=["last_iterate_mse"],
        )
        pilot[lr] = float(res.metrics["last_iterate_mse"].mean[-1])
    lr_adam = min(pilot, key=pilot.get)
    opts = {"FedLSA": None, "FedAvgM": fj.optimizer(optax.sgd, **FEDAVGM), "FedAdam": adam(lr_adam)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), dpi=110)
    part2 = {
        "adam_pilot_final_mse": {str(k): v for k, v in pilot.items()},
        "adam_lr": lr_adam,
        "optimizers": {},
    }
    level = float(bias[10] @ bias[10])
    for name, opt in opts.items():
        alg = fj.fedlsa(ETA, H, server_optimizer=opt)
        avg_alg = fj.averaged(alg, burn_in=b)
        res0 = run(P, avg_alg, seeds[10], zero, metrics=["last_iterate_mse"])
        last0 = res0.metrics["last_iterate_mse"]
        res_avg = (
            runs1["FedLSA", 10]
            if opt is None
            else run(P, avg_alg, seeds[10], star, metrics=["last_iterate_mse"])
        )
        label = (
            name
            if opt is None
            else f"{name} ({'sgd(1.0, momentum=0.9)' if name == 'FedAvgM' else f'adam({lr_adam:g})'})"
        )
        curve(axes[0], res0.rounds, last0.mean, last0.sem, label, COLORS[name])
        curve(axes[1], res_avg.rounds, res_avg.mse_mean, res_avg.mse_sem, label, COLORS[name])
        dist, dist_sem = norm_with_sem(res_avg.theta_mean[-1] - stars[10], res_avg.theta_sem[-1])
        row = {
            "final_mse_from_zero": float(last0.mean[-1]),
            "final_mse_from_zero_sem": float(last0.sem[-1]),
            "rounds_to_reach_2x_final_mse_from_zero": int(
                res0.rounds[np.argmax(last0.mean <= 2 * last0.mean[-1])]
            ),
            "last_iterate_final_mse_from_star": float(res_avg.metrics["last_iterate_mse"].mean[-1]),
            "averaged_final_mse_from_star": float(res_avg.mse_mean[-1]),
            "limit_distance_to_theta_star": dist,
            "limit_distance_sem": dist_sem,
            "bias_norm": float(np.linalg.norm(bias[10])),
            "mean_vs_theta_star_plus_bias": mean_vs(res_avg, stars[10] + bias[10]),
            "mean_vs_theta_star": mean_vs(res_avg, stars[10]),
            "trace_cov_averaged": trace_cov(res_avg),
        }
        if name != "FedAdam":  # affine: exact theory
            e0 = exact(f"mse_{name}_from0", lambda: fj.theory.exact_mse(P, alg, T))
            exact_line(axes[0], e0, "exact" if name == "FedLSA" else None)
            row["exact_final_mse_from_zero"] = float(e0[-1])
            row["z_final_from_zero_vs_exact"] = float((last0.mean[-1] - e0[-1]) / last0.sem[-1])
            if opt is not None:
                m = exact(f"mean_{name}_avg", lambda: fj.theory.exact_mean(P, avg_alg, T, star))
                row["exact_mean_distance_to_theta_star"] = float(np.linalg.norm(m[-1] - stars[10]))
                row["mean_vs_exact_mean"] = mean_vs(res_avg, m[-1])
        part2["optimizers"][name] = row
    for ax in axes:
        ax.axhline(level, color="C2", ls="--", lw=1.2, label=r"FedLSA $\|$bias$\|^2$")
    finish(axes[0], rf"last iterate from $\theta_0=0$, N=10, H={H}, $\eta$={ETA}, {seeds[10]} seeds")
    finish(axes[1], rf"averaged iterate (burn-in {b}) from $\theta_0=\theta_\star$, N=10, {seeds[10]} seeds")
    fig.suptitle("Server optimizers on FedLSA's pseudo-gradient (heterogeneous Garnet)", fontsize=11)
    save(fig, args.figures, "averaging_server_optimizers.png")
    report["part2_server_optimizers"] = part2

    # ---------------- 3. Richardson-Romberg (N = 10) ----------------
    avg_alg = fj.averaged(fj.fedlsa(ETA, H), burn_in=b)
    rr_alg = fj.richardson(avg_alg)
    rr = run(P, rr_alg, seeds[10], star)
    avg = runs1["FedLSA", 10]
    rr_exact = exact("mean_rr_avg", lambda: fj.theory.exact_mean(P, rr_alg, T, star))
    avg_exact = exact("mean_FedLSA_avg", lambda: fj.theory.exact_mean(P, avg_alg, T, star))
    rr_limit = 2 * bias[10] - fj.theory.fedlsa_bias(P, 2 * ETA, H)
    dist, dist_sem = norm_with_sem(rr.theta_mean[-1] - stars[10], rr.theta_sem[-1])
    adist, adist_sem = norm_with_sem(avg.theta_mean[-1] - stars[10], avg.theta_sem[-1])
    report["part3_richardson"] = {
        "bias_norm": float(np.linalg.norm(bias[10])),
        "rr_limit_bias_norm_exact": float(np.linalg.norm(rr_limit)),
        "fraction_of_bias_removed_in_the_limit": float(
            1 - np.linalg.norm(rr_limit) / np.linalg.norm(bias[10])
        ),
        "rr_distance_measured": dist,
        "rr_distance_sem": dist_sem,
        "rr_distance_exact_at_T": float(np.linalg.norm(rr_exact[-1] - stars[10])),
        "rr_mean_vs_exact_mean": mean_vs(rr, rr_exact[-1]),
        "rr_mean_vs_theta_star": mean_vs(rr, stars[10]),
        "averaged_distance_measured": adist,
        "averaged_distance_sem": adist_sem,
        "averaged_distance_exact_at_T": float(np.linalg.norm(avg_exact[-1] - stars[10])),
        "trace_cov_rr": trace_cov(rr),
        "trace_cov_averaged": trace_cov(avg),
        "variance_cost_ratio": trace_cov(rr) / trace_cov(avg),
        "final_mse_rr": float(rr.mse_mean[-1]),
        "final_mse_rr_sem": float(rr.mse_sem[-1]),
        "final_mse_averaged": float(avg.mse_mean[-1]),
        "final_mse_averaged_sem": float(avg.mse_sem[-1]),
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), dpi=110)
    curve(axes[0], avg.rounds, avg.mse_mean, avg.mse_sem, rf"averaged FedLSA, $\eta$={ETA}", "C0")
    curve(
        axes[0], rr.rounds, rr.mse_mean, rr.mse_sem, r"Richardson 2$\bar\theta(\eta)-\bar\theta(2\eta)$", "C1"
    )
    for ax in axes:
        ax.axhline(level, color="C3", ls="--", lw=1.2, label=r"FedLSA $\|$bias$\|^2$")
        ax.axhline(
            float(rr_limit @ rr_limit),
            color="C4",
            ls="--",
            lw=1.2,
            label=r"Richardson's limit $\|$bias$\|^2$",
        )
    finish(axes[0], f"MSE, N=10, H={H}, averaged after t={b}, {seeds[10]} seeds")
    t = np.arange(T + 1)
    for res, e, color, label in (
        (avg, avg_exact, "C0", "averaged FedLSA"),
        (rr, rr_exact, "C1", "Richardson"),
    ):
        sq = np.sum((res.theta_mean - stars[10]) ** 2, axis=1)
        floor = np.sum(res.theta_sem**2, axis=1)  # E|mean - E theta|^2 = tr Cov / S: the estimate's noise
        keep = res.rounds >= 1
        axes[1].plot(res.rounds[keep], sq[keep], color=color, lw=1.5, label=f"{label}: measured")
        axes[1].plot(
            res.rounds[keep],
            floor[keep],
            color=color,
            lw=0.9,
            ls="-.",
            label=f"{label}: noise level tr Cov / S",
        )
        axes[1].plot(
            t[1:],
            np.sum((e[1:] - stars[10]) ** 2, axis=1),
            color=color,
            ls=":",
            lw=1.5,
            label=f"{label}: exact (exact_mean)",
        )
    finish(axes[1], r"squared bias $\|\mathbb{E}\,\bar\theta_t - \theta_\star\|^2$, N=10", legend=False)
    axes[1].set_ylabel(r"$\|$mean over seeds $- \theta_\star\|^2$", fontsize=9)
    axes[1].legend(fontsize=7.5)
    fig.suptitle(
        r"Richardson-Romberg extrapolation of averaged FedLSA from $\theta_0=\theta_\star$ "
        "(common random numbers)",
        fontsize=11,
    )
    save(fig, args.figures, "averaging_richardson.png")

    timings["total"] = time.perf_counter() - t_start
    report["wall_seconds"] = timings
    report["versions"] = avg.config.get("versions")
    write_json(args.json, report)
    print(
        f"wrote {args.json} and figures in {args.figures}; wall time {timings['total']:.0f} s "
        f"(simulate {timings['simulate']:.0f} s, exact {timings.get('exact', 0.0):.0f} s)"
    )
    return report


if __name__ == "__main__":
    main()
