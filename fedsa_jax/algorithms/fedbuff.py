"""FedBuff: buffered asynchronous aggregation of local LSA updates on a simulated clock.

Agents work at their own speeds and the server does not wait for all of them (Nguyen, Malik,
Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated learning with buffered asynchronous
aggregation", AISTATS 2022, Algorithms 1-2). Every agent is always busy: it downloads the server
iterate, runs H local LSA steps from it on its own observations,

    theta^c_{h+1} = theta^c_h - eta (A_c(Z^c_{h+1}) theta^c_h - b_c(Z^c_{h+1})),   theta^c_0 = theta_v,

uploads its update ``Delta = theta^c_H - theta_v`` (through the uplink's quantizer q), downloads the
iterate current then and starts again. The server adds each arriving update to a buffer and, when
K contributions have arrived, steps

    theta_{t+1} = theta_t + (1/K) sum_{k=1..K} s(tau_k) q(Delta_k),    s(tau) = (1 + tau)^(-a),

``tau_k = t - v_k`` the staleness of contribution k (server steps since its agent downloaded
``theta_{v_k}``); ``a = 1/2`` is FedBuff's ``1 / sqrt(1 + staleness)``, ``a = 0`` no weighting, and
any function of the staleness may be given. A round of :func:`fedsa_jax.simulate` is one server
step (K contributions); a server optimizer (optax) takes ``theta_t - (that step's target)`` as its
pseudo-gradient (``optax.sgd(eta_g)``: FedBuff's server learning rate ``eta_g``).

**The clock** (:mod:`fedsa_jax.channel.clock`). Time runs in integer ticks; a job started at the end of
tick s arrives at tick ``s + D``, ``D`` drawn from the agent's law of durations. Arrivals at one tick
are taken in the order of the agents' index (make ticks finer to make ties rarer); the server steps
as soon as its buffer holds K contributions, possibly several times in one tick; the agents that
arrived at a tick download at its end, the latest iterate. An agent may contribute twice to one
buffer if it is fast. With ``buffer_size = N`` and every job one tick long each buffer holds every
agent's update from the current iterate: FedLSA's round, on the same observations (tested; exactly
with an exact uplink and a weight ``s(0) = 1``; with a quantizer the same law, other draws).

The state carries each agent's start (its copy of the model), its version ``v_c``, the tick its
job arrives and the clock; the metrics ``"wall_clock"`` (ticks elapsed at the round's server step)
and ``"staleness"`` (the mean staleness of its buffer) record them. A synchronous round under the
same law lasts ``max_c D_c`` ticks (:meth:`fedsa_jax.channel.clock.Durations.sync_round_time`).

Exact theory: not covered. Which agents fill a buffer and how stale their starts are follow the
clock (the agents' remaining job times, a Markov chain of its own), so a round applies a random
number of each agent's updates computed from iterates of different ages; the moments would need a
set of blocks per clock state. :func:`fedsa_jax.theory.exact_mean` refuses it with this reason.

Not built (refused with a one-line error): erasures (the server counts delivered contributions),
error feedback, a compressed downlink, cohorts, local work laws, bootstrap weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate, optim, registry
from fedsa_jax.algorithms._base import (
    Algorithm,
    ErrorCoordinates,
    RoundInfo,
    RoundRandomness,
    init_samplers,
    initial_error,
    local_updates,
    observations_per_step,
)
from fedsa_jax.channel import Channel, channel, clock
from fedsa_jax.channel.clock import CLOCK_STREAM, Durations, from_text as durations_from_text
from fedsa_jax.registry import Option, nonnegative_real, positive_int

__all__ = ["FedBuffState", "fedbuff"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FedBuffConfig:
    """Hyperparameters of FedBuff (a pytree: the step size and the channel's leaves are traced)."""

    step_size: Any  # eta, or a schedule of the local-step count k = t H + h (t: server steps)
    channel: Channel  # the uplink's quantizer (no erasures)
    num_local_steps: int = dataclasses.field(metadata=dict(static=True))  # H
    buffer_size: int = dataclasses.field(metadata=dict(static=True))  # K, contributions per server step
    durations: Durations = dataclasses.field(metadata=dict(static=True))  # the agents' job durations
    staleness: Any = dataclasses.field(metadata=dict(static=True))  # exponent a, or a function of tau
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))
    server_optimizer: Any = None

    def randomness(self, key: jax.Array, problem) -> RoundRandomness:
        """One round's random numbers: the K contributions' observations in one block (the problem's
        block for K agents: contribution k takes slice k, whichever agent sends it), a key for the
        quantizer and one for the clock (``fold_in(key, CLOCK_STREAM)``: the new jobs' durations)."""
        k_obs, k_channel = jax.random.split(key)
        obs = problem.randomness(k_obs, self.buffer_size, self.num_local_steps, self.skip)
        return RoundRandomness(obs, k_channel, clock=jax.random.fold_in(key, CLOCK_STREAM))

    def check_run(self, num_agents: int, num_rounds: int | None = None) -> None:
        """Checks with the problem's N, before compiling: a staleness function's weights are finite
        and ``> 0`` at every staleness a contribution can have (:func:`staleness_bound`), and the
        clock's int32 ticks (without x64) stay below ``2^31`` over ``num_rounds`` server steps; ``K <= N``
        and a law of durations with one row per agent for this N."""
        if self.buffer_size > num_agents:
            _validate.fail(
                "buffer_size", self.buffer_size, f"expected at most N = {num_agents} (the problem's agents)"
            )
        self.durations.check(num_agents)
        if callable(self.staleness):
            bound = staleness_bound(self.durations, num_agents, self.buffer_size)
            where = (
                f"a staleness this run can reach (up to {bound}: N = {num_agents}, K = {self.buffer_size}, "
            )
            _check_weights(self.staleness, bound, where + f"D_max = {self.durations.max})")
        if num_rounds is not None:
            self.durations.check_ticks(num_rounds)

    def weight(self, staleness: jax.Array, dtype) -> jax.Array:
        """``s(tau)``: ``(1 + tau)^(-a)`` for an exponent a, else the given function's value."""
        tau = staleness.astype(dtype)
        if callable(self.staleness):
            return jnp.asarray(self.staleness(tau), dtype)
        return (1.0 + tau) ** jnp.asarray(-self.staleness, dtype)


