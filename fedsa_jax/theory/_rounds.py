"""One round of an algorithm's moment description (:mod:`fedsa_jax.moments`): its step sizes, its
phases, its mean map and its second-moment map ``S -> G(S)`` (sparse conjugations ``S -> L S L^T``
touching only the rows a map changes), shared by :mod:`fedsa_jax.theory.engine` and
:mod:`fedsa_jax.theory.stationary`. Knows no algorithm."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fedsa_jax import _validate, optim
from fedsa_jax.moments.phases import Chain, Coin, LocalStep, RandomStop
from fedsa_jax.moments.state import Recursion

__all__ = ["changing_round", "round_operations", "round_map", "second_moment_round"]

CACHE_SIZE = 32  # conjugators kept (one per map in use)


def changing_round(rec: Recursion) -> bool:
    """Whether the rounds differ from one another: a step-size schedule, or local steps that
    change with the round (:class:`fedsa_jax.optim.LocalSteps`)."""
    return not optim.is_constant(rec.step_size) or isinstance(rec.num_local_steps, optim.LocalSteps)


def _etas(rec: Recursion, num_rounds: int) -> Any:
    """The step sizes of every local step, per round (float64): a ``(num_rounds, H)`` array, or for
    local steps that change with the round a list of ``num_rounds`` arrays ``(H_t,)``."""
    H = rec.num_local_steps
    if isinstance(H, optim.LocalSteps) and num_rounds > H.num_rounds:
        optim.check_horizon(rec, num_rounds)
    table = H.table[:num_rounds] if isinstance(H, optim.LocalSteps) else (int(H),) * num_rounds
    starts = np.concatenate([[0], np.cumsum(table)]).astype(np.int64)
    if optim.is_constant(rec.step_size):
        flat = np.full(int(starts[-1]), float(rec.step_size))
    else:
        per_round = rec.step_size.per_round
        with jax.enable_x64(True):
            values = optim.schedule_values(rec.step_size, num_rounds if per_round else int(starts[-1]))
        if not np.all(np.isfinite(values) & (values > 0)):
            k = int(np.argmax(~(np.isfinite(values) & (values > 0))))
            _validate.fail(
                "step_size",
                rec.step_size.describe(),
                f"the schedule gives {float(values[k])!r} at {'t' if per_round else 'k'}={k}; step sizes "
                "must be finite and > 0",
            )
        flat = np.repeat(values, table) if per_round else values
    if not isinstance(H, optim.LocalSteps):
        return flat.reshape(num_rounds, int(H))
    return [flat[starts[t] : starts[t + 1]] for t in range(num_rounds)]


def _phases(rec: Recursion, t: int, etas: np.ndarray) -> list:
    return [p for p in rec.round(t, etas) if p is not None]


def _recursion(rec, algorithm, num_rounds: int, second: bool = False):
    """``(rec, etas)`` for the description ``rec`` of ``algorithm``, everything checked: the layout's
    size, the round's blocks (channel, quantizer) and, for second moments, their channel."""
    if not isinstance(rec, Recursion):
        _validate.fail(
            "algorithm",
            getattr(algorithm, "name", algorithm),
            f"its theory must return fj.theory.Recursion or fj.theory.Combination, not {type(rec).__name__}",
        )
    rec.state.D  # noqa: B018 (the layout, its size checked before any map is built)
    etas = _etas(rec, num_rounds)
    phases = _phases(rec, 0, etas[0] if num_rounds else _etas(rec, 1)[0])
    if second:
        for phase in phases:
            phase.prepare()
    return rec, etas


def round_operations(rec: Recursion, t: int, etas: np.ndarray) -> tuple[int, int]:
    """``(local steps, other maps)`` that round t's second-moment recursion applies to its
    ``D x D`` moment: a local step costs about ``D^2`` operations (its agent's rows), another map
    (a conjugation ``L S L^T`` of the rows it changes) at most ``D^3``. A chain counts its phases
    (one map if noiseless), a coin one map more than its phase, a random stop its stages, the finish
    of each outcome of positive probability, and one conjugation by its mean map."""

    def count(phase) -> np.ndarray:
        if isinstance(phase, RandomStop):
            ends = [k for k in range(len(phase.stages)) if phase.pmf[:, k].any()]
            finish = [phase.finish(k) for k in ends] if phase.finish is not None else []
            parts = [*phase.stages, *(f for f in finish if f is not None)]
            return sum((count(p) for p in parts), np.array([0, 1]))
        if isinstance(phase, Chain):
            return np.array([0, 1]) if phase.noiseless else sum((count(p) for p in phase.phases), np.zeros(2))
        if isinstance(phase, Coin):
            return count(phase.phase) + np.array([0, 1])
        return np.array([1, 0]) if isinstance(phase, LocalStep) else np.array([0, 1])

    local, other = sum((count(p) for p in _phases(rec, t, etas)), np.zeros(2, int))
    return int(local), int(other)


def round_map(rec: Recursion, t: int, etas: np.ndarray) -> np.ndarray:
    """The mean map of round t (0-based: its count after the round is t + 1)."""
    phases = _phases(rec, t, etas)
    L = phases[0].mean()
    for phase in phases[1:]:
        L = phase.mean() @ L
    return L


def second_moment_round(rec: Recursion):
    """``advance(S, t, etas) -> S'``: ``S = E[Y Y^T]`` through round t's phases (the conjugations
    ``S -> L S L^T`` of the affine phases cached per map), symmetrised."""
    conjugate = _cached_conjugate()

    def advance(S, t, etas):
        for phase in _phases(rec, t, etas):
            S = phase.second(S, conjugate)
        # S is symmetric in exact arithmetic, but the phases write its blocks one side at a time: the
        # rounding errors' antisymmetric part is not a moment, and some rounds amplify it (FedLSA,
        # rand-k with erasures, divide by received, on TD: x1.15 per round, exact_mse negative after
        # 300 rounds). Keeping the symmetric part removes it at every round.
        return 0.5 * (S + S.T)

    return advance


def _cached_conjugate():
    """``conjugate(L, S) -> L S L^T``, the conjugator of each map L built once (the last
    ``CACHE_SIZE`` kept)."""
    conjugators: dict = {}

    def conjugate(L, S):
        if id(L) not in conjugators:
            if len(conjugators) >= CACHE_SIZE:
                conjugators.pop(next(iter(conjugators)))
            conjugators[id(L)] = (L, _conjugator(L))  # L kept alive while cached: its id stays unique
        return conjugators[id(L)][1](S)

    return conjugate


def _conjugator(L):
    """``S -> L S L^T`` for symmetric S, touching only the rows where L differs from I
    (and, in them, only L's nonzero columns): O(r c D) instead of O(D^3)."""
    D = L.shape[0]
    rows = np.nonzero(np.any(L != np.eye(D), axis=1))[0]
    cols = np.nonzero(np.any(L[rows] != 0, axis=0))[0]
    if 2 * len(cols) > D:  # gathering most of S costs more than the zeros it skips
        cols = slice(None)
    block = L[rows][:, cols]

    def apply_rows(S):
        R = S.copy()
        R[rows] = block @ S[cols]
        return R

    return lambda S: apply_rows(apply_rows(S).T)
