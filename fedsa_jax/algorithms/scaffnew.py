"""Scaffnew (ProxSkip for federated learning): control variates and randomly skipped communication.

Every agent c keeps a local iterate ``x_c`` and a control variate ``h_c`` (stored as
``xi``, the name SCAFFLSA uses, so that the metric ``"control_variate_error"``
applies; ``h_c = 0`` at start). At every local step k, every agent moves

    xh_c = x_c - eta (A_c(Z_{c,k}) x_c - b_c(Z_{c,k}) - h_c),

then one coin ``theta_k ~ Bernoulli(p)``, shared by all agents, decides whether they
communicate:

    theta_k = 1:  x_c = (1/N) sum_j xh_j,   h_c <- h_c + (p / eta) (x_c - xh_c),
    theta_k = 0:  x_c = xh_c.

A round is ``H = num_local_steps`` local steps (``p H`` communications on average), and
the server iterate scored by the MSE is ``theta_t = (1/N) sum_c x_c`` after round t.
The updates keep ``sum_c h_c = 0``, so averaging preserves the mean and
``theta`` moves like centralised LSA, ``theta <- theta - eta (1/N) sum_c (A_c(Z) x_c - b_c(Z))``.
The fixed point is ``x_c = theta_star``, ``h_c = xi_c* = A_bar[c] theta_star - b_bar[c]``:
no heterogeneity bias, whatever p and H. With ``p = 1`` every step communicates,
``theta`` follows FedLSA with one local step (H of them per round) and
``h_c = g_c - (1/N) sum_j g_j`` with ``g_c = A_c(Z) theta - b_c(Z)`` of the last step.
ProxSkip (``p`` about ``sqrt(eta mu)``) communicates ``O(sqrt(kappa) log(1/eps))``
times where gradient descent needs ``O(kappa log(1/eps))``.

Channel (beyond the paper): on a communication agent c uploads
``m_c = xh_c - x_sync``, where ``x_sync`` is the last synchronised iterate (the server's
model; ``theta_0`` at start), through a quantizer q; the message is delivered with
probability ``success_prob``. The server sets ``x_sync <- x_sync + sum_c w_c q(m_c)``
(``w_c = 1/N`` for ``"divide_by_n"`` or ``1/|R|`` for ``"divide_by_received"`` on the
delivered set R, 0 elsewhere) and broadcasts it with R; every agent restarts from it
(``x_c = x_sync``), and only delivered agents move their control variate, against the
mean of the delivered messages ``mbar_R = (1/|R|) sum_{j in R} q(m_j)``:

    h_c <- h_c + (p / eta) (mbar_R - q(m_c))   for c in R;   h_c unchanged otherwise.

As in SCAFFLSA, a lost message discards that agent's local work since the last
synchronisation and leaves its control variate unchanged, and ``sum_c h_c`` stays
exactly 0 for either rule. With an exact channel this is the update above. Error feedback
(:mod:`fedsa_jax.channel`) acts on the messages of the communications only: the memory moves
when the coin says the step communicates.

Randomness: the round's observations are one block, as for FedLSA (agent c's k-th
local step uses its k-th observation). The round's channel key ``k`` is split,
``(k_coin, k_send) = split(k)``; the coins are ``uniform(k_coin, (H,)) < p`` (dtype of
the problem), and with a lossy channel local step k transmits with
``split(k_send, H)[k]``. The communication is evaluated at every local step and kept
where the coin says so (under ``vmap`` a branch costs both sides), so a lossy
channel quantizes H times per round.

Accounting (:class:`~fedsa_jax.algorithms.RoundInfo`): N messages per communication,
each of ``channel.quantizer.bits(d)`` bits, the delivered ones counted;
``N H`` observations (times ``skip`` under Markov sampling); ``client_drift`` is
``mean_c |x_c - theta_{t+1}|^2`` at the end of the round (0 if its last step
communicated).

Partial participation (``clients_per_round = m``): ProxSkip's Scaffnew has every agent train
and communicate; client sampling is studied in its successors 5GCS (Grudzień, Malinovsky,
Richtárik, "Can 5th Generation Local Training Methods Support Client Sampling? Yes!", AISTATS
2023, arXiv:2212.14370) and TAMUNA (Condat, Agarský, Malinovsky, Richtárik, arXiv:2302.09832,
2023), where a cohort is chosen when a local-training period starts and only it trains,
communicates and moves its control variates. We follow that structure with Scaffnew's own
update: a cohort S of m agents is drawn uniformly without replacement at the start and after
each communication (independently of everything else); until the next communication only S
draws observations and steps (the others hold ``x_c = x_sync`` and their ``h_c``); the
communication aggregates over S as SCAFFLSA does (``1/m`` or ``1/|S ∩ R|``, the delivered set
becoming ``S ∩ R``, so ``sum_c h_c`` stays 0), and the server model goes to every agent. The
scored iterate is the cohort's mean ``theta_t = (1/m) sum_{c in S} x_c``. Accounting: m
messages per communication, ``m H`` observations per round. For the exact theory the idle
agents may as well train on fresh observations whose work is discarded: S is independent of
their iterates when it is used, so only the aggregation's weights change.

References: Mishchenko, Malinovsky, Stich, Richtárik, "ProxSkip: Yes! Local Gradient
Steps Provably Lead to Communication Acceleration! Finally!", ICML 2022,
arXiv:2202.09357, Algorithm 2 (Scaffnew); Mangold et al., "SCAFFLSA", NeurIPS 2024,
arXiv:2402.04114 (its derandomised version for LSA).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, moments, optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    RoundInfo,
    RoundRandomness,
    control_variate_update,
    init_samplers,
    initial_error,
    local_steps_config,
    observations_per_step,
    server_update,
)
from fedsa_jax.channel import Channel, broadcast, channel, cohorts, downlink_key
from fedsa_jax.channel.cohorts import (
    COHORT_STREAM,
    cohort_active,
    cohort_mask,
    keep_outside,
    with_clients_per_round,
)
from fedsa_jax.channel.downlink import (
    downlink_bits,
    downlink_init,
    downlink_theory,
    from_reference,
)
from fedsa_jax.channel.dp import (
    refuse_central_privacy,
)
from fedsa_jax.channel.local_work import (
    LocalWork,
    stepwise_active,
)
from fedsa_jax.problems.protocol import local_unroll

__all__ = ["ScaffnewConfig", "ScaffnewState", "scaffnew"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScaffnewConfig:
    """Hyperparameters of Scaffnew; ``step_size``, ``comm_prob`` and the channel's
    success probability are traced leaves (sweeping them does not recompile)."""

    step_size: Any  # eta: a float or a schedule of the local-step count (fedsa_jax.optim)
    comm_prob: float  # p, probability that a local step ends with a communication
    channel: Channel  # uplink
    num_local_steps: Any = dataclasses.field(metadata=dict(static=True))  # H (or fj.optim.LocalSteps)
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))  # keep 1 obs out of skip
    server_optimizer: Any = None  # None or an optax transformation applied at each communication
    downlink: Any = dataclasses.field(default=None, metadata=dict(omit_none=True))  # None or a Channel
    clients_per_round: int | None = dataclasses.field(default=None, metadata=dict(static=True))  # m

    @property
    def releases_per_round(self) -> None:
        """Uplink releases per round: random (a communication ends each local step with probability
        p), so a privacy budget cannot be spread over rounds in advance (``--target-epsilon``)."""
        return None

    @property
    def cohort_per_step(self) -> bool:
        """Whether each local step draws its observations as its own cohort's (``m < N``, the
        module's "Partial participation"), not from the round's one block."""
        return self.clients_per_round is not None


class ScaffnewState(NamedTuple):
    """Iterates are held as errors from ``theta_star`` (:class:`~fedsa_jax.algorithms.ErrorCoordinates`)."""

    theta: jax.Array  # (d,) mean_c x_c, the iterate scored by the MSE (theta_star + error)
    error: jax.Array  # (d,) theta - theta_star
    x: jax.Array  # (N, d) the agents' iterates, minus theta_star
    xi: jax.Array  # (N, d) control variates (the paper's h_c), sum over agents is 0
    x_sync: jax.Array  # (d,) last synchronised iterate minus theta_star, reference of the uplink messages
    sampler: jax.Array  # (N,) each agent's observation-stream state
    count: jax.Array  # () int32, rounds done (a schedule's local-step count is count H + h)
    opt_state: Any  # the server optimizer's state (() without one), stepped at each communication
    memory: Any = ()  # the agents' error-feedback memory (N, d) (channel.init_memory; () without)
    hat: Any = ()  # the agents' copy of x_sync, with a downlink (() without)
    cohort: Any = None  # (N,) bool, the agents of the current local-training period (None: every agent)


def init(key: jax.Array, problem, theta0: jax.Array, config: ScaffnewConfig) -> ScaffnewState:
    error = initial_error(problem, theta0)
    x = jnp.broadcast_to(error, (problem.num_agents, problem.dim))
    xi = jnp.zeros((problem.num_agents, problem.dim), problem.dtype)
    state = ScaffnewState(
        problem.theta_star + error,
        error,
        x,
        xi,
        error,
        init_samplers(key, problem, problem.theta_star + error),
        jnp.int32(0),
        optim.init_server(config, error),
        config.channel.init_memory(problem.num_agents, problem.dim, problem.dtype),
        downlink_init(config, error),
    )
    if not cohort_active(config, problem.num_agents):
        return state
    m = int(config.clients_per_round)  # pyright: ignore[reportArgumentType] (an int when active)
    return state._replace(cohort=cohort_mask(jax.random.fold_in(key, COHORT_STREAM), problem.num_agents, m))


def step(rand: RoundRandomness, state: ScaffnewState, problem, config: ScaffnewConfig):
    """One round (H local steps, each followed by a communication with probability p) for one seed."""
    if state.cohort is not None:
        return _cohort_step(rand, state, problem, config)
    dtype = problem.dtype
    H, ch = optim.max_local_steps(config.num_local_steps), config.channel
    etas = jnp.broadcast_to(
        optim.step_sizes(config.step_size, state.count, config.num_local_steps, dtype), (H,)
    )
    p = jnp.asarray(config.comm_prob, dtype)
    params = problem.agent_params()
    view = ErrorCoordinates(problem)
    observe = jax.vmap(lambda *a: problem.observe(*a, config.skip))
    active = stepwise_active(config, problem, state.count)  # Markov, H_t: observe step by step
    if active is None:
        obs, sampler = observe(params, state.sampler, rand.obs)
        obs = jax.tree.map(lambda o: jnp.swapaxes(o, 0, 1), obs)  # (H, N, ...): scanned over local steps
        acts = None
    else:
        obs, sampler, acts = rand.obs, state.sampler, active  # (H, N, ...) blocks of one observation
    k_coin, k_send = jax.random.split(rand.channel)
    coins = _coins(k_coin, H, p, config, state.count)
    send_keys = None if ch.trivial else jax.random.split(k_send, H)

    def local_step(carry, xs):
        x, sync, sampler = carry
        o, coin, key, down_key, eta, act, w = xs
        if act is not None:
            o, moved = observe(params, sampler, o)
            sampler = jax.tree.map(lambda n, old: jnp.where(act, n, old), moved, sampler)
            o = jax.tree.map(lambda a: a[:, 0], o)
        xh = x - _weighted(eta, w) * (jax.vmap(view.direction)(params, o, x) - sync[0])
        return (*_communicate(coin, key, down_key, xh, sync, eta / p, problem, config), sampler), None

    carry = (state.x, _sync_carry(state), sampler)
    (x, (xi, x_sync, opt_state, delivered, memory, hat), sampler), _ = jax.lax.scan(
        local_step,
        carry,
        (obs, coins, send_keys, _down_keys(rand, config, H), etas, acts, _step_weights(rand)),
        unroll=local_unroll(H),
    )
    error = x.mean(axis=0)
    N, d = x.shape
    drift = jnp.mean(jnp.sum((x - error) ** 2, axis=-1))
    info = _round_info(coins, delivered, N, config, problem, drift, state.count)
    new = ScaffnewState(
        problem.theta_star + error, error, x, xi, x_sync, sampler, state.count + 1, opt_state, memory, hat
    )
    return new, info


def _step_weights(rand: RoundRandomness):
    """The round's multipliers ``(H_max, N)``, steps first (scanned), or None."""
    return None if rand.weights is None else jnp.moveaxis(rand.weights, 1, 0)


