"""The second-moment recursion with the agents' blocks factored: O(N) or O(N^2) per round instead
of O(N^2) or O(N^3).

Split Y into its global coordinates ``Y_G`` (the constant, theta, optimizer states, averages...)
and each agent's coordinates ``a_c`` (its per-agent blocks), among which the carried ones ``x_c``
(blocks that persist across rounds: control variates, an agent's own iterate). The recursion
keeps ``S = E[Z Z^T]`` for ``Z = (Y_G, x_1, ..., x_N)`` taken at the last *snapshot*, and each
agent's coordinates in the form

    a_c = F_c Y_G + E_c x_c + u_c,    E[u_c Z^T] = 0,   E[u_c u_j^T] = 0 (c != j),   E[u_c u_c^T] = R_c:

within a round the agents' local iterates are independent given the state at its start. A
broadcast and each local step (``a_c <- J_c a_c + K_c Y_G + w_c``, noise w_c of mean zero given
the past, independent across agents) keep the form: ``F_c <- J_c F_c + K_c``, ``E_c <- J_c E_c``,
``R_c <- J_c R_c J_c^T + Cov(w_c)``, O(N p^2 (g + q)) with ``g = |Y_G|``, ``q = |x_c|``.

Any other affine map takes a new snapshot: the globals ``Y_G' = L_GG Y_G + sum_c L_Gc a_c`` and
the carried coordinates ``x_c' = L_KG Y_G + L_Kc a_c + sum_{j != c} L_Kj a_j``, where an agent may
read the others only through the new globals, ``L_Kj = C_c L_Gj`` (control variates move against
the aggregate). Then ``Z' = M Z + n`` with ``M = [[A, B], [P + C A, Delta + C B]]``, ``Delta``
block diagonal and ``C B`` of rank g, and ``E[Z' Z'^T] = M S M^T + E[n n^T]`` costs
O(N^2 q^2 (q + g)) instead of the O(N^3 p^3) of the full moment; the agents' other coordinates
are stale until rewritten. A coin (communicate with probability p) takes the snapshot on both of
its branches and mixes them.

Applies to rounds made of phases that keep this form: affine maps (:class:`~fedsa_jax.moments.Affine`),
:func:`~fedsa_jax.moments.local_step`, :func:`~fedsa_jax.moments.aggregate` with a channel of the
full recursion (cohorts, erasures, unbiased quantizers; with control variates an exact channel),
:func:`~fedsa_jax.moments.coin` and chains. A round that reads a stale agent coordinate, mixes
agents otherwise, or has another phase (a compressed downlink, error feedback) raises
:class:`Unfactored`, and the caller runs the full recursion. Knows no algorithm.
"""

from __future__ import annotations

import copy

import numpy as np

from fedsa_jax.moments.aggregation import Aggregation
from fedsa_jax.moments.phases import AgentsMean, Assign, Broadcast, Chain, Coin, LocalStep
from fedsa_jax.moments.state import Affine, Recursion
from fedsa_jax.theory._rounds import _phases

__all__ = ["FACTORED_RATIO", "Unfactored", "factored_mse", "factored_pays", "factored_round"]

CACHE_SIZE = 32  # analysed maps kept
FACTORED_RATIO = 4  # the factored recursion runs when the agents' coordinates are this many times the rest
_FACTOR_TOL = 1e-12  # relative: an agent reads the others through the new globals
# coordinates of Z (the globals and every agent's persistent blocks): its moment and a few
# temporaries of that size, 2.5 GB at the limit (SCAFFLSA with N = 1000, d = 8 has 8009)
MAX_FACTORED_DIM = 8100


class Unfactored(Exception):
    """A phase the factored recursion does not cover."""


