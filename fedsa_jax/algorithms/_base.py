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
drawn first; the driver draws them one round ahead (see :mod:`fedsa_jax.simulate`)
and calls ``step_from``. Inside a step the agents are vmapped; the driver vmaps
over seeds and scans rounds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate
from fedsa_jax.channel import Channel, Delivery, channel, transmit


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Algorithm:
    """An algorithm: ``init(key, problem, theta0) -> state`` and
    ``step(key, state, problem) -> (state, info)`` for one seed
    (``= step_from(randomness(key, problem), state, problem)``)."""

    config: Any
    name: str = dataclasses.field(metadata=dict(static=True))
    init_fn: Callable = dataclasses.field(metadata=dict(static=True))
    step_fn: Callable = dataclasses.field(metadata=dict(static=True))

    def init(self, key: jax.Array, problem, theta0: jax.Array):
        return self.init_fn(key, problem, theta0, self.config)

    def randomness(self, key: jax.Array, problem) -> RoundRandomness:
        """One round's random numbers: all agents' observations in one block, and a
        key for the channel (two independent streams split from ``key``)."""
        k_obs, k_channel = jax.random.split(key)
        obs = problem.randomness(k_obs, problem.num_agents, self.config.num_local_steps, self.config.skip)
        return RoundRandomness(obs, k_channel)

    def step_from(self, rand, state, problem):
        return self.step_fn(rand, state, problem, self.config)

    def step(self, key: jax.Array, state, problem):
        return self.step_from(self.randomness(key, problem), state, problem)

    def bits_per_message(self, dim: int) -> int:
        return self.config.channel.quantizer.bits(dim)

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "algorithm": self.name,
            "step_size": float(cfg.step_size),
            "num_local_steps": cfg.num_local_steps,
            "skip": cfg.skip,
            "channel": cfg.channel.describe(),
        }


class RoundRandomness(NamedTuple):
    obs: Any  # the problem's block for all agents (see problem.randomness)
    channel: jax.Array  # key for quantizers and erasures


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalStepsConfig:
    """Hyperparameters of FedLSA, SCAFFLSA and QFedTD (``H = 1``)."""

    step_size: float  # eta (a traced leaf: changing or vmapping it does not recompile)
    channel: Channel  # uplink; its success probability is a traced leaf too
    num_local_steps: int = dataclasses.field(metadata=dict(static=True))  # H
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))  # keep 1 obs out of skip


class RoundInfo(NamedTuple):
    """Per-round diagnostics (same structure for every algorithm)."""

    client_drift: jax.Array  # mean_c |theta^c_{t,H} - theta_{t+1}|^2 (0 for QFedTD)
    num_delivered: jax.Array  # () int32, uplink messages delivered this round


# Local steps unrolled per scan iteration. With the fused PRNG, unroll 2..10 measured the same on a
# 2-core CPU; unroll 1 ran on one core only (see benchmarks/README.md).
LOCAL_UNROLL = 8


def local_steps_config(
    step_size: Any, num_local_steps: Any, skip: Any = 1, quantizer=None, success_prob: Any = 1.0,
    aggregation: str = "divide_by_n",
) -> LocalStepsConfig:
    """Validated :class:`LocalStepsConfig`."""
    eta = _validate.real("step_size", step_size, 0.0, low_open=True)
    H = _validate.integer("num_local_steps", num_local_steps)
    k = _validate.integer("skip", skip)
    return LocalStepsConfig(eta, channel(quantizer, success_prob, aggregation), H, k)


def server_update(key: jax.Array, theta: jax.Array, local: jax.Array, ch: Channel) -> tuple[jax.Array, Delivery]:
    """Aggregate the agents' model differences ``m_c = theta^c - theta`` over the uplink.

    Exact channel: ``theta + mean_c m_c = mean_c theta^c`` (computed as the mean).
    Otherwise ``theta + sum_c w_c q(m_c)`` with the channel's weights (``1/N`` or
    ``1/|R|`` on delivered messages, 0 on lost ones).
    """
    N = local.shape[0]
    if ch.trivial:
        delivered = jnp.ones((N,), bool)
        weights = jnp.full((N,), 1.0 / N, local.dtype)
        return local.mean(axis=0), Delivery(local - theta, delivered, weights)
    delivery = transmit(key, local - theta, ch)
    return theta + jnp.sum(delivery.weights[:, None] * delivery.messages, axis=0), delivery


def round_info(local: jax.Array, theta: jax.Array, delivery: Delivery) -> RoundInfo:
    drift = jnp.mean(jnp.sum((local - theta) ** 2, axis=-1))
    return RoundInfo(drift, jnp.sum(delivery.delivered).astype(jnp.int32))


def init_samplers(key: jax.Array, problem) -> jax.Array:
    """Each agent's observation-stream state (Markov chain state), shape ``(N,)``."""
    keys = jax.random.split(key, problem.num_agents)
    return jax.vmap(problem.init_sampler)(keys, problem.agent_params())


def initial_theta(problem, theta0: jax.Array) -> jax.Array:
    return jnp.asarray(theta0, problem.dtype)


def local_updates(problem, params, obs, theta, step_size, control=None):
    """H local steps of one agent: ``theta <- theta - eta (A_c(Z_h) theta - b_c(Z_h) - control)``.

    ``obs`` has leading axis H (drawn in one block); ``control`` is SCAFFLSA's
    ``xi_c`` (``None`` for FedLSA).
    """

    def body(th, o):
        g = problem.direction(params, o, th)
        if control is not None:
            g = g - control
        return th - step_size * g, None

    theta, _ = jax.lax.scan(body, theta, obs, unroll=min(LOCAL_UNROLL, jax.tree.leaves(obs)[0].shape[0]))
    return theta


def run_agents(rand, problem, samplers, theta, step_size, skip, controls=None):
    """All agents' local rounds from the common ``theta`` (vmapped over agents).

    ``rand``: the random numbers of all agents' H observations, one block
    (:meth:`Algorithm.randomness`). Returns ``(theta^c_{t,H} (N, d), new samplers (N,))``.
    """

    def agent(rand, params, sampler, control):
        obs, sampler = problem.observe(params, sampler, rand, skip)
        return local_updates(problem, params, obs, theta, step_size, control), sampler

    return jax.vmap(agent)(rand, problem.agent_params(), samplers, controls)