def _weighted(eta, w):
    """A local step's size for every agent: ``eta`` (a scalar), or ``(eta w_c)_c (N, 1)`` with the
    step's multipliers ``w (N,)``."""
    return eta if w is None else (eta * w)[:, None]


def _sync_carry(state: ScaffnewState):
    """What a communication moves besides the iterates: ``(xi, x_sync, opt_state, delivered,
    memory, hat)`` (``delivered``: the round's counts of delivered messages and of messages the
    privacy clipping shortened, from 0)."""
    return state.xi, state.x_sync, state.opt_state, jnp.zeros((2,), jnp.int32), state.memory, state.hat


def _down_keys(rand: RoundRandomness, config, H: int):
    """The H local steps' downlink keys (None without a compressed downlink)."""
    if getattr(config, "downlink", None) is None:  # a user's config may have none
        return None
    return jax.random.split(downlink_key(rand.channel), H)


def _coins(key, H: int, p, config, count):
    """The round's H_max communication coins, ``uniform(key, (H_max,)) < p``, False past ``H_t``
    (local steps that change with the round)."""
    coins = jax.random.uniform(key, (H,), p.dtype) < p
    active = optim.active_steps(config.num_local_steps, count)
    return coins if active is None else coins & active


def _round_info(coins, delivered, senders: int, config, problem, client_drift, count) -> RoundInfo:
    """The round's counts: ``senders`` messages per communication (N, or m with a cohort); ``count``
    the round's (rounds done before it); ``delivered``: the messages delivered and clipped."""
    (delivered, clipped), dtype = delivered, client_drift.dtype
    d, H = problem.dim, optim.round_local_steps(config.num_local_steps, count)
    bits = config.channel.quantizer.bits(d)
    communications = jnp.sum(coins)
    sent = jnp.int32(senders) * communications.astype(jnp.int32)
    down = downlink_bits(config, problem.num_agents, d, communications)
    return RoundInfo(
        client_drift=client_drift,
        messages_sent=sent,
        messages_delivered=delivered,
        bits_sent=sent * jnp.int32(bits),
        bits_delivered=delivered * jnp.int32(bits),
        observations=jnp.int32(senders * observations_per_step(problem, config.skip)) * H,
        downlink_bits_sent=down,
        downlink_bits_delivered=down,
        clipped_fraction=clipped.astype(dtype) / jnp.maximum(sent, 1).astype(dtype),  # of all communications'
    )


