"""The deterministic (noise-free) path of an algorithm and its limit, for any problem.

For a linear problem the mean of the iterates follows an exact affine recursion
(:func:`fedsa_jax.theory.exact_mean`). For a problem whose observations follow the iterate
(SARSA) or whose direction is not affine (Q-learning) the mean is no longer closed, and the
reference is the **noise-free path**: every agent's local step follows its mean field,

    theta^c_{t,h+1} = theta^c_{t,h} - eta (mean direction of agent c at theta^c_{t,h}),

with the algorithm's own aggregation (FedLSA's averaging, SCAFFLSA's control variates, a server
optimizer). :func:`mean_path` runs the algorithm's own kernel, in float64, on the problem's
noise-free version (:func:`fedsa_jax.problems.expected`: ``mean_field()`` for SARSA, the mean
system for a linear problem, where the path equals :func:`~fedsa_jax.theory.exact_mean`), so no
round is written twice. :func:`mean_path_limit` finds its fixed point by Newton's method on the
algorithm's state (the autodiff Jacobian of one round): for FedSARSA at step eta and H local
steps, the control analogue of FedLSA's heterogeneity bias is ``mean_path_limit - theta_star``.

The path is deterministic only if the algorithm draws no random numbers of its own (an exact
channel, every agent every round, fixed local work): others are refused, found by running the
first rounds from two keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.algorithms._base import Algorithm
from fedsa_jax.problems._base import float64
from fedsa_jax.problems.mean_path import expected

__all__ = ["mean_path", "mean_path_limit"]

LIMIT_ROUNDS_TOL = 1e-12  # the limit's stopping residual |round(x) - x|, per unit of step size
_CHECK_ROUNDS = (
    8  # rounds run from two keys to tell a deterministic algorithm (a cohort of 2 of 3: 3^-8 to miss)
)


def _to64(tree):
    """Every floating leaf of ``tree`` in float64 (inside :func:`float64`)."""

    def cast(x):
        return jnp.asarray(x, jnp.float64) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact) else x

    return jax.tree.map(cast, tree)


def _setup(problem, algorithm, theta0):
    """The float64 noise-free problem, the algorithm and theta0 (default: theta_star's zeros, as
    :func:`fedsa_jax.simulate`'s default ``theta0 = 0``)."""
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__, "expected an fj.Algorithm")
    noise_free = expected(problem)
    d = problem.dim
    theta0 = np.zeros(d) if theta0 is None else _validate.array("theta0", theta0, 1)
    if theta0.shape != (d,):
        _validate.fail("theta0", list(theta0), f"expected shape ({d},) to match the problem's dimension")
    return _to64(noise_free), _to64(algorithm), jnp.asarray(theta0, jnp.float64)


def _rounds(problem, algorithm, state, num_rounds: int, key):
    """``num_rounds`` rounds from ``state``; the server iterates ``(num_rounds, d)`` and the state."""

    def body(st, t):
        st, _ = algorithm.step(jax.random.fold_in(key, t), st, problem)
        return st, st.theta

    state, thetas = jax.lax.scan(body, state, jnp.arange(num_rounds))
    return thetas, state


def _check_deterministic(problem, algorithm, state) -> None:
    """Refuse an algorithm whose rounds draw random numbers (the path would be one random draw)."""
    run = jax.jit(lambda s, k: _rounds(problem, algorithm, s, _CHECK_ROUNDS, k)[0])
    a, b = run(state, jax.random.key(1)), run(state, jax.random.key(2))
    if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True):
        _validate.fail(
            "algorithm",
            algorithm.name,
            "its rounds draw random numbers of their own (a quantizer, erasures, privacy noise, a "
            "cohort, random local work or delays), so its noise-free path is random: take them off "
            "for the deterministic reference, or simulate",
        )


