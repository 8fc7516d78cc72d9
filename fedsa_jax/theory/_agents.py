"""The second-moment recursion with the agents' blocks factored: O(N) instead of O(N^2) per round.

Split Y into its global coordinates ``Y_G`` (the constant, theta, optimizer states, averages...) and
each agent's coordinates ``a_c`` (its per-agent blocks). Within a round, the agents' local iterates
are independent given the server state: after a broadcast ``a_c = F_c Y_G`` and each local step
``a_c <- J_c a_c + K_c Y_G + w_c`` with noise w_c of mean zero given the past, independent across
agents. So, as long as ``Y_G`` has not moved since the agents read it,

    a_c = F_c Y_G + u_c,    E[u_c Y_G^T] = 0,    E[u_c u_j^T] = 0 (c != j),    E[u_c u_c^T] = R_c,

and ``E[Y Y^T]`` is determined by ``S_G = E[Y_G Y_G^T]``, the maps ``F_c (p, g)`` and the residual
covariances ``R_c (p, p)``: ``E[a_c Y_G^T] = F_c S_G``, ``E[a_c a_j^T] = F_c S_G F_j^T + delta_cj
R_c``. An aggregation ``Y_G <- L_GG Y_G + sum_c L_Gc a_c`` then gives ``S_G <- A S_G A^T + sum_c
L_Gc R_c L_Gc^T`` with ``A = L_GG + sum_c L_Gc F_c`` (plus the channel's noise, from the messages'
moments written the same way), after which the agents' coordinates are stale until rewritten from
``Y_G`` alone. Cost per local step O(N (d^2 g + d g^2)) and per aggregation O(N g^2 d) with
``g = |Y_G|``, against O(N d^2 D) and O(N d D^2) for the full moment (``D = g + N p``).

Applies to rounds made of phases that keep this form: affine maps (:class:`~fedsa_jax.moments.Affine`)
whose agent rows read only their own agent and ``Y_G``, :func:`~fedsa_jax.moments.local_step`, and
:func:`~fedsa_jax.moments.aggregate` without control variates (any channel of the full recursion,
cohorts included), in chains. A round that reads a stale agent coordinate, mixes agents in agent
rows (control variates), or has another phase (a coin, a compressed downlink, error feedback)
raises :class:`Unfactored`, and the caller runs the full recursion. Knows no algorithm.
"""

from __future__ import annotations

import numpy as np

from fedsa_jax.moments import Affine, Aggregation, Chain, LocalStep, Recursion
from fedsa_jax.theory._rounds import _phases

__all__ = ["Unfactored", "factored_mse", "factored_round"]

CACHE_SIZE = 32  # analysed maps kept


class Unfactored(Exception):
    """A phase the factored recursion does not cover."""


class _Layout:
    """The global coordinates ``g`` (0 first) and each agent's coordinates ``agents (N, p)``."""

    def __init__(self, rec: Recursion):
        y = rec.state
        self.y, self.N = y, y.N
        parts = [np.stack([np.arange(y.D)[sl] for sl in y[name]]) for name in y.per_agent]
        self.agents = np.concatenate(parts, axis=1) if parts else np.zeros((y.N, 0), int)
        self.g = np.setdiff1d(np.arange(y.D), self.agents.ravel())
        self.p = self.agents.shape[1]
        where = np.full(y.D, -1)
        where[self.g] = np.arange(len(self.g))
        self.global_position = where  # position in g of a global coordinate (-1 for an agent's)
        self.identity = np.eye(y.D)
        own = np.full(y.D, -1)
        own[self.agents[0]] = np.arange(self.p)  # agent 0's coordinates -> position in a_c
        self.agent_position = {
            name: _as_slice(own[np.arange(y.D)[y[name][0]]]) for name in y.per_agent
        }  # a per-agent block's positions in a_c

    def globals_of(self, name: str) -> np.ndarray:
        pos = self.global_position[np.arange(self.y.D)[self.y[name]]]
        if np.any(pos < 0):
            raise Unfactored(name)
        return pos


def _as_slice(positions: np.ndarray):
    """Contiguous positions as a slice (views, no gathers); others as they are."""
    if len(positions) and np.array_equal(positions, np.arange(positions[0], positions[0] + len(positions))):
        return slice(int(positions[0]), int(positions[0]) + len(positions))
    return positions