def _communicate(coin, key, down_key, xh, sync, denominator, problem, config, cohort=None):
    """A local step's communication, kept where its coin says so: the aggregate of the messages
    ``xh_c - ref`` (of the cohort, if any; ``ref`` is ``x_sync``, or the agents' copy hat with a
    downlink), the control variates' step (divided by ``eta / p``), the optimizer's step, the
    broadcast, every agent restarting from the new model (or its copy); returns the new
    ``(x, sync)``, ``sync`` as :func:`_sync_carry`."""
    xi, x_sync, opt_state, delivered, memory, hat = sync
    ch, dl = config.channel, getattr(config, "downlink", None)
    ref = x_sync if dl is None else hat  # the agents' copy of x_sync
    aggregate, delivery = server_update(key, ref, xh, ch, memory, cohort)
    xi_synced = control_variate_update(xi, aggregate, xh, delivery, ch, denominator, cohort)
    aggregate = from_reference(x_sync, ref, aggregate, config)
    synced, opt_synced = optim.server_step(config, opt_state, x_sync, aggregate, problem.theta_star)
    hat_synced = hat if dl is None else broadcast(down_key, synced, hat, dl)
    restart = synced if dl is None else hat_synced
    x = jnp.where(coin, jnp.broadcast_to(restart, xh.shape), xh)
    xi = jnp.where(coin, xi_synced, xi)
    x_sync = jnp.where(coin, synced, x_sync)
    opt_state, memory, hat = jax.tree.map(
        lambda new, old: jnp.where(coin, new, old),
        (opt_synced, delivery.memory, hat_synced),
        (opt_state, memory, hat),
    )
    counts = jnp.stack([jnp.sum(delivery.delivered), jnp.asarray(delivery.clipped)]).astype(jnp.int32)
    delivered = delivered + jnp.where(coin, counts, 0)
    return x, (xi, x_sync, opt_state, delivered, memory, hat)


