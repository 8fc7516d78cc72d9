"""Exact moments under Markov sampling: the moments of Y conditioned on the agents' joint chain state.

Under ``sampling="markov"`` agent c's local step at step size eta reads the transition ``s -> s'`` of
its own chain (:meth:`fedsa_jax.problems.FederatedTD.observe`): with ``skip = k`` the chain is at
``s = s_{hk}`` before step h, the step reads ``(s_{hk}, s_{hk+1})`` and the chain moves on to
``s_{(h+1)k}``; it starts from ``mu_c`` and persists across rounds. Given the transition the step is
the deterministic affine map

    e_c <- (I - eta A_c(s, s')) e_c - eta rho_c(s, s') (+ eta xi_c),
    rho_c(s, s') = A_c(s, s') theta_star - b_c(s, s'),

so Y is a Markov jump linear system driven by the joint chain ``s = (s_1, ..., s_N)`` (Costa,
Fragoso, Marques, "Discrete-Time Markov Jump Linear Systems", Springer 2005, Ch. 3): the conditional
moments ``m_j = E[Y 1{s = j}]`` and ``S_j = E[Y Y^T 1{s = j}]``, one per joint state j (``S^N`` of
them), evolve linearly. A local step maps them by

    S'_{j''} = sum_{x, x'} prod_c P_c(x_c, x'_c) P_c^{k-1}(x'_c, j''_c) L(x, x') S_x L(x, x')^T,

and ``L(x, x')`` is the product of commuting per-agent maps ``L_c(x_c, x'_c)`` (each rewrites only
agent c's rows), so the sum is taken one agent at a time, along that agent's axis of the stack:
``O(N S^{N+1} d D^2)`` per local step instead of ``S^{2N} D^3``. Every other phase (broadcast,
aggregation through the channel, server optimizer, averaging) draws its randomness independently of
the chains and is linear in S, so it acts on each conditional moment as on an unconditional one; a
coin mixes the conditioned phases. The moments of Y are the sums over j. Agents outside a cohort do
not move their chains: a cohort (``clients_per_round < N``) is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.moments.aggregation import Aggregation
from fedsa_jax.moments.phases import Chain, Coin, LocalStep, RandomStop
from fedsa_jax.moments.state import Augmented

__all__ = ["MAX_MARKOV_ENTRIES", "MAX_MARKOV_UNKNOWNS"]

MAX_MARKOV_ENTRIES = 2**23  # conditional moments' entries (64 MiB in float64)
MAX_MARKOV_UNKNOWNS = 5000  # a dense operator on the conditional means (mean_spectral_radius)


@dataclasses.dataclass
class MarkovLaw:
    """The agents' chains as the recursions read them (float64): ``initial (N, S)``, ``P (N, S, S)``,
    ``after (N, S, S) = P^{k-1}`` (the moves between the read transition and the next step),
    ``A (N, S, S, d, d)`` and ``rho (N, S, S, d) = A(s, s') theta_star - b(s, s')``."""

    initial: np.ndarray
    P: np.ndarray
    after: np.ndarray
    A: np.ndarray
    rho: np.ndarray

    @property
    def S(self) -> int:
        return self.P.shape[-1]

    @property
    def N(self) -> int:
        return self.P.shape[0]

    def initial_stack(self, m: np.ndarray, second: bool) -> np.ndarray:
        """``E[Y_0 1{s_0 = j}]`` ``(S^N, D)`` (or ``E[Y_0 Y_0^T 1{s_0 = j}]``, ``(S^N, D, D)``) for
        the deterministic ``Y_0 = m``: the chains start independent, agent c's from ``initial[c]``."""
        pi = np.ones(())
        for c in range(self.N):
            pi = np.multiply.outer(pi, self.initial[c])
        pi = pi.reshape(-1)
        base = np.outer(m, m) if second else m
        return pi.reshape((-1,) + (1,) * base.ndim) * base[None]


def is_markov(problem) -> bool:
    """Whether ``problem`` samples other than i.i.d. (``sampling`` not ``"generative"``)."""
    return getattr(problem, "sampling", "generative") != "generative"


