"""Command line: ``fedsa-jax run`` simulates, writes result files and a figure;
``fedsa-jax sweep CONFIG.toml`` runs a grid of configurations.

    fedsa-jax run                      # heterogeneous Garnet, FedLSA vs SCAFFLSA
    fedsa-jax run --problem gaussian --algorithms fedlsa --step-size 0.1 --local-steps 10
    fedsa-jax run --algorithms fedlsa,mymodule:fedavgm --param beta=0.9   # a user's own algorithm
    fedsa-jax run --schedule inverse-time --average 20 --server-optimizer sgd --server-momentum 0.5
    fedsa-jax sweep CONFIG.toml        # a grid of configurations, resumable
    fedsa-jax sweep CONFIG.toml --shard 3/8   # one task of a cluster job array

The sweep file's format (``[run]``, ``[grid]`` and ``[params]`` tables) is
documented with a complete example in the README ("Sweeps from a TOML file").

Nothing is lost to a bad path: every output folder is created and checked
before any simulation; errors are one line naming the option (exit status 2).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path

from fedsa_jax.cpu import XLA_FLAG

PROBLEMS = ("garnet", "gaussian", "qfedtd-mdp")
ALGORITHMS = ("fedlsa", "scafflsa", "qfedtd", "scaffnew")
SCHEDULES = ("constant", "inverse-time")
SERVER_OPTIMIZERS = ("none", "sgd", "adam")
QUANTIZERS = ("none", "stochastic-uniform", "qsgd", "rand-k", "natural")
HETEROGENEITY = ("homogeneous", "heterogeneous")
X_AXES = ("rounds", "communications", "samples", "bits_sent", "bits_delivered")  # = fedsa_jax.result.X_AXES
SEED_MAX = 2**32 - 1  # larger seeds collide in 32-bit mode (JAX keeps the low 32 bits)
_FACTORY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Parser(argparse.ArgumentParser):
    """Errors in one line, without the usage block: ``fedsa-jax run: error: argument --x: ...``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class _Help(argparse.HelpFormatter):
    """Shows a default once, where there is one to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {SEED_MAX}], got {text!r}")
    return value


def _name_or_number(text: str, names: tuple[str, ...], accept, expected: str):
    """``text`` if it is one of ``names``, else a float that ``accept`` takes."""
    if text in names:
        return text
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not accept(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _real(text: str) -> float:
    return _name_or_number(text, (), lambda v: True, "a finite real number")


def _positive_real(text: str) -> float:
    return _name_or_number(text, (), lambda v: v > 0.0, "a finite real number > 0")


def _heterogeneity(text: str):
    return _name_or_number(text, HETEROGENEITY, lambda v: 0.0 <= v <= 1.0,
                           "'homogeneous', 'heterogeneous' or a number in [0, 1]")


def _range(text: str):
    return _name_or_number(text, ("maxabs",), lambda v: v > 0.0, "'maxabs' or a number R > 0")


def _algorithm(text: str) -> str:
    name = text.strip()
    if name not in ALGORITHMS and not _FACTORY_RE.match(name):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(ALGORITHMS)} or a factory 'package.module:function', got {text!r}")
    return name


def _algorithms(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list from {', '.join(ALGORITHMS)} or 'module:factory', got {text!r}")
    try:
        return [_algorithm(n) for n in names]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list from {', '.join(ALGORITHMS)} or 'package.module:factory' entries, "
            f"got {text!r}") from None


def _param_value(text: str):
    """A JSON number, string or boolean; anything else is kept as the string given."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    ok = isinstance(value, (bool, int, str)) or (isinstance(value, float) and value == value and abs(value) != float("inf"))
    return value if ok else text


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not _PARAM_RE.match(key.strip()):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (NAME a Python identifier), got {text!r}")
    return key.strip(), _param_value(value.strip())


def _x_axis(text: str) -> str:
    return "bits_delivered" if text == "bits" else text  # 'bits': the name before the x axes matched Python's


