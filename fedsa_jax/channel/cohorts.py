"""Partial participation: a uniform cohort of ``m`` of the N agents takes part in each round.

``clients_per_round = m`` (an argument of :func:`~fedsa_jax.fedlsa`, :func:`~fedsa_jax.scafflsa`,
:func:`~fedsa_jax.scaffnew`, :func:`~fedsa_jax.qfedtd`, ``--clients-per-round``): each round a cohort S of
m agents is drawn uniformly without replacement, from a key of its own (``fold_in(key,
COHORT_STREAM)``, so that ``m = N`` keeps every other random number); only its agents observe and
send, the others keep their state (:func:`keep_outside`), and the aggregate weighs the messages
``1/m`` (``"divide_by_n"``) or ``1/|S ∩ R|`` on the delivered ones (:func:`fedsa_jax.channel.transmit`).
The exact theory's inclusion probabilities ``P(c in S) = m/N``, ``P(c, j in S) = m(m-1)/(N(N-1))``
enter the aggregate's moments (:func:`fedsa_jax.moments.aggregate`, ``clients_per_round=m``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedsa_jax import _validate
from fedsa_jax.registry import Option, positive_int

__all__ = ["cohort_mask", "keep_outside", "round_cohort"]

COHORT_STREAM = 0x636F68  # fold_in tag of the cohort's key ("coh"): a stream of its own


def with_clients_per_round(config, clients_per_round):
    """``config`` with its ``clients_per_round`` field set, validated: None or an integer >= 1
    (at most N is checked with the problem, :func:`check`)."""
    if clients_per_round is None:
        return config
    m = _validate.integer("clients_per_round", clients_per_round)
    return dataclasses.replace(config, clients_per_round=m)


def cohort_active(config, num_agents: int) -> bool:
    """Whether rounds draw a cohort: ``clients_per_round = m < N`` (None or N: every agent, today's code)."""
    m = getattr(config, "clients_per_round", None)
    return m is not None and m < num_agents


def cohort_mask(key: jax.Array, num_agents: int, clients_per_round: int) -> jax.Array:
    """The cohort S as a mask ``(N,) bool``: m agents drawn uniformly without replacement
    (the first m of a uniform random permutation of ``0..N-1``, ``jax.random.permutation(key, N)``)."""
    chosen = jax.random.permutation(key, num_agents)[:clients_per_round]
    return jnp.zeros((num_agents,), bool).at[chosen].set(True)


def round_cohort(rand, config, problem) -> jax.Array | None:
    """The round's cohort mask from ``rand.cohort`` (None when every agent takes part)."""
    if not cohort_active(config, problem.num_agents):
        return None
    return cohort_mask(rand.cohort, problem.num_agents, config.clients_per_round)


def keep_outside(cohort: jax.Array | None, new, old):
    """``new`` for the cohort's agents, ``old`` for the others (pytrees with a leading agent axis N):
    agents outside the cohort keep their state (samplers, iterates); ``cohort=None``: ``new``."""
    if cohort is None:
        return new

    def pick(n, o):
        return jnp.where(cohort.reshape(cohort.shape + (1,) * (jnp.ndim(n) - 1)), n, o)

    return jax.tree.map(pick, new, old)


def check(config, num_agents: int) -> None:
    """Refuses ``clients_per_round = m > N`` (needs the problem's N; called before compiling)."""
    m = getattr(config, "clients_per_round", None)
    if m is not None and m > num_agents:
        _validate.fail("clients_per_round", m, f"expected at most N = {num_agents} (the problem's agents)")


def with_round_key(rand, key: jax.Array, config, problem):
    """``rand`` (:class:`~fedsa_jax.algorithms.RoundRandomness`) with the cohort's key when rounds draw
    a cohort: ``fold_in(key, COHORT_STREAM)``, a stream of its own, so that ``m = N`` keeps the numbers
    of every agent."""
    if not cohort_active(config, problem.num_agents):
        return rand
    return rand._replace(cohort=jax.random.fold_in(key, COHORT_STREAM))


CLIENTS_PER_ROUND = Option(
    ("--clients-per-round",),
    "clients_per_round",
    "partial participation: a cohort of M agents drawn uniformly each round (Scaffnew: each "
    "communication), the others idle (default: every agent)",
    positive_int,
    None,
    metavar="M",
    group="algorithms",
    params=("clients_per_round",),
)
