"""Federated Q-learning with importance averaging (Woo, Joshi, Chi; FedAsynQ-ImAvg).

Each round t every agent c starts from the server's ``Q_t`` and runs H local steps on its own
observations, as in :func:`fedsa_jax.fedlsa`; during the round it counts its visits ``N_c(s, a)`` to
every entry. The server then averages each entry with weights that grow with the visits,

    Q_{t+1}(s, a) = sum_c alpha_c(s, a) Q^c_{t,H}(s, a),
    alpha_c(s, a) = (1 - eta)^{-N_c(s, a)} / sum_c' (1 - eta)^{-N_c'(s, a)}

(Woo, Joshi, Chi 2025, Algorithm 2 with its importance weights, eq. (14)). An entry's local
estimate forgets the round's start by ``(1 - eta)`` per visit, so an agent that visited it more
has more of the round's data in it: with heterogeneous behaviour policies equal averaging
(``fj.fedlsa``) dilutes the well-visited agents' estimates with the start; importance averaging
does not, and behaves as if all trajectories were processed by one learner. When every agent
visits an entry equally often (synchronous sampling: each step updates every entry) the weights
are ``1/N`` and the round is FedLSA's.

A step-size schedule uses each visit's own step: ``log alpha_c(s, a) = -sum_{h: (s, a) visited at
h} log(1 - eta_h) + const`` (the paper's weight for a constant step). The weights are computed as a
softmax over the agents of these logarithms, so large counts cannot overflow. Step sizes must stay
below 1 (a weight ``(1 - eta)^{-N}`` is undefined at eta >= 1; a schedule that reaches 1 makes the
run diverge, and it is counted so).

Channel (beyond the paper): each agent sends its model difference ``m_c = Q^c_{t,H} - Q_t`` through
a quantizer q and its visit counts exactly (``d`` integers of ``bit_length(H)`` bits each, counted in
the bits sent); a message is delivered with probability p. The server sets ``Q_{t+1}(s, a) = Q_t(s,
a) + sum_{c in R} alpha_c(s, a) q(m_c)(s, a)`` with the weights normalised over the agents asked
(``"divide_by_n"``: a lost message is a zero update, as in FedLSA) or over those received
(``"divide_by_received"``; no update if nothing arrives). A cohort (``clients_per_round = m``)
draws m agents per round uniformly without replacement; only they observe and send, and the weights
are normalised over the cohort (or over what arrived from it). Refused, each with its reason: error
feedback, a compressed downlink, privacy, delays, random local work, tables of H, ``skip > 1``, and
any problem that does not say which entries a local step updates (a ``visits(obs)`` method, as
:func:`fedsa_jax.problems.q_learning`'s), such as one whose observations follow the iterate.

References: Woo, Joshi, Chi, "The blessing of heterogeneity in federated Q-learning: linear speedup
and beyond", JMLR 26 (2025), arXiv:2305.10697, Sec. 4 (importance averaging).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    LocalStepsConfig,
    RoundRandomness,
    init_samplers,
    initial_error,
    local_steps_config,
    local_updates,
    round_info,
)
from fedsa_jax.channel import cohorts, transmit
from fedsa_jax.channel.cohorts import (
    keep_outside,
    round_cohort,
    with_clients_per_round,
)

__all__ = ["ImportanceAveragingState", "importance_averaging", "importance_weights"]


class ImportanceAveragingState(NamedTuple):
    theta: jax.Array  # (d,) server iterate Q_t = theta_star + error
    error: jax.Array  # (d,) Q_t - theta_star, what the rounds update (ErrorCoordinates)
    sampler: jax.Array  # (N,) each agent's observation-stream state
    count: jax.Array  # () int32, rounds done (a schedule's local-step count is count H + h)
    opt_state: Any  # the server optimizer's state (() without one)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> ImportanceAveragingState:
    _check_problem(problem)
    error = initial_error(problem, theta0)
    return ImportanceAveragingState(
        problem.theta_star + error,
        error,
        init_samplers(key, problem, problem.theta_star + error),
        jnp.int32(0),
        optim.init_server(config, error),
    )


def _check_problem(problem) -> None:
    if not hasattr(problem, "visits"):
        family = problem.describe().get("family", type(problem).__name__)
        _validate.fail(
            "problem",
            family,
            "importance averaging weights each entry by the agent's visits to it in the round: the "
            "problem must draw its observations before the updates and say which entries a local step "
            "updates (a visits(obs) method, as fj.problems.q_learning's)",
        )


def importance_weights(log_weights: jax.Array, senders: jax.Array, normalise: jax.Array) -> jax.Array:
    """``(N, d)`` weights ``alpha_c(p) = [c in senders] exp(l_c(p)) / sum_{c' in normalise}
    exp(l_c'(p))`` from the log-weights ``l (N, d)`` and the masks ``(N,) bool`` (a softmax over the
    agents; 0 for an entry whose normalising set is empty)."""
    masked = jnp.where(normalise[:, None], log_weights, -jnp.inf)
    top = jnp.max(masked, axis=0)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.where(normalise[:, None], jnp.exp(log_weights - top), 0.0)
    total = jnp.sum(w, axis=0)
    return jnp.where(senders[:, None], w, 0.0) / jnp.where(total > 0, total, 1.0)


def step(rand: RoundRandomness, state: ImportanceAveragingState, problem, config: LocalStepsConfig):
    """One round for one seed, in error coordinates (:class:`~fedsa_jax.algorithms.ErrorCoordinates`)."""
    _check_problem(problem)
    H = config.num_local_steps
    eta = optim.step_sizes(config.step_size, state.count, H, problem.dtype)
    etas = jnp.broadcast_to(eta, (H,))
    view = ErrorCoordinates(problem)
    cohort = round_cohort(rand, config, problem)  # None: every agent

    def agent(rand_c, params, sampler):
        obs, sampler = view.observe(params, sampler, rand_c, 1)
        local = local_updates(view, params, obs, state.error, eta)
        log_weight = -jnp.log1p(-etas) @ problem.visits(obs).astype(etas.dtype)  # (d,)
        return local, sampler, log_weight

    local, sampler, log_weights = jax.vmap(agent)(rand.obs, problem.agent_params(), state.sampler)
    sampler = keep_outside(cohort, sampler, state.sampler)  # agents outside the cohort drew nothing
    ch = config.channel
    N = problem.num_agents
    asked = jnp.ones((N,), bool) if cohort is None else cohort
    delivery = transmit(rand.channel, local - state.error, ch, (), cohort)
    normalise = asked if ch.aggregation == "divide_by_n" else delivery.delivered
    alpha = importance_weights(log_weights, delivery.delivered, normalise)
    aggregate = state.error + jnp.sum(alpha * delivery.messages, axis=0)
    error, opt_state = optim.server_step(config, state.opt_state, state.error, aggregate, problem.theta_star)
    info = round_info(local, error, delivery, config, problem, cohort, state.count)
    counts = jnp.int32(problem.dim * H.bit_length())  # each message's visit counts, sent exactly
    info = info._replace(
        bits_sent=info.bits_sent + info.messages_sent * counts,
        bits_delivered=info.bits_delivered + info.messages_delivered * counts,
    )
    state = ImportanceAveragingState(problem.theta_star + error, error, sampler, state.count + 1, opt_state)
    return state, info


def importance_averaging(
    step_size: float,
    num_local_steps: int,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
    clients_per_round: int | None = None,
) -> Algorithm:
    """Federated Q-learning with importance averaging: H local steps at step size eta, then each entry
    averaged over the agents with weights ``(1 - eta)^{-N_c(s, a)}`` (module docstring).

    Args:
      step_size: ``0 < eta < 1``, or a schedule of the local-step count ``k = t H + h``
        (:mod:`fedsa_jax.optim`) whose values stay below 1.
      num_local_steps: ``H >= 1`` (the synchronisation period).
      quantizer: uplink quantizer of the model differences (:mod:`fedsa_jax.channel`; default exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` (weights normalised over the agents asked) or
        ``"divide_by_received"`` (over those received).
      server_optimizer: None or an optax ``GradientTransformation`` on the pseudo-gradient
        ``Q_t - aggregate_t`` (:mod:`fedsa_jax.optim`).
      clients_per_round: None (every agent) or ``1 <= m <= N`` agents per round.

    Example:
      >>> import jax, numpy as np, fedsa_jax as fj
      >>> P = np.full((2, 2, 2, 2), 0.5); r = np.array([[0.0, 0.0], [1.0, 1.0]])
      >>> b = np.array([[[0.9, 0.1], [0.9, 0.1]], [[0.1, 0.9], [0.1, 0.9]]])
      >>> problem = fj.problems.q_learning(P, r, 0.9, sampling="asynchronous", behaviour=b)
      >>> res = fj.simulate(jax.random.key(0), problem, fj.importance_averaging(0.1, 10), 50, 64)
    """
    if isinstance(step_size, (int, float)) and not isinstance(step_size, bool):
        _validate.real("step_size", step_size, 0.0, 1.0, low_open=True, high_open=True)
    H = _validate.integer("num_local_steps", num_local_steps)
    config = local_steps_config(step_size, H, 1, quantizer, success_prob, aggregation, server_optimizer)
    config = with_clients_per_round(config, clients_per_round)
    return Algorithm(config, "importance_averaging", init, step)


def _from_options(step_size, args, **channel) -> Algorithm:
    for name in ("error_feedback", "downlink", "privacy"):
        if channel.pop(name, None) is not None:
            _validate.fail(name, "given", "importance averaging sends the model differences as they are")
    return importance_averaging(
        step_size, args.local_steps, clients_per_round=args.clients_per_round, **channel
    )


registry.register_algorithm(
    "importance-averaging",
    _from_options,
    options=(registry.LOCAL_STEPS, cohorts.CLIENTS_PER_ROUND),
    title="FedLSA with importance averaging",
    note="federated Q-learning: entries averaged with weights (1 - eta)^(-visits)",
    order=7,
)