def _shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if m is None or not int(m[1]) < int(m[2]):
        raise argparse.ArgumentTypeError(f"expected K/N with integers 0 <= K < N (e.g. 3/8), got {text!r}")
    return int(m[1]), int(m[2])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fedsa-jax",
        description="Monte Carlo simulation of federated linear stochastic approximation in JAX.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="simulate algorithms on a problem; write result files and an MSE figure",
        description="Simulate FedLSA / SCAFFLSA on a federated problem over many independent seeds. "
        "Writes result_<algorithm>.npz (arrays + config + versions), result_<algorithm>.csv, summary.json "
        "and mse.png into --out. Defaults: heterogeneous Garnet (N=10), FedLSA vs SCAFFLSA, eta=0.05, H=1000, "
        "60 rounds, 256 seeds (under a minute on 2 CPU cores).",
        formatter_class=_Help,
    )
    g = run.add_argument_group("problem")
    g.add_argument("--problem", choices=PROBLEMS, default="garnet",
                   help="garnet: Garnet MRPs (SCAFFLSA experiments); gaussian: random Gaussian LSA; "
                   "qfedtd-mdp: the QFedTD experiments' 20-state MDP")
    g.add_argument("--agents", "-N", type=_positive_int, default=10, help="number of agents N")
    g.add_argument("--heterogeneity", type=_heterogeneity, default="heterogeneous",
                   help="garnet and gaussian: 'homogeneous', 'heterogeneous' or a level in [0, 1] "
                   "(gaussian: homogeneous = 0, heterogeneous = 1)")
    g.add_argument("--states", type=_positive_int, default=None,
                   help="number of states S (garnet default 30, qfedtd-mdp default 20)")
    g.add_argument("--dim", "-d", type=_positive_int, default=None,
                   help="dimension d (garnet default 8, qfedtd-mdp 10, gaussian 5)")
    g.add_argument("--sampling", choices=("generative", "markov"), default=None,
                   help="TD observation model (garnet default generative, qfedtd-mdp default markov)")
    g.add_argument("--noise-A", type=_real, default=0.1, help="gaussian: std of A(Z) entries")
    g.add_argument("--noise-b", type=_real, default=0.5, help="gaussian: std of b(Z) entries")
    g.add_argument("--problem-seed", type=_seed, default=0, help="PRNG seed of the random problem")
    a = run.add_argument_group("algorithms")
    a.add_argument("--algorithms", "--algorithm", type=_algorithms, default="fedlsa,scafflsa",
                   help="comma-separated from fedlsa, scafflsa, qfedtd (one local step per round), or your own "
                   "algorithm as 'package.module:factory': a function returning a fedsa_jax.Algorithm, imported "
                   "with the current folder on the import path")
    a.add_argument("--param", type=_param, action="append", default=None, metavar="NAME=VALUE",
                   help="keyword argument of every 'module:factory' algorithm (repeat the option); VALUE is read "
                   "as a JSON number, string or true/false, else kept as text. A factory also gets step_size and "
                   "num_local_steps (from --step-size, --local-steps) if its signature has them and no --param "
                   "gives them")
    a.add_argument("--step-size", "--eta", type=_real, default=0.05, help="step size eta")
    a.add_argument("--local-steps", "-H", type=_positive_int, default=1000, help="local steps H per round")
    a.add_argument("--skip", type=_positive_int, default=1,
                   help="keep one observation out of SKIP (Markovian sampling)")
    a.add_argument("--comm-prob", type=_real, default=0.2,
                   help="scaffnew: probability that a local step ends with a communication")
    o = run.add_argument_group("step sizes, server optimizer, averaging (every built-in algorithm)")
    o.add_argument("--schedule", choices=SCHEDULES, default="constant",
                   help="step size of local step k = t H + h: constant eta, or inverse-time "
                   "eta / (1 + k / DECAY_STEPS) (the 1/k regime); any optax schedule from Python")
    o.add_argument("--decay-steps", type=_positive_real, default=1000.0,
                   help="inverse-time: local steps k0 over which the step size halves")
    o.add_argument("--server-optimizer", choices=SERVER_OPTIMIZERS, default="none",
                   help="optax optimizer on the server's pseudo-gradient theta_t - aggregate_t: none (plain "
                   "averaging), sgd (with --server-momentum: FedAvgM) or adam (FedAdam)")
    o.add_argument("--server-lr", type=_positive_real, default=1.0, help="server optimizer's learning rate")
    o.add_argument("--server-momentum", type=_real, default=0.0,
                   help="sgd: momentum beta in [0, 1) (0: none)")
    o.add_argument("--average", type=_nonnegative_int, default=None, metavar="BURN_IN",
                   help="report the Polyak-Ruppert average of the iterates after BURN_IN rounds "
                   "(fj.averaged); the last iterate's MSE is kept as the metric last_iterate_mse")
    o.add_argument("--richardson", action="store_true",
                   help="Richardson-Romberg: report 2 theta(eta) - theta(2 eta), both runs on the same random "
                   "numbers (fj.richardson; with --average, of the averaged iterates)")
    c = run.add_argument_group("uplink channel (every built-in algorithm)")
    c.add_argument("--quantizer", choices=QUANTIZERS, default="none",
                   help="quantizer of the uplink message (FedLSA/SCAFFLSA: the model difference; QFedTD: "
                   "the TD direction)")
    c.add_argument("--bits", type=_positive_int, default=4, help="stochastic-uniform: bits per coordinate")
    c.add_argument("--range", type=_range, default="maxabs",
                   help="stochastic-uniform: 'maxabs' (unbiased) or a fixed R > 0 (clipped, biased)")
    c.add_argument("--levels", type=_positive_int, default=4, help="qsgd: number of levels s")
    c.add_argument("--k", type=_positive_int, default=1, help="rand-k: coordinates kept")
    c.add_argument("--success-prob", "-p", type=_real, default=1.0,
                   help="probability that an uplink message is delivered (Bernoulli erasures)")
    c.add_argument("--aggregation", choices=("divide_by_n", "divide_by_received"), default="divide_by_n",
                   help="server rule: sum of delivered messages over N, or over the number received")
    s = run.add_argument_group("simulation")
    s.add_argument("--rounds", "-T", type=_positive_int, default=60, help="communication rounds T")
    s.add_argument("--seeds", type=_positive_int, default=256, help="independent runs")
    s.add_argument("--seed", type=_seed, default=1, help="PRNG seed of the runs")
    s.add_argument("--record-every", type=_positive_int, default=1, help="record statistics every K rounds")
    s.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="floating point type")
    s.add_argument("--out", type=Path, default=Path("fedsa_run"), help="output folder (created if needed)")
    s.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="write an atomic checkpoint here after each chunk; rerunning the same command resumes "
                   "(one subfolder per algorithm; other configurations may share the folder)")
    s.add_argument("--chunk-rounds", type=_positive_int, default=None,
                   help="rounds per kernel call (progress and checkpoint granularity; default: automatic)")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on a terminal only)")
    s.add_argument("--x-axis", type=_x_axis, choices=X_AXES, default="rounds",
                   help="figure's x axis: communication rounds, uplink messages, observations drawn, uplink bits "
                   "sent or delivered ('bits' means bits_delivered)")
    s.add_argument("--band", choices=("sem", "quantiles"), default="sem",
                   help="figure's band: mean +- 2 standard errors, or 5-95%% / 25-75%% quantiles over seeds")
    s.add_argument("--exact", action="store_true",
                   help="also compute the exact MSE curve (fj.theory.exact_mse; built-in algorithms on Gaussian "
                   "or generative TD problems, small N d) and draw it dotted")
    s.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    _jax_options(s)
    sw = sub.add_parser(
        "sweep",
        help="run a grid of configurations from a TOML file; finished ones are skipped on rerun",
        description="Run every configuration of a TOML grid ([run], [grid] and [params] tables: see the "
        "README). Step sizes and success probabilities of otherwise identical configurations run side "
        "by side in one compiled kernel. Each finished configuration is saved to OUT/<name>.npz at once; "
        "OUT/sweep.json indexes them and OUT/sweep.png plots their final MSE; rerunning skips what is done "
        "and recomputes damaged files.",
        formatter_class=_Help,
    )
    sw.add_argument("config", type=Path, help="the sweep's TOML file")
    sw.add_argument("--out", type=Path, default=None, help="output folder (default: [run] out)")
    sw.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                    help="run only the configurations whose index is K mod N (0 <= K < N), into the shared "
                    "output folder, e.g. one task of a cluster job array; a later run without --shard "
                    "collects them and writes sweep.json and sweep.png")
    sw.add_argument("--collect", action="store_true",
                    help="compute nothing: load the finished configurations, write sweep.json and sweep.png, "
                    "list the missing ones (exit status 1 if any)")
    sw.add_argument("--allow-plugins", action="store_true",
                    help="run the file's 'module:factory' algorithms: each is code that the sweep imports "
                    "and calls, so allow it only for a file you trust (without it such a file is refused)")
    sw.add_argument("--max-grid", type=_positive_int, default=None, metavar="N",
                    help="refuse grids of more than N configurations (default: fedsa_jax.sweep.MAX_GRID)")
    sw.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars (default: on a terminal only)")
    sw.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    _jax_options(sw)
    return parser


