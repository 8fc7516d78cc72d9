"""The plug-in baseline for inference on ``theta*``: running estimates of ``A_bar`` and the noise.

``fj.plug_in(algorithm)`` runs ``algorithm`` unchanged (bit for bit) and keeps, for every seed and
agent c, running means over the observations the run draws (the same observations: the same
random numbers through the same sampler, Markov chains and cohorts included),

    A_hat_c = (1/n_c) sum_k A_c(Z_k),        b_hat_c = (1/n_c) sum_k b_c(Z_k),
    S_hat_c = (1/n_c) sum_k eps_k eps_k^T,   eps_k = (A_c(Z_k) - A_hat_c) theta_t - (b_c(Z_k) - b_hat_c),

``theta_t`` the server iterate of the round the observation ``Z_k`` belongs to (``A_hat``,
``b_hat`` including that round), and the step size ``eta_t`` of the round's last local step. The
plug-in confidence interval of Levin, Shuklin, Moulines, Mangold, Samsonov ("Gaussian Approximation
and Multiplier Bootstrap for Federated Linear Stochastic Approximation", arXiv:2605.19629, 2026,
their baseline) is built from them (:mod:`fedsa_jax.inference`, method ``"plug_in"``): with
``A_hat = mean_c A_hat_c`` and ``Sigma_eps = mean_c S_hat_c / N``, the solution ``Sigma`` of the
Lyapunov equation

    A_hat Sigma + Sigma A_hat^T = Sigma_eps

gives ``Cov(theta_T) ~ eta_T Sigma``: the first-order covariance of an LSA iterate with a small,
slowly varying step size, the noise averaged over N agents at every local step (FedLSA on a
homogeneous problem; to first order in ``eta H`` also under heterogeneity, where FedLSA's bias is
not in it). It reads the observations only: no channel noise (quantizers, erasures' scaling, a
cohort's sampling) and no control variates' delay enter it, which the bootstrap's replicates carry.

``A_c(Z)`` is read from the problem's direction ``g(theta) = A_c(Z) theta - b_c(Z)`` at ``theta_t``:
its Jacobian (d forward-mode products per observation), ``b_c(Z) = A_c(Z) theta_t - g(theta_t)``
and ``eps_k = g(theta_t) - (A_hat_c theta_t - b_hat_c)``. (A problem that draws its direction's law
rather than ``A_c(Z)`` itself, as Gaussian LSA does, ``A_bar theta - b_bar + sqrt(sigma_A^2
|theta|^2 + sigma_b^2) z``, has the noise of that law at ``theta_t``, the one that drives its
iterates.) Memory: ``2 N d^2 + N d``
numbers and a copy of the agents' samplers per seed beside the algorithm's state.

Covered: the last iterate of FedLSA, SCAFFLSA, Scaffnew or QFedTD at its own step size (through
:func:`fedsa_jax.bootstrap`), the noise averaged over the agents of a step (N, or a cohort's m).
Refused: an averaged or extrapolated iterate (:func:`fedsa_jax.averaged`, :func:`fedsa_jax.richardson`)
and a server optimizer, whose covariances ``eta_T Sigma`` does not describe.

Wrap a bootstrap to have both sets from one run: ``fj.plug_in(fj.bootstrap(alg, B))``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, moments, optim
from fedsa_jax.algorithms._base import (
    Algorithm,
    RoundRandomness,
    init_samplers,
)
from fedsa_jax.algorithms.averaged import _error, _Wrapper
from fedsa_jax.channel.cohorts import (
    cohort_active,
    keep_outside,
    round_cohort,
)
from fedsa_jax.channel.dp import refuse_privacy
from fedsa_jax.channel.local_work import (
    stepwise_observations,
)
from fedsa_jax.problems.protocol import check_linear

__all__ = ["PlugInMoments", "PlugInState", "lyapunov", "plug_in"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PlugInConfig(_Wrapper):
    inner: Algorithm  # the algorithm that runs, unchanged

    @property
    def trajectories(self) -> int:
        return self.inner.trajectories

    def describe(self) -> dict[str, Any]:
        return {"inner": self.inner.describe()}


class PlugInMoments(NamedTuple):
    """One seed's running sums over its agents' observations (the plug-in estimates are the sums
    divided by ``count``)."""

    count: jax.Array  # (N,) observations agent c drew (int32)
    sum_A: jax.Array  # (N, d, d) sum of A_c(Z_k)
    sum_b: jax.Array  # (N, d) sum of b_c(Z_k)
    sum_noise: jax.Array  # (N, d, d) sum of eps_k eps_k^T
    sampler: Any  # (N,) the agents' observation streams, in step with the algorithm's
    step_size: jax.Array  # () the step size of the last round's last local step (eta_T)
    agents: jax.Array  # () the agents whose updates each step averages: m with a cohort, else N


class PlugInState(NamedTuple):
    theta: jax.Array  # (d,) the algorithm's iterate
    error: jax.Array  # (d,) theta - theta_star
    inner: Any  # the algorithm's state
    plug_in: PlugInMoments
    count: jax.Array  # () int32, rounds done


def _step_size_config(config, name: str | None = None):
    """The config whose ``step_size`` the algorithm's local steps use, through wrappers; with the
    algorithm's ``name``, refusing what the plug-in's ``eta_T Sigma`` does not describe: a wrapper
    whose ``theta`` is not the wrapped algorithm's iterate (an average, an extrapolation), a server
    optimizer."""
    while not hasattr(config, "step_size") and hasattr(config, "inner"):
        if name is not None and not getattr(config, "reports_inner_iterate", False):
            _validate.fail(
                "algorithm",
                name,
                "it reports another iterate than its local steps' last one (an average or an "
                "extrapolation), whose covariance the plug-in's eta_T Sigma does not describe",
            )
        config = config.inner.config
    if name is not None and getattr(config, "delays", None) is not None:
        _validate.fail(
            "algorithm",
            name,
            "its updates are delayed (fj.delays), which the plug-in's eta_T Sigma does not describe; "
            "the bootstrap's intervals cover it",
        )
    if name is not None and getattr(config, "buffer_size", None) is not None:
        _validate.fail(
            "algorithm",
            name,
            "its contributions follow a simulated clock (fj.fedbuff), while the plug-in replays every "
            "agent every round: its moments and eta_T Sigma do not describe it",
        )
    if name is not None and getattr(config, "local_work", None) is not None:
        _validate.fail(
            "algorithm",
            name,
            "its agents run unequal local work (fj.local_work), which the plug-in's moments and "
            "eta_T Sigma do not follow; the bootstrap's intervals cover it",
        )
    if name is not None and getattr(config, "server_optimizer", None) is not None:
        _validate.fail(
            "algorithm",
            name,
            "its server optimizer changes the step of the iterate, which the plug-in's eta_T Sigma "
            "does not describe; the bootstrap's intervals cover it",
        )
    return config


def init_plug_in(key, problem, theta0, config: PlugInConfig) -> PlugInState:
    inner = config.inner.init(key, problem, theta0)
    N, d, dtype = problem.num_agents, problem.dim, problem.dtype
    moments_ = PlugInMoments(
        jnp.zeros((N,), jnp.int32),
        jnp.zeros((N, d, d), dtype),
        jnp.zeros((N, d), dtype),
        jnp.zeros((N, d, d), dtype),
        init_samplers(key, problem, theta0),  # the key every built-in algorithm draws its samplers from
        jnp.zeros((), dtype),
        jnp.asarray(config.clients_per_round if cohort_active(config, N) else N, dtype),
    )
    error = _error(inner, problem)
    return PlugInState(problem.theta_star + error, error, inner, moments_, jnp.int32(0))


def _observations(rand: RoundRandomness, problem, sampler, config, count):
    """The round's observations ``(N, H_max, ...)`` as the algorithm draws them, the new samplers and
    ``(N, H_max) bool``: which observations the round uses (``h < H_t``, the round's cohort)."""
    params, skip = problem.agent_params(), config.skip
    H = config.inner.num_local_steps
    active = optim.active_steps(config.num_local_steps, count)
    active = jnp.ones((H,), bool) if active is None else active

    def observe(rand, params, sampler):
        return problem.observe(params, sampler, rand, skip)

    if stepwise_observations(config, problem):  # blocks (H_max, N, ...): a chain moves on active steps

        def body(s, xs):
            r, act = xs
            obs, moved = jax.vmap(observe)(r, params, s)
            return jax.tree.map(lambda n, o: jnp.where(act, n, o), moved, s), obs

        new, obs = jax.lax.scan(body, sampler, (rand.obs, active))
        obs = jax.tree.map(lambda x: jnp.moveaxis(x[:, :, 0], 0, 1), obs)  # (N, H_max, ...)
    else:
        obs, new = jax.vmap(observe)(rand.obs, params, sampler)
    cohort = round_cohort(rand, config, problem)
    new = keep_outside(cohort, new, sampler)
    used = jnp.broadcast_to(active, (problem.num_agents, H))
    if cohort is not None:
        used = used & cohort[:, None]
    return obs, new, used


def _last_step_size(config, count, dtype):
    """``eta`` of the round's last local step (``H_t - 1``)."""
    cfg = _step_size_config(config)
    etas = optim.step_sizes(cfg.step_size, count, getattr(cfg, "num_local_steps", 1), dtype)
    if jnp.ndim(etas) == 0:
        return etas
    last = optim.round_local_steps(getattr(cfg, "num_local_steps", 1), count) - 1
    return etas[last]


def step_plug_in(rand: RoundRandomness, state: PlugInState, problem, config: PlugInConfig):
    check_linear(problem, "the plug-in covariance (a linear SA's eta Sigma)")
    m = state.plug_in
    obs, sampler, used = _observations(rand, problem, m.sampler, config, state.count)
    theta = state.theta

    def agent(params, obs, used, count, sum_A, sum_b, sum_noise):
        def one(o):
            def direction(th):  # A_c(Z) th - b_c(Z), and the same as the Jacobian's auxiliary value
                g = problem.direction(params, o, th)
                return g, g

            A, g = jax.jacfwd(direction, has_aux=True)(theta)  # A_c(Z) and g at theta_t, one pass
            return g, A, A @ theta - g

        g, A, b = jax.vmap(one)(obs)  # (H, d), (H, d, d), (H, d)
        w = used.astype(theta.dtype)
        count = count + jnp.sum(used, dtype=jnp.int32)
        sum_A = sum_A + jnp.einsum("h,hij->ij", w, A)
        sum_b = sum_b + w @ b
        n = jnp.maximum(count, 1).astype(theta.dtype)
        eps = g - (sum_A / n @ theta - sum_b / n)  # (H, d): (A_c(Z) - A_hat) theta_t - (b_c(Z) - b_hat)
        sum_noise = sum_noise + jnp.einsum("h,hi,hj->ij", w, eps, eps)
        return count, sum_A, sum_b, sum_noise

    sums = jax.vmap(agent)(problem.agent_params(), obs, used, m.count, m.sum_A, m.sum_b, m.sum_noise)
    eta = _last_step_size(config, state.count, problem.dtype)
    inner, info = config.inner.step_from(rand, state.inner, problem)
    error = _error(inner, problem)
    moments_ = PlugInMoments(*sums, sampler, jnp.asarray(eta, problem.dtype), m.agents)
    return PlugInState(problem.theta_star + error, error, inner, moments_, state.count + 1), info


def theory_plug_in(config: PlugInConfig, problem) -> moments.Recursion | moments.Combination:
    """The algorithm's own description: the plug-in changes nothing of the run."""
    return moments.recursion_of(config.inner, problem)


def gauss_jordan(K: jax.Array, q: jax.Array) -> jax.Array:
    """``K^{-1} q`` by Gauss-Jordan elimination with partial pivoting, in plain XLA operations: a
    LAPACK call batched over thousands of seeds inside the kernel's loop stalled XLA's CPU runtime."""
    n = K.shape[0]
    M = jnp.concatenate([K, q[:, None]], axis=1)

    def eliminate(k, M):
        row = jnp.argmax(jnp.where(jnp.arange(n) >= k, jnp.abs(M[:, k]), -1.0))
        swap = M[jnp.array([k, row])]
        M = M.at[k].set(swap[1]).at[row].set(swap[0])
        pivot = M[k] / M[k, k]
        M = M - M[:, k, None] * pivot[None, :]
        return M.at[k].set(pivot)

    return jax.lax.fori_loop(0, n, eliminate, M)[:, n]


def lyapunov(A: jax.Array, Q: jax.Array) -> jax.Array:
    """``Sigma`` solving ``A Sigma + Sigma A^T = Q`` (``(d, d)``), in the kernel: the ``d^2`` unknowns
    through ``(A (x) I + I (x) A) vec(Sigma) = vec(Q)`` (``scipy.linalg.solve_continuous_lyapunov``
    solves the same on the host, by Bartels-Stewart)."""
    d = A.shape[-1]
    eye = jnp.eye(d, dtype=A.dtype)
    K = jnp.kron(A, eye) + jnp.kron(eye, A)
    return gauss_jordan(K, Q.reshape(d * d)).reshape(d, d)


def plug_in_covariance(m: PlugInMoments) -> jax.Array:
    """``eta_T Sigma``: the plug-in covariance of ``theta_T`` from one seed's moments ``m`` (module
    docstring; the noise averaged over the ``m.agents`` agents of a step: N, or a cohort's m)."""
    n = jnp.maximum(m.count, 1).astype(m.sum_A.dtype)[:, None, None]
    seen = jnp.sum(m.count) > 0  # before the first observation: no estimate, a zero covariance
    A = jnp.where(seen, jnp.mean(m.sum_A / n, axis=0), jnp.eye(m.sum_A.shape[-1], dtype=m.sum_A.dtype))
    noise = jnp.mean(m.sum_noise / n, axis=0) / m.agents
    sigma = lyapunov(A, noise)
    return jnp.where(seen, m.step_size * 0.5 * (sigma + sigma.T), 0.0)


def plug_in(algorithm: Algorithm) -> Algorithm:
    """``algorithm`` with the plug-in estimates of its observations' moments (module docstring),
    named ``"plug_in_<name>"``; the run, its files and exact curves are the algorithm's.

    Args:
      algorithm: any algorithm whose config (or a wrapped one's, through ``inner``) has a
        ``step_size``: FedLSA, SCAFFLSA, Scaffnew, QFedTD, a bootstrap of one
        (``fj.plug_in(fj.bootstrap(alg, B))``).

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4)
      >>> alg = fj.plug_in(fj.bootstrap(fj.fedlsa(0.1, 10), 20))
      >>> res = fj.simulate(jax.random.key(1), problem, alg, 20, 16)
    """
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__, "expected an fj.Algorithm")
    refuse_privacy(
        algorithm,
        "the plug-in",
        "its moments are read from the raw observations and leave the privacy noise out",
    )
    inner = _step_size_config(algorithm.config, algorithm.name)
    if getattr(inner, "cohort_per_step", False):
        _validate.fail(
            "algorithm",
            algorithm.name,
            "its cohort changes within a round (each local step observes as its own cohort), which the "
            "plug-in does not replay; run it with every agent (clients_per_round=None)",
        )
    if not hasattr(inner, "step_size"):
        _validate.fail(
            "algorithm",
            algorithm.name,
            "the plug-in interval needs the step size eta_T: a config with step_size",
        )
    return Algorithm(
        PlugInConfig(algorithm), f"plug_in_{algorithm.name}", init_plug_in, step_plug_in, theory_plug_in
    )