class _Layout:
    """The global coordinates ``g`` (0 first), each agent's coordinates ``agents (N, p)`` and the
    positions ``K`` among them of the carried blocks (``q = |K|``); ``z`` the coordinates of Y
    that Z holds."""

    def __init__(self, rec: Recursion):
        y = rec.state
        self.y, self.N = y, y.N
        every = np.arange(y.D)
        parts = [np.stack([every[sl] for sl in y[name]]) for name in y.per_agent]
        self.agents = np.concatenate(parts, axis=1) if parts else np.zeros((y.N, 0), int)
        self.g = np.setdiff1d(np.arange(y.D), self.agents.ravel())
        self.p = self.agents.shape[1]
        where = np.full(y.D, -1)
        where[self.g] = np.arange(len(self.g))
        self.global_position = where  # position in g of a global coordinate (-1 for an agent's)
        own = np.full(y.D, -1)
        own[self.agents[0]] = np.arange(self.p)  # agent 0's coordinates -> position in a_c
        self.agent_position = {
            name: _as_slice(own[every[y[name][0]]]) for name in y.per_agent
        }  # a per-agent block's positions in a_c
        carried = [n for n in y.per_agent if n in y.carried or n in y.zero_sum]
        self.K = (
            np.concatenate([np.arange(self.p)[self.agent_position[n]] for n in carried])
            if carried
            else np.zeros(0, int)
        )
        self.q = len(self.K)
        self.z = np.concatenate([self.g, self.agents[:, self.K].ravel()])
        if len(self.z) > MAX_FACTORED_DIM:
            raise Unfactored(f"{len(self.z)} factored coordinates > MAX_FACTORED_DIM = {MAX_FACTORED_DIM}")
        select = np.zeros((self.q, self.p))
        select[np.arange(self.q), self.K] = 1.0
        self.flush = _flush_info(self, select)  # Z' = Z: the snapshot of the current form

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
    """``(S, F, E, R, fresh)``: S the second moment of Z; ``fresh (p,)`` marks the agent coordinates
    that the form describes (the others are stale: overwritten before they are read)."""

    def __init__(self, layout: _Layout, S: np.ndarray):
        N, p, g, q = layout.N, layout.p, len(layout.g), layout.q
        self.S = S
        self.F = np.zeros((N, p, g))
        self.E = np.zeros((N, p, q))
        self.E[:, layout.K, np.arange(q)] = 1.0  # x_c as it is in Z
        self.R = np.zeros((N, p, p))
        self.fresh = np.zeros(p, bool)
        self.fresh[layout.K] = True
        self._joint = None

    @classmethod
    def start(cls, layout: _Layout, m0: np.ndarray) -> _Factored:
        """A deterministic start at mean ``m0``."""
        state = cls(layout, np.outer(m0[layout.z], m0[layout.z]))
        other = np.setdiff1d(np.arange(layout.p), layout.K)
        state.F[:, other, 0] = m0[layout.agents[:, other]]
        state.fresh[:] = True
        return state

    def joint(self, layout: _Layout) -> np.ndarray:
        """``E[(Y_G, x_c)(Y_G, x_c)^T]`` for every agent, ``(N, g + q, g + q)``."""
        if self._joint is None:
            N, g, q, S = layout.N, len(layout.g), layout.q, self.S
            J = np.empty((N, g + q, g + q))
            J[:, :g, :g] = S[:g, :g]
            GX = S[:g, g:].reshape(g, N, q).transpose(1, 0, 2)
            J[:, :g, g:] = GX
            J[:, g:, :g] = GX.transpose(0, 2, 1)
            idx = np.arange(N)
            J[:, g:, g:] = S[g:, g:].reshape(N, q, N, q)[idx, :, idx, :]
            self._joint = J
        return self._joint

    def set_moment(self, S: np.ndarray, layout: _Layout) -> None:
        """The new snapshot: the carried coordinates are Z's, the others stale."""
        fresh = _Factored(layout, S)
        self.S, self.F, self.E, self.R, self.fresh, self._joint = (
            fresh.S,
            fresh.F,
            fresh.E,
            fresh.R,
            fresh.fresh,
            None,
        )


def _flush_info(layout: _Layout, select: np.ndarray) -> dict:
    """The snapshot map of the identity: ``Y_G' = Y_G``, ``x_c' = a_c[K]``."""
    N, g, p, q = layout.N, len(layout.g), layout.p, layout.q
    z = np.zeros((N, q, g))
    return _snapshot_info(np.eye(g), np.zeros((N, g, p)), z, np.broadcast_to(select, (N, q, p)), z, layout.K)


