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

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.local_work import CountLaw, check_table, counts_law, from_option

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
