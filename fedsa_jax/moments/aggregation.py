"""The uplink's aggregate in an exact moment recursion: the joint moments of the channel.

One phase, :func:`aggregate`, carries everything that happens between the agents' messages and the
server's aggregate, because their moments do not factor per mechanism: erasure weights and either
aggregation rule, a cohort's inclusion probabilities, an unbiased quantizer's error covariance,
privacy noise, and (:class:`CompressedAggregation`) a random linear compressor with or without error
feedback (:func:`channel_memory`).
"""

from __future__ import annotations

import math
from math import lgamma

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.moments.state import Affine, Augmented

__all__ = ["aggregate", "channel_memory"]


def aggregate(
    y: Augmented,
    channel,
    into: str = "theta",
    reference: str = "theta",
    iterates: str = "loc",
    control_variates: str | None = None,
    denominator: float | tuple[float, ...] | None = None,
    clients_per_round: int | None = None,
    memory: str = "mem",
) -> Affine:
    """``server_update`` through ``channel``: ``into <- reference + sum_c w_c q(m_c)``,
    ``m_c = iterates_c - reference``, with the channel's random weights (erasures, either
    aggregation rule) and quantizer (unbiased; for second moments identity or rand-k).

    ``control_variates``: also ``control_variate_update`` of that per-agent block in the same map,
    ``xi_c <- xi_c + (sum_j E[1{c,j in R}/|R|] m_j - E[1{c in R}] m_c) / denominator`` (its mean;
    exact second moments with an exact channel only).

    ``clients_per_round = m``: only a cohort S of m agents, drawn uniformly without replacement
    and independently of the state, sends; R becomes ``S ∩ R`` and the weights are ``1/m``
    (``"divide_by_n"``) or ``1/|S ∩ R|`` on it. Their moments follow from ``P(c in S) = m/N``,
    ``P(c, j in S) = m(m-1)/(N(N-1))`` (and so on for more agents) with the erasures independent
    of S. The agents outside S may be modelled as running their local steps too: their work is
    not read (the next :func:`broadcast` overwrites it), and their control variates do not move.
    None or N: every agent (the same maps as without the argument).

    A biased compressor that is a random linear map of the message (unscaled rand-k), and error
    feedback (EF14, EF21, its memory in the block ``memory``, see :func:`channel_memory`) with one
    (rand-k, scaled or not), are exact too (``"divide_by_n"``, no control variates): the round stays
    linear in Y given the round's randomness (:class:`CompressedAggregation`). Top-k and scaled sign
    are refused: they are not linear in the message."""
    q = channel.quantizer
    privacy = getattr(channel, "privacy", None)
    if privacy is not None and privacy.clip:
        _validate.fail(
            "privacy",
            privacy.describe(),
            "clipping is not linear in the message: no exact moment recursion (simulate it; "
            "fj.channel.privacy(..., clip=False), the noise alone, is exact and is the reference)",
        )
    if q.kind in ("top_k", "scaled_sign"):
        name = q.kind.replace("_", "-")
        _validate.fail(
            "quantizer",
            q.describe(),
            f"{name} is not linear in the message (C(x) != M x with M independent of x): "
            "no exact moment recursion, with or without error feedback",
        )
    if channel.error_feedback is None and (q.unbiased or not q.linear):  # the second refused there
        return Aggregation(
            y, channel, reference, into, iterates, control_variates, denominator, clients_per_round
        )
    if privacy is not None:
        _validate.fail(
            "privacy",
            privacy.describe(),
            "no exact recursion for privacy noise with a biased compressor or error feedback (simulate it)",
        )
    if _cohort_size(clients_per_round, y.N) is not None:
        _validate.fail(
            "clients_per_round",
            clients_per_round,
            "no exact recursion for a cohort with a biased compressor or error feedback (simulate it; "
            f"None or N = {y.N} here)",
        )
    return CompressedAggregation(y, channel, reference, into, iterates, control_variates, memory)