def _analyse(layout: _Layout, L: np.ndarray) -> dict:
    """An affine map in blocks. ``local``: the globals stay and each agent's rows read only its own
    coordinates and the globals (``AG (N, p, g)``, ``AA (N, p, p)``, the positions it ``changed``).
    Otherwise the snapshot's blocks ``GG (g, g)``, ``GA (N, g, p)``, ``KG (N, q, g)``, ``KA (N, q,
    p)`` and ``C (N, q, g)``, the carried rows' reads of the other agents through the new globals.
    Only the rows that differ from the identity are read (an average moves one block of many)."""
    g, a, N, p, K = layout.g, layout.agents, layout.N, layout.p, layout.K
    moved = np.any(L != np.eye(len(L)), axis=1)  # (D,) the rows the map rewrites
    rows_g = np.nonzero(moved[g])[0]
    GG = L[np.ix_(g, g)]
    GA = np.zeros((N, len(g), p))
    if len(rows_g):
        GA[:, rows_g] = L[g[rows_g]][:, a.ravel()].reshape(len(rows_g), N, p).transpose(1, 0, 2)
    changed = np.any(moved[a], axis=0)  # (p,) positions whose rows move (for some agent)
    cpos = np.nonzero(changed)[0]
    idx = np.arange(N)
    AG = np.zeros((N, p, len(g)))
    AA = np.broadcast_to(np.eye(p), (N, p, p)).copy()
    off = np.zeros((N, len(cpos), N, p))
    if len(cpos):
        Lr = L[a[:, cpos].ravel()]  # (N |cpos|, D)
        AG[:, cpos] = Lr[:, g].reshape(N, len(cpos), len(g))
        off = Lr[:, a.ravel()].reshape(N, len(cpos), N, p)
        AA[:, cpos] = off[idx, :, idx, :]
        off[idx, :, idx, :] = 0.0
    if not len(rows_g) and not np.any(off):
        reads = np.any(AA[:, changed] != 0, axis=(0, 1))  # the other rows are the identity
        return {"local": True, "AG": AG, "AA": AA, "changed": changed, "reads": reads}
    offK = np.zeros((N, len(K), N, p))
    inK = np.isin(cpos, K)
    where = np.full(p, -1)
    where[K] = np.arange(len(K))
    offK[:, where[cpos[inK]]] = off[:, inK]
    C = _through_globals(GA, offK) if np.any(offK) else np.zeros((N, len(K), len(g)))
    return _snapshot_info(GG, GA, AG[:, K], AA[:, K], C, K)


def _snapshot_info(GG, GA, KG, KA, C, K) -> dict:
    """The blocks of a snapshot map, the agent positions it reads, and whether it moves only the
    globals, reading none of the agents' coordinates (the carried ones stay as they are)."""
    N, q, p = KA.shape
    select = np.zeros((q, p))
    select[np.arange(q), K] = 1.0
    reads = np.any(GA != 0, axis=(0, 1)) | np.any(KA != 0, axis=(0, 1))
    same = np.array_equal(KA, np.broadcast_to(select, KA.shape))  # x_c' = x_c
    stay = same and not np.any(GA) and not np.any(C) and not np.any(KG)
    blocks = {"GG": GG, "GA": GA, "KG": KG, "KA": KA, "C": C}
    return {"local": False, **blocks, "reads": reads, "globals_only": stay}


def _through_globals(GA: np.ndarray, offK: np.ndarray) -> np.ndarray:
    """``C (N, q, g)`` with ``offK[c, :, j] = C_c GA_j`` for every ``j != c`` (least squares on the
    other agents' columns, then checked), or :class:`Unfactored`."""
    N, g, p = GA.shape
    q = offK.shape[1]
    G = GA.transpose(1, 0, 2).reshape(g, N * p)  # the globals' rows on every agent coordinate
    gram = G @ G.T - GA @ GA.transpose(0, 2, 1)  # (N, g, g): the other agents' columns only
    C = offK.reshape(N, q, N * p) @ G.T @ np.linalg.pinv(gram, hermitian=True)
    residual = offK - (C.reshape(N * q, g) @ G).reshape(N, q, N, p)
    idx = np.arange(N)
    residual[idx, :, idx, :] = 0.0
    if np.max(np.abs(residual)) > _FACTOR_TOL * max(1.0, float(np.max(np.abs(offK)))):
        raise Unfactored("an agent row reads another agent other than through the globals")
    return C


