"""Closed forms and shorthands of the exact theory: FedLSA's heterogeneity bias, the step-size
bound of a recursion given by name, and the mixing times of per-agent Markov chains."""

from __future__ import annotations

import inspect

import numpy as np
from scipy import linalg

from fedsa_jax import _validate, algorithms, registry
from fedsa_jax.channel.local_work import LocalWork
from fedsa_jax.moments.noise import float64_arrays
from fedsa_jax.problems.protocol import check_linear
from fedsa_jax.theory.engine import stable_step_size
from fedsa_jax.theory.stationary import mean_square_spectral_radius

__all__ = [
    "fedlsa_bias",
    "fedlsa_round_bias",
    "max_stable_step_size",
    "mixing_time",
    "privacy_noise_floor",
    "tv_to_stationary",
]


def _fedlsa_round(problem, step_size, num_local_steps):
    """``Gamma_bar = mean_c B_c^H`` and ``rho_bar = mean_c (I - B_c^H)(theta_c* - theta*)`` with
    ``B_c = I - eta A_bar[c]``; ``rho_bar`` is computed as
    ``eta mean_c sum_{k<H} B_c^k (b_c - A_c theta*)``, which needs no local inverse.

    With local work (:mod:`fedsa_jax.channel.local_work`) agent c's terms are averaged over its law,
    ``Gamma_c = sum_h P(H_c = h) B_c^h``, and FedNova's normalisation scales outcome h by
    ``tau / h``: ``Gamma_c = I - sum_h P(H_c = h) (tau / h) (I - B_c^h)``, likewise ``rho``."""
    if callable(step_size):
        _validate.fail(
            "step_size",
            step_size,
            "fedlsa_bias and fedlsa_round_bias take a constant step size; for a "
            "schedule the mean iterate is fj.theory.exact_mean(problem, fj.fedlsa(schedule, H), T)",
        )
    eta = _validate.real("step_size", step_size, 0.0, low_open=True)
    A, b, theta_star = float64_arrays(problem)
    N, d, _ = A.shape
    if isinstance(num_local_steps, LocalWork):
        num_local_steps.check(N)
        weights = num_local_steps.table(N)  # (N, H_max): P(H_c = h)
        if num_local_steps.normalization == "fednova":
            weights = weights * num_local_steps.tau(N) / np.arange(1, weights.shape[1] + 1)
    else:
        H = _validate.integer("num_local_steps", num_local_steps)
        weights = np.zeros((N, H))
        weights[:, -1] = 1.0
    gamma_bar = np.eye(d)
    rho = np.zeros(d)
    for c in range(N):
        B = np.eye(d) - eta * A[c]
        Bk = np.eye(d)
        acc = np.zeros(d)
        r = b[c] - A[c] @ theta_star
        for w in weights[c]:  # w = P(H_c = h) (times tau / h); acc, Bk after step h: sum_k<h B^k r, B^h
            acc += Bk @ r
            Bk = B @ Bk
            gamma_bar -= w * (np.eye(d) - Bk) / N
            rho += w * eta * acc / N
    return gamma_bar, rho


def fedlsa_round_bias(problem, step_size: float, num_local_steps: int) -> np.ndarray:
    """``rho_bar_H = mean_c (I - (I - eta A_bar[c])^H)(local_theta_star[c] - theta_star)``: the
    deterministic heterogeneity bias one round of local training adds (SCAFFLSA paper,
    Sec. 4). Zero for homogeneous agents or ``H = 1``."""
    return _fedlsa_round(problem, step_size, num_local_steps)[1]


def fedlsa_bias(problem, step_size: float, num_local_steps, num_rounds: int | None = None) -> np.ndarray:
    """FedLSA's heterogeneity bias (SCAFFLSA paper, Sec. 4; derived step by step in the documentation,
    ``docs/guide/theory.md``, "FedLSA's heterogeneity bias"). ``num_local_steps``: H, or a law of
    heterogeneous or random local work (:mod:`fedsa_jax.channel.local_work`, plain or FedNova averaging;
    ``docs/guide/lockstep.md``), whose limit is ``[sum_c (I - Gamma_c)]^{-1} sum_c (I - Gamma_c)
    (theta_c* - theta*)`` with ``Gamma_c = E (I - eta A_c)^{H_c}``.

    The mean iterate follows ``E[theta_{t+1}] - theta* = Gamma_bar (E[theta_t] - theta*) + rho_bar``
    with ``Gamma_bar = mean_c (I - eta A_bar[c])^H`` and ``rho_bar`` from
    :func:`fedlsa_round_bias`, so ``E[theta_t] - theta* = Gamma_bar^t (theta_0 - theta*) + bias_t``.

    Args:
      num_rounds: None for the limit (closed form)
        ``bias_inf = [mean_c (I - B_c^H)]^{-1} mean_c (I - B_c^H)(theta_c* - theta*)``, shape ``(d,)``;
        an integer T for the per-round bias ``bias_t = sum_{s<t} Gamma_bar^s rho_bar``
        (the paper's ``theta^(bi,bi)_t``, the part of ``E[theta_t] - theta*`` that does not
        depend on ``theta_0``), shape ``(T + 1, d)``, ``bias_0 = 0``.
    """
    gamma_bar, rho = _fedlsa_round(problem, step_size, num_local_steps)
    d = rho.shape[0]
    if num_rounds is None:
        return np.linalg.solve(np.eye(d) - gamma_bar, rho)
    T = _validate.integer("num_rounds", num_rounds, 0)
    out = np.zeros((T + 1, d))
    for t in range(T):
        out[t + 1] = gamma_bar @ out[t] + rho
    return out


