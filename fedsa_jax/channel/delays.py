"""Delayed updates: agent c computes round t's update from the server iterate ``tau_{c,t}`` rounds old.

The server applies, at round t, updates computed from stale iterates (Adibi et al., "Stochastic
approximation with delayed updates: finite-time rates under Markovian sampling", AISTATS 2024, with
its multi-agent version):

    theta_{t+1} = theta_t + (1/N) sum_c q(theta^c_{t,H} - theta_{t - tau_{c,t}}),

agent c's H local steps starting from ``theta_{t - tau_{c,t}}`` (``theta_s = theta_0`` for
``s < 0``), the message through the uplink channel as without delays. The delay is drawn each
round from a law with bounded support ``{0, ..., tau_max}``, independently of the state and of the
observations, per agent or one draw shared by every agent:

* :func:`fixed` ``(tau)``: every update ``tau`` rounds old;
* :func:`uniform` ``(tau_max)``: uniform on ``{0, ..., tau_max}``;
* :func:`geometric` ``(mean, tau_max)``: geometric on ``{0, 1, ...}`` with that mean, conditioned on
  ``<= tau_max`` (a bounded support is required: the state carries the last ``tau_max`` iterates);
* :func:`law` ``(pmf)``: ``P(tau = k)`` for ``k = 0..tau_max``, one row or one per agent.

Pass one as ``delays=`` of :func:`~fedsa_jax.fedlsa` or :func:`~fedsa_jax.scafflsa` (the control
variates then move against the updates taken from the stale starts; the limit stays theta*). The
state carries a buffer of the last ``tau_max`` server iterates. A delay of 0 everywhere
(``fixed(0)``) is no delay: the same kernel and numbers as without the argument.

**Mean and limit.** In error coordinates, with ``Gamma_c = (I - eta A_c)^H`` and
``D_k = (1/N) sum_c P(tau_c = k)(I - Gamma_c)``, the mean follows the companion recursion
``E e_{t+1} = E e_t - sum_k D_k E e_{t-k} + rho_bar`` on ``(e_t, ..., e_{t - tau_max})``. A constant
trajectory is a fixed point exactly when it is one without delays: the limit is FedLSA's, delays
change the transient and the stability (for a fixed delay tau the scalar mode ``x_{t+1} = x_t -
delta x_{t - tau}`` is stable iff ``0 < delta < 2 sin(pi / (2 (2 tau + 1)))``). The second moment
follows from :func:`fedsa_jax.moments.random_stop` with stages that start the agents from each lag:
independent delays and one shared delay have the same mean and different second moments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate, moments, optim
from fedsa_jax.channel.local_work import CountLaw, check_table, counts_law, from_option, local_work_theory
from fedsa_jax.registry import Option, law_spec, shared_flag

__all__ = ["Delays", "fixed", "from_text", "geometric", "law", "uniform"]

DELAY_STREAM = 0x646C79  # fold_in tag of the round's delay key ("dly"): a stream of its own


@dataclasses.dataclass(frozen=True)
class Delays(CountLaw):
    """A law of the delays (hashable, compared by value): ``pmf[c][k] = P(tau_c = k)``, ``k =
    0..tau_max``; one row or one per agent; ``shared``: one delay per round for every agent."""

    first = 0
    argument = "delays"

    @property
    def tau_max(self) -> int:
        return self.largest


def _make(pmf, name: str, shared: bool) -> Delays | None:
    out = counts_law(Delays, pmf, name, shared)
    return None if out.tau_max == 0 else out


def from_text(text: str, shared: bool = False, num_agents: int | None = None) -> Delays | None:
    """The law of the command line's ``--delays LAW:NUMBERS`` (``none``: None), for ``num_agents``
    agents where given; refusals name ``delays``."""
    if text == "none":
        return None

    def build(name: str, values: list[Any]) -> Delays | None:
        if name == "fixed":
            return fixed(values[0])
        if name == "uniform":
            return uniform(values[0], shared)
        return geometric(float(values[0]), values[1], shared)

    return from_option("delays", text, build, num_agents)


def law(pmf, shared: bool = False) -> Delays | None:
    """Any bounded law: ``pmf[k] = P(tau = k)`` for ``k = 0..tau_max`` (one row, or one per agent)."""
    return _make(pmf, "law", shared)


def fixed(tau: int) -> Delays | None:
    """Every update ``tau >= 0`` rounds old (``fixed(0)``: no delay, None)."""
    t = _validate.integer("tau", tau, minimum=0)
    check_table("tau", tau, 1, t + 1)
    pmf = np.zeros(t + 1)
    pmf[t] = 1.0
    return _make(pmf, "fixed", False)


def uniform(tau_max: int, shared: bool = False) -> Delays | None:
    """Delays uniform on ``{0, ..., tau_max}`` each round."""
    t = _validate.integer("tau_max", tau_max, minimum=0)
    check_table("tau_max", tau_max, 1, t + 1)
    return _make(np.ones(t + 1), "uniform", shared)


def geometric(mean: float, tau_max: int | None = None, shared: bool = False) -> Delays | None:
    """Delays geometric on ``{0, 1, ...}`` with mean ``mean``, conditioned on ``<= tau_max``."""
    if not isinstance(mean, (int, float)) or not math.isfinite(mean) or mean < 0:
        _validate.fail("mean", mean, "expected a real number >= 0")
    if tau_max is None:
        _validate.fail(
            "tau_max",
            tau_max,
            "expected an integer >= 0: a delay law needs a bounded support (the state "
            "keeps the last tau_max iterates, and the exact theory one block per lag)",
        )
    t = _validate.integer("tau_max", tau_max, minimum=0)
    check_table("tau_max", tau_max, 1, t + 1)
    q = 1.0 / (1.0 + float(mean))  # P(tau = k) = q (1 - q)^k has mean (1 - q) / q
    return _make(q * (1 - q) ** np.arange(t + 1), "geometric", shared)


def with_delays(config, delays):
    """``config`` with its ``delays`` field (a :class:`fedsa_jax.channel.delays.Delays`, or None: none)."""
    if delays is None:
        return config
    if not isinstance(delays, Delays):
        _validate.fail(
            "delays", delays, "expected None or a law of fj.delays (fixed, uniform, geometric, law)"
        )
    if getattr(config, "downlink", None) is not None:
        _validate.fail("delays", delays.name, "delayed updates with a compressed downlink are not built")
    if isinstance(config.num_local_steps, optim.LocalSteps):
        _validate.fail(
            "delays", delays.name, "delayed updates with local steps growing with the round are not built"
        )
    return dataclasses.replace(config, delays=delays)


def delayed_starts(rand, config, problem, error: jax.Array, past: Any):
    """The agents' starts ``(N, d)``: ``theta_{t - tau_c}`` from the buffer ``past`` (``theta_{t-1},
    ..., theta_{t - tau_max}``, error coordinates) with this round's delays; ``error`` without delays."""
    law = getattr(config, "delays", None)
    if law is None:
        return error
    lags = law.draw(rand.delay, problem.num_agents)
    return jnp.concatenate([error[None], past])[lags]


