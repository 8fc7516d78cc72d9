"""``fedsa-jax sweep CONFIG.toml``: the sweep file's tables checked against the options' list
(its keys and grid axes are the run options), then the grid run through ``fj.sweep``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from fedsa_jax import registry
from fedsa_jax._runtime.sweep import config_name
from fedsa_jax._validate import fail
from fedsa_jax.cli.build import _make_algorithm, _make_problem, one_line, rounds_within
from fedsa_jax.cli.checks import _as_option, law_reads
from fedsa_jax.cli.options import PARAM_RE, algorithm, run_options
from fedsa_jax.cli.parser import build_parser, progress_mode
from fedsa_jax.cli.run import _prepare_jax, _prepare_outputs
from fedsa_jax.registry import positive_int

RUN_KEYS = {
    "seeds": 64,
    "seed": 1,
    "rounds": None,
    "total_local_steps": None,
    "record_every": None,
    "records": None,
    "dtype": "float32",
    "out": "fedsa_sweep",
    "figure_x": None,
}


def problem_keys() -> tuple[str, ...]:
    """The options a problem is built from (configurations equal in these share one problem)."""
    return (*(dest for dest, o in run_options().items() if o.group == "problem"), "dtype")


def _default_algorithm() -> str:
    return next(iter(registry.algorithms()))


def _check_value(where: str, value, convert, choices=None):
    """``value`` from a TOML file, checked and converted exactly as the command line would
    (so integers refuse 1.7 and true, and the message names ``where``)."""
    if isinstance(value, (dict, list)):
        raise ValueError(f"{where}={value!r} is invalid: expected a single value")
    text = value if isinstance(value, str) else json.dumps(value)
    try:
        converted = convert(text) if convert is not None else text
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise ValueError(f"{where}={value!r} is invalid: {err}") from None
    if choices is not None and converted not in choices:
        raise ValueError(
            f"{where}={value!r} is invalid: expected one of {', '.join(repr(c) for c in choices)}"
        )
    return converted


def _table(spec: dict, name: str) -> dict:
    table = spec.get(name, {})
    if not isinstance(table, dict):
        raise ValueError(f"{name}={table!r} is invalid: expected a table [{name}]")
    return table


def _read_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # pyright: ignore[reportMissingImports]
    try:
        spec = tomllib.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"config={str(path)!r} is invalid: {one_line(err)}") from None
    unknown = set(spec) - {"run", "grid", "params"}
    if unknown or "grid" not in spec:
        raise ValueError(
            f"config={str(path)!r} is invalid: expected tables [run], [grid] and optionally "
            f"[params], got {sorted(spec)}"
        )
    return spec


def _run_table(given_run: dict) -> dict:
    bad = set(given_run) - set(RUN_KEYS)
    if bad:
        raise ValueError(f"run.{sorted(bad)[0]} is invalid: expected one of {', '.join(sorted(RUN_KEYS))}")
    options = run_options()
    run = dict(RUN_KEYS)
    for key, value in given_run.items():
        if key in ("total_local_steps", "records"):
            run[key] = _check_value(f"run.{key}", value, positive_int)
        elif key in ("out", "figure_x"):
            if not isinstance(value, str) or not value:
                raise ValueError(f"run.{key}={value!r} is invalid: expected a non-empty string")
            run[key] = value
        else:
            run[key] = _check_value(f"run.{key}", value, options[key].type, options[key].choices)
    if (run["rounds"] is None) == (run["total_local_steps"] is None):
        raise ValueError("run.rounds is invalid: give exactly one of rounds and total_local_steps")
    return run


def grid_keys() -> dict:
    """The sweep grid's axes: ``algorithm`` and every run option a grid may vary, by ``dest``."""
    return {"algorithm": None, **{dest: o for dest, o in run_options().items() if o.grid}}


def _grid_table(given_grid: dict) -> dict:
    allowed = grid_keys()
    grid = {}
    for key, values in given_grid.items():
        if key not in allowed:
            raise ValueError(f"grid.{key} is invalid: expected one of {', '.join(sorted(allowed))}")
        option = allowed[key]
        convert, choices = (algorithm, None) if option is None else (option.type, option.choices)
        items = values if isinstance(values, list) else [values]
        if not items:
            raise ValueError(f"grid.{key}=[] is invalid: expected a value or a non-empty list of values")
        checked = [_check_value(f"grid.{key}", v, convert, choices) for v in items]
        grid[key] = checked if isinstance(values, list) else checked[0]
    return grid


