"""SCAFFLSA: FedLSA with control variates that remove the heterogeneity bias.

Each agent keeps a control variate ``xi_c`` (``xi_c = 0`` at start). Round t:

    theta^c_{t,h+1} = theta^c_{t,h} - eta (A_c(Z) theta^c_{t,h} - b_c(Z) - xi_c),   h < H,
    theta_{t+1}     = (1/N) sum_c theta^c_{t,H},
    xi_c           <- xi_c + (theta_{t+1} - theta^c_{t,H}) / (eta H).

The update keeps ``sum_c xi_c = 0``; the ideal control variates are
``xi_c* = A_bar[c] theta_star - b_bar[c]``, and ``theta_star`` is the fixed point
of the mean dynamics: SCAFFLSA has no heterogeneity bias.

References: Mangold et al., "SCAFFLSA: Taming Heterogeneity in Federated Linear
Stochastic Approximation and TD Learning", NeurIPS 2024, arXiv:2402.04114,
Algorithm 2 and Sec. 5.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax.algorithms._base import (
    Algorithm,
    LocalStepsConfig,
    RoundInfo,
    init_samplers,
    initial_theta,
    run_agents,
    local_steps_config,
)


class SCAFFLSAState(NamedTuple):
    theta: jax.Array  # (d,) server iterate
    xi: jax.Array  # (N, d) control variates, sum over agents is 0
    sampler: jax.Array  # (N,)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> SCAFFLSAState:
    del config
    theta = initial_theta(problem, theta0)
    xi = jnp.zeros((problem.num_agents, problem.dim), problem.dtype)
    return SCAFFLSAState(theta, xi, init_samplers(key, problem))


def step(rand: jax.Array, state: SCAFFLSAState, problem, config: LocalStepsConfig):
    """One communication round for one seed, from its random numbers ``rand``."""
    eta = jnp.asarray(config.step_size, problem.dtype)
    H = config.num_local_steps
    local, sampler = run_agents(rand, problem, state.sampler, state.theta, eta, config.skip, controls=state.xi)
    theta = local.mean(axis=0)
    xi = state.xi + (theta - local) / (eta * H)
    info = RoundInfo(jnp.mean(jnp.sum((local - theta) ** 2, axis=-1)))
    return SCAFFLSAState(theta, xi, sampler), info


def scafflsa(step_size: float, num_local_steps: int, skip: int = 1) -> Algorithm:
    """SCAFFLSA with step size ``eta`` and ``H`` local steps per round.

    Args:
      step_size: ``eta > 0``.
      num_local_steps: ``H >= 1``.
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
    """
    return Algorithm(local_steps_config(step_size, num_local_steps, skip), "scafflsa", init, step)
