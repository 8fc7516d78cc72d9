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
costs nothing beyond that round. A biased compressor (``top_k``, ``scaled_sign``, unscaled
``rand_k``) runs as it is, biased; with ``error_feedback="ef14"`` or ``"ef21"`` the agents keep a
memory (:mod:`fedsa_jax.channel`) and EF21 reaches the uncompressed limit.

Partial participation (``clients_per_round = m``): each round a cohort S of m agents is
drawn uniformly without replacement, independently of everything else (FedAvg's client
sampling, McMahan et al. 2017, Alg. 1, and SCAFFOLD's, Karimireddy et al. 2020, Alg. 1 with
global step size 1). Only the cohort starts from ``theta_t``, draws observations and sends;
the others' observation streams do not move. The server averages over the cohort:
``theta_{t+1} = theta_t + (1/m) sum_{c in S ∩ R} q(m_c)`` (``"divide_by_n"``: divide by the
number of agents asked) or ``(1/|S ∩ R|) sum_{c in S ∩ R} q(m_c)`` (``"divide_by_received"``).
The mean recursion has weights ``P(c in S) p / m = p / N``, as with all agents.

References: Mangold, Samsonov, Labbi, Levin, Alami, Naumov, Moulines,
"SCAFFLSA: Taming Heterogeneity in Federated Linear Stochastic Approximation and
TD Learning", NeurIPS 2024, arXiv:2402.04114, Algorithm 1 and Sec. 3.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from fedsa_jax.channel import cohorts, delays, local_work
from fedsa_jax.channel.cohorts import (
    keep_outside,
    round_cohort,
    with_clients_per_round,
)
from fedsa_jax.channel.delays import (
    delay_blocks,
    delay_theory,
    delayed_messages,
    delayed_starts,
    from_text as delays_from_text,
    initial_past,
    pushed,
    with_delays,
)
from fedsa_jax.channel.downlink import (
    downlink_init,
    downlink_step,
    downlink_theory,
    from_reference,
)
from fedsa_jax.channel.local_work import (
    normalize_work,
    round_work,
    stepwise_active,
    work_weights,
)

__all__ = ["FedLSAState", "fedlsa"]


class FedLSAState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_t = theta_star + error
    error: jax.Array  # (d,) theta_t - theta_star, what the rounds update (ErrorCoordinates)
    sampler: jax.Array  # (N,) each agent's observation-stream state
    count: jax.Array  # () int32, rounds done (a schedule's local-step count is count H + h)
    opt_state: Any  # the server optimizer's state (() without one)
    memory: Any = ()  # the agents' error-feedback memory (N, d) (channel.init_memory; () without)
    hat: Any = ()  # the agents' copy of the model minus theta_star, with a downlink (() without)
    past: Any = ()  # (tau_max, d) the last server iterates minus theta_star, with delays (() without)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> FedLSAState:
    error = initial_error(problem, theta0)
    return FedLSAState(
        problem.theta_star + error,
        error,
        init_samplers(key, problem, problem.theta_star + error),
        jnp.int32(0),
        optim.init_server(config, error),
        config.channel.init_memory(problem.num_agents, problem.dim, problem.dtype),
        downlink_init(config, error),
        initial_past(config, error),
    )


def step(rand: RoundRandomness, state: FedLSAState, problem, config: LocalStepsConfig):
    """One communication round for one seed, from its random numbers ``rand`` (in error
    coordinates, :class:`~fedsa_jax.algorithms.ErrorCoordinates`)."""
    eta = optim.step_sizes(config.step_size, state.count, config.num_local_steps, problem.dtype)
    view = ErrorCoordinates(problem)
    cohort = round_cohort(rand, config, problem)  # None: every agent
    start = state.error if getattr(config, "downlink", None) is None else state.hat  # the agents' copy
    start = delayed_starts(rand, config, problem, start, state.past)  # (N, d): theta_{t - tau_c}
    counts = round_work(rand, config, problem)  # None: every agent runs H (lockstep)
    active = stepwise_active(config, problem, state.count, counts)
    weights = work_weights(counts, rand.weights, config.num_local_steps, problem.dtype)
    local, sampler = run_agents(
        rand.obs, view, state.sampler, start, eta, config.skip, active=active, weights=weights
    )
    local = normalize_work(config, counts, start, local)
    local, start = delayed_messages(state.error, start, local)  # delayed: updates move the current iterate
    sampler = keep_outside(cohort, sampler, state.sampler)  # agents outside the cohort drew nothing
    aggregate, delivery = server_update(rand.channel, start, local, config.channel, state.memory, cohort)
    aggregate = from_reference(state.error, start, aggregate, config)
    error, opt_state = optim.server_step(config, state.opt_state, state.error, aggregate, problem.theta_star)
    hat = downlink_step(rand.channel, config, error, state.hat)
    past = pushed(config, state.past, state.error)
    state = FedLSAState(
        problem.theta_star + error, error, sampler, state.count + 1, opt_state, delivery.memory, hat, past
    )
    return state, round_info(local, error, delivery, config, problem, cohort, state.count - 1, counts)


