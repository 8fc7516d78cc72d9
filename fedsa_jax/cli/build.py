"""Problems, quantizers and algorithms from the options, through the registry; a user's
``module:factory`` algorithm imported and called with its keyword arguments."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from types import SimpleNamespace

import fedsa_jax as fj
from fedsa_jax import _validate, registry


def _make_problem(args, key):
    problems = registry.problems()
    if args.problem not in problems:
        raise ValueError(f"problem={args.problem!r} is invalid: expected one of {', '.join(problems)}")
    return problems[args.problem].build(key, args)


def _make_quantizer(args, dest: str = "quantizer"):
    quantizers, name = registry.quantizers(), getattr(args, dest)
    if name not in quantizers:
        raise ValueError(f"{dest}={name!r} is invalid: expected one of {', '.join(quantizers)}")
    return quantizers[name].build(args)


def _make_downlink(args) -> dict:
    """``{"downlink": channel}`` from ``--downlink-quantizer``, ``{}`` for ``none``."""
    if getattr(args, "downlink_quantizer", "none") == "none":
        return {}
    return {"downlink": fj.channel.channel(_make_quantizer(args, "downlink_quantizer"))}


def _make_privacy(args) -> dict:
    """``{"privacy": fj.channel.privacy(...)}`` from ``--clip-norm`` (and ``--noise-multiplier`` or
    ``--target-epsilon``, ``--dp-mode``, ``--delta``, ``--no-clip``, adaptive clipping's
    ``--target-quantile``, ``--clip-lr``, ``--count-noise``); ``{}`` without ``--clip-norm``."""
    C = getattr(args, "clip_norm", None)
    if C is None:
        for flag, dest, default in (
            ("--noise-multiplier", "noise_multiplier", 0.0),
            ("--target-epsilon", "target_epsilon", None),
            ("--dp-mode", "dp_mode", "central"),
            ("--delta", "delta", 1e-5),
            ("--no-clip", "no_clip", False),
            ("--target-quantile", "target_quantile", None),
            ("--clip-lr", "clip_lr", 0.2),
            ("--count-noise", "count_noise", None),
        ):
            if getattr(args, dest, default) != default:
                raise ValueError(
                    f"{flag}={getattr(args, dest)!r} is invalid: it needs --clip-norm (differential privacy)"
                )
        return {}
    sigma, target = args.noise_multiplier, args.target_epsilon
    if target is not None:
        if sigma != 0.0:
            raise ValueError(
                f"--target-epsilon={target!r} is invalid: it picks --noise-multiplier, given too"
            )
        rounds = args.rounds
        if rounds is None:  # a sweep at a total of local steps: the configuration's own rounds
            plain = SimpleNamespace(**{**vars(args), "target_epsilon": None, "noise_multiplier": 0.0})
            rounds = max(1, rounds_within(_make_algorithm(args.algorithm, plain), args.total_local_steps)[0])
        sigma = fj.accounting.noise_multiplier(
            target, rounds, args.agents, args.delta, args.dp_mode, args.clients_per_round
        )
    adaptive = {}
    if args.target_quantile is not None:
        adaptive = dict(
            target_quantile=args.target_quantile, clip_lr=args.clip_lr, count_noise=args.count_noise
        )
    elif args.clip_lr != 0.2 or args.count_noise is not None:
        raise ValueError("--clip-lr/--count-noise is invalid without --target-quantile (adaptive clipping)")
    privacy = fj.channel.privacy(sigma, C, args.dp_mode, clip=not args.no_clip, delta=args.delta, **adaptive)
    return {"privacy": privacy}


def _make_algorithm(name: str, args, option: str = "--algorithms", param_option: str = "--param"):
    """A registered algorithm from the options, or a user's ``module:factory`` called with
    ``args.params`` (and step_size / num_local_steps where its signature takes them)."""
    algorithms = registry.algorithms()
    if ":" in name:
        if args.schedule != "constant" or args.server_optimizer != "none":
            raise ValueError(
                f"--schedule/--server-optimizer is invalid with {option}={name!r}: they configure the "
                "built-in algorithms (a factory takes its own step_size and server_optimizer)"
            )
        alg = _custom_algorithm(name, getattr(args, "params", None) or {}, args, option, param_option)
    elif name not in algorithms:
        raise ValueError(f"algorithm={name!r} is invalid: expected one of {', '.join(algorithms)}")
    else:
        args = _with_local_steps(args)
        step = args.step_size
        if args.schedule == "inverse-time":
            step = fj.schedule(fj.optim.inverse_time, eta0=float(args.step_size), k0=float(args.decay_steps))
        alg = algorithms[name].build(
            step,
            args,
            quantizer=_make_quantizer(args),
            success_prob=args.success_prob,
            aggregation=args.aggregation,
            **({} if args.error_feedback == "none" else {"error_feedback": args.error_feedback}),
            **_make_downlink(args),
            **_make_privacy(args),
            server_optimizer=_make_server_optimizer(args),
        )
    if (
        getattr(args, "target_epsilon", None) is not None
        and getattr(getattr(alg, "config", None), "releases_per_round", 1) is None
    ):
        raise ValueError(
            f"--target-epsilon={args.target_epsilon!r} is invalid with {name}: its releases per round are "
            "random (a communication per local step with probability p): give --noise-multiplier"
        )
    if args.average is not None:
        alg = fj.averaged(alg, burn_in=args.average)  # pyright: ignore[reportArgumentType]
    alg = fj.richardson(alg) if args.richardson else alg  # pyright: ignore[reportArgumentType]
    if getattr(args, "bootstrap", None) is not None:
        weights = getattr(args, "bootstrap_weights", "beta")
        alg = fj.bootstrap(alg, args.bootstrap, weights=weights)  # pyright: ignore[reportArgumentType]
    if getattr(args, "plug_in", False):
        alg = fj.plug_in(alg)  # pyright: ignore[reportArgumentType]
    return alg


def local_steps(args):
    """``num_local_steps`` from the options: ``--local-steps`` H, or with ``--local-steps-growth``
    gamma > 0 the table ``H_t = ceil(H (t + 1)^gamma)`` over the run's rounds (a sweep's
    ``total_local_steps``: the rounds that fit in it)."""
    growth = float(getattr(args, "local_steps_growth", 0.0) or 0.0)
    work = getattr(args, "local_work", "none") or "none"
    if work != "none":
        if growth:
            _validate.fail("--local-work", work, "local steps growing with the round take no local work law")
        return local_work(args)
    if growth == 0.0:
        return args.local_steps
    total = getattr(args, "total_local_steps", None)
    if total is not None:
        return fj.optim.growing_local_steps(args.local_steps, growth, total_local_steps=total)
    return fj.optim.growing_local_steps(args.local_steps, growth, args.rounds)


def local_work(args):
    """The law of ``--local-work LAW:NUMBERS`` (:mod:`fedsa_jax.channel.local_work`), one count per agent or
    shared (``--local-work-shared``), plain or FedNova averaging (``--work-normalization``)."""
    shared = bool(getattr(args, "local_work_shared", False))
    norm = getattr(args, "work_normalization", "none") or "none"
    return fj.local_work.from_text(
        args.local_work, args.local_steps, shared, norm, getattr(args, "agents", None)
    )


def rounds_within(alg, total: int) -> tuple[int, int]:
    """``(rounds, H_0)``: the most rounds of ``alg`` whose local steps add up to at most ``total``,
    and its first round's local steps."""
    H = getattr(alg.config, "num_local_steps", 1)
    first = H.table[0] if isinstance(H, fj.optim.LocalSteps) else int(H)
    return fj.optim.rounds_within(H, total), first


