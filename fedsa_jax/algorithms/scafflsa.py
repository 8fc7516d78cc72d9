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
With error feedback ``q(m_c)`` is what the server reconstructs: EF14's ``C(m_c + e_c)``,
EF21's ``g_c`` (:mod:`fedsa_jax.channel`).
This composition can blow up at every step size: the control variates take the whole
correction each round and the memory delays part of it (on the default Garnet, top-k with
k <= 2 of 8 diverges with EF14 and EF21 at H = 1..1000, k >= 3 converges; top-k alone converges).
The compressed SCAFFOLD variants with guarantees (SCALLION, SCAFCOM: Huang, Li, Li, ICLR 2024)
damp the compressed control-variate step; here it is not damped.

Partial participation (``clients_per_round = m``): SCAFFOLD with sampled clients
(Karimireddy et al. 2020, Alg. 1, global step size 1) in SCAFFLSA's centred form. Each round
a cohort S of m agents is drawn uniformly without replacement, independently of everything
else; only the cohort runs its local steps (with its ``xi_c``), draws observations and
sends. The server averages over the cohort as FedLSA does (``1/m`` or ``1/|S ∩ R|``) and
the delivered set above becomes ``S ∩ R``: the cohort's control variates move against the
cohort's mean message, the others keep theirs, and ``sum_c xi_c`` stays 0. (SCAFFOLD's own
rule moves the server's ``c`` by ``(1/N) sum_{i in S} Delta c_i``, which shifts every
agent's ``c - c_i``, the cohort's and the others' alike, by that amount; the centred rule keeps
the idle agents' corrections as they were, so an agent's correction only changes with its
own messages, as under erasures.) With ``m = 1`` the cohort's mean message is its only
message, so the control variates never move and SCAFFLSA runs as FedLSA with one agent per
round; they learn from cohorts of two or more.

References: Mangold et al., "SCAFFLSA: Taming Heterogeneity in Federated Linear
Stochastic Approximation and TD Learning", NeurIPS 2024, arXiv:2402.04114,
Algorithm 2 and Sec. 5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate, moments, optim, registry
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
from fedsa_jax.channel.dp import (
    refuse_central_privacy,
)
from fedsa_jax.channel.local_work import (
    control_denominator,
    normalize_work,
    round_work,
    stepwise_active,
    work_weights,
)

__all__ = ["SCAFFLSAState", "scafflsa"]


class SCAFFLSAState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_star + error
    error: jax.Array  # (d,) theta - theta_star, what the rounds update (ErrorCoordinates)
    xi: jax.Array  # (N, d) control variates, sum over agents is 0
    sampler: jax.Array  # (N,)
    count: jax.Array  # () int32, rounds done (a schedule's local-step count is count H + h)
    opt_state: Any  # the server optimizer's state (() without one)
    memory: Any = ()  # the agents' error-feedback memory (N, d) (channel.init_memory; () without)
    hat: Any = ()  # the agents' copy of the model minus theta_star, with a downlink (() without)
    past: Any = ()  # (tau_max, d) the last server iterates minus theta_star, with delays (() without)


def init(key: jax.Array, problem, theta0: jax.Array, config: LocalStepsConfig) -> SCAFFLSAState:
    error = initial_error(problem, theta0)
    xi = jnp.zeros((problem.num_agents, problem.dim), problem.dtype)
    return SCAFFLSAState(
        problem.theta_star + error,
        error,
        xi,
        init_samplers(key, problem, problem.theta_star + error),
        jnp.int32(0),
        optim.init_server(config, error),
        config.channel.init_memory(problem.num_agents, problem.dim, problem.dtype),
        downlink_init(config, error),
        initial_past(config, error),
    )