class Aggregation(Affine):
    """The server's aggregate through the uplink channel (:func:`aggregate`)."""

    def __init__(
        self,
        y: Augmented,
        channel,
        reference: str,
        into: str,
        iterates: str,
        control_variates: str | None,
        denominator: float | tuple[float, ...] | None,
        clients_per_round: int | None = None,
    ):
        self.channel, self.reference, self.into, self.iterates = channel, reference, into, iterates
        self.control_variates, self.denominator = control_variates, denominator
        channel.quantizer.check_dim(y.d)
        self.m = _cohort_size(clients_per_round, y.N)
        channel_key = _channel_key(channel)
        self.weights = y.memo(  # E[w_c], E[1{c in R} / |R|], E[1{c, j in R} / |R|]
            ("weights", channel_key, self.m), lambda: _expected_weights(channel, y.N, self.m)
        )
        self.w_server = self.weights[0]
        key = ("aggregate", reference, into, iterates, control_variates, denominator, self.m, channel_key)
        super().__init__(y, self._build, key)

    def coefficients(self) -> tuple[float, float, float]:
        """``(w, own, other)`` of the mean map: ``a <- (1 - N w) ref + w sum_c loc_c`` and, with control
        variates, ``xi_c <- xi_c + own m_c + other sum_{j != c} m_j`` (0, 0 without)."""
        if not self.control_variates:
            return self.w_server, 0.0, 0.0
        y, m = self.y, self.m
        _, w_same, w_other = self.weights
        p = float(self.channel.success_prob) if m is None else _inclusion(self.channel, y.N, m, 1, 0)
        one = isinstance(self.denominator, tuple)  # per agent: divided in _build
        denominator = 1.0 if one else float(self.denominator)  # pyright: ignore[reportArgumentType]
        return self.w_server, (w_same - p) / denominator, w_other / denominator

    def _build(self) -> np.ndarray:
        """``a <- ref + sum_c E[w_c] (loc_c - ref)`` and the control variates' mean step against it:
        ``xi_c <- xi_c + (sum_j E[1{c,j in R}/|R|] m_j - E[1{c in R}] m_c) / denominator`` (R: ``S ∩ R``
        with a cohort of m agents)."""
        y = self.y
        w, own, other = self.coefficients()
        L = np.eye(y.D)
        N, d, ref, into = y.N, y.d, y[self.reference], y[self.into]
        loc = y.indices(self.iterates)
        L[into] = 0.0
        L[into, ref] = (1.0 - N * w) * np.eye(d)
        L[into, loc] = np.tile(w * np.eye(d), N)
        if self.control_variates:
            xi = y.indices(self.control_variates)
            coef = np.full((N, N), other) + (own - other) * np.eye(N)
            row = np.full(N, own + (N - 1) * other)
            if isinstance(self.denominator, tuple):  # one per agent: agent c's row over D_c
                inv = 1.0 / np.asarray(self.denominator, float)
                coef, row = coef * inv[:, None], row * inv
            L[np.ix_(xi, loc)] += np.kron(coef, np.eye(d))
            L[xi, ref] -= np.kron(row[:, None], np.eye(d))
        return L

    def _channel_moments(self):
        """``(Cov(w_c, w_c), Cov(w_c, w_j), E[w_c^2], V)`` of the channel."""
        ch, y = self.channel, self.y

        def build():
            quant = _quantizer_covariance(ch.quantizer, y.d)
            c_same, c_other = _weight_covariance(ch, y.N, self.m)
            return c_same, c_other, c_same + _server_weight(ch, y.N, self.m) ** 2, quant

        return y.memo(("channel", _channel_key(ch), self.m), build)

    @property
    def noiseless(self) -> bool:
        c_same, c_other, _, _ = self._channel_moments()
        noise = self.channel.privacy is not None and self.channel.privacy.noise_std > 0
        return not (c_same or c_other or noise or self.channel.quantizer.kind != "identity")

    def _privacy_noise(self) -> tuple[float, float]:
        """``(local, central)``: the variance ``sigma^2 C^2`` of the privacy noise on each message
        (local mode) and what the central noise adds to each coordinate of the aggregate's second
        moment, ``E[1{|R| > 0} w^2] sigma^2 C^2`` with w the weight of a delivered message."""
        privacy, y = self.channel.privacy, self.y
        if privacy is None:
            return 0.0, 0.0
        s2 = privacy.noise_std**2
        if privacy.mode == "local":
            return s2, 0.0
        n = y.N if self.m is None else self.m
        p = float(self.channel.success_prob)
        k = np.arange(1, n + 1)
        received = np.array([math.comb(n, int(j)) for j in k]) * p**k * (1 - p) ** (n - k)  # P(|R| = k)
        unit_sq = (
            received.sum() / n**2 if self.channel.aggregation == "divide_by_n" else np.sum(received / k**2)
        )
        return 0.0, float(unit_sq) * s2

    def prepare(self) -> None:
        if isinstance(self.denominator, tuple) and (not self.channel.trivial or self.m is not None):
            _validate.fail(
                "algorithm",
                self.channel.describe(),
                "control variates with one denominator per agent (local work) are exact with an exact "
                "channel and every agent only",
            )
        if self.control_variates and not self.channel.trivial:
            _validate.fail(
                "algorithm",
                self.channel.describe(),
                f"exact_mse covers {self.y.title or self.y.name} with an exact channel only "
                "(identity quantizer, success_prob=1); exact_mean covers any unbiased channel",
            )
        self._channel_moments()

    def channel_noise(self, own: np.ndarray, total: np.ndarray) -> np.ndarray:
        """What the channel adds to the aggregate's second moment (no control variates), from the
        messages' ``own = E[m_c m_c^T] (N, d, d)`` and ``total = sum_{c,j} E[m_c m_j^T] (d, d)``."""
        c_same, c_other, w_sq, quant = self._channel_moments()
        local, central = self._privacy_noise()  # the Gaussian mechanism without clipping
        N, eye = len(own), np.eye(own.shape[-1])
        noisy = own + local * eye  # E[m~_c m~_c^T], m~_c = m_c + noise_c (local mode)
        diag_sum = own.sum(0)
        extra = c_same * (diag_sum + N * local * eye) + c_other * (total - diag_sum)
        extra = extra + w_sq * sum(quant(noisy[c]) for c in range(N))
        w = _server_weight(self.channel, self.y.N, self.m)
        return extra + (N * w**2 * local + central) * eye

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        """Erasure weights and quantizer errors of mean zero add ``sum_{c,j} Cov(w_c, w_j) E[m_c m_j^T]
        + sum_c E[w_c^2] V(E[m_c m_c^T])`` to the aggregate, ``m_c = loc_c - ref``."""
        y = self.y
        N, d = y.N, y.d
        extra = None
        if not self.noiseless:
            loc_idx, ref_idx = y.indices(self.iterates), y.indices(self.reference)
            ref = y[self.reference]
            Sl = S[np.ix_(loc_idx, loc_idx)].reshape(N, d, N, d)
            cross = S[np.ix_(loc_idx, ref_idx)].reshape(N, d, d)  # E[loc_c ref^T]
            # E[m_c m_j^T] for the messages m_c = loc_c - ref
            M = (
                Sl
                - cross[:, :, None, :]
                - np.transpose(cross, (2, 0, 1))[None]
                + S[ref, ref][None, :, None, :]
            )
            if self.control_variates:  # a cohort's random weights move the control variates too
                rows = np.concatenate([y.indices(self.into), y.indices(self.control_variates)])
                extra = _cohort_control_variate_noise(self, M)
            else:
                extra = self.channel_noise(np.einsum("cicj->cij", M), np.einsum("cidj->ij", M))
        S = conjugate(self.mean(), S)
        if extra is not None and self.control_variates:
            S[np.ix_(rows, rows)] += extra
        elif extra is not None:  # the channel's noise enters the aggregate
            into = y[self.into]
            S[into, into] += extra
        return S