def _local(state: _Factored, info: dict) -> None:
    """``a_c <- AG_c Y_G + AA_c a_c`` (the globals stay)."""
    if np.any(info["reads"] & ~state.fresh):
        raise Unfactored("a stale agent coordinate is read")
    changed = info["changed"]
    if np.any(changed):
        AG, AA = info["AG"], info["AA"]
        state.F = AG + AA @ state.F
        state.E = AA @ state.E
        state.R = AA @ state.R @ np.swapaxes(AA, 1, 2)
        state.fresh = state.fresh | changed


def _snapshot(layout: _Layout, state: _Factored, info: dict, noise=None) -> None:
    """``Z <- M Z + n`` (module docstring); ``noise (g, g)``: what a channel adds to the new
    globals (mean zero given everything else)."""
    if np.any(info["reads"] & ~state.fresh):
        raise Unfactored("a stale agent coordinate is read")
    S, F, E, R = state.S, state.F, state.E, state.R
    N, g, q = layout.N, len(layout.g), layout.q
    GG, GA, C = info["GG"], info["GA"], info["C"]
    if info["globals_only"] and noise is None and _is_snapshot(layout, state):  # x stays: O(g n)
        S[:g] = GG @ S[:g]  # in place: a state owns its moment
        S[:, :g] = S[:, :g] @ GG.T
        S[:g, :g] = 0.5 * (S[:g, :g] + S[:g, :g].T)
        state.set_moment(S, layout)
        return
    A = GG + np.einsum("cgp,cph->gh", GA, F)
    B = GA @ E  # (N, g, q)
    MG = np.concatenate([A, B.transpose(1, 0, 2).reshape(g, N * q)], axis=1)
    T1 = MG @ S
    GR = GA @ R  # (N, g, p)
    Nz = np.einsum("cgp,chp->gh", GR, GA)
    if noise is not None:
        Nz = Nz + noise
    out = np.empty_like(S)
    out[:g, :g] = T1 @ MG.T + Nz
    if q:
        Q = info["KA"] - C @ GA  # (N, q, p)
        P = (info["KG"] - C @ GG + Q @ F).reshape(N * q, g)
        Delta = Q @ E  # (N, q, q)
        Cf = C.reshape(N * q, g)
        SX = S[g:].reshape(N, q, -1)
        U_G = P @ S[:g, :g] + (Delta @ SX[:, :, :g]).reshape(N * q, g) + Cf @ T1[:, :g]  # U = (P~ + C M_G) S
        U_X = P @ S[:g, g:] + (Delta @ SX[:, :, g:]).reshape(N * q, N * q) + Cf @ T1[:, g:]
        QRG = (Q @ GR.transpose(0, 2, 1)).reshape(N * q, g)
        XG = U_G @ A.T + U_X @ MG[:, g:].T + QRG  # E[x' Y_G'^T] before the noise through C
        # U P~^T + (U M_G^T + QRG) C^T + C (QRG + C Nz)^T: one product, then the block-diagonal part
        XX = out[g:, g:]
        left, right = np.concatenate([U_G, XG, Cf], axis=1), np.concatenate([P, Cf, QRG + Cf @ Nz], axis=1)
        np.matmul(left, right.T, out=XX)
        XX += np.einsum("rcj,ckj->rck", U_X.reshape(N * q, N, q), Delta, optimize=True).reshape(N * q, N * q)
        XG += Cf @ Nz
        own = Q @ R @ Q.transpose(0, 2, 1)  # (N, q, q): the fresh noise of each agent
        blocks = XX.reshape(N, q, N, q)
        idx = np.arange(N)
        blocks[idx, :, idx, :] += own
        out[g:, :g], out[:g, g:] = XG, XG.T
    out += out.T  # the symmetric part, as the full recursion: rounding's antisymmetric part can grow
    out *= 0.5
    state.set_moment(out, layout)


