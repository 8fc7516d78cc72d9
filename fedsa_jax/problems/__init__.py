"""Federated SA problems: the protocol every problem follows, the built-in families
(Gaussian LSA, federated TD(0), least squares, federated SARSA and Q-learning, federated TD(0) on
gymnax's classic control, the noise-free version of any problem) and the pieces for writing a new
one, linear features of a continuous observation included."""

from fedsa_jax.problems import environments, features
from fedsa_jax.problems._base import alias_draw, alias_tables, fixed_points
from fedsa_jax.problems.classic_control import ClassicControlTD, classic_control_td
from fedsa_jax.problems.classic_sarsa import ClassicControlSARSA, classic_control_sarsa
from fedsa_jax.problems.environments import LinearPolicy, agent_env_params
from fedsa_jax.problems.features import fourier_basis, radial_basis, state_action, tile_coding
from fedsa_jax.problems.federated_q_learning import (
    QLearning,
    QLearningMeanField,
    maze_q_learning,
    optimal_q,
    q_learning,
    two_state_q_learning,
)
from fedsa_jax.problems.federated_sarsa import (
    FederatedSARSA,
    SARSAMeanField,
    garnet_control,
    garnet_control_mdp,
    sarsa,
)
from fedsa_jax.problems.gaussian import GaussianLSA, gaussian_lsa, random_gaussian_lsa
from fedsa_jax.problems.generators import garnet, qfedtd_mdp
from fedsa_jax.problems.mean_path import ExpectedProblem, expected
from fedsa_jax.problems.protocol import (
    FiniteSupport,
    Problem,
    check_linear,
    direction_second_moment,
    follows_iterate,
    missing_members,
)
from fedsa_jax.problems.regression import LeastSquares, least_squares
from fedsa_jax.problems.td import FederatedTD, federated_td

__all__ = [
    "ClassicControlSARSA",
    "ClassicControlTD",
    "ExpectedProblem",
    "FederatedSARSA",
    "FederatedTD",
    "FiniteSupport",
    "GaussianLSA",
    "LeastSquares",
    "LinearPolicy",
    "Problem",
    "QLearning",
    "QLearningMeanField",
    "SARSAMeanField",
    "agent_env_params",
    "alias_draw",
    "alias_tables",
    "check_linear",
    "classic_control_sarsa",
    "classic_control_td",
    "direction_second_moment",
    "environments",
    "expected",
    "features",
    "federated_td",
    "fixed_points",
    "follows_iterate",
    "fourier_basis",
    "garnet",
    "garnet_control",
    "garnet_control_mdp",
    "gaussian_lsa",
    "least_squares",
    "maze_q_learning",
    "missing_members",
    "optimal_q",
    "q_learning",
    "qfedtd_mdp",
    "radial_basis",
    "random_gaussian_lsa",
    "sarsa",
    "state_action",
    "tile_coding",
    "two_state_q_learning",
]
