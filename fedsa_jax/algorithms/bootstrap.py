"""The online multiplier bootstrap: B weighted replicate trajectories per seed, in the kernel.

``fj.bootstrap(algorithm, num_replicates=B, weights="beta")`` runs, for every seed, the main
trajectory of ``algorithm`` exactly as without the option (bit for bit), and B replicate
trajectories on **the same random numbers** (observations, Markov chain paths, channel draws,
cohorts, Scaffnew's coins), in which every local update of every agent is multiplied by its own
i.i.d. weight ``w`` of mean 1 and variance 1, drawn afresh at every local step, agent and
replicate. For FedLSA, with ``eta_t`` the round's step size and ``Z`` the shared observations,

    theta^{c,b}_{t,h+1} = theta^{c,b}_{t,h} - eta_t w^{c,b}_{t,h} (A_c(Z) theta^{c,b}_{t,h} - b_c(Z)),
    Z = Z^c_{t,h+1},

and ``theta^b_{t+1}`` is the server's aggregate of the replicate's agents (Levin, Shuklin,
Moulines, Mangold, Samsonov, "Gaussian Approximation and Multiplier Bootstrap for Federated
Linear Stochastic Approximation", arXiv:2605.19629, 2026, Sec. 4). Given the data, the spread of
``theta^b_T - theta_T`` over the replicates approximates the law of ``theta_T - theta*``: its
quantiles and standard deviation give confidence sets for ``theta*`` from one run
(:mod:`fedsa_jax.inference`).

What a weight multiplies, per algorithm (each one's step function reads ``rand.weights``, an
``(N, H_max)`` array, :class:`~fedsa_jax.algorithms.RoundRandomness`):

* FedLSA: agent c's local update ``eta_h (A_c(Z) theta - b_c(Z))`` at step h;
* SCAFFLSA: the local update with the control variate, ``eta_h (A_c(Z) theta - b_c(Z) - xi_c)``;
  the control variates' own step (divided by ``sum_h eta_h``) is not weighted;
* Scaffnew: the local step ``eta_k (A_c(Z) x_c - b_c(Z) - h_c)``; the communication (divided by
  ``eta_k / p``) is not weighted;
* QFedTD: agent c's TD direction ``g_c = b_c(Z) - A_c(Z) theta`` before the quantizer (one step
  per round: ``w^{c,b}_t``).

A replicate goes through the same channel as the main run (the same quantizer uniforms and
deliveries). The counts (messages, bits, observations) are the main trajectory's: the replicates
reuse its observations. An algorithm of your own takes part by reading ``rand.weights`` in its
step function and declaring it, ``fj.Algorithm(..., weighted=True)``.

Weight laws (``weights=``), each of mean 1 and variance 1:

* ``"beta"`` (default): the standardized Beta(1/2, 2) of the paper, ``1 + (X - 1/5) / sd``,
  ``sd^2 = 8/175``, drawn by its inverse CDF from one uniform u: ``F(x) = (3 s - s^3) / 2`` with
  ``s = sqrt(x)``, so ``s = 2 cos((arccos(-u) - 2 pi) / 3)``; every weight is at least
  ``1 - sqrt(7/8) = 0.065``;
* ``"rademacher"``: 0 or 2 with probability 1/2; ``"exponential"``: a standard exponential;
  ``"gaussian"``: ``1 + Z``;
* ``"ones"``: every weight 1, a check (each replicate is then the main trajectory, bit for bit);
* a function ``law(key, shape, dtype)`` of your own, checked on 2^16 draws (float64): mean and
  variance within 6 standard errors of 1.

Memory: the replicates are a vmapped axis of the state (``B + 1`` copies of the algorithm's per-seed
state, which sizes the driver's seed batches); a bootstrap whose one seed does not fit in the
memory budget is refused before compiling.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate, moments
from fedsa_jax._digest import code_digest
from fedsa_jax.algorithms._base import Algorithm, RoundRandomness
from fedsa_jax.algorithms.averaged import _Wrapper
from fedsa_jax.algorithms.plug_in import PlugInConfig
from fedsa_jax.channel.dp import refuse_privacy

__all__ = ["WEIGHT_LAWS", "BootstrapState", "bootstrap", "replicate_weights"]

BOOTSTRAP_STREAM = 0x626F6F  # fold_in tag of the weights' key ("boo"): a stream of its own
_BETA_MEAN, _BETA_SD = 0.2, float(np.sqrt(8.0 / 175.0))  # Beta(1/2, 2)
_CHECK_DRAWS = 2**16
_CHECK_Z = 6.0


def _uniform(key, shape, dtype):
    """Uniforms on ``[0, 1)`` drawn as one flat block (fused threefry, :mod:`fedsa_jax._prng`)."""
    return _prng.uniform(key, (math.prod(shape),), dtype).reshape(shape)


def _beta(key, shape, dtype):
    # X ~ Beta(1/2, 2) by its inverse CDF: F(x) = (3 s - s^3) / 2 with s = sqrt(x), so s is the root
    # in [0, 1] of s^3 - 3 s + 2 u = 0, s = 2 cos((arccos(-u) - 2 pi) / 3)
    u = _uniform(key, shape, dtype)
    s = 2.0 * jnp.cos((jnp.arccos(-u) - 2.0 * np.pi) / 3.0)
    return 1.0 + (s * s - _BETA_MEAN) / _BETA_SD


def _rademacher(key, shape, dtype):
    return jnp.where(_uniform(key, shape, dtype) < 0.5, 0.0, 2.0).astype(dtype)


def _exponential(key, shape, dtype):
    return -jnp.log1p(-_uniform(key, shape, dtype))


def _gaussian(key, shape, dtype):
    return 1.0 + _prng.normal(key, (math.prod(shape),), dtype).reshape(shape)


def _ones(key, shape, dtype):
    del key
    return jnp.ones(shape, dtype)


WEIGHT_LAWS: dict[str, Callable] = {
    "beta": _beta,
    "rademacher": _rademacher,
    "exponential": _exponential,
    "gaussian": _gaussian,
    "ones": _ones,
}


def _check_law(law: Callable) -> None:
    """Refuse a law of your own whose mean or variance is not 1 (``_CHECK_DRAWS`` draws in float64,
    within ``_CHECK_Z`` standard errors), or that fails or returns the wrong shape."""
    n = _CHECK_DRAWS
    try:
        with jax.enable_x64(True):
            w = np.asarray(law(jax.random.key(0), (n,), jnp.float64), np.float64)
    except Exception as e:  # noqa: BLE001 (any failure of user code is reported as a bad argument)
        _validate.fail("weights", law, f"calling law(key, shape, dtype) failed: {type(e).__name__}: {e}")
    if w.shape != (n,) or not np.all(np.isfinite(w)):
        _validate.fail("weights", law, f"law(key, ({n},), float64) must return {n} finite weights")
    mean, var = float(np.mean(w)), float(np.var(w, ddof=1))
    mean_se = np.sqrt(max(var, 1e-300) / n)
    var_se = np.sqrt(max(float(np.mean((w - mean) ** 4)) - var**2, 1e-300) / n)
    if abs(mean - 1.0) > _CHECK_Z * max(mean_se, 1e-12) or abs(var - 1.0) > _CHECK_Z * max(var_se, 1e-12):
        _validate.fail(
            "weights",
            law,
            f"a weight law must have mean 1 and variance 1; {n} draws have mean {mean:.4g} and variance "
            f"{var:.4g}",
        )


def _law_arg(weights: Any) -> Any:
    """Validated ``weights``: a name of :data:`WEIGHT_LAWS` or a checked function."""
    if isinstance(weights, str):
        _validate.choice("weights", weights, tuple(WEIGHT_LAWS))
        return weights
    if not callable(weights):
        _validate.fail(
            "weights", weights, f"expected one of {', '.join(WEIGHT_LAWS)} or law(key, shape, dtype)"
        )
    _check_law(weights)
    return weights


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BootstrapConfig(_Wrapper):
    inner: Algorithm  # the algorithm whose main and replicate trajectories run
    num_replicates: int = dataclasses.field(default=1, metadata=dict(static=True))  # B
    weights: Any = dataclasses.field(default="beta", metadata=dict(static=True))  # a law's name or function

    reports_inner_iterate = True  # state.theta is the wrapped algorithm's own iterate (fj.plug_in reads it)

    @property
    def trajectories(self) -> int:
        """Trajectories per seed: the main one and B replicates."""
        return 1 + self.num_replicates

    def describe(self) -> dict[str, Any]:
        law = self.weights if isinstance(self.weights, str) else _describe_law(self.weights)
        return {"inner": self.inner.describe(), "num_replicates": self.num_replicates, "weights": law}


def _describe_law(law: Callable) -> Any:
    return {"name": getattr(law, "__qualname__", type(law).__name__), "code": code_digest(law)}


class BootstrapState(NamedTuple):
    theta: jax.Array  # (d,) the main trajectory's iterate (theta_star + error)
    error: jax.Array  # (d,) theta - theta_star
    inner: Any  # the main trajectory's state
    replicates: Any  # the B replicates' states, each leaf with a leading axis B
    count: Any = 0  # () int32, rounds done (what an interval from the exact theory indexes)


def _error(state, problem):
    error = getattr(state, "error", None)
    return state.theta - problem.theta_star if error is None else error


def init_bootstrap(key, problem, theta0, config: BootstrapConfig) -> BootstrapState:
    main = config.inner.init(key, problem, theta0)
    B = config.num_replicates
    replicates = jax.tree.map(lambda x: jnp.broadcast_to(x, (B, *jnp.shape(x))), main)
    error = _error(main, problem)
    return BootstrapState(problem.theta_star + error, error, main, replicates, jnp.int32(0))


def replicate_weights(key: jax.Array, config: BootstrapConfig, num_agents: int, dtype) -> jax.Array:
    """The round's weights ``(B, N, H_max)`` from the round's channel key ``key``:
    ``law(fold_in(key, BOOTSTRAP_STREAM), (B, N, H_max), dtype)``, ``BOOTSTRAP_STREAM = 0x626F6F``
    (a stream of its own)."""
    law = WEIGHT_LAWS[config.weights] if isinstance(config.weights, str) else config.weights
    shape = (config.num_replicates, num_agents, config.inner.num_local_steps)
    return jnp.asarray(law(jax.random.fold_in(key, BOOTSTRAP_STREAM), shape, dtype), dtype)


def step_bootstrap(rand: RoundRandomness, state: BootstrapState, problem, config: BootstrapConfig):
    main, info = config.inner.step_from(rand, state.inner, problem)
    w = replicate_weights(rand.channel, config, problem.num_agents, problem.dtype)

    def replicate(weights, s):
        return config.inner.step_from(rand._replace(weights=weights), s, problem)[0]

    replicates = jax.vmap(replicate)(w, state.replicates)
    error = _error(main, problem)
    return BootstrapState(problem.theta_star + error, error, main, replicates, state.count + 1), info


def theory_bootstrap(config: BootstrapConfig, problem) -> moments.Recursion | moments.Combination:
    """The main trajectory's description: the exact curves are those of the algorithm itself."""
    return moments.recursion_of(config.inner, problem)


