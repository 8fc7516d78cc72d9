"""Polyak-Ruppert averaging and Richardson-Romberg extrapolation: wrappers of any algorithm.

**Averaging.** ``fj.averaged(algorithm, burn_in=b)`` runs ``algorithm`` unchanged and
reports, as its server iterate, the running mean of the iterates after the burn-in,

    theta_bar_t = (1 / (t - b)) sum_{s=b+1..t} theta_s   for t > b,    theta_bar_t = theta_t   for t <= b,

updated as ``theta_bar_t = theta_bar_{t-1} + (theta_t - theta_bar_{t-1}) / (t - b)`` (in
error coordinates). MSE, plots, sweeps and :mod:`fedsa_jax.theory` apply to it unchanged;
the last iterate's MSE is the metric ``"last_iterate_mse"``. With a constant step the
average of LSA iterates has an O(eta) bias and a variance ``O(1 / (t - b))`` with the
optimal asymptotic covariance ``A^{-1} Sigma A^{-T}`` up to O(eta) terms (Polyak and
Juditsky, 1992); FedLSA's averaged iterate still converges to FedLSA's biased limit.

**Richardson-Romberg.** ``fj.richardson(algorithm)`` runs ``algorithm`` at step sizes
``eta`` and ``2 eta`` (a schedule is scaled by 2) on **the same random numbers** and
reports ``2 theta(eta) - theta(2 eta)``: if ``E[theta_bar(eta)] = theta* + eta B + O(eta^2)``
the O(eta) term cancels, FedLSA's heterogeneity bias included to first order. Apply it
to an averaged algorithm (``fj.richardson(fj.averaged(fj.fedlsa(eta, H)))``): averaging
removes the fluctuations, extrapolation the bias. The pair costs two runs in one kernel
and the variance of ``2 theta(eta) - theta(2 eta)``.

References: Polyak and Juditsky, SIAM J. Control Optim. 30(4), 1992; Durmus, Moulines,
Naumov, Samsonov, Scaman, Wai, "Tight high probability bounds for linear stochastic
approximation with fixed step-size", NeurIPS 2021, and Huo, Chen, Xie, "Bias and
extrapolation in Markovian linear stochastic approximation with constant stepsizes",
2023 (Richardson-Romberg for LSA).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedsa_jax import _validate, moments
from fedsa_jax.algorithms._base import Algorithm, RoundRandomness
from fedsa_jax.channel.dp import refuse_privacy

__all__ = ["AveragedState", "RichardsonState", "averaged", "richardson"]


class _Wrapper:
    """The driver's optional fields, read from the wrapped algorithm."""

    inner: Algorithm

    @property
    def num_local_steps(self):
        """The wrapped config's ``num_local_steps`` (an integer or a table of ``H_t``)."""
        return getattr(self.inner.config, "num_local_steps", 1)

    @property
    def skip(self) -> int:
        return self.inner.skip

    @property
    def channel(self):
        return self.inner.channel

    @property
    def clients_per_round(self):
        return self.inner.clients_per_round

    @property
    def delays(self):
        """The wrapped config's law of delays (:mod:`fedsa_jax.channel.delays`), or None."""
        return getattr(self.inner.config, "delays", None)

    @property
    def local_work(self):
        """The wrapped config's law of the agents' local work (:mod:`fedsa_jax.channel.local_work`),
        or None."""
        return getattr(self.inner.config, "local_work", None)

    @property
    def buffer_size(self):
        """The wrapped config's buffer size (:func:`fedsa_jax.fedbuff`), or None."""
        return getattr(self.inner.config, "buffer_size", None)

    @property
    def durations(self):
        """The wrapped config's law of job durations (:mod:`fedsa_jax.channel.clock`), or None."""
        return getattr(self.inner.config, "durations", None)

    def randomness(self, key, problem):
        """The wrapped algorithm's round randomness (its own where its config draws it)."""
        return self.inner.randomness(key, problem)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AveragedConfig(_Wrapper):
    inner: Algorithm  # the averaged algorithm (its config's leaves stay traced)
    burn_in: int = dataclasses.field(default=0, metadata=dict(static=True))  # b, rounds left out of the mean


class AveragedState(NamedTuple):
    theta: jax.Array  # (d,) theta_star + error: the running mean after the burn-in
    error: jax.Array  # (d,) mean of the inner errors theta_s - theta_star, s = b+1..t
    inner: Any  # the wrapped algorithm's state (its theta is the last iterate)
    count: jax.Array  # () int32, rounds done (t)


def _error(state, problem):
    """``theta - theta_star`` of a state (its ``error`` field where it has one)."""
    error = getattr(state, "error", None)
    return state.theta - problem.theta_star if error is None else error


def init_averaged(key, problem, theta0, config: AveragedConfig) -> AveragedState:
    inner = config.inner.init(key, problem, theta0)
    error = _error(inner, problem)
    return AveragedState(problem.theta_star + error, error, inner, jnp.int32(0))


def step_averaged(rand: RoundRandomness, state: AveragedState, problem, config: AveragedConfig):
    inner, info = config.inner.step_from(rand, state.inner, problem)
    count = state.count + 1
    n = count - config.burn_in  # iterates in the mean
    last = _error(inner, problem)
    running = state.error + (last - state.error) / jnp.maximum(n, 1).astype(last.dtype)
    error = jnp.where(n <= 1, last, running)  # the first averaged iterate is theta_{b+1} itself
    return AveragedState(problem.theta_star + error, error, inner, count), info