def _with_local_steps(args):
    """``args`` with ``local_steps`` the table of :func:`local_steps` (a copy; ``args`` itself is
    left as it is)."""
    steps = local_steps(args)
    if steps is args.local_steps:
        return args
    return SimpleNamespace(**{**vars(args), "local_steps": steps})


def _make_server_optimizer(args):
    if args.server_optimizer == "none":
        for option, value, default in (
            ("--server-lr", args.server_lr, 1.0),
            ("--server-momentum", args.server_momentum, 0.0),
        ):
            if value != default:
                raise ValueError(
                    f"{option}={value!r} is invalid: it sets --server-optimizer, which is 'none'"
                )
        return None
    import optax

    lr = float(args.server_lr)
    if args.server_optimizer == "adam":
        if args.server_momentum != 0.0:
            raise ValueError(f"--server-momentum={args.server_momentum!r} is invalid: it applies to sgd")
        return fj.optimizer(optax.adam, learning_rate=lr)
    beta = float(args.server_momentum)
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"--server-momentum={beta!r} is invalid: expected a number in [0, 1)")
    if beta == 0.0:
        return fj.optimizer(optax.sgd, learning_rate=lr)
    return fj.optimizer(optax.sgd, learning_rate=lr, momentum=beta)


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _import_factory(spec: str, fail):
    """The function ``spec`` = ``package.module:function`` names, the current folder first on the
    import path (as ``python -m`` does)."""
    module_name, attr = spec.split(":")
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            fail(f"no module named {err.name!r} (looked in the current folder and on the import path)")
        fail(f"importing {module_name!r} raised {one_line(err)}")
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # the user's module failed or exited (SystemExit): say how, in one line
        fail(f"importing {module_name!r} raised {one_line(err)}")
    finally:
        if added:
            sys.path.remove(cwd)
    factory = getattr(module, attr, None)
    if factory is None:
        fail(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        fail(f"{attr!r} is a {type(factory).__name__}, expected a function returning a fedsa_jax.Algorithm")
    return factory


def factory_parameters(factory) -> tuple[list[str], bool] | None:
    """The keyword parameters of a plugin factory, and whether it takes ``**kwargs`` (None: unknown)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    names = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, takes_any


def _custom_algorithm(spec: str, params: dict, args, option: str, param_option: str):
    def fail(reason, name=option, value=spec):
        raise ValueError(f"{name}={value!r} is invalid: {reason}")

    factory = _import_factory(spec, fail)
    kwargs = dict(params)
    signature = factory_parameters(factory)
    if signature is not None:
        names, takes_any = signature
        for key, value in params.items():
            if key not in names and not takes_any:  # named as given: --param beta=0.5, or params.beta=0.5
                where, shown = (
                    ("--param", f"{key}={value}")
                    if param_option == "--param"
                    else (param_option + key, value)
                )
                fail(
                    f"{spec} takes no argument {key!r} (its arguments: {', '.join(names) or 'none'})",
                    where,
                    shown,
                )
        for key, value in (("step_size", args.step_size), ("num_local_steps", local_steps(args))):
            if key in names and key not in params:
                kwargs[key] = value
    try:
        alg = factory(**kwargs)  # pyright: ignore[reportOptionalCall]
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # SystemExit too: a factory never ends the command with its status
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        fail(f"{spec}({shown}) raised {one_line(err)}")
    if not isinstance(alg, fj.Algorithm):
        fail(f"{spec} returned a {type(alg).__name__}, expected a fedsa_jax.Algorithm")
    return alg