def _cohort_step(rand: RoundRandomness, state: ScaffnewState, problem, config: ScaffnewConfig):
    """One round with a cohort of ``m < N`` agents per local-training period (the module's
    "Partial participation"): each local step has its own block of one observation per agent
    (from the round's cohort key; the H blocks and the H candidate next cohorts are drawn at once),
    so that an agent's stream moves only on the steps where it trains; a communication switches
    to that step's next cohort."""
    dtype, N = problem.dtype, problem.num_agents
    H, m = optim.max_local_steps(config.num_local_steps), int(config.clients_per_round or N)
    etas = jnp.broadcast_to(
        optim.step_sizes(config.step_size, state.count, config.num_local_steps, dtype), (H,)
    )
    p = jnp.asarray(config.comm_prob, dtype)
    params = problem.agent_params()
    view = ErrorCoordinates(problem)
    k_coin, k_send = jax.random.split(rand.channel)
    coins = _coins(k_coin, H, p, config, state.count)
    active = optim.active_steps(config.num_local_steps, state.count)
    acts = jnp.ones((H,), bool) if active is None else active
    # per step k: (k_obs, k_next) = split(split(rand.cohort, H)[k]), drawn for all steps at once
    k_obs, k_next = jnp.moveaxis(jax.vmap(jax.random.split)(jax.random.split(rand.cohort, H)), 1, 0)
    blocks = jax.vmap(lambda k: problem.randomness(k, N, 1, config.skip))(k_obs)
    next_cohorts = jax.vmap(lambda k: cohort_mask(k, N, m))(k_next)

    def local_step(carry, xs):
        x, sync, sampler, cohort = carry
        coin, key, down_key, block, next_cohort, eta, act, w = xs
        obs, moved = jax.vmap(lambda *a: problem.observe(*a, config.skip))(params, sampler, block)
        sampler = keep_outside(cohort & act, moved, sampler)  # idle agents (and steps past H_t) draw nothing
        o = jax.tree.map(lambda a: a[:, 0], obs)
        xh = keep_outside(
            cohort, x - _weighted(eta, w) * (jax.vmap(view.direction)(params, o, x) - sync[0]), x
        )
        x, sync = _communicate(coin, key, down_key, xh, sync, eta / p, problem, config, cohort)
        cohort = jnp.where(coin, next_cohort, cohort)
        return (x, sync, sampler, cohort), None

    carry = (state.x, _sync_carry(state), state.sampler, state.cohort)
    (x, (xi, x_sync, opt_state, delivered, memory, hat), sampler, cohort), _ = jax.lax.scan(
        local_step,
        carry,
        (
            coins,
            jax.random.split(k_send, H),
            _down_keys(rand, config, H),
            blocks,
            next_cohorts,
            etas,
            acts,
            _step_weights(rand),
        ),
        unroll=local_unroll(H),
    )
    inside = cohort[:, None]
    error = jnp.sum(jnp.where(inside, x, 0.0), axis=0) / m  # the cohort's mean (idle agents hold x_sync)
    drift = jnp.sum(jnp.where(inside, (x - error) ** 2, 0.0)) / m
    info = _round_info(coins, delivered, m, config, problem, drift, state.count)
    new = ScaffnewState(
        problem.theta_star + error, error, x, xi, x_sync, sampler, state.count + 1, opt_state, memory, hat
    )
    return new._replace(cohort=cohort), info


