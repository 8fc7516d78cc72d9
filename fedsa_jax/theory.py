"""Exact references: FedLSA's heterogeneity bias, exact moment recursions, step-size
bounds and mixing times.

All updates of FedLSA, SCAFFLSA and QFedTD are affine in the joint state given the
noise. Write one round on the augmented vector

    Y = (1, theta, xi_1, ..., xi_N, theta^1, ..., theta^N)

(the local iterates theta^c live in Y during a round): broadcast
``theta^c <- theta``; H local steps
``theta^c <- (I - eta A_bar[c]) theta^c + eta b_bar[c] + eta xi_c + w_c``;
aggregation ``theta <- mean_c theta^c`` and, for SCAFFLSA,
``xi_c <- xi_c + (theta - theta^c) / (eta H)``. Each is ``Y <- L Y + w`` with a
constant matrix L and a noise w of mean zero given Y, so whenever observations
are i.i.d. (Gaussian LSA, generative TD) the mean follows ``m <- L m`` and the
second moment ``S = E[Y Y^T]`` follows ``S <- L S L^T + E[w w^T]``, with
``E[w w^T]`` linear in S:

* Gaussian LSA: ``w_c = -eta (noise_A G theta^c - noise_b g)`` has covariance
  ``eta^2 (noise_A^2 tr E[theta^c theta^c^T] + noise_b^2) I``;
* generative TD: ``Z = (s, s')`` has finite support, so ``E[w_c w_c^T]`` is a finite
  sum over states of ``mu_c(s) phi(s) phi(s)^T E_{s'|s}[(r_c(s) - u^T theta^c)^2]``,
  ``u = phi(s) - gamma phi(s')``, minus the mean part; it needs only ``E[u|s]`` and
  ``E[u u^T|s]``, enumerated once;
* any problem with ``finite_support()`` (least squares, the noise-free
  ``fj.problems.expected(problem)``, user problems): ``E[w_c w_c^T]`` is the finite
  sum over agent c's support points of ``w_k E[(A_k x - b_k)(A_k x - b_k)^T]``
  (linear in ``E[x]`` and ``E[x x^T]``, see ``fj.problems.FiniteSupport``), minus
  the mean part;
* the uplink channel (FedLSA, QFedTD): random aggregation weights (erasures) and
  quantizer errors of mean zero add ``sum_{c,j} Cov(w_c, w_j) E[m_c m_j^T] +
  sum_c E[w_c^2] V(E[m_c m_c^T])`` to the theta block, V linear for ``identity``
  and ``rand_k``.

**Error coordinates.** The recursions run on ``Y`` with every iterate replaced by its
error from ``theta_star`` (``e = theta - theta_star``, ``e^c = theta^c - theta_star``,
``x_sync - theta_star``): the maps above commute with that shift except the local
step, whose constant becomes ``-eta rho_c`` with ``rho_c = A_bar[c] theta_star -
b_bar[c]`` (float64). ``E|theta_t - theta_star|^2 = tr E[e_t e_t^T]`` is then read off S
with no cancellation, exact to float64 rounding at any step size (reading it as
``E|theta|^2 - 2 theta_star^T E[theta] + |theta_star|^2`` lost a third of the value at
``eta = 1e-7``). Everything runs in float64 numpy.

**Scaffnew** (ProxSkip) carries its agents' iterates ``x_c`` and control variates
``xi_c`` across rounds, and ``x_sync`` (the last synchronised iterate) at the end of
Y: no broadcast; each local step is the local map above followed, with probability p
(a coin independent of the state), by the communication
``xi_c <- xi_c + (p / eta)(xbar - x_c)``, ``x_c <- xbar``, ``x_sync <- xbar`` with
``xbar = mean_j x_j`` (exact channel); a round of H local steps ends with
``theta <- mean_c x_c``. One local step therefore maps the mean by
``((1 - p) I + p L_comm) L_s`` and the second moment by the same mixture of
``L_s S L_s^T + E[w w^T]`` and ``L_comm (L_s S L_s^T + E[w w^T]) L_comm^T``.

**Schedules, server optimizers, averaging** (:mod:`fedsa_jax.optim`,
:func:`fedsa_jax.averaged`). A step-size schedule makes the local map time-varying: local
step ``k = t H + h`` uses ``eta_k`` (SCAFFLSA's control variates divide by
``sum_h eta_{tH+h}``, Scaffnew's by ``eta_k / p``). A server optimizer is probed in float64
as an affine map ``[u; s'] = M [g; s; theta] + c`` of the pseudo-gradient
``g = theta - a``, its flattened state s and the iterate (``optax.sgd`` with momentum is
``s' = g + beta s``, ``u = -lr s'``); Y gains the block s and a scratch block a for the
aggregate, and the channel's noise enters a. Optimizers that are not affine (Adam,
RMSProp) or whose state counts steps are refused. Averaging adds the running mean
``v <- v + (theta - v) / (t - b)`` (``t > b``) to Y, and v is reported after the burn-in.
Richardson-Romberg's mean is ``2 E[theta(eta)] - E[theta(2 eta)]`` (:func:`exact_mean`).

Uplink channels keep the mean dynamics linear for every algorithm: in
:func:`exact_mean` the server step uses the expected aggregation weights
``E[w_c]`` (``p / N`` for ``"divide_by_n"``, ``(1 - (1 - p)^N) / N`` for
``"divide_by_received"``) and the control variate steps of SCAFFLSA and Scaffnew
the expected products ``E[1{c in R} 1{j in R} / |R|]``.

Also: :func:`fedlsa_bias` (limit and per-round), :func:`fedlsa_round_bias`,
:func:`lsa_step_size_bound` and :func:`max_stable_step_size` (mean stability),
:func:`tv_to_stationary` and :func:`mixing_time` (per-agent Markov chains).

References: Mangold et al., SCAFFLSA, NeurIPS 2024, arXiv:2402.04114, Sec. 3-4
(FedLSA bias, rho_bar_H, Markovian skipping) and Sec. 5 (SCAFFLSA); Dal Fabbro,
Mitra, Pappas, QFedTD, IEEE L-CSS 2023 (channel model); Mishchenko, Malinovsky,
Stich, Richtárik, ProxSkip, ICML 2022, arXiv:2202.09357 (Scaffnew).
"""