def max_stable_step_size(
    problem,
    algorithm="fedlsa",
    num_local_steps: int | None = None,
    grid_points: int = 200,
    tol: float = 1e-6,
    kind: str = "mean",
) -> float:
    """Largest step size up to which the exact mean recursion of ``algorithm``
    contracts (spectral radius of one round < 1 for every smaller step size), or with
    ``kind="mean_square"`` its second-moment recursion
    (:func:`~fedsa_jax.theory.mean_square_spectral_radius`: the MSE stays bounded).

    Args:
      algorithm: the name of a built-in algorithm whose factory needs only a step size and H
        (``"fedlsa"``, ``"scafflsa"``, ``"qfedtd"``: exact channel, H = ``num_local_steps``,
        default 1), or an algorithm such as
        ``fj.qfedtd(0.1, success_prob=0.5)`` or ``fj.scaffnew(0.1, 0.2, 10)``, whose H,
        channel (and communication probability) are kept and whose step size is
        varied (erasures with ``"divide_by_n"`` shrink the mean step by p, so they
        raise the bound by about 1/p); any algorithm with a moment description works
        (averaging leaves the bound as is).

    Scans a log grid from ``1e-4 eta_lsa`` to ``100 eta_lsa`` (``eta_lsa`` =
    :func:`lsa_step_size_bound` of ``mean_c A_bar[c]``) up to its first unstable
    point, then bisects to relative precision ``tol``. For H = 1 FedLSA this is
    ``eta_lsa``. If the whole grid is stable it returns ``100 eta_lsa``, a lower
    bound. Mean stability is necessary, not sufficient, for a bounded MSE: the
    ``"mean_square"`` bound is at most the mean one; it scans ``grid_points`` (at most 25)
    log-spaced steps from ``1e-4`` times the mean bound up to it, then bisects, building the
    second-moment operator at each (:mod:`fedsa_jax.theory.stationary`: small problems).
    """
    kind = _validate.choice("kind", kind, ("mean", "mean_square"))
    if isinstance(algorithm, algorithms.Algorithm):
        if num_local_steps is not None:
            _validate.fail("num_local_steps", num_local_steps, "leave it out: it is taken from the algorithm")
    else:
        algorithm = _from_name(algorithm, num_local_steps)
    bound = stable_step_size(problem, algorithm, grid_points, tol)
    if kind == "mean" or bound == 0.0:
        return bound
    points = min(grid_points, 25)
    return stable_step_size(problem, algorithm, points, tol, mean_square_spectral_radius, upper=bound)


def _from_name(name, num_local_steps):
    """``fj.<name>(1.0[, num_local_steps=H])`` for a registered built-in algorithm whose factory needs
    only the step size and, if it has one, ``num_local_steps``."""
    factories = {n: getattr(algorithms, n) for n in registry.algorithms() if hasattr(algorithms, n)}
    shorthands = tuple(n for n, f in factories.items() if _required(f) <= {"step_size", "num_local_steps"})
    _validate.choice("algorithm", name, shorthands)
    factory = factories[name]
    H = _validate.integer("num_local_steps", 1 if num_local_steps is None else num_local_steps)
    if "num_local_steps" in inspect.signature(factory).parameters:
        return factory(1.0, num_local_steps=H)
    if H != 1:
        _validate.fail("num_local_steps", H, f"fj.{name} takes one local step per round (H=1)")
    return factory(1.0)


def _required(factory) -> set[str]:
    return {
        p.name
        for p in inspect.signature(factory).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD
    }