def _local_step(layout: _Layout, state: _Factored, phase: LocalStep) -> None:
    """``loc_c <- (I - eta A_c) loc_c - eta rho_c + eta xi_c + w_c`` on the factored moment."""
    y, eta = layout.y, phase.eta
    loc = layout.agent_position[phase.iterates]
    xi = layout.agent_position[phase.controls] if phase.controls else None
    if not np.all(state.fresh[loc]) or (xi is not None and not np.all(state.fresh[xi])):
        raise Unfactored("a local step reads a stale agent coordinate")
    F, E, R = state.F, state.E, state.R
    J = state.joint(layout)  # (N, g + q, g + q)
    W = np.concatenate([F[:, loc], E[:, loc]], axis=2)  # loc_c = W_c (Y_G, x_c) + u_c
    m_e = (W @ J[:, :, :1])[:, :, 0]  # E[loc_c] (Z[0] = 1)
    Rloc = R[:, loc]  # (N, d, p)
    second = W @ J @ W.transpose(0, 2, 1) + Rloc[:, :, loc]
    cov = phase.noise_covariance(m_e, second)
    B = np.eye(y.d) - eta * y.A  # (N, d, d)
    new_F, new_E = B @ F[:, loc], B @ E[:, loc]
    new_F[:, :, 0] -= eta * y.rho
    Rrows = B @ Rloc  # rows loc of J R
    if xi is not None:
        new_F += eta * F[:, xi]
        new_E += eta * E[:, xi]
        Rrows += eta * R[:, xi]
    F[:, loc], E[:, loc], R[:, loc] = new_F, new_E, Rrows
    Rcols = R[:, :, loc] @ B.transpose(0, 2, 1)  # columns loc of (J R) J^T
    if xi is not None:
        Rcols += eta * R[:, :, xi]
    R[:, :, loc] = Rcols
    if isinstance(loc, slice):
        R[:, loc, loc] += cov
    else:
        R[:, loc[:, None], loc[None, :]] += cov


def _aggregation_noise(layout: _Layout, state: _Factored, phase: Aggregation) -> np.ndarray | None:
    """The channel's noise on the aggregate (g, g), from the messages ``m_c = loc_c - ref``."""
    if phase.noiseless:
        return None
    if phase.control_variates:
        raise Unfactored("control variates on a random channel")
    loc = layout.agent_position[phase.iterates]
    if not np.all(state.fresh[loc]):
        raise Unfactored("an aggregation reads a stale agent coordinate")
    ref = layout.globals_of(phase.reference)
    N, g, q = layout.N, len(layout.g), layout.q
    G = state.F[:, loc].copy()  # (N, d, g): m_c = G_c Y_G + E_c x_c + u_c
    G[:, :, ref] -= np.eye(len(ref))
    W = np.concatenate([G, state.E[:, loc]], axis=2)
    Rll = state.R[:, loc][:, :, loc]
    own = W @ state.joint(layout) @ W.transpose(0, 2, 1) + Rll
    Wsum = np.concatenate([G.sum(0), state.E[:, loc].transpose(1, 0, 2).reshape(len(ref), N * q)], axis=1)
    total = Wsum @ state.S @ Wsum.T + Rll.sum(0)
    into = layout.globals_of(phase.into)
    out = np.zeros((g, g))
    out[np.ix_(into, into)] = phase.channel_noise(own, total)
    return out


