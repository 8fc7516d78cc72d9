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

Channel (beyond the paper): each agent uploads its model difference
``m_c = theta^c_{t,H} - theta_t`` through a quantizer q, and the message is
delivered with probability p. The server sets
``theta_{t+1} = theta_t + (1/N) sum_{c delivered} q(m_c)`` (``"divide_by_n"``: a
lost message is a zero update, which shrinks the step by p on average) or
``theta_t + (1/|R|) sum_{c in R} q(m_c)`` (``"divide_by_received"``; no update
if nothing arrives). Agents hold no state between rounds, so a lost message
costs nothing beyond that round.

References: Mangold, Samsonov, Labbi, Levin, Alami, Naumov, Moulines,
"SCAFFLSA: Taming Heterogeneity in Federated Linear Stochastic Approximation and
TD Learning", NeurIPS 2024, arXiv:2402.04114, Algorithm 1 and Sec. 3.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import moments, optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    LocalStepsConfig,
    RoundRandomness,
    init_samplers,
    initial_error,
    local_steps_config,
    round_info,
    run_agents,
    server_update,
)

__all__ = ["FedLSAState", "fedlsa"]


class FedLSAState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_t = theta_star + error
    error: jax.Array  # (d,) theta_t - theta_star, what the rounds update (ErrorCoordinates)
    sampler: jax.Array  # (N,) each agent's observation-stream state
    count: jax.Array  # () int32, rounds done (a schedule's local-step count is count H + h)
    opt_state: Any  # the server optimizer's state (() without one)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> FedLSAState:
    error = initial_error(problem, theta0)
    return FedLSAState(
        problem.theta_star + error,
        error,
        init_samplers(key, problem),
        jnp.int32(0),
        optim.init_server(config, error),
    )


def step(rand: RoundRandomness, state: FedLSAState, problem, config: LocalStepsConfig):
    """One communication round for one seed, from its random numbers ``rand`` (in error
    coordinates, :class:`~fedsa_jax.algorithms.ErrorCoordinates`)."""
    eta = optim.step_sizes(config.step_size, state.count, config.num_local_steps, problem.dtype)
    view = ErrorCoordinates(problem)
    local, sampler = run_agents(rand.obs, view, state.sampler, state.error, eta, config.skip)
    aggregate, delivery = server_update(rand.channel, state.error, local, config.channel)
    error, opt_state = optim.server_step(config, state.opt_state, state.error, aggregate, problem.theta_star)
    state = FedLSAState(problem.theta_star + error, error, sampler, state.count + 1, opt_state)
    return state, round_info(local, error, delivery, config, problem)


def theory(config: LocalStepsConfig, problem) -> moments.Recursion:
    """The exact moment description of a round (:mod:`fedsa_jax.moments`): ``Y = (1, theta,
    theta^1..theta^N [, s, a])``; broadcast, H local steps, the aggregate through the channel
    (into theta, or into a scratch block a for the server optimizer) and the optimizer's step."""
    y = moments.Augmented(problem)
    y.add("loc", per_agent=True)
    into, server = moments.server_step(y, config.server_optimizer)
    send = moments.broadcast(y)

    def round(t, etas):
        return [
            send,
            *(moments.local_step(y, float(eta)) for eta in etas),
            moments.aggregate(y, config.channel, into=into),
            server,
        ]

    return moments.Recursion(y, round, config.step_size, config.num_local_steps)


def fedlsa(
    step_size: float,
    num_local_steps: int,
    skip: int = 1,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
) -> Algorithm:
    """FedLSA with step size ``eta``, ``H`` local steps per round.

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``
        (an optax schedule or ``fj.schedule(...)``, see :mod:`fedsa_jax.optim`).
      num_local_steps: ``H >= 1``.
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: uplink quantizer from :mod:`fedsa_jax.channel` (default: exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` or ``"divide_by_received"``.
      server_optimizer: None (``theta_{t+1}`` is the aggregate) or an optax
        ``GradientTransformation`` on the pseudo-gradient ``theta_t - aggregate_t``
        (``optax.sgd(lr, momentum=beta)``: FedAvgM; ``optax.adam(lr)``: FedAdam).

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4)
      >>> res = fj.simulate(jax.random.key(1), problem, fj.fedlsa(0.1, 10), 20, 64)
    """
    config = local_steps_config(
        step_size, num_local_steps, skip, quantizer, success_prob, aggregation, server_optimizer
    )
    return Algorithm(config, "fedlsa", init, step, theory)


def _from_options(step_size, args, **channel) -> Algorithm:
    return fedlsa(step_size, args.local_steps, skip=args.skip, **channel)


registry.register_algorithm(
    "fedlsa",
    _from_options,
    options=(registry.LOCAL_STEPS, registry.SKIP),
    title="FedLSA",
    bias="fedlsa_bias",
    order=0,
    default=True,
)