def markov_law(problem, skip: int, y: Augmented, second: bool) -> MarkovLaw | None:
    """The law of ``problem``'s chains under ``sampling="markov"`` (None for i.i.d. sampling), with
    ``skip`` moves per local step; refuses a problem without ``markov_observations()`` and a stack of
    conditional moments larger than :data:`MAX_MARKOV_ENTRIES`."""
    if not is_markov(problem):
        return None
    sampling = problem.sampling
    own = getattr(problem, "markov_observations", None)
    if sampling != "markov" or not callable(own):
        _validate.fail(
            "problem.sampling",
            sampling,
            "exact recursions need i.i.d. ('generative') sampling, or 'markov' sampling from a problem "
            "with markov_observations() (federated TD)",
        )
    obs: Any = own()
    P = np.asarray(obs.transitions, np.float64)
    N, S, _ = P.shape
    D = y.D
    size = S**N * D ** (2 if second else 1)
    if size > MAX_MARKOV_ENTRIES:
        what = "S^N * D^2" if second else "S^N * D"
        power = "^2" if second else ""
        _validate.fail(
            "problem",
            f"S={S} states, N={N} agents",
            f"Markov exact theory tracks {what} = {S}^{N} * {D}{power} = {size} entries "
            f"(one moment of the {D}-dimensional state per joint chain state), limit "
            f"MAX_MARKOV_ENTRIES = {MAX_MARKOV_ENTRIES}",
        )
    k = _validate.integer("skip", skip)
    after = np.stack([np.linalg.matrix_power(P[c], k - 1) for c in range(N)])
    A = np.asarray(obs.A, np.float64)
    rho = np.einsum("cstij,j->csti", A, y.theta_star) - np.asarray(obs.b, np.float64)
    return MarkovLaw(np.asarray(obs.initial, np.float64), P, after, A, rho)


def check_unknowns(law: MarkovLaw, per_state: int, name) -> int:
    """``S^N per_state`` unknowns of a dense operator on the conditional moments, refused beyond
    ``MAX_MARKOV_UNKNOWNS`` with the sizes."""
    n = law.S**law.N * per_state
    if n > MAX_MARKOV_UNKNOWNS:
        _validate.fail(
            "algorithm",
            name,
            f"its mean recursion under Markov sampling has S^N * {per_state} = {law.S}^{law.N} * "
            f"{per_state} = {n} unknowns (one set per joint chain state) > MAX_MARKOV_UNKNOWNS = "
            f"{MAX_MARKOV_UNKNOWNS}",
        )
    return n


def prepare(phase, second: bool) -> None:
    """The checks of ``phase.prepare()`` (second moments) but the local steps' noise model, which
    the chains replace; refuses a cohort (its idle agents' chains stand still) and random local work
    (each agent's chain would move a random number of steps), for the means too."""
    if isinstance(phase, RandomStop) and any(_has_local_step(s) for s in phase.stages):
        _validate.fail(
            "algorithm",
            "local work under Markov sampling",
            "no exact recursion: each agent's chain moves as many steps as the agent runs, a random "
            "number (simulate it; generative sampling is exact)",
        )
    if isinstance(phase, Chain):
        for p in phase.phases:
            prepare(p, second)
    elif isinstance(phase, Coin):
        prepare(phase.phase, second)
    elif isinstance(phase, Aggregation) and phase.m is not None:
        _validate.fail(
            "clients_per_round",
            phase.m,
            "exact recursions under Markov sampling need every agent every round (idle agents' chains "
            "stand still): None or N",
        )
    elif second and not isinstance(phase, LocalStep):
        phase.prepare()


def _has_local_step(phase) -> bool:
    if isinstance(phase, Chain):
        return any(_has_local_step(p) for p in phase.phases)
    return isinstance(phase, LocalStep)


def mean(phase, stack: np.ndarray, law: MarkovLaw) -> np.ndarray:
    """``m_j = E[Y 1{s = j}]`` ``(S^N, D)`` through ``phase``; ``(S^N, D, B)``: B of them at once
    (the phase's map applied to each column)."""
    if stack.ndim == 2:
        return mean(phase, stack[..., None], law)[..., 0]
    if isinstance(phase, LocalStep):
        return _local(phase, stack, law, second=False)
    if isinstance(phase, Chain):
        for p in phase.phases:
            stack = mean(p, stack, law)
        return stack
    if isinstance(phase, Coin):
        return (1.0 - phase.p) * stack + phase.p * mean(phase.phase, stack, law)
    return phase.mean() @ stack


