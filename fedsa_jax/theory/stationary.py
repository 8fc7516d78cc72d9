"""The limits of the exact recursions with a constant step size, solved directly, and mean-square
stability.

With a constant step size a round is the same affine map every round: the mean of the augmented
state Y (:mod:`fedsa_jax.moments`) follows ``m <- R m`` and its second moment ``S = E[Y Y^T]``
follows ``S <- G(S)``, with G affine in S (the conjugations ``L S L^T`` of the round's phases plus
the noise covariances, which are linear in S, plus constants). Only the blocks that persist across
rounds matter at a round's start (the columns of R that are not zero: theta, control variates,
optimizer states, memories; scratch blocks such as the local iterates of FedLSA are overwritten
before they are read), so both recursions are written on those coordinates K. Per-agent blocks
whose sum over agents stays 0 (control variates, ``zero_sum``) are written in an orthonormal
basis of that subspace: there the sum direction, which a round keeps exactly (eigenvalue 1), is
left out.

* :func:`stationary_mean`: the fixed point of ``m <- R m`` on K, ``(I - R_KK) m_K = R_K0`` (the
  affine constant lives in column 0 of R, ``Y_0 = 1``), then one round to read theta.
* :func:`stationary_mse`: the fixed point of G on the symmetric matrices over K with
  ``S_00 = 1``, ``(I - M) s = c`` with M the linear part of G on the entries other than ``S_00``,
  solved by GMRES: each product ``M v`` is one round of the recursion, so M (``n = K'(K'+1)/2``
  unknowns, K' the number of coordinates) is never assembled, and a few dozen rounds replace n
  rounds and an O(n^3) eigenvalue problem. Mean-square stability is certified first by a second
  solve (the positive map's Lyapunov-type criterion, :func:`_require_mean_square_stable`).
* :func:`mean_square_spectral_radius`: the spectral radius of M, assembled column by column by
  applying one round to each element of a basis. The second moment converges from
  every start iff it is below 1 (the recursion is affine: ``s_t = s* + M^t (s_0 - s*)``); it is at
  least the spectral radius of the mean recursion (the entries ``S_0k = E[Y_k]`` are among s), so
  mean-square stability implies mean stability, and the converse fails at large step sizes.

References: Costa, Fragoso, Marques, "Discrete-Time Markov Jump Linear Systems", Springer 2005,
Ch. 3 (mean-square stability of linear systems with multiplicative noise through the spectral
radius of the second-moment operator).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsa_jax import _validate, optim
from fedsa_jax.moments import Combination, Recursion, recursion_of
from fedsa_jax.theory._operator import Operator, gmres, persistent_basis
from fedsa_jax.theory._rounds import _recursion, round_map

__all__ = ["MAX_STATIONARY_UNKNOWNS", "mean_square_spectral_radius", "stationary_mean", "stationary_mse"]

# entries of the stationary second moment solved for (GMRES: O(200 n) memory)
MAX_STATIONARY_UNKNOWNS = 50_000
# entries of an assembled operator (mean_square_spectral_radius: dense eigenvalues, O(n^3))
MAX_ASSEMBLED_UNKNOWNS = 5000
DENSE_UNKNOWNS = 100  # up to this many unknowns stationary_mse assembles the operator (n rounds)
_TOL = 1e-13  # relative residual of the fixed points
_MAX_APPLICATIONS = 3000  # rounds GMRES may apply
_PROBE_ROUNDS = (0, 1, 2, 3, 1000)  # rounds whose maps must agree for a limit to exist


@dataclasses.dataclass
class _Stationary:
    """A constant-step recursion written on its persistent coordinates: ``Y_K = P z``."""

    rec: Recursion
    etas: np.ndarray  # (H,) the round's step sizes
    R: np.ndarray  # (D, D) the round's mean map
    keep: np.ndarray  # K, the persistent coordinates of Y (0 first)
    P: np.ndarray  # (|K|, K') orthonormal columns, zero-sum blocks in their subspace; P[0] = e_0


def _setup(problem, algorithm, what: str) -> _Stationary:
    description = recursion_of(algorithm, problem)
    name = getattr(algorithm, "name", algorithm)
    if isinstance(description, Combination):
        _validate.fail("algorithm", name, f"{what} does not cover {description.what}; {description.hint}")
    if not optim.is_constant(description.step_size):
        _validate.fail("algorithm", name, f"{what} needs a constant step size; this algorithm has a schedule")
    rec, etas = _recursion(description, algorithm, 1, second=what != "stationary_mean")
    R = round_map(rec, 0, etas[0])
    for t in _PROBE_ROUNDS[1:]:
        if not np.array_equal(round_map(rec, t, etas[0]), R):
            _validate.fail(
                "algorithm",
                name,
                f"its round changes with t (round {t} differs from round 0: a running average or a "
                f"count-dependent rule), so {what} has no fixed point to solve; use exact_mean/exact_mse",
            )
    keep, P = persistent_basis(rec, R)
    return _Stationary(rec, etas[0], R, keep, P)


def _solve_fixed_point(M: np.ndarray, c: np.ndarray, what: str, name) -> np.ndarray:
    radius = float(np.max(np.abs(np.linalg.eigvals(M)))) if M.size else 0.0
    if not radius < 1.0:
        _validate.fail(
            "algorithm",
            name,
            f"the {what} operator has spectral radius {radius:.6g} >= 1: no limit to solve for "
            "(lower the step size; fj.theory.max_stable_step_size gives the bound)",
        )
    return np.linalg.solve(np.eye(len(c)) - M, c)


def stationary_mean(problem, algorithm) -> np.ndarray:
    """``lim_t E[theta_t]`` (shape ``(d,)``) with a constant step size, solved as the fixed point of
    the exact mean recursion (no iteration). Refused, with the reason, for schedules, running
    averages and when the mean recursion does not contract (spectral radius >= 1)."""
    st = _setup(problem, algorithm, "stationary_mean")
    y = st.rec.state
    K, P = st.keep, st.P
    M = P.T @ st.R[np.ix_(K, K)] @ P  # z' = M z, z_0 = 1
    z = _solve_fixed_point(M[1:, 1:], M[1:, 0], "mean recursion's", algorithm.name)
    m = st.R[:, K] @ (P @ np.concatenate([[1.0], z]))  # one round from the fixed point: every block
    return m[y[st.rec.scored(1)]] + y.theta_star


def _operator(st: _Stationary, name, which: str) -> Operator:
    """The round's second-moment operator (:class:`~fedsa_jax.theory._operator.Operator`), refused
    above the limit named ``which`` on its unknowns."""
    limit = globals()[which]
    y = st.rec.state
    k = st.P.shape[1]
    n = k * (k + 1) // 2
    if n - 1 > limit:
        _validate.fail(
            "algorithm",
            name,
            f"its stationary second moment has {n - 1} unknowns ({k} persistent coordinates of the "
            f"{y.D} of its exact recursion, N={y.N}, d={y.d}) > {which} = {limit}",
        )
    return Operator(st.rec, st.etas, st.keep, st.P)


def _solve(op: Operator, matvec, b: np.ndarray, name, what: str) -> np.ndarray:
    x, residual, _ = gmres(matvec, b, tol=_TOL, maxiter=_MAX_APPLICATIONS)
    if not residual <= _TOL:
        _validate.fail(
            "algorithm",
            name,
            f"GMRES did not solve for {what} within {_MAX_APPLICATIONS} rounds (relative residual "
            f"{residual:.3g}): the second-moment recursion contracts too slowly (or not at all) for a "
            "fixed point; use exact_mse over a long horizon",
        )
    return x


def _require_mean_square_stable(op: Operator, name) -> None:
    """Refuses unless the linear part T of the round on the second moments proper (``Z_ab``,
    ``a, b >= 1``, means set to 0) has spectral radius below 1. T is a positive map (``T(X) =
    E[L X L^T]`` for the round's random linear part L, PSD to PSD), so ``rho(T) < 1`` iff the
    solution of ``X - T(X) = I`` is positive definite (Costa, Fragoso, Marques 2005, Thm. 3.9):
    if ``rho(T) < 1``, ``X = sum_k T^k(I) > 0``; if ``rho(T) >= 1``, T's adjoint has a PSD Perron
    eigenvector ``W != 0``, ``<W, X> (1 - rho) = tr W > 0`` and X is not positive definite. The
    means' radius ``rho(R)`` is at most ``sqrt(rho(T))`` (``T >= R . R^T``), so this is the radius
    of the whole operator M."""
    sigma = op.sigma
    if not sigma.size:
        return
    embed = np.zeros(op.n - 1)

    def restricted(x):
        embed[sigma] = x
        return x - op.linear(embed)[sigma]

    diagonal = (op.iu[0] == op.iu[1])[1:][sigma].astype(float)  # the identity's entries
    X = _solve(op, restricted, diagonal, name, "the mean-square stability certificate")
    full = np.zeros(op.n - 1)
    full[sigma] = X
    Sigma = op.symmetric(np.concatenate([[0.0], full]))[1:, 1:]
    try:
        np.linalg.cholesky(Sigma)
    except np.linalg.LinAlgError:
        rho = _radius_estimate(op)
        _validate.fail(
            "algorithm",
            name,
            f"the second-moment operator has spectral radius {max(rho, 1.0):.6g} >= 1: no limit to "
            "solve for (lower the step size; fj.theory.max_stable_step_size(..., kind='mean_square') "
            "gives the bound)",
        )


def _radius_estimate(op: Operator, rounds: int = 100) -> float:
    """Power iteration of T from the identity (its Perron eigenvalue is its spectral radius)."""
    x = np.zeros(op.n - 1)
    x[op.sigma] = (op.iu[0] == op.iu[1])[1:][op.sigma]
    rho = 0.0
    for _ in range(rounds):
        nxt = np.zeros_like(x)
        nxt[op.sigma] = op.linear(x)[op.sigma]
        rho, x = float(np.linalg.norm(nxt) / np.linalg.norm(x)), nxt / np.linalg.norm(nxt)
        if not np.isfinite(rho) or rho == 0.0:
            break
    return rho


def stationary_mse(problem, algorithm) -> float:
    """``lim_t E|theta_t - theta_star|^2`` with a constant step size: the fixed point of the exact
    second-moment recursion (:func:`fedsa_jax.theory.exact_mse`), ``(I - M) z = c`` on the
    persistent coordinates, solved by GMRES with one round of the recursion per product ``M v``
    (never assembling M), after a certificate of mean-square stability (a second solve, see
    :func:`_require_mean_square_stable`); up to ``DENSE_UNKNOWNS`` unknowns M is assembled (n
    rounds), its spectral radius checked and the system solved densely. Refused, with the reason and
    the sizes, for schedules, running averages, second moments with more than
    ``MAX_STATIONARY_UNKNOWNS`` unknowns, and when the recursion is not mean-square stable
    (:func:`mean_square_spectral_radius` >= 1)."""
    st = _setup(problem, algorithm, "stationary_mse")
    op = _operator(st, algorithm.name, "MAX_STATIONARY_UNKNOWNS")
    if op.n - 1 <= DENSE_UNKNOWNS:  # n rounds cost less than the two Krylov solves
        M, _ = op.assemble()
        z = _solve_fixed_point(M, op.constant, "second-moment", algorithm.name)
    else:
        _require_mean_square_stable(op, algorithm.name)
        z = _solve(op, lambda v: v - op.linear(v), op.constant, algorithm.name, "the stationary moment")
    S = op.second_moment(z)  # one round from the fixed point
    scored = st.rec.state[st.rec.scored(1)]
    return float(np.trace(S[scored, scored]))


def mean_square_spectral_radius(problem, algorithm) -> float:
    """Spectral radius of one round of the exact second-moment recursion (constant step) on the
    persistent coordinates: below 1 iff the second moment converges from every start (mean-square
    stability); at least :func:`~fedsa_jax.theory.engine.mean_spectral_radius`. The operator is
    assembled (one round per unknown) and its eigenvalues computed: at most
    ``MAX_ASSEMBLED_UNKNOWNS`` unknowns."""
    st = _setup(problem, algorithm, "mean_square_spectral_radius")
    op = _operator(st, algorithm.name, "MAX_ASSEMBLED_UNKNOWNS")
    with np.errstate(over="ignore", invalid="ignore"):
        M, _ = op.assemble()
    if not np.all(np.isfinite(M)):
        return np.inf
    return float(np.max(np.abs(np.linalg.eigvals(M)))) if M.size else 0.0