def mean_path(problem, algorithm: Algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """The noise-free path of ``algorithm`` on ``problem``: ``(num_rounds + 1, d)`` server iterates,
    float64 (module docstring).

    Args:
      problem: any problem; one that follows the iterate needs ``mean_field()``
        (:class:`~fedsa_jax.problems.FederatedSARSA` has it).
      algorithm: an algorithm whose rounds draw no random numbers of their own.
      num_rounds: T >= 0.
      theta0: the initial iterate (default 0, as :func:`fedsa_jax.simulate`).

    Example:
      >>> import fedsa_jax as fj
      >>> p = fj.problems.garnet_control()
      >>> path = fj.theory.mean_path(p, fj.fedlsa(0.01, 10), 5)
      >>> path.shape
      (6, 30)
    """
    T = _validate.integer("num_rounds", num_rounds, 0)
    with float64():
        noise_free, alg, theta0 = _setup(problem, algorithm, theta0)
        state = alg.init(jax.random.key(0), noise_free, theta0)
        _check_deterministic(noise_free, alg, state)
        thetas, _ = jax.jit(lambda s: _rounds(noise_free, alg, s, T, jax.random.key(0)))(state)
        return np.concatenate([np.asarray(theta0)[None], np.asarray(thetas)])


def mean_path_limit(problem, algorithm: Algorithm, theta0=None, max_iterations: int = 50) -> np.ndarray:
    """The fixed point of ``algorithm``'s noise-free round on ``problem`` (:func:`mean_path`'s limit):
    ``(d,)`` float64, by Newton's method on the algorithm's whole state (its float leaves: the
    iterate, control variates, ...), with the autodiff Jacobian of one round; quantities the round
    conserves (a control variates' sum, which makes the Jacobian singular) keep the values they have
    at the start (:func:`_newton_step`), which is the state at
    ``theta0`` (default: ``problem.theta_star``). A constant step size only.

    Raises a ``ValueError`` when the residual ``|round(x) - x|`` does not fall below
    ``LIMIT_ROUNDS_TOL`` times the round's total step (``sum_h eta_h``)."""
    theta0 = np.asarray(problem.theta_star, np.float64) if theta0 is None else theta0
    with float64():
        noise_free, alg, theta0 = _setup(problem, algorithm, theta0)
        state = alg.init(jax.random.key(0), noise_free, theta0)
        _check_deterministic(noise_free, alg, state)
        leaves, treedef = jax.tree.flatten(state)
        moving = [i for i, x in enumerate(leaves) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
        shapes = [jnp.shape(leaves[i]) for i in moving]
        sizes = [int(np.prod(s)) for s in shapes]

        def unpack(x):
            out, at = list(leaves), 0
            for i, shape, size in zip(moving, shapes, sizes):
                out[i] = x[at : at + size].reshape(shape)
                at += size
            return jax.tree.unflatten(treedef, out)

        def pack(st):
            flat = jax.tree.leaves(st)
            return jnp.concatenate([jnp.ravel(flat[i]) for i in moving])

        def residual(x):  # round(x) - x
            st, _ = alg.step(jax.random.key(0), unpack(x), noise_free)
            return pack(st) - x

        F, J = jax.jit(residual), jax.jit(jax.jacfwd(residual))
        x = np.asarray(pack(state))
        r = np.asarray(F(x))
        scale = _round_step(alg, noise_free)
        for _ in range(max_iterations):
            if np.linalg.norm(r) <= LIMIT_ROUNDS_TOL * scale:
                break
            x_new = x + _newton_step(np.asarray(J(x)), r)
            r_new = np.asarray(F(x_new))
            if not np.linalg.norm(r_new) < np.linalg.norm(r):
                break  # at the rounding floor
            x, r = x_new, r_new
        norm = float(np.linalg.norm(r))
        if not norm <= 1e3 * LIMIT_ROUNDS_TOL * scale:
            _validate.fail(
                "algorithm",
                algorithm.name,
                f"no fixed point of its noise-free round found: Newton's method stopped at residual "
                f"{norm:.3g}: a step size beyond stability, a start far from the limit (pass theta0), or "
                "a round that is not a smooth map of the state (an adaptive server optimizer, e.g. Adam)",
            )
        return np.asarray(unpack(x).theta)


def _newton_step(jacobian: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The step ``delta`` of ``(J_round - I) delta = -r`` that keeps the round's conserved linear
    quantities: the left null vectors w of ``J_round - I`` (``w^T J_round = w^T``, e.g. the sum of
    control variates, which the round keeps) are added as constraints ``w^T delta = 0``, so the
    limit is the one the path from the start reaches, not another point of the family of fixed
    points that differ in them."""
    M = jacobian
    u, sv, _ = np.linalg.svd(M)
    conserved = u[:, sv <= 1e-10 * max(sv.max(initial=0.0), 1.0)].T  # left null vectors
    system = np.vstack([M, conserved])
    rhs = np.concatenate([-r, np.zeros(conserved.shape[0])])
    return np.linalg.lstsq(system, rhs, rcond=None)[0]


def _round_step(algorithm: Algorithm, problem) -> float:
    """``sum_h eta_h`` of a round (the scale of a round's increment), from a constant step size."""
    eta = getattr(algorithm.config, "step_size", None)
    try:
        eta = float(eta)  # pyright: ignore[reportArgumentType]
    except (TypeError, ValueError):
        _validate.fail("step_size", "a schedule", "the noise-free limit needs a constant step size")
    del problem
    H = getattr(algorithm.config, "num_local_steps", 1)
    if not isinstance(H, int):
        _validate.fail(
            "num_local_steps",
            "a table",
            "the noise-free limit needs the same round every time: a constant number of local steps",
        )
    return eta * H
