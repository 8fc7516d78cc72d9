"""fedsa_jax: Monte Carlo simulation of federated linear stochastic approximation in JAX.

FedLSA, SCAFFLSA (and, through the channel, QFedTD) with agents, local steps and
independent seeds vmapped and scanned into one jitted kernel.
"""

__version__ = "0.1.0"

from fedsa_jax import channel, problems, theory
from fedsa_jax.algorithms import Algorithm, fedlsa, qfedtd, scafflsa
from fedsa_jax.result import SimulationResult, load
from fedsa_jax.simulate import simulate
from fedsa_jax.sweep import SweepEntry, grid, sweep

__all__ = [
    "Algorithm",
    "SimulationResult",
    "SweepEntry",
    "channel",
    "fedlsa",
    "grid",
    "load",
    "problems",
    "qfedtd",
    "scafflsa",
    "simulate",
    "sweep",
    "theory",
    "plotting",
]


def __getattr__(name):
    # fj.plotting imports matplotlib, so it loads on first use only.
    if name == "plotting":
        import importlib

        return importlib.import_module("fedsa_jax.plotting")
    raise AttributeError(f"module 'fedsa_jax' has no attribute {name!r}")
