"""SCAFFLSA: FedLSA with control variates that remove the heterogeneity bias.

Each agent keeps a control variate ``xi_c`` (``xi_c = 0`` at start). Round t:

    theta^c_{t,h+1} = theta^c_{t,h} - eta (A_c(Z) theta^c_{t,h} - b_c(Z) - xi_c),   h < H,
    theta_{t+1}     = (1/N) sum_c theta^c_{t,H},
    xi_c           <- xi_c + (theta_{t+1} - theta^c_{t,H}) / (eta H).

The update keeps ``sum_c xi_c = 0``; the ideal control variates are
``xi_c* = A_bar[c] theta_star - b_bar[c]``, and ``theta_star`` is the fixed point
of the mean dynamics: SCAFFLSA has no heterogeneity bias.

Channel (beyond the paper): agent c uploads ``m_c = theta^c_{t,H} - theta_t``
through a quantizer q; the message is delivered with probability p, and the
server broadcasts ``theta_{t+1}`` together with which messages arrived (R).
The server step is ``theta_t + sum_c w_c q(m_c)`` with ``w_c = 1/N``
(``"divide_by_n"``) or ``1/|R|`` (``"divide_by_received"``) on delivered
messages. Control variates move only for delivered agents, against the mean of
the delivered messages ``mbar_R = (1/|R|) sum_{j in R} q(m_j)``:

    xi_c <- xi_c + (mbar_R - q(m_c)) / (eta H)   for c in R;   xi_c unchanged otherwise.

So a lost message leaves that agent's control variate as it was (its local work
of the round is discarded), and ``sum_c xi_c`` stays exactly 0 for either rule.
With an exact channel this is the update above (``mbar_R = theta_{t+1} - theta_t``).

References: Mangold et al., "SCAFFLSA: Taming Heterogeneity in Federated Linear
Stochastic Approximation and TD Learning", NeurIPS 2024, arXiv:2402.04114,
Algorithm 2 and Sec. 5.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import moments, optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    LocalStepsConfig,
    RoundRandomness,
    control_variate_update,
    init_samplers,
    initial_error,
    local_steps_config,
    round_info,
    run_agents,
    server_update,
)

__all__ = ["SCAFFLSAState", "scafflsa"]


class SCAFFLSAState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_star + error
    error: jax.Array  # (d,) theta - theta_star, what the rounds update (ErrorCoordinates)
    xi: jax.Array  # (N, d) control variates, sum over agents is 0
    sampler: jax.Array  # (N,)
    count: jax.Array  # () int32, rounds done (a schedule's local-step count is count H + h)
    opt_state: Any  # the server optimizer's state (() without one)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> SCAFFLSAState:
    error = initial_error(problem, theta0)
    xi = jnp.zeros((problem.num_agents, problem.dim), problem.dtype)
    return SCAFFLSAState(
        problem.theta_star + error,
        error,
        xi,
        init_samplers(key, problem),
        jnp.int32(0),
        optim.init_server(config, error),
    )


def step(rand: RoundRandomness, state: SCAFFLSAState, problem, config: LocalStepsConfig):
    """One communication round for one seed, from its random numbers ``rand``. The control
    variates move against the channel's aggregate, divided by the sum of the round's steps."""
    H = config.num_local_steps
    eta = optim.step_sizes(config.step_size, state.count, H, problem.dtype)
    local, sampler = run_agents(
        rand.obs, ErrorCoordinates(problem), state.sampler, state.error, eta, config.skip, controls=state.xi
    )
    aggregate, delivery = server_update(rand.channel, state.error, local, config.channel)
    xi = control_variate_update(
        state.xi, aggregate, local, delivery, config.channel, optim.round_step_sum(eta, H)
    )
    error, opt_state = optim.server_step(config, state.opt_state, state.error, aggregate, problem.theta_star)
    state = SCAFFLSAState(problem.theta_star + error, error, xi, sampler, state.count + 1, opt_state)
    return state, round_info(local, error, delivery, config, problem)


def theory(config: LocalStepsConfig, problem) -> moments.Recursion:
    """The exact moment description of a round (:mod:`fedsa_jax.moments`): ``Y = (1, theta,
    xi_1..xi_N, theta^1..theta^N [, s, a])``; broadcast, H local steps with the control variates,
    the aggregate through the channel with the control variates' step against it (divided by
    ``sum_h eta_{tH+h}``), and the server optimizer's step."""
    y = moments.Augmented(problem, title="SCAFFLSA")
    y.add("xi", per_agent=True, zero_sum=True)
    y.add("loc", per_agent=True)
    into, server = moments.server_step(y, config.server_optimizer)
    send = moments.broadcast(y)

    def round(t, etas):
        steps = [moments.local_step(y, float(eta), controls="xi") for eta in etas]
        aggregate = moments.aggregate(
            y, config.channel, into=into, control_variates="xi", denominator=float(np.sum(etas))
        )
        return [send, *steps, aggregate, server]

    return moments.Recursion(y, round, config.step_size, config.num_local_steps)


def scafflsa(
    step_size: float,
    num_local_steps: int,
    skip: int = 1,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
) -> Algorithm:
    """SCAFFLSA with step size ``eta`` and ``H`` local steps per round.

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``
        (:mod:`fedsa_jax.optim`); the control variates then divide by
        ``sum_{h<H} eta_{tH+h}`` instead of ``eta H``.
      num_local_steps: ``H >= 1``.
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: uplink quantizer from :mod:`fedsa_jax.channel` (default: exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` or ``"divide_by_received"``.
      server_optimizer: None or an optax ``GradientTransformation`` on the pseudo-gradient
        ``theta_t - aggregate_t`` (:mod:`fedsa_jax.optim`); the control variates move
        against the aggregate, as without one.
    """
    config = local_steps_config(
        step_size, num_local_steps, skip, quantizer, success_prob, aggregation, server_optimizer
    )
    return Algorithm(config, "scafflsa", init, step, theory)


def _from_options(step_size, args, **channel) -> Algorithm:
    return scafflsa(step_size, args.local_steps, skip=args.skip, **channel)


registry.register_algorithm(
    "scafflsa",
    _from_options,
    options=(registry.LOCAL_STEPS, registry.SKIP),
    title="SCAFFLSA",
    order=1,
    default=True,
)
