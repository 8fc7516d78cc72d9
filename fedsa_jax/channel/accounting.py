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
  ``SampledWithoutReplacementDpEvent(N, m, .)`` (RDP only: the PLD accountant does not take it).
  Each release is also at most a Gaussian of sensitivity 2C whether or not the agent was drawn (no
  amplification: ``GaussianDpEvent(sigma / 2)``, composed as add-or-remove at sigma / 2), a valid
  bound for the same relation and the smaller one at large cohorts or small sigma: the smaller of
  the two is reported, and ``PrivacyLoss.event`` names it. ``clients_per_round = N`` is the row
  above;
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
PLD_MAX_LOAD = 400.0  # the PLD accountant's largest releases / sigma^2 (measured: 1.4 GB, 15 s)
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


def _bounds(noise: float, releases: int, mode: str, num_agents: int, clients_per_round: int | None):
    """The valid bounds of ``releases`` releases (module docstring): ``[(event, relation, scale)]``,
    ``scale`` the divisor of sigma in each release's Gaussian (1, or 2 at sensitivity 2C, composed as
    add-or-remove at sigma / 2, equal to replace-one at 2C)."""
    if mode == "local":
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise / 2), releases)
        return [(event, "replace_one", 2)]
    m = clients_per_round
    if m is None or m >= num_agents:  # every agent every round: no sampling
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise), releases)
        return [(event, "add_or_remove_one", 1)]
    sampled = dp_accounting.SampledWithoutReplacementDpEvent(
        num_agents, m, dp_accounting.GaussianDpEvent(noise / 2)
    )
    unsampled = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise / 2), releases)
    return [
        (dp_accounting.SelfComposedDpEvent(sampled, releases), "replace_one", 0),
        (unsampled, "replace_one", 2),
    ]


def _accountant(name: str, relation: str, scale: int):
    """The library's accountant; a Gaussian of sensitivity 2C (``scale`` 2) is composed under
    add-or-remove at sigma / 2 (its replace-one privacy loss is that; PLD would otherwise double the
    shift again)."""
    relation = "add_or_remove_one" if scale == 2 else relation
    if name == "rdp":
        return rdp.RdpAccountant(neighboring_relation=_RELATIONS[relation])
    return pld.PLDAccountant(neighboring_relation=_RELATIONS[relation])


def _pld_load(noise: float, releases: int, scale: int) -> float:
    """``releases / (sigma / scale)^2``: the squared mu of the composed Gaussian, which sets the size of
    the PLD accountant's grid."""
    return releases * (max(scale, 1) / noise) ** 2


def _epsilon(noise: float, releases: int, delta: float, mode: str, num_agents, clients_per_round, name):
    """``(epsilon, event, relation)``: the smallest of the valid bounds the accountant takes. A noise
    multiplier above ``MAX_NOISE_MULTIPLIER`` is accounted at it (epsilon falls with sigma: an upper
    bound, about 0, where the library's arithmetic would overflow)."""
    noise = min(noise, MAX_NOISE_MULTIPLIER)
    bounds = _bounds(max(noise, 1e-300), max(releases, 1), mode, num_agents, clients_per_round)
    taken = [b for b in bounds if _accountant(name, b[1], b[2]).supports(b[0])]
    if noise == 0.0 or releases == 0:
        return (math.inf if noise == 0.0 else 0.0), type(taken[0][0].event).__name__, taken[0][1]
    best = None
    for event, relation, scale in taken:
        load = _pld_load(noise, releases, scale)
        if name == "pld" and load > PLD_MAX_LOAD:
            _validate.fail(
                "accountant",
                name,
                f"the PLD accountant's grid grows with releases / (sigma/{max(scale, 1)})^2 = {load:.3g} > "
                f"{PLD_MAX_LOAD:g} ({releases} releases at sigma = {noise:g}; 1.4 GB and 15 s at 400, "
                "9 GB at 1000): use accountant='rdp'",
            )
        eps = float(_accountant(name, relation, scale).compose(event).get_epsilon(delta))
        if best is None or eps < best[0]:
            best = (eps, type(event.event).__name__, relation)
    assert best is not None
    return best


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
    eps, event, relation = _epsilon(
        privacy.noise_multiplier, T, d, privacy.mode, num_agents, clients_per_round, accountant
    )
    return PrivacyLoss(eps, d, T, privacy.describe(), relation, event, accountant)


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
    ``target_epsilon`` at ``delta`` (a bisection on :func:`epsilon`'s number, the smaller of the valid
    bounds); a one-line error if none up to ``MAX_NOISE_MULTIPLIER`` does, or if every sigma down to the
    search's lower end does (1e-3; for PLD, where its grid reaches ``PLD_MAX_LOAD``)."""
    d = _check(delta, num_agents, clients_per_round, accountant)
    target = _validate.real("target_epsilon", target_epsilon, 0.0, math.inf, low_open=True)
    T = _validate.integer("releases", releases)
    _validate.choice("mode", mode, ("local", "central"))

    def cost(sigma: float) -> float:
        return _epsilon(sigma, T, d, mode, num_agents, clients_per_round, accountant)[0]

    if cost(MAX_NOISE_MULTIPLIER) > target:
        _validate.fail(
            "target_epsilon",
            target,
            f"cannot be met in {T} releases at delta={d:g}: even sigma = {MAX_NOISE_MULTIPLIER:g} "
            f"costs epsilon = {cost(MAX_NOISE_MULTIPLIER):.3g}",
        )
    scale = max(_bounds(1.0, 1, mode, num_agents, clients_per_round)[-1][2], 1)
    # the search's lower end: RDP 1e-3; PLD where its grid stays within PLD_MAX_LOAD
    low = 1e-3 if accountant == "rdp" else max(0.1, scale * math.sqrt(T / PLD_MAX_LOAD) * (1 + 1e-9))
    return _smallest_sigma(cost, target, low, T)


def _smallest_sigma(cost, target: float, low: float, releases: int) -> float:
    """Bisection in log sigma on the reported epsilon (the smaller of the valid bounds), bracketed from
    sigma = 1 outwards, so that the search goes down to ``low`` only when the target needs it; returns
    the bracket's upper end (it meets the target), within a relative 1e-5 of the smallest sigma."""
    hi = max(1.0, low)
    while cost(hi) > target:  # cost(MAX_NOISE_MULTIPLIER) <= target: this stops
        hi = min(2 * hi, MAX_NOISE_MULTIPLIER)
    lo = hi
    while True:
        if lo <= low:
            _validate.fail(
                "target_epsilon",
                target,
                f"every noise multiplier the search covers meets it (sigma = {low:g} costs epsilon = "
                f"{cost(low):.3g} in {releases} releases): give a smaller target or a noise multiplier",
            )
        lo = max(lo / 2, low)
        if cost(lo) > target:
            break
        hi = lo
    while hi / lo > 1 + 1e-5:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if cost(mid) <= target else (mid, hi)
    return hi


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
