"""Exact references: FedLSA's heterogeneity bias and exact moment recursions.

All updates of FedLSA and SCAFFLSA are affine in the joint state given the
noise. Write one round on the augmented vector

    Y = (1, theta, xi_1, ..., xi_N, theta^1, ..., theta^N)

(the local iterates theta^c live in Y during a round): broadcast
``theta^c <- theta``; H local steps
``theta^c <- (I - eta A_bar[c]) theta^c + eta b_bar[c] + eta xi_c + w_c``;
aggregation ``theta <- mean_c theta^c`` and, for SCAFFLSA,
``xi_c <- xi_c + (theta - theta^c) / (eta H)``. Each is ``Y <- L Y + w`` with a
constant matrix L, so the mean follows ``m <- L m`` exactly whenever the
observations are i.i.d. (Gaussian LSA, generative TD). For Gaussian noise the
local noise ``w_c = -eta (noise_A G theta^c - noise_b g)`` has conditional
covariance ``eta^2 (noise_A^2 |theta^c|^2 + noise_b^2) I``, independent across
agents and steps, so the second moment ``S = E[Y Y^T]`` follows
``S <- L S L^T + E[w w^T]`` exactly, and ``E|theta_t - theta_star|^2`` is read
off S. Computed in float64 numpy.

Uplink channels (unbiased quantizer Q, erasures with probability 1 - p) keep the
mean dynamics linear: the quantizer noise has mean zero and the erasures are
independent of everything else, so in :func:`exact_mean` the server step uses
the expected aggregation weights ``E[w_c]`` (``p / N`` for ``"divide_by_n"``,
``(1 - (1 - p)^N) / N`` for ``"divide_by_received"``) and SCAFFLSA's control
variate step the expected products ``E[1{c in R} 1{j in R} / |R|]``.

References: Mangold et al., SCAFFLSA, NeurIPS 2024, arXiv:2402.04114, Sec. 3
(FedLSA bias) and Sec. 5 (SCAFFLSA).
"""

from __future__ import annotations

import numpy as np

from fedsa_jax import _validate

MAX_AUGMENTED_DIM = 2000


def _arrays(problem):
    A = np.asarray(problem.A_bar, np.float64)
    b = np.asarray(problem.b_bar, np.float64)
    return A, b, np.asarray(problem.theta_star, np.float64)


def fedlsa_bias(problem, step_size: float, num_local_steps: int) -> np.ndarray:
    """Limit of ``E[theta_t] - theta_star`` for FedLSA (closed form, DESIGN §2):

        [mean_c (I - B_c^H)]^{-1} mean_c (I - B_c^H)(local_theta_star[c] - theta_star),
        B_c = I - eta A_bar[c],

    computed as ``(I - B_c^H)(theta_c* - theta*) = eta sum_{k<H} B_c^k (b_c - A_c theta*)``,
    which needs no local inverse.
    """
    eta = _validate.real("step_size", step_size, 0.0, low_open=True)
    H = _validate.integer("num_local_steps", num_local_steps)
    A, b, theta_star = _arrays(problem)
    N, d, _ = A.shape
    M = np.zeros((d, d))
    v = np.zeros(d)
    for c in range(N):
        B = np.eye(d) - eta * A[c]
        Bk = np.eye(d)
        acc = np.zeros(d)
        r = b[c] - A[c] @ theta_star
        for _ in range(H):
            acc += Bk @ r
            Bk = B @ Bk
        M += (np.eye(d) - Bk) / N
        v += eta * acc / N
    return np.linalg.solve(M, v)


def _binomial_inverse_mean(n: int, p: float, shift: int) -> float:
    """``E[1 / (shift + X)]`` for ``X ~ Binomial(n, p)``, ``shift >= 1``."""
    from math import comb

    return sum(comb(n, k) * p**k * (1 - p) ** (n - k) / (shift + k) for k in range(n + 1))


def _expected_weights(channel, N: int) -> tuple[float, float, float]:
    """``E[w_c]``, ``E[1{c in R} / |R|]`` and ``E[1{c, j in R} / |R|]`` (j != c)."""
    if not channel.quantizer.unbiased:
        _validate.fail("quantizer", channel.quantizer.describe(), "exact recursions need an unbiased quantizer")
    p = float(channel.success_prob)
    same = p * _binomial_inverse_mean(N - 1, p, 1)
    other = p * p * _binomial_inverse_mean(N - 2, p, 2) if N > 1 else 0.0
    server = p / N if channel.aggregation == "divide_by_n" else (1.0 - (1.0 - p) ** N) / N
    return server, same, other


