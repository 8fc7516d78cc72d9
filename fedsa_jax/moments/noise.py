"""Noise models of the problems in an exact moment recursion: the local steps' noise second moment
``E[w_c w_c^T]`` from a problem's ``noise_second_moment()`` or ``finite_support()``, in float64.
"""

from __future__ import annotations

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.problems.protocol import check_linear, direction_second_moment

__all__ = []


def residuals(problem) -> np.ndarray:
    """``rho_c = A_bar[c] theta_star - b_bar[c]`` (N, d), in float64: the constant term of a local
    step in error coordinates."""
    A, b, theta_star = float64_arrays(problem)
    return np.einsum("cij,j->ci", A, theta_star) - b


def require_iid(problem):
    """Refuses a problem whose observations are not i.i.d. (``sampling`` other than generative)."""
    if getattr(problem, "sampling", "generative") != "generative":
        _validate.fail(
            "problem.sampling", problem.sampling, "exact recursions need i.i.d. ('generative') sampling"
        )


def noise_model(problem):
    """``cov(m, X) -> (N, d, d)``: the covariance of the local direction
    ``b_c(Z) - A_c(Z) x`` around ``b_bar[c] - A_bar[c] x``, averaged over an iterate
    ``x`` with ``E[x] = m[c]``, ``E[x x^T] = X[c]``, Z independent of x:
    ``E[(A(Z) x - b(Z))(...)^T] - E[(A_bar x - b_bar)(...)^T]``, linear in ``(m, X)``.

    * A problem with ``finite_support()`` (least squares, :func:`~fedsa_jax.problems.expected`,
      user problems): the first term is the finite sum of
      :class:`~fedsa_jax.problems.FiniteSupport` over each agent's support points.
    * A problem with ``noise_second_moment()`` (Gaussian LSA, federated TD, user problems):
      the function it returns (the problem owns the law of its noise; see
      :class:`~fedsa_jax.problems.Problem`).
    """
    A, b, _ = float64_arrays(problem)
    N, d, _ = A.shape
    if hasattr(problem, "finite_support"):
        require_iid(problem)
        mean_part = direction_second_moment(np.ones((N, 1)), A[:, None], b[:, None])
        second = _support_second_moment(problem, A, b)
        return lambda m, X: second(m, X) - mean_part(m, X)
    own = getattr(problem, "noise_second_moment", None)
    cov = own() if callable(own) else None
    if cov is None:
        _validate.fail(
            "problem",
            type(problem).__name__,
            "exact second moments need the law of the noise: a problem with a "
            "noise_second_moment() method (Gaussian LSA, federated TD) or a finite_support() "
            "method (fj.problems.FiniteSupport)",
        )
    require_iid(problem)
    return cov


def _support_second_moment(problem, A, b):
    """``E[(A(Z) x - b(Z))(...)^T]`` from ``problem.finite_support()``, after checking
    that its weights are a law per agent and reproduce ``A_bar`` and ``b_bar``."""
    sup = problem.finite_support()
    N, d, _ = A.shape
    name = f"{type(problem).__name__}.finite_support()"
    w = np.asarray(sup.weights, np.float64)
    bz = np.asarray(sup.b, np.float64)
    if w.ndim != 2 or w.shape[0] != N or bz.shape != w.shape + (d,):
        _validate.fail(
            name, f"weights {w.shape}, b {bz.shape}", f"expected weights (N={N}, K) and b (N, K, d={d})"
        )
    if sup.A is not None:
        Az = np.asarray(sup.A, np.float64)
        if Az.shape != w.shape + (d, d) or sup.left is not None or sup.right is not None:
            _validate.fail(name, f"A {Az.shape}", f"expected A of shape {w.shape + (d, d)} and no left/right")
        mean_A = np.einsum("ck,ckij->cij", w, Az)
    else:
        if sup.left is None or sup.right is None:
            _validate.fail(name, "A=None", "expected A, or both left and right (A(z) = left right^T)")
        left, right = np.asarray(sup.left, np.float64), np.asarray(sup.right, np.float64)
        if left.shape != bz.shape or right.shape != bz.shape:
            _validate.fail(
                name, f"left {left.shape}, right {right.shape}", f"expected both of shape {bz.shape}"
            )
        mean_A = np.einsum("ck,cki,ckj->cij", w, left, right)
    tol = np.sqrt(np.finfo(problem.dtype).eps)
    if np.any(w < 0) or not np.allclose(w.sum(1), 1.0, rtol=0, atol=tol):
        _validate.fail(name, "weights", "expected nonnegative weights summing to 1 for every agent")
    scale = max(1.0, float(np.max(np.abs(A))), float(np.max(np.abs(b))))
    if not (
        np.allclose(mean_A, A, rtol=0, atol=tol * scale)
        and np.allclose(np.einsum("ck,cki->ci", w, bz), b, rtol=0, atol=tol * scale)
    ):
        _validate.fail(
            name,
            "the support's means",
            "expected sum_k weights A(z_k) = A_bar and sum_k weights b(z_k) = b_bar for every agent",
        )
    if sup.A is not None:
        return direction_second_moment(w, Az, bz)
    wl = w[:, :, None] * left
    bb = np.swapaxes(w[:, :, None] * bz, 1, 2) @ bz  # sum_k w b b^T

    def second(m, X):
        v = (right @ m[:, :, None])[..., 0]  # (N, K): r_k^T m
        q = np.sum((right @ X) * right, axis=-1)  # r_k^T X r_k
        ll = np.swapaxes(wl * q[..., None], 1, 2) @ left  # sum_k w q l l^T
        lb = np.swapaxes(wl * v[..., None], 1, 2) @ bz  # sum_k w v l b^T
        return ll - lb - np.swapaxes(lb, 1, 2) + bb

    return second


def float64_arrays(problem):
    """``(A_bar, b_bar, theta_star)`` in float64, for a problem the linear theory covers (one that
    follows the iterate or is not affine is refused here, for every exact recursion)."""
    check_linear(problem, "the exact theory")
    A = np.asarray(problem.A_bar, np.float64)
    b = np.asarray(problem.b_bar, np.float64)
    return A, b, np.asarray(problem.theta_star, np.float64)
