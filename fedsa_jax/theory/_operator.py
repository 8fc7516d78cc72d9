"""A constant round as an affine map on the second moment of its persistent coordinates, applied
without being assembled, and a Krylov solver for its fixed point. Knows no algorithm.

With a constant step size a round maps ``S = E[Y Y^T]`` to ``G(S)``, affine in S. Only the blocks
that persist across rounds matter at a round's start (the columns K of the round's mean map R that
are not zero); per-agent blocks whose sum over agents stays 0 (``zero_sum``) are written in an
orthonormal basis of that subspace, ``S_KK = P Z P^T``. :class:`Operator` applies one round to
``Z`` (its upper-triangular entries, ``Z_00 = E[1] = 1`` first) through the phases' own
second-moment maps, so one application costs one round of :func:`fedsa_jax.theory.exact_mse`.
:func:`gmres` solves ``(I - M) z = c`` with such applications only (Saad and Schultz, "GMRES: A
generalized minimal residual algorithm for solving nonsymmetric linear systems", SIAM J. Sci. Stat.
Comput. 7(3), 1986; restarted, classical Gram-Schmidt applied twice, Givens rotations).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsa_jax.moments import Recursion
from fedsa_jax.theory._agents import Unfactored, factored_round
from fedsa_jax.theory._rounds import _phases, second_moment_round

__all__ = ["MAX_ASSEMBLED_FOR_CURVES", "Operator", "constant_round_mse", "gmres", "persistent_basis"]

MAX_ASSEMBLED_FOR_CURVES = 2000  # unknowns of an operator assembled for a long constant-step curve
CURVE_RATIO = 3  # ... when the horizon is at least this many times its unknowns


def persistent_basis(rec: Recursion, R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, P)``: the persistent coordinates K of Y (0 first: the nonzero columns of the round's
    mean map R, or of ``R (D,)``: a row whose nonzero entries mark them) and ``P (|K|, K')`` with
    orthonormal columns, the zero-sum blocks in their subspace, ``P[:, 0] = e_0``."""
    y = rec.state
    read = np.any(R != 0, axis=0) if R.ndim == 2 else R != 0
    keep = np.union1d([0], np.nonzero(read)[0])
    position = {int(k): i for i, k in enumerate(keep)}
    P = np.eye(len(keep))
    for block in y.zero_sum:
        idx = y.indices(block)
        if not np.all(np.isin(idx, keep)):
            continue
        rows = np.array([position[int(k)] for k in idx])  # agent c's coordinates, agent after agent
        d = len(idx) // y.N
        sums = y.zero_sum_constraint(block)  # (d, N d): sum over agents (weighted)
        Q = np.linalg.svd(sums)[2][d:].T  # (N d, (N - 1) d) orthonormal basis of {sum_c w_c x_c = 0}
        others = np.setdiff1d(np.arange(P.shape[1]), rows)
        block_basis = np.zeros((len(keep), Q.shape[1]))
        block_basis[rows] = Q
        P = np.concatenate([P[:, others], block_basis], axis=1)
    return keep, P  # column 0 stays e_0: the constant is never zero-sum


