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
from fedsa_jax.theory._rounds import second_moment_round

__all__ = ["Operator", "gmres", "persistent_basis"]


def persistent_basis(rec: Recursion, R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, P)``: the persistent coordinates K of Y (0 first: the nonzero columns of the round's
    mean map R) and ``P (|K|, K')`` with orthonormal columns, the zero-sum blocks in their subspace,
    ``P[:, 0] = e_0``."""
    y = rec.state
    keep = np.union1d([0], np.nonzero(np.any(R != 0, axis=0))[0])
    position = {int(k): i for i, k in enumerate(keep)}
    P = np.eye(len(keep))
    for block in y.zero_sum:
        idx = y.indices(block)
        if not np.all(np.isin(idx, keep)):
            continue
        rows = np.array([position[int(k)] for k in idx])  # agent c's coordinates, agent after agent
        N, d = y.N, len(idx) // y.N
        sums = np.kron(np.ones((1, N)), np.eye(d))  # (d, N d): sum over agents
        Q = np.linalg.svd(sums)[2][d:].T  # (N d, (N - 1) d) orthonormal basis of {sum_c x_c = 0}
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

    def __post_init__(self):
        self.k = self.P.shape[1]
        self.iu = np.triu_indices(self.k)
        self.n = len(self.iu[0])
        self.advance = second_moment_round(self.rec)
        self.base = self.image(np.zeros((self.k, self.k)))  # G(0)
        self.scale = max(float(np.max(np.abs(self.base))), 1.0)
        E00 = np.zeros((self.k, self.k))
        E00[0, 0] = 1.0
        self.constant = self.image(E00)[1:]
        self.sigma = np.nonzero(self.iu[0][1:] >= 1)[0]

    def lift(self, Z: np.ndarray) -> np.ndarray:
        """The D x D moment with ``S_KK = P Z P^T`` (the other blocks are overwritten before read)."""
        D = self.rec.state.D
        S = np.zeros((D, D))
        S[np.ix_(self.keep, self.keep)] = self.P @ Z @ self.P.T
        return S

    def symmetric(self, values: np.ndarray) -> np.ndarray:
        """Z from its upper-triangular entries."""
        Z = np.zeros((self.k, self.k))
        Z[self.iu] = values
        return Z + np.triu(Z, 1).T

    def image(self, Z: np.ndarray) -> np.ndarray:
        """The upper-triangular entries of ``P^T G(lift(Z))_KK P``."""
        K = self.keep
        out = self.P.T @ self.advance(self.lift(Z), 0, self.etas)[np.ix_(K, K)] @ self.P
        return out[self.iu]

    def linear(self, v: np.ndarray) -> np.ndarray:
        """``M v``: ``(G(s v) - G(0)) / s`` with ``s v`` of the size of ``G(0)`` (no cancellation)."""
        top = float(np.max(np.abs(v))) if v.size else 0.0
        if top == 0.0:
            return np.zeros_like(v)
        s = self.scale / top
        return (self.image(self.symmetric(np.concatenate([[0.0], s * v]))) - self.base)[1:] / s

    def second_moment(self, v: np.ndarray) -> np.ndarray:
        """``G(S)`` (D x D) one round after the moment with entries ``(1, v)``."""
        return self.advance(self.lift(self.symmetric(np.concatenate([[1.0], v]))), 0, self.etas)

    def assemble(self) -> np.ndarray:
        """M as a dense ``(n - 1) x (n - 1)`` matrix: one round per entry."""
        m = self.n - 1
        M = np.empty((m, m))
        for j in range(m):
            e = np.zeros(m)
            e[j] = 1.0
            M[:, j] = self.linear(e)
        return M


def gmres(matvec, b: np.ndarray, tol: float = 1e-13, restart: int = 200, maxiter: int = 2000):
    """``(x, relative residual, applications)`` for ``matvec(x) = b``: restarted GMRES until
    ``|b - matvec(x)| <= tol |b|`` (the true residual, recomputed at each restart) or ``maxiter``
    applications of ``matvec``."""
    n = len(b)
    x = np.zeros(n)
    bnorm = float(np.linalg.norm(b))
    if bnorm == 0.0:
        return x, 0.0, 0
    r, used = b.copy(), 0
    while True:
        beta = float(np.linalg.norm(r))
        if beta <= tol * bnorm or used >= maxiter:
            return x, beta / bnorm, used
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
        y = np.linalg.lstsq(np.triu(H[: j + 1, : j + 1]), g[: j + 1], rcond=None)[0]
        x = x + y @ V[: j + 1]
        r = b - matvec(x)
        used += 1
