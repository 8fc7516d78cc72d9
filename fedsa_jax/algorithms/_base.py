"""What every algorithm shares: the container and the local-update scan.

An algorithm is an :class:`Algorithm`: a name, two module-level pure functions
(``init_fn``, ``step_fn``) and a config dataclass whose continuous fields
(step size, success probability) are pytree leaves, traced and vmappable, and
whose structural fields (H, skip, ...) are static. Because the functions are
module-level and the config is a pytree, two equal algorithms hit the same
compiled kernel: building ``fj.fedlsa(0.1, 10)`` twice, or changing only the
step size, never recompiles.

``step(key, state, problem)`` advances **one seed** by one communication round;
it is ``step_from(randomness(key, problem), state, problem)``: the round's random
numbers (all agents' observations in one block, and a key for the channel) are
drawn first; the driver draws them one round ahead (see :mod:`fedsa_jax._runtime.kernel`)
and calls ``step_from``. Inside a step the agents are vmapped; the driver vmaps
over seeds and scans rounds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, optim
from fedsa_jax._describe import describe_value
from fedsa_jax.channel import (
    Channel,
    Delivery,
    aggregate,
    channel,
    cohorts,
    delays,
    downlink,
    downlink_arg,
    local_work,
    transmit,
)
from fedsa_jax.channel.local_work import LocalWork
from fedsa_jax.problems.protocol import FOLLOWS_ITERATE_UNROLL, follows_iterate, local_unroll, merged_vmaps


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Algorithm:
    """An algorithm for one seed: ``init(key, problem, theta0) -> state`` and
    ``step(key, state, problem) -> (state, info)``.

    Args:
      config: any frozen dataclass registered as a pytree
        (``jax.tree_util.register_dataclass``): continuous hyperparameters are
        leaves (traced: changing or vmapping them does not recompile), structural
        ones are static fields. The driver reads four optional fields:
        ``num_local_steps`` (default 1: observations per agent and round),
        ``skip`` (default 1: Markov steps per kept observation), ``channel``
        (default: exact, :func:`fedsa_jax.channel.channel`) and ``clients_per_round``
        (default None: every agent; an integer m < N adds a cohort key to the round's
        random numbers, :meth:`randomness`). Every field is
        recorded in ``result.config["algorithm"]``.
      name: a short name (result files, legends).
      init_fn: ``init_fn(key, problem, theta0, config) -> state``, a pytree whose
        field ``theta (d,)`` (dtype ``problem.dtype``) is the server iterate scored
        by the MSE. A state may also carry ``error = theta - theta_star`` (d,),
        updated accurately (:class:`ErrorCoordinates`); the MSE then uses it.
      step_fn: ``step_fn(rand, state, problem, config) -> (state, RoundInfo)``: one
        communication round from the round's random numbers ``rand``
        (:class:`RoundRandomness`, drawn by :meth:`randomness`). The new state has
        the structure, shapes and dtypes of the old one. Build the
        :class:`RoundInfo` with :func:`round_info` for the usual round (every agent
        sends one message) or by hand.

      theory: optional ``theory(config, problem) -> fj.theory.Recursion``, the exact moment
        description of a round written with the blocks of :mod:`fedsa_jax.moments`
        (``fj.theory.broadcast``, ``local_step``, ``aggregate``, ...): with it
        :func:`fedsa_jax.theory.exact_mean` and :func:`~fedsa_jax.theory.exact_mse` cover
        the algorithm. Without it they raise a ``ValueError`` saying how to add one.
      weighted: whether ``step_fn`` multiplies each agent's local updates by
        ``rand.weights`` when it is given (an ``(N, H_max)`` array of multipliers, None otherwise):
        what :func:`fedsa_jax.bootstrap` needs of an algorithm (the built-in ones are).

    Both functions are written for one seed (agents are vmapped inside, see
    :func:`run_agents`); make them module-level functions so that two equal
    algorithms hit the same compiled kernel.
    """

    config: Any
    name: str = dataclasses.field(metadata=dict(static=True))
    init_fn: Callable = dataclasses.field(metadata=dict(static=True))
    step_fn: Callable = dataclasses.field(metadata=dict(static=True))
    theory: Callable | None = dataclasses.field(default=None, metadata=dict(static=True))
    weighted: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def num_local_steps(self) -> int:
        """``config.num_local_steps`` (default 1); ``H_max`` for local steps that change with the
        round (:class:`fedsa_jax.optim.LocalSteps`): the steps every round of the kernel has."""
        return optim.max_local_steps(getattr(self.config, "num_local_steps", 1))

    @property
    def trajectories(self) -> int:
        """Trajectories a seed runs (``config.trajectories``, default 1; :func:`fedsa_jax.bootstrap`:
        the main one and its replicates): the driver sizes chunks by them."""
        return int(getattr(self.config, "trajectories", 1))

    @property
    def skip(self) -> int:
        """``config.skip`` (default 1)."""
        return int(getattr(self.config, "skip", 1))

    @property
    def channel(self) -> Channel:
        """``config.channel`` (default: exact)."""
        ch = getattr(self.config, "channel", None)
        return channel() if ch is None else ch

    def init(self, key: jax.Array, problem, theta0: jax.Array):
        return self.init_fn(key, problem, theta0, self.config)

    @property
    def clients_per_round(self) -> int | None:
        """``config.clients_per_round`` (default None: every agent takes part in every round)."""
        return getattr(self.config, "clients_per_round", None)

    def randomness(self, key: jax.Array, problem) -> RoundRandomness:
        """One round's random numbers: all agents' observations in one block, and a
        key for the channel (two independent streams split from ``key``); with a cohort of
        ``m < N`` agents (``clients_per_round``) also a key for drawing it, a third stream
        (``fold_in(key, COHORT_STREAM)``, ``COHORT_STREAM = 0x636F68``), so that ``m = N`` keeps the
        numbers of every agent; with random local work (:mod:`fedsa_jax.channel.local_work`) a key for the
        agents' step counts, a fourth (``fold_in(key, WORK_STREAM)``); with delayed updates
        (:mod:`fedsa_jax.channel.delays`) a key for the delays (``fold_in(key, DELAY_STREAM)``). A config
        with a method ``randomness(key, problem)`` draws its rounds' numbers itself
        (:func:`fedsa_jax.fedbuff`: one block per contribution)."""
        own = getattr(self.config, "randomness", None)
        if own is not None:
            return own(key, problem)
        k_obs, k_channel = jax.random.split(key)
        if local_work.stepwise_observations(self.config, problem):  # (H_max, N, ...): a block per step
            keys = jax.random.split(k_obs, self.num_local_steps)
            obs = jax.vmap(lambda k: problem.randomness(k, problem.num_agents, 1, self.skip))(keys)
        else:
            obs = problem.randomness(k_obs, problem.num_agents, self.num_local_steps, self.skip)
        rand = RoundRandomness(obs, k_channel)
        for mechanism in (cohorts, local_work, delays):  # each adds its own stream where it is on
            rand = mechanism.with_round_key(rand, key, self.config, problem)
        return rand

    def step_from(self, rand, state, problem):
        return self.step_fn(rand, state, problem, self.config)

    def step(self, key: jax.Array, state, problem):
        return self.step_from(self.randomness(key, problem), state, problem)

    def bits_per_message(self, dim: int) -> int:
        return self.channel.quantizer.bits(dim)

    def describe(self) -> dict[str, Any]:
        """``{"algorithm": name, <every config field>: value}``, JSON-friendly."""
        out: dict[str, Any] = {"algorithm": self.name}
        out.update(describe_value(self.config))
        if out.get("clients_per_round", 0) is None:
            del out["clients_per_round"]  # every agent, every round: described as before the option existed
        if not hasattr(self.config, "channel"):
            out["channel"] = self.channel.describe()
        return out


class RoundRandomness(NamedTuple):
    obs: Any  # the problem's block for all agents (see problem.randomness)
    channel: jax.Array  # key for quantizers and erasures
    cohort: Any = None  # key for the round's cohort (clients_per_round < N), else None
    weights: Any = None  # (N, H_max) multipliers of each agent's local updates (fj.bootstrap), else None
    work: Any = None  # key for the round's local step counts (fj.local_work), else None
    delay: Any = None  # key for the round's delays (fj.delays), else None
    clock: Any = None  # key for the simulated clock (fj.fedbuff), else None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalStepsConfig:
    """Hyperparameters of FedLSA, SCAFFLSA and QFedTD (``H = 1``)."""

    step_size: Any  # eta: a float (a traced leaf: changing or vmapping it does not recompile) or a
    # fj.optim.Schedule of the local-step count k = t H + h
    channel: Channel  # uplink; its success probability is a traced leaf too
    num_local_steps: Any = dataclasses.field(metadata=dict(static=True))  # H, or fj.optim.LocalSteps
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))  # keep 1 obs out of skip
    server_optimizer: Any = None  # None or fj.optim.ServerOptimizer (optax), see fedsa_jax.optim
    downlink: Any = dataclasses.field(default=None, metadata=dict(omit_none=True))  # None or a Channel
    clients_per_round: int | None = dataclasses.field(default=None, metadata=dict(static=True))  # m
    # None (lockstep: every agent runs num_local_steps) or fj.local_work's law of the agents' H_c
    local_work: Any = dataclasses.field(default=None, metadata=dict(static=True, omit_none=True))
    # None (every update from the current iterate) or fj.delays' law of the updates' age tau_c
    delays: Any = dataclasses.field(default=None, metadata=dict(static=True, omit_none=True))


class RoundInfo(NamedTuple):
    """What one round did, for one seed: a diagnostic and the round's counts.

    The driver sums the counts over rounds (exactly, in 64-bit counters) and
    reports their means over seeds as ``result.communications``,
    ``messages_delivered``, ``uplink_bits_sent``, ``uplink_bits_delivered``, ``samples``,
    ``downlink_bits_sent`` and ``downlink_bits_delivered`` (``result.bits_sent`` and
    ``bits_delivered`` are uplink plus downlink): an algorithm that communicates at random reports
    what it actually sent. The downlink counts default to 0 (a model broadcast uncompressed is not
    counted); a compressed downlink counts one message per receiving agent. ``clipped_fraction``
    (the metric ``"clipped_fraction"``, not summed) is None where an algorithm does not report it.
    """

    client_drift: jax.Array  # () mean_c |theta^c_{t,H} - theta_{t+1}|^2 (0 without local steps)
    messages_sent: jax.Array  # () int32, uplink messages sent this round
    messages_delivered: jax.Array  # () int32, uplink messages delivered this round
    bits_sent: jax.Array  # () int32, uplink bits sent this round
    bits_delivered: jax.Array  # () int32, uplink bits delivered this round
    observations: jax.Array  # () int32, observations drawn by all agents this round
    downlink_bits_sent: Any = 0  # () int32, downlink bits sent this round (to every receiving agent)
    downlink_bits_delivered: Any = 0  # () int32, downlink bits delivered this round
    # () the fraction of the round's sent messages that the privacy clipping shortened (None: not reported)
    clipped_fraction: Any = None


COUNT_FIELDS = RoundInfo._fields[1:-1]  # what the driver sums


def local_steps_config(
    step_size: Any,
    num_local_steps: Any,
    skip: Any = 1,
    quantizer=None,
    success_prob: Any = 1.0,
    aggregation: str = "divide_by_n",
    server_optimizer=None,
    error_feedback: str | None = None,
    downlink: Any = None,
    privacy: Any = None,
) -> LocalStepsConfig:
    """Validated :class:`LocalStepsConfig` (``step_size``: a float or a schedule, ``server_optimizer``:
    None or optax, see :mod:`fedsa_jax.optim`; ``error_feedback``: see :mod:`fedsa_jax.channel`;
    ``downlink``: None or a channel, see :mod:`fedsa_jax.channel.downlink`; ``privacy``: None or
    :func:`fedsa_jax.channel.privacy`)."""
    eta = optim.step_size_arg(step_size)
    work = num_local_steps if isinstance(num_local_steps, LocalWork) else None
    H = optim.local_steps_arg(num_local_steps if work is None else work.max)
    k = _validate.integer("skip", skip)
    opt = optim.server_optimizer_arg(server_optimizer)
    up = channel(quantizer, success_prob, aggregation, error_feedback, privacy)
    return LocalStepsConfig(eta, up, H, k, opt, downlink_arg(downlink), local_work=work)


def check_run(config, num_agents: int, num_rounds: int | None = None) -> None:
    """Checks with the problem's N, before compiling: each mechanism's own (a cohort of at most N
    agents, a law with one row per agent for this N: :mod:`fedsa_jax.channel.cohorts`,
    :mod:`~fedsa_jax.channel.local_work`, :mod:`~fedsa_jax.channel.delays`), then the config's own
    ``check_run(num_agents, num_rounds)`` where it has one (FedBuff: its buffer, its clock)."""
    cohorts.check(config, num_agents)
    local_work.check(config, num_agents)
    delays.check(config, num_agents)
    own = getattr(config, "check_run", None)
    if callable(own):
        own(num_agents, num_rounds)


def server_update(
    key: jax.Array,
    theta: jax.Array,
    local: jax.Array,
    ch: Channel,
    memory: Any = (),
    cohort: jax.Array | None = None,
) -> tuple[jax.Array, Delivery]:
    """Aggregate the agents' model differences ``m_c = theta^c - theta`` over the uplink.

    Exact channel: ``theta + mean_c m_c = mean_c theta^c`` (computed as the mean).
    Otherwise ``theta + sum_c w_c q(m_c)`` with the channel's weights (``1/N`` or
    ``1/|R|`` on delivered messages, 0 on lost ones). With error feedback, ``memory`` is
    the agents' (``ch.init_memory``), the new one is ``delivery.memory``, and the sum is over
    what error feedback sends (:mod:`fedsa_jax.channel`; EF21: ``theta + mean_c g_c``). With a
    cohort ``S`` (mask ``(N,)``, see :func:`cohort_mask`) only its agents send:
    ``theta + sum_{c in R ∩ S} w_c q(m_c)``, ``w_c = 1/m`` or ``1/|R ∩ S|``
    (:func:`fedsa_jax.channel.transmit`).
    """
    N = local.shape[0]
    if ch.trivial and cohort is None:
        delivered = jnp.ones((N,), bool)
        weights = jnp.full((N,), 1.0 / N, local.dtype)
        return local.mean(axis=0), Delivery(local - theta, delivered, weights)
    delivery = transmit(key, local - theta, ch, memory, cohort)
    return theta + aggregate(delivery), delivery


def control_variate_update(
    xi: jax.Array,
    theta: jax.Array,
    local: jax.Array,
    delivery: Delivery,
    ch: Channel,
    denominator,
    cohort: jax.Array | None = None,
) -> jax.Array:
    """Control variates ``xi (N, d)`` after a server step (SCAFFLSA, Scaffnew).

    Exact channel: ``xi_c <- xi_c + (theta - local_c) / denominator`` with ``theta`` the new
    server iterate (the mean of ``local (N, d)``). Otherwise only the delivered agents R move,
    against the mean of the delivered messages ``mbar_R = (1/|R|) sum_{j in R} q(m_j)``:
    ``xi_c <- xi_c + (mbar_R - q(m_c)) / denominator`` for c in R, unchanged otherwise. The
    increments sum to 0 over R, so ``sum_c xi_c`` stays 0 (SCAFFLSA: ``denominator = eta H``;
    Scaffnew: ``eta / p``). A denominator per agent ``(N, 1)`` (SCAFFLSA under local work,
    :func:`control_denominator`) keeps ``sum_c D_c xi_c`` instead, as exact arithmetic does. With
    EF21 ``q(m_c)`` is the server's ``g_c``, the same rule. With a
    cohort S (``delivery`` from :func:`server_update` with it) the delivered agents are ``R ∩ S``:
    the others keep their control variate.
    """
    if ch.trivial and cohort is None:
        delivered = jnp.ones((local.shape[0], 1), bool)
        increment = (theta - local) / denominator
    else:
        delivered = delivery.delivered[:, None]
        count = jnp.maximum(jnp.sum(delivery.delivered), 1).astype(local.dtype)
        messages = delivery.messages
        if ch.error_feedback == "ef21":  # the server's g_c, for every agent: keep the delivered ones
            messages = jnp.where(delivered, messages, 0.0)
        mean_delivered = jnp.sum(messages, axis=0) / count  # lost messages are 0
        increment = jnp.where(delivered, (mean_delivered - messages) / denominator, 0.0)
    # The increments sum to 0 over the delivered agents in exact arithmetic, but each carries the
    # rounding error of a difference of iterates divided by a small denominator: over 1e5 rounds in
    # float32 their sum drifts, sum_c xi_c leaves 0 and the iterate runs away (seen with SCAFFLSA,
    # H = 1, eta = 0.01). Removing their mean over the delivered agents keeps sum_c xi_c = 0 to
    # rounding at every server step.
    if jnp.ndim(denominator) == 2:  # one per agent (local work): sum_R D_c increment_c = 0 is kept
        share = jnp.where(delivered, jnp.broadcast_to(denominator, delivered.shape), 0.0)
        total = jnp.maximum(jnp.sum(share), jnp.finfo(local.dtype).tiny)  # 0 delivered: 0 / tiny
        increment = increment - jnp.where(delivered, jnp.sum(share * increment, axis=0) / total, 0.0)
        return xi + increment
    n_delivered = jnp.maximum(jnp.sum(delivered), 1).astype(local.dtype)
    increment = increment - jnp.where(delivered, jnp.sum(increment, axis=0) / n_delivered, 0.0)
    return xi + increment


def observations_per_step(problem, skip: int) -> int:
    """Observations an agent draws per kept observation: ``skip`` along a Markov chain
    (``problem.sampling == "markov"``: the chain moves ``skip`` steps), else 1 (discarding
    i.i.d. draws is free)."""
    return skip if getattr(problem, "sampling", None) == "markov" else 1


def round_info(
    local: jax.Array,
    theta: jax.Array,
    delivery: Delivery,
    config,
    problem,
    cohort: jax.Array | None = None,
    count: Any = None,
    counts: jax.Array | None = None,
) -> RoundInfo:
    """:class:`RoundInfo` of the usual round: every agent ran ``num_local_steps`` local steps
    (``local (N, d)``, its last iterate) and sent one message of
    ``channel.quantizer.bits(d)`` bits; ``delivery`` says which arrived. With a cohort S (mask)
    only its m agents observed and sent, and ``client_drift`` is their mean. Local steps that
    change with the round count the ``H_t`` of the round whose count (rounds done before it) is
    ``count``; heterogeneous or random local work the agents' ``counts`` ``H_{c,t}`` (the cohort's).

    ``config``'s optional fields ``num_local_steps``, ``skip`` and ``channel`` take their
    defaults (1, 1, exact) when absent.
    """
    if cohort is not None:
        m = int(config.clients_per_round)
        drift = jnp.sum(jnp.where(cohort, jnp.sum((local - theta) ** 2, axis=-1), 0.0)) / m
        full = round_info(local[:m], theta, delivery, config, problem, count=count)  # m agents' counts
        if counts is not None:
            per_step = observations_per_step(problem, int(getattr(config, "skip", 1)))
            full = full._replace(observations=jnp.int32(per_step) * jnp.sum(jnp.where(cohort, counts, 0)))
        return full._replace(client_drift=drift)
    N, d = local.shape
    H = optim.round_local_steps(getattr(config, "num_local_steps", 1), count)
    skip = int(getattr(config, "skip", 1))
    ch = getattr(config, "channel", None)
    bits = channel().quantizer.bits(d) if ch is None else ch.quantizer.bits(d)
    drift = jnp.mean(jnp.sum((local - theta) ** 2, axis=-1))
    delivered = jnp.sum(delivery.delivered).astype(jnp.int32)
    down = downlink.downlink_bits(config, N, d)
    return RoundInfo(
        client_drift=drift,
        messages_sent=jnp.int32(N),
        messages_delivered=delivered,
        bits_sent=jnp.int32(N * bits),
        bits_delivered=delivered * jnp.int32(bits),
        observations=jnp.int32(observations_per_step(problem, skip))
        * (jnp.int32(N) * H if counts is None else jnp.sum(counts)),
        downlink_bits_sent=down,
        downlink_bits_delivered=down,
        clipped_fraction=jnp.asarray(getattr(delivery, "clipped", 0), drift.dtype) / N,
    )


def init_samplers(key: jax.Array, problem, theta0: jax.Array | None = None) -> jax.Array:
    """Each agent's observation-stream state (Markov chain state), shape ``(N,)``. A problem whose
    observations follow the iterate (:func:`fedsa_jax.problems.follows_iterate`) starts its streams
    from the initial iterate ``theta0`` (e.g. SARSA's first action, drawn from the policy of
    ``theta0``)."""
    keys = jax.random.split(key, problem.num_agents)
    if follows_iterate(problem):
        if theta0 is None:
            raise TypeError("init_samplers: a problem that follows the iterate needs theta0")
        start = jnp.asarray(theta0, problem.dtype)
        return jax.vmap(lambda k, p: problem.init_sampler(k, p, start))(keys, problem.agent_params())
    return jax.vmap(problem.init_sampler)(keys, problem.agent_params())


def initial_theta(problem, theta0: jax.Array) -> jax.Array:
    """``theta0`` in the problem's dtype."""
    return jnp.asarray(theta0, problem.dtype)


