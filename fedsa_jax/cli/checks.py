"""Options refused where nothing reads them, and library errors reported under the option that
set the parameter; both read the options' list and the registry."""

from __future__ import annotations

import functools
import re

from fedsa_jax import registry
from fedsa_jax.cli.options import library_options, run_options

_INVALID_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)=(.*?) is invalid: (.*)$", re.DOTALL)


def _as_option(text: str, args, option_of) -> str:
    """A library error ``name=value is invalid: ...`` reported under the option that set ``name``
    (``option_of(dest)``: its spelling, or None where no option of this command set it); the value
    shown is the option's (the library's where the option was left to its per-problem default)."""
    m = _INVALID_RE.match(text)
    if m is None:
        return text
    name, shown, reason = m.groups()
    library = library_options()
    key = name if name in library else name.rsplit(".", 1)[-1]
    params = getattr(args, "params", None) or {}
    if key in params:  # a module:factory keyword given with --param / [params]
        return text
    dest = library.get(key)
    option = None if dest is None else option_of(dest)
    if option is None:
        return text
    value = getattr(args, dest, None)  # pyright: ignore[reportCallIssue, reportArgumentType]
    where = (
        f"{option}={value!r}"
        if value is not None
        else f"{option}={shown} (its default with --problem {args.problem})"
        if dest in ("states", "dim")
        else f"{option}={shown}"
    )
    decay = option_of("decay_steps")
    if dest == "step_size" and getattr(args, "schedule", "constant") != "constant" and decay is not None:
        where += f" with {decay}={args.decay_steps!r}"
    return f"{where} is invalid: {reason}"


def _run_option(dest: str) -> str | None:
    option = run_options().get(dest)
    return None if option is None else option.flags[0]


def options_checked(command):
    """The run command, refusing options it would not read (:func:`_check_applicable`) and reporting
    the library's errors, which name its parameters (``num_states=1 is invalid: ...``), under the
    option that set the parameter (``--states=1 is invalid: ...``)."""

    @functools.wraps(command)
    def run(args):
        _check_applicable(args)
        try:
            return command(args)
        except ValueError as err:
            raise ValueError(_as_option(str(err), args, _run_option)) from None

    return run


def _readers(args, kind: str) -> dict[str, tuple[str, bool, str]]:
    """For each option an entry of ``kind`` reads: (who reads it, whether this run does, what this
    run has)."""
    table = {
        "problem": registry.problems,
        "quantizer": registry.quantizers,
        "algorithm": registry.algorithms,
    }[kind]()
    if kind == "algorithm":
        chosen = [table[n] for n in args.algorithms if n in table]
        plugins, has = (
            any(n not in table for n in args.algorithms),
            f"--algorithms {','.join(args.algorithms)}",
        )
    elif kind == "quantizer":  # the uplink's and the downlink's quantizers read the same options
        down = getattr(args, "downlink_quantizer", "none")
        chosen, plugins, has = [table[args.quantizer], table[down]], False, f"--quantizer {args.quantizer}"
        has += "" if down == "none" else f" and --downlink-quantizer {down}"
    else:
        chosen, plugins, has = [table[getattr(args, kind)]], False, f"--{kind} {getattr(args, kind)}"
    readers: dict[str, tuple[str, bool, str]] = {}
    for option in {o.dest: o for entry in table.values() for o in entry.options}.values():
        names = [name for name, entry in table.items() if entry.reads(option.dest)]
        if option.read_by is not None:
            read_by = option.read_by
        elif kind == "algorithm":
            read_by = ("the algorithm " if len(names) == 1 else "") + _and(names)
        else:
            read_by = f"--{kind} " + " or ".join(names)
        read = any(entry.reads(option.dest) for entry in chosen) or (option.plugins and plugins)
        readers[option.dest] = (read_by, read, has)
    return readers


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _check_applicable(args) -> None:
    """Refuse an option set (to anything but its default) where nothing in this run reads it:
    ``--bits`` without the stochastic-uniform quantizer, ``--local-steps`` with a one-step algorithm
    alone, a channel option with plugins only, ..."""
    options = run_options()
    builtin = any(n in registry.algorithms() for n in args.algorithms)
    algorithms = f"--algorithms {','.join(args.algorithms)}"
    table = _readers(args, "quantizer")
    table["decay_steps"] = (
        "--schedule inverse-time",
        args.schedule == "inverse-time",
        f"--schedule {args.schedule}",
    )
    table["bootstrap_weights"] = (
        "--bootstrap",
        getattr(args, "bootstrap", None) is not None,
        "no --bootstrap",
    )
    inference = getattr(args, "bootstrap", None) is not None or getattr(args, "plug_in", False)
    for dest in ("level", "direction"):
        table[dest] = ("--bootstrap or --plug-in", inference, "neither")
    table.update(_readers(args, "problem"))
    table.update(_readers(args, "algorithm"))
    for dest in (
        "quantizer",
        "success_prob",
        "aggregation",
        "error_feedback",
        "downlink_quantizer",
        "clip_norm",
        "noise_multiplier",
        "target_epsilon",
        "dp_mode",
        "delta",
        "no_clip",
        "target_quantile",
        "clip_lr",
        "count_noise",
    ):
        table[dest] = (options[dest].read_by, builtin, algorithms)  # pyright: ignore[reportArgumentType]
    for dest, (read_by, read, has) in table.items():
        value = getattr(args, dest)
        if not read and value != options[dest].default:
            option = options[dest].flags[0]
            raise ValueError(
                f"{option}={value!r} is invalid: it is read only with {read_by}, and this run "
                f"has {has}; drop {option}"
            )