@dataclasses.dataclass
class Operator:
    """One constant round ``z -> G(z)`` on the upper-triangular entries z of ``Z`` (``S_KK = P Z P^T``,
    entry 0 is ``Z_00``). ``linear(v)``: its linear part on the entries other than ``Z_00``
    (``M v``); ``constant``: ``G(E_00)`` on those entries (c), so the fixed point solves
    ``(I - M) v = c``; ``sigma``: the positions, among those entries, of the block ``Z_ab`` with
    ``a, b >= 1`` (the second moments proper, without the means ``Z_0b``)."""

    rec: Recursion
    etas: np.ndarray
    keep: np.ndarray
    P: np.ndarray
    factored: bool = False  # rounds of the factored recursion on the globals (theory._agents)

    def __post_init__(self):
        self.k = self.P.shape[1]
        self.iu = np.triu_indices(self.k)
        self.n = len(self.iu[0])
        y = self.rec.state
        self.scored = np.arange(y.D)[y[self.rec.scored(1)]]
        self.space = y.D  # the moment the rounds act on: D x D, or that of the factored coordinates
        self.advance = second_moment_round(self.rec)
        if self.factored:
            z, self.advance = factored_round(self.rec)
            position = np.full(y.D, -1)
            position[z] = np.arange(len(z))
            self.keep, self.scored, self.space = position[self.keep], position[self.scored], len(z)
            if np.any(self.keep < 0) or np.any(self.scored < 0):
                raise Unfactored("a block that is not carried persists or is reported")
        self.base, self.base_trace = self._apply(np.zeros((self.k, self.k)))  # G(0)
        self.scale = max(float(np.max(np.abs(self.base))), 1.0)
        E00 = np.zeros((self.k, self.k))
        E00[0, 0] = 1.0
        constant, self.constant_trace = self._apply(E00)
        self.constant = constant[1:]
        self.sigma = np.nonzero(self.iu[0][1:] >= 1)[0]

    def lift(self, Z: np.ndarray) -> np.ndarray:
        """The moment with ``S_KK = P Z P^T`` (the other blocks are overwritten before read)."""
        S = np.zeros((self.space, self.space))
        S[np.ix_(self.keep, self.keep)] = self.P @ Z @ self.P.T
        return S

    def symmetric(self, values: np.ndarray) -> np.ndarray:
        """Z from its upper-triangular entries."""
        Z = np.zeros((self.k, self.k))
        Z[self.iu] = values
        return Z + np.triu(Z, 1).T

    def _apply(self, Z: np.ndarray) -> tuple[np.ndarray, float]:
        """The upper-triangular entries of ``P^T G(lift(Z))_KK P`` and the trace of G's reported block."""
        K = self.keep
        S = self.advance(self.lift(Z), 0, self.etas)
        out = self.P.T @ S[np.ix_(K, K)] @ self.P
        return out[self.iu], float(np.trace(S[np.ix_(self.scored, self.scored)]))

    def image(self, Z: np.ndarray) -> np.ndarray:
        """The upper-triangular entries of ``P^T G(lift(Z))_KK P``."""
        return self._apply(Z)[0]

    def linear(self, v: np.ndarray, trace: bool = False):
        """``M v``: ``(G(s v) - G(0)) / s`` with ``s v`` of the size of ``G(0)`` (no cancellation);
        with ``trace``, also the linear part of the reported block's trace at v."""
        top = float(np.max(np.abs(v))) if v.size else 0.0
        if top == 0.0:
            return (np.zeros_like(v), 0.0) if trace else np.zeros_like(v)
        s = self.scale / top
        image, tr = self._apply(self.symmetric(np.concatenate([[0.0], s * v])))
        out = (image - self.base)[1:] / s
        return (out, (tr - self.base_trace) / s) if trace else out

    def second_moment(self, v: np.ndarray) -> np.ndarray:
        """``G(S)`` (D x D) one round after the moment with entries ``(1, v)``."""
        return self.advance(self.lift(self.symmetric(np.concatenate([[1.0], v]))), 0, self.etas)

    def assemble(self) -> tuple[np.ndarray, np.ndarray]:
        """``(M, g)``: M as a dense ``(n - 1) x (n - 1)`` matrix and g the linear part of the reported
        block's trace after the round (``trace = constant_trace + g . v``): one round per entry."""
        m = self.n - 1
        M, g = np.empty((m, m)), np.empty(m)
        for j in range(m):
            e = np.zeros(m)
            e[j] = 1.0
            M[:, j], g[j] = self.linear(e, trace=True)
        return M, g


def gmres(matvec, b: np.ndarray, tol: float = 1e-13, restart: int = 200, maxiter: int = 2000):
    """``(x, relative residual, applications)`` for ``matvec(x) = b``: restarted GMRES until
    ``|b - matvec(x)| <= tol |b|`` (the true residual, recomputed at each restart), ``maxiter``
    applications of ``matvec``, or stagnation, where further cycles would only spend rounds: a cycle
    that did not lower the true residual (in exact arithmetic a cycle never raises it, and one that
    made no progress makes none again from the same residual), or one whose own estimate reached the
    tolerance while the true residual did not halve (the rounding of ``matvec`` reached)."""
    n = len(b)
    x = np.zeros(n)
    bnorm = float(np.linalg.norm(b))
    if bnorm == 0.0:
        return x, 0.0, 0
    r, used, previous, claimed = b.copy(), 0, np.inf, False
    while True:
        beta = float(np.linalg.norm(r))
        stagnated = beta >= previous or (claimed and beta > 0.5 * previous)
        if beta <= tol * bnorm or used >= maxiter or stagnated:
            return x, beta / bnorm, used
        previous = beta
        m = min(restart, n, maxiter - used)
        V = np.zeros((m + 1, n))
        H = np.zeros((m + 1, m))
        cs, sn = np.zeros(m), np.zeros(m)
        g = np.zeros(m + 1)
        g[0], V[0] = beta, r / beta
        j = 0
        for j in range(m):
            w = matvec(V[j])
            used += 1
            h = V[: j + 1] @ w
            w = w - h @ V[: j + 1]
            h2 = V[: j + 1] @ w  # re-orthogonalise: classical Gram-Schmidt twice
            w, h = w - h2 @ V[: j + 1], h + h2
            H[: j + 1, j], H[j + 1, j] = h, np.linalg.norm(w)
            for i in range(j):  # the previous rotations
                H[i, j], H[i + 1, j] = (
                    cs[i] * H[i, j] + sn[i] * H[i + 1, j],
                    cs[i] * H[i + 1, j] - sn[i] * H[i, j],
                )
            rho = np.hypot(H[j, j], H[j + 1, j])
            cs[j], sn[j] = (1.0, 0.0) if rho == 0.0 else (H[j, j] / rho, H[j + 1, j] / rho)
            H[j, j], H[j + 1, j] = rho, 0.0
            g[j], g[j + 1] = cs[j] * g[j], -sn[j] * g[j]
            if abs(g[j + 1]) <= 0.1 * tol * bnorm or rho == 0.0 or np.linalg.norm(w) == 0.0:
                break
            V[j + 1] = w / np.linalg.norm(w)
        claimed = abs(g[j + 1]) <= tol * bnorm  # the cycle's own estimate of its residual
        y = np.linalg.lstsq(np.triu(H[: j + 1, : j + 1]), g[: j + 1], rcond=None)[0]
        x = x + y @ V[: j + 1]
        r = b - matvec(x)
        used += 1