def initial_error(problem, theta0: jax.Array) -> jax.Array:
    """``theta0 - theta_star`` in the problem's dtype (exactly 0 when started at ``theta_star``)."""
    return initial_theta(problem, theta0) - problem.theta_star


class ErrorCoordinates:
    """``problem`` seen from ``theta_star``: ``direction(params, obs, e)`` is the direction at
    ``theta_star + e``, from the problem's ``error_direction`` when it has one (accurate in
    ``e``: the residual at the optimum comes from float64 values), else from ``direction``.

    The built-in algorithms run their local steps and aggregation on the error
    ``e = theta - theta_star`` through this view: the updates are the same affine maps
    (they commute with the shift by ``theta_star``), but in float32 an increment
    ``eta (A theta - b)`` far below the resolution of ``theta`` is kept, since it is
    added to ``e``, not to ``theta``. Their states carry ``error`` (used for the MSE) and
    ``theta = theta_star + error`` (what users, metrics and plots see).
    """

    def __init__(self, problem):
        self.problem = problem

    def __getattr__(self, name):
        return getattr(self.problem, name)

    def direction(self, params, obs, error):
        p = self.problem
        if hasattr(p, "error_direction"):
            return p.error_direction(params, obs, error)
        return p.direction(params, obs, p.theta_star + error)

    @property
    def observe_step(self):
        """The problem's ``observe_step`` at ``theta_star + error`` (an AttributeError when it has
        none, so that :func:`~fedsa_jax.problems.follows_iterate` reads the problem's)."""
        p = self.problem
        observe = p.observe_step
        return lambda params, sampler, rand, error: observe(params, sampler, rand, p.theta_star + error)


