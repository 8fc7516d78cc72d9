"""The generic phases of an exact moment recursion: broadcast, local step, server optimizer, coin,
chain, random stop, and the affine blocks (assign, agents' mean, averaging, rebase, scaling).

Each mirrors a simulation block of :mod:`fedsa_jax.algorithms` (table in :mod:`fedsa_jax.moments`).
The mechanisms' own phases live with the mechanisms: the downlink's in
:mod:`fedsa_jax.channel.downlink`, delays' in :mod:`fedsa_jax.channel.delays`, random local work's in
:mod:`fedsa_jax.channel.local_work` (all built on :func:`random_stop` and these blocks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.moments.state import Affine, Augmented

__all__ = [
    "agents_mean",
    "assign",
    "averaging",
    "broadcast",
    "chain",
    "coin",
    "local_step",
    "random_stop",
    "rebase",
    "scale_updates",
    "server_step",
    "shift",
]


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
    one row). Heterogeneous and random local work (:mod:`fedsa_jax.channel.local_work`): the stages are the
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
    averaging sends ``tau / H_c`` times it (:mod:`fedsa_jax.channel.local_work`)."""
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