def _round_maps(problem, algorithm):
    """Broadcast, local-step and aggregation matrices on Y, and index helpers.

    The aggregation matrix uses expected channel weights: exact for the mean,
    and for second moments only with an exact channel (checked by the callers).
    """
    name = algorithm.name
    if name not in ("fedlsa", "scafflsa", "qfedtd"):
        _validate.fail("algorithm", name, "exact recursions cover 'fedlsa', 'scafflsa' and 'qfedtd'")
    cfg = algorithm.config
    eta, H = float(cfg.step_size), int(cfg.num_local_steps)
    A, b, _ = _arrays(problem)
    N, d, _ = A.shape
    D = 1 + d + 2 * N * d
    if D > MAX_AUGMENTED_DIM:
        _validate.fail(
            "problem", f"N={N}, d={d}",
            f"the exact recursion's state has 1 + d + 2 N d = {D} > {MAX_AUGMENTED_DIM} coordinates",
        )
    th = slice(1, 1 + d)
    xi = [slice(1 + d + c * d, 1 + d + (c + 1) * d) for c in range(N)]
    loc = [slice(1 + d + (N + c) * d, 1 + d + (N + c + 1) * d) for c in range(N)]
    I = np.eye(d)
    w_server, w_same, w_other = _expected_weights(cfg.channel, N)

    L_b = np.eye(D)
    for c in range(N):
        L_b[loc[c], loc[c]] = 0.0
        L_b[loc[c], th] = I
    L_s = np.eye(D)
    for c in range(N):
        # QFedTD's message is the TD direction, i.e. its local iterate is theta + eta g: same map.
        L_s[loc[c], loc[c]] = I - eta * A[c]
        L_s[loc[c], 0] = eta * b[c]
        if name == "scafflsa":
            L_s[loc[c], xi[c]] = eta * I
    # Aggregation on the messages m_c = theta^c - theta: theta <- theta + sum_c E[w_c] m_c.
    L_a = np.eye(D)
    L_a[th, th] = (1.0 - N * w_server) * I
    for c in range(N):
        L_a[th, loc[c]] = w_server * I
    if name == "scafflsa":
        # xi_c <- xi_c + (sum_j E[1{c,j in R}/|R|] m_j - E[1{c in R}] m_c) / (eta H)
        p = float(cfg.channel.success_prob)
        for c in range(N):
            for j in range(N):
                coef = (w_same - p if j == c else w_other) / (eta * H)
                L_a[xi[c], loc[j]] += coef * I
                L_a[xi[c], th] -= coef * I
    return L_b, L_s, L_a, H, eta, th, loc


def _initial(problem, theta0, D, th):
    d = problem.dim
    m = np.zeros(D)
    m[0] = 1.0
    m[th] = np.zeros(d) if theta0 is None else np.asarray(theta0, np.float64)
    return m


def _require_iid(problem):
    if getattr(problem, "sampling", "generative") != "generative":
        _validate.fail("problem.sampling", problem.sampling, "exact recursions need i.i.d. ('generative') sampling")


def exact_mean(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``E[theta_t]`` for ``t = 0..num_rounds`` (shape ``(T+1, d)``), exact for i.i.d.
    observations, for FedLSA, SCAFFLSA and QFedTD, with any unbiased channel.

    For QFedTD: ``E[theta_{k+1}] = (I - alpha p_eff mean A_bar) E[theta_k] + alpha p_eff mean b_bar``
    with ``p_eff = p`` (``"divide_by_n"``) or ``1 - (1 - p)^N`` (``"divide_by_received"``).
    """
    _require_iid(problem)
    T = _validate.integer("num_rounds", num_rounds, 0)
    L_b, L_s, L_a, H, _, th, _ = _round_maps(problem, algorithm)
    L_round = L_a @ np.linalg.matrix_power(L_s, H) @ L_b
    m = _initial(problem, theta0, L_b.shape[0], th)
    out = [m[th].copy()]
    for _ in range(T):
        m = L_round @ m
        out.append(m[th].copy())
    return np.asarray(out)


def exact_mse(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``E|theta_t - theta_star|^2`` for ``t = 0..num_rounds``, exact for Gaussian LSA.

    Propagates the second moment of the augmented state (module docstring).
    """
    if not hasattr(problem, "noise_A"):
        _validate.fail("problem", type(problem).__name__, "exact_mse covers Gaussian LSA problems")
    if not algorithm.config.channel.trivial:
        _validate.fail("algorithm", algorithm.describe()["channel"], "exact_mse needs an exact channel")
    T = _validate.integer("num_rounds", num_rounds, 0)
    L_b, L_s, L_a, H, eta, th, loc = _round_maps(problem, algorithm)
    sA = np.asarray(problem.noise_A, np.float64)
    sb = np.asarray(problem.noise_b, np.float64)
    theta_star = np.asarray(problem.theta_star, np.float64)
    d = problem.dim
    m = _initial(problem, theta0, L_b.shape[0], th)
    S = np.outer(m, m)

    def mse(S):
        return np.trace(S[th, th]) - 2 * theta_star @ S[0, th] + theta_star @ theta_star

    out = [mse(S)]
    for _ in range(T):
        S = L_b @ S @ L_b.T
        for _ in range(H):
            noise = [eta**2 * (sA[c] ** 2 * np.trace(S[l, l]) + sb[c] ** 2) for c, l in enumerate(loc)]
            S = L_s @ S @ L_s.T
            for c, l in enumerate(loc):
                S[l, l] += noise[c] * np.eye(d)
        S = L_a @ S @ L_a.T
        out.append(mse(S))
    return np.asarray(out)
