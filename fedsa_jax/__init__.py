"""fedsa_jax: Monte Carlo simulation of federated linear stochastic approximation in JAX.

FedLSA, SCAFFLSA, Scaffnew (and, through the channel, QFedTD) with agents, local steps and
independent seeds vmapped and scanned into one jitted kernel; step-size schedules, server
optimizers (optax), Polyak-Ruppert averaging and Richardson-Romberg extrapolation on top.

On a CPU, call :func:`use_cpu_cores` right after ``import fedsa_jax`` (before any JAX
computation): JAX then has one CPU device per core and ``simulate`` shards its seeds over
them (1.05x for Gaussian LSA to 1.6x for TD on 2 cores, against JAX's single multi-threaded
device). Importing the package never changes JAX's configuration.
"""

from typing import TYPE_CHECKING

from fedsa_jax._version import __version__ as __version__

# name -> the module it comes from; each loads on first use (``import fedsa_jax`` itself imports
# neither JAX nor matplotlib, so the command line's --help is instant); a submodule is its own entry
_PUBLIC = {
    "Algorithm": "fedsa_jax.algorithms",
    "Comparison": "fedsa_jax._runtime.compare",
    "Difference": "fedsa_jax._runtime.compare",
    "Execution": "fedsa_jax._runtime.options",
    "MetricStats": "fedsa_jax.result",
    "Record": "fedsa_jax._runtime.options",
    "Recording": "fedsa_jax._runtime.options",
    "RoundInfo": "fedsa_jax.algorithms",
    "SimulationResult": "fedsa_jax.result",
    "SweepEntry": "fedsa_jax._runtime.sweep",
    "Until": "fedsa_jax._runtime.options",
    "accounting": None,
    "algorithms": None,
    "averaged": "fedsa_jax.algorithms",
    "bootstrap": "fedsa_jax.algorithms",
    "channel": None,
    "clock": None,
    "compare": "fedsa_jax._runtime.compare",
    "delays": None,
    "fedbuff": "fedsa_jax.algorithms",
    "fedlsa": "fedsa_jax.algorithms",
    "grid": "fedsa_jax._runtime.sweep",
    "importance_averaging": "fedsa_jax.algorithms",
    "growing_local_steps": "fedsa_jax.optim",
    "inference": None,
    "load": "fedsa_jax.result",
    "local_steps": "fedsa_jax.optim",
    "local_work": None,
    "metrics": None,
    "optim": None,
    "optimizer": "fedsa_jax.optim",
    "plug_in": "fedsa_jax.algorithms",
    "problems": None,
    "qfedtd": "fedsa_jax.algorithms",
    "richardson": "fedsa_jax.algorithms",
    "scafflsa": "fedsa_jax.algorithms",
    "scaffnew": "fedsa_jax.algorithms",
    "schedule": "fedsa_jax.optim",
    "simulate": "fedsa_jax._runtime.driver",
    "stats": None,
    "sweep": "fedsa_jax._runtime.sweep",
    "theory": None,
    "until": "fedsa_jax._runtime.options",
    "use_cpu_cores": "fedsa_jax.cpu",
    "plotting": None,
}
# the mechanisms' modules live in the channel package; fj.delays is fedsa_jax.channel.delays
_MODULES = {name: f"fedsa_jax.channel.{name}" for name in ("accounting", "clock", "delays", "local_work")}
__all__ = [
    "Algorithm",
    "Comparison",
    "Difference",
    "Execution",
    "MetricStats",
    "Record",
    "Recording",
    "RoundInfo",
    "SimulationResult",
    "SweepEntry",
    "Until",
    "accounting",
    "algorithms",
    "averaged",
    "bootstrap",
    "channel",
    "clock",
    "compare",
    "delays",
    "fedbuff",
    "fedlsa",
    "grid",
    "growing_local_steps",
    "importance_averaging",
    "inference",
    "load",
    "local_steps",
    "local_work",
    "metrics",
    "optim",
    "optimizer",
    "plug_in",
    "problems",
    "qfedtd",
    "richardson",
    "scafflsa",
    "scaffnew",
    "schedule",
    "simulate",
    "stats",
    "sweep",
    "theory",
    "until",
    "use_cpu_cores",
    "plotting",
]

if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported
    from fedsa_jax import (
        algorithms,
        channel,
        inference,
        metrics,
        optim,
        plotting,
        problems,
        stats,
        theory,
    )
    from fedsa_jax._runtime.compare import Comparison, Difference, compare
    from fedsa_jax._runtime.driver import simulate
    from fedsa_jax._runtime.options import Execution, Record, Recording, Until, until
    from fedsa_jax._runtime.sweep import SweepEntry, grid, sweep
    from fedsa_jax.algorithms import (
        Algorithm,
        RoundInfo,
        averaged,
        bootstrap,
        fedbuff,
        fedlsa,
        importance_averaging,
        plug_in,
        qfedtd,
        richardson,
        scafflsa,
        scaffnew,
    )
    from fedsa_jax.channel import accounting, clock, delays, local_work
    from fedsa_jax.cpu import use_cpu_cores
    from fedsa_jax.optim import growing_local_steps, local_steps, optimizer, schedule
    from fedsa_jax.result import MetricStats, SimulationResult, load


def __getattr__(name: str):
    import importlib

    if name not in _PUBLIC:
        raise AttributeError(f"module 'fedsa_jax' has no attribute {name!r}")
    source = _PUBLIC[name]
    value = (
        importlib.import_module(_MODULES.get(name, f"fedsa_jax.{name}"))
        if source is None
        else getattr(importlib.import_module(source), name)
    )
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