class FedBuffState(NamedTuple):
    theta: jax.Array  # (d,) server iterate theta_t = theta_star + error
    error: jax.Array  # (d,) theta_t - theta_star
    sampler: jax.Array  # (N,) each agent's observation-stream state
    count: jax.Array  # () int32, server steps done (t: the server's version)
    opt_state: Any  # the server optimizer's state (() without one)
    start: jax.Array  # (N, d) each agent's start theta_{v_c} - theta_star (the iterate it downloaded)
    version: jax.Array  # (N,) int32 v_c, the server steps done when agent c downloaded
    finish: jax.Array  # (N,) ticks (int64 with x64, else int32): when agent c's current job arrives
    pending: jax.Array  # (N,) bool: arrived at the current tick, downloads at its end
    clock: jax.Array  # () ticks: the current tick (that of the last arrival)
    staleness: jax.Array  # () mean staleness of the last server step's K contributions


def _tick_dtype():
    """The clock's integer ticks: int64 where JAX has x64, else int32 (``fj.simulate`` then refuses a
    run whose ticks could pass ``2^31 - 1``: :meth:`fedsa_jax.channel.clock.Durations.check_ticks`)."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32  # pyright: ignore[reportAttributeAccessIssue]


def init(key: jax.Array, problem, theta0: jax.Array, config: FedBuffConfig) -> FedBuffState:
    """Every agent downloads ``theta_0`` at tick 0 and starts a job (the observation streams start as
    FedLSA's from ``key``; the first durations from ``fold_in(key, CLOCK_STREAM)``)."""
    error = initial_error(problem, theta0)
    N, tick = problem.num_agents, _tick_dtype()
    return FedBuffState(
        problem.theta_star + error,
        error,
        init_samplers(key, problem, problem.theta_star + error),
        jnp.int32(0),
        optim.init_server(config, error),
        jnp.broadcast_to(error, (N, error.shape[0])),
        jnp.zeros((N,), jnp.int32),
        config.durations.draw(jax.random.fold_in(key, CLOCK_STREAM), N).astype(tick),
        jnp.zeros((N,), bool),
        jnp.zeros((), tick),
        jnp.zeros((), problem.dtype),
    )


class _Events(NamedTuple):
    """What the arrivals of one round carry from one to the next."""

    start: jax.Array
    version: jax.Array
    finish: jax.Array
    pending: jax.Array
    clock: jax.Array
    sampler: Any
    total: jax.Array  # (d,) sum_k s(tau_k) q(Delta_k)
    locals_sum: jax.Array  # (d,) sum_k theta^{c_k}_H (error coordinates), for the drift
    locals_sq: jax.Array  # () sum_k |theta^{c_k}_H|^2
    staleness: jax.Array  # () sum_k tau_k


def step(rand: RoundRandomness, state: FedBuffState, problem, config: FedBuffConfig):
    """One server step for one seed: the next K arrivals in clock order (a scan), then the step."""
    dtype, N, K = problem.dtype, problem.num_agents, config.buffer_size
    eta = optim.step_sizes(config.step_size, state.count, config.num_local_steps, dtype)
    view = ErrorCoordinates(problem)
    params = problem.agent_params()
    u = jax.random.uniform(rand.clock, (K,), jnp.float32)
    keys = jax.random.split(rand.channel, K)

    def arrival(ev: _Events, xs):
        block, key, u_k = xs
        now = jnp.min(ev.finish)
        j = jnp.argmin(ev.finish)  # the first agent (lowest index) arriving at tick `now`
        advanced = now > ev.clock  # the agents pending at the earlier tick download at its end
        download = ev.pending & advanced
        start = jnp.where(download[:, None], state.error, ev.start)
        version = jnp.where(download, state.count, ev.version)
        pending = ev.pending & ~advanced
        p_j = jax.tree.map(lambda p: p[j], params)
        obs, moved = problem.observe(p_j, jax.tree.map(lambda s: s[j], ev.sampler), block, config.skip)
        local = local_updates(view, p_j, obs, start[j], eta)
        sent = config.channel.quantizer(key, local - start[j])
        tau = state.count - version[j]
        sampler = jax.tree.map(lambda s, m: s.at[j].set(m), ev.sampler, moved)
        duration = config.durations.inverse(u_k[None], j[None], N)[0]
        return _Events(
            start,
            version,
            ev.finish.at[j].set(now + duration),
            pending.at[j].set(True),
            now,
            sampler,
            ev.total + config.weight(tau, dtype) * sent,
            ev.locals_sum + local,
            ev.locals_sq + jnp.sum(local * local),
            ev.staleness + tau.astype(dtype),
        ), None

    zero = jnp.zeros_like(state.error)
    ev = _Events(
        state.start, state.version, state.finish, state.pending, state.clock, state.sampler,
        zero, zero, jnp.zeros((), dtype), jnp.zeros((), dtype),
    )  # fmt: skip
    ev, _ = jax.lax.scan(arrival, ev, (rand.obs, keys, u))
    aggregate = state.error + ev.total / K
    error, opt_state = optim.server_step(config, state.opt_state, state.error, aggregate, problem.theta_star)
    new = FedBuffState(
        problem.theta_star + error,
        error,
        ev.sampler,
        state.count + 1,
        opt_state,
        ev.start,
        ev.version,
        ev.finish,
        ev.pending,
        ev.clock,
        ev.staleness / K,
    )
    drift = (ev.locals_sq - 2 * jnp.dot(error, ev.locals_sum)) / K + jnp.sum(error * error)
    bits = config.channel.quantizer.bits(problem.dim)
    info = RoundInfo(
        client_drift=jnp.maximum(drift, 0.0),
        messages_sent=jnp.int32(K),
        messages_delivered=jnp.int32(K),
        bits_sent=jnp.int32(K * bits),
        bits_delivered=jnp.int32(K * bits),
        observations=jnp.int32(K * config.num_local_steps * observations_per_step(problem, config.skip)),
    )
    return new, info


def theory(config: FedBuffConfig, problem):
    """Refused, with the reason (module docstring)."""
    del config, problem
    _validate.fail(
        "algorithm",
        "fedbuff",
        "buffered asynchronous aggregation has no exact moment recursion: which agents fill a "
        "buffer and how stale their starts are follow the simulated clock (the agents' remaining "
        "job times, a Markov chain of its own), so its moments would need blocks per clock state; "
        "use Monte Carlo (buffer_size = N with every job one tick long is FedLSA, whose theory applies)",
    )


def staleness_bound(durations: Durations, num_agents: int, buffer_size: int) -> int:
    """The largest staleness a contribution can have. Agent c downloads at the first arrival after
    tick s and returns by tick ``s + D_max``; the arrivals between lie in ``[s + 1, s + D_max]``,
    where agent j arrives at most ``floor((D_max - 1) / d_j) + 1`` times (``d_j`` its shortest
    job): with A their sum the server steps at most ``ceil(A / K)`` times meanwhile."""
    table = durations.table(num_agents)
    shortest = np.argmax(table > 0, axis=1) + durations.first  # d_j
    arrivals = int(np.sum((durations.max - 1) // shortest + 1))
    return -(-arrivals // buffer_size)


def _check_weights(staleness: Callable, largest: int, where: str) -> None:
    """Refuse a staleness function whose weights on ``0..largest`` (float32, as in a run) are not one
    finite value ``> 0`` each, naming the first bad staleness."""
    tau = jnp.arange(largest + 1, dtype=jnp.float32)
    try:
        out = np.asarray(staleness(tau), np.float64)
    except Exception as e:  # noqa: BLE001 (the user's function failed: say so in one line)
        _validate.fail(
            "staleness", staleness, f"the function raised {type(e).__name__} on an array of staleness"
        )
    if out.shape != tau.shape:
        _validate.fail("staleness", staleness, "expected a function returning one weight per staleness")
    bad = ~(np.isfinite(out) & (out > 0))
    if np.any(bad):
        k = int(np.argmax(bad))
        _validate.fail(
            "staleness",
            staleness,
            f"s({k}) = {float(out[k])!r}, at {where}; expected a finite weight > 0 at every staleness "
            "(a weight <= 0 drops or reverses a contribution)",
        )


def _staleness_arg(staleness) -> float | Callable:
    if callable(staleness):  # tried on staleness 0..3 here, on every reachable one before a run
        _check_weights(
            staleness, 3, "staleness 0..3, tried when FedBuff is built (a run tries all it can reach)"
        )
        return staleness
    if isinstance(staleness, (bool, np.bool_)) or not isinstance(
        staleness, (int, float, np.integer, np.floating)
    ):
        staleness = -1.0
    if not staleness >= 0:
        _validate.fail(
            "staleness",
            staleness,
            "expected an exponent a >= 0 (weights (1 + tau)^-a; 0.5: FedBuff's 1/sqrt(1 + tau), "
            "0: none) or a function of the staleness tau",
        )
    return float(staleness)


def fedbuff(
    step_size: float,
    num_local_steps: int,
    buffer_size: int,
    durations: Durations | None = None,
    staleness: float | Callable = 0.5,
    skip: int = 1,
    quantizer=None,
    server_optimizer=None,
    **refused,
) -> Algorithm:
    """FedBuff with step size ``eta``, ``H`` local steps per job, a buffer of ``K`` contributions.

    Args:
      step_size: ``eta > 0``, or a schedule of the local-step count ``k = t H + h``, t the server
        steps done when the contribution is computed (:mod:`fedsa_jax.optim`).
      num_local_steps: ``H >= 1``, the local steps of every job.
      buffer_size: ``1 <= K <= N``: contributions per server step.
      durations: the law of the jobs' durations in ticks (:mod:`fedsa_jax.channel.clock`); default
        ``fj.clock.fixed(1)``, every job one tick.
      staleness: an exponent ``a >= 0``, contributions weighted ``(1 + tau)^(-a)`` (0.5, the default:
        FedBuff's ``1 / sqrt(1 + tau)``; 0: none), or a function ``s(tau)`` of the staleness (a float
        array), jit-compatible and hashable (a module-level function).
      skip: keep one observation out of ``skip`` (Markovian sampling), ``>= 1``.
      quantizer: the uplink's quantizer (:mod:`fedsa_jax.channel`; default exact), on each update.
      server_optimizer: None, or an optax ``GradientTransformation`` on the pseudo-gradient
        (``optax.sgd(eta_g)``: FedBuff's server learning rate).

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=8)
      >>> alg = fj.fedbuff(0.1, 10, buffer_size=4, durations=fj.clock.geometric(3.0, 20))
      >>> res = fj.simulate(jax.random.key(1), problem, alg, 50, 64, metrics=["wall_clock"])
    """
    _refuse(refused)
    eta = optim.step_size_arg(step_size)
    H = _validate.integer("num_local_steps", num_local_steps)
    K = _validate.integer("buffer_size", buffer_size)
    law = Durations(((1.0,),), name="fixed") if durations is None else durations
    if not isinstance(law, Durations):
        _validate.fail(
            "durations", durations, "expected None or a law of fj.clock (fixed, uniform, geometric, ...)"
        )
    config = FedBuffConfig(
        eta,
        channel(quantizer),
        H,
        K,
        law,
        _staleness_arg(staleness),
        _validate.integer("skip", skip),
        optim.server_optimizer_arg(server_optimizer),
    )
    return Algorithm(config, "fedbuff", init, step, theory)


_REFUSED = {  # option -> (value that is no refusal, why)
    "success_prob": (1.0, "erasures are not built: the server counts the contributions it receives"),
    "aggregation": ("divide_by_n", "the server divides by the buffer size K"),
    "error_feedback": (None, "error feedback is not built for asynchronous agents"),
    "downlink": (None, "a compressed downlink is not built: agents download the exact iterate"),
    "clients_per_round": (None, "every agent is always busy (the buffer size K sets the pace)"),
    "privacy": (None, "differential privacy is not built for asynchronous agents"),
}


def _refuse(options: dict) -> None:
    """One-line errors for the options of the synchronous algorithms that FedBuff does not take."""
    for name, value in options.items():
        if name not in _REFUSED:
            raise TypeError(f"fedbuff() got an unexpected keyword argument {name!r}")
        allowed, why = _REFUSED[name]
        if value != allowed:
            _validate.fail(name, value, f"fedbuff takes {allowed!r} only: {why}")


def _from_options(step_size, args, **channel) -> Algorithm:
    """FedBuff from the options, checked for the ``--agents`` N (``fj.simulate`` checks the same
    with the problem): ``buffer_size`` at most N, a law with one row or N."""
    N = getattr(args, "agents", None)
    if N is not None and args.buffer_size > N:
        _validate.fail("buffer_size", args.buffer_size, f"expected at most N = {N} (the problem's agents)")
    return fedbuff(
        step_size,
        args.local_steps,
        args.buffer_size,
        durations_from_text(args.durations, N),
        args.staleness,
        skip=args.skip,
        **channel,
    )


BUFFER_SIZE = Option(
    ("--buffer-size",),
    "buffer_size",
    "buffered asynchronous aggregation: contributions K per server step, at most N",
    positive_int,
    2,
    metavar="K",
    group="algorithms",
    params=("buffer_size",),
)


STALENESS = Option(
    ("--staleness",),
    "staleness",
    "contributions weighted (1 + staleness)^-A (0.5: 1/sqrt(1 + staleness), 0: none)",
    nonnegative_real,
    0.5,
    metavar="A",
    group="algorithms",
    params=("staleness",),
)


registry.register_algorithm(
    "fedbuff",
    _from_options,
    options=(
        registry.LOCAL_STEPS,
        BUFFER_SIZE,
        clock.DURATIONS,
        STALENESS,
        registry.SKIP,
    ),
    title="FedBuff",
    note="buffered asynchronous aggregation, K contributions per round",
    order=5,
)
