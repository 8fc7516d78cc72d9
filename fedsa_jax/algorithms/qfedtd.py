"""QFedTD: federated TD(0) with quantized uplinks over Bernoulli erasure channels.

One local step per round. At round k every agent i draws one observation
``Z_{i,k}`` (one step of its own Markov chain, or an i.i.d. draw), computes the
TD direction ``g_{i,k} = b_i(Z) - A_i(Z) theta_k`` and uploads ``Q(g_{i,k})``;
the message arrives with probability p (``b_{i,k} ~ Bernoulli(p)``, independent):

    theta_{k+1} = theta_k + (alpha / N) sum_i b_{i,k} Q(g_{i,k}).

The sum is divided by N, not by the number received (``aggregation=
"divide_by_n"``, the paper's rule; ``"divide_by_received"`` is offered too).
Under generative sampling the mean follows exactly
``E[theta_{k+1}] = (I - alpha p mean_i A_bar[i]) E[theta_k] + alpha p mean_i b_bar[i]``
(:func:`fedsa_jax.theory.exact_mean`). With ``p = 1`` and the identity quantizer
this is FedTD, i.e. FedLSA with ``H = 1``.

References: Dal Fabbro, Mitra, Pappas, "Federated TD Learning over Finite-Rate
Erasure Channels: Linear Speedup under Markovian Sampling", IEEE Control Systems
Letters, 2023, eq. (2).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    LocalStepsConfig,
    RoundRandomness,
    init_samplers,
    initial_error,
    local_steps_config,
    round_info,
)
from fedsa_jax.algorithms.fedlsa import theory
from fedsa_jax.channel import Delivery, aggregate, transmit

__all__ = ["QFedTDState", "qfedtd"]


class QFedTDState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_k = theta_star + error
    error: jax.Array  # (d,) theta_k - theta_star, what the rounds update (ErrorCoordinates)
    sampler: jax.Array  # (N,) each agent's chain state
    count: jax.Array  # () int32, rounds done (= the schedule's count: one step per round)
    opt_state: Any  # the server optimizer's state (() without one)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> QFedTDState:
    error = initial_error(problem, theta0)
    return QFedTDState(
        problem.theta_star + error,
        error,
        init_samplers(key, problem),
        jnp.int32(0),
        optim.init_server(config, error),
    )


def step(rand: RoundRandomness, state: QFedTDState, problem, config: LocalStepsConfig):
    """One round (one TD step per agent) for one seed, in error coordinates
    (:class:`~fedsa_jax.algorithms.ErrorCoordinates`)."""
    alpha = optim.step_sizes(config.step_size, state.count, 1, problem.dtype)
    alpha = alpha if alpha.ndim == 0 else alpha[0]
    view = ErrorCoordinates(problem)

    def direction(rand_c, params, sampler):
        obs, sampler = problem.observe(params, sampler, rand_c, 1)
        first = jax.tree.map(lambda x: x[0], obs)
        return -view.direction(params, first, state.error), sampler  # g = b(Z) - A(Z) theta

    g, sampler = jax.vmap(direction)(rand.obs, problem.agent_params(), state.sampler)
    ch = config.channel
    if ch.trivial:
        N = g.shape[0]
        delivery = Delivery(g, jnp.ones((N,), bool), jnp.full((N,), 1.0 / N, g.dtype))
    else:
        delivery = transmit(rand.channel, g, ch)
    combined = state.error + alpha * aggregate(delivery)  # sum_c w_c q(g_c), as a dot (faster)
    error, opt_state = optim.server_step(config, state.opt_state, state.error, combined, problem.theta_star)
    info = round_info(jnp.broadcast_to(state.error, g.shape), state.error, delivery, config, problem)
    info = info._replace(client_drift=jnp.zeros((), g.dtype))  # one step: no local drift (nothing computed)
    return QFedTDState(problem.theta_star + error, error, sampler, state.count + 1, opt_state), info


def qfedtd(
    step_size: float,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
) -> Algorithm:
    """QFedTD with server step ``alpha``, quantizer Q and success probability p.

    Args:
      step_size: ``alpha > 0``, or a schedule of the round ``k`` (one step per round,
        :mod:`fedsa_jax.optim`).
      quantizer: from :mod:`fedsa_jax.channel` (default: none, i.e. FedTD).
      success_prob: ``p`` in ``(0, 1]``.
      aggregation: ``"divide_by_n"`` (the paper's) or ``"divide_by_received"``.
      server_optimizer: None or an optax ``GradientTransformation`` on the pseudo-gradient
        ``theta_k - aggregate_k`` (:mod:`fedsa_jax.optim`).

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40)
      >>> alg = fj.qfedtd(0.6, fj.channel.stochastic_uniform(bits=4), success_prob=0.6)
      >>> res = fj.simulate(jax.random.key(1), problem, alg, num_rounds=200, num_seeds=256)
    """
    config = local_steps_config(step_size, 1, 1, quantizer, success_prob, aggregation, server_optimizer)
    return Algorithm(config, "qfedtd", init, step, theory)  # FedLSA's round with H = 1


def _from_options(step_size, args, **channel) -> Algorithm:
    return qfedtd(step_size, **channel)


registry.register_algorithm("qfedtd", _from_options, title="QFedTD", note="one local step per round", order=2)