def _tv_sequence(problem):
    """Yields ``max_s TV(P_c^t(s, .), mu_c)`` (shape ``(N,)``) for t = 0, 1, 2, ..."""
    check_linear(problem, "mixing_time (the chain of a fixed evaluated policy)")
    if not hasattr(problem, "transitions"):
        _validate.fail(
            "problem", type(problem).__name__, "mixing times need a federated TD problem (a Markov chain)"
        )
    P = np.asarray(problem.transitions, np.float64)
    mu = np.asarray(problem.stationary, np.float64)
    N, S, _ = P.shape
    Pt = np.broadcast_to(np.eye(S), (N, S, S)).copy()
    while True:
        yield 0.5 * np.abs(Pt - mu[:, None, :]).sum(-1).max(-1)
        Pt = Pt @ P


def tv_to_stationary(problem, num_steps: int) -> np.ndarray:
    """``(N, num_steps + 1)``: ``max_s TV(P_c^t(s, .), mu_c)`` for ``t = 0..num_steps``, per agent.

    ``TV(p, q) = sum_s |p(s) - q(s)| / 2``; non-increasing in t.
    """
    T = _validate.integer("num_steps", num_steps, 0)
    seq = _tv_sequence(problem)
    return np.stack([next(seq) for _ in range(T + 1)], axis=1)


def mixing_time(problem, eps: float = 0.25, max_steps: int = 100_000) -> np.ndarray:
    """``(N,)`` per-agent mixing time ``t_mix(eps) = min{t : max_s TV(P_c^t(s, .), mu_c) <= eps}``.

    A natural ``skip`` for Markovian FedLSA (SCAFFLSA paper, Sec. 4: keep about one
    observation per mixing time). Raises if some chain has not mixed within ``max_steps``
    (e.g. a periodic chain).
    """
    eps = _validate.real("eps", eps, 0.0, 1.0, low_open=True, high_open=True)
    max_steps = _validate.integer("max_steps", max_steps)
    seq = _tv_sequence(problem)
    out = None
    for t in range(max_steps + 1):
        tv = next(seq)
        out = np.full(tv.shape, -1) if out is None else out
        out[(out < 0) & (tv <= eps)] = t
        if np.all(out >= 0):
            return out
    _validate.fail(
        "problem",
        f"agents {np.nonzero(out < 0)[0].tolist()}",  # pyright: ignore[reportOptionalOperand]
        f"did not mix to TV <= {eps} within max_steps={max_steps} steps (periodic or slowly mixing chain)",
    )


def privacy_noise_floor(
    problem, step_size: float, num_local_steps: int, privacy, first_order: bool = False
) -> float:
    """The MSE that the uplink's Gaussian noise (:func:`fedsa_jax.channel.privacy`, without clipping)
    adds to FedLSA's stationary MSE, every agent every round over an exact channel,
    ``"divide_by_n"``.

    The aggregate gets a noise ``w_t`` of covariance ``s^2 I`` independent of everything else:
    ``s^2 = sigma^2 C^2 / N`` (local: N agents' noises averaged) or ``sigma^2 C^2 / N^2`` (central: one
    noise on the sum, divided by N). Through the mean map ``e_{t+1} = Gamma_bar e_t + ...`` it adds the
    stationary covariance ``Sigma = Gamma_bar Sigma Gamma_bar^T + s^2 I`` (a discrete Lyapunov
    equation, scipy's ``solve_discrete_lyapunov``), and ``tr Sigma`` to the MSE; the noise's further
    path through the agents' random ``A_c(Z)`` adds ``O(eta)`` relative to it. To first order in eta
    (``first_order=True``: ``Gamma_bar = I - eta H A + O(eta^2)``, ``A = mean_c A_bar[c]``),
    ``tr Sigma = s^2 / (eta H) tr X`` with ``A X + X A^T = I`` (``solve_continuous_lyapunov``); for a
    symmetric A, ``s^2 tr(A^{-1}) / (2 eta H)``: the floor grows as eta shrinks, since each round's
    noise is fixed and the contraction per round is ``eta H``."""
    if privacy is None or privacy.noise_std == 0:
        return 0.0
    A, _, _ = float64_arrays(problem)
    N, d, _ = A.shape
    s2 = privacy.noise_std**2 / (N if privacy.mode == "local" else N**2)
    if first_order:
        eta = _validate.real("step_size", step_size, 0.0, low_open=True)
        H = _validate.integer("num_local_steps", num_local_steps)
        X = linalg.solve_continuous_lyapunov(A.mean(0), np.eye(d))
        return float(s2 * np.trace(X) / (eta * H))
    gamma_bar, _ = _fedlsa_round(problem, step_size, num_local_steps)
    return float(np.trace(linalg.solve_discrete_lyapunov(gamma_bar, s2 * np.eye(d))))
