"""Privacy accounting for the uplink's Gaussian mechanism (:mod:`fedsa_jax.channel.dp`).

The epsilon of a run at a given delta is computed by Google's ``dp-accounting`` library (its Rényi
DP accountant by default, ``accountant="pld"`` its privacy-loss-distribution accountant), never by a
formula of ours: the library is maintained, tested against the literature, and the same numbers are
what TensorFlow Privacy, Opacus's users and Flower report. What is composed, per agent, is one
release per communication (a round for FedLSA, SCAFFLSA and QFedTD; a communication for Scaffnew):

* **central, every agent every round**: the sum of clipped messages plus ``N(0, sigma^2 C^2)``;
  adding or removing one agent's data changes the sum by at most C: a Gaussian mechanism of noise
  multiplier ``sigma``, composed over the releases, relation *add or remove one*;
* **central, a cohort of m < N agents** drawn uniformly without replacement each round: the same
  mechanism on a subsample; the library's amplification by sampling without replacement (Wang,
  Balle, Kasiviswanathan, AISTATS 2019) holds for the relation *replace one* (the dataset of N agents
  keeps its size), under which the sum's sensitivity is 2C: noise multiplier ``sigma / 2`` inside
  ``SampledWithoutReplacementDpEvent(N, m, .)`` (RDP only: the PLD accountant does not take it);
* **local**: each agent's own message, clipped and noised before it leaves, seen by the server with
  the agent's identity: no amplification; any two data sets of the agent change its clipped message
  by at most 2C: noise multiplier ``sigma / 2``, composed over every round (an upper bound when a
  cohort leaves the agent out of some rounds), relation *replace one* (the agent's data).

All are client-level guarantees (an agent's whole data), not record-level. Without clipping
(``clip=False``) the sensitivity is unbounded and no epsilon is reported.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import dp_accounting
from dp_accounting import pld, rdp

from fedsa_jax import _validate

__all__ = ["ACCOUNTANTS", "PrivacyLoss", "epsilon", "noise_multiplier", "report"]

ACCOUNTANTS = ("rdp", "pld")
MAX_NOISE_MULTIPLIER = 1e4  # --target-epsilon searches sigma in (0, MAX_NOISE_MULTIPLIER]
_RELATIONS = {
    "add_or_remove_one": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
}


@dataclasses.dataclass(frozen=True)
class PrivacyLoss:
    """``(epsilon, delta)`` of a run's releases, with what was composed and how."""

    epsilon: float
    delta: float
    releases: int  # releases composed per agent
    mechanism: dict  # the privacy mechanism (noise multiplier, clipping norm, mode)
    relation: str  # "add_or_remove_one" or "replace_one": the neighbouring data sets (of agents' data)
    event: str  # the dp-accounting event composed
    accountant: str  # "rdp" or "pld"

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _event(noise: float, releases: int, mode: str, num_agents: int, clients_per_round: int | None):
    """``(dp_accounting event, relation)`` of ``releases`` releases (module docstring)."""
    if mode == "local":  # replace-one at sensitivity 2C, computed as add-or-remove at sigma / 2 (equal)
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise / 2), releases)
        return event, "replace_one"
    m = clients_per_round
    if m is None or m >= num_agents:
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(noise), releases
        ), "add_or_remove_one"
    sampled = dp_accounting.SampledWithoutReplacementDpEvent(
        num_agents, m, dp_accounting.GaussianDpEvent(noise / 2)
    )
    return dp_accounting.SelfComposedDpEvent(sampled, releases), "replace_one"


def _accountant(name: str, relation: str, mode: str = "central"):
    """The library's accountant; local noise is composed under add-or-remove at sigma / 2 (a Gaussian's
    replace-one privacy loss at sensitivity 2C is that; PLD would otherwise double the shift again)."""
    relation = "add_or_remove_one" if mode == "local" else relation
    if name == "rdp":
        return rdp.RdpAccountant(neighboring_relation=_RELATIONS[relation])
    return pld.PLDAccountant(neighboring_relation=_RELATIONS[relation])


def _epsilon(
    noise: float, releases: int, delta: float, mode: str, num_agents, clients_per_round, name
) -> float:
    if noise == 0.0:
        return math.inf
    if releases == 0:
        return 0.0
    event, relation = _event(noise, releases, mode, num_agents, clients_per_round)
    accountant = _accountant(name, relation, mode)
    if not accountant.supports(event):
        _validate.fail(
            "accountant",
            name,
            f"dp-accounting's {name.upper()} accountant does not take {type(event.event).__name__} "
            "(a cohort sampled without replacement): use accountant='rdp'",
        )
    return float(accountant.compose(event).get_epsilon(delta))


