"""Federated LSA problems: the protocol every problem follows, the built-in families
(Gaussian LSA, federated TD(0), least squares, the noise-free version of any
problem) and the pieces for writing a new one."""

from fedsa_jax.problems._base import alias_draw, alias_tables, fixed_points
from fedsa_jax.problems.gaussian import GaussianLSA, gaussian_lsa, random_gaussian_lsa
from fedsa_jax.problems.generators import garnet, qfedtd_mdp
from fedsa_jax.problems.mean_path import ExpectedProblem, expected
from fedsa_jax.problems.protocol import FiniteSupport, Problem, direction_second_moment, missing_members
from fedsa_jax.problems.regression import LeastSquares, least_squares
from fedsa_jax.problems.td import FederatedTD, federated_td

__all__ = [
    "ExpectedProblem",
    "FederatedTD",
    "FiniteSupport",
    "GaussianLSA",
    "LeastSquares",
    "Problem",
    "alias_draw",
    "alias_tables",
    "direction_second_moment",
    "expected",
    "federated_td",
    "fixed_points",
    "garnet",
    "gaussian_lsa",
    "least_squares",
    "missing_members",
    "qfedtd_mdp",
    "random_gaussian_lsa",
]
