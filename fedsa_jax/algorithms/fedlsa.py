"""FedLSA: federated linear stochastic approximation with local steps.

Each round t, every agent c starts from the server's ``theta_t`` and runs H local
steps on its own observations,

    theta^c_{t,h+1} = theta^c_{t,h} - eta (A_c(Z^c_{t,h+1}) theta^c_{t,h} - b_c(Z^c_{t,h+1})),

then the server averages: ``theta_{t+1} = (1/N) sum_c theta^c_{t,H}``.

Under heterogeneity FedLSA converges (in mean) to a biased point:

    theta_inf - theta_star = [mean_c (I - (I - eta A_bar[c])^H)]^{-1}
                             mean_c (I - (I - eta A_bar[c])^H) (local_theta_star[c] - theta_star),

(:func:`fedsa_jax.theory.fedlsa_bias`), which vanishes for H = 1 or identical agents.
Markovian data: with ``skip = k`` each agent keeps one observation out of every k
of its trajectory (about the mixing time), discarding the others.

References: Mangold, Samsonov, Labbi, Levin, Alami, Naumov, Moulines,
"SCAFFLSA: Taming Heterogeneity in Federated Linear Stochastic Approximation and
TD Learning", NeurIPS 2024, arXiv:2402.04114, Algorithm 1 and Sec. 3.
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


class FedLSAState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_t
    sampler: jax.Array  # (N,) each agent's observation-stream state


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> FedLSAState:
    del config
    return FedLSAState(initial_theta(problem, theta0), init_samplers(key, problem))


def step(rand: jax.Array, state: FedLSAState, problem, config: LocalStepsConfig):
    """One communication round for one seed, from its random numbers ``rand``."""
    eta = jnp.asarray(config.step_size, problem.dtype)
    local, sampler = run_agents(rand, problem, state.sampler, state.theta, eta, config.skip)
    theta = local.mean(axis=0)
    info = RoundInfo(jnp.mean(jnp.sum((local - theta) ** 2, axis=-1)))
    return FedLSAState(theta, sampler), info


def fedlsa(step_size: float, num_local_steps: int, skip: int = 1) -> Algorithm:
    """FedLSA with step size ``eta``, ``H`` local steps per round.

    Args:
      step_size: ``eta > 0``.
      num_local_steps: ``H >= 1``.
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4)
      >>> res = fj.simulate(jax.random.key(1), problem, fj.fedlsa(0.1, 10), 20, 64)
    """
    return Algorithm(local_steps_config(step_size, num_local_steps, skip), "fedlsa", init, step)