def delayed_messages(error: jax.Array, start: jax.Array, local: jax.Array):
    """``(local, reference)`` for the server: with delayed starts (``start (N, d)``) each agent's update
    ``local_c - start_c`` against its stale start moves the current iterate, ``error + (local_c -
    start_c)`` against ``error``; ``(local, start)`` as they are otherwise."""
    if start.ndim == 2:
        return error + (local - start), error
    return local, start


def initial_past(config, error: jax.Array) -> Any:
    """The buffer of the last ``tau_max`` iterates at the start: ``theta_0`` in every slot; ``()``
    without delays."""
    law = getattr(config, "delays", None)
    return () if law is None else jnp.broadcast_to(error, (law.tau_max, error.shape[0]))


def pushed(config, past: Any, error: jax.Array) -> Any:
    """The buffer after a round that started at ``error``: ``(theta_t, theta_{t-1}, ...)``."""
    if getattr(config, "delays", None) is None:
        return past
    return jnp.concatenate([error[None], past[:-1]])


def delay_theory(y, config, steps: list, reference: str) -> list:
    """A round's start and local phases under the config's delays (:mod:`fedsa_jax.channel.delays`): each
    agent starts from the lag-k block (``theta``, ``past1``, ...) with the law's probability
    (:func:`fedsa_jax.moments.random_stop`, also copying it to the agent's ``lag`` block), runs
    ``steps``, and its message is taken against its start: ``loc_c <- theta + loc_c - lag_c``; then
    the buffer moves (``past_k <- past_{k-1}``, ``past1 <- theta``). Without delays: the broadcast
    and the steps."""
    law = getattr(config, "delays", None)
    if law is None:
        return [moments.broadcast(y, source=reference), *local_work_theory(y, config, steps, reference)]
    law.check(y.N)
    sources = ["theta"] + [f"past{k}" for k in range(1, law.tau_max + 1)]
    stages = [
        moments.chain(
            y, ("lag", s), moments.broadcast(y, source=s), moments.broadcast(y, source=s, into="lag")
        )
        for s in sources
    ]
    pmf = law.pmf if law.shared else law.table(y.N)
    start = moments.random_stop(y, stages, pmf, law.shared, blocks=("loc", "lag"), key=("delays", law))
    push = moments.assign(y, **{s: {prev: 1.0} for prev, s in zip(sources[:-1], sources[1:])})
    rebase = moments.rebase(y, iterates="loc", start="lag", base="theta")
    return [start, *local_work_theory(y, config, steps, "lag"), rebase, push]


def delay_blocks(y, config) -> None:
    """The blocks delays add to the state: the buffer ``past1..past{tau_max}`` (carried, starting at
    theta_0) and each agent's start ``lag``."""
    law = getattr(config, "delays", None)
    if law is None:
        return
    for k in range(1, law.tau_max + 1):
        y.add(f"past{k}", initial=moments.START, carried=True)
    y.add("lag", per_agent=True)


def check(config, num_agents: int) -> None:
    """Refuses a law with one row per agent for another N (called before compiling)."""
    law = getattr(config, "delays", None)
    if law is not None:
        law.check(num_agents)


def with_round_key(rand, key: jax.Array, config, problem):
    """``rand`` with the key of the round's delays (``fold_in(key, DELAY_STREAM)``) under delays."""
    if getattr(config, "delays", None) is None:
        return rand
    return rand._replace(delay=jax.random.fold_in(key, DELAY_STREAM))


DELAY_LAWS = {"fixed": 1, "uniform": 1, "geometric": 2}


def delays_spec(text: str) -> str:
    """``--delays``: ``none`` or ``LAW:NUMBERS`` (:mod:`fedsa_jax.channel.delays`)."""
    return law_spec(text, DELAY_LAWS, "none, fixed:TAU, uniform:TAU_MAX or geometric:MEAN,TAU_MAX")


DELAYS = Option(
    ("--delays",),
    "delays",
    "delayed updates: each agent's update starts from the server iterate TAU rounds old, fixed:TAU, "
    "uniform:TAU_MAX or geometric:MEAN,TAU_MAX (default none)",
    delays_spec,
    "none",
    metavar="LAW",
    group="algorithms",
    params=("delays",),
    read_by="fedlsa and scafflsa",
)


DELAYS_SHARED = shared_flag("delays", "delay", "fedlsa and scafflsa", ("uniform", "geometric"))
