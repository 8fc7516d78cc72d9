"""Building blocks of exact moment recursions: an algorithm describes its round with them, and
:func:`fedsa_jax.theory.exact_mean` and :func:`~fedsa_jax.theory.exact_mse` run the description.

With i.i.d. observations every update of a federated LSA algorithm built from the simulation blocks
(:mod:`fedsa_jax.algorithms`) is affine in a joint state given the round's noise. An algorithm
lays that state out as an :class:`Augmented` vector

    Y = (1, theta, <its own blocks: control variates, local iterates, optimizer state, averages...>)

in **error coordinates** (every iterate minus ``theta_star``, so the MSE is read with no
cancellation), and describes round t as a list of **phases**, each ``Y <- L Y + w`` with a
constant matrix L and a noise w of mean zero given Y. The mean follows ``m <- L m``; the second
moment ``S = E[Y Y^T]`` follows ``S <- L S L^T + E[w w^T]`` with ``E[w w^T]`` linear in S. The
phases mirror the simulation blocks:

==========================================  ============================================================
simulation                                  phase
==========================================  ============================================================
agents start from theta (``run_agents``)     :func:`broadcast` (``loc_c <- theta``)
one local step (``local_updates``)           :func:`local_step`: ``loc_c <- (I - eta A_bar[c]) loc_c
                                             - eta rho_c + eta xi_c + w_c``, w_c from the problem's
                                             ``noise_second_moment()`` or ``finite_support()``
``server_update`` (+ the channel)            :func:`aggregate`: ``a <- ref + sum_c E[w_c](loc_c - ref)``;
                                             erasure weights and quantizer noise enter S exactly;
                                             error feedback's memory: :func:`channel_memory`
``control_variate_update``                   ``aggregate(..., control_variates="xi", denominator=...)``
a compressed downlink (``broadcast`` of        :func:`downlink_blocks`, :func:`downlink` (``hat <- hat +
:mod:`fedsa_jax.channel.downlink`)           C(theta - hat)``), :func:`shift`; agents start from hat
``fj.optim.server_step``                     :func:`server_step` (an affine optax optimizer, probed)
a coin (communicate with probability p)      :func:`coin`
``fj.averaged``                              :func:`averaging`
anything else affine                         :func:`assign`, :func:`agents_mean`, :class:`Affine`
==========================================  ============================================================

``rho_c = A_bar[c] theta_star - b_bar[c]`` (float64) is the constant of a local step in error
coordinates. :func:`chain` groups phases (one map, cached: a local step and its coin). A
:class:`Recursion` holds the state and the round (``round(t, etas) -> phases``, ``etas`` the
round's H local step sizes, a schedule's values included); a :class:`Combination` is a linear
combination of other algorithms' means (Richardson-Romberg). An algorithm passes its
description as ``fj.Algorithm(..., theory=fn)`` with ``fn(config, problem) -> Recursion``.

Example (server momentum on the agents' mean, ``v <- beta v + (mean - theta)``, ``theta <- theta + v``)::

    def fedavgm_theory(config, problem):
        y = fj.theory.Augmented(problem)
        y.add("loc", per_agent=True)             # the agents' iterates
        y.add("velocity", carried=True)          # kept across rounds (starts at 0)
        y.add("mean")                            # scratch: the aggregate
        b = float(config.momentum)
        server = fj.theory.assign(y, velocity={"velocity": b, "mean": 1.0, "theta": -1.0},
                                  theta={"velocity": b, "mean": 1.0})
        def round(t, etas):
            return [fj.theory.broadcast(y), *(fj.theory.local_step(y, eta) for eta in etas),
                    fj.theory.aggregate(y, fj.channel.channel(), into="mean"), server]
        return fj.theory.Recursion(y, round, config.step_size, config.num_local_steps)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from math import lgamma
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.problems.protocol import check_linear, direction_second_moment

__all__ = [
    "MAX_AUGMENTED_DIM",
    "START",
    "Affine",
    "Augmented",
    "Combination",
    "Recursion",
    "agents_mean",
    "aggregate",
    "assign",
    "averaging",
    "broadcast",
    "chain",
    "channel_memory",
    "coin",
    "downlink",
    "downlink_blocks",
    "local_step",
    "random_stop",
    "rebase",
    "recursion_of",
    "scale_updates",
    "server_step",
    "shift",
]

MAX_AUGMENTED_DIM = 2000
CACHE_SIZE = 32  # maps kept per state (a constant step needs a handful; a schedule's are used once each)


def START(error0: np.ndarray) -> np.ndarray:
    """Initial mean of a block that starts at the initial iterate: ``theta_0 - theta_star``."""
    return error0


class Augmented:
    """The augmented state Y of an exact recursion: named blocks (error coordinates), their initial
    means, and a cache of the maps built on it.

    ``Augmented(problem)`` holds the blocks ``one`` (the constant 1, column of the affine terms) and
    ``theta`` (the server iterate, starting at ``theta_0``). :meth:`add` appends a block; after
    the first read of the layout (``y["theta"]``, ``y.D``) no block can be added. The problem's
    float64 ``A_bar`` (``y.A``), ``theta_star`` and residuals ``rho = A_bar theta_star - b_bar``
    (``y.rho``, (N, d)) are attributes, with ``y.N`` and ``y.d``.

    Args:
      problem: the problem (its mean system is read with numpy).
      title: how refusals name the algorithm (default: its name).
      theta_carried: whether theta persists across rounds (:func:`fedsa_jax.theory.max_stable_step_size`
        takes the spectral radius of a round on the carried blocks); False when a round recomputes it.
    """

    def __init__(self, problem, title: str | None = None, theta_carried: bool = True):
        A, _, theta_star = _arrays(problem)
        self.problem, self.name, self.title = problem, None, title
        self.A, self.theta_star, self.rho = A, theta_star, _residuals(problem)
        self.N, self.d = self.rho.shape
        self._specs: list[tuple[str, int, bool, Callable | None]] = []
        self.carried: list[str] = []
        self.zero_sum: list[str] = []
        self.zero_sum_weights: dict[str, np.ndarray] = {}  # a zero_sum block's weights w_c (default 1)
        self._slices: dict[str, Any] | None = None
        self._cache: dict = {}
        self._memo: dict = {}
        self.add("one", 1, initial=lambda e0: 1.0)
        self.add("theta", initial=START, carried=theta_carried)

    def add(
        self,
        name: str,
        size: int | None = None,
        per_agent: bool = False,
        initial: Callable | None = None,
        carried: bool = False,
        zero_sum: bool | Sequence[float] = False,
    ) -> None:
        """Append a block of ``size`` coordinates (default d), one per agent if ``per_agent``.

        ``initial(theta_0 - theta_star) -> values`` gives its initial mean (default 0; :data:`START`:
        the initial iterate). ``carried``: the block persists across rounds (stability).
        ``zero_sum`` (per-agent blocks): their sum over agents stays 0 (control variates);
        stability is taken on that subspace; a sequence of N weights: ``sum_c w_c x_c`` stays 0
        instead (SCAFFLSA's control variates under unequal local work keep ``sum_c D_c xi_c``).
        """
        if self._slices is not None:
            _validate.fail("block", name, "add every block before reading the layout (y[...], y.D)")
        if name in self:
            _validate.fail("block", name, f"a block of that name exists: {[n for n, *_ in self._specs]}")
        self._specs.append((name, self.d if size is None else int(size), per_agent, initial))
        if carried:
            self.carried.append(name)
        if zero_sum is not False:
            self.zero_sum.append(name)
        if zero_sum is not False and zero_sum is not True:
            self.zero_sum_weights[name] = np.asarray(zero_sum, np.float64)

    @property
    def per_agent(self) -> list[str]:
        """The names of the per-agent blocks, in order."""
        return [name for name, _, per_agent, _ in self._specs if per_agent]

    def zero_sum_constraint(self, name: str) -> np.ndarray:
        """``(n, N n)``: the map ``x -> sum_c w_c x_c`` of a zero-sum per-agent block of size n."""
        w = self.zero_sum_weights.get(name, np.ones(self.N))
        size = len(self.indices(name)) // self.N
        return np.kron(w[None, :], np.eye(size))

    def __contains__(self, name: str) -> bool:
        return any(n == name for n, *_ in self._specs)

    def _layout(self) -> dict[str, Any]:
        if self._slices is None:
            blocks = []
            for name, size, per_agent, _ in self._specs:
                blocks += [(f"{name}{c}", size) for c in range(self.N)] if per_agent else [(name, size)]
            D = sum(n for _, n in blocks)
            self._blocks = blocks
            starts = np.cumsum([0] + [n for _, n in blocks])
            flat = {b: slice(int(s), int(s) + n) for (b, n), s in zip(blocks, starts)}
            self._slices = {
                name: [flat[f"{name}{c}"] for c in range(self.N)] if per_agent else flat[name]
                for name, _, per_agent, _ in self._specs
            }
            self._D = int(D)
        return self._slices

    @property
    def D(self) -> int:
        """Dimension of Y."""
        self._layout()
        return self._D

    @property
    def dense(self) -> bool:
        """Whether maps and moments over the whole of Y are allowed (``D <= MAX_AUGMENTED_DIM``)."""
        return self.D <= MAX_AUGMENTED_DIM

    def require_dense(self, why: str = "") -> None:
        """Refuses a state of more than ``MAX_AUGMENTED_DIM`` coordinates (a map or a second moment
        over the whole of Y is D x D), naming its blocks' sizes (and ``why`` no shortcut applied)."""
        if self.dense:
            return
        kinds: dict[str, list[int]] = {}  # a block per agent is counted, not listed: N may be large
        for b, n in self._blocks:
            kinds.setdefault(b.rstrip("0123456789"), []).append(n)
        parts = [f"{len(ns)} x {ns[0]} ({b})" if len(ns) > 1 else f"{ns[0]} ({b})" for b, ns in kinds.items()]
        sizes = " + ".join(part for part, ns in zip(parts, kinds.values()) if ns[0])
        _validate.fail(
            "problem",
            f"N={self.N}, d={self.d}",
            f"the exact recursion's state for {self.name} has {self.D} coordinates ({sizes}) > "
            f"MAX_AUGMENTED_DIM = {MAX_AUGMENTED_DIM}" + (f" ({why})" if why else ""),
        )

    def __getitem__(self, name: str):
        """A block's slice of Y (a list of N slices for a per-agent block)."""
        return self._layout()[name]

    def indices(self, name: str) -> np.ndarray:
        """The coordinates of a block (all agents' in order for a per-agent block)."""

        def build():
            parts = self[name] if isinstance(self[name], list) else [self[name]]
            every = np.arange(self.D)
            return np.concatenate([every[sl] for sl in parts])

        return self.memo(("indices", name), build)

    def memo(self, key, build):
        """``build()`` once per key (small derived values: indices, channel moments, the noise model)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def cached(self, key, build):
        """``build()`` cached under ``key`` (the last ``CACHE_SIZE`` maps are kept)."""
        if key not in self._cache:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))  # the oldest
            self._cache[key] = build()
        return self._cache[key]

    @property
    def noise(self):
        """The problem's local noise covariance ``cov(m, X) -> (N, d, d)`` (:func:`noise_model`)."""
        return self.memo("noise", lambda: noise_model(self.problem))

    def initial(self, theta0=None) -> np.ndarray:
        """``E[Y_0]`` for the initial iterate ``theta0`` (default 0)."""
        d = self.d
        e0 = -self.theta_star
        if theta0 is not None:
            theta0 = _validate.array("theta0", theta0, 1)
            if theta0.shape != (d,):
                _validate.fail("theta0", theta0, f"expected shape ({d},) to match the problem's dimension")
            e0 = theta0 - self.theta_star
        m = np.zeros(self.D)
        for name, _, per_agent, initial in self._specs:
            if initial is not None:
                for sl in self[name] if per_agent else [self[name]]:
                    m[sl] = initial(e0)
        return m


# -- phases ----------------------------------------------------------------------------------


class Affine:
    """``Y <- L Y``, no noise: ``build() -> L (D, D)`` (the affine constant in column 0), built
    once (cached in the state under ``key`` if given, else on the phase)."""

    noiseless = True

    def __init__(self, y: Augmented, build: Callable[[], np.ndarray], key=None):
        self.y, self.build, self.key, self._L = y, build, key, None

    def mean(self) -> np.ndarray:
        self.y.require_dense()
        if self.key is not None:
            return self.y.cached(self.key, self.build)
        if self._L is None:
            self._L = self.build()
        return self._L

    def prepare(self) -> None:
        """Checks that the second-moment recursion applies (raises ``ValueError`` if not)."""

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        return conjugate(self.mean(), S)


class LocalStep:
    """One local step of every agent (:func:`local_step`)."""

    noiseless = False

    def __init__(self, y: Augmented, eta: float, iterates: str, controls: str | None):
        self.y, self.eta, self.iterates, self.controls = y, float(eta), iterates, controls

    def mean(self) -> np.ndarray:
        """``e_c <- (I - eta A_c) e_c - eta rho_c (+ eta xi_c)`` (error coordinates)."""
        y, eta = self.y, self.eta
        y.require_dense()

        def build():
            L = np.eye(y.D)
            xi = y[self.controls] if self.controls else None
            for c, l in enumerate(y[self.iterates]):
                L[l, l] = np.eye(y.d) - eta * y.A[c]
                L[l, 0] = -eta * y.rho[c]
                if xi:
                    L[l, xi[c]] = eta * np.eye(y.d)
            return L

        return y.cached(("local", eta, self.iterates, self.controls), build)

    def prepare(self) -> None:
        self.y.noise  # noqa: B018 (builds the noise model: refuses a problem without one)

    def noise_covariance(self, m_e: np.ndarray, second: np.ndarray) -> np.ndarray:
        """``E[w_c w_c^T]`` (N, d, d) for local iterates with means ``m_e (N, d)`` and second moments
        ``second (N, d, d)`` in error coordinates (the noise model takes them in theta coordinates)."""
        theta_star = self.y.theta_star
        X = (
            second
            + theta_star[:, None] * m_e[:, None, :]
            + m_e[:, :, None] * theta_star[None, :]
            + np.outer(theta_star, theta_star)
        )  # (N, d, d): E[theta^c theta^c^T]
        return (self.eta * self.eta) * self.y.noise(m_e + theta_star, X)

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        """``S <- L S L^T + E[w w^T]``, touching only the local rows and columns."""
        y, eta = self.y, self.eta
        N, d, D = y.N, y.d, y.D
        A, rho = y.A, y.rho
        loc_idx = y.indices(self.iterates)
        xi_idx = y.indices(self.controls) if self.controls else None
        blocks = y.memo(
            ("diagonal", self.iterates),
            lambda: (loc_idx.reshape(N, d)[:, :, None], loc_idx.reshape(N, d)[:, None, :]),
        )

        def local_rows(S):
            """``L(eta) @ S``: only the local rows change."""
            R = S.copy()
            B = np.eye(d) - eta * A  # (N, d, d)
            rows = B @ S[loc_idx].reshape(N, d, D) - eta * rho[:, :, None] * S[0][None, None]
            if xi_idx is not None:
                rows = rows + eta * S[xi_idx].reshape(N, d, D)
            R[loc_idx] = rows.reshape(N * d, D)
            return R

        cov = self.noise_covariance(S[0, loc_idx].reshape(N, d), S[blocks])
        S = local_rows(local_rows(S).T)
        S[blocks] += cov
        return S


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


def channel_memory(y: Augmented, channel, name: str = "mem") -> None:
    """The senders' error-feedback memory as a carried per-agent block ``name`` (EF14's ``e_c``,
    EF21's ``g_c``, 0 at start), added only when ``channel.error_feedback`` is set: call it with the
    other blocks, before :func:`aggregate` reads it."""
    if channel.error_feedback is not None:
        y.add(name, per_agent=True, carried=True)


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


class Downlink(Affine):
    """The server's broadcast to the agents' copy (:func:`downlink`): ``hat <- hat + M x`` with
    ``x = target - hat``, ``M`` the compressor's random
    diagonal (rand-k, scaled or not; ``E[M] = mu I``, ``E[M_ii M_jj] = W_ij``), independent of
    everything else. ``Y' = A Y + U M P Y`` (``x = P Y``): mean map ``A + mu U P``, noise
    ``U (W (.) X - mu^2 X) U^T`` with ``X = P S P^T``. The identity is ``hat <- target``, no noise."""

    def __init__(self, y: Augmented, channel, target: str, hat: str):
        q = channel.quantizer
        if q.kind != "identity" and not q.linear:
            _validate.fail(
                "downlink",
                channel.describe(),
                "exact recursions need a downlink compressor that is a random linear map of the "
                "difference (identity() or rand_k(k), scaled or not): "
                f"{q.kind} is not",
            )
        q.check_dim(y.d)
        self.channel, self.target, self.hat = channel, target, hat
        d = y.d
        if q.kind == "identity":
            self.mu, self.W = 1.0, np.ones((d, d))
        else:
            scale = 1.0 if q.unscaled else d / q.k
            self.mu = scale * q.k / d
            off = scale * scale * q.k * (q.k - 1) / (d * (d - 1)) if d > 1 else 0.0
            self.W = np.full((d, d), off)
            np.fill_diagonal(self.W, scale * scale * q.k / d)
        self.noiseless = q.kind == "identity"
        super().__init__(y, self._build, ("downlink", target, hat, _channel_key(channel)))

    def _operators(self):
        """``(A, P, U)``: ``x = P Y`` (d, D), ``Y' = A Y + U r`` with ``r = M x``."""
        y, I = self.y, np.eye(self.y.d)
        P = np.zeros((y.d, y.D))
        P[:, y[self.target]] += I
        P[:, y[self.hat]] -= I
        A, U = np.eye(y.D), np.zeros((y.D, y.d))
        U[y[self.hat]] = I
        return A, P, U

    def _build(self) -> np.ndarray:
        A, P, U = self._operators()
        return A + self.mu * U @ P

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        out = conjugate(self.mean(), S)
        if self.noiseless:
            return out
        _, P, U = self.y.memo(("downlink ops", self.key), self._operators)
        X = P @ S @ P.T
        return out + U @ (self.W * X - self.mu**2 * X) @ U.T


class Coin:
    """With probability p (a coin independent of the state) ``phase``, else nothing (:func:`coin`)."""

    noiseless = False

    def __init__(self, p: float, phase):
        self.p, self.phase = float(p), phase

    def mean(self) -> np.ndarray:
        L = self.phase.mean()
        return (1.0 - self.p) * np.eye(L.shape[0]) + self.p * L

    def prepare(self) -> None:
        self.phase.prepare()

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        return (1.0 - self.p) * S + self.p * self.phase.second(S, conjugate)


class Chain:
    """Phases applied in order, their mean maps multiplied once and cached (:func:`chain`)."""

    def __init__(self, y: Augmented, key, phases):
        self.y, self.key, self.phases = y, key, [p for p in phases if p is not None]

    @property
    def noiseless(self) -> bool:
        return all(p.noiseless for p in self.phases)

    def mean(self) -> np.ndarray:
        def build():
            L = self.phases[0].mean()
            for p in self.phases[1:]:
                L = p.mean() @ L
            return L

        return self.y.cached(("chain", self.key), build)

    def prepare(self) -> None:
        for p in self.phases:
            p.prepare()

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        if self.noiseless:  # one conjugation by the product
            return conjugate(self.mean(), S)
        for p in self.phases:
            S = p.second(S, conjugate)
        return S


class RandomStop:
    """Each agent's per-agent blocks after a random number of ``stages`` (:func:`random_stop`)."""

    noiseless = False

    def __init__(self, y: Augmented, stages, pmf: np.ndarray, shared: bool, finish, blocks, key):
        self.y, self.stages, self.pmf, self.shared = y, list(stages), pmf, shared
        self.finish, self.blocks, self.key = finish, tuple(blocks), key

    def _rows(self) -> np.ndarray:
        """``(N, r)``: agent c's rows of the blocks the stages write."""
        y = self.y
        return np.concatenate([y.indices(b).reshape(y.N, -1) for b in self.blocks], axis=1)

    def _ended(self, k: int, X: np.ndarray, mean: bool, conjugate=None) -> np.ndarray:
        """Outcome k (the stages up to k, then ``finish(k)``): its mean map, or its second moment."""
        f = None if self.finish is None else self.finish(k)
        if f is None:
            return X
        return f.mean() @ X if mean else f.second(X, conjugate)

    def mean(self) -> np.ndarray:
        """Agent c's rows ``sum_k P(K_c = k) (F_k L_k ... L_0)[rows_c]``; the other rows unchanged."""
        y = self.y
        y.require_dense()

        def build():
            rows = self._rows()
            M, acc = np.eye(y.D), np.zeros(rows.shape + (y.D,))
            for k, stage in enumerate(self.stages):
                M = stage.mean() @ M
                if self.pmf[:, k].any():  # outcomes of probability 0 (a straggler's other counts) skipped
                    acc += self.pmf[:, k, None, None] * self._ended(k, M, True)[rows]
            out = np.eye(y.D)
            out[rows.reshape(-1)] = acc.reshape(-1, y.D)
            return out

        return build() if self.key is None else y.cached(("random stop", self.key), build)

    def prepare(self) -> None:
        for stage in self.stages:
            stage.prepare()

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        """Shared count: ``sum_k P(K = k) G_k(S)`` with ``G_k`` outcome k's second-moment map.
        Independent counts: agent c's diagonal block ``sum_k P(K_c = k) G_k(S)[c, c]``; every other
        entry from the mean map (the agents' counts and noises are independent of each other)."""
        rows = self._rows()
        diag = (rows[:, :, None], rows[:, None, :])
        X = S
        acc = np.zeros_like(S) if self.shared else np.zeros(rows.shape + rows.shape[1:])
        for k, stage in enumerate(self.stages):
            X = stage.second(X, conjugate)
            if not self.pmf[:, k].any():  # an outcome of probability 0: its finish never runs
                continue
            Z = self._ended(k, X, False, conjugate)
            acc += self.pmf[0, k] * Z if self.shared else self.pmf[:, k, None, None] * Z[diag]
        if self.shared:
            return acc
        out = conjugate(self.mean(), S)
        out[diag] = acc
        return out


def random_stop(
    y: Augmented,
    stages,
    pmf,
    shared: bool = False,
    finish=None,
    blocks=("loc",),
    key=None,
) -> RandomStop:
    """Agent c runs the phases ``stages[0..K_c]`` and then ``finish(K_c)`` (a phase or None), with
    ``K_c`` drawn from ``pmf[c] (K,)`` (``P(K_c = k)``, ``k = 0..K-1``) independently of the state:
    independently across agents (``shared=False``) or one ``K`` for every agent (``shared=True``,
    one row). Heterogeneous and random local work (:mod:`fedsa_jax.local_work`): the stages are the
    local steps, ``K_c = H_c - 1``; a random lag is the same block with stages that overwrite.

    The stages and ``finish`` must write only the per-agent ``blocks`` of agent c from agent c's
    own rows and the global ones (a local step, a broadcast, a per-agent affine map), and any noise
    they add must be independent across agents. Then the mean map mixes each agent's rows over its
    own law, and the second moment is exact: with a shared count a mixture of whole outcomes, with
    independent counts each agent's own block a mixture and the cross terms products of the mean
    maps. ``key``: a hashable name of the block's content, to cache its mean map."""
    p = np.atleast_2d(np.asarray(pmf, np.float64))
    if p.shape[1] != len(stages) or p.shape[0] not in (1, y.N) or (shared and p.shape[0] != 1):
        _validate.fail(
            "pmf",
            f"shape {p.shape}",
            f"expected (1, {len(stages)}) or ({y.N}, {len(stages)}) (one per agent; shared: one row)",
        )
    return RandomStop(y, stages, np.broadcast_to(p, (y.N, p.shape[1])), shared, finish, blocks, key)


# -- the blocks --------------------------------------------------------------------------------


class Broadcast(Affine):
    """Every agent's block ``into`` set to the global block ``source`` (:func:`broadcast`)."""

    def __init__(self, y: Augmented, source: str, into: str):
        self.source, self.into = source, into
        super().__init__(y, self._build, ("broadcast", source, into))

    def _build(self) -> np.ndarray:
        y = self.y
        L = np.eye(y.D)
        for l in y[self.into]:
            L[l, l] = 0.0
            L[l, y[self.source]] = np.eye(y.d)
        return L


def broadcast(y: Augmented, source: str = "theta", into: str = "loc") -> Affine:
    """Every agent starts from the server's iterate: ``into_c <- source`` (``run_agents``)."""
    return Broadcast(y, source, into)


def local_step(y: Augmented, eta: float, iterates: str = "loc", controls: str | None = None) -> LocalStep:
    """One local step of every agent at step size ``eta``, with the problem's noise:
    ``e_c <- (I - eta A_bar[c]) e_c - eta rho_c + eta xi_c + w_c`` (``controls``: the per-agent
    block of control variates xi, or None), ``E[w_c w_c^T] = eta^2 cov_c`` from the problem's
    ``noise_second_moment()`` or ``finite_support()``, independent across agents and steps."""
    return LocalStep(y, eta, iterates, controls)


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


def server_step(y: Augmented, server_optimizer, reference: str = "theta"):
    """``fj.optim.server_step``: ``(into, phase)``. Without an optimizer the aggregate goes to
    ``reference`` and the phase is None. With one (probed in float64 as an affine map
    ``[u; s'] = M [g; s; params] + c`` of the pseudo-gradient ``g = reference - a``, its flattened
    state s and the iterate, refused if not affine or if its state counts steps), the state gains
    its block ``s`` (carried) and a scratch block ``agg`` for the aggregate a (so call this before
    adding later blocks), and the phase is ``reference <- reference + u``, ``s <- s'``."""
    if server_optimizer is None:
        return reference, None
    d = y.d
    M, c, _, n_s = _affine_optimizer(server_optimizer, d, np.zeros(d))
    y.add("s", n_s, initial=lambda e0: _affine_optimizer(server_optimizer, d, e0)[2], carried=True)
    y.add("agg")
    Mg, Ms, Mp = M[:, :d], M[:, d : d + n_s], M[:, d + n_s :]
    shift = c + Mp @ y.theta_star  # the constant in error coordinates
    rows = {}  # [u; s'] = (Mg + Mp) ref - Mg agg + Ms s + shift; reference <- reference + u
    for block, part, plus in ((reference, slice(0, d), np.eye(d)), ("s", slice(d, d + n_s), 0.0)):
        if part.stop > part.start:
            rows[block] = {reference: plus + (Mg + Mp)[part], "agg": -Mg[part], "one": shift[part]}
            if n_s:
                rows[block]["s"] = Ms[part]
    return "agg", assign(y, **rows)


def downlink_blocks(y: Augmented, channel, hat: str = "hat") -> None:
    """The downlink's block (``channel`` not None): the agents' copy of the model ``hat`` (carried,
    starting at ``theta_0``)."""
    y.add(hat, initial=START, carried=True)


def downlink(y: Augmented, channel, target: str = "theta", hat: str = "hat") -> Affine:
    """The server's broadcast of ``target`` through a compressed downlink
    (:func:`fedsa_jax.channel.broadcast`): ``hat <- hat + C(target - hat)``. Exact for the identity
    (``hat <- target``) and a compressor that is a random linear map (rand-k, scaled or not); others
    are refused (:class:`Downlink`). Agents then start from ``hat``: :func:`broadcast` with
    ``source=hat``."""
    return Downlink(y, channel, target, hat)


def shift(y: Augmented, into: str, sent: str, reference: str = "hat", base: str = "theta") -> Affine:
    """``into <- base + sent - reference``: an aggregate ``sent`` of the messages taken against the
    agents' copy ``reference`` moves the server's own model ``base`` (a compressed downlink)."""
    return assign(y, **{into: {base: 1.0, sent: 1.0, reference: -1.0}})


class ScaleUpdates(Affine):
    """Each agent's update scaled (:func:`scale_updates`)."""

    def __init__(self, y: Augmented, scale, reference: str, iterates: str):
        self.scale = np.broadcast_to(np.asarray(scale, np.float64), (y.N,))
        self.reference, self.iterates = reference, iterates
        super().__init__(y, self._build)

    def _build(self) -> np.ndarray:
        y = self.y
        y.require_dense()
        L = np.eye(y.D)
        for c, rows in enumerate(y.indices(self.iterates).reshape(y.N, -1)):
            L[rows, rows] = self.scale[c]
            L[rows, _agent_rows(y, self.reference, c)] += 1.0 - self.scale[c]
        return L


def _agent_rows(y: Augmented, block: str, c: int) -> np.ndarray:
    """Agent c's rows of a per-agent ``block``, or the rows of a global one."""
    rows = y.indices(block)
    return rows.reshape(y.N, -1)[c] if block in y.per_agent else rows


class Rebase(Affine):
    """Each agent's iterate moved from its own start to a global block (:func:`rebase`)."""

    def __init__(self, y: Augmented, iterates: str, start: str, base: str):
        self.iterates, self.start, self.base = iterates, start, base
        super().__init__(y, self._build, ("rebase", iterates, start, base))

    def _build(self) -> np.ndarray:
        y = self.y
        y.require_dense()
        L = np.eye(y.D)
        for c, rows in enumerate(y.indices(self.iterates).reshape(y.N, -1)):
            L[rows, _agent_rows(y, self.start, c)] -= 1.0  # paired indices: the identity block
            L[rows, y.indices(self.base)] += 1.0
        return L


def rebase(y: Augmented, iterates: str = "loc", start: str = "lag", base: str = "theta") -> Affine:
    """``iterates_c <- base + (iterates_c - start_c)``: agent c's update since its own start (a
    per-agent block, e.g. the stale iterate a delayed update began from) applied to ``base``."""
    return Rebase(y, iterates, start, base)


def scale_updates(y: Augmented, scale, reference: str = "theta", iterates: str = "loc") -> Affine:
    """``iterates_c <- reference + s_c (iterates_c - reference)``: agent c's update since the
    broadcast of ``reference`` scaled by ``s_c`` (a number or one per agent), as FedNova's normalised
    averaging sends ``tau / H_c`` times it (:mod:`fedsa_jax.local_work`)."""
    return ScaleUpdates(y, scale, reference, iterates)


def coin(p: float, phase) -> Coin:
    """``phase`` with probability p, on a coin independent of the state: the mean map is
    ``(1 - p) I + p L`` and the second moment the mixture ``(1 - p) S + p phase(S)``."""
    return Coin(p, phase)


def chain(y: Augmented, key, *phases) -> Chain:
    """Phases in order as one (None entries skipped); the product of their mean maps is cached under
    ``key`` (which must identify the phases, e.g. ``("local", eta)``)."""
    return Chain(y, key, phases)


class AgentsMean(Affine):
    """A global block set to the agents' mean of a per-agent block (:func:`agents_mean`)."""

    def __init__(self, y: Augmented, source: str, into: str):
        self.source, self.into = source, into
        super().__init__(y, self._build, ("mean", source, into))

    def _build(self) -> np.ndarray:
        y = self.y
        L = np.eye(y.D)
        L[y[self.into]] = 0.0
        for l in y[self.source]:
            L[y[self.into], l] = np.eye(y.d) / y.N
        return L


def agents_mean(y: Augmented, source: str = "loc", into: str = "theta") -> Affine:
    """``into <- mean_c source_c`` (exact channel)."""
    return AgentsMean(y, source, into)


def averaging(y: Augmented, n: int, block: str = "avg", source: str = "theta") -> Affine:
    """Polyak-Ruppert: ``block <- block + (source - block) / n`` (n iterates in the mean)."""
    return assign(y, **{block: {block: 1.0 - 1.0 / n, source: 1.0 / n}})


class Assign(Affine):
    """Blocks set at once to linear combinations of the old values (:func:`assign`)."""

    def __init__(self, y: Augmented, rows: dict):
        self.rows = rows
        super().__init__(y, self._build)

    def entries(self) -> list[tuple[str, str, np.ndarray]]:
        """``(target, source, matrix)``: ``target <- sum matrix @ source`` over its entries."""
        y, out = self.y, []
        for target, combination in self.rows.items():
            t = y[target]
            if isinstance(t, list):
                _validate.fail("assign", target, "expected a block that is not per agent")
            for source, coef in combination.items():
                s = y[source]
                if isinstance(s, list):
                    _validate.fail("assign", source, "expected a block that is not per agent")
                if np.ndim(coef) == 0 and source != "one":
                    coef = coef * np.eye(t.stop - t.start, s.stop - s.start)
                out.append((target, source, np.reshape(coef, (t.stop - t.start, s.stop - s.start))))
        return out

    def _build(self) -> np.ndarray:
        y = self.y
        L = np.eye(y.D)
        for target in self.rows:
            L[y[target]] = 0.0
        for target, source, M in self.entries():
            L[y[target], y[source]] += M
        return L


def assign(y: Augmented, **rows) -> Affine:
    """Blocks set at once to linear combinations of the old values: ``assign(y, theta={"theta": 1 - b,
    "mean": b})`` is ``theta <- (1 - b) theta + b mean``. A coefficient is a number (times the
    identity; blocks of equal size) or a matrix; ``"one"`` with a vector adds a constant (error
    coordinates: a constant shift of an iterate). Unnamed blocks are unchanged; per-agent blocks
    are neither read nor written."""
    return Assign(y, rows)


# -- descriptions ------------------------------------------------------------------------------


@dataclasses.dataclass
class Recursion:
    """An algorithm's exact moment description.

    Args:
      state: its :class:`Augmented` state.
      round: ``round(t, etas) -> [phase, ...]`` for round t (0-based), ``etas (H,)`` the step sizes
        of its local steps (float64; a schedule's ``eta_{tH+h}``); None entries are skipped.
      step_size: the config's step size (a float or a schedule of the local-step count).
      num_local_steps: H.
      scored: ``scored(t) -> block name`` of the reported iterate after round t (default theta).
    """

    state: Augmented
    round: Callable[[int, np.ndarray], list]
    step_size: Any
    num_local_steps: int = 1
    scored: Callable[[int], str] = lambda t: "theta"


@dataclasses.dataclass
class Combination:
    """A linear combination ``sum_k coef_k E[theta_t(algorithm_k)]`` of other algorithms' means:
    :func:`~fedsa_jax.theory.exact_mean` only (the runs may share their noise).

    ``what`` names it in refusals; ``hint`` says what to pass to ``max_stable_step_size`` instead."""

    terms: tuple
    what: str
    hint: str = "pass one of the algorithms it combines"


def recursion_of(algorithm, problem):
    """The description ``algorithm.theory(algorithm.config, problem)`` (a :class:`Recursion` or a
    :class:`Combination`); a ``ValueError`` saying how to add one if the algorithm has none."""
    describe = getattr(algorithm, "theory", None)
    if describe is None:
        _validate.fail(
            "algorithm",
            getattr(algorithm, "name", algorithm),
            "has no exact moment description: pass theory=fn to fj.Algorithm, with "
            "fn(config, problem) returning fj.theory.Recursion(state, round, step_size, "
            "num_local_steps) built from the blocks of fj.theory (broadcast, local_step, aggregate, "
            "server_step, assign...; see docs/write-your-own/theory.md)",
        )
    out = describe(algorithm.config, problem)
    if isinstance(out, Recursion) and out.state.name is None:
        out.state.name = algorithm.name
    return out


# -- moments of the noise and of the channel ----------------------------------------------------


def _arrays(problem):
    """``(A_bar, b_bar, theta_star)`` in float64, for a problem the linear theory covers (one that
    follows the iterate or is not affine is refused here, for every exact recursion)."""
    check_linear(problem, "the exact theory")
    A = np.asarray(problem.A_bar, np.float64)
    b = np.asarray(problem.b_bar, np.float64)
    return A, b, np.asarray(problem.theta_star, np.float64)


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


def _affine_optimizer(server_optimizer, d: int, error0: np.ndarray):
    """A server optimizer as an affine map, probed in float64: ``[u; s'] = M [g; s; params] + c`` for the
    pseudo-gradient g (d), its flattened state s (n_s) and ``params`` (d); returns ``(M, c, s0, n_s)``
    with ``s0`` the flattened initial state. Refuses optimizers that are not affine (Adam) or that
    count steps (a schedule inside the optimizer: not constant)."""
    what = server_optimizer.describe()
    with jax.enable_x64(True):
        tx = server_optimizer.build()
        s0 = tx.init(jnp.asarray(error0, jnp.float64))
        leaves, treedef = jax.tree.flatten(s0)
        if any(not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) for x in leaves):
            _validate.fail(
                "server_optimizer",
                what,
                "exact_mean and exact_mse need a constant affine server "
                "optimizer such as optax.sgd(lr, momentum=beta); this one's state counts steps (Adam's bias "
                "correction, or a schedule inside it), so its update changes with t: estimate it by "
                "simulation",
            )
        shapes = [jnp.shape(x) for x in leaves]
        sizes = [int(np.prod(s)) for s in shapes]
        n_s = sum(sizes)

        def f(z):
            g, s, p = z[:d], z[d : d + n_s], z[d + n_s :]
            parts = np.split(np.arange(n_s), np.cumsum(sizes)[:-1]) if n_s else []
            state = jax.tree.unflatten(treedef, [s[idx].reshape(shape) for idx, shape in zip(parts, shapes)])
            u, state = tx.update(g, state, p)
            return jnp.concatenate([jnp.ravel(u), *[jnp.ravel(x) for x in jax.tree.leaves(state)]])

        f = jax.jit(f)
        n = 2 * d + n_s
        c = np.asarray(f(jnp.zeros(n)), np.float64)
        if c.shape != (d + n_s,):
            _validate.fail(
                "server_optimizer", what, "exact theory needs an optimizer whose state keeps its shape"
            )
        M = np.stack([np.asarray(f(jnp.eye(n)[i]), np.float64) - c for i in range(n)], axis=1)
        rng = np.random.default_rng(0)
        for scale in (1e-3, 1.0, 1e3):  # an affine map matches c + M z everywhere
            z = scale * rng.standard_normal(n)
            out = np.asarray(f(jnp.asarray(z)), np.float64)
            pred = c + M @ z
            if not np.allclose(out, pred, rtol=1e-8, atol=1e-12 * (np.abs(M) @ np.abs(z) + np.abs(c)).max()):
                _validate.fail(
                    "server_optimizer",
                    what,
                    "exact_mean and exact_mse need an affine server optimizer "
                    "(updates and state linear in the pseudo-gradient, the state and the iterate, e.g. "
                    "optax.sgd(lr, momentum=beta)); this one is not "
                    "(Adam- and RMSProp-type updates divide by a "
                    "running second moment): estimate it by simulation",
                )
        s0 = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves]) if n_s else np.zeros(0)
    return M, c, s0, n_s


def _residuals(problem) -> np.ndarray:
    """``rho_c = A_bar[c] theta_star - b_bar[c]`` (N, d), in float64: the constant term of a local
    step in error coordinates."""
    A, b, theta_star = _arrays(problem)
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
    A, b, _ = _arrays(problem)
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