class CompressedAggregation(Affine):
    """The aggregate through a compressor that is a random linear map ``C(x) = M_c x`` (rand-k,
    ``M_c`` a random diagonal independent of everything else), with or without error feedback,
    erasures ``delta_c ~ Bernoulli(p)`` and ``"divide_by_n"`` (:func:`aggregate`).

    With ``x_c`` what agent c compresses (``m_c``, ``m_c + e_c`` or ``m_c - g_c``, ``m_c = loc_c -
    ref``) and ``r_c = delta_c M_c x_c`` what arrives, the round is

        no EF, EF14:  a <- ref + (1/N) sum_c r_c;      EF14: e_c <- e_c + delta_c m_c - r_c,
        EF21:         a <- ref + (1/N) sum_c (g_c + r_c),     g_c <- g_c + r_c,

    linear in Y given ``(delta_c, M_c)``, independent across agents. So ``Y' = L Y + sum_c z_c`` with
    ``L`` the mean map (``E[M] = mu I``, ``E[delta] = p``) and ``z_c`` of mean zero given Y,
    uncorrelated across agents: ``E[Y' Y'^T] = L S L^T + sum_c E[z_c z_c^T]``, where
    ``E[r r^T] = p W (.) E[x x^T]`` (``W_ij = E[M_ii M_jj]``), ``E[r (delta m)^T] = p mu E[x m^T]``
    and ``E[delta m m^T] = p E[m m^T]``."""

    noiseless = False

    def __init__(self, y: Augmented, channel, reference, into, iterates, control_variates, memory):
        q, ef = channel.quantizer, channel.error_feedback
        what = "a biased compressor" if ef is None else f"error feedback ({ef})"
        if control_variates is not None:
            _validate.fail(
                "algorithm",
                channel.describe(),
                f"exact recursions with {what} cover algorithms without control variates only",
            )
        if not q.linear:
            _validate.fail(
                "quantizer",
                q.describe(),
                f"exact recursions with {what} need a compressor that is a random linear map of the "
                "message (rand_k(k), scaled or not)",
            )
        if channel.aggregation != "divide_by_n":
            _validate.fail(
                "aggregation", channel.aggregation, f"exact recursions with {what} need 'divide_by_n'"
            )
        if ef is not None and memory not in y:
            _validate.fail(
                "memory",
                memory,
                "error feedback needs the memory block: call fj.theory.channel_memory(y, channel) first",
            )
        q.check_dim(y.d)
        self.channel, self.reference, self.into, self.iterates = channel, reference, into, iterates
        self.memory = memory  # read only with error feedback
        self.p = float(channel.success_prob)
        d, k = y.d, q.k
        scale = 1.0 if q.unscaled else d / k
        self.mu = scale * k / d
        off = scale * scale * k * (k - 1) / (d * (d - 1)) if d > 1 else 0.0
        self.W = np.full((d, d), off)
        np.fill_diagonal(self.W, scale * scale * k / d)
        key = ("compressed", reference, into, iterates, memory, _channel_key(channel))
        super().__init__(y, self._build, key)

    def _operators(self, c: int):
        """``(P, Pm, U, V)``: ``x_c = P Y``, ``m_c = Pm Y`` (d, D); ``U``, ``V`` (D, d) place ``r_c``
        and ``delta_c m_c`` into Y'."""
        y, ef = self.y, self.channel.error_feedback
        I = np.eye(y.d)
        Pm = np.zeros((y.d, y.D))
        Pm[:, y[self.iterates][c]] += I
        Pm[:, y[self.reference]] -= I
        P, U, V = Pm.copy(), np.zeros((y.D, y.d)), np.zeros((y.D, y.d))
        U[y[self.into]] = I / y.N
        if ef is not None:
            mem = y[self.memory][c]
            P[:, mem] += I if ef == "ef14" else -I
            U[mem] = -I if ef == "ef14" else I
            if ef == "ef14":
                V[mem] = I
        return P, Pm, U, V

    def _build(self) -> np.ndarray:
        y, p, mu = self.y, self.p, self.mu
        L = np.eye(y.D)
        into = y[self.into]
        L[into] = 0.0
        L[into, y[self.reference]] = np.eye(y.d)
        for c in range(y.N):
            P, Pm, U, V = self._operators(c)
            L += p * mu * U @ P + p * V @ Pm
            if self.channel.error_feedback == "ef21":
                L[into, y[self.memory][c]] += np.eye(y.d) / y.N
        return L

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        y, p, mu = self.y, self.p, self.mu
        ops = y.memo(("compressed ops", self.key), lambda: [self._operators(c) for c in range(y.N)])
        extra = np.zeros_like(S)
        for P, Pm, U, V in ops:
            X = P @ S @ P.T
            noise = U @ (p * self.W * X - (p * mu) ** 2 * X) @ U.T
            if self.channel.error_feedback == "ef14":
                B = (p * mu - p * p * mu) * (P @ S @ Pm.T)
                noise += U @ B @ V.T + V @ B.T @ U.T + (p - p * p) * V @ (Pm @ S @ Pm.T) @ V.T
            extra += noise
        return conjugate(self.mean(), S) + extra