def _same_rounds(rec: Recursion, etas: np.ndarray, rounds) -> bool:
    """Whether these rounds are round 0 again: the same reported block, and phases of the same kinds
    with the same mean maps, step sizes and probabilities."""
    first = _phases(rec, 0, etas[0])
    for t in rounds:
        other = _phases(rec, t, etas[t])
        if rec.scored(t + 1) != rec.scored(1) or len(other) != len(first):
            return False
        for a, b in zip(first, other):
            same_kind = type(a) is type(b) and all(
                getattr(a, attr, None) == getattr(b, attr, None) for attr in ("eta", "p")
            )
            La, Lb = a.mean(), b.mean()
            if not same_kind or not (La is Lb or np.array_equal(La, Lb)):
                return False
    return True


def _read_columns(rec: Recursion, etas: np.ndarray) -> np.ndarray:
    """``1^T |L_m| ... |L_1|`` over round 0's phases: positive exactly on the columns its mean map
    can read (structurally: no cancellation), in O(m D^2) instead of a product of D x D maps."""
    u = np.ones(rec.state.D)
    for phase in reversed(_phases(rec, 0, etas[0])):
        u = u @ np.abs(phase.mean())
    return u


def constant_round_mse(
    rec: Recursion, etas: np.ndarray, num_rounds: int, m0: np.ndarray, factored: bool = False
):
    """``E|theta_t - theta_star|^2`` for ``t = 0..num_rounds`` through the assembled operator, or
    None where the round-by-round recursion is as cheap or the shortcut does not apply.

    With a constant round, the second moment on the persistent coordinates follows ``z_{t+1} = M z_t
    + c`` (:class:`Operator`, n unknowns): assembling M costs n rounds of the recursion, after which
    each round is one O(n^2) product instead of the phases' O(N d^2 D) updates on the D x D moment.
    The reported value after a round is affine in the moment at its start (its linear part is read
    from the same n rounds). Taken when the horizon is at least ``CURVE_RATIO`` times n (theta
    alone persists: n = (d+1)(d+2)/2 whatever N, so the gain is about T / n), the round is the
    same at the first rounds and the last, and the start lies in the zero-sum subspace of its
    blocks. ``factored``: the n rounds by the factored recursion (:mod:`fedsa_jax.theory._agents`)
    where it applies."""
    T = num_rounds
    y = rec.state
    if not y.dense:  # its probes read the round's D x D maps
        return None
    if T < 3 or not _same_rounds(rec, etas, (1, 2, T - 1)):  # (a short horizon never pays)
        return None
    keep, P = persistent_basis(rec, _read_columns(rec, etas))
    k = P.shape[1]
    n = k * (k + 1) // 2
    if n - 1 > MAX_ASSEMBLED_FOR_CURVES or CURVE_RATIO * (n + 2) > T:
        return None
    S0 = np.outer(m0, m0)
    S0_KK = S0[np.ix_(keep, keep)]
    Z0 = P.T @ S0_KK @ P
    if not np.allclose(P @ Z0 @ P.T, S0_KK, rtol=0, atol=1e-14 * max(1.0, float(np.max(np.abs(S0))))):
        return None
    try:
        op = Operator(rec, etas[0], keep, P, factored)
        M, g = op.assemble()
    except Unfactored:  # the full rounds
        op = Operator(rec, etas[0], keep, P)
        M, g = op.assemble()
    scored = np.arange(y.D)[y[rec.scored(0)]]
    out = np.empty(T + 1)
    out[0] = np.trace(S0[np.ix_(scored, scored)])
    z = Z0[op.iu][1:]
    for t in range(T):  # out[t + 1] is read from round t + 1's output, z the moment at its start
        out[t + 1] = op.constant_trace + g @ z
        z = M @ z + op.constant
    return out
