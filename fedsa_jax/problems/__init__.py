"""Federated LSA problem families: Gaussian LSA and federated TD(0)."""

from fedsa_jax.problems.gaussian import GaussianLSA, gaussian_lsa, random_gaussian_lsa
from fedsa_jax.problems.generators import garnet, qfedtd_mdp
from fedsa_jax.problems.td import FederatedTD, federated_td

__all__ = [
    "FederatedTD",
    "GaussianLSA",
    "federated_td",
    "garnet",
    "gaussian_lsa",
    "qfedtd_mdp",
    "random_gaussian_lsa",
]