def channel_memory(y: Augmented, channel, name: str = "mem") -> None:
    """The senders' error-feedback memory as a carried per-agent block ``name`` (EF14's ``e_c``,
    EF21's ``g_c``, 0 at start), added only when ``channel.error_feedback`` is set: call it with the
    other blocks, before :func:`aggregate` reads it."""
    if channel.error_feedback is not None:
        y.add(name, per_agent=True, carried=True)


def _channel_key(channel) -> tuple:
    """A channel's value as a cache key: maps and moments built for one channel serve only an equal
    one (not its ``id``, which a freed channel's successor may reuse)."""
    return (
        float(channel.success_prob),
        channel.quantizer,
        channel.aggregation,
        channel.erasures,
        channel.error_feedback,
        channel.privacy,
    )


def _binomial_inverse_mean(n: int, p: float, shift: int, power: int = 1) -> float:
    """``E[1 / (shift + X)^power]`` for ``X ~ Binomial(n, p)``, ``shift >= 1`` (log-space
    probabilities, so any n)."""
    if p == 1.0:
        return 1.0 / (shift + n) ** power
    k = np.arange(n + 1)
    log_pmf = (
        lgamma(n + 1)
        - np.array([lgamma(i + 1) + lgamma(n - i + 1) for i in k])
        + k * np.log(p)
        + (n - k) * np.log1p(-p)
    )
    return float(np.sum(np.exp(log_pmf) / (shift + k) ** power))