def local_step(problem, params, obs, theta, step_size, control=None):
    """One local update ``theta - eta (A_c(Z) theta - b_c(Z) - control)`` (``control`` None: FedLSA)."""
    g = problem.direction(params, obs, theta)
    if control is not None:
        g = g - control
    return theta - step_size * g


def local_updates(problem, params, obs, theta, step_size, control=None):
    """H local steps of one agent: ``theta <- theta - eta_h (A_c(Z_h) theta - b_c(Z_h) - control)``.

    ``obs`` has leading axis H (drawn in one block); ``step_size`` is a scalar or the round's
    ``(H,)`` step sizes (a schedule, :func:`fedsa_jax.optim.step_sizes`); ``control`` is
    SCAFFLSA's ``xi_c`` (``None`` for FedLSA). In error coordinates a problem may run the steps
    itself, laid out for speed: ``problem.error_local_steps(params, obs, error, step_sizes (H,),
    control (d,))`` (same updates; returns ``None`` to decline), e.g. the Gaussian family.
    """

    if isinstance(problem, ErrorCoordinates) and hasattr(problem.problem, "error_local_steps"):
        H = jax.tree.leaves(obs)[0].shape[0]
        etas = jnp.broadcast_to(jnp.asarray(step_size, theta.dtype), (H,))
        zero = jnp.zeros_like(theta) if control is None else control
        out = problem.problem.error_local_steps(params, obs, theta, etas, zero)
        if out is not None:
            return out

    def body(th, xs):
        o, eta = xs
        return local_step(problem, params, o, th, step_size if eta is None else eta, control), None

    etas = step_size if jnp.ndim(step_size) == 1 else None
    unroll = local_unroll(jax.tree.leaves(obs)[0].shape[0])
    theta, _ = jax.lax.scan(body, theta, (obs, etas), unroll=unroll)
    return theta


