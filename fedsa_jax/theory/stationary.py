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
from typing import Any

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.moments import Combination, Recursion, recursion_of
from fedsa_jax.theory import markov
from fedsa_jax.theory._agents import Unfactored, factored_pays
from fedsa_jax.theory._operator import Operator, gmres, persistent_basis
from fedsa_jax.theory._rounds import _cached_conjugate, _phases, _recursion, changing_round, round_map

__all__ = ["MAX_STATIONARY_UNKNOWNS", "mean_square_spectral_radius", "stationary_mean", "stationary_mse"]

# entries of the stationary second moment solved for (GMRES: at most 201 vectors of n, 650 MB at the
# limit, written only as the iterations need them: SCAFFLSA at N = 100, d = 8 has 321,200 unknowns
# and needs about 45)
MAX_STATIONARY_UNKNOWNS = 400_000
# entries of an assembled operator (mean_square_spectral_radius: dense eigenvalues, O(n^3))
MAX_ASSEMBLED_UNKNOWNS = 5000
DENSE_UNKNOWNS = 100  # up to this many unknowns stationary_mse assembles the operator (n rounds)
_TOL = 1e-13  # relative residual of the fixed points aimed at
# ... and the largest accepted where GMRES stagnates above _TOL (the rounding of the round's map): the
# error of the fixed point is at most cond(I - M) times it, below 1e-5 relative up to a condition number
# of 1e5, while 4 digits are printed
_ACCEPT = 1e-10
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
    law: Any = None  # the agents' chains under Markov sampling (fedsa_jax.theory.markov), else None


