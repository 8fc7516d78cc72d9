"""Command line: ``fedsa-jax run`` simulates, writes result files and a figure.

    fedsa-jax run                      # heterogeneous Garnet, FedLSA vs SCAFFLSA
    fedsa-jax run --problem gaussian --algorithms fedlsa --step-size 0.1 --local-steps 10
    fedsa-jax sweep CONFIG.toml        # a grid of configurations, resumable

A sweep file has a ``[run]`` table (seeds, seed, rounds or total_local_steps,
record_every or records, dtype, out) and a ``[grid]`` table whose keys are the
``run`` options' names with underscores (problem, agents, heterogeneity, states,
dim, sampling, noise_A, noise_b, problem_seed, algorithm, step_size,
local_steps, skip, quantizer, bits, range, levels, k, success_prob,
aggregation); a list makes that option an axis of the grid::

    [run]
    seeds = 10
    total_local_steps = 500000     # rounds = total_local_steps / local_steps
    records = 100
    out = "grid_out"

    [grid]
    problem = "garnet"
    agents = [10, 100]
    heterogeneity = ["homogeneous", "heterogeneous"]
    algorithm = ["fedlsa", "scafflsa"]
    step_size = [0.01, 0.1]
    local_steps = [1, 10, 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROBLEMS = ("garnet", "gaussian", "qfedtd-mdp")
ALGORITHMS = ("fedlsa", "scafflsa", "qfedtd")
QUANTIZERS = ("none", "stochastic-uniform", "qsgd", "rand-k", "natural")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _algorithms(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ALGORITHMS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list from {', '.join(ALGORITHMS)}, got {text!r}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsa-jax",
        description="Monte Carlo simulation of federated linear stochastic approximation in JAX.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="simulate algorithms on a problem; write result files and an MSE figure",
        description="Simulate FedLSA / SCAFFLSA on a federated problem over many independent seeds. "
        "Writes result_<algorithm>.npz (arrays + config + versions), summary.json and mse.png "
        "into --out. Defaults: heterogeneous Garnet (N=10), FedLSA vs SCAFFLSA, eta=0.05, H=1000, "
        "60 rounds, 256 seeds (under a minute on 2 CPU cores).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = run.add_argument_group("problem")
    g.add_argument("--problem", choices=PROBLEMS, default="garnet",
                   help="garnet: Garnet MRPs (SCAFFLSA experiments); gaussian: random Gaussian LSA; "
                   "qfedtd-mdp: the QFedTD experiments' 20-state MDP")
    g.add_argument("--agents", "-N", type=_positive_int, default=10, help="number of agents N")
    g.add_argument("--heterogeneity", default="heterogeneous",
                   help="garnet: 'homogeneous', 'heterogeneous' or a level in [0,1]; gaussian: a level in [0,1]")
    g.add_argument("--states", type=_positive_int, default=None,
                   help="number of states S (garnet default 30, qfedtd-mdp default 20)")
    g.add_argument("--dim", "-d", type=_positive_int, default=None,
                   help="dimension d (garnet 8, qfedtd-mdp 10, gaussian 5)")
    g.add_argument("--sampling", choices=("generative", "markov"), default=None,
                   help="TD observation model (garnet default generative, qfedtd-mdp default markov)")
    g.add_argument("--noise-A", type=float, default=0.1, help="gaussian: std of A(Z) entries")
    g.add_argument("--noise-b", type=float, default=0.5, help="gaussian: std of b(Z) entries")
    g.add_argument("--problem-seed", type=int, default=0, help="PRNG seed of the random problem")
    a = run.add_argument_group("algorithms")
    a.add_argument("--algorithms", type=_algorithms, default=["fedlsa", "scafflsa"],
                   help="comma-separated from fedlsa,scafflsa,qfedtd (qfedtd: one local step per round)")
    a.add_argument("--step-size", "--eta", type=float, default=0.05, help="step size eta")
    a.add_argument("--local-steps", "-H", type=_positive_int, default=1000, help="local steps H per round")
    a.add_argument("--skip", type=_positive_int, default=1,
                   help="keep one observation out of SKIP (Markovian sampling)")
    c = run.add_argument_group("uplink channel (every algorithm)")
    c.add_argument("--quantizer", choices=QUANTIZERS, default="none",
                   help="quantizer of the uplink message (FedLSA/SCAFFLSA: the model difference; QFedTD: "
                   "the TD direction)")
    c.add_argument("--bits", type=_positive_int, default=4, help="stochastic-uniform: bits per coordinate")
    c.add_argument("--range", default="maxabs",
                   help="stochastic-uniform: 'maxabs' (unbiased) or a fixed R > 0 (clipped, biased)")
    c.add_argument("--levels", type=_positive_int, default=4, help="qsgd: number of levels s")
    c.add_argument("--k", type=_positive_int, default=1, help="rand-k: coordinates kept")
    c.add_argument("--success-prob", "-p", type=float, default=1.0,
                   help="probability that an uplink message is delivered (Bernoulli erasures)")
    c.add_argument("--aggregation", choices=("divide_by_n", "divide_by_received"), default="divide_by_n",
                   help="server rule: sum of delivered messages over N, or over the number received")
    s = run.add_argument_group("simulation")
    s.add_argument("--rounds", "-T", type=_positive_int, default=60, help="communication rounds T")
    s.add_argument("--seeds", type=_positive_int, default=256, help="independent runs")
    s.add_argument("--seed", type=int, default=1, help="PRNG seed of the runs")
    s.add_argument("--record-every", type=_positive_int, default=1, help="record statistics every K rounds")
    s.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="floating point type")
    s.add_argument("--out", type=Path, default=Path("fedsa_run"), help="output directory")
    s.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="write an atomic checkpoint here after each chunk; rerunning the same command resumes "
                   "(one subfolder per algorithm)")
    s.add_argument("--chunk-rounds", type=_positive_int, default=None,
                   help="rounds per kernel call (progress and checkpoint granularity; default: automatic)")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on a terminal only)")
    s.add_argument("--x-axis", choices=("rounds", "communications", "samples", "bits", "bits_sent"),
                   default="rounds", help="figure's x axis: communication rounds, uplink messages, observations "
                   "drawn, uplink bits delivered ('bits') or sent")
    s.add_argument("--band", choices=("sem", "quantiles"), default="sem",
                   help="figure's band: mean +- 2 standard errors, or 5-95%% / 25-75%% quantiles over seeds")
    s.add_argument("--exact", action="store_true",
                   help="also compute the exact MSE curve (fj.theory.exact_mse; Gaussian or generative TD "
                   "problems, small N d) and draw it dotted")
    s.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    sw = sub.add_parser(
        "sweep",
        help="run a grid of configurations from a TOML file; finished ones are skipped on rerun",
        description="Run every configuration of a TOML grid (see the module docstring: [run] and [grid] "
        "tables). Step sizes and success probabilities of otherwise identical configurations run side "
        "by side in one compiled kernel. Each finished configuration is saved to OUT/<name>.npz at once; "
        "OUT/sweep.json indexes them; rerunning skips what is done.",
    )
    sw.add_argument("config", type=Path, help="the sweep's TOML file")
    sw.add_argument("--out", type=Path, default=None, help="output directory (overrides [run] out)")
    sw.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars (default: on a terminal only)")
    return parser


def _make_problem(args, key):
    import fedsa_jax as fj

    dtype = args.dtype
    if args.problem == "garnet":
        het = args.heterogeneity
        het = het if het in ("homogeneous", "heterogeneous") else float(het)
        return fj.problems.garnet(
            key, num_agents=args.agents, heterogeneity=het, num_states=args.states or 30,
            dim=args.dim or 8, sampling=args.sampling or "generative", dtype=dtype,
        )
    if args.problem == "qfedtd-mdp":
        return fj.problems.qfedtd_mdp(
            key, num_agents=args.agents, num_states=args.states or 20, dim=args.dim or 10,
            sampling=args.sampling or "markov", dtype=dtype,
        )
    if args.problem != "gaussian":
        raise ValueError(f"problem={args.problem!r} is invalid: expected one of {', '.join(PROBLEMS)}")
    het = 1.0 if args.heterogeneity == "heterogeneous" else (
        0.0 if args.heterogeneity == "homogeneous" else float(args.heterogeneity))
    return fj.problems.random_gaussian_lsa(
        key, num_agents=args.agents, dim=args.dim or 5, heterogeneity=het,
        noise_A=args.noise_A, noise_b=args.noise_b, dtype=dtype,
    )


def _make_quantizer(args):
    import fedsa_jax as fj

    if args.quantizer == "none":
        return None
    if args.quantizer == "stochastic-uniform":
        rng = args.range if args.range == "maxabs" else float(args.range)
        return fj.channel.stochastic_uniform(args.bits, range=rng)
    if args.quantizer == "qsgd":
        return fj.channel.qsgd(args.levels)
    if args.quantizer == "rand-k":
        return fj.channel.rand_k(args.k)
    if args.quantizer == "natural":
        return fj.channel.natural()
    raise ValueError(f"quantizer={args.quantizer!r} is invalid: expected one of {', '.join(QUANTIZERS)}")


def _make_algorithm(name: str, args):
    import fedsa_jax as fj

    channel = dict(quantizer=_make_quantizer(args), success_prob=args.success_prob,
                   aggregation=args.aggregation)
    if name == "qfedtd":
        return fj.qfedtd(args.step_size, **channel)
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is invalid: expected one of {', '.join(ALGORITHMS)}")
    return getattr(fj, name)(args.step_size, args.local_steps, skip=args.skip, **channel)


def cmd_run(args) -> int:
    import jax

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    import fedsa_jax as fj
    from fedsa_jax._io import atomic_write

    try:
        problem = _make_problem(args, jax.random.key(args.problem_seed))
        algs = [_make_algorithm(name, args) for name in args.algorithms]
    except ValueError as err:
        print(f"fedsa-jax: error: {err}", file=sys.stderr)
        return 2
    if args.quantizer != "none" or args.success_prob != 1.0:
        print(f"uplink channel: {json.dumps(algs[0].config.channel.describe())}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"problem: {json.dumps(problem.describe())}")
    results, summary = {}, {"problem": problem.describe(), "runs": {}}
    for alg in algs:
        t0 = time.perf_counter()
        try:
            res = fj.simulate(
                jax.random.key(args.seed), problem, alg, args.rounds, args.seeds,
                record_every=min(args.record_every, args.rounds), chunk_rounds=args.chunk_rounds,
                checkpoint_dir=None if args.checkpoint_dir is None else args.checkpoint_dir / alg.name,
                progress=args.progress, quantiles=True if args.band == "quantiles" else None,
            )
        except ValueError as err:
            print(f"fedsa-jax: error: {err}", file=sys.stderr)
            return 2
        seconds = time.perf_counter() - t0
        path = out / f"result_{alg.name}.npz"
        res.save(path)
        res.to_csv(out / f"result_{alg.name}.csv")
        results[alg.name] = res
        steps = args.seeds * args.rounds * problem.num_agents * alg.config.num_local_steps
        summary["runs"][alg.name] = {
            "file": path.name,
            "final_mse": float(res.mse_mean[-1]),
            "final_mse_sem": float(res.mse_sem[-1]),
            "num_diverged": int(res.num_diverged[-1]),
            "bits_sent": float(res.bits_sent[-1]),
            "bits_delivered": float(res.bits_delivered[-1]),
            "seconds": seconds,
            "agent_steps_per_s": steps / seconds,
            "config": res.config["algorithm"],
        }
        print(f"{alg.name:9s} final MSE {res.mse_mean[-1]:.4g} +- {res.mse_sem[-1]:.2g} (s.e.), "
              f"{int(res.num_diverged[-1])} diverged, {seconds:.1f} s ({steps / seconds:.3g} agent-steps/s)"
              f" -> {path}")
    lines = {}
    if "fedlsa" in args.algorithms:
        bias = fj.theory.fedlsa_bias(problem, args.step_size, args.local_steps)
        level = float(np.sum(bias**2))
        summary["fedlsa_predicted_squared_bias"] = level
        lines[r"FedLSA predicted $\|\mathrm{bias}\|^2$"] = level
        print(f"FedLSA predicted squared bias |theta_inf - theta_star|^2 = {level:.4g}")
    exact = {}
    if args.exact:
        for alg in algs:
            try:
                exact[alg.name] = fj.theory.exact_mse(problem, alg, args.rounds)
            except ValueError as err:
                print(f"fedsa-jax: no exact curve for {alg.name}: {err}", file=sys.stderr)
                continue
            summary["runs"][alg.name]["exact_final_mse"] = float(exact[alg.name][-1])
            print(f"{alg.name:9s} exact final MSE {exact[alg.name][-1]:.4g}")
    if not args.no_plot:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        from fedsa_jax.plotting import plot_mse

        title = f"{args.problem}, N={problem.num_agents}, d={problem.dim}, " + rf"$\eta$={args.step_size:g}"
        if any(alg.name != "qfedtd" for alg in algs):
            title += f", H={args.local_steps}"
        if args.quantizer != "none":
            title += f", {args.quantizer}"
            title += f" {args.bits} bits" if args.quantizer == "stochastic-uniform" else ""
        if args.success_prob != 1.0:
            title += f", p={args.success_prob:g}"
        x = "bits_delivered" if args.x_axis == "bits" else args.x_axis
        fig = plot_mse(results, reference_lines=lines, title=title, x=x, band=args.band, theory=exact)

        atomic_write(out / "mse.png", lambda f: fig.savefig(f, format="png"))
        print(f"figure -> {out / 'mse.png'}")
    atomic_write(out / "summary.json", lambda f: f.write(json.dumps(summary, indent=2)), mode="w")
    return 0


RUN_KEYS = {"seeds": 64, "seed": 1, "rounds": None, "total_local_steps": None, "record_every": None,
            "records": None, "dtype": "float32", "out": "fedsa_sweep"}


def _sweep_spec(path: Path):
    """Parse and check a sweep file: (run options, grid axes)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    try:
        spec = tomllib.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"config={str(path)!r} is invalid: {err}") from None
    unknown = set(spec) - {"run", "grid"}
    if unknown or "grid" not in spec:
        raise ValueError(f"config={str(path)!r} is invalid: expected tables [run] and [grid], "
                         f"got {sorted(spec)}")
    run = {**RUN_KEYS, **spec.get("run", {})}
    bad = set(run) - set(RUN_KEYS)
    if bad:
        raise ValueError(f"run.{sorted(bad)[0]} is invalid: expected one of {', '.join(sorted(RUN_KEYS))}")
    if (run["rounds"] is None) == (run["total_local_steps"] is None):
        raise ValueError("run.rounds is invalid: give exactly one of rounds and total_local_steps")
    defaults = vars(build_parser().parse_args(["run"]))
    allowed = set(defaults) - {"command", "algorithms", "rounds", "seeds", "seed", "record_every", "dtype", "out",
                               "no_plot", "x_axis", "checkpoint_dir", "chunk_rounds", "progress"}
    allowed |= {"algorithm"}
    grid = spec["grid"]
    bad = set(grid) - allowed
    if bad:
        raise ValueError(f"grid.{sorted(bad)[0]} is invalid: expected one of {', '.join(sorted(allowed))}")
    choices = {"problem": PROBLEMS, "algorithm": ALGORITHMS, "quantizer": QUANTIZERS,
               "sampling": ("generative", "markov"), "aggregation": ("divide_by_n", "divide_by_received")}
    for name, allowed_values in choices.items():
        values = grid.get(name, [])
        for v in values if isinstance(values, list) else [values]:
            if v not in allowed_values:
                raise ValueError(f"grid.{name}={v!r} is invalid: expected one of "
                                 f"{', '.join(repr(a) for a in allowed_values)}")
    for name in ("seeds", "records", "rounds", "total_local_steps", "record_every"):
        v = run[name]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"run.{name}={v!r} is invalid: expected an integer >= 1")
    return run, grid, defaults