def _phase(layout: _Layout, state: _Factored, phase, analysed: dict) -> None:
    if isinstance(phase, Chain):
        for p in phase.phases:
            _phase(layout, state, p, analysed)
        return
    if isinstance(phase, LocalStep):
        _local_step(layout, state, phase)
        return
    if isinstance(phase, Coin):  # both branches as snapshots, mixed
        other = copy.copy(state)
        if _is_snapshot(layout, state):
            other.S = state.S.copy()  # the branches' moments apart (a snapshot may write in place)
        else:
            _snapshot(layout, other, layout.flush)
        _phase(layout, state, phase.phase, analysed)
        if not _is_snapshot(layout, state):
            _snapshot(layout, state, layout.flush)
        state.set_moment((1.0 - phase.p) * other.S + phase.p * state.S, layout)
        return
    if not (isinstance(phase, Aggregation) or type(phase).second is Affine.second):
        raise Unfactored(type(phase).__name__)
    info = _info(layout, phase, analysed)
    if info["local"]:
        _local(state, info)
        return
    noise = _aggregation_noise(layout, state, phase) if isinstance(phase, Aggregation) else None
    _snapshot(layout, state, info, noise)


def _info(layout: _Layout, phase, analysed: dict) -> dict:
    """The phase's blocks, cached: an aggregation and an assignment are read from their
    coefficients, other maps from their D x D matrix."""
    if isinstance(phase, Aggregation):
        key, keep, build = phase.key, None, lambda: _analyse_aggregation(layout, phase)  # channel in key
    elif isinstance(phase, Assign):
        key, keep, build = id(phase), phase, lambda: _analyse_assign(layout, phase)
    elif isinstance(phase, Broadcast):
        key, keep, build = phase.key, None, lambda: _analyse_broadcast(layout, phase)
    elif isinstance(phase, AgentsMean):
        blocks = (phase.into, phase.into, phase.source, None, 1.0 / layout.N, 0.0, 0.0)
        key, keep, build = phase.key, None, lambda: _aggregation_blocks(layout, *blocks)
    elif not layout.y.dense:  # read from its D x D matrix, which is not built beyond MAX_AUGMENTED_DIM
        raise Unfactored(f"a {type(phase).__name__} phase is read as a map over the whole state")
    else:
        L = phase.mean()
        key, keep, build = id(L), L, lambda: _analyse(layout, L)
    if key not in analysed:
        if len(analysed) >= CACHE_SIZE:
            analysed.pop(next(iter(analysed)))
        analysed[key] = (keep, build())  # what an id names is kept alive while cached: the id stays unique
    return analysed[key][1]


def _analyse_broadcast(layout: _Layout, phase: Broadcast) -> dict:
    """:func:`_analyse` of a broadcast (agent-local), from its blocks."""
    N, p, g = layout.N, layout.p, len(layout.g)
    into = np.arange(p)[layout.agent_position[phase.into]]
    source = layout.globals_of(phase.source)
    AG = np.zeros((N, p, g))
    AG[:, into[:, None], source[None, :]] = np.eye(len(into))
    AA = np.broadcast_to(np.eye(p), (N, p, p)).copy()
    AA[:, into] = 0.0
    changed = np.zeros(p, bool)
    changed[into] = True
    return {"local": True, "AG": AG, "AA": AA, "changed": changed, "reads": np.zeros(p, bool)}


def _analyse_assign(layout: _Layout, phase: Assign) -> dict:
    """:func:`_analyse` of an assignment (globals only), from its entries."""
    N, p, q, K = layout.N, layout.p, layout.q, layout.K
    g = len(layout.g)
    GG = np.eye(g)
    for target in phase.rows:
        GG[layout.globals_of(target)] = 0.0
    for target, source, M in phase.entries():
        GG[np.ix_(layout.globals_of(target), layout.globals_of(source))] += M
    KA = np.zeros((N, q, p))
    KA[:, np.arange(q), K] = 1.0
    z = np.zeros((N, q, g))
    return _snapshot_info(GG, np.zeros((N, g, p)), z, KA, z, K)


def _analyse_aggregation(layout: _Layout, phase: Aggregation) -> dict:
    """:func:`_analyse` of an aggregation's mean map, from its coefficients (no D x D map: a schedule
    makes a new one each round)."""
    if isinstance(phase.denominator, tuple):
        raise Unfactored("control variates with one denominator per agent")
    blocks = (phase.into, phase.reference, phase.iterates, phase.control_variates)
    return _aggregation_blocks(layout, *blocks, *phase.coefficients())