def observed_updates(problem, params, sampler, rand, theta, step_size, control=None, skip: int = 1):
    """One agent's round of local steps from its block of random numbers ``rand``: observe, then
    update. Returns ``(theta^c_{t,H}, new sampler)``.

    A problem whose observations do not depend on the iterate draws the H observations first
    (``observe``) and :func:`local_updates` scans them. One whose observations follow the iterate
    (``observe_step``, :func:`fedsa_jax.problems.follows_iterate`) draws each step's observation with
    the agent's current local iterate: ``Z_h ~ law(theta^c_{t,h})``, then
    ``theta^c_{t,h+1} = theta^c_{t,h} - eta_h (A_c(Z_h) theta^c_{t,h} - b_c(Z_h) - control)``, in one
    scan over the block's rows (``skip`` must be 1: such a problem updates on every transition). In
    error coordinates such a problem may run the steps itself, laid out for speed:
    ``problem.error_observed_steps(params, sampler, rand, error, step_sizes (H,), control)``
    (``control``: ``(d,)``, or ``None`` for none) returns ``(error, sampler)``, or ``None`` to
    decline (SARSA with dense features does)."""
    if not follows_iterate(problem):
        obs, sampler = problem.observe(params, sampler, rand, skip)
        return local_updates(problem, params, obs, theta, step_size, control), sampler
    H = jax.tree.leaves(rand)[0].shape[0]
    etas = jnp.broadcast_to(jnp.asarray(step_size, theta.dtype), (H,))
    if isinstance(problem, ErrorCoordinates) and hasattr(problem.problem, "error_observed_steps"):
        out = problem.problem.error_observed_steps(params, sampler, rand, theta, etas, control)
        if out is not None:
            return out

    inner = problem.problem if isinstance(problem, ErrorCoordinates) else problem
    steps = functools.partial(_observed_steps, isinstance(problem, ErrorCoordinates))
    if all(isinstance(x, jax.Array) for x in jax.tree.leaves(inner)):
        steps = merged_vmaps(steps)
    return steps(inner, params, sampler, rand, theta, etas, control)