def cmd_sweep(args) -> int:
    import functools
    from types import SimpleNamespace

    try:
        run, grid_axes, defaults = _sweep_spec(args.config)
    except ValueError as err:
        print(f"fedsa-jax: error: {err}", file=sys.stderr)
        return 2
    import jax

    if run["dtype"] == "float64":
        jax.config.update("jax_enable_x64", True)
    import fedsa_jax as fj

    configs = fj.grid(**grid_axes)

    def options(config):
        merged = {**defaults, "dtype": run["dtype"], **config}
        merged["algorithm"] = config.get("algorithm", "fedlsa")
        return SimpleNamespace(**merged)

    @functools.lru_cache(maxsize=64)
    def problem_for(items):
        o = SimpleNamespace(**dict(items))
        return _make_problem(o, jax.random.key(o.problem_seed))

    problem_keys = ("problem", "agents", "heterogeneity", "states", "dim", "sampling", "noise_A", "noise_b",
                    "problem_seed", "dtype")

    def build(config):
        o = options(config)
        return problem_for(tuple((k, getattr(o, k)) for k in problem_keys)), _make_algorithm(o.algorithm, o)

    def rounds(config):
        if run["rounds"] is not None:
            return int(run["rounds"])
        o = options(config)
        H = _make_algorithm(o.algorithm, o).config.num_local_steps
        return max(1, int(run["total_local_steps"]) // H)

    def record_every(config):
        if run["record_every"] is not None:
            return min(int(run["record_every"]), rounds(config))
        return max(1, rounds(config) // int(run["records"] or rounds(config)))

    from fedsa_jax.sweep import config_name

    out = args.out or Path(run["out"])
    t0 = time.perf_counter()
    try:
        entries = fj.sweep(jax.random.key(int(run["seed"])), configs, build, rounds, int(run["seeds"]),
                           out_dir=out, record_every=record_every, progress=args.progress)
    except ValueError as err:
        print(f"fedsa-jax: error: {err}", file=sys.stderr)
        return 2
    for e in entries:
        state = "loaded" if e.seconds == 0 else f"{e.seconds:.1f} s"
        print(f"{config_name(e.config)}: final MSE {e.result.mse_mean[-1]:.4g} "
              f"+- {e.result.mse_sem[-1]:.2g} ({state})")
    print(f"{len(entries)} configurations in {time.perf_counter() - t0:.1f} s -> {out / 'sweep.json'}")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "sweep":
        return cmd_sweep(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
