"""The exact recursions: run an algorithm's moment description (:mod:`fedsa_jax.moments`).

Every algorithm describes its own round (``fj.Algorithm(..., theory=fn)``); this module knows no
algorithm. :func:`exact_mean` composes a round's mean maps and applies them to ``E[Y]``;
:func:`exact_mse` propagates ``S = E[Y Y^T]`` phase by phase (sparse conjugations
``S -> L S L^T`` touching only the rows a map changes, and the local steps' own row updates);
:func:`mean_spectral_radius` is the contraction factor of one round of the mean recursion on the
blocks that persist across rounds, which :func:`stable_step_size` scans.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsa_jax import _validate, algorithms
from fedsa_jax.moments import Combination, Recursion, recursion_of
from fedsa_jax.theory import markov
from fedsa_jax.theory._agents import Unfactored, factored_mse, factored_pays, factored_round
from fedsa_jax.theory._operator import CURVE_RATIO, MAX_ASSEMBLED_FOR_CURVES, constant_round_mse
from fedsa_jax.theory._rounds import (
    _cached_conjugate,
    _etas,
    _phases,
    _recursion,
    changing_round,
    round_map,
    round_operations,
    second_moment_round,
)
from fedsa_jax.theory.stationary import DENSE_UNKNOWNS

__all__ = [
    "exact_covariance",
    "exact_mean",
    "exact_mse",
    "lsa_step_size_bound",
    "mean_spectral_radius",
    "stable_step_size",
]


def exact_mean(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``E[theta_t]`` for ``t = 0..num_rounds`` (shape ``(T+1, d)``), exact for i.i.d.
    observations, for every algorithm with a moment description: the built-in ones with any
    unbiased channel, any step-size schedule, any affine server optimizer (``optax.sgd`` with or
    without momentum), their Polyak-Ruppert average (:func:`fedsa_jax.averaged`) and
    Richardson-Romberg extrapolation (:func:`fedsa_jax.richardson`: ``2 E[theta(eta)] -
    E[theta(2 eta)]``), and yours (``fj.Algorithm(..., theory=fn)``, :mod:`fedsa_jax.moments`).

    Markov sampling (``sampling="markov"``, any ``skip``; a problem with ``markov_observations()``,
    federated TD): exact too, on small chains. The means ``E[Y 1{s = j}]`` conditioned on the
    agents' joint chain state j (``S^N`` of them) follow a Markov jump linear system (Costa,
    Fragoso, Marques 2005, Ch. 3; :mod:`fedsa_jax.theory.markov`); refused beyond
    ``S^N * D = MAX_MARKOV_ENTRIES`` entries, and with a cohort (``clients_per_round < N``).
    """
    T = _validate.integer("num_rounds", num_rounds, 0)
    description = recursion_of(algorithm, problem)
    if isinstance(description, Combination):
        out = 0.0
        for coef, term in description.terms:
            out = out + coef * exact_mean(problem, term, T, theta0)
        return out  # pyright: ignore[reportReturnType]
    rec, etas = _recursion(description, algorithm, T)
    y = rec.state
    m = y.initial(theta0)
    law = markov.markov_law(problem, getattr(algorithm, "skip", 1), y, second=False)
    if law is not None:
        return _markov_mean(rec, law, etas, T, m)
    advance = _mean_rounds(rec)
    out = [m[y[rec.scored(0)]].copy()]
    for t in range(T):
        m = advance(m, t, etas[t])
        out.append(m[y[rec.scored(t + 1)]].copy())
    return np.asarray(out) + y.theta_star  # from error coordinates


def _mean_rounds(rec: Recursion, cache_size: int = 32):
    """``advance(m, t, etas) -> E[Y]`` after round t. A round seen once is applied phase by phase
    (``H`` products ``L m``, no D x D product: a schedule's rounds are all distinct); from its second
    occurrence its mean map (the product of its phases' maps) is formed once and reused, one product
    ``R m`` a round. A round is known by its phases' maps (cached by the state: a constant step, or
    a round description that repeats, gives the same objects; they are kept alive with the entry,
    so their ids stay unique)."""
    seen: dict = {}

    def advance(m, t, etas):
        maps = [phase.mean() for phase in _phases(rec, t, etas)]
        key = tuple(map(id, maps))
        if key in seen and seen[key][1] is not None:
            return seen[key][1] @ m
        if key in seen:  # the second time: form the round's map
            R = maps[0]
            for L in maps[1:]:
                R = L @ R
            seen[key] = (maps, R)
            return R @ m
        if len(seen) >= cache_size:
            seen.pop(next(iter(seen)))
        seen[key] = (maps, None)
        for L in maps:
            m = L @ m
        return m

    return advance