def second(phase, stack: np.ndarray, law: MarkovLaw, conjugate) -> np.ndarray:
    """``S_j = E[Y Y^T 1{s = j}]`` ``(S^N, D, D)`` through ``phase``."""
    if isinstance(phase, LocalStep):
        return _local(phase, stack, law, second=True)
    if isinstance(phase, Chain):
        for p in phase.phases:
            stack = second(p, stack, law, conjugate)
        return stack
    if isinstance(phase, Coin):
        return (1.0 - phase.p) * stack + phase.p * second(phase.phase, stack, law, conjugate)
    if getattr(phase, "noiseless", False) is True:  # S_j -> L S_j L^T for every j at once
        return _conjugate_all(phase.mean(), stack)
    return np.stack([phase.second(S, conjugate) for S in stack])


def _conjugate_all(L: np.ndarray, stack: np.ndarray) -> np.ndarray:
    """``L S_j L^T`` for every ``S_j`` of ``stack (J, D, D)``, touching only the rows (then columns)
    where L differs from I, and in them L's nonzero columns."""
    D = L.shape[0]
    rows = np.nonzero(np.any(L != np.eye(D), axis=1))[0]
    cols = np.nonzero(np.any(L[rows] != 0, axis=0))[0]
    block = L[np.ix_(rows, cols)]
    left = stack.copy()
    left[:, rows, :] = block @ stack[:, cols, :]  # L S
    out = left.copy()
    out[:, :, rows] = left[:, :, cols] @ block.T  # (L S) L^T
    return out


def _local(phase: LocalStep, stack: np.ndarray, law: MarkovLaw, second: bool) -> np.ndarray:
    """One local step on the stack: agent by agent, the sum over its transitions ``x -> x'`` of
    ``P_c(x, x') L_c(x, x') (.) L_c(x, x')^T`` (or ``L_c (.)`` for means) along its axis, then
    the ``k - 1`` further moves ``P_c^{k-1}``. ``L_c`` rewrites only agent c's rows (and, on the
    right, its columns): the rest of the sum is ``sum_x P_c(x, x') Z_x``, and only the new rows are
    computed per transition."""
    y, eta = phase.y, phase.eta
    N, S = law.N, law.S
    tail = stack.shape[1:]
    loc = y[phase.iterates]
    xi = y[phase.controls] if phase.controls else None
    X = stack.reshape((S,) * N + tail)
    for c in range(N):
        X = np.moveaxis(X, c, 0)
        others = X.shape[1:N]
        Z = X.reshape((S, -1) + tail)  # (S, R, D, D or B)
        B = np.eye(y.d) - eta * law.A[c]  # (S, S', d, d)
        const = -eta * law.rho[c]  # (S, S', d)
        step = (loc[c], xi[c] if xi else None, eta)
        U = _along(law.P[c], Z)  # the rows no transition changes
        rows = 0.0
        for x in range(S):
            new = _rows(Z[x], B[x], const[x], *step)  # (S', R, d, D or B): (L_c(x, x') Z_x)[loc]
            if second:  # the columns loc of those rows: (L Z L^T)[loc, loc]
                block = _rows(np.swapaxes(new, -1, -2), B[x], const[x], *step)  # (S', R, d, d), transposed
                new[..., loc[c]] = np.swapaxes(block, -1, -2)
            rows = rows + law.P[c, x][:, None, None, None] * new
        U[..., loc[c], :] = rows
        if second:
            U[..., loc[c]] = np.swapaxes(rows, -1, -2)
        Z = _along(law.after[c], U)
        X = np.moveaxis(Z.reshape((S,) + others + tail), 0, c)
    return X.reshape(stack.shape)


def _along(P: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """``sum_x P[x, y] Z[x]`` ``(S', ...)`` as one matrix product."""
    return (P.T @ Z.reshape(Z.shape[0], -1)).reshape((P.shape[1],) + Z.shape[1:])


def _rows(M: np.ndarray, B: np.ndarray, const: np.ndarray, loc: slice, xi, eta: float) -> np.ndarray:
    """Agent c's new rows ``(L_c(x, x') M)[loc] = B M[loc] + const M[0] (+ eta M[xi])`` for every
    ``x'`` at once: ``M (R, D, B)`` or ``(S', R, D, B)``, ``B (S', d, d)``, ``const (S', d)``;
    returns ``(S', R, d, B)``."""
    new = B[:, None] @ M[..., loc, :] + const[:, None, :, None] * M[..., 0:1, :]
    if xi is not None:
        new = new + eta * M[..., xi, :]
    return new