def _cohort_size(clients_per_round, N: int) -> int | None:
    """The cohort size m when ``clients_per_round < N`` (None: every agent); refuses m > N."""
    if clients_per_round is None:
        return None
    m = _validate.integer("clients_per_round", clients_per_round)
    if m > N:
        _validate.fail("clients_per_round", m, f"expected at most N = {N} (the problem's agents)")
    return None if m == N else m


def _inclusion(channel, N: int, m: int, s: int, power: int) -> float:
    """``E[1{s given agents in K} / |K|^power]`` for the senders ``K = S ∩ R``: S a uniform cohort
    of m of the N agents (``P(s given in S) = prod_{i<s} (m - i)/(N - i)``), R independent
    erasures of success probability p (``|K| - s ~ Binomial(m - s, p)`` given the s in K)."""
    if s > m:
        return 0.0
    p = float(channel.success_prob)
    chosen = float(np.prod([(m - i) / (N - i) for i in range(s)])) * p**s
    return chosen if power == 0 else chosen * _binomial_inverse_mean(m - s, p, s, power)


def _server_weight(channel, N: int, m: int | None = None) -> float:
    """``E[w_c]``: ``p / N`` (``"divide_by_n"``) or ``E[1{c in R} / |R|] = (1 - (1 - p)^N) / N``;
    with a cohort of m agents ``p / N`` or ``E[1{c in S ∩ R} / |S ∩ R|]``."""
    p = float(channel.success_prob)
    if m is not None:
        by_n = channel.aggregation == "divide_by_n"
        return _inclusion(channel, N, m, 1, 0) / m if by_n else _inclusion(channel, N, m, 1, 1)
    return p / N if channel.aggregation == "divide_by_n" else (1.0 - (1.0 - p) ** N) / N


def _expected_weights(channel, N: int, m: int | None = None) -> tuple[float, float, float]:
    """``E[w_c]``, ``E[1{c in R} / |R|]`` and ``E[1{c, j in R} / |R|]`` (j != c); with a cohort
    of m agents R is ``S ∩ R``."""
    if not channel.quantizer.unbiased:
        _validate.fail(
            "quantizer", channel.quantizer.describe(), "exact recursions need an unbiased quantizer"
        )
    if m is not None:
        same, other = _inclusion(channel, N, m, 1, 1), _inclusion(channel, N, m, 2, 1)
        return _server_weight(channel, N, m), same, other
    p = float(channel.success_prob)
    same = p * _binomial_inverse_mean(N - 1, p, 1)
    other = p * p * _binomial_inverse_mean(N - 2, p, 2) if N > 1 else 0.0
    return _server_weight(channel, N), same, other


def _weight_covariance(channel, N: int, m: int | None = None) -> tuple[float, float]:
    """``Cov(w_c, w_c)`` and ``Cov(w_c, w_j)`` (j != c) of the random aggregation weights (with a
    cohort of m agents: ``w_c = 1{c in S ∩ R} / m`` or ``/ |S ∩ R|``)."""
    if m is not None:
        power, scale = (0, 1.0 / m) if channel.aggregation == "divide_by_n" else (1, 1.0)
        mean = scale * _inclusion(channel, N, m, 1, power)
        same = scale**2 * _inclusion(channel, N, m, 1, 2 * power) - mean**2
        return same, scale**2 * _inclusion(channel, N, m, 2, 2 * power) - mean**2
    p = float(channel.success_prob)
    if not channel.erasures or p == 1.0:
        return 0.0, 0.0
    if channel.aggregation == "divide_by_n":
        return p * (1 - p) / N**2, 0.0
    mean = _server_weight(channel, N)
    same = p * _binomial_inverse_mean(N - 1, p, 1, 2) - mean**2
    other = (p * p * _binomial_inverse_mean(N - 2, p, 2, 2) if N > 1 else 0.0) - mean**2
    return same, other


