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
this is FedTD, i.e. FedLSA with ``H = 1``. With ``error_feedback`` the directions go through
EF14 or EF21 (EF-TD, Mitra et al. 2023, arXiv:2301.00944, uses EF14 with top-k and sign).

Partial participation (``clients_per_round = m``; not in the paper): FedAvg's client sampling
(McMahan et al. 2017, Alg. 1), as for :func:`~fedsa_jax.fedlsa`: each round a cohort S of m
agents drawn uniformly without replacement (independently of everything else) observes and
uploads, the others' chains stay put, and ``theta_{k+1} = theta_k + (alpha / m) sum_{i in S}
b_{i,k} Q(g_{i,k})`` (``"divide_by_n"``: the same mean step ``alpha p mean_i A_bar[i]`` as with
every agent) or divided by the number received from S.

References: Dal Fabbro, Mitra, Pappas, "Federated TD Learning over Finite-Rate
Erasure Channels: Linear Speedup under Markovian Sampling", IEEE Control Systems
Letters, 2023, eq. (2).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    LocalStepsConfig,
    RoundRandomness,
    first_observation,
    init_samplers,
    initial_error,
    local_steps_config,
    round_info,
)
from fedsa_jax.algorithms.fedlsa import theory as fedlsa_theory
from fedsa_jax.channel import Delivery, aggregate, cohorts, transmit
from fedsa_jax.channel.cohorts import (
    keep_outside,
    round_cohort,
    with_clients_per_round,
)
from fedsa_jax.channel.downlink import (
    downlink_init,
    downlink_step,
)

__all__ = ["QFedTDState", "qfedtd"]


class QFedTDState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_k = theta_star + error
    error: jax.Array  # (d,) theta_k - theta_star, what the rounds update (ErrorCoordinates)
    sampler: jax.Array  # (N,) each agent's chain state
    count: jax.Array  # () int32, rounds done (= the schedule's count: one step per round)
    opt_state: Any  # the server optimizer's state (() without one)
    memory: Any = ()  # the agents' error-feedback memory (N, d) (channel.init_memory; () without)
    hat: Any = ()  # the agents' copy of the model minus theta_star, with a downlink (() without)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> QFedTDState:
    error = initial_error(problem, theta0)
    return QFedTDState(
        problem.theta_star + error,
        error,
        init_samplers(key, problem, problem.theta_star + error),
        jnp.int32(0),
        optim.init_server(config, error),
        config.channel.init_memory(problem.num_agents, problem.dim, problem.dtype),
        downlink_init(config, error),
    )


def step(rand: RoundRandomness, state: QFedTDState, problem, config: LocalStepsConfig):
    """One round (one TD step per agent) for one seed, in error coordinates
    (:class:`~fedsa_jax.algorithms.ErrorCoordinates`)."""
    alpha = optim.step_sizes(config.step_size, state.count, 1, problem.dtype)
    alpha = alpha if alpha.ndim == 0 else alpha[0]
    view = ErrorCoordinates(problem)
    start = state.error if getattr(config, "downlink", None) is None else state.hat  # the agents' copy

    def direction(rand_c, params, sampler):
        first, sampler = first_observation(view, params, sampler, rand_c, start)
        return -view.direction(params, first, start), sampler  # g = b(Z) - A(Z) theta

    g, sampler = jax.vmap(direction)(rand.obs, problem.agent_params(), state.sampler)
    if rand.weights is not None:  # fj.bootstrap: each agent's update g_c times its multiplier
        g = g * rand.weights[:, :1]
    ch = config.channel
    cohort = round_cohort(rand, config, problem)  # None: every agent
    sampler = keep_outside(cohort, sampler, state.sampler)  # agents outside the cohort drew nothing
    if ch.trivial and cohort is None:
        delivery = _exact(g)
    else:
        delivery = transmit(rand.channel, g, ch, state.memory, cohort)
    combined = state.error + alpha * aggregate(delivery)  # sum_c w_c q(g_c), as a dot (faster)
    error, opt_state = optim.server_step(config, state.opt_state, state.error, combined, problem.theta_star)
    info = round_info(jnp.broadcast_to(state.error, g.shape), state.error, delivery, config, problem, cohort)
    info = info._replace(client_drift=jnp.zeros((), g.dtype))  # one step: no local drift (nothing computed)
    hat = downlink_step(rand.channel, config, error, state.hat)
    state = QFedTDState(
        problem.theta_star + error, error, sampler, state.count + 1, opt_state, delivery.memory, hat
    )
    return state, info