def _jax_options(group) -> None:
    group.add_argument("--cpu-devices", type=_positive_int, default=None, metavar="N",
                       help="JAX CPU devices the seeds are sharded over, 1 to the cores this process may use "
                       "(default: one per core, faster than JAX's single multi-threaded device; 1 restores that "
                       f"device). An explicit XLA_FLAGS=--{XLA_FLAG}=N or JAX_NUM_CPU_DEVICES wins. No effect on GPUs")
    group.add_argument("--no-compile-cache", action="store_true",
                       help="do not keep compiled kernels on disk (default: kept in "
                       "$XDG_CACHE_HOME/fedsa_jax/jax_compile_cache, ~/.cache without XDG_CACHE_HOME, so a "
                       "repeated run does not compile again; FEDSA_JAX_COMPILE_CACHE=off disables it too, "
                       "FEDSA_JAX_COMPILE_CACHE=FOLDER moves it)")


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


def _make_problem(args, key):
    import fedsa_jax as fj

    dtype = args.dtype
    het = args.heterogeneity
    if args.problem == "garnet":
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
    level = {"homogeneous": 0.0, "heterogeneous": 1.0}.get(het, het)
    return fj.problems.random_gaussian_lsa(
        key, num_agents=args.agents, dim=args.dim or 5, heterogeneity=level,
        noise_A=args.noise_A, noise_b=args.noise_b, dtype=dtype,
    )