def _observed_steps(error_coordinates: bool, problem, params, sampler, rand, theta, etas, control):
    """:func:`observed_updates`' scan for a problem whose observations follow the iterate."""
    if error_coordinates:
        problem = ErrorCoordinates(problem)

    def body(carry, xs):
        th, smp = carry
        r, eta = xs
        o, smp = problem.observe_step(params, smp, r, th)
        return (local_step(problem, params, o, th, eta, control), smp), None

    unroll = local_unroll(etas.shape[0], FOLLOWS_ITERATE_UNROLL)
    (theta, sampler), _ = jax.lax.scan(body, (theta, sampler), (rand, etas), unroll=unroll)
    return theta, sampler


def first_observation(problem, params, sampler, rand, theta, skip: int = 1):
    """One agent's first observation of its round's block ``rand`` and its new sampler (QFedTD: one
    step a round), drawn at ``theta`` for a problem whose observations follow the iterate."""
    if follows_iterate(problem):
        return problem.observe_step(params, sampler, jax.tree.map(lambda x: x[0], rand), theta)
    obs, sampler = problem.observe(params, sampler, rand, skip)
    return jax.tree.map(lambda x: x[0], obs), sampler


def agent_step_sizes(step_size, weights):
    """Each agent's step sizes ``(N, H_max)``, ``eta_h w_{c,h}``, for a round with multipliers
    ``weights (N, H_max)`` (:func:`fedsa_jax.bootstrap`); ``step_size`` itself without them."""
    if weights is None:
        return step_size
    return jnp.asarray(step_size, weights.dtype) * weights


