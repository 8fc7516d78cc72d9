"""Federated SA algorithms, one file each, written for one agent and one seed, and the public
building blocks to write your own (see :class:`Algorithm` and ``docs/write-your-own/algorithm.md``)."""

from fedsa_jax.algorithms._base import (
    Algorithm,
    LocalStepsConfig,
    RoundInfo,
    RoundRandomness,
    control_variate_update,
    describe_value,
    init_samplers,
    initial_theta,
    local_updates,
    observations_per_step,
    observed_updates,
    round_info,
    run_agents,
    server_update,
)
from fedsa_jax.algorithms.averaged import (
    AveragedState,
    RichardsonState,
    averaged,
    richardson,
    scale_step_size,
    with_step_size,
)
from fedsa_jax.algorithms.bootstrap import WEIGHT_LAWS, BootstrapState, bootstrap, replicate_weights
from fedsa_jax.algorithms.fedbuff import FedBuffState, fedbuff
from fedsa_jax.algorithms.fedlsa import FedLSAState, fedlsa
from fedsa_jax.algorithms.importance_averaging import ImportanceAveragingState, importance_averaging
from fedsa_jax.algorithms.plug_in import PlugInMoments, PlugInState, lyapunov, plug_in
from fedsa_jax.algorithms.qfedtd import QFedTDState, qfedtd
from fedsa_jax.algorithms.scafflsa import SCAFFLSAState, scafflsa
from fedsa_jax.algorithms.scaffnew import ScaffnewConfig, ScaffnewState, scaffnew

__all__ = [
    "Algorithm",
    "AveragedState",
    "BootstrapState",
    "RichardsonState",
    "WEIGHT_LAWS",
    "averaged",
    "bootstrap",
    "richardson",
    "scale_step_size",
    "FedBuffState",
    "FedLSAState",
    "LocalStepsConfig",
    "QFedTDState",
    "RoundInfo",
    "RoundRandomness",
    "SCAFFLSAState",
    "ScaffnewConfig",
    "ScaffnewState",
    "control_variate_update",
    "describe_value",
    "fedbuff",
    "fedlsa",
    "ImportanceAveragingState",
    "importance_averaging",
    "init_samplers",
    "initial_theta",
    "local_updates",
    "observations_per_step",
    "observed_updates",
    "PlugInMoments",
    "PlugInState",
    "lyapunov",
    "plug_in",
    "qfedtd",
    "replicate_weights",
    "round_info",
    "run_agents",
    "scafflsa",
    "scaffnew",
    "server_update",
    "with_step_size",
]