def _params_table(given_params: dict, grid: dict) -> None:
    algorithms = grid.get("algorithm", _default_algorithm())
    custom = [a for a in (algorithms if isinstance(algorithms, list) else [algorithms]) if ":" in a]
    if given_params and not custom:
        raise ValueError(
            "params is invalid: [params] applies to 'module:factory' algorithms only, and "
            "grid.algorithm has none"
        )
    for key, values in given_params.items():
        items = values if isinstance(values, list) else [values]
        if not PARAM_RE.match(key):
            raise ValueError(f"params.{key} is invalid: expected a Python identifier")
        if not items or not all(isinstance(v, (bool, int, float, str)) for v in items):
            raise ValueError(
                f"params.{key}={values!r} is invalid: expected a number, string or boolean, "
                "or a non-empty list of them"
            )
        grid[f"params.{key}"] = values


def _sweep_spec(path: Path):
    """Parse and check a sweep file: (run options, grid axes, defaults of the run options)."""
    spec = _read_toml(path)
    given_run, given_grid, given_params = (_table(spec, name) for name in ("run", "grid", "params"))
    run = _run_table(given_run)
    grid = _grid_table(given_grid)
    _params_table(given_params, grid)
    if run["figure_x"] is not None and run["figure_x"] not in grid:
        raise ValueError(
            f"run.figure_x={run['figure_x']!r} is invalid: expected one of the grid's keys "
            f"({', '.join(grid)})"
        )
    defaults = vars(build_parser().parse_args(["run"]))
    return run, grid, defaults


def _check_plugins(grid: dict, allowed: bool) -> None:
    """A sweep file naming a 'module:factory' algorithm runs code: only with --allow-plugins."""
    algorithms = grid.get("algorithm", _default_algorithm())
    for name in algorithms if isinstance(algorithms, list) else [algorithms]:
        if ":" in name and not allowed:
            raise ValueError(
                f"grid.algorithm={name!r} is invalid: a 'module:factory' algorithm is code "
                "that the sweep imports and calls; pass --allow-plugins if you trust this file"
            )


def _read_keys(config: dict) -> dict:
    """``config`` without the keys its built-in algorithm does not read: [params], another
    algorithm's options (FedLSA's ``delays`` beside FedBuff), an option whose law is not set
    (``work_normalization`` without ``local_work``). They are out of its file name and record, as
    they are out of its run; a ``module:factory`` algorithm keeps them all."""
    name = config.get("algorithm", _default_algorithm())
    if ":" in name:
        return config
    entries, options = registry.algorithms(), run_options()
    own = {o.dest for entry in entries.values() for o in entry.options}
    given = SimpleNamespace(**{**{d: o.default for d, o in options.items()}, **config})
    return {
        k: v
        for k, v in config.items()
        if not k.startswith("params.")
        and not (k in own and not entries[name].reads(k))
        and (k not in options or law_reads(given, options[k]))
    }


def _sweep_configs(grid: dict, limit: int | None) -> list[dict]:
    """The grid's configurations (at most ``limit``, default ``fedsa_jax.sweep.MAX_GRID``), each
    without the keys its algorithm does not read (:func:`_read_keys`): configurations that are then
    the same run appear once."""
    from fedsa_jax._runtime import sweep as sweep

    configs, seen = [], set()
    for config in sweep._grid(grid, sweep.MAX_GRID if limit is None else limit):
        config = _read_keys(config)
        key = json.dumps(config, sort_keys=True)
        if key not in seen:
            seen.add(key)
            configs.append(config)
    return configs


