"""Federated SA algorithms: one file each, written for one agent and one seed."""

from fedsa_jax.algorithms._base import Algorithm, RoundInfo
from fedsa_jax.algorithms.fedlsa import FedLSAConfig, FedLSAState, fedlsa
from fedsa_jax.algorithms.scafflsa import SCAFFLSAConfig, SCAFFLSAState, scafflsa

__all__ = [
    "Algorithm",
    "FedLSAConfig",
    "FedLSAState",
    "RoundInfo",
    "SCAFFLSAConfig",
    "SCAFFLSAState",
    "fedlsa",
    "scafflsa",
]