def _aggregation_blocks(layout: _Layout, into, reference, iterates, control_variates, w, own, other):
    """The snapshot map of ``into <- (1 - N w) reference + w sum_c iterates_c`` and, with control
    variates, ``xi_c <- xi_c + own m_c + other sum_{j != c} m_j`` (``m_c = iterates_c - reference``;
    :meth:`~fedsa_jax.moments.Aggregation.coefficients`). The agents' mean is ``w = 1/N`` into itself."""
    N, p, q, K = layout.N, layout.p, layout.q, layout.K
    g = len(layout.g)
    into, ref = layout.globals_of(into), layout.globals_of(reference)
    loc = np.arange(p)[layout.agent_position[iterates]]
    I = np.eye(len(into))
    GG = np.eye(g)
    GG[into] = 0.0
    GG[np.ix_(into, ref)] += (1.0 - N * w) * I
    GA = np.zeros((N, g, p))
    GA[:, into[:, None], loc[None, :]] = w * I
    KG, C = np.zeros((N, q, g)), np.zeros((N, q, g))
    KA = np.zeros((N, q, p))
    KA[:, np.arange(q), K] = 1.0
    if control_variates:
        xi = np.arange(p)[layout.agent_position[control_variates]]
        where = np.full(p, -1)
        where[K] = np.arange(q)
        rows = where[xi]  # their rows among the carried coordinates
        if np.any(rows < 0):
            raise Unfactored("control variates that are not carried")
        KA[:, rows[:, None], loc[None, :]] += own * I
        KG[:, rows[:, None], ref[None, :]] -= (own + (N - 1) * other) * I
        if other:
            if w == 0.0:
                raise Unfactored("control variates read messages the aggregate does not")
            C[:, rows[:, None], into[None, :]] = (other / w) * I
    return _snapshot_info(GG, GA, KG, KA, C, K)


def _is_snapshot(layout: _Layout, state: _Factored) -> bool:
    """Whether the carried coordinates are Z's as they are (no round has moved them since)."""
    K = layout.K
    return bool(
        np.all(state.fresh[K])
        and not np.any(state.F[:, K])
        and not np.any(state.R[:, K])
        and not np.any(state.R[:, :, K])
        and np.array_equal(state.E[:, K], np.broadcast_to(np.eye(layout.q), (layout.N, layout.q, layout.q)))
    )


def factored_pays(rec: Recursion) -> bool:
    """Whether the agents' coordinates outweigh the global ones enough for the factored recursion:
    ``N p >= FACTORED_RATIO g``."""
    y = rec.state
    agents = sum(len(y.indices(name)) for name in y.per_agent)
    return agents > 0 and agents >= FACTORED_RATIO * (y.D - agents)


def factored_mse(rec: Recursion, etas: np.ndarray, num_rounds: int, m0: np.ndarray) -> np.ndarray:
    """``E|theta_t - theta_star|^2`` for ``t = 0..num_rounds`` by the factored recursion; raises
    :class:`Unfactored` if a phase is not covered (or the reported block is an agent's)."""
    layout = _Layout(rec)
    state = _Factored.start(layout, m0)
    analysed: dict = {}
    out = np.empty(num_rounds + 1)

    def read(t):
        pos = layout.globals_of(rec.scored(t))
        return float(np.trace(state.S[np.ix_(pos, pos)]))

    out[0] = read(0)
    for t in range(num_rounds):
        for phase in _phases(rec, t, etas[t]):
            _phase(layout, state, phase, analysed)
        out[t + 1] = read(t + 1)
    return out


def factored_round(rec: Recursion):
    """``(z, advance)``: the coordinates z of Y that the factored moment holds (the globals, then
    each agent's carried blocks) and ``advance(S_Z, t, etas) -> S_Z'``, one round from their second
    moment (every other agent coordinate stale at the start: a round that reads one raises
    :class:`Unfactored`)."""
    layout = _Layout(rec)
    analysed: dict = {}

    def advance(S_Z, t, etas):
        state = _Factored(layout, S_Z.copy())
        for phase in _phases(rec, t, etas):
            _phase(layout, state, phase, analysed)
        if not _is_snapshot(layout, state):
            _snapshot(layout, state, layout.flush)
        return state.S

    return layout.z, advance