def step(rand: RoundRandomness, state: SCAFFLSAState, problem, config: LocalStepsConfig):
    """One communication round for one seed, from its random numbers ``rand``. The control
    variates move against the channel's aggregate, divided by the sum of the round's steps."""
    H = config.num_local_steps
    eta = optim.step_sizes(config.step_size, state.count, H, problem.dtype)
    cohort = round_cohort(rand, config, problem)  # None: every agent
    start = state.error if getattr(config, "downlink", None) is None else state.hat  # the agents' copy
    start = delayed_starts(rand, config, problem, start, state.past)  # (N, d): theta_{t - tau_c}
    counts = round_work(rand, config, problem)  # None: every agent runs H (lockstep)
    active = stepwise_active(config, problem, state.count, counts)
    local, sampler = run_agents(
        rand.obs,
        ErrorCoordinates(problem),
        state.sampler,
        start,
        eta,
        config.skip,
        state.xi,
        active,
        work_weights(counts, rand.weights, H, problem.dtype),
    )
    local = normalize_work(config, counts, start, local)
    local, start = delayed_messages(state.error, start, local)  # delayed: updates move the current iterate
    sampler = keep_outside(cohort, sampler, state.sampler)  # agents outside the cohort drew nothing
    aggregate, delivery = server_update(rand.channel, start, local, config.channel, state.memory, cohort)
    denominator = control_denominator(config, eta, counts)
    xi = control_variate_update(state.xi, aggregate, local, delivery, config.channel, denominator, cohort)
    aggregate = from_reference(state.error, start, aggregate, config)
    error, opt_state = optim.server_step(config, state.opt_state, state.error, aggregate, problem.theta_star)
    hat = downlink_step(rand.channel, config, error, state.hat)
    past = pushed(config, state.past, state.error)
    state = SCAFFLSAState(
        problem.theta_star + error, error, xi, sampler, state.count + 1, opt_state, delivery.memory, hat, past
    )
    return state, round_info(local, error, delivery, config, problem, cohort, state.count - 1, counts)


def theory(config: LocalStepsConfig, problem) -> moments.Recursion:
    """The exact moment description of a round (:mod:`fedsa_jax.moments`): ``Y = (1, theta,
    xi_1..xi_N, theta^1..theta^N [, s, a])``; broadcast, H local steps with the control variates,
    the aggregate through the channel with the control variates' step against it (divided by
    ``sum_h eta_{tH+h}``), and the server optimizer's step; a compressed downlink as in FedLSA's."""
    y = moments.Augmented(problem, title="SCAFFLSA")
    work = config.local_work  # plain averaging over unequal counts keeps sum_c H_c xi_c, not sum_c xi_c
    plain = work is not None and work.normalization == "none" and work.deterministic
    weights = work.table(problem.num_agents).argmax(axis=1) + 1.0 if plain else True  # pyright: ignore
    y.add("xi", per_agent=True, zero_sum=weights)
    delay_blocks(y, config)
    y.add("loc", per_agent=True)
    into, server = moments.server_step(y, config.server_optimizer)
    reference, sent, shift, down = downlink_theory(y, config, into)

    def round(t, etas):
        steps = [moments.local_step(y, float(eta), controls="xi") for eta in etas]
        aggregate = moments.aggregate(
            y,
            config.channel,
            into=sent,
            reference=reference,
            control_variates="xi",
            denominator=_denominator(config, etas, y.N),
            clients_per_round=config.clients_per_round,
        )
        return [
            *delay_theory(y, config, steps, reference),
            aggregate,
            *([] if shift is None else [shift]),
            server,
            *([] if down is None else [down]),
        ]

    return moments.Recursion(y, round, config.step_size, config.num_local_steps)


def _denominator(config: LocalStepsConfig, etas, num_agents: int):
    """:func:`control_denominator` of the theory: ``sum_h eta_h``, FedNova's ``tau mean_h eta_h``, or
    with fixed per-agent counts one per agent; random counts with plain averaging are refused (the
    control variates divide by the agent's random count: the round is not linear in the state)."""
    work = config.local_work
    if work is None:
        return float(np.sum(etas))
    if work.normalization == "fednova":
        return work.tau(num_agents) * float(np.mean(etas))
    if not work.deterministic:
        _validate.fail(
            "algorithm",
            f"scafflsa with {work.name} local work",
            "no exact recursion: with plain averaging the control variates divide by each agent's "
            "random step count, which makes the round nonlinear in the state; fixed counts "
            "(fj.local_work.fixed) and normalization='fednova' are exact (simulate this one)",
        )
    work.check(num_agents)
    counts = work.table(num_agents).argmax(axis=1) + 1
    return tuple(float(np.sum(etas[:h])) for h in counts)