def theory_averaged(config: AveragedConfig, problem) -> moments.Recursion:
    """The inner algorithm's description with the running mean ``v`` appended to its state:
    ``v <- v + (theta - v) / (t - b)`` after round ``t > b``; v is reported after the burn-in."""
    inner = moments.recursion_of(config.inner, problem)
    if not isinstance(inner, moments.Recursion):
        _validate.fail(
            "algorithm", config.inner.name, f"exact recursions average one recursion, not {inner.what}"
        )
    y, b, scored = inner.state, config.burn_in, inner.scored
    avg, k = "avg", 1
    while avg in y:  # an average of an average
        k += 1
        avg = f"avg{k}"
    y.add(avg, initial=moments.START)

    def round(t, etas):
        phases = inner.round(t, etas)
        n = t + 1 - b  # iterates in the mean after the round
        return phases if n < 1 else [*phases, moments.averaging(y, n, avg, scored(t + 1))]

    return dataclasses.replace(inner, round=round, scored=lambda t: avg if t > b else scored(t))


def averaged(algorithm: Algorithm, burn_in: int = 0) -> Algorithm:
    """Polyak-Ruppert averaging of ``algorithm`` after ``burn_in`` rounds (module docstring); named
    ``"averaged_<name>"``.

    Example:
      >>> import jax, fedsa_jax as fj
      >>> problem = fj.problems.garnet(jax.random.key(0), num_agents=4)
      >>> alg = fj.averaged(fj.scafflsa(0.1, 10), burn_in=20)
      >>> res = fj.simulate(jax.random.key(1), problem, alg, 200, 64, metrics=["last_iterate_mse"])
    """
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__, "expected an fj.Algorithm to average")
    b = _validate.integer("burn_in", burn_in, 0)
    return Algorithm(
        AveragedConfig(algorithm, b),
        f"averaged_{algorithm.name}",
        init_averaged,
        step_averaged,
        theory_averaged,
        weighted=algorithm.weighted,
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RichardsonConfig(_Wrapper):
    inner: Algorithm  # at step size eta
    doubled: Algorithm  # the same at 2 eta


class RichardsonState(NamedTuple):
    theta: jax.Array  # (d,) theta_star + error
    error: jax.Array  # (d,) 2 e(eta) - e(2 eta)
    inner: Any  # state at eta
    doubled: Any  # state at 2 eta


def init_richardson(key, problem, theta0, config: RichardsonConfig) -> RichardsonState:
    a = config.inner.init(key, problem, theta0)
    b = config.doubled.init(key, problem, theta0)
    error = 2 * _error(a, problem) - _error(b, problem)
    return RichardsonState(problem.theta_star + error, error, a, b)


def step_richardson(rand: RoundRandomness, state: RichardsonState, problem, config: RichardsonConfig):
    a, info = config.inner.step_from(rand, state.inner, problem)
    b, info_b = config.doubled.step_from(rand, state.doubled, problem)  # common random numbers
    error = 2 * _error(a, problem) - _error(b, problem)
    info = jax.tree.map(lambda x, y: x + y, info, info_b)._replace(client_drift=info.client_drift)
    return RichardsonState(problem.theta_star + error, error, a, b), info


def _map_step_size(algorithm: Algorithm, fn) -> Algorithm:
    """``algorithm`` with its config's ``step_size`` replaced by ``fn(step_size)``, through wrappers."""
    config = algorithm.config
    if isinstance(config, _Wrapper):
        wrapper: Any = config  # every _Wrapper is a dataclass
        fields = {
            f.name: _map_step_size(getattr(wrapper, f.name), fn)
            for f in dataclasses.fields(wrapper)
            if isinstance(getattr(wrapper, f.name), Algorithm)
        }
        return dataclasses.replace(algorithm, config=dataclasses.replace(wrapper, **fields))
    eta = getattr(config, "step_size", None)
    if eta is None:
        _validate.fail("algorithm", algorithm.name, "Richardson extrapolation needs a config field step_size")
    return dataclasses.replace(algorithm, config=dataclasses.replace(config, step_size=fn(eta)))


def scale_step_size(algorithm: Algorithm, factor: float) -> Algorithm:
    """``algorithm`` with its step size (or schedule) multiplied by ``factor``, through wrappers."""
    return _map_step_size(
        algorithm, lambda eta: eta.scaled(factor) if hasattr(eta, "scaled") else eta * factor
    )


def with_step_size(algorithm: Algorithm, step_size: float) -> Algorithm:
    """``algorithm`` with the constant step size ``step_size``, through wrappers (both runs of a
    Richardson pair get it)."""
    return _map_step_size(algorithm, lambda eta: step_size)


def theory_richardson(config: RichardsonConfig, problem) -> moments.Combination:
    """``2 E[theta(eta)] - E[theta(2 eta)]``: a combination of the two runs' means (their second
    moments share the noise, so ``exact_mse`` does not cover it)."""
    return moments.Combination(
        ((2.0, config.inner), (-1.0, config.doubled)),
        "Richardson-Romberg extrapolation (its two runs share their noise)",
        "pass the algorithm it extrapolates (its 2 eta run must be stable: halve the bound)",
    )


def richardson(algorithm: Algorithm) -> Algorithm:
    """Richardson-Romberg extrapolation ``2 theta(eta) - theta(2 eta)`` with common random numbers
    (module docstring), named ``"richardson_<name>"``; the counts reported are those of both runs."""
    if not isinstance(algorithm, Algorithm):
        _validate.fail("algorithm", type(algorithm).__name__, "expected an fj.Algorithm")
    refuse_privacy(
        algorithm,
        "Richardson extrapolation",
        "its two runs share their random numbers, the privacy noise included, so their difference "
        "carries none (and each round releases twice)",
    )
    return Algorithm(
        RichardsonConfig(algorithm, scale_step_size(algorithm, 2.0)),
        f"richardson_{algorithm.name}",
        init_richardson,
        step_richardson,
        theory_richardson,
        weighted=algorithm.weighted,
    )