def run_agents(rand, problem, samplers, theta, step_size, skip=1, controls=None, active=None, weights=None):
    """All agents' local rounds from the common ``theta`` (vmapped over agents).

    ``rand``: the random numbers of all agents' H observations, one block
    (:meth:`Algorithm.randomness`). Returns ``(theta^c_{t,H} (N, d), new samplers (N,))``.
    ``active`` (``(H_max,) bool``, :func:`stepwise_active`): ``rand`` holds one block per local
    step, and the steps are scanned one at a time, each agent observing (its chain moving) and
    updating only on the active ones. ``weights`` (``(N, H_max)``, :func:`fedsa_jax.bootstrap`):
    agent c's local update h is multiplied by ``w_{c,h}`` (its step size ``eta_h w_{c,h}``).
    """
    params = problem.agent_params()
    etas = agent_step_sizes(step_size, weights)
    if active is not None:
        return _run_stepwise(rand, problem, params, samplers, theta, etas, skip, controls, active)

    def agent(rand, params, sampler, control, eta, start):
        return observed_updates(problem, params, sampler, rand, start, eta, control, skip)

    axis = None if weights is None else 0
    starts = 0 if jnp.ndim(theta) == 2 else None  # one start per agent (delayed updates), else common
    return jax.vmap(agent, in_axes=(0, 0, 0, 0, axis, starts))(rand, params, samplers, controls, etas, theta)