class _Factored:
    """``(S_G, F, R, fresh)``: the moment in factored form; ``fresh (p,)`` marks the agent coordinates
    that it describes (the others are stale: overwritten before they are read)."""

    def __init__(self, layout: _Layout, m0: np.ndarray):
        g, a = layout.g, layout.agents
        self.S = np.outer(m0[g], m0[g])
        self.F = np.zeros((layout.N, layout.p, len(g)))
        self.F[:, :, 0] = m0[a]  # deterministic at the start
        self.R = np.zeros((layout.N, layout.p, layout.p))
        self.fresh = np.ones(layout.p, bool)

    @classmethod
    def stale(cls, layout: _Layout, S: np.ndarray) -> _Factored:
        """The moment at a round's start when only the globals persist: ``S_G = S``, agents stale."""
        state = cls(layout, np.zeros(layout.y.D))
        state.S, state.fresh[:] = S.copy(), False
        return state


def _analyse(layout: _Layout, L: np.ndarray) -> dict:
    """An affine map's blocks: ``GG (g, g)``, ``GA (N, g, p)``, ``AG (N, p, g)``, ``AA (N, p, p)``;
    which agent positions change and are read; refused if agent rows mix agents."""
    g, a, N, p = layout.g, layout.agents, layout.N, layout.p
    moved = np.any(L != layout.identity, axis=1)  # (D,) the rows the map rewrites
    GG = L[np.ix_(g, g)]
    GA = np.zeros((N, len(g), p))
    rows = np.nonzero(moved[g])[0]
    if len(rows):
        GA[:, rows] = L[g[rows]][:, a.ravel()].reshape(len(rows), N, p).transpose(1, 0, 2)
    info = {"GG": GG, "GA": GA, "globals_move": len(rows) > 0 and not np.array_equal(GG, np.eye(len(g)))}
    if not np.any(moved[a]):  # the agents' rows are the identity: a map of the globals
        none = np.zeros(p, bool)
        return {**info, "AG": None, "AA": None, "changed": none, "reads": np.any(GA != 0, axis=(0, 1))}
    La = L[a.ravel()]
    AA_full = La[:, a.ravel()].reshape(N, p, N, p)
    AA = np.stack([AA_full[c, :, c, :] for c in range(N)])
    off = AA_full.copy()
    for c in range(N):
        off[c, :, c, :] = 0.0
    if np.any(off != 0):
        raise Unfactored("an agent row reads another agent")
    changed = np.any(moved[a], axis=0)
    reads = np.any(GA != 0, axis=(0, 1)) | np.any(AA[:, changed] != 0, axis=(0, 1))
    return {**info, "AG": La[:, g].reshape(N, p, len(g)), "AA": AA, "changed": changed, "reads": reads}


def _affine(state: _Factored, info: dict) -> None:
    """``Y_G <- GG Y_G + sum_c GA_c a_c``, ``a_c <- AG_c Y_G + AA_c a_c`` on the factored moment."""
    if np.any(info["reads"] & ~state.fresh):
        raise Unfactored("a stale agent coordinate is read")
    GA, AG, AA, changed = info["GA"], info["AG"], info["AA"], info["changed"]
    if np.any(GA != 0):  # the globals read the agents: their noise enters S_G, the agents go stale
        N, g, p = GA.shape
        A = info["GG"] + GA.transpose(1, 0, 2).reshape(g, N * p) @ state.F.reshape(N * p, g)
        state.S = A @ state.S @ A.T + (GA @ state.R @ GA.transpose(0, 2, 1)).sum(0)
        state.fresh = np.zeros_like(state.fresh)
        return
    if info["globals_move"]:  # the agents' form refers to the old globals
        state.S = info["GG"] @ state.S @ info["GG"].T
        state.fresh = np.zeros_like(state.fresh)
        return
    if np.any(changed):
        state.F = AG + AA @ state.F
        state.R = AA @ state.R @ np.swapaxes(AA, 1, 2)
        state.fresh = state.fresh | changed