def theory(config: ScaffnewConfig, problem) -> moments.Recursion:
    """The exact moment description of a round (:mod:`fedsa_jax.moments`): ``Y = (1, theta,
    xi_1..xi_N, x_1..x_N, x_sync [, s, a])``, the agents' iterates and ``x_sync`` carried across
    rounds. Each local step is followed, on a coin of probability p, by the communication:
    aggregate into ``x_sync`` (or a for the optimizer) with the control variates' step (divided
    by ``eta / p``), the optimizer's step, every agent restarting from ``x_sync``. The round
    ends with ``theta <- mean_c x_c`` (with a cohort: the agents' restart point plus the cohort's
    mean message, the aggregation of an exact channel over a cohort drawn independently of the
    iterates). A compressed downlink: the messages are taken against the agents' copy hat, which
    the broadcast of ``x_sync`` moves and the agents restart from."""
    y = moments.Augmented(problem, title="Scaffnew", theta_carried=False)
    y.add("xi", per_agent=True, zero_sum=True)
    y.add("loc", per_agent=True, initial=moments.START, carried=True)
    y.add("sync", initial=moments.START, carried=True)
    into, server = moments.server_step(y, config.server_optimizer, reference="sync")
    reference, sent, shift, down = downlink_theory(y, config, into, target="sync")
    p, m = float(config.comm_prob), config.clients_per_round

    @functools.lru_cache(maxsize=64)  # one object per step size: a constant step builds it once
    def step(eta):
        send = moments.aggregate(
            y,
            config.channel,
            into=sent,
            reference=reference,
            control_variates="xi",
            denominator=eta / p,
            clients_per_round=m,
        )
        restart = moments.broadcast(y, source=reference)
        talk = moments.chain(y, ("communication", eta), send, shift, server, down, restart)
        return moments.chain(
            y, ("local", eta), moments.local_step(y, eta, controls="xi"), moments.coin(p, talk)
        )

    mean = moments.agents_mean(y)
    if m is not None and m < y.N:  # the scored iterate is the cohort's mean: a draw of S (see the module)
        mean = moments.aggregate(y, channel(), into="theta", reference=reference, clients_per_round=m)
    return moments.Recursion(
        y,
        lambda t, etas: [*(step(float(eta)) for eta in etas), mean],
        config.step_size,
        config.num_local_steps,
    )