def bootstrap(algorithm: Algorithm, num_replicates: int = 100, weights: Any = "beta") -> Algorithm:
    """``algorithm`` with B multiplier-bootstrap replicates per seed (module docstring), named
    ``"bootstrap_<name>"``; ``state.theta`` is the main trajectory's, ``state.replicates.theta``
    the replicates' ``(B, d)``.

    Args:
      algorithm: an algorithm whose step function reads the weights (``algorithm.weighted``):
        FedLSA, SCAFFLSA, Scaffnew, QFedTD, their averages, or one of your own.
      num_replicates: ``B >= 1``.
      weights: the weights' law: ``"beta"`` (standardized Beta(1/2, 2), the default),
        ``"rademacher"``, ``"exponential"``, ``"gaussian"``, ``"ones"`` (a check), or
        ``law(key, shape, dtype)`` of mean 1 and variance 1.

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4)
      >>> alg = fj.bootstrap(fj.fedlsa(0.1, 10), num_replicates=50)
      >>> res = fj.simulate(jax.random.key(1), problem, alg, 20, 64)
    """
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__, "expected an fj.Algorithm to bootstrap")
    refuse_privacy(
        algorithm,
        "the multiplier bootstrap",
        "its replicates reuse the main trajectory's random numbers, the privacy noise included, so "
        "their spread leaves the noise out (and they are releases of their own)",
    )
    if isinstance(algorithm.config, PlugInConfig):
        _validate.fail(
            "algorithm",
            algorithm.name,
            "the plug-in's moments are not replicated: wrap the other way, "
            f"fj.plug_in(fj.bootstrap({algorithm.config.inner.name}, B))",
        )
    if not algorithm.weighted:
        _validate.fail(
            "algorithm",
            algorithm.name,
            "its step function does not read the bootstrap's weights (rand.weights): multiply each "
            "agent's local updates by them and pass weighted=True to fj.Algorithm",
        )
    B = _validate.integer("num_replicates", num_replicates)
    law = _law_arg(weights)
    return Algorithm(
        BootstrapConfig(algorithm, B, law),
        f"bootstrap_{algorithm.name}",
        init_bootstrap,
        step_bootstrap,
        theory_bootstrap,
        weighted=False,
    )