def _check(delta, num_agents, clients_per_round, accountant) -> float:
    d = _validate.real("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    _validate.integer("num_agents", num_agents)
    if clients_per_round is not None:
        _validate.integer("clients_per_round", clients_per_round)
    _validate.choice("accountant", accountant, ACCOUNTANTS)
    return d


def epsilon(
    privacy,
    releases: int,
    num_agents: int,
    delta: float = 1e-5,
    clients_per_round: int | None = None,
    accountant: str = "rdp",
) -> PrivacyLoss:
    """The privacy loss of ``releases`` releases of ``privacy`` (:func:`fedsa_jax.channel.privacy`)
    among ``num_agents`` agents (a cohort of ``clients_per_round`` per round, or every agent), at
    ``delta`` in (0, 1), by dp-accounting's ``accountant`` (``"rdp"`` or ``"pld"``)."""
    d = _check(delta, num_agents, clients_per_round, accountant)
    T = _validate.integer("releases", releases, minimum=0)
    if not privacy.clip:
        _validate.fail(
            "privacy",
            privacy.describe(),
            "no privacy guarantee without clipping (clip=False): the sensitivity is unbounded",
        )
    eps = _epsilon(privacy.noise_multiplier, T, d, privacy.mode, num_agents, clients_per_round, accountant)
    event, relation = _event(
        max(privacy.noise_multiplier, 1.0), max(T, 1), privacy.mode, num_agents, clients_per_round
    )
    return PrivacyLoss(eps, d, T, privacy.describe(), relation, type(event.event).__name__, accountant)


def noise_multiplier(
    target_epsilon: float,
    releases: int,
    num_agents: int,
    delta: float = 1e-5,
    mode: str = "central",
    clients_per_round: int | None = None,
    accountant: str = "rdp",
) -> float:
    """The smallest noise multiplier ``sigma`` whose ``releases`` releases cost at most
    ``target_epsilon`` at ``delta`` (dp-accounting's ``calibrate_dp_mechanism``); a one-line error if
    none up to ``MAX_NOISE_MULTIPLIER`` does."""
    d = _check(delta, num_agents, clients_per_round, accountant)
    target = _validate.real("target_epsilon", target_epsilon, 0.0, math.inf, low_open=True)
    T = _validate.integer("releases", releases)
    _validate.choice("mode", mode, ("local", "central"))

    def cost(sigma: float) -> float:
        return _epsilon(sigma, T, d, mode, num_agents, clients_per_round, accountant)

    if cost(MAX_NOISE_MULTIPLIER) > target:
        _validate.fail(
            "target_epsilon",
            target,
            f"cannot be met in {T} releases at delta={d:g}: even sigma = {MAX_NOISE_MULTIPLIER:g} "
            f"costs epsilon = {cost(MAX_NOISE_MULTIPLIER):.3g}",
        )

    def event(sigma: float):
        return _event(sigma, T, mode, num_agents, clients_per_round)[0]

    relation = _event(1.0, T, mode, num_agents, clients_per_round)[1]
    low = 1e-3 if accountant == "rdp" else 0.1  # PLD's discretisation explodes for tiny sigma
    sigma = dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(accountant, relation, mode),
        event,
        target,
        d,
        dp_accounting.LowerEndpointAndGuess(low, 1.0),
    )
    return float(sigma)


def report(algorithm, num_agents: int, communications: float) -> dict[str, Any] | None:
    """What ``result.privacy`` holds for a run of ``algorithm`` whose agents sent ``communications``
    messages in all (the mean over seeds): the epsilon of its releases, one per ``N`` messages (``m``
    with a cohort), at the mechanism's delta; None without a privacy mechanism; the reason in place
    of epsilon without clipping."""
    privacy = algorithm.channel.privacy
    if privacy is None:
        return None
    m = algorithm.clients_per_round
    senders = num_agents if m is None else min(m, num_agents)
    releases = math.ceil(float(communications) / senders - 1e-9)
    reason = None if privacy.clip else "no guarantee without clipping"
    reason = reason if privacy.noise_multiplier > 0 else "no noise (sigma = 0): no guarantee"
    if reason is not None:
        return {"mechanism": privacy.describe(), "epsilon": None, "releases": releases, "reason": reason}
    return epsilon(privacy, releases, num_agents, privacy.delta, m).describe()