from __future__ import annotations

import dataclasses
from math import lgamma

import numpy as np

from fedsa_jax import _validate, optim
from fedsa_jax.problems.protocol import direction_second_moment

MAX_AUGMENTED_DIM = 2000


def _arrays(problem):
    A = np.asarray(problem.A_bar, np.float64)
    b = np.asarray(problem.b_bar, np.float64)
    return A, b, np.asarray(problem.theta_star, np.float64)


def _fedlsa_round(problem, step_size, num_local_steps):
    """``Gamma_bar = mean_c B_c^H`` and ``rho_bar = mean_c (I - B_c^H)(theta_c* - theta*)`` with
    ``B_c = I - eta A_bar[c]``; ``rho_bar`` is computed as
    ``eta mean_c sum_{k<H} B_c^k (b_c - A_c theta*)``, which needs no local inverse."""
    if callable(step_size):
        _validate.fail("step_size", step_size, "fedlsa_bias and fedlsa_round_bias take a constant step size; for a "
                       "schedule the mean iterate is fj.theory.exact_mean(problem, fj.fedlsa(schedule, H), T)")
    eta = _validate.real("step_size", step_size, 0.0, low_open=True)
    H = _validate.integer("num_local_steps", num_local_steps)
    A, b, theta_star = _arrays(problem)
    N, d, _ = A.shape
    gamma_bar = np.zeros((d, d))
    rho = np.zeros(d)
    for c in range(N):
        B = np.eye(d) - eta * A[c]
        Bk = np.eye(d)
        acc = np.zeros(d)
        r = b[c] - A[c] @ theta_star
        for _ in range(H):
            acc += Bk @ r
            Bk = B @ Bk
        gamma_bar += Bk / N
        rho += eta * acc / N
    return gamma_bar, rho


def fedlsa_round_bias(problem, step_size: float, num_local_steps: int) -> np.ndarray:
    """``rho_bar_H = mean_c (I - (I - eta A_bar[c])^H)(local_theta_star[c] - theta_star)``: the
    deterministic heterogeneity bias one round of local training adds (SCAFFLSA paper,
    Sec. 4). Zero for homogeneous agents or ``H = 1``."""
    return _fedlsa_round(problem, step_size, num_local_steps)[1]