def _markov_mean(rec: Recursion, law, etas: np.ndarray, T: int, m: np.ndarray) -> np.ndarray:
    """:func:`exact_mean` under Markov sampling: the stack of conditional means through the phases."""
    y = rec.state
    for phase in _phases(rec, 0, etas[0]) if T else []:
        markov.prepare(phase, second=False)
    stack = law.initial_stack(m, second=False)
    out = [m[y[rec.scored(0)]].copy()]
    for t in range(T):
        for phase in _phases(rec, t, etas[t]):
            stack = markov.mean(phase, stack, law)
        out.append(stack.sum(0)[y[rec.scored(t + 1)]])
    return np.asarray(out) + y.theta_star


def exact_mse(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``E|theta_t - theta_star|^2`` for ``t = 0..num_rounds``, exact (float64).

    Propagates ``S = E[Y Y^T]`` of the algorithm's augmented state Y through the phases of its
    rounds (:mod:`fedsa_jax.moments`). A local step maps ``S <- L_s S L_s^T + E[w w^T]``: the
    local noise ``w_c = eta ((b_c(Z) - A_c(Z) x_c) - (b_bar[c] - A_bar[c] x_c))`` has mean zero
    given the state and is independent across agents, and its covariance is linear in S: the
    problem's ``noise_second_moment()`` (Gaussian LSA, generative TD) or ``finite_support()``
    (least squares, ``fj.problems.expected``, user problems). Other problems are refused with a
    ``ValueError``.

    The uplink channel enters exactly: with random weights ``w_c`` (erasures) and quantizer
    error ``e_c`` (mean zero given the message, covariance ``V(m_c m_c^T)``), the aggregate gains
    ``sum_{c,j} Cov(w_c, w_j) E[m_c m_j^T] + sum_c E[w_c^2] V(E[m_c m_c^T])``. ``V`` is linear for
    ``identity`` and ``rand_k`` only; other quantizers, and control variates on a lossy channel
    (products of erasure indicators), are refused. A cohort of m of the N agents
    (``clients_per_round``) enters the same way, its weights drawn independently of the state (control
    variates included, with an exact channel). A coin independent of the state (communicate
    with probability p) mixes ``S <- (1 - p) S + p L S L^T``.

    Cost O(N d^2 D) per local step and O(N d D^2) per round (O(N^2 d^2 D) with control variates)
    with D the size of Y (``1 + d + N d`` plus the algorithm's blocks; at most
    ``MAX_AUGMENTED_DIM``); memory O(D^2). With i.i.d. observations two shortcuts give the same
    values (to rounding), the first also beyond ``MAX_AUGMENTED_DIM`` (up to
    ``_agents.MAX_FACTORED_DIM`` global and persistent per-agent coordinates):

    * many agents: within a round the agents' local iterates are independent given the state at
      its start, so their blocks are carried in factored form (derived in the theory guide),
      O(N d^2 (g + q)) per local step with g the global coordinates and q an agent's persistent
      ones (control variates, its own iterate); only the joint moment of the globals and the
      persistent blocks is kept, O(N^2 q^2 (q + g)) per aggregation. Covers any channel, cohort,
      schedule, server optimizer or average without control variates, and control variates
      (SCAFFLSA, Scaffnew's coin) with an exact channel; used when the agents' coordinates are at
      least ``_agents.FACTORED_RATIO`` times the others;
    * a constant round over a long horizon (at least ``CURVE_RATIO`` times the n unknowns of the
      second moment of the persistent coordinates): the round's affine operator is assembled from n
      rounds and applied as one ``n x n`` product a round.

    Markov sampling (``sampling="markov"``, any ``skip``, chains started from their stationary
    laws and carried across rounds; a problem with ``markov_observations()``, federated TD): the
    observation is a deterministic function ``(A_c(s, s'), b_c(s, s'))`` of the transition, so Y is
    a Markov jump linear system (Costa, Fragoso, Marques, "Discrete-Time Markov Jump Linear
    Systems", Springer 2005, Ch. 3) and ``S_j = E[Y Y^T 1{s = j}]``, one per joint chain state j of
    the N agents, evolve linearly: a local step sums ``P(x, x') L(x, x') S_x L(x, x')^T`` over
    transitions (one agent at a time, :mod:`fedsa_jax.theory.markov`), every other phase acts on
    each ``S_j`` as above, and ``E[Y Y^T] = sum_j S_j``. Cost ``O(N S^{N+1} d D^2)`` per local
    step; refused beyond ``S^N * D^2 = MAX_MARKOV_ENTRIES`` entries (the sizes named), and with a
    cohort (``clients_per_round < N``: idle agents' chains stand still).
    """
    rec, moments = _second_moments(problem, algorithm, num_rounds, theta0)
    y = rec.state
    iid = not markov.is_markov(problem)  # the shortcuts are for i.i.d. observations
    factored = iid and factored_pays(rec)  # many agents: blocks factored (independent given the server)
    if iid and not changing_round(rec):  # a long horizon: the assembled operator, if cheaper
        fast = constant_round_mse(rec, _etas(rec, num_rounds), num_rounds, y.initial(theta0), factored)
        if fast is not None:
            return fast
    if factored:
        try:
            return factored_mse(rec, _etas(rec, num_rounds), num_rounds, y.initial(theta0))
        except Unfactored as why:
            y.require_dense(f"and the recursion on the agents' factored blocks does not apply: {why}")
    # error coordinates: no cancellation
    return np.asarray([np.trace(S[y[rec.scored(t)], y[rec.scored(t)]]) for t, S in enumerate(moments)])


def exact_covariance(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``Cov(theta_t)`` for ``t = 0..num_rounds`` (shape ``(T+1, d, d)``): the covariance of the
    reported iterate, from the same second moments as :func:`exact_mse` (whose trace plus the
    squared bias ``|E[theta_t] - theta_star|^2`` it is), round by round on the full moment (none of
    exact_mse's shortcuts; Markov sampling included). ``u^T Cov(theta_T) u`` is the exact variance
    of ``u^T theta_T``, the reference of the confidence intervals of :mod:`fedsa_jax.inference`."""
    rec, moments = _second_moments(problem, algorithm, num_rounds, theta0)
    y = rec.state
    out = []
    for t, S in enumerate(moments):
        block = np.arange(y.D)[y[rec.scored(t)]]
        second, mean = S[np.ix_(block, block)], S[0, block]  # Y_0 = 1: E[e] is its first row
        cov = second - np.outer(mean, mean)
        out.append(0.5 * (cov + cov.T))
    return np.asarray(out)


def _second_moments(problem, algorithm, num_rounds: int, theta0=None):
    """``(recursion, an iterator over S_t = E[Y_t Y_t^T] for t = 0..num_rounds)``: the recursion of
    :func:`exact_mse` (``recursion.scored(t)`` names the reported iterate's block of Y after round t),
    its arguments checked before it returns."""
    T = _validate.integer("num_rounds", num_rounds, 0)
    description = recursion_of(algorithm, problem)
    if isinstance(description, Combination):
        _validate.fail(
            "algorithm", algorithm.name, f"exact_mse does not cover {description.what}; exact_mean does"
        )
    rec, etas = _recursion(description, algorithm, T)
    y = rec.state
    law = markov.markov_law(problem, getattr(algorithm, "skip", 1), y, second=True)
    if law is None:
        _recursion(description, algorithm, T, second=True)  # the phases' checks
    m = y.initial(theta0)
    if law is not None:
        y.require_dense()
        return rec, _markov_second_moments(rec, law, etas, T, m)
    y.noise  # noqa: B018 (the problem's noise law, or a refusal)
    advance = second_moment_round(rec)

    def moments():  # the full moment, D x D: built only when iterated
        y.require_dense()
        S = np.outer(m, m)
        yield S
        for t in range(T):
            S = advance(S, t, etas[t])
            yield S

    return rec, moments()


def _markov_second_moments(rec: Recursion, law, etas: np.ndarray, T: int, m: np.ndarray):
    """The iterator of :func:`_second_moments` under Markov sampling: ``sum_j S_j``, the stack of
    second moments conditioned on the joint chain state propagated phase by phase."""
    for phase in _phases(rec, 0, etas[0] if T else _etas(rec, 1)[0]):
        markov.prepare(phase, second=True)
    conjugate = _cached_conjugate()
    stack = law.initial_stack(m, second=True)
    yield stack.sum(0)
    for t in range(T):
        for phase in _phases(rec, t, etas[t]):
            stack = markov.second(phase, stack, law, conjugate)
        stack = 0.5 * (stack + np.swapaxes(stack, -1, -2))  # see second_moment_round
        yield stack.sum(0)


def lsa_step_size_bound(A) -> float:
    """Largest eta with spectral radius ``rho(I - eta A) < 1``: ``min_lambda 2 Re(lambda) / |lambda|^2``
    over the eigenvalues of ``A (d, d)`` (0 if some ``Re(lambda) <= 0``, i.e. A is not Hurwitz-stable)."""
    lam = np.linalg.eigvals(np.asarray(A, np.float64))
    if np.any(lam.real <= 0):
        return 0.0
    return float(np.min(2 * lam.real / np.abs(lam) ** 2))


def mean_spectral_radius(problem, algorithm) -> float:
    """Spectral radius of one round of the exact mean recursion (constant step), on the blocks
    that persist across rounds (``carried``), restricted to ``sum_c xi_c = 0`` for the per-agent
    blocks whose sum stays 0 (``zero_sum``: control variates). Under Markov sampling: of one round
    of the means conditioned on the joint chain state (:mod:`fedsa_jax.theory.markov`), on the same
    blocks of each."""
    rec, etas = _recursion(recursion_of(algorithm, problem), algorithm, 1)
    y = rec.state
    law = markov.markov_law(problem, getattr(algorithm, "skip", 1), y, second=False)
    with np.errstate(over="ignore", invalid="ignore"):
        R = round_map(rec, 0, etas[0]) if law is None else None
    if R is not None and not np.all(np.isfinite(R)):
        return np.inf
    d = y.d
    zero = [sl for name in y.zero_sum for sl in y[name]]
    parts = [*zero] + [
        sl for name in y.carried for sl in (y[name] if isinstance(y[name], list) else [y[name]])
    ]
    every = np.arange(y.D)
    keep = np.concatenate([every[sl] for sl in parts])
    Q = np.eye(len(keep))
    if zero:  # orthonormal basis of {sum_c w_c xi_c = 0} in the kept coordinates (the xi blocks first)
        sums = np.zeros((d, len(keep)))
        sums[:, : len(zero) * d] = y.zero_sum_constraint(y.zero_sum[0])
        Q = np.linalg.svd(sums)[2][d:].T
    if law is not None:
        M = _markov_mean_operator(rec, law, etas[0], keep, Q)
    else:
        M = Q.T @ R[np.ix_(keep, keep)] @ Q  # pyright: ignore[reportOptionalSubscript]
    if not np.all(np.isfinite(M)):
        return np.inf
    return float(np.max(np.abs(np.linalg.eigvals(M))))


def _markov_mean_operator(rec: Recursion, law, etas: np.ndarray, keep: np.ndarray, Q: np.ndarray):
    """One round of the conditional means ``E[Y_keep 1{s = j}] = Q z_j`` as a matrix on the z_j
    (``S^N`` blocks), from the round applied to every basis element at once."""
    y, J, k = rec.state, law.S**law.N, Q.shape[1]
    n = markov.check_unknowns(law, k, y.name)
    for phase in _phases(rec, 0, etas):
        markov.prepare(phase, second=False)
    basis = np.zeros((J, y.D, n))
    for j in range(J):
        basis[j][np.ix_(keep, j * k + np.arange(k))] = Q
    with np.errstate(over="ignore", invalid="ignore"):
        for phase in _phases(rec, 0, etas):
            basis = markov.mean(phase, basis, law)
    return np.einsum("ki,jkc->jic", Q, basis[:, keep, :]).reshape(n, n)


def stable_step_size(
    problem, algorithm, grid_points: int = 200, tol: float = 1e-6, radius_of=None, upper: float | None = None
) -> float:
    """Largest constant step size up to which ``algorithm``'s exact mean recursion contracts, its
    other hyperparameters kept (see :func:`fedsa_jax.theory.max_stable_step_size`).

    ``radius_of(problem, algorithm)``: another spectral radius to keep below 1 (default
    :func:`mean_spectral_radius`); ``upper``: scan ``upper * logspace(-4, 0)`` instead of the
    default grid around the single-agent bound (a known bound above the answer)."""
    description = recursion_of(algorithm, problem)
    if isinstance(description, Combination):
        _validate.fail("algorithm", algorithm.name, description.hint)
    if changing_round(description):
        _validate.fail(
            "algorithm",
            algorithm.name,
            "max_stable_step_size varies a constant step size over identical rounds; this algorithm has "
            "a schedule or local steps that change with the round",
        )

    radius_of = mean_spectral_radius if radius_of is None else radius_of

    def radius(eta):
        return radius_of(problem, algorithms.with_step_size(algorithm, eta))

    if upper is None:
        A = np.asarray(problem.A_bar, np.float64)
        base = lsa_step_size_bound(A.mean(0))
        if base == 0.0:
            _validate.fail(
                "problem", "mean_c A_bar[c]", "has an eigenvalue with Re <= 0: no step size is stable"
            )
        grid = base * np.logspace(-4, 2, grid_points)
    else:
        grid = upper * np.logspace(-4, 0, grid_points)
    if radius(grid[0]) >= 1.0:
        return 0.0
    lo = grid[0]
    for hi in grid[1:]:
        if radius(hi) >= 1.0:
            break
        lo = hi
    else:
        return float(grid[-1])
    while hi - lo > tol * lo:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if radius(mid) < 1.0 else (lo, mid)
    return float(lo)


# Seconds per operation of the dense second-moment recursion (a local step ~ D^2, another map <= D^3,
# :func:`~fedsa_jax.theory._rounds.round_operations`): measured 0.7e-8 to 2e-8 on two shared cores
# (FedLSA, SCAFFLSA, random local work, delays; N = 10, d = 8). Estimates are good to a few times.
SECONDS_PER_OPERATION = 1e-8
# Rounds of stationary_mse's two GMRES solves (the stability certificate, the moment): measured 90 to
# 370 at N = 10, d = 8; GMRES may apply up to stationary._MAX_APPLICATIONS.
GMRES_ROUNDS = 400


@dataclasses.dataclass(frozen=True)
class ExactCost:
    """What :func:`exact_mse` and :func:`~fedsa_jax.theory.stationary_mse` will cost on the dense
    recursion, from the sizes: ``rounds`` (and ``stationary_rounds``, None without a constant round)
    of ``local_steps`` local steps and ``maps`` other maps each, on the ``dim x dim`` second moment of
    the augmented state (averaged over a few rounds where the rounds change)."""

    dim: int
    local_steps: float
    maps: float
    rounds: int
    stationary_rounds: int | None

    def seconds(self, rounds: int) -> float:
        """The estimated wall time of ``rounds`` rounds (:data:`SECONDS_PER_OPERATION`)."""
        operations = self.local_steps * self.dim**2 + self.maps * self.dim**3
        return rounds * operations * SECONDS_PER_OPERATION

    def sizes(self, rounds: int) -> str:
        """``"60 rounds of 1000 local steps and 11 maps on a 217 x 217 moment"``."""
        return (
            f"{rounds} rounds of {self.local_steps:.0f} local steps and {self.maps:.0f} maps on a "
            f"{self.dim} x {self.dim} moment"
        )


def exact_cost(problem, algorithm, num_rounds: int) -> ExactCost | None:
    """The sizes that set the exact theory's time (:class:`ExactCost`); None where they do not
    (Markov sampling and the agents' factored recursion have their own limits, and cost little on
    problems that pass them) or where the algorithm has no exact second moments (:func:`exact_mse`
    says why)."""
    try:
        description = recursion_of(algorithm, problem)
        if isinstance(description, Combination) or markov.is_markov(problem):
            return None
        rec, etas = _recursion(description, algorithm, num_rounds)
    except ValueError:
        return None
    if num_rounds == 0 or _factored_applies(rec, etas):
        return None
    D, constant = rec.state.D, not changing_round(rec)
    probes = sorted({0, num_rounds // 2, num_rounds - 1})
    local, maps = np.mean([round_operations(rec, t, etas[t]) for t in probes], axis=0)
    n = D * (D + 1) // 2  # the second moment's unknowns at most (the persistent coordinates are fewer)
    rounds = num_rounds
    if constant and n - 1 <= MAX_ASSEMBLED_FOR_CURVES and CURVE_RATIO * (n + 2) <= num_rounds:
        rounds = n  # assembled from n rounds, then one product a round
    stationary = (n if n - 1 <= DENSE_UNKNOWNS else GMRES_ROUNDS) if constant else None
    return ExactCost(D, float(local), float(maps), rounds, stationary)


def _factored_applies(rec: Recursion, etas) -> bool:
    """Whether the rounds run on the agents' factored blocks (cheap: O(N d^2) a local step): one round
    from a zero moment, which a phase it does not cover interrupts at once."""
    if not factored_pays(rec):
        return False
    try:
        z, advance = factored_round(rec)
        advance(np.zeros((len(z), len(z))), 0, etas[0])
    except Unfactored:
        return False
    return True
