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
exactly 0 for either rule. With an exact channel this is the update above.

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

References: Mishchenko, Malinovsky, Stich, Richtárik, "ProxSkip: Yes! Local Gradient
Steps Provably Lead to Communication Acceleration! Finally!", ICML 2022,
arXiv:2202.09357, Algorithm 2 (Scaffnew); Mangold et al., "SCAFFLSA", NeurIPS 2024,
arXiv:2402.04114 (its derandomised version for LSA).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, moments, optim, registry
from fedsa_jax.algorithms._base import (
    LOCAL_UNROLL,
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
from fedsa_jax.channel import Channel

__all__ = ["ScaffnewConfig", "ScaffnewState", "scaffnew"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScaffnewConfig:
    """Hyperparameters of Scaffnew; ``step_size``, ``comm_prob`` and the channel's
    success probability are traced leaves (sweeping them does not recompile)."""

    step_size: Any  # eta: a float or a schedule of the local-step count (fedsa_jax.optim)
    comm_prob: float  # p, probability that a local step ends with a communication
    channel: Channel  # uplink
    num_local_steps: int = dataclasses.field(metadata=dict(static=True))  # H local steps per round
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))  # keep 1 obs out of skip
    server_optimizer: Any = None  # None or an optax transformation applied at each communication


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


def init(key: jax.Array, problem, theta0: jax.Array, config: ScaffnewConfig) -> ScaffnewState:
    error = initial_error(problem, theta0)
    x = jnp.broadcast_to(error, (problem.num_agents, problem.dim))
    xi = jnp.zeros((problem.num_agents, problem.dim), problem.dtype)
    return ScaffnewState(
        problem.theta_star + error,
        error,
        x,
        xi,
        error,
        init_samplers(key, problem),
        jnp.int32(0),
        optim.init_server(config, error),
    )


def step(rand: RoundRandomness, state: ScaffnewState, problem, config: ScaffnewConfig):
    """One round (H local steps, each followed by a communication with probability p) for one seed."""
    dtype = problem.dtype
    H, ch = config.num_local_steps, config.channel
    etas = jnp.broadcast_to(optim.step_sizes(config.step_size, state.count, H, dtype), (H,))
    p = jnp.asarray(config.comm_prob, dtype)
    params = problem.agent_params()
    view = ErrorCoordinates(problem)
    obs, sampler = jax.vmap(lambda *a: problem.observe(*a, config.skip))(params, state.sampler, rand.obs)
    obs = jax.tree.map(lambda o: jnp.swapaxes(o, 0, 1), obs)  # (H, N, ...): scanned over local steps
    k_coin, k_send = jax.random.split(rand.channel)
    coins = jax.random.uniform(k_coin, (H,), dtype) < p
    send_keys = None if ch.trivial else jax.random.split(k_send, H)

    def local_step(carry, xs):
        x, xi, x_sync, opt_state, delivered = carry
        o, coin, key, eta = xs
        xh = x - eta * (jax.vmap(view.direction)(params, o, x) - xi)
        aggregate, delivery = server_update(key, x_sync, xh, ch)
        xi_synced = control_variate_update(xi, aggregate, xh, delivery, ch, eta / p)
        synced, opt_synced = optim.server_step(config, opt_state, x_sync, aggregate, problem.theta_star)
        x = jnp.where(coin, jnp.broadcast_to(synced, xh.shape), xh)
        xi = jnp.where(coin, xi_synced, xi)
        x_sync = jnp.where(coin, synced, x_sync)
        opt_state = jax.tree.map(lambda new, old: jnp.where(coin, new, old), opt_synced, opt_state)
        delivered = delivered + jnp.where(coin, jnp.sum(delivery.delivered), 0).astype(jnp.int32)
        return (x, xi, x_sync, opt_state, delivered), None

    carry = (state.x, state.xi, state.x_sync, state.opt_state, jnp.int32(0))
    (x, xi, x_sync, opt_state, delivered), _ = jax.lax.scan(
        local_step, carry, (obs, coins, send_keys, etas), unroll=min(LOCAL_UNROLL, H)
    )
    error = x.mean(axis=0)
    N, d = x.shape
    bits = ch.quantizer.bits(d)
    sent = jnp.int32(N) * jnp.sum(coins).astype(jnp.int32)
    info = RoundInfo(
        client_drift=jnp.mean(jnp.sum((x - error) ** 2, axis=-1)),
        messages_sent=sent,
        messages_delivered=delivered,
        bits_sent=sent * jnp.int32(bits),
        bits_delivered=delivered * jnp.int32(bits),
        observations=jnp.int32(N * H * observations_per_step(problem, config.skip)),
    )
    return ScaffnewState(
        problem.theta_star + error, error, x, xi, x_sync, sampler, state.count + 1, opt_state
    ), info