def _run_stepwise(blocks, problem, params, samplers, theta, etas, skip, controls, active):
    """:func:`run_agents` one local step at a time: ``blocks`` has leading axis H_max."""

    def agent_step(params, sampler, rand, th, control, eta):
        return observed_updates(problem, params, sampler, rand, th, eta, control, skip)

    per_agent = jnp.ndim(etas) == 2  # (N, H_max): multiplied by the agents' weights

    def body(carry, xs):
        local, sampler = carry
        rand, eta, act = xs
        new, moved = jax.vmap(agent_step, in_axes=(0, 0, 0, 0, 0, 0 if per_agent else None))(
            params, sampler, rand, local, controls, eta
        )
        keep = lambda n, o: jnp.where(jnp.reshape(act, act.shape + (1,) * (n.ndim - act.ndim)), n, o)  # noqa: E731
        return (keep(new, local), jax.tree.map(keep, moved, sampler)), None

    local = theta if jnp.ndim(theta) == 2 else jnp.broadcast_to(theta, (problem.num_agents, *theta.shape))
    etas = jnp.moveaxis(etas, 1, 0) if per_agent else jnp.broadcast_to(etas, active.shape[:1])  # steps first
    (local, samplers), _ = jax.lax.scan(body, (local, samplers), (blocks, etas, active))
    return local, samplers