def _setup(problem, algorithm, what: str) -> _Stationary:
    description = recursion_of(algorithm, problem)
    name = getattr(algorithm, "name", algorithm)
    if isinstance(description, Combination):
        _validate.fail("algorithm", name, f"{what} does not cover {description.what}; {description.hint}")
    if changing_round(description):
        _validate.fail(
            "algorithm",
            name,
            f"{what} needs a constant step size and H (identical rounds); this algorithm has a schedule "
            "or local steps that change with the round",
        )
    second = what != "stationary_mean"
    rec, etas = _recursion(description, algorithm, 1)
    law = markov.markov_law(problem, getattr(algorithm, "skip", 1), rec.state, second)
    if law is None:
        _recursion(description, algorithm, 1, second=second)  # the phases' checks
    else:
        for phase in _phases(rec, 0, etas[0]):
            markov.prepare(phase, second)
        if not np.allclose(np.einsum("cs,cst->ct", law.initial, law.P), law.initial, rtol=0, atol=1e-12):
            _validate.fail(
                "problem", "markov_observations()", "expected chains started from their stationary laws"
            )
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
    return _Stationary(rec, etas[0], R, keep, P, law)


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
    averages and when the mean recursion does not contract (spectral radius >= 1).

    Markov sampling (small chains, :func:`~fedsa_jax.theory.exact_mean`): the fixed point of the
    means conditioned on the agents' joint chain state, ``S^N`` times the persistent coordinates'
    unknowns (at most ``MAX_ASSEMBLED_UNKNOWNS``), the chains at their stationary laws."""
    st = _setup(problem, algorithm, "stationary_mean")
    if st.law is not None:
        return _markov_stationary_mean(st, algorithm.name)
    y = st.rec.state
    K, P = st.keep, st.P
    M = P.T @ st.R[np.ix_(K, K)] @ P  # z' = M z, z_0 = 1
    z = _solve_fixed_point(M[1:, 1:], M[1:, 0], "mean recursion's", algorithm.name)
    m = st.R[:, K] @ (P @ np.concatenate([[1.0], z]))  # one round from the fixed point: every block
    return m[y[st.rec.scored(1)]] + y.theta_star


def _markov_round(st: _Stationary, second: bool):
    """One round on the stack of conditional moments (:mod:`fedsa_jax.theory.markov`)."""
    phases = _phases(st.rec, 0, st.etas)
    conjugate = _cached_conjugate()

    def advance(stack):
        for phase in phases:
            stack = (
                markov.second(phase, stack, st.law, conjugate)
                if second
                else markov.mean(phase, stack, st.law)
            )
        return 0.5 * (stack + np.swapaxes(stack, -1, -2)) if second else stack

    return advance


def _markov_unknowns(st: _Stationary, per_state: int, what: str) -> int:
    """``S^N per_state`` unknowns, refused beyond ``MAX_ASSEMBLED_UNKNOWNS`` with the sizes."""
    law, n = st.law, st.law.S**st.law.N * per_state
    if n > MAX_ASSEMBLED_UNKNOWNS:
        _validate.fail(
            "algorithm",
            st.rec.state.name,
            f"its stationary {what} under Markov sampling has S^N * {per_state} = {law.S}^{law.N} * "
            f"{per_state} = {n} unknowns (one set per joint chain state) > MAX_ASSEMBLED_UNKNOWNS = "
            f"{MAX_ASSEMBLED_UNKNOWNS}",
        )
    return n


def _markov_stationary_mean(st: _Stationary, name) -> np.ndarray:
    """:func:`stationary_mean` under Markov sampling: the fixed point of one round on the conditional
    means ``E[Y_K 1{s = j}] = P z_j`` (``z_j0 = pi_j``, pi the chains' stationary joint law), the
    round's linear part assembled by applying it to every basis element at once."""
    y, K, P, law = st.rec.state, st.keep, st.P, st.law
    J, k = law.S**law.N, P.shape[1] - 1
    n = _markov_unknowns(st, k, "mean")
    pi = law.initial_stack(np.ones(1), second=False)[:, 0]
    advance = _markov_round(st, second=False)
    basis = np.zeros((J, y.D, n + 1))  # column 0: the constant (Y_0 = 1 with law pi); then z_{j,i}
    basis[:, 0, 0] = pi
    for j in range(J):
        basis[j][np.ix_(K, 1 + j * k + np.arange(k))] = P[:, 1:]
    image = np.einsum("ki,jkc->jic", P[:, 1:], advance(basis)[:, K, :]).reshape(n, n + 1)
    z = _solve_fixed_point(image[:, 1:], image[:, 0], "mean recursion's", name)
    stack = np.zeros((J, y.D))
    stack[:, 0] = pi
    stack[:, K] += z.reshape(J, k) @ P[:, 1:].T
    m = advance(stack).sum(0)  # one round from the fixed point: every block
    return m[y[st.rec.scored(1)]] + y.theta_star


def _markov_second_moment_operator(st: _Stationary):
    """:func:`_second_moment_operator` under Markov sampling: the unknowns are the upper triangles of
    ``Z_j`` (``S_{j,K} = P Z_j P^T``) but ``Z_j00 = pi_j``, one per joint chain state j."""
    y, K, P, law = st.rec.state, st.keep, st.P, st.law
    J, k = law.S**law.N, P.shape[1]
    iu = np.triu_indices(k)
    per = len(iu[0]) - 1
    n = _markov_unknowns(st, per, "second moment")
    pi = law.initial_stack(np.ones(1), second=False)[:, 0]
    advance = _markov_round(st, second=True)

    def lift(Z):  # (J, k, k) -> the stack (J, D, D)
        stack = np.zeros((J, y.D, y.D))
        stack[:, K[:, None], K[None, :]] = P @ Z @ P.T
        return stack

    def image(Z):
        out = advance(lift(Z))[:, K[:, None], K[None, :]]
        return (P.T @ out @ P)[:, iu[0], iu[1]][:, 1:].reshape(-1)

    base = np.zeros((J, k, k))
    base[:, 0, 0] = pi
    c = image(base)
    columns = np.empty((n, n))
    for j in range(J):
        for e, (a, b) in enumerate(zip(iu[0][1:], iu[1][1:])):
            B = base.copy()
            B[j, a, b] = B[j, b, a] = 1.0
            columns[:, j * per + e] = image(B) - c

    def finish(z):  # E[Y Y^T] one round after the fixed point
        Z = np.zeros((J, len(iu[0])))
        Z[:, 0], Z[:, 1:] = pi, z.reshape(J, per)
        full = np.stack([_symmetric(row, iu, k) for row in Z])
        return advance(lift(full)).sum(0)

    return columns, c, finish


def _symmetric(values, iu, k):
    Z = np.zeros((k, k))
    Z[iu] = values
    return Z + np.triu(Z, 1).T


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
    if st.law is None and factored_pays(st.rec):  # many agents: rounds on their factored blocks
        try:
            return Operator(st.rec, st.etas, st.keep, st.P, factored=True)
        except Unfactored:
            pass
    return Operator(st.rec, st.etas, st.keep, st.P)


def _solve(op: Operator | None, matvec, b: np.ndarray, name, what: str) -> np.ndarray:
    """GMRES aims at ``_TOL``; a solve that stops above it (the rounding of a round's map reached:
    the true residual no longer halves) is kept up to ``_ACCEPT``, far below what the printed digits
    need. Above that the solve failed, which says nothing against the algorithm: the message names
    the solver, its residual and the tolerance."""
    x, residual, used = gmres(matvec, b, tol=_TOL, maxiter=_MAX_APPLICATIONS)
    if not residual <= _ACCEPT:
        stopped = "reached its limit of" if used >= _MAX_APPLICATIONS else "stopped improving after"
        raise ValueError(
            f"{name}: GMRES did not solve for {what}: it {stopped} {used} rounds at relative residual "
            f"{residual:.3g} > {_ACCEPT:g} (tolerance {_TOL:g}): the second-moment recursion contracts "
            "too slowly (or not at all) for a fixed point to be solved; use exact_mse over a long horizon"
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
    (:func:`mean_square_spectral_radius` >= 1). Under Markov sampling the unknowns are the second
    moments conditioned on the joint chain state (``S^N`` sets, at most ``MAX_ASSEMBLED_UNKNOWNS``;
    Costa, Fragoso, Marques 2005, Ch. 3), and so is the operator of
    :func:`mean_square_spectral_radius`."""
    st = _setup(problem, algorithm, "stationary_mse")
    scored = st.rec.state[st.rec.scored(1)]
    if st.law is not None:  # Markov sampling: the conditional second moments, assembled
        M, c, finish = _markov_second_moment_operator(st)
        S = finish(_solve_fixed_point(M, c, "second-moment", algorithm.name))
        return float(np.trace(S[scored, scored]))
    op = _operator(st, algorithm.name, "MAX_STATIONARY_UNKNOWNS")
    if op.n - 1 <= DENSE_UNKNOWNS:  # n rounds cost less than the two Krylov solves
        M, _ = op.assemble()
        z = _solve_fixed_point(M, op.constant, "second-moment", algorithm.name)
    else:
        _require_mean_square_stable(op, algorithm.name)
        z = _solve(op, lambda v: v - op.linear(v), op.constant, algorithm.name, "the stationary moment")
    S = op.second_moment(z)  # one round from the fixed point
    return float(np.trace(S[scored, scored]))


def mean_square_spectral_radius(problem, algorithm) -> float:
    """Spectral radius of one round of the exact second-moment recursion (constant step) on the
    persistent coordinates: below 1 iff the second moment converges from every start (mean-square
    stability); at least :func:`~fedsa_jax.theory.engine.mean_spectral_radius`. The operator is
    assembled (one round per unknown) and its eigenvalues computed: at most
    ``MAX_ASSEMBLED_UNKNOWNS`` unknowns."""
    st = _setup(problem, algorithm, "mean_square_spectral_radius")
    with np.errstate(over="ignore", invalid="ignore"):
        if st.law is not None:
            M, _, _ = _markov_second_moment_operator(st)
        else:
            M, _ = _operator(st, algorithm.name, "MAX_ASSEMBLED_UNKNOWNS").assemble()
    if not np.all(np.isfinite(M)):
        return np.inf
    return float(np.max(np.abs(np.linalg.eigvals(M)))) if M.size else 0.0