def _refuse_independent_random_work(config: LocalStepsConfig) -> None:
    """Refuse counts drawn per agent and round with plain averaging: agent c's control variate then
    moves by ``(theta_{t+1} - theta^c) / D_c`` with ``D_c`` its own random step sum, which keeps
    neither ``sum_c xi_c`` nor any fixed weighting of it. For small ``eta H`` the common part of the
    agents' corrections is multiplied each round by ``(1/N) sum_c H_{c,t+1} / H_{c,t}``, whose mean
    ``E[H] E[1/H]`` exceeds 1 (1.105 for a straggler law with prob 0.3, fraction 0.5): the iterate
    grows, faster with smaller steps, even on the noise-free mean system (a numpy loop of the
    definition, ``tests/test_first_use.py``). Fixed counts, a shared count and FedNova's normalised
    messages keep one weighting of the control variates and converge."""
    work = config.local_work
    if work is None or work.deterministic or work.shared or work.normalization != "none":
        return
    _validate.fail(
        "local_work",
        work.name,
        "SCAFFLSA diverges with counts drawn per agent and plain averaging (its control variates "
        "divide by each agent's random count), at every step size; use normalization='fednova' "
        "(--work-normalization fednova), a shared count (--local-work-shared) or fixed counts",
    )


def scafflsa(
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
    """SCAFFLSA with step size ``eta`` and ``H`` local steps per round.

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``
        (:mod:`fedsa_jax.optim`); the control variates then divide by
        ``sum_{h<H} eta_{tH+h}`` instead of ``eta H``.
      num_local_steps: ``H >= 1``; or local steps that change with the round, a table
        ``H_t`` (a list of integers, ``fj.local_steps(fn, num_rounds)``,
        ``fj.growing_local_steps(h0, power, num_rounds)``; :mod:`fedsa_jax.optim`).
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: uplink quantizer from :mod:`fedsa_jax.channel` (default: exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` or ``"divide_by_received"``.
      server_optimizer: None or an optax ``GradientTransformation`` on the pseudo-gradient
        ``theta_t - aggregate_t`` (:mod:`fedsa_jax.optim`); the control variates move
        against the aggregate, as without one.
      error_feedback: None, ``"ef14"`` or ``"ef21"``: error feedback on the uplink, for a
        compressor (a biased one such as ``fj.channel.top_k(k)`` needs it to converge to the
        uncompressed limit); see :mod:`fedsa_jax.channel` for what a lost message does.
      downlink: None (the model goes down exact) or ``fj.channel.channel(quantizer)`` (a contractive
        compressor, :mod:`fedsa_jax.channel.downlink`): the server broadcasts
        ``C(theta_{t+1} - theta_hat_t)`` to
        the agents' copy ``theta_hat`` (:mod:`fedsa_jax.channel.downlink`). The agents start their
        local steps from ``theta_hat`` (with their ``xi_c``), send ``m_c = theta^c_{t,H} -
        theta_hat_t``, and the control variates move against these messages as above
        (``xi_c += (mbar - q(m_c)) / (eta H)``: they see only what the agents hold); the server
        adds the aggregate of the messages to its own ``theta_t``.
      clients_per_round: None (every agent, every round) or ``1 <= m <= N``: a uniform cohort
        of m agents per round (see above).
      delays: None, or a law of :mod:`fedsa_jax.channel.delays`: agent c's local steps of round t start from
        the server iterate ``tau_c`` rounds old (with its current ``xi_c``), its update against that
        start moves the current iterate, and the control variates move against these updates as
        above (the limit is SCAFFLSA's, theta*).
      privacy: None, or the uplink's clipping and Gaussian noise, :func:`fedsa_jax.channel.privacy`
        (:mod:`fedsa_jax.channel.dp`); the run's epsilon is in ``result.privacy``. Central noise is
        refused: the control variates sent back to each agent carry the server's exact mean of the
        others' messages.
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
    refuse_central_privacy(config, "SCAFFLSA")
    _refuse_independent_random_work(config)
    config = with_delays(with_clients_per_round(config, clients_per_round), delays)
    return Algorithm(config, "scafflsa", init, step, theory, weighted=True)


def _from_options(step_size, args, **channel) -> Algorithm:
    delays = delays_from_text(
        getattr(args, "delays", "none") or "none", bool(getattr(args, "delays_shared", False))
    )
    return scafflsa(
        step_size,
        args.local_steps,
        skip=args.skip,
        clients_per_round=args.clients_per_round,
        delays=delays,
        **channel,
    )


registry.register_algorithm(
    "scafflsa",
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
    title="SCAFFLSA",
    order=1,
    default=True,
)
