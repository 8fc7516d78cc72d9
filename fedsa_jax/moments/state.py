"""The augmented state of an exact moment recursion and the recursion itself.

:class:`Augmented` lays out ``Y = (1, theta, <blocks>)`` in error coordinates; :class:`Affine` is a
phase ``Y <- L Y + w`` with a constant mean map L; a :class:`Recursion` holds the state and the
round's phases, a :class:`Combination` a linear combination of other algorithms' means. The engine
that runs them is :mod:`fedsa_jax.theory.engine`; the phases are in :mod:`fedsa_jax.moments.phases`
and :mod:`fedsa_jax.moments.aggregation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedsa_jax import _validate
from fedsa_jax.moments.noise import float64_arrays, noise_model, residuals

__all__ = ["MAX_AUGMENTED_DIM", "START", "Affine", "Augmented", "Combination", "Recursion", "recursion_of"]

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
        A, _, theta_star = float64_arrays(problem)
        self.problem, self.name, self.title = problem, None, title
        self.A, self.theta_star, self.rho = A, theta_star, residuals(problem)
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