def _make_quantizer(args):
    import fedsa_jax as fj

    if args.quantizer == "none":
        return None
    if args.quantizer == "stochastic-uniform":
        return fj.channel.stochastic_uniform(args.bits, range=args.range)
    if args.quantizer == "qsgd":
        return fj.channel.qsgd(args.levels)
    if args.quantizer == "rand-k":
        return fj.channel.rand_k(args.k)
    if args.quantizer == "natural":
        return fj.channel.natural()
    raise ValueError(f"quantizer={args.quantizer!r} is invalid: expected one of {', '.join(QUANTIZERS)}")


def _make_algorithm(name: str, args, option: str = "--algorithms", param_option: str = "--param"):
    """A built-in algorithm from the options, or a user's ``module:factory`` called with
    ``args.params`` (and step_size / num_local_steps where its signature takes them)."""
    import fedsa_jax as fj

    if ":" in name:
        if args.schedule != "constant" or args.server_optimizer != "none":
            raise ValueError(f"--schedule/--server-optimizer is invalid with {option}={name!r}: they configure the "
                             "built-in algorithms (a factory takes its own step_size and server_optimizer)")
        alg = _custom_algorithm(name, getattr(args, "params", None) or {}, args, option, param_option)
    elif name not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is invalid: expected one of {', '.join(ALGORITHMS)}")
    else:
        step = args.step_size
        if args.schedule == "inverse-time":
            step = fj.schedule(fj.optim.inverse_time, eta0=float(args.step_size), k0=float(args.decay_steps))
        kwargs = dict(quantizer=_make_quantizer(args), success_prob=args.success_prob,
                      aggregation=args.aggregation, server_optimizer=_make_server_optimizer(args))
        if name == "qfedtd":
            alg = fj.qfedtd(step, **kwargs)
        elif name == "scaffnew":
            alg = fj.scaffnew(step, args.comm_prob, args.local_steps, skip=args.skip, **kwargs)
        else:
            alg = getattr(fj, name)(step, args.local_steps, skip=args.skip, **kwargs)
    if args.average is not None:
        alg = fj.averaged(alg, burn_in=args.average)
    return fj.richardson(alg) if args.richardson else alg