def _local_step(layout: _Layout, state: _Factored, phase: LocalStep) -> None:
    """``loc_c <- (I - eta A_c) loc_c - eta rho_c + eta xi_c + w_c`` on the factored moment."""
    y, eta = layout.y, phase.eta
    loc = layout.agent_position[phase.iterates]
    xi = layout.agent_position[phase.controls] if phase.controls else None
    if not np.all(state.fresh[loc]) or (xi is not None and not np.all(state.fresh[xi])):
        raise Unfactored("a local step reads a stale agent coordinate")
    F, R, S = state.F, state.R, state.S
    Floc = F[:, loc]  # (N, d, g)
    Rloc = R[:, loc]  # (N, d, p)
    m_e = Floc @ S[:, 0]  # E[loc_c] (Y_G[0] = 1)
    second = Floc @ S @ Floc.transpose(0, 2, 1) + Rloc[:, :, loc]
    cov = phase.noise_covariance(m_e, second)
    B = np.eye(y.d) - eta * y.A  # (N, d, d)
    new_F = B @ Floc
    new_F[:, :, 0] -= eta * y.rho
    Rrows = B @ Rloc  # rows loc of J R
    if xi is not None:
        new_F += eta * F[:, xi]
        Rrows += eta * R[:, xi]
    F[:, loc] = new_F
    R[:, loc] = Rrows
    Rcols = R[:, :, loc] @ B.transpose(0, 2, 1)  # columns loc of (J R) J^T
    if xi is not None:
        Rcols += eta * R[:, :, xi]
    R[:, :, loc] = Rcols
    if isinstance(loc, slice):
        R[:, loc, loc] += cov
    else:
        R[:, loc[:, None], loc[None, :]] += cov


def _aggregation_noise(layout: _Layout, state: _Factored, phase: Aggregation) -> np.ndarray | None:
    """The channel's noise on the aggregate, from the messages ``m_c = loc_c - ref`` in factored form."""
    if phase.noiseless:
        return None
    if phase.control_variates:
        raise Unfactored("control variates")
    loc = layout.agent_position[phase.iterates]
    if not np.all(state.fresh[loc]):
        raise Unfactored("an aggregation reads a stale agent coordinate")
    ref = layout.globals_of(phase.reference)
    G = state.F[:, loc].copy()  # (N, d, g): m_c = G_c Y_G + u_c
    G[:, :, ref] -= np.eye(len(ref))
    own = G @ state.S @ G.transpose(0, 2, 1) + state.R[:, loc][:, :, loc]
    Gsum = G.sum(0)
    total = Gsum @ state.S @ Gsum.T + state.R[:, loc][:, :, loc].sum(0)
    return phase.channel_noise(own, total)


def _phase(layout: _Layout, state: _Factored, phase, analysed: dict) -> None:
    if isinstance(phase, Chain):
        for p in phase.phases:
            _phase(layout, state, p, analysed)
        return
    if isinstance(phase, LocalStep):
        _local_step(layout, state, phase)
        return
    if not (isinstance(phase, Aggregation) or type(phase).second is Affine.second):
        raise Unfactored(type(phase).__name__)
    L = phase.mean()
    if id(L) not in analysed:
        if len(analysed) >= CACHE_SIZE:
            analysed.pop(next(iter(analysed)))
        analysed[id(L)] = (L, _analyse(layout, L))  # L kept alive while cached: its id stays unique
    noise = _aggregation_noise(layout, state, phase) if isinstance(phase, Aggregation) else None
    _affine(state, analysed[id(L)][1])
    if noise is not None:
        into = layout.globals_of(phase.into)
        state.S[np.ix_(into, into)] += noise


def factored_mse(rec: Recursion, etas: np.ndarray, num_rounds: int, m0: np.ndarray) -> np.ndarray:
    """``E|theta_t - theta_star|^2`` for ``t = 0..num_rounds`` by the factored recursion; raises
    :class:`Unfactored` if a phase is not covered (or the reported block is an agent's)."""
    layout = _Layout(rec)
    state = _Factored(layout, m0)
    analysed: dict = {}
    out = np.empty(num_rounds + 1)

    def read(t):
        pos = layout.globals_of(rec.scored(t))
        return float(np.trace(state.S[np.ix_(pos, pos)]))

    out[0] = read(0)
    for t in range(num_rounds):
        for phase in _phases(rec, t, etas[t]):
            _phase(layout, state, phase, analysed)
        state.S = 0.5 * (state.S + state.S.T)  # as the full recursion: the symmetric part
        out[t + 1] = read(t + 1)
    return out


def factored_round(rec: Recursion):
    """``(g, advance)``: the global coordinates g of Y and ``advance(S_G, t, etas) -> S_G'``, one round
    of the factored recursion from a moment of the globals alone (every agent coordinate stale at
    the start: a round that reads one raises :class:`Unfactored`)."""
    layout = _Layout(rec)
    analysed: dict = {}

    def advance(S_G, t, etas):
        state = _Factored.stale(layout, S_G)
        for phase in _phases(rec, t, etas):
            _phase(layout, state, phase, analysed)
        return 0.5 * (state.S + state.S.T)

    return layout.g, advance