def scaffnew(
    step_size: float,
    comm_prob: float,
    num_local_steps: int | Sequence[int] | optim.LocalSteps,
    skip: int = 1,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
    error_feedback: str | None = None,
    downlink=None,
    clients_per_round: int | None = None,
    privacy=None,
) -> Algorithm:
    """Scaffnew with step size ``eta``, communication probability ``p`` and ``H`` local steps
    per round (a round is H local steps; it communicates ``p H`` times on average).

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``
        (:mod:`fedsa_jax.optim`); a communication at step k divides by ``eta_k / p``.
      comm_prob: ``p`` in ``(0, 1]``, probability that a local step ends with a
        communication (one coin for all agents).
      num_local_steps: ``H >= 1``, local steps per recorded round; or local steps that change
        with the round, a table ``H_t`` (a list of integers, ``fj.local_steps(fn, num_rounds)``,
        ``fj.growing_local_steps(h0, power, num_rounds)``; :mod:`fedsa_jax.optim`).
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: uplink quantizer from :mod:`fedsa_jax.channel` (default: exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` or ``"divide_by_received"``.
      server_optimizer: None or an optax ``GradientTransformation``, stepped at each
        communication on the pseudo-gradient ``x_sync - aggregate`` (:mod:`fedsa_jax.optim`).
      error_feedback: None, ``"ef14"`` or ``"ef21"``: error feedback on the uplink, for a
        compressor (a biased one such as ``fj.channel.top_k(k)`` needs it to converge to the
        uncompressed limit); see :mod:`fedsa_jax.channel` for what a lost message does.
      downlink: None (``x_sync`` goes down exact) or ``fj.channel.channel(quantizer)`` (a contractive
        compressor): at each communication the server broadcasts
        ``C(x_sync - x_hat)`` to the agents' copy ``x_hat`` (:mod:`fedsa_jax.channel.downlink`);
        the agents restart from ``x_hat`` (so ``theta = mean_c x_c`` is ``x_hat`` after a
        communication), send ``m_c = xh_c - x_hat``, and their control variates move against these
        messages as above; the server adds the aggregate to its own ``x_sync``. One broadcast per
        communication, counted once per agent.
      clients_per_round: None (every agent) or ``1 <= m <= N``: a uniform cohort of m agents per
        local-training period, drawn at each communication (see the module's "Partial participation").
      privacy: None, or the uplink's clipping and Gaussian noise, :func:`fedsa_jax.channel.privacy`
        (:mod:`fedsa_jax.channel.dp`); the run's epsilon is in ``result.privacy``. Central noise is
        refused: the control variates sent back to each agent carry the server's exact mean of the
        others' messages.

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4, heterogeneity="heterogeneous")
      >>> res = fj.simulate(jax.random.key(1), problem, fj.scaffnew(0.1, 0.2, 10), 20, 64,
      ...                   metrics=["control_variate_error"])
      >>> sent = res.communications[-1]  # about 20 rounds x 10 steps x 0.2 x 4 agents = 160
    """
    if isinstance(num_local_steps, LocalWork):
        _validate.fail(
            "num_local_steps",
            num_local_steps.name,
            "Scaffnew's agents communicate on random steps, not after rounds of local work: "
            "heterogeneous local work runs with fj.fedlsa and fj.scafflsa",
        )
    base = local_steps_config(
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
    refuse_central_privacy(base, "Scaffnew")
    p = _validate.real("comm_prob", comm_prob, 0.0, 1.0, low_open=True)
    config = ScaffnewConfig(
        base.step_size, p, base.channel, base.num_local_steps, base.skip, base.server_optimizer, base.downlink
    )
    config = with_clients_per_round(config, clients_per_round)
    return Algorithm(config, "scaffnew", init, step, theory, weighted=True)


COMM_PROB = registry.Option(
    ("--comm-prob",),
    "comm_prob",
    "scaffnew: probability that a local step ends with a communication",
    registry.real,
    0.2,
    group="algorithms",
    params=("comm_prob",),
)


def _from_options(step_size, args, **channel) -> Algorithm:
    return scaffnew(
        step_size,
        args.comm_prob,
        args.local_steps,
        skip=args.skip,
        clients_per_round=args.clients_per_round,
        **channel,
    )


registry.register_algorithm(
    "scaffnew",
    _from_options,
    options=(
        COMM_PROB,
        registry.LOCAL_STEPS,
        registry.LOCAL_STEPS_GROWTH,
        registry.SKIP,
        cohorts.CLIENTS_PER_ROUND,
    ),
    title="Scaffnew",
    order=3,
)