def fedlsa_bias(problem, step_size: float, num_local_steps: int, num_rounds: int | None = None) -> np.ndarray:
    """FedLSA's heterogeneity bias (DESIGN §2; SCAFFLSA paper, Sec. 4).

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


def _binomial_inverse_mean(n: int, p: float, shift: int, power: int = 1) -> float:
    """``E[1 / (shift + X)^power]`` for ``X ~ Binomial(n, p)``, ``shift >= 1`` (log-space
    probabilities, so any n)."""
    if p == 1.0:
        return 1.0 / (shift + n) ** power
    k = np.arange(n + 1)
    log_pmf = (lgamma(n + 1) - np.array([lgamma(i + 1) + lgamma(n - i + 1) for i in k])
               + k * np.log(p) + (n - k) * np.log1p(-p))
    return float(np.sum(np.exp(log_pmf) / (shift + k) ** power))


def _server_weight(channel, N: int) -> float:
    """``E[w_c]``: ``p / N`` (``"divide_by_n"``) or ``E[1{c in R} / |R|] = (1 - (1 - p)^N) / N``."""
    p = float(channel.success_prob)
    return p / N if channel.aggregation == "divide_by_n" else (1.0 - (1.0 - p) ** N) / N


def _expected_weights(channel, N: int) -> tuple[float, float, float]:
    """``E[w_c]``, ``E[1{c in R} / |R|]`` and ``E[1{c, j in R} / |R|]`` (j != c)."""
    if not channel.quantizer.unbiased:
        _validate.fail("quantizer", channel.quantizer.describe(), "exact recursions need an unbiased quantizer")
    p = float(channel.success_prob)
    same = p * _binomial_inverse_mean(N - 1, p, 1)
    other = p * p * _binomial_inverse_mean(N - 2, p, 2) if N > 1 else 0.0
    return _server_weight(channel, N), same, other


def _control_variate_rows(L, xi, loc, ref, channel, N: int, denominator: float) -> None:
    """Adds to ``L`` the mean control-variate step on the messages ``m_j = Y[loc_j] - Y[ref]``
    (SCAFFLSA, Scaffnew): ``xi_c <- xi_c + (sum_j E[1{c,j in R}/|R|] m_j - E[1{c in R}] m_c) / denominator``."""
    _, w_same, w_other = _expected_weights(channel, N)
    p = float(channel.success_prob)
    I = np.eye(xi[0].stop - xi[0].start)
    for c in range(N):
        for j in range(N):
            coef = (w_same - p if j == c else w_other) / denominator
            L[xi[c], loc[j]] += coef * I
            L[xi[c], ref] -= coef * I


def _affine_optimizer(server_optimizer, d: int, error0: np.ndarray):
    """A server optimizer as an affine map, probed in float64: ``[u; s'] = M [g; s; params] + c`` for the
    pseudo-gradient g (d), its flattened state s (n_s) and ``params`` (d); returns ``(M, c, s0, n_s)``
    with ``s0`` the flattened initial state. Refuses optimizers that are not affine (Adam) or that
    count steps (a schedule inside the optimizer: not constant)."""
    import jax
    import jax.numpy as jnp

    what = server_optimizer.describe()
    with jax.enable_x64(True):
        tx = server_optimizer.build()
        s0 = tx.init(jnp.asarray(error0, jnp.float64))
        leaves, treedef = jax.tree.flatten(s0)
        if any(not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) for x in leaves):
            _validate.fail("server_optimizer", what, "exact_mean and exact_mse need a constant affine server "
                           "optimizer such as optax.sgd(lr, momentum=beta); this one's state counts steps (Adam's bias "
                           "correction, or a schedule inside it), so its update changes with t: estimate it by "
                           "simulation")
        shapes = [jnp.shape(x) for x in leaves]
        sizes = [int(np.prod(s)) for s in shapes]
        n_s = sum(sizes)

        def f(z):
            g, s, p = z[:d], z[d:d + n_s], z[d + n_s:]
            parts = np.split(np.arange(n_s), np.cumsum(sizes)[:-1]) if n_s else []
            state = jax.tree.unflatten(treedef, [s[idx].reshape(shape) for idx, shape in zip(parts, shapes)])
            u, state = tx.update(g, state, p)
            return jnp.concatenate([jnp.ravel(u), *[jnp.ravel(x) for x in jax.tree.leaves(state)]])

        f = jax.jit(f)
        n = 2 * d + n_s
        c = np.asarray(f(jnp.zeros(n)), np.float64)
        if c.shape != (d + n_s,):
            _validate.fail("server_optimizer", what, "exact theory needs an optimizer whose state keeps its shape")
        M = np.stack([np.asarray(f(jnp.eye(n)[i]), np.float64) - c for i in range(n)], axis=1)
        rng = np.random.default_rng(0)
        for scale in (1e-3, 1.0, 1e3):  # an affine map matches c + M z everywhere
            z = scale * rng.standard_normal(n)
            out = np.asarray(f(jnp.asarray(z)), np.float64)
            pred = c + M @ z
            if not np.allclose(out, pred, rtol=1e-8, atol=1e-12 * (np.abs(M) @ np.abs(z) + np.abs(c)).max()):
                _validate.fail("server_optimizer", what, "exact_mean and exact_mse need an affine server optimizer "
                               "(updates and state linear in the pseudo-gradient, the state and the iterate, e.g. "
                               "optax.sgd(lr, momentum=beta)); this one is not (Adam- and RMSProp-type updates divide by a "
                               "running second moment): estimate it by simulation")
        s0 = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves]) if n_s else np.zeros(0)
    return M, c, s0, n_s


class _Model:
    """The exact recursion of one algorithm: the layout of the augmented state Y and its
    affine maps (mean dynamics), built for each step size.

    ``Y = (1, theta, xi_1..xi_N, theta^1..theta^N [, x_sync] [, s] [, a] [, v])`` in error
    coordinates: control variates only for SCAFFLSA and Scaffnew, ``x_sync`` for Scaffnew,
    the server optimizer's flattened state ``s`` and a scratch block ``a`` for the
    aggregate when there is a server optimizer, and the Polyak-Ruppert average ``v`` under
    :func:`fedsa_jax.averaged`. A round t is

        Y <- V_t A(eta_t) L(eta_{tH+H-1}) ... L(eta_{tH}) B Y

    with the broadcast B (none for Scaffnew), the local steps L (for Scaffnew, the coin's
    mixture ``(1 - p) L_local + p C L_local`` with the communication C), the server step A
    (aggregate into ``a``, or into theta without optimizer; SCAFFLSA's control variates
    against the aggregate, divided by ``sum_h eta_{tH+h}``; then the optimizer
    ``theta <- theta + u``, ``s <- s'`` with ``[u; s'] = M [theta - a; s; theta_star + theta] + c``;
    Scaffnew: ``theta <- mean_c x_c``) and the averaging V_t (``v <- v + (theta - v)/(t - b)``
    for ``t > b``).
    """

    def __init__(self, problem, algorithm):
        from fedsa_jax.algorithms.averaged import AveragedConfig, RichardsonConfig

        self.burn_in = None
        if isinstance(algorithm.config, AveragedConfig):
            self.burn_in = int(algorithm.config.burn_in)
            algorithm = algorithm.config.inner
        name = algorithm.name
        if isinstance(algorithm.config, (AveragedConfig, RichardsonConfig)):
            _validate.fail("algorithm", name, "exact recursions cover one level of fj.averaged(...) around "
                           "'fedlsa', 'scafflsa', 'qfedtd' or 'scaffnew'")
        if name not in ("fedlsa", "scafflsa", "qfedtd", "scaffnew"):
            _validate.fail("algorithm", name, "exact recursions cover 'fedlsa', 'scafflsa', 'qfedtd' and 'scaffnew', "
                           "their fj.averaged(...) and (exact_mean only) fj.richardson(...)")
        self.algorithm, self.name, cfg = algorithm, name, algorithm.config
        self.cfg, self.channel, self.H = cfg, cfg.channel, int(cfg.num_local_steps)
        self.constant = optim.is_constant(cfg.step_size)
        self.comm_prob = float(cfg.comm_prob) if name == "scaffnew" else 0.0
        A, _, theta_star = _arrays(problem)
        self.A, self.theta_star, self.rho = A, theta_star, _residuals(problem)
        N, d = self.rho.shape
        self.N, self.d = N, d
        self.channel.quantizer.check_dim(d)
        opt = getattr(cfg, "server_optimizer", None)
        self.opt = None if opt is None else _affine_optimizer(opt, d, np.zeros(d))
        n_xi = N if name in ("scafflsa", "scaffnew") else 0
        n_s = 0 if self.opt is None else self.opt[3]
        blocks = [("one", 1), ("theta", d), *((f"xi{c}", d) for c in range(n_xi)), *((f"loc{c}", d) for c in range(N))]
        if name == "scaffnew":
            blocks.append(("sync", d))
        if self.opt is not None:
            blocks += [("s", n_s), ("agg", d)]
        if self.burn_in is not None:
            blocks.append(("avg", d))
        D = sum(n for _, n in blocks)
        if D > MAX_AUGMENTED_DIM:
            kinds: dict[str, list[int]] = {}  # a block per agent is counted, not listed: N may be thousands
            for b, n in blocks:
                kinds.setdefault(b.rstrip("0123456789"), []).append(n)
            sizes = " + ".join(f"{len(ns)} x {ns[0]} ({b})" if len(ns) > 1 else f"{ns[0]} ({b})"
                               for b, ns in kinds.items() if ns[0])
            _validate.fail("problem", f"N={N}, d={d}", f"the exact recursion's state for {name} has {D} coordinates "
                           f"({sizes}) > MAX_AUGMENTED_DIM = {MAX_AUGMENTED_DIM}")
        self.D, starts = D, np.cumsum([0] + [n for _, n in blocks])
        self.slices = {b: slice(int(s), int(s) + n) for (b, n), s in zip(blocks, starts)}
        self.th = self.slices["theta"]
        self.xi = [self.slices[f"xi{c}"] for c in range(n_xi)]
        self.loc = [self.slices[f"loc{c}"] for c in range(N)]
        self.ref = self.slices.get("sync", self.th)  # the server iterate the messages are taken against
        self.agg = self.slices.get("agg", self.ref)  # where the aggregate goes
        self.w_server = _expected_weights(self.channel, N)[0]
        self._cache: dict = {}

    # -- step sizes --------------------------------------------------------------------------
    def etas(self, num_rounds: int) -> np.ndarray:
        """``(num_rounds, H)`` step sizes of every local step (float64)."""
        if self.constant:
            return np.full((num_rounds, self.H), float(self.cfg.step_size))
        import jax

        with jax.enable_x64(True):
            values = optim.schedule_values(self.cfg.step_size, num_rounds * self.H)
        if not np.all(np.isfinite(values) & (values > 0)):
            k = int(np.argmax(~(np.isfinite(values) & (values > 0))))
            _validate.fail("step_size", self.cfg.step_size.describe(), f"the schedule gives {float(values[k])!r} at k={k}; "
                           "step sizes must be finite and > 0")
        return values.reshape(num_rounds, self.H)

    CACHE_SIZE = 32  # maps kept (a constant step needs a handful; a schedule's are used once each)

    def _cached(self, key, build):
        if key not in self._cache:
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))  # the oldest
            self._cache[key] = build()
        return self._cache[key]

    # -- maps --------------------------------------------------------------------------------
    def broadcast(self) -> np.ndarray:
        def build():
            L = np.eye(self.D)
            if self.name != "scaffnew":  # Scaffnew's agents keep their iterates across rounds
                for l in self.loc:
                    L[l, l] = 0.0
                    L[l, self.th] = np.eye(self.d)
            return L

        return self._cached("broadcast", build)

    def _local_only(self, eta: float) -> np.ndarray:
        """``e_c <- (I - eta A_c) e_c - eta rho_c (+ eta xi_c)`` (error coordinates)."""
        L = np.eye(self.D)
        for c, l in enumerate(self.loc):
            L[l, l] = np.eye(self.d) - eta * self.A[c]
            L[l, 0] = -eta * self.rho[c]
            if self.xi:
                L[l, self.xi[c]] = eta * np.eye(self.d)
        return L

    def local(self, eta: float) -> np.ndarray:
        """One local step's mean map (Scaffnew: with its coin's communication mixed in)."""
        def build():
            L = self._local_only(eta)
            if self.name == "scaffnew":
                p = self.comm_prob
                L = ((1.0 - p) * np.eye(self.D) + p * self.communication(eta)) @ L
            return L

        return self._cached(("local", eta), build)

    def _aggregation(self, denominator: float) -> np.ndarray:
        """``a <- ref + sum_c E[w_c] (loc_c - ref)`` (into ``ref`` without optimizer) and the control
        variates' mean step against it."""
        L = np.eye(self.D)
        d = self.d
        L[self.agg] = 0.0
        L[self.agg, self.ref] = (1.0 - self.N * self.w_server) * np.eye(d)
        for l in self.loc:
            L[self.agg, l] = self.w_server * np.eye(d)
        if self.xi:
            _control_variate_rows(L, self.xi, self.loc, self.ref, self.channel, self.N, denominator)
        return L

    def optimizer(self) -> np.ndarray | None:
        """``ref <- ref + u``, ``s <- s'``, ``[u; s'] = M [ref - a; s; theta_star + ref] + c`` (None without one)."""
        if self.opt is None:
            return None

        def build():
            M, c, _, n_s = self.opt
            d, I = self.d, np.eye(self.d)
            Mg, Ms, Mp = M[:, :d], M[:, d:d + n_s], M[:, d + n_s:]
            L = np.eye(self.D)
            ref, s, agg = self.ref, self.slices["s"], self.agg
            out = np.zeros((d + n_s, self.D))  # rows of [u; s']
            out[:, ref] = Mg + Mp
            out[:, agg] = -Mg
            out[:, s] = Ms
            out[:, 0] = c + Mp @ self.theta_star
            L[ref] = out[:d]
            L[ref, ref] += I
            L[s] = out[d:]
            return L

        return self._cached("optimizer", build)

    def communication(self, eta: float) -> np.ndarray:
        """Scaffnew's communication at a local step of size eta: aggregate, control variates (divided
        by ``eta / p``), the optimizer, and every agent restarting from ``x_sync``."""
        def build():
            L = self._aggregation(eta / self.comm_prob)
            opt = self.optimizer()
            if opt is not None:
                L = opt @ L
            restart = np.eye(self.D)
            for l in self.loc:
                restart[l] = 0.0
                restart[l, self.ref] = np.eye(self.d)
            return restart @ L

        return self._cached(("communication", eta), build)

    def server(self, etas: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The end of a round: ``(aggregation, optimizer)`` maps (Scaffnew: ``theta <- mean_c x_c``, None)."""
        if self.name == "scaffnew":
            def build():
                L = np.eye(self.D)
                L[self.th] = 0.0
                for l in self.loc:
                    L[self.th, l] = np.eye(self.d) / self.N
                return L

            return self._cached("mean", build), None
        total = float(np.sum(etas))
        return self._cached(("aggregation", total), lambda: self._aggregation(total)), self.optimizer()

    def averaging(self, t: int) -> np.ndarray | None:
        """``v <- v + (theta - v) / (t - b)`` after round t (None before the burn-in ends)."""
        if self.burn_in is None or t <= self.burn_in:
            return None
        n = t - self.burn_in
        L = np.eye(self.D)
        v = self.slices["avg"]
        L[v, v] = (1.0 - 1.0 / n) * np.eye(self.d)
        L[v, self.th] = np.eye(self.d) / n
        return L

    def scored(self, t: int) -> slice:
        """The block holding the reported iterate after round t."""
        return self.slices["avg"] if self.burn_in is not None and t > self.burn_in else self.th

    def round_map(self, t: int, etas: np.ndarray) -> np.ndarray:
        """The mean map of round t (0-based: its count after the round is t + 1)."""
        L = self.broadcast()
        for eta in etas:
            L = self.local(float(eta)) @ L
        agg, opt = self.server(etas)
        L = agg @ L
        if opt is not None:
            L = opt @ L
        avg = self.averaging(t + 1)
        return L if avg is None else avg @ L

    def initial(self, problem, theta0) -> np.ndarray:
        """``E[Y_0]``: ``theta_0 - theta_star`` (``theta_0`` default 0) in theta, Scaffnew's agents,
        ``x_sync`` and the average; the optimizer's initial state."""
        d = self.d
        m = np.zeros(self.D)
        m[0] = 1.0
        e0 = -self.theta_star
        if theta0 is not None:
            theta0 = _validate.array("theta0", theta0, 1)
            if theta0.shape != (d,):
                _validate.fail("theta0", theta0, f"expected shape ({d},) to match the problem's dimension")
            e0 = theta0 - self.theta_star
        m[self.th] = e0
        if self.name == "scaffnew":
            for part in [*self.loc, self.slices["sync"]]:
                m[part] = e0
        if "avg" in self.slices:
            m[self.slices["avg"]] = e0
        if self.opt is not None:
            m[self.slices["s"]] = _affine_optimizer(self.algorithm.config.server_optimizer, d, e0)[2]
        return m


def _conjugator(L):
    """``S -> L S L^T`` for symmetric S, touching only the rows where L differs from I
    (and, in them, only L's nonzero columns): O(r c D) instead of O(D^3)."""
    D = L.shape[0]
    rows = np.nonzero(np.any(L != np.eye(D), axis=1))[0]
    cols = np.nonzero(np.any(L[rows] != 0, axis=0))[0]
    if 2 * len(cols) > D:  # gathering most of S costs more than the zeros it skips
        cols = slice(None)
    block = L[rows][:, cols]

    def apply_rows(S):
        R = S.copy()
        R[rows] = block @ S[cols]
        return R

    return lambda S: apply_rows(apply_rows(S).T)


def _residuals(problem) -> np.ndarray:
    """``rho_c = A_bar[c] theta_star - b_bar[c]`` (N, d), in float64: the constant term of a local
    step in error coordinates."""
    A, b, theta_star = _arrays(problem)
    return np.einsum("cij,j->ci", A, theta_star) - b


def _require_iid(problem):
    if getattr(problem, "sampling", "generative") != "generative":
        _validate.fail("problem.sampling", problem.sampling, "exact recursions need i.i.d. ('generative') sampling")


def _is_richardson(algorithm) -> bool:
    from fedsa_jax.algorithms.averaged import RichardsonConfig

    return isinstance(algorithm.config, RichardsonConfig)


def exact_mean(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``E[theta_t]`` for ``t = 0..num_rounds`` (shape ``(T+1, d)``), exact for i.i.d.
    observations, for FedLSA, SCAFFLSA, QFedTD and Scaffnew, with any unbiased channel, any
    step-size schedule, any affine server optimizer (``optax.sgd`` with or without momentum),
    their Polyak-Ruppert average (:func:`fedsa_jax.averaged`) and Richardson-Romberg
    extrapolation (:func:`fedsa_jax.richardson`: ``2 E[theta(eta)] - E[theta(2 eta)]``).

    For QFedTD: ``E[theta_{k+1}] = (I - alpha p_eff mean A_bar) E[theta_k] + alpha p_eff mean b_bar``
    with ``p_eff = p`` (``"divide_by_n"``) or ``1 - (1 - p)^N`` (``"divide_by_received"``).
    """
    _require_iid(problem)
    T = _validate.integer("num_rounds", num_rounds, 0)
    if _is_richardson(algorithm):
        cfg = algorithm.config
        return 2 * exact_mean(problem, cfg.inner, T, theta0) - exact_mean(problem, cfg.doubled, T, theta0)
    model = _Model(problem, algorithm)
    etas = model.etas(T)
    m = model.initial(problem, theta0)
    out = [m[model.scored(0)].copy()]
    for t in range(T):
        m = model.round_map(t, etas[t]) @ m
        out.append(m[model.scored(t + 1)].copy())
    return np.asarray(out) + model.theta_star  # from error coordinates


def _noise_model(problem):
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
        _require_iid(problem)
        mean_part = direction_second_moment(np.ones((N, 1)), A[:, None], b[:, None])
        second = _support_second_moment(problem, A, b)
        return lambda m, X: second(m, X) - mean_part(m, X)
    own = getattr(problem, "noise_second_moment", None)
    cov = own() if callable(own) else None
    if cov is None:
        _validate.fail("problem", type(problem).__name__,
                       "exact second moments need the law of the noise: a problem with a noise_second_moment() "
                       "method (Gaussian LSA, federated TD) or a finite_support() method (fj.problems.FiniteSupport)")
    _require_iid(problem)
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
        _validate.fail(name, f"weights {w.shape}, b {bz.shape}", f"expected weights (N={N}, K) and b (N, K, d={d})")
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
            _validate.fail(name, f"left {left.shape}, right {right.shape}", f"expected both of shape {bz.shape}")
        mean_A = np.einsum("ck,cki,ckj->cij", w, left, right)
    tol = np.sqrt(np.finfo(problem.dtype).eps)
    if np.any(w < 0) or not np.allclose(w.sum(1), 1.0, rtol=0, atol=tol):
        _validate.fail(name, "weights", "expected nonnegative weights summing to 1 for every agent")
    scale = max(1.0, float(np.max(np.abs(A))), float(np.max(np.abs(b))))
    if not (np.allclose(mean_A, A, rtol=0, atol=tol * scale)
            and np.allclose(np.einsum("ck,cki->ci", w, bz), b, rtol=0, atol=tol * scale)):
        _validate.fail(name, "the support's means", "expected sum_k weights A(z_k) = A_bar and sum_k weights b(z_k) "
                       "= b_bar for every agent")
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
    _validate.fail("quantizer", quantizer.describe(),
                   "exact second moments need a quantizer whose error covariance is linear in x x^T: "
                   "identity() or rand_k(k)")


def _weight_covariance(channel, N: int) -> tuple[float, float]:
    """``Cov(w_c, w_c)`` and ``Cov(w_c, w_j)`` (j != c) of the random aggregation weights."""
    p = float(channel.success_prob)
    if not channel.erasures or p == 1.0:
        return 0.0, 0.0
    if channel.aggregation == "divide_by_n":
        return p * (1 - p) / N**2, 0.0
    mean = _server_weight(channel, N)
    same = p * _binomial_inverse_mean(N - 1, p, 1, 2) - mean**2
    other = (p * p * _binomial_inverse_mean(N - 2, p, 2, 2) if N > 1 else 0.0) - mean**2
    return same, other


def exact_mse(problem, algorithm, num_rounds: int, theta0=None) -> np.ndarray:
    """``E|theta_t - theta_star|^2`` for ``t = 0..num_rounds``, exact (float64).

    Propagates ``S = E[Y Y^T]`` of the augmented state Y (module docstring). One
    local step maps ``S <- L_s S L_s^T + E[w w^T]``: the local noise
    ``w_c = eta ((b_c(Z) - A_c(Z) x_c) - (b_bar[c] - A_bar[c] x_c))`` has mean zero given
    the state and is independent across agents, and its covariance is linear in S
    (:func:`_noise_model`): Gaussian noise, generative TD sampling with the
    finite support of ``(s, s')`` enumerated, or the problem's own
    ``finite_support()`` (least squares, ``fj.problems.expected``, user problems).
    Other problems are refused with a ``ValueError``.

    The uplink channel enters FedLSA and QFedTD exactly: with random weights
    ``w_c`` (erasures) and quantizer error ``e_c`` (mean zero given the message,
    covariance ``V(m_c m_c^T)``), the server adds, to the theta block,
    ``sum_{c,j} Cov(w_c, w_j) E[m_c m_j^T] + sum_c E[w_c^2] V(E[m_c m_c^T])``. ``V`` is
    linear for ``identity`` and ``rand_k`` only; other quantizers, and SCAFFLSA or
    Scaffnew with a lossy channel (products of erasure indicators in the control
    variates), are refused.

    Scaffnew: its coin is independent of the state, so a local step is the mixture
    ``S <- (1 - p) S' + p L_comm S' L_comm^T`` of ``S' = L_s S L_s^T + E[w w^T]`` (no
    communication) and of the same step followed by the communication ``L_comm``.

    Cost O(N d^2 D) per local step and O(N d D^2) per round (O(N^2 d^2 D) for
    SCAFFLSA) with ``D = 1 + d + N d`` (plus N d for the control variates of SCAFFLSA
    and Scaffnew, and d for Scaffnew's ``x_sync``; at most ``MAX_AUGMENTED_DIM``);
    memory O(D^2).
    """
    model, moments = _second_moments(problem, algorithm, num_rounds, theta0)
    # error coordinates: no cancellation
    return np.asarray([np.trace(S[model.scored(t), model.scored(t)]) for t, S in enumerate(moments)])


def _second_moments(problem, algorithm, num_rounds: int, theta0=None):
    """``(model, an iterator over S_t = E[Y_t Y_t^T] for t = 0..num_rounds)``: the recursion of
    :func:`exact_mse` (``model.scored(t)`` is the reported iterate's block of Y after round t),
    its arguments checked before it returns."""
    T = _validate.integer("num_rounds", num_rounds, 0)
    if _is_richardson(algorithm):
        _validate.fail("algorithm", algorithm.name, "exact_mse does not cover Richardson-Romberg extrapolation (its two "
                       "runs share their noise); exact_mean does")
    model = _Model(problem, algorithm)
    name, channel = model.name, model.channel
    if name in ("scafflsa", "scaffnew") and not channel.trivial:
        _validate.fail("algorithm", model.algorithm.describe()["channel"],
                       f"exact_mse covers {'SCAFFLSA' if name == 'scafflsa' else 'Scaffnew'} with an exact channel "
                       "only (identity quantizer, success_prob=1); exact_mean covers any unbiased channel")
    noise = _noise_model(problem)
    etas = model.etas(T)
    A, theta_star, rho = model.A, model.theta_star, model.rho
    N, d, D, H = model.N, model.d, model.D, model.H
    quant = _quantizer_covariance(channel.quantizer, d)
    c_same, c_other = _weight_covariance(channel, N)
    w_sq = c_same + _server_weight(channel, N) ** 2  # E[w_c^2]
    loc_idx = np.concatenate([np.arange(D)[l] for l in model.loc])  # (N d,)
    xi_idx = np.concatenate([np.arange(D)[x] for x in model.xi]) if model.xi else None
    th_idx = np.arange(D)[model.th]
    agg = model.agg
    rows = loc_idx.reshape(N, d)
    blocks = (rows[:, :, None], rows[:, None, :])  # S[blocks]: the N diagonal (d, d) blocks of the locals
    conjugators: dict = {}

    def conjugate(L, S):
        if id(L) not in conjugators:
            if len(conjugators) >= model.CACHE_SIZE:
                conjugators.pop(next(iter(conjugators)))
            conjugators[id(L)] = (L, _conjugator(L))  # L kept alive while cached: its id stays unique
        return conjugators[id(L)][1](S)

    def local_rows(S, eta):
        """``L(eta) @ S`` for a local step (not Scaffnew's communication): only the local rows change."""
        R = S.copy()
        B = np.eye(d) - eta * A  # (N, d, d)
        rows = B @ S[loc_idx].reshape(N, d, D) - eta * rho[:, :, None] * S[0][None, None]
        if xi_idx is not None:
            rows = rows + eta * S[xi_idx].reshape(N, d, D)
        R[loc_idx] = rows.reshape(N * d, D)
        return R

    def moments(S):
        yield S
        for t in range(T):
            S = conjugate(model.broadcast(), S)
            for eta in etas[t]:
                eta = float(eta)
                # the noise model takes the local iterates' moments in theta coordinates
                m_e = S[0, loc_idx].reshape(N, d)
                X = S[blocks] + theta_star[:, None] * m_e[:, None, :] + m_e[:, :, None] * theta_star[None, :] \
                    + np.outer(theta_star, theta_star)  # (N, d, d): E[theta^c theta^c^T]
                cov = (eta * eta) * noise(m_e + theta_star, X)
                S = local_rows(local_rows(S, eta).T, eta)
                S[blocks] += cov
                if model.comm_prob:  # Scaffnew: a communication with probability p, independent of the state
                    p = model.comm_prob
                    S = (1.0 - p) * S + p * conjugate(model.communication(eta), S)
            extra = None
            if c_same or c_other or channel.quantizer.kind != "identity":
                Sl = S[np.ix_(loc_idx, loc_idx)].reshape(N, d, N, d)
                cross = S[np.ix_(loc_idx, th_idx)].reshape(N, d, d)  # E[loc_c theta^T]
                # E[m_c m_j^T] for the messages m_c = loc_c - theta
                M = Sl - cross[:, :, None, :] - np.transpose(cross, (2, 0, 1))[None] + S[model.th, model.th][None, :, None, :]
                diag_sum = np.einsum("cicj->ij", M)
                extra = c_same * diag_sum + c_other * (np.einsum("cidj->ij", M) - diag_sum)
                extra = extra + w_sq * sum(quant(M[c, :, c, :]) for c in range(N))
            aggregation, opt = model.server(etas[t])
            S = conjugate(aggregation, S)
            if extra is not None:  # the channel's noise enters the aggregate
                S[agg, agg] += extra
            if opt is not None:
                S = conjugate(opt, S)
            avg = model.averaging(t + 1)
            if avg is not None:
                S = conjugate(avg, S)
            yield S

    m = model.initial(problem, theta0)
    return model, moments(np.outer(m, m))


def lsa_step_size_bound(A) -> float:
    """Largest eta with spectral radius ``rho(I - eta A) < 1``: ``min_lambda 2 Re(lambda) / |lambda|^2``
    over the eigenvalues of ``A (d, d)`` (0 if some ``Re(lambda) <= 0``, i.e. A is not Hurwitz-stable)."""
    lam = np.linalg.eigvals(np.asarray(A, np.float64))
    if np.any(lam.real <= 0):
        return 0.0
    return float(np.min(2 * lam.real / np.abs(lam) ** 2))


def _mean_spectral_radius(problem, algorithm) -> float:
    """Spectral radius of one round of the exact mean recursion (constant step), on the state
    that persists across rounds: theta (FedLSA, QFedTD) and the control variates (SCAFFLSA),
    or the control variates, the agents' iterates and ``x_sync`` (Scaffnew, whose theta is
    their mean), and the server optimizer's state; restricted to ``sum_c xi_c = 0`` (both
    control-variate algorithms keep that sum at 0)."""
    model = _Model(problem, algorithm)
    with np.errstate(over="ignore", invalid="ignore"):
        R = model.round_map(0, model.etas(1)[0])
    if not np.all(np.isfinite(R)):
        return np.inf
    d = model.d
    parts = [*model.xi] + ([model.th] if model.name != "scaffnew" else [*model.loc, model.slices["sync"]])
    if "s" in model.slices:
        parts.append(model.slices["s"])
    keep = np.concatenate([np.arange(model.D)[sl] for sl in parts])
    M = R[np.ix_(keep, keep)]
    if not model.xi:
        return float(np.max(np.abs(np.linalg.eigvals(M))))
    # Orthonormal basis of {sum_c xi_c = 0} in the kept coordinates (the xi blocks come first).
    sums = np.zeros((d, len(keep)))
    for c in range(len(model.xi)):
        sums[:, c * d:(c + 1) * d] = np.eye(d)
    _, _, Vt = np.linalg.svd(sums)
    Q = Vt[d:].T
    return float(np.max(np.abs(np.linalg.eigvals(Q.T @ M @ Q))))


def max_stable_step_size(problem, algorithm="fedlsa", num_local_steps: int | None = None,
                         grid_points: int = 200, tol: float = 1e-6) -> float:
    """Largest step size up to which the exact mean recursion of ``algorithm``
    contracts (spectral radius of one round < 1 for every smaller step size).

    Args:
      algorithm: ``"fedlsa"``, ``"scafflsa"`` or ``"qfedtd"`` (exact channel, H =
        ``num_local_steps``, default 1), or an algorithm such as
        ``fj.qfedtd(0.1, success_prob=0.5)`` or ``fj.scaffnew(0.1, 0.2, 10)``, whose H,
        channel (and communication probability) are kept and whose step size is
        varied (erasures with ``"divide_by_n"`` shrink the mean step by p, so they
        raise the bound by about 1/p).

    Scans a log grid from ``1e-4 eta_lsa`` to ``100 eta_lsa`` (``eta_lsa`` =
    :func:`lsa_step_size_bound` of ``mean_c A_bar[c]``) up to its first unstable
    point, then bisects to relative precision ``tol``. For H = 1 FedLSA this is
    ``eta_lsa``. If the whole grid is stable it returns ``100 eta_lsa``, a lower
    bound. Mean stability is necessary, not sufficient, for a bounded MSE; check
    :func:`exact_mse` at the chosen step size for that.
    """
    from fedsa_jax import algorithms

    if isinstance(algorithm, algorithms.Algorithm):
        if num_local_steps is not None:
            _validate.fail("num_local_steps", num_local_steps, "leave it out: it is taken from the algorithm")
        from fedsa_jax.algorithms.averaged import AveragedConfig

        while isinstance(algorithm.config, AveragedConfig):  # averaging leaves the iterates' stability as is
            algorithm = algorithm.config.inner
        if _is_richardson(algorithm):
            _validate.fail("algorithm", algorithm.name, "pass the algorithm it extrapolates (its 2 eta run must be "
                           "stable: halve the bound)")
        if not optim.is_constant(getattr(algorithm.config, "step_size", 0.0)):
            _validate.fail("algorithm", algorithm.name, "max_stable_step_size varies a constant step size; this "
                           "algorithm has a schedule")
        base_alg = algorithm
    else:
        _validate.choice("algorithm", algorithm, ("fedlsa", "scafflsa", "qfedtd"))
        H = _validate.integer("num_local_steps", 1 if num_local_steps is None else num_local_steps)
        if algorithm == "qfedtd" and H != 1:
            _validate.fail("num_local_steps", H, "QFedTD takes one local step per round (H=1)")
        base_alg = algorithms.qfedtd(1.0) if algorithm == "qfedtd" else getattr(algorithms, algorithm)(1.0, H)

    def radius(eta):
        config = dataclasses.replace(base_alg.config, step_size=eta)
        return _mean_spectral_radius(problem, dataclasses.replace(base_alg, config=config))

    A, _, _ = _arrays(problem)
    base = lsa_step_size_bound(A.mean(0))
    if base == 0.0:
        _validate.fail("problem", "mean_c A_bar[c]", "has an eigenvalue with Re <= 0: no step size is stable")
    grid = base * np.logspace(-4, 2, grid_points)
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


def _tv_sequence(problem):
    """Yields ``max_s TV(P_c^t(s, .), mu_c)`` (shape ``(N,)``) for t = 0, 1, 2, ..."""
    if not hasattr(problem, "transitions"):
        _validate.fail("problem", type(problem).__name__, "mixing times need a federated TD problem (a Markov chain)")
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
    _validate.fail("problem", f"agents {np.nonzero(out < 0)[0].tolist()}",
                   f"did not mix to TV <= {eps} within max_steps={max_steps} steps (periodic or slowly mixing chain)")
