"""``fedsa-jax run``: simulate the algorithms on one problem, write result files, a summary and
a figure."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fedsa_jax import registry
from fedsa_jax.cli.build import _make_algorithm, _make_problem
from fedsa_jax.cli.checks import options_checked
from fedsa_jax.cli.limits import bias_lines, exact_costs, exact_curves, reference_lines
from fedsa_jax.cli.parser import progress_mode
from fedsa_jax.cli.titles import cohort_caption, run_title


def _prepare_jax(args, dtype: str) -> None:
    """JAX's settings, before anything computes: float64 if asked, one CPU device per core
    (``--cpu-devices``) and the persistent compilation cache.

    When ``main()`` is called from a process whose JAX already runs (a notebook, the tests),
    the default keeps its devices as they are; an explicit ``--cpu-devices`` that cannot be
    honoured is an error."""
    import jax

    from fedsa_jax import compile_cache, cpu

    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    if args.cpu_devices is not None or not cpu.backends_initialized():
        try:
            cpu.use_cpu_cores(args.cpu_devices)
        except (RuntimeError, ValueError) as err:  # more devices than cores, or JAX already runs
            reason = str(err).removeprefix(f"num_devices={args.cpu_devices} is invalid: ")
            raise ValueError(f"--cpu-devices={args.cpu_devices} is invalid: {reason}") from None
    folder = compile_cache.configured_dir(opt_out=args.no_compile_cache)
    if folder is not None:
        compile_cache.enable(folder)


def _prepare_outputs(pairs) -> None:
    from fedsa_jax._io import prepare_dir

    for option, path in pairs:
        if path is not None:
            prepare_dir(path, option)


def _mean_local_steps(alg, num_rounds: int) -> float:
    """Local steps per round, averaged over the run's rounds (H for an integer H)."""
    import fedsa_jax as fj

    H = getattr(alg.config, "num_local_steps", 1)
    return (
        fj.optim.total_local_steps(H, num_rounds) / max(num_rounds, 1)
        if num_rounds
        else float(fj.optim.max_local_steps(H))
    )