def _make_server_optimizer(args):
    import fedsa_jax as fj

    if args.server_optimizer == "none":
        for option, value, default in (("--server-lr", args.server_lr, 1.0),
                                       ("--server-momentum", args.server_momentum, 0.0)):
            if value != default:
                raise ValueError(f"{option}={value!r} is invalid: it sets --server-optimizer, which is 'none'")
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


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _custom_algorithm(spec: str, params: dict, args, option: str, param_option: str):
    import fedsa_jax as fj

    def fail(reason, name=option, value=spec):
        raise ValueError(f"{name}={value!r} is invalid: {reason}")

    module_name, attr = spec.split(":")
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:  # as `python -m` does: the current folder first on the import path
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            fail(f"no module named {err.name!r} (looked in the current folder and on the import path)")
        fail(f"importing {module_name!r} raised {_one_line(err)}")
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # the user's module failed or exited (SystemExit): say how, in one line
        fail(f"importing {module_name!r} raised {_one_line(err)}")
    finally:
        if added:
            sys.path.remove(cwd)
    factory = getattr(module, attr, None)
    if factory is None:
        fail(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        fail(f"{attr!r} is a {type(factory).__name__}, expected a function returning a fedsa_jax.Algorithm")
    kwargs = dict(params)
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        names = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key, value in params.items():
            if key not in names and not takes_any:  # named as given: --param beta=0.5, or params.beta=0.5
                where, shown = ("--param", f"{key}={value}") if param_option == "--param" else (param_option + key, value)
                fail(f"{spec} takes no argument {key!r} (its arguments: {', '.join(names) or 'none'})", where, shown)
        for key, value in (("step_size", args.step_size), ("num_local_steps", args.local_steps)):
            if key in names and key not in params:
                kwargs[key] = value
    try:
        alg = factory(**kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # SystemExit too: a factory never ends the command with its status
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        fail(f"{spec}({shown}) raised {_one_line(err)}")
    if not isinstance(alg, fj.Algorithm):
        fail(f"{spec} returned a {type(alg).__name__}, expected a fedsa_jax.Algorithm")
    return alg


def _num_local_steps(alg) -> int:
    return int(getattr(alg.config, "num_local_steps", 1))


class _CompileTimer:
    """Wall time JAX spends tracing, lowering and compiling (the union of those events' spans),
    so that throughput can be reported warm, without compilation."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __enter__(self):
        import jax.monitoring as monitoring

        self.spans: list[tuple[float, float]] = []
        self._monitoring = monitoring
        self._spans = hasattr(monitoring, "register_event_time_span_listener")
        if self._spans:
            monitoring.register_event_time_span_listener(self._record)
        else:  # older JAX: durations only (nested events may count twice)
            monitoring.register_event_duration_secs_listener(self._record_duration)
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
            self._monitoring.unregister_event_time_span_listener(self._record)
        else:
            self._monitoring.unregister_event_duration_listener(self._record_duration)

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
    itself (a resumed run counts only the rounds it ran)."""
    execution = res.config["execution"]
    steps = int(execution.get("seed_rounds_run", 0)) * problem.num_agents * _num_local_steps(alg)
    warm = seconds - compile_s
    return {
        "seconds": seconds,
        "compile_s": compile_s,
        "agent_steps_run": steps,
        "agent_steps_per_s": steps / warm if steps and warm > 0 else None,
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
    return text


def _prepare_outputs(pairs) -> None:
    from fedsa_jax._io import prepare_dir

    for option, path in pairs:
        if path is not None:
            prepare_dir(path, option)


# The library's name of a parameter -> the run option (argparse dest) that sets it.
LIBRARY_OPTIONS = {
    "num_agents": "agents", "num_states": "states", "dim": "dim", "heterogeneity": "heterogeneity",
    "noise_A": "noise_A", "noise_b": "noise_b", "sampling": "sampling", "dtype": "dtype",
    "step_size": "step_size", "eta0": "step_size", "k0": "decay_steps", "num_local_steps": "local_steps",
    "skip": "skip", "comm_prob": "comm_prob", "learning_rate": "server_lr", "momentum": "server_momentum",
    "burn_in": "average", "bits": "bits", "range": "range", "levels": "levels", "k": "k",
    "success_prob": "success_prob", "aggregation": "aggregation", "num_rounds": "rounds",
    "num_seeds": "seeds", "record_every": "record_every", "chunk_rounds": "chunk_rounds",
    "checkpoint_dir": "checkpoint_dir",
}
_INVALID_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)=(.*?) is invalid: (.*)$", re.DOTALL)


def _as_option(text: str, args, option_of) -> str:
    """A library error ``name=value is invalid: ...`` reported under the option that set ``name``
    (``option_of(dest)``: its spelling, or None where no option of this command set it); the value
    shown is the option's (the library's where the option was left to its per-problem default)."""
    m = _INVALID_RE.match(text)
    if m is None:
        return text
    name, shown, reason = m.groups()
    key = name if name in LIBRARY_OPTIONS else name.rsplit(".", 1)[-1]
    params = getattr(args, "params", None) or {}
    if key in params:  # a module:factory keyword given with --param / [params]
        return text
    dest = LIBRARY_OPTIONS.get(key)
    option = None if dest is None else option_of(dest)
    if option is None:
        return text
    value = getattr(args, dest, None)
    where = f"{option}={value!r}" if value is not None else \
        f"{option}={shown} (its default with --problem {args.problem})" if dest in ("states", "dim") else \
        f"{option}={shown}"
    decay = option_of("decay_steps")
    if dest == "step_size" and getattr(args, "schedule", "constant") != "constant" and decay is not None:
        where += f" with {decay}={args.decay_steps!r}"
    return f"{where} is invalid: {reason}"


def _run_option(dest: str) -> str | None:
    action = _run_actions().get(dest)
    return None if action is None else action.option_strings[0]


def _options_checked(command):
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


def _check_applicable(args) -> None:
    """Refuse an option set (to anything but its default) where nothing in this run reads it:
    ``--bits`` without the stochastic-uniform quantizer, ``--local-steps`` with QFedTD alone, ..."""
    builtin = [n for n in args.algorithms if n in ALGORITHMS]
    stepping = [n for n in args.algorithms if n != "qfedtd"]  # a factory may take num_local_steps
    quantizer, schedule = f"--quantizer {args.quantizer}", f"--schedule {args.schedule}"
    problem, algorithms = f"--problem {args.problem}", f"--algorithms {','.join(args.algorithms)}"
    uniform = args.quantizer == "stochastic-uniform"
    table = [  # (dest, read by, whether this run reads it, what this run has)
        ("bits", "--quantizer stochastic-uniform", uniform, quantizer),
        ("range", "--quantizer stochastic-uniform", uniform, quantizer),
        ("levels", "--quantizer qsgd", args.quantizer == "qsgd", quantizer),
        ("k", "--quantizer rand-k", args.quantizer == "rand-k", quantizer),
        ("decay_steps", "--schedule inverse-time", args.schedule == "inverse-time", schedule),
        ("noise_A", "--problem gaussian", args.problem == "gaussian", problem),
        ("noise_b", "--problem gaussian", args.problem == "gaussian", problem),
        ("states", "--problem garnet or qfedtd-mdp", args.problem != "gaussian", problem),
        ("sampling", "--problem garnet or qfedtd-mdp", args.problem != "gaussian", problem),
        ("heterogeneity", "--problem garnet or gaussian", args.problem != "qfedtd-mdp", problem),
        ("comm_prob", "the algorithm scaffnew", "scaffnew" in builtin, algorithms),
        ("local_steps", "algorithms with local steps (qfedtd takes one step per round)", bool(stepping),
         algorithms),
        ("skip", "fedlsa, scafflsa and scaffnew", any(n != "qfedtd" for n in builtin), algorithms),
    ]
    table += [(dest, "the built-in algorithms (a factory builds its own channel)", bool(builtin), algorithms)
              for dest in ("quantizer", "success_prob", "aggregation")]
    actions = _run_actions()
    for dest, read_by, read, has in table:
        value = getattr(args, dest)
        if not read and value != actions[dest].default:
            option = actions[dest].option_strings[0]
            raise ValueError(f"{option}={value!r} is invalid: it is read only with {read_by}, and this run "
                             f"has {has}; drop {option}")


@_options_checked
def cmd_run(args) -> int:
    _prepare_outputs([("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir)])
    import jax

    _prepare_jax(args, args.dtype)
    import numpy as np

    import fedsa_jax as fj
    from fedsa_jax._io import atomic_write, write_json
    from fedsa_jax._paths import safe_name

    args.params = dict(args.param or [])
    if args.params and not any(":" in name for name in args.algorithms):
        raise ValueError("--param is invalid: it applies to 'module:factory' algorithms only, and --algorithms "
                         f"has none ({','.join(args.algorithms)})")
    problem = _make_problem(args, jax.random.key(args.problem_seed))
    algs = [_make_algorithm(name, args) for name in args.algorithms]
    names = [safe_name(alg.name) for alg in algs]
    if len(set(names)) < len(names):
        raise ValueError(f"--algorithms={','.join(args.algorithms)!r} is invalid: two algorithms are named "
                         f"{max(names, key=names.count)!r} (results are named after the algorithm)")
    builtin = [alg for spec, alg in zip(args.algorithms, algs) if spec in ALGORITHMS]
    if builtin and (args.quantizer != "none" or args.success_prob != 1.0):
        print(f"uplink channel: {json.dumps(builtin[0].config.channel.describe())}")
    out: Path = args.out
    print(f"problem: {json.dumps(problem.describe())}")
    results, summary = {}, {"problem": problem.describe(), "runs": {}}
    for alg, file_name in zip(algs, names):
        with _CompileTimer() as timer:
            t0 = time.perf_counter()
            res = fj.simulate(
                jax.random.key(args.seed), problem, alg, args.rounds, args.seeds,
                record_every=min(args.record_every, args.rounds), chunk_rounds=args.chunk_rounds,
                checkpoint_dir=None if args.checkpoint_dir is None else args.checkpoint_dir / file_name,
                progress=args.progress, quantiles=True if args.band == "quantiles" else None,
                metrics=["last_iterate_mse"] if args.average is not None else None,
            )
            seconds = time.perf_counter() - t0
        timing = _timing(res, seconds, timer.seconds, problem, alg)
        path = out / f"result_{file_name}.npz"
        res.save(path)
        res.to_csv(out / f"result_{file_name}.csv")
        results[alg.name] = res
        summary["runs"][alg.name] = {
            "file": path.name,
            "final_mse": float(res.mse_mean[-1]),
            "final_mse_sem": float(res.mse_sem[-1]),
            "num_diverged": int(res.num_diverged[-1]),
            "bits_sent": float(res.bits_sent[-1]),
            "bits_delivered": float(res.bits_delivered[-1]),
            **timing,
            "config": res.config["algorithm"],
        }
        print(f"{alg.name:9s} final MSE {res.mse_mean[-1]:.4g} +- {res.mse_sem[-1]:.2g} (s.e.), "
              f"{int(res.num_diverged[-1])} diverged, {_describe_timing(timing, args.rounds)} -> {path}")
    lines = {}
    if "fedlsa" in args.algorithms and args.schedule == "constant":
        bias = fj.theory.fedlsa_bias(problem, args.step_size, args.local_steps)
        level = float(np.sum(bias**2))
        summary["fedlsa_predicted_squared_bias"] = level
        lines[r"FedLSA predicted $\|\mathrm{bias}\|^2$"] = level
        print(f"FedLSA predicted squared bias |theta_inf - theta_star|^2 = {level:.4g}")
    exact = {}
    if args.exact:
        for spec, alg in zip(args.algorithms, algs):
            if spec not in ALGORITHMS:
                print(f"fedsa-jax: no exact curve for {alg.name}: fj.theory.exact_mse covers the built-in "
                      "algorithms", file=sys.stderr)
                continue
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
        if args.schedule != "constant":
            title = title.replace(rf"$\eta$={args.step_size:g}", rf"$\eta_k$={args.step_size:g}/(1+k/{args.decay_steps:g})")
        if any(alg.name != "qfedtd" for alg in algs):
            title += f", H={args.local_steps}"
        if args.server_optimizer != "none":
            title += f", server {args.server_optimizer} lr={args.server_lr:g}"
            title += f" momentum={args.server_momentum:g}" if args.server_momentum else ""
        if args.average is not None:
            title += f", averaged after {args.average}"
        if args.quantizer != "none":
            title += f", {args.quantizer}"
            title += f" {args.bits} bits" if args.quantizer == "stochastic-uniform" else ""
        if args.success_prob != 1.0:
            title += f", p={args.success_prob:g}"
        fig = plot_mse(results, reference_lines=lines, title=title, x=args.x_axis, band=args.band, theory=exact)

        atomic_write(out / "mse.png", lambda f: fig.savefig(f, format="png"))
        print(f"figure -> {out / 'mse.png'}")
    write_json(out / "summary.json", summary)
    return 0


RUN_KEYS = {"seeds": 64, "seed": 1, "rounds": None, "total_local_steps": None, "record_every": None,
            "records": None, "dtype": "float32", "out": "fedsa_sweep", "figure_x": None}
# run options that are not grid axes (they are [run] keys, or concern one run's files)
NOT_GRID = {"algorithms", "param", "rounds", "seeds", "seed", "record_every", "dtype", "out", "no_plot", "x_axis",
            "checkpoint_dir", "chunk_rounds", "progress", "band", "exact", "help", "richardson", "cpu_devices",
            "no_compile_cache"}
PROBLEM_KEYS = ("problem", "agents", "heterogeneity", "states", "dim", "sampling", "noise_A", "noise_b",
                "problem_seed", "dtype")


def _run_actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices["run"]._actions}


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
        raise ValueError(f"{where}={value!r} is invalid: expected one of {', '.join(repr(c) for c in choices)}")
    return converted


def _table(spec: dict, name: str) -> dict:
    table = spec.get(name, {})
    if not isinstance(table, dict):
        raise ValueError(f"{name}={table!r} is invalid: expected a table [{name}]")
    return table


def _sweep_spec(path: Path):
    """Parse and check a sweep file: (run options, grid axes, defaults of the run options)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    try:
        spec = tomllib.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"config={str(path)!r} is invalid: {_one_line(err)}") from None
    unknown = set(spec) - {"run", "grid", "params"}
    if unknown or "grid" not in spec:
        raise ValueError(f"config={str(path)!r} is invalid: expected tables [run], [grid] and optionally "
                         f"[params], got {sorted(spec)}")
    given_run, given_grid, given_params = (_table(spec, name) for name in ("run", "grid", "params"))
    bad = set(given_run) - set(RUN_KEYS)
    if bad:
        raise ValueError(f"run.{sorted(bad)[0]} is invalid: expected one of {', '.join(sorted(RUN_KEYS))}")
    actions = _run_actions()
    run = dict(RUN_KEYS)
    for key, value in given_run.items():
        if key in ("total_local_steps", "records"):
            run[key] = _check_value(f"run.{key}", value, _positive_int)
        elif key in ("out", "figure_x"):
            if not isinstance(value, str) or not value:
                raise ValueError(f"run.{key}={value!r} is invalid: expected a non-empty string")
            run[key] = value
        else:
            run[key] = _check_value(f"run.{key}", value, actions[key].type, actions[key].choices)
    if (run["rounds"] is None) == (run["total_local_steps"] is None):
        raise ValueError("run.rounds is invalid: give exactly one of rounds and total_local_steps")
    allowed = (set(actions) - NOT_GRID) | {"algorithm"}
    grid = {}
    for key, values in given_grid.items():
        if key not in allowed:
            raise ValueError(f"grid.{key} is invalid: expected one of {', '.join(sorted(allowed))}")
        action = actions.get(key)
        convert, choices = (_algorithm, None) if key == "algorithm" else (action.type, action.choices)
        items = values if isinstance(values, list) else [values]
        if not items:
            raise ValueError(f"grid.{key}=[] is invalid: expected a value or a non-empty list of values")
        checked = [_check_value(f"grid.{key}", v, convert, choices) for v in items]
        grid[key] = checked if isinstance(values, list) else checked[0]
    algorithms = grid.get("algorithm", "fedlsa")
    custom = [a for a in (algorithms if isinstance(algorithms, list) else [algorithms]) if ":" in a]
    if given_params and not custom:
        raise ValueError("params is invalid: [params] applies to 'module:factory' algorithms only, and "
                         "grid.algorithm has none")
    for key, values in given_params.items():
        items = values if isinstance(values, list) else [values]
        if not _PARAM_RE.match(key):
            raise ValueError(f"params.{key} is invalid: expected a Python identifier")
        if not items or not all(isinstance(v, (bool, int, float, str)) for v in items):
            raise ValueError(f"params.{key}={values!r} is invalid: expected a number, string or boolean, "
                             "or a non-empty list of them")
        grid[f"params.{key}"] = values
    if run["figure_x"] is not None and run["figure_x"] not in grid:
        raise ValueError(f"run.figure_x={run['figure_x']!r} is invalid: expected one of the grid's keys "
                         f"({', '.join(grid)})")
    defaults = vars(build_parser().parse_args(["run"]))
    return run, grid, defaults


def _check_plugins(grid: dict, allowed: bool) -> None:
    """A sweep file naming a 'module:factory' algorithm runs code: only with --allow-plugins."""
    algorithms = grid.get("algorithm", "fedlsa")
    for name in algorithms if isinstance(algorithms, list) else [algorithms]:
        if ":" in name and not allowed:
            raise ValueError(f"grid.algorithm={name!r} is invalid: a 'module:factory' algorithm is code "
                             "that the sweep imports and calls; pass --allow-plugins if you trust this file")


def _sweep_configs(grid: dict, limit: int | None) -> list[dict]:
    """The grid's configurations (at most ``limit``, default ``fedsa_jax.sweep.MAX_GRID``); a built-in
    algorithm ignores [params], so it appears once."""
    from fedsa_jax import _sweep as sweep

    configs, seen = [], set()
    for config in sweep._grid(grid, sweep.MAX_GRID if limit is None else limit):
        if ":" not in config.get("algorithm", "fedlsa"):
            config = {k: v for k, v in config.items() if not k.startswith("params.")}
        key = json.dumps(config, sort_keys=True)
        if key not in seen:
            seen.add(key)
            configs.append(config)
    return configs


def cmd_sweep(args) -> int:
    from types import SimpleNamespace

    run, grid_axes, defaults = _sweep_spec(args.config)
    _check_plugins(grid_axes, args.allow_plugins)
    out = args.out or Path(run["out"])
    _prepare_outputs([("--out" if args.out else "run.out", out)])
    import jax

    _prepare_jax(args, run["dtype"])
    import fedsa_jax as fj
    from fedsa_jax._sweep import config_name

    configs = _sweep_configs(grid_axes, args.max_grid)

    def options(config):
        merged = {**defaults, "dtype": run["dtype"], **{k: v for k, v in config.items() if "." not in k}}
        merged["algorithm"] = config.get("algorithm", "fedlsa")
        merged["params"] = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("params.")}
        return SimpleNamespace(**merged)

    problems = {}

    def build(config):
        o = options(config)
        try:
            items = tuple((k, getattr(o, k)) for k in PROBLEM_KEYS)
            if items not in problems:
                problems[items] = _make_problem(o, jax.random.key(o.problem_seed))
            return problems[items], _make_algorithm(o.algorithm, o, "grid.algorithm", "params.")
        except ValueError as err:  # named after the grid key that set the parameter, where one did
            key = lambda dest: f"grid.{dest}" if dest in config else None  # noqa: E731
            raise ValueError(_as_option(str(err), o, key)) from None

    def rounds(config):
        if run["rounds"] is not None:
            return int(run["rounds"])
        total, H = int(run["total_local_steps"]), _num_local_steps(build(config)[1])
        if total < H:  # a round is H local steps: fewer cannot be run
            raise ValueError(f"run.total_local_steps={total} is invalid: configuration {config_name(config)} "
                             f"has H = {H} local steps per round; expected total_local_steps >= H (rounds = "
                             "total_local_steps // H)")
        return total // H

    def record_every(config):
        if run["record_every"] is not None:
            return min(int(run["record_every"]), rounds(config))
        return max(1, rounds(config) // int(run["records"] or rounds(config)))

    t0 = time.perf_counter()
    entries = fj.sweep(jax.random.key(int(run["seed"])), configs, build, rounds, int(run["seeds"]),
                       out_dir=out, record_every=record_every, progress=args.progress,
                       shard=args.shard, compute=not args.collect)
    for e in entries:
        if e.result is None:
            print(f"{config_name(e.config)}: missing")
            continue
        state = {"loaded": "loaded", "recomputed": f"damaged file recomputed, {e.seconds:.1f} s"}.get(
            e.status, f"{e.seconds:.1f} s")
        print(f"{config_name(e.config)}: final MSE {e.result.mse_mean[-1]:.4g} "
              f"+- {e.result.mse_sem[-1]:.2g} ({state})")
    seconds = time.perf_counter() - t0
    if args.shard is not None:
        k, n = args.shard
        print(f"shard {k}/{n}: {len(entries)} of {len(configs)} configurations in {seconds:.1f} s -> {out}; "
              f"run without --shard (or with --collect) when all shards are done for sweep.json and sweep.png")
        return 0
    finished = [e for e in entries if e.result is not None]
    if not args.no_plot and finished:
        import matplotlib

        matplotlib.use("Agg")
        from fedsa_jax._io import atomic_write
        from fedsa_jax.plotting import plot_sweep

        fig = plot_sweep(finished, x=run["figure_x"], title=args.config.stem)
        atomic_write(out / "sweep.png", lambda f: fig.savefig(f, format="png"))
    print(f"{len(finished)} of {len(configs)} configurations in {seconds:.1f} s -> {out / 'sweep.json'}")
    missing = len(entries) - len(finished)
    if missing:
        print(f"{missing} configurations missing: run without --collect to compute them", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = {"run": cmd_run, "sweep": cmd_sweep}[args.command]
    shown = warnings.showwarning

    def one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"fedsa-jax: warning: {' '.join(str(message).split())}", file=sys.stderr)

    warnings.showwarning = one_line_warning  # warnings (diverged seeds, damaged files) in one line
    try:
        return command(args)
    except ValueError as err:
        print(f"fedsa-jax: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:  # a folder that became unwritable during the run, a full disk
        print(f"fedsa-jax: error: {err.strerror or err}: {err.filename or ''}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