def _quantizer_covariance(quantizer, d: int):
    """``V(Sigma)``: covariance of ``Q(x) - x`` given ``E[x x^T] = Sigma``, linear in
    Sigma for the identity and rand-k (k of d coordinates without replacement, scaled
    by d/k: ``E[Q Q^T]_ii = (d/k) x_i^2``, ``E[Q Q^T]_ij = d (k-1) / (k (d-1)) x_i x_j``)."""
    if quantizer.kind == "identity":
        return lambda S: np.zeros_like(S)
    if quantizer.kind == "rand_k":
        k = quantizer.k
        diag = d / k - 1.0
        off = (d * (k - 1) / (k * (d - 1)) - 1.0) if d > 1 else 0.0
        W = np.full((d, d), off)
        np.fill_diagonal(W, diag)
        return lambda S: W * S
    _validate.fail(
        "quantizer",
        quantizer.describe(),
        "exact second moments need a quantizer whose error covariance is linear in x x^T: "
        "identity() or rand_k(k)",
    )


def _cohort_control_variate_noise(phase: Aggregation, M: np.ndarray) -> np.ndarray:
    """The second moment a cohort's random weights add to the rows ``Z = (into, xi_1..xi_N)`` of an
    aggregation with control variates (exact channel). On Z the phase is ``Z <- Z_0 + sum_j C_j
    m_j`` with random scalars ``C_j[0] = w_j`` and ``C_j[1 + c] = (1{c, j in S}/m - 1{c = j in
    S}) / denominator``, independent of the state, so ``E[Z Z^T]`` exceeds the mean map's by
    ``sum_{j,k} Cov(C_j, C_k) (x) E[m_j m_k^T]``; ``M (N, d, N, d)`` holds ``E[m_j m_k^T]``."""
    y, N, d = phase.y, phase.y.N, phase.y.d

    def build():
        return _coefficient_covariance(phase.channel, N, phase.m, float(phase.denominator))  # pyright: ignore[reportArgumentType]

    cov = y.memo(("cohort noise", _channel_key(phase.channel), phase.m, phase.denominator), build)
    return np.einsum("ajbk,jxky->axby", cov, M).reshape((N + 1) * d, (N + 1) * d)


def _coefficient_covariance(channel, N: int, m: int, denominator: float) -> np.ndarray:
    """``Cov(C_j[a], C_k[b])`` ``(N + 1, N, N + 1, N)`` for :func:`_cohort_control_variate_noise`. Each
    coefficient is a sum of monomials ``coef prod_{i in A} 1{i in K} / |K|^power`` (K the senders), and
    a product of two is the monomial of the union: its mean is :func:`_inclusion`."""
    by_n = channel.aggregation == "divide_by_n"

    def monomials(a: int, j: int) -> list:
        if a == 0:  # the server weight w_j
            return [({j}, 0, 1.0 / m)] if by_n else [({j}, 1, 1.0)]
        c = a - 1
        out = [({c, j}, 1, 1.0 / denominator)]
        return out + [({j}, 0, -1.0 / denominator)] if c == j else out

    moment = {}

    def mean(size: int, power: int) -> float:
        if (size, power) not in moment:
            moment[size, power] = _inclusion(channel, N, m, size, power)
        return moment[size, power]

    terms = [[monomials(a, j) for j in range(N)] for a in range(N + 1)]
    first = np.array([[sum(co * mean(len(A), pw) for A, pw, co in t) for t in row] for row in terms])
    second = np.empty((N + 1, N, N + 1, N))
    for a in range(N + 1):
        for j in range(N):
            for b in range(N + 1):
                for k in range(N):
                    second[a, j, b, k] = sum(
                        c1 * c2 * mean(len(A1 | A2), p1 + p2)
                        for A1, p1, c1 in terms[a][j]
                        for A2, p2, c2 in terms[b][k]
                    )
    return second - first[:, :, None, None] * first[None, None, :, :]