def theory(config: ScaffnewConfig, problem) -> moments.Recursion:
    """The exact moment description of a round (:mod:`fedsa_jax.moments`): ``Y = (1, theta,
    xi_1..xi_N, x_1..x_N, x_sync [, s, a])``, the agents' iterates and ``x_sync`` carried across
    rounds. Each local step is followed, on a coin of probability p, by the communication:
    aggregate into ``x_sync`` (or a for the optimizer) with the control variates' step (divided
    by ``eta / p``), the optimizer's step, every agent restarting from ``x_sync``. The round
    ends with ``theta <- mean_c x_c``."""
    y = moments.Augmented(problem, title="Scaffnew", theta_carried=False)
    y.add("xi", per_agent=True, zero_sum=True)
    y.add("loc", per_agent=True, initial=moments.START, carried=True)
    y.add("sync", initial=moments.START, carried=True)
    into, server = moments.server_step(y, config.server_optimizer, reference="sync")
    p = float(config.comm_prob)

    def step(eta):
        send = moments.aggregate(
            y, config.channel, into=into, reference="sync", control_variates="xi", denominator=eta / p
        )
        talk = moments.chain(y, ("communication", eta), send, server, moments.broadcast(y, source="sync"))
        return moments.chain(
            y, ("local", eta), moments.local_step(y, eta, controls="xi"), moments.coin(p, talk)
        )

    mean = moments.agents_mean(y)
    return moments.Recursion(
        y,
        lambda t, etas: [*(step(float(eta)) for eta in etas), mean],
        config.step_size,
        config.num_local_steps,
    )


def scaffnew(
    step_size: float,
    comm_prob: float,
    num_local_steps: int,
    skip: int = 1,
    quantizer=None,
    success_prob: float = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
) -> Algorithm:
    """Scaffnew with step size ``eta``, communication probability ``p`` and ``H`` local steps
    per round (a round is H local steps; it communicates ``p H`` times on average).

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``
        (:mod:`fedsa_jax.optim`); a communication at step k divides by ``eta_k / p``.
      comm_prob: ``p`` in ``(0, 1]``, probability that a local step ends with a
        communication (one coin for all agents).
      num_local_steps: ``H >= 1``, local steps per recorded round.
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: uplink quantizer from :mod:`fedsa_jax.channel` (default: exact).
      success_prob: probability in ``(0, 1]`` that an uplink message is delivered.
      aggregation: ``"divide_by_n"`` or ``"divide_by_received"``.
      server_optimizer: None or an optax ``GradientTransformation``, stepped at each
        communication on the pseudo-gradient ``x_sync - aggregate`` (:mod:`fedsa_jax.optim`).

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4, heterogeneity="heterogeneous")
      >>> res = fj.simulate(jax.random.key(1), problem, fj.scaffnew(0.1, 0.2, 10), 20, 64,
      ...                   metrics=["control_variate_error"])
      >>> sent = res.communications[-1]  # about 20 rounds x 10 steps x 0.2 x 4 agents = 160
    """
    base = local_steps_config(
        step_size, num_local_steps, skip, quantizer, success_prob, aggregation, server_optimizer
    )
    p = _validate.real("comm_prob", comm_prob, 0.0, 1.0, low_open=True)
    config = ScaffnewConfig(
        base.step_size, p, base.channel, base.num_local_steps, base.skip, base.server_optimizer
    )
    return Algorithm(config, "scaffnew", init, step, theory)


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
    return scaffnew(step_size, args.comm_prob, args.local_steps, skip=args.skip, **channel)


registry.register_algorithm(
    "scaffnew",
    _from_options,
    options=(COMM_PROB, registry.LOCAL_STEPS, registry.SKIP),
    title="Scaffnew",
    order=3,
)