class _CompileTimer:
    """Wall time JAX spends tracing, lowering and compiling (the union of those events' spans),
    so that throughput can be reported warm, without compilation."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __enter__(self):
        import jax.monitoring as monitoring

        self.spans: list[tuple[float, float]] = []
        self._monitoring = monitoring
        self._spans = hasattr(monitoring, "register_event_time_span_listener")
        if self._spans:
            monitoring.register_event_time_span_listener(self._record)  # pyright: ignore[reportArgumentType]
        else:  # older JAX: durations only (nested events may count twice)
            monitoring.register_event_duration_secs_listener(self._record_duration)  # pyright: ignore[reportArgumentType]
        return self

    def _record(self, event, start, end, **kwargs):
        if event in self.EVENTS:
            self.spans.append((start, end))

    def _record_duration(self, event, duration, **kwargs):
        if event in self.EVENTS:
            start = self.spans[-1][1] if self.spans else 0.0
            self.spans.append((start, start + duration))

    def __exit__(self, *exc):
        if self._spans:
            self._monitoring.unregister_event_time_span_listener(self._record)  # pyright: ignore[reportArgumentType]
        else:
            self._monitoring.unregister_event_duration_listener(self._record_duration)  # pyright: ignore[reportArgumentType]

    @property
    def seconds(self) -> float:
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self.spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


def _timing(res, seconds: float, compile_s: float, problem, alg) -> dict:
    """What a run cost: wall time, compile time, and warm agent-steps/s over the work it did
    itself (a resumed run counts only the rounds it ran; a round of FedBuff runs its buffer's K
    agents' local steps, not N)."""
    execution = res.config["execution"]
    per_round = _mean_local_steps(alg, int(res.rounds[-1]))
    runs = getattr(alg.config, "buffer_size", None) or problem.num_agents  # local runs per round
    steps = round(int(execution.get("seed_rounds_run", 0)) * runs * per_round)
    warm = seconds - compile_s
    return {
        "seconds": seconds,
        "compile_s": compile_s,
        "agent_steps_run": steps,
        "agent_steps_per_s": steps / warm if steps and warm > 0 else None,
        "trajectories": alg.trajectories,  # per seed: 1, or 1 + B with the bootstrap's replicates
        "resumed": execution.get("resumed_from") is not None,
        "resumed_from": execution.get("resumed_from"),
    }


def _describe_timing(timing: dict, num_rounds: int) -> str:
    text = f"{timing['seconds']:.1f} s"
    resumed = timing["resumed_from"]
    if resumed is not None and not timing["agent_steps_run"]:
        return text + ", loaded a finished checkpoint (nothing ran)"
    if resumed is not None:
        text += f", resumed at seed batch {resumed['seed_batch']} round {resumed['round']} of {num_rounds}"
    text += f": compile {timing['compile_s']:.1f} s"
    if timing["agent_steps_per_s"] is not None:
        text += f", {timing['agent_steps_per_s']:.3g} agent-steps/s warm"
        if timing.get("trajectories", 1) > 1:  # the bootstrap's replicates run as many steps each
            total = timing["agent_steps_per_s"] * timing["trajectories"]
            text += f" ({total:.3g} counting the {timing['trajectories'] - 1} replicates' steps)"
    return text


def _algorithms(args, problem) -> tuple[list, list[str]]:
    """The run's algorithms and the file names of their results (distinct)."""
    from fedsa_jax._paths import safe_name

    args.params = dict(args.param or [])
    if args.params and not any(":" in name for name in args.algorithms):
        raise ValueError(
            "--param is invalid: it applies to 'module:factory' algorithms only, and --algorithms "
            f"has none ({','.join(args.algorithms)})"
        )
    algs = [_make_algorithm(name, args) for name in args.algorithms]
    names = [safe_name(alg.name) for alg in algs]  # pyright: ignore[reportAttributeAccessIssue]
    if len(set(names)) < len(names):
        raise ValueError(
            f"--algorithms={','.join(args.algorithms)!r} is invalid: two algorithms are named "
            f"{max(names, key=names.count)!r} (results are named after the algorithm)"
        )
    return algs, names


def _run_options(args, checkpoint_name: str) -> dict:
    """The keywords of ``fj.simulate`` / ``fj.compare`` that the options set."""
    import fedsa_jax as fj

    return dict(
        record_every=args.record_every,  # above --rounds refused, as fj.simulate refuses it
        execution=fj.Execution(
            chunk_rounds=args.chunk_rounds,
            checkpoint_dir=None if args.checkpoint_dir is None else args.checkpoint_dir / checkpoint_name,
            progress=progress_mode(args.progress),
            fused_local_steps=getattr(args, "fused_local_steps", None),
        ),
        quantiles=True if args.band == "quantiles" else None,
        metrics={
            **({"last_iterate_mse": "last_iterate_mse"} if args.average is not None else {}),
            **({"clipped_fraction": "clipped_fraction"} if _clips(args) else {}),
            **getattr(args, "intervals", {}),
        }
        or None,
    )


def _clips(args) -> bool:
    """Whether the run's privacy mechanism clips the messages (``--clip-norm`` without ``--no-clip``)."""
    return getattr(args, "clip_norm", None) is not None and not getattr(args, "no_clip", False)


def _interval_methods(args) -> list[str]:
    """The intervals for ``u^T theta*`` the run's wrappers give: the bootstrap's, the plug-in's."""
    return (["quantile", "normal"] if getattr(args, "bootstrap", None) is not None else []) + (
        ["plug_in"] if getattr(args, "plug_in", False) else []
    )


def _direction(args, dim: int):
    """``--direction``: ``e_I`` for an index, else the d numbers given."""
    import numpy as np

    values = [float(t) for t in args.direction.split(",")]
    if len(values) == 1 and args.direction.strip().isdigit():
        index = int(args.direction)
        if index >= dim:
            raise ValueError(
                f"--direction={args.direction!r} is invalid: expected a coordinate index in [0, {dim - 1}]"
            )
        return np.eye(dim)[index]
    if len(values) != dim or not any(values):
        raise ValueError(
            f"--direction={args.direction!r} is invalid: expected {dim} comma-separated numbers, not all 0 "
            "(the problem's dimension), or a coordinate's index"
        )
    return np.asarray(values)


def _interval_metrics(args, problem) -> dict:
    """The metrics of the intervals at ``--level`` along ``--direction`` (their coverage of ``theta*``
    is what ``covers_*`` averages to), for ``--bootstrap`` and ``--plug-in`` runs."""
    import fedsa_jax as fj

    methods = _interval_methods(args)
    if not methods:
        return {}
    u = _direction(args, problem.dim)
    return fj.inference.intervals(u, levels=args.level, methods=methods)


def _coverage_line(args, res, problem, name: str, summary: dict) -> None:
    """Each interval's coverage of ``u^T theta*`` at the last round, with its binomial s.e. (and why
    it collapsed, where the seeds' mean iterate lies outside the intervals: :func:`_centre_note`)."""
    methods = _interval_methods(args)
    if not methods:
        return
    from fedsa_jax.inference import level_name

    coverage = {}
    for m in methods:
        stats = res.metrics[f"covers_{m}_{level_name(args.level)}"]
        coverage[m] = {"coverage": float(stats.mean[-1]), "sem": float(stats.sem[-1])}
    summary["runs"][name]["coverage"] = {"level": args.level, "direction": args.direction, **coverage}
    cells = ", ".join(f"{m} {c['coverage']:.3f} +- {c['sem']:.3f}" for m, c in coverage.items())
    print(
        f"{name:9s} coverage of u^T theta* at level {args.level:g} (u: --direction {args.direction}): {cells}"
    )
    note = _centre_note(args, res, problem, [f"{m}_{level_name(args.level)}" for m in methods])
    if note:
        summary["runs"][name]["coverage"]["note"] = note
        print(f"  note: {note}")


def _centre_note(args, res, problem, tags: list[str]) -> str | None:
    """Every interval is centred on the seed's ``theta_T``: where the seeds' mean of ``u^T theta_T`` is
    farther from ``u^T theta*`` than the widest interval's mean half-width, the typical interval misses
    whatever its width, and the coverage says nothing of the interval. Why: an iterate still on its
    way (from the recorded round nearest T/2 to T, the MSE falls by more than 10 % and 4.5 s.e., or
    the mean of ``u^T theta_t`` moves by more than 4.5 s.e.) or a limit that is itself off ``theta*``
    (a bias); with rounds 0 and T alone recorded, either."""
    import numpy as np

    u = _direction(args, problem.dim)
    u = u / np.linalg.norm(u)  # the intervals' own normalisation
    offset = abs(float((res.theta_mean[-1] - np.asarray(problem.theta_star, np.float64)) @ u))
    width = max(
        0.5 * float(res.metrics[f"upper_{t}"].mean[-1] - res.metrics[f"lower_{t}"].mean[-1]) for t in tags
    )
    if not offset > width:
        return None
    where = (
        f"the intervals are centred on theta_T, whose mean over seeds is off u^T theta* by {offset:.3g}, "
        f"{offset / max(width, 1e-300):.3g} times the widest interval's mean half-width {width:.3g}"
    )
    mid = int(np.argmin(np.abs(res.rounds - res.rounds[-1] / 2)))
    if mid == 0:
        return f"{where}: it has not reached its limit or its limit is biased (record more rounds to tell)"
    drop = res.mse_mean[mid] - res.mse_mean[-1]
    moved = abs(float((res.theta_mean[mid] - res.theta_mean[-1]) @ u))
    moved_se = float(np.sqrt((res.theta_sem[mid] ** 2 + res.theta_sem[-1] ** 2) @ u**2))
    if (drop > 0.1 * res.mse_mean[-1] and drop > 4.5 * np.hypot(res.mse_sem[mid], res.mse_sem[-1])) or (
        moved > 4.5 * moved_se
    ):
        return (
            f"{where}: it has not reached its limit (from round {res.rounds[mid]} to {res.rounds[-1]} the "
            f"MSE went from {res.mse_mean[mid]:.3g} to {res.mse_mean[-1]:.3g} and the mean of u^T theta_t "
            f"moved by {moved:.3g}): the numbers above are a transient's; run more rounds (--rounds)"
        )
    return (
        f"{where}, and it has stopped moving (MSE {res.mse_mean[-1]:.3g}): its limit is biased, which the "
        "intervals do not carry (e.g. FedLSA's under heterogeneity; SCAFFLSA has none)"
    )


def _seeds(args):
    """The seed count, or with ``--rel-sem`` the precision target (:func:`fedsa_jax.until`)."""
    import fedsa_jax as fj

    return args.seeds if args.rel_sem is None else fj.until(rel_sem=args.rel_sem, max_seeds=args.seeds)


def _compare_name(names: list[str]) -> str:
    return "compare__" + "__".join(names)


def _check_runs(args, problem, algs, names: list[str]) -> None:
    """Every simulation's arguments checked as :func:`fedsa_jax.simulate` checks them (nothing runs
    or compiles: a quantizer's ``k`` above the dimension, more clients per round than agents,
    ``--record-every`` above ``--rounds``, ...), so that an error comes before anything is printed."""
    import inspect

    import jax

    import fedsa_jax as fj
    from fedsa_jax._runtime.driver import simulation_run

    key, seeds = jax.random.key(args.seed), _seeds(args)
    for alg, name in zip(algs, names, strict=True):
        options = _run_options(args, _compare_name(names) if args.compare else name)
        bound = inspect.signature(fj.simulate).bind(key, problem, alg, args.rounds, seeds, **options)
        bound.apply_defaults()
        simulation_run(**bound.arguments)


def _simulate_one(args, problem, alg, file_name: str, summary: dict):
    """Simulate ``alg``, write its result files, add its line to ``summary`` and print it."""
    import jax

    import fedsa_jax as fj

    with _CompileTimer() as timer:
        t0 = time.perf_counter()
        res = fj.simulate(
            jax.random.key(args.seed),
            problem,
            alg,
            args.rounds,
            _seeds(args),
            **_run_options(args, file_name),
        )
        seconds = time.perf_counter() - t0
    _write_one(
        args, res, problem, alg, file_name, summary, _timing(res, seconds, timer.seconds, problem, alg)
    )
    return res


def _compare_all(args, problem, algs, names: list[str], summary: dict) -> dict:
    """``--compare``: every algorithm on the same seeds in one run (:func:`fedsa_jax.compare`); each
    result written as a lone run's, then each pair's paired difference and ratio at the last round."""
    import jax

    import fedsa_jax as fj

    with _CompileTimer() as timer:
        t0 = time.perf_counter()
        cmp = fj.compare(
            jax.random.key(args.seed),
            problem,
            {alg.name: alg for alg in algs},
            args.rounds,
            args.seeds,
            **_run_options(args, _compare_name(names)),
        )
        seconds = time.perf_counter() - t0
    for alg, name in zip(algs, names, strict=True):
        timing = _timing(cmp.results[alg.name], seconds, timer.seconds, problem, alg)
        _write_one(args, cmp.results[alg.name], problem, alg, name, summary, timing)
    summary["differences"] = {}
    for i, a in enumerate(algs):
        for j, b in enumerate(algs[i + 1 :], start=i + 1):
            d = cmp.difference(a.name, b.name)
            d.to_csv(args.out / f"difference_{names[i]}__{names[j]}.csv")
            low, high = (float(v[-1]) for v in d.interval())
            r_low, r_high = (float(v[-1]) for v in d.ratio_interval())
            summary["differences"][f"{a.name} - {b.name}"] = {
                "mean": float(d.mean[-1]),
                "sem": float(d.sem[-1]),
                "interval": [low, high],
                "ratio": float(d.ratio[-1]),
                "ratio_interval": [r_low, r_high],
            }
            print(
                f"{a.name} - {b.name}: paired MSE difference {d.mean[-1]:.4g} +- {d.sem[-1]:.2g} (s.e.), "
                f"95% [{low:.4g}, {high:.4g}]; ratio {d.ratio[-1]:.6g}, 95% [{r_low:.6g}, {r_high:.6g}]"
            )
    return cmp.results


def _write_one(args, res, problem, alg, file_name: str, summary: dict, timing: dict) -> None:
    """Write a result's files, add its line to ``summary`` and print it."""
    path = args.out / f"result_{file_name}.npz"
    res.save(path)
    res.to_csv(args.out / f"result_{file_name}.csv")
    summary["runs"][alg.name] = {
        "file": path.name,
        "final_mse": float(res.mse_mean[-1]),
        "final_mse_sem": float(res.mse_sem[-1]),
        "final_mse_interval": [float(v[-1]) for v in res.mse_interval()],
        "num_seeds": res.num_seeds,
        **({"until": res.config["until"]} if "until" in res.config else {}),
        "num_diverged": int(res.num_diverged[-1]),
        "bits_sent": float(res.bits_sent[-1]),
        "bits_delivered": float(res.bits_delivered[-1]),
        **timing,
        "config": res.config["algorithm"],
    }
    cohort = f"{cohort_caption(args, problem)}, " if cohort_caption(args, problem) else ""
    print(
        f"{alg.name:9s} final MSE {res.mse_mean[-1]:.4g} +- {res.mse_sem[-1]:.2g} (s.e.), "
        f"{cohort}{int(res.num_diverged[-1])} diverged{_growth_note(res, problem)}{_seeds_note(res)}, "
        f"{_describe_timing(timing, args.rounds)} -> {path}"
    )
    _coverage_line(args, res, problem, alg.name, summary)
    _privacy_line(res, alg.name, summary)
    _clipped_line(res, alg.name, summary)


def _clipped_line(res, name: str, summary: dict) -> None:
    """The fraction of the messages the privacy clipping shortened, over the run's rounds (metric
    ``"clipped_fraction"``), printed and in the summary; a warning where nearly all were."""
    stats = res.metrics.get("clipped_fraction")
    if stats is None or res.privacy is None or len(res.rounds) < 2:
        return
    fraction = float(stats.mean[1:].mean())  # round 0 sent nothing
    summary["runs"][name]["clipped_fraction"] = fraction
    m = res.privacy["mechanism"]
    clip = f"C = {m['clip_norm']:g}{' at start' if 'target_quantile' in m else ''}"
    line = f"{name:9s} privacy: {100 * fraction:.3g} % of the messages clipped ({clip})"
    if fraction >= CLIPPED_WARNING:
        line += (
            ": nearly every update is shortened to norm C, whatever --step-size, so the run moves "
            "slowly and towards a biased limit; raise --clip-norm (or let it adapt: --target-quantile)"
        )
    print(line)


CLIPPED_WARNING = 0.9  # the fraction of clipped messages from which the run is told it is mostly clipping


def _privacy_line(res, name: str, summary: dict) -> None:
    """The run's privacy loss (``result.privacy``), printed and in the summary."""
    spent = res.privacy
    if spent is None:
        return
    summary["runs"][name]["privacy"] = spent
    m = spent["mechanism"]
    if spent.get("epsilon") is None:
        print(
            f"{name:9s} privacy: sigma {m['noise_multiplier']:.4g}, C {m['clip_norm']:g}, {m['mode']}: "
            f"{spent['reason']}"
        )
        return
    print(
        f"{name:9s} privacy: epsilon {spent['epsilon']:.4g} at delta {spent['delta']:g} after "
        f"{spent['releases']} releases ({m['mode']} noise, sigma {m['noise_multiplier']:.4g}, "
        f"C {m['clip_norm']:g}{_adaptive(m)}; "
        f"{spent['relation'].replace('_', ' ')}, {spent['accountant'].upper()} accountant)"
    )


def _adaptive(mechanism: dict) -> str:
    """How the clipping norm adapts, if it does."""
    if "target_quantile" not in mechanism:
        return ""
    return f" at start, adapting to the {mechanism['target_quantile']:g} quantile"


def _growth_note(res, problem) -> str:
    """For a run whose MSE grew by orders of magnitude or settled far above its start (the library
    warns too): by how much."""
    import numpy as np

    from fedsa_jax._runtime.growth import mse_growth

    star = np.asarray(problem.theta_star, np.float64)  # settled too high: said if no seed diverged
    diverged = bool(np.max(res.num_diverged))
    growth = mse_growth(res.rounds, res.mse_mean, reference=None if diverged else float(star @ star))
    return "" if growth is None else f", but {growth.note()}"


def _seeds_note(res) -> str:
    """For a precision-targeted run (``--rel-sem``): the seeds it ran and why it stopped."""
    until = res.config.get("until")
    return "" if until is None else f", {res.num_seeds} seeds ({until['stopped']})"


# Under Markov sampling the closed form is the i.i.d. limit; the exact limit differs by the Markov bias.


# --exact: an exact part whose estimate (fj.theory.engine.exact_cost) exceeds LONG_EXACT_S is announced
# before it starts; one above MAX_EXACT_S is refused (exact_mse: before the simulation) or skipped
# (the stationary MSE). The estimates are good to a few times.


def _check_compare(args, algs) -> None:
    """``--compare`` needs two algorithms or more, and a seed count."""
    if not args.compare:
        return
    if len(algs) < 2:
        raise ValueError(
            f"--compare is invalid: it compares two algorithms or more, and --algorithms has one "
            f"({','.join(args.algorithms)})"
        )
    if args.rel_sem is not None:
        raise ValueError(f"--rel-sem={args.rel_sem!r} is invalid: it applies to runs without --compare")


@options_checked
def cmd_run(args) -> int:
    _prepare_outputs([("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir)])
    import jax

    _prepare_jax(args, args.dtype)
    from fedsa_jax._io import atomic_write, write_json

    problem = _make_problem(args, jax.random.key(args.problem_seed))
    algs, names = _algorithms(args, problem)
    args.intervals = _interval_metrics(args, problem)
    _check_compare(args, algs)
    _check_runs(args, problem, algs, names)  # every error before the first line printed
    args.exact_costs = exact_costs(args, problem, algs)
    builtin = [alg for spec, alg in zip(args.algorithms, algs, strict=True) if spec in registry.algorithms()]
    if builtin and (args.quantizer != "none" or args.success_prob != 1.0):
        print(f"uplink channel: {json.dumps(builtin[0].config.channel.describe())}")
    out: Path = args.out
    print(f"problem: {json.dumps(problem.describe())}")
    summary = {"problem": problem.describe(), "runs": {}}
    if args.compare:
        results = _compare_all(args, problem, algs, names, summary)
    else:
        results = {
            alg.name: _simulate_one(args, problem, alg, name, summary)
            for alg, name in zip(algs, names, strict=True)
        }
    lines = bias_lines(args, problem, summary) | reference_lines(problem, results, summary)
    exact = exact_curves(args, problem, algs, summary, lines)
    if not args.no_plot:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        from fedsa_jax.plotting import plot_mse

        plot = dict(reference_lines=lines, title=run_title(args, problem), x=args.x_axis)
        fig = plot_mse(results, **plot, band=args.band, theory=exact)  # pyright: ignore[reportArgumentType]

        atomic_write(out / "mse.png", lambda f: fig.savefig(f, format="png"))
        import matplotlib.pyplot as plt

        plt.close(fig)  # written: main() called in one process (a notebook, tests) keeps no figure open
        print(f"figure -> {out / 'mse.png'}")
    write_json(out / "summary.json", summary)
    return 0