def theory(config: LocalStepsConfig, problem):
    """FedLSA's round with ``H = 1`` (its message is ``alpha g``). With error feedback the memories
    are then ``alpha`` times QFedTD's, the same iterates for a constant ``alpha`` only
    (``C(alpha x) = alpha C(x)`` for rand-k), and privacy noise ``sigma C`` on ``g`` is ``alpha sigma
    C`` on the message: a schedule is refused with either."""
    ch = config.channel
    if (ch.error_feedback is not None or ch.privacy is not None) and isinstance(
        config.step_size, optim.Schedule
    ):
        _validate.fail(
            "step_size",
            "a schedule",
            "QFedTD's exact recursion with error feedback or privacy noise needs a constant step size",
        )
    if ch.privacy is not None:  # the noise in the units of the message alpha g
        scaled = dataclasses.replace(ch.privacy, clip_norm=ch.privacy.clip_norm * float(config.step_size))
        config = dataclasses.replace(config, channel=dataclasses.replace(ch, privacy=scaled))
    return fedlsa_theory(config, problem)


def _exact(g: jax.Array) -> Delivery:
    """Every message delivered exactly, weights ``1/N``."""
    N = g.shape[0]
    return Delivery(g, jnp.ones((N,), bool), jnp.full((N,), 1.0 / N, g.dtype))


def qfedtd(
    step_size: float,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
    error_feedback: str | None = None,
    downlink=None,
    clients_per_round: int | None = None,
    privacy=None,
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
      error_feedback: None, ``"ef14"`` or ``"ef21"``: error feedback on the uplink, for a
        compressor (a biased one such as ``fj.channel.top_k(k)`` needs it to converge to the
        uncompressed limit); see :mod:`fedsa_jax.channel` for what a lost message does.
      downlink: None (the model goes down exact) or ``fj.channel.channel(quantizer)`` (a contractive
        compressor, :mod:`fedsa_jax.channel.downlink`): the server broadcasts
        ``C(theta_{k+1} - theta_hat_k)`` to
        the agents' copy ``theta_hat`` (:mod:`fedsa_jax.channel.downlink`); the agents evaluate
        their direction ``g_c = b_c(Z) - A_c(Z) theta_hat_k`` there and the server steps its own
        model, ``theta_{k+1} = theta_k + alpha sum_c w_c q(g_c)``.
      clients_per_round: None (every agent, every round) or ``1 <= m <= N``: each round a
        cohort of m agents drawn uniformly without replacement steps and sends (see
        :func:`fedsa_jax.fedlsa`); the server divides by m (``"divide_by_n"``) or by the number
        received from the cohort.
      privacy: None, or the uplink's clipping and Gaussian noise, :func:`fedsa_jax.channel.privacy`
        (:mod:`fedsa_jax.channel.dp`); the run's epsilon is in ``result.privacy``.

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40)
      >>> alg = fj.qfedtd(0.6, fj.channel.stochastic_uniform(bits=4), success_prob=0.6)
      >>> res = fj.simulate(jax.random.key(1), problem, alg, num_rounds=200, num_seeds=256)
    """
    config = local_steps_config(
        step_size,
        1,
        1,
        quantizer,
        success_prob,
        aggregation,
        server_optimizer,
        error_feedback,
        downlink,
        privacy,
    )
    config = with_clients_per_round(config, clients_per_round)
    return Algorithm(config, "qfedtd", init, step, theory, weighted=True)  # FedLSA's round with H = 1


def _from_options(step_size, args, **channel) -> Algorithm:
    return qfedtd(step_size, clients_per_round=args.clients_per_round, **channel)


registry.register_algorithm(
    "qfedtd",
    _from_options,
    options=(cohorts.CLIENTS_PER_ROUND,),
    title="QFedTD",
    note="one local step per round",
    order=2,
)
