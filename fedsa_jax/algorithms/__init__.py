"""Federated SA algorithms: one file each, written for one agent and one seed."""

from fedsa_jax.algorithms._base import Algorithm, LocalStepsConfig, RoundInfo
from fedsa_jax.algorithms.fedlsa import FedLSAState, fedlsa
from fedsa_jax.algorithms.qfedtd import QFedTDState, qfedtd
from fedsa_jax.algorithms.scafflsa import SCAFFLSAState, scafflsa

__all__ = [
    "Algorithm",
    "LocalStepsConfig",
    "FedLSAState",
    "QFedTDState",
    "RoundInfo",
    "SCAFFLSAState",
    "fedlsa",
    "qfedtd",
    "scafflsa",
]
