"""Options refused where nothing reads them, and library errors reported under the option that
set the parameter; both read the options' list and the registry."""

from __future__ import annotations

import ast
import functools
import json
import re

from fedsa_jax import registry
from fedsa_jax.cli.options import library_options, run_options

_INVALID_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)=(.*?) is invalid: (.*)$", re.DOTALL)
_VALUE = r"'[^']*'|\"[^\"]*\"|[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|inf)\b|[A-Za-z_]\w*"
# a Python keyword argument spelled in a library's reason (``mode='local'``, ``clip=False``)
_KEYWORD_RE = re.compile(rf"(?<![\w.\-])([A-Za-z_]\w*)=({_VALUE})")
# a call of the library spelled with its keywords (``fj.channel.privacy(..., clip=False)``)
_CALL_RE = re.compile(r"\bfj\.[\w.]+\(([^()]*)\)")


def _as_option(text: str, args, option_of) -> str:
    """A library error ``name=value is invalid: ...`` reported under the option that set ``name``
    (``option_of(dest)``: its spelling, or None where no option of this command set it); the value
    shown is the option's (the library's where the option was left to its per-problem default), and
    the reason's keywords are spelled as the options that set them (:func:`_in_option_terms`)."""
    m = _INVALID_RE.match(text)
    if m is None:
        return _in_option_terms(text, args, option_of)
    name, shown, reason = m.groups()
    library = library_options()
    key = name if name in library else name.rsplit(".", 1)[-1]
    reason = _in_option_terms(reason, args, option_of, keep=key)  # the parameter named first: shown so
    params = getattr(args, "params", None) or {}
    if key in params:  # a module:factory keyword given with --param / [params]
        return f"{name}={shown} is invalid: {reason}"
    dest = library.get(key)
    option = None if dest is None else option_of(dest)
    if option is None:  # a parameter no option sets alone (privacy={...}): the options that set its fields
        fields = _literal(shown)
        spelled = (
            [_spelled(k, v, args, option_of) for k, v in fields.items()] if isinstance(fields, dict) else []
        )
        where = " ".join(s for s in spelled if s) if spelled and all(spelled) else f"{name}={shown}"
        return f"{where} is invalid: {reason}"
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


def _literal(text: str):
    """A value as Python spells it (``'local'``, ``1e-05``, ``False``, a dict), or the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _spelled(param: str, value, args, option_of) -> str | None:
    """The library keyword ``param=value`` as the option feeding ``param`` spells it on this command
    (the registry's ``Option.params``): ``mode='local'`` -> ``--dp-mode local``, ``num_rounds=2`` ->
    ``--rounds=2``, ``clip=False`` -> ``--no-clip`` (a flag that sets a ``no_`` option gives its
    parameter False), a sweep file's ``grid.dp_mode = "local"``; None where no option of this command
    sets ``param``."""
    if param in (getattr(args, "params", None) or {}):  # a module:factory keyword given with --param
        return None
    dest = library_options().get(param)
    option = None if dest is None else option_of(dest)
    if dest is None or option is None:
        return None
    value = _literal(value) if isinstance(value, str) else value
    if run_options()[dest].action == "store_true":
        if not isinstance(value, bool):
            return None
        value = value != dest.startswith("no_")  # whether the flag is given
        if option.startswith("--"):
            return option if value else f"no {option}"
    if option.startswith("--"):  # as typed: a word after the flag, a number attached (a bound)
        return f"{option} {value}" if isinstance(value, str) else f"{option}={value}"
    return f"{option} = {json.dumps(value)}"


def _in_option_terms(reason: str, args, option_of, keep: str = "") -> str:
    """``reason`` with the library's keywords (``use mode='local'``) and its calls spelled with them
    (``fj.channel.privacy(..., clip=False)``) rewritten as the options that set them (``use --dp-mode
    local``, ``--no-clip``); a keyword no option of this command sets, or ``keep`` (the parameter the
    message names first, under its option), is left as written."""

    def call(m: re.Match) -> str:
        parts = [p.strip() for p in m.group(1).split(",") if p.strip() not in ("", "...")]
        keywords = [_KEYWORD_RE.fullmatch(p) for p in parts]
        spelled = [k and _spelled(k.group(1), k.group(2), args, option_of) for k in keywords]
        return " ".join(s for s in spelled if s) if spelled and all(spelled) else m.group(0)

    def keyword(m: re.Match) -> str:
        return (m.group(1) != keep and _spelled(m.group(1), m.group(2), args, option_of)) or m.group(0)

    return _KEYWORD_RE.sub(keyword, _CALL_RE.sub(call, reason))


def _run_option(dest: str) -> str | None:
    option = run_options().get(dest)
    return None if option is None else option.flags[0]


def in_option_terms(text: str, args) -> str:
    """A library error as the run command's options spell it (:func:`_as_option`)."""
    return _as_option(text, args, _run_option)


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
            raise ValueError(in_option_terms(str(err), args)) from None

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


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def law_reads(args, option) -> bool:
    """Whether ``option`` is read by the law this run's ``option.needs`` names (True without one)."""
    if option.needs is None:
        return True
    law, laws = option.needs
    return str(getattr(args, law, None)).partition(":")[0] in laws


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
    for dest, option in options.items():  # read only with one of the laws of another option
        if option.needs is not None and table.get(dest, (None, False))[1]:
            law, laws = option.needs
            if not law_reads(args, option):
                flag = options[law].flags[0]
                table[dest] = (f"{flag} {_or(list(laws))}", False, f"{flag} {getattr(args, law)}")
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