def theory(config: LocalStepsConfig, problem) -> moments.Recursion:
    """The exact moment description of a round (:mod:`fedsa_jax.moments`): ``Y = (1, theta,
    theta^1..theta^N [, mem_1..mem_N] [, s, a])``, mem the uplink's error-feedback memory; broadcast,
    H local steps, the aggregate through the channel (into theta, or into a scratch block a for the
    server optimizer) and the optimizer's step. A compressed downlink adds the agents' copy hat
    (and EF14's memory): the agents start from hat, the aggregate of their messages against hat
    moves theta, and the broadcast moves hat (:func:`fedsa_jax.channel.downlink.downlink`)."""
    y = moments.Augmented(problem)
    delay_blocks(y, config)
    y.add("loc", per_agent=True)
    moments.channel_memory(y, config.channel)
    into, server = moments.server_step(y, config.server_optimizer)
    reference, sent, shift, down = downlink_theory(y, config, into)

    def round(t, etas):
        return [
            *delay_theory(y, config, [moments.local_step(y, float(eta)) for eta in etas], reference),
            moments.aggregate(
                y, config.channel, into=sent, reference=reference, clients_per_round=config.clients_per_round
            ),
            *([] if shift is None else [shift]),
            server,
            *([] if down is None else [down]),
        ]

    return moments.Recursion(y, round, config.step_size, config.num_local_steps)


def fedlsa(
    step_size: float,
    num_local_steps: int | Sequence[int] | optim.LocalSteps,
    skip: int = 1,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
    error_feedback: str | None = None,
    downlink=None,
    clients_per_round: int | None = None,
    delays=None,
    privacy=None,
) -> Algorithm:
    """FedLSA with step size ``eta``, ``H`` local steps per round.

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``
        (an optax schedule or ``fj.schedule(...)``, see :mod:`fedsa_jax.optim`).
      num_local_steps: ``H >= 1``; or local steps that change with the round, a table
        ``H_t`` (a list of integers, ``fj.local_steps(fn, num_rounds)``,
        ``fj.growing_local_steps(h0, power, num_rounds)``; :mod:`fedsa_jax.optim`).
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: uplink quantizer from :mod:`fedsa_jax.channel` (default: exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` or ``"divide_by_received"``.
      server_optimizer: None (``theta_{t+1}`` is the aggregate) or an optax
        ``GradientTransformation`` on the pseudo-gradient ``theta_t - aggregate_t``
        (``optax.sgd(lr, momentum=beta)``: FedAvgM; ``optax.adam(lr)``: FedAdam).
      error_feedback: None, ``"ef14"`` or ``"ef21"``: error feedback on the uplink, for a
        compressor (a biased one such as ``fj.channel.top_k(k)`` needs it to converge to the
        uncompressed limit); see :mod:`fedsa_jax.channel` for what a lost message does.
      downlink: None (the model goes down exact) or ``fj.channel.channel(quantizer)`` (a contractive
        compressor, :mod:`fedsa_jax.channel.downlink`): the server broadcasts
        ``C(theta_{t+1} - theta_hat_t)`` to
        the agents' copy ``theta_hat`` (:mod:`fedsa_jax.channel.downlink`); the agents start their
        local steps from ``theta_hat``, their uplink message is ``theta^c_{t,H} - theta_hat_t`` and
        the server adds the aggregate of the messages to its own ``theta_t``.
      clients_per_round: None (every agent, every round: the code of the full round) or an
        integer ``1 <= m <= N``: a uniform cohort of m agents per round (see above).
      delays: None, or a law of :mod:`fedsa_jax.channel.delays`: agent c's update of round t starts from the
        server iterate ``tau_c`` rounds old and moves the current one (delayed updates).
      privacy: None, or the uplink's clipping and Gaussian noise, :func:`fedsa_jax.channel.privacy`
        (:mod:`fedsa_jax.channel.dp`); the run's epsilon is in ``result.privacy``.

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4)
      >>> res = fj.simulate(jax.random.key(1), problem, fj.fedlsa(0.1, 10), 20, 64)
    """
    config = local_steps_config(
        step_size,
        num_local_steps,
        skip,
        quantizer,
        success_prob,
        aggregation,
        server_optimizer,
        error_feedback,
        downlink,
        privacy,
    )
    config = with_delays(with_clients_per_round(config, clients_per_round), delays)
    return Algorithm(config, "fedlsa", init, step, theory, weighted=True)


def _from_options(step_size, args, **channel) -> Algorithm:
    delays = delays_from_text(
        getattr(args, "delays", "none") or "none", bool(getattr(args, "delays_shared", False))
    )
    return fedlsa(
        step_size,
        args.local_steps,
        skip=args.skip,
        clients_per_round=args.clients_per_round,
        delays=delays,
        **channel,
    )


registry.register_algorithm(
    "fedlsa",
    _from_options,
    options=(
        registry.LOCAL_STEPS,
        registry.LOCAL_STEPS_GROWTH,
        *local_work.OPTIONS,
        delays.DELAYS,
        delays.DELAYS_SHARED,
        registry.SKIP,
        cohorts.CLIENTS_PER_ROUND,
    ),
    title="FedLSA",
    bias="fedlsa_bias",
    order=0,
    default=True,
)