class _Grid:
    """Builds each configuration's problem (shared by equal problem options) and algorithm, its
    number of rounds and recording interval, from the sweep file's [run] table and defaults."""

    def __init__(self, run: dict, defaults: dict):
        self.run, self.defaults, self.problems = run, defaults, {}

    def options(self, config):
        merged = {
            **self.defaults,
            "dtype": self.run["dtype"],
            **{k: v for k, v in config.items() if "." not in k},
        }
        merged["rounds"], merged["total_local_steps"] = self.run["rounds"], self.run["total_local_steps"]
        merged["algorithm"] = config.get("algorithm", _default_algorithm())
        merged["params"] = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("params.")}
        return SimpleNamespace(**merged)

    def build(self, config):
        import jax

        o = self.options(config)
        try:
            items = tuple((k, getattr(o, k)) for k in problem_keys())
            if items not in self.problems:
                self.problems[items] = _make_problem(o, jax.random.key(o.problem_seed))
            return self.problems[items], _make_algorithm(o.algorithm, o, "grid.algorithm", "params.")
        except ValueError as err:  # named after the grid key that set the parameter, where one did
            key = lambda dest: f"grid.{dest}" if dest in config else None  # noqa: E731
            raise ValueError(_as_option(str(err), o, key)) from None

    def rounds(self, config):
        if self.run["rounds"] is not None:
            return int(self.run["rounds"])
        total = int(self.run["total_local_steps"])
        rounds, first = rounds_within(self.build(config)[1], total)
        if rounds < 1:  # a round is H local steps: fewer cannot be run
            raise ValueError(
                f"run.total_local_steps={total} is invalid: configuration {config_name(config)} "
                f"has H = {first} local steps in its first round; expected total_local_steps >= H "
                "(rounds = the most whose local steps fit in it)"
            )
        return rounds

    def record_every(self, config):
        """``run.record_every`` where given (refused above the configuration's rounds, as
        ``fj.simulate`` refuses it), else every ``rounds // run.records`` rounds (1 without records)."""
        rounds, given = self.rounds(config), self.run["record_every"]
        if given is None:
            return max(1, rounds // int(self.run["records"] or rounds))
        if int(given) > rounds:
            where = "" if self.run["rounds"] is not None else f" (configuration {config_name(config)})"
            fail("run.record_every", given, f"expected an integer in [1, num_rounds={rounds}]{where}")
        return int(given)


def _report(entries) -> None:
    """One console line per configuration: the values that vary across the sweep (all of them
    legible; the file name, cut to a portable length, is in sweep.json), then its final MSE."""
    from fedsa_jax._runtime.sweep import config_label, varying_keys

    varying = varying_keys([e.config for e in entries]) or list(entries[0].config if entries else ())
    for e in entries:
        label = config_label(e.config, varying) or "configuration"  # an empty grid: one configuration
        if e.result is None:
            print(f"{label}: missing")
            continue
        state = {"loaded": "loaded", "recomputed": f"damaged file recomputed, {e.seconds:.1f} s"}.get(
            e.status, f"{e.seconds:.1f} s"
        )
        print(f"{label}: final MSE {e.result.mse_mean[-1]:.4g} +- {e.result.mse_sem[-1]:.2g} ({state})")


def cmd_sweep(args) -> int:
    run, grid_axes, defaults = _sweep_spec(args.config)
    _check_plugins(grid_axes, args.allow_plugins)
    out = args.out or Path(run["out"])
    _prepare_outputs([("--out" if args.out else "run.out", out)])
    import jax

    _prepare_jax(args, run["dtype"])
    import fedsa_jax as fj

    configs = _sweep_configs(grid_axes, args.max_grid)
    grid = _Grid(run, defaults)
    t0 = time.perf_counter()
    entries = fj.sweep(
        jax.random.key(int(run["seed"])),
        configs,
        grid.build,
        grid.rounds,
        int(run["seeds"]),
        out_dir=out,
        record_every=grid.record_every,
        progress=progress_mode(args.progress),
        shard=args.shard,
        compute=not args.collect,
    )
    _report(entries)
    seconds = time.perf_counter() - t0
    if args.shard is not None:
        k, n = args.shard
        print(
            f"shard {k}/{n}: {len(entries)} of {len(configs)} configurations in {seconds:.1f} s -> {out}; "
            f"run without --shard (or with --collect) when all shards are done for sweep.json and sweep.png"
        )
        return 0
    finished = [e for e in entries if e.result is not None]
    if not args.no_plot and finished:
        import matplotlib

        matplotlib.use("Agg")
        from fedsa_jax._io import atomic_write
        from fedsa_jax.plotting import plot_sweep

        fig = plot_sweep(finished, x=run["figure_x"], title=args.config.stem)
        atomic_write(out / "sweep.png", lambda f: fig.savefig(f, format="png"))
        import matplotlib.pyplot as plt

        plt.close(fig)
    print(f"{len(finished)} of {len(configs)} configurations in {seconds:.1f} s -> {out / 'sweep.json'}")
    missing = len(entries) - len(finished)
    if missing:
        print(f"{missing} configurations missing: run without --collect to compute them", file=sys.stderr)
        return 1
    return 0
