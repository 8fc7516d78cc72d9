"""Exact moments under Markov sampling (``fj.theory.exact_mean`` / ``exact_mse`` on
``sampling="markov"``): against an enumeration of every chain path, against Monte Carlo, the
refusals, and the power of the check (the i.i.d. curve is far from Markov Monte Carlo)."""

import jax
import numpy as np
import optax
import pytest
from conftest import Z_TOL
from reference import markov_enumerated_moments

import fedsa_jax as fj


def small_garnet(num_agents, num_states, sampling="markov", **kw):
    """A Garnet problem with one action: each state reaches two others (sparse chains: few paths)."""
    return fj.problems.garnet(
        jax.random.key(0),
        num_agents=num_agents,
        num_states=num_states,
        num_actions=1,
        branching=2,
        dim=2,
        gamma=0.8,
        sampling=sampling,
        **kw,
    )


THETA0 = np.array([1.0, -1.0])


@pytest.mark.parametrize(
    "kind, algorithm, T, skip",
    [
        ("fedlsa", fj.fedlsa(0.6, 2), 3, 1),
        ("fedlsa", fj.fedlsa(0.6, 2, skip=2), 2, 2),
        ("scafflsa", fj.scafflsa(0.6, 2), 3, 1),
        ("scafflsa", fj.scafflsa(0.6, 2, skip=2), 2, 2),
        ("qfedtd", fj.qfedtd(0.9, fj.channel.rand_k(1), success_prob=0.7), 3, 1),
    ],
)
def test_exact_equals_path_enumeration(kind, algorithm, T, skip):
    problem = small_garnet(2, 3)
    eta = float(algorithm.config.step_size)
    H = algorithm.config.num_local_steps
    kw = dict(success_prob=0.7, rand_k=1) if kind == "qfedtd" else {}
    mean, mse = markov_enumerated_moments(problem, kind, eta, H, T, skip, THETA0, **kw)
    np.testing.assert_allclose(fj.theory.exact_mean(problem, algorithm, T, THETA0), mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fj.theory.exact_mse(problem, algorithm, T, THETA0), mse, rtol=0, atol=1e-12)
    # power: the i.i.d. recursion misses the enumeration by far more than rounding
    iid = small_garnet(2, 3, sampling="generative")
    assert np.max(np.abs(fj.theory.exact_mse(iid, algorithm, T, THETA0) - mse)) > 1e-4


ALGORITHMS = {
    "fedlsa": fj.fedlsa(0.5, 3),
    "fedlsa, skip 2": fj.fedlsa(0.5, 3, skip=2),
    "scafflsa": fj.scafflsa(0.5, 3),
    "qfedtd": fj.qfedtd(0.8, fj.channel.rand_k(1), success_prob=0.7),
}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_monte_carlo_within_standard_errors(name):
    problem = small_garnet(3, 4)
    alg, T, n = ALGORITHMS[name], 8, 3000
    res = fj.simulate(jax.random.key(1), problem, alg, T, n, theta0=THETA0)
    exact = fj.theory.exact_mse(problem, alg, T, theta0=THETA0)
    z = np.abs(res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(z < Z_TOL), z
    mean = fj.theory.exact_mean(problem, alg, T, theta0=THETA0)
    sem = np.sqrt(exact[:, None] / n)  # E|e|^2 / n bounds each coordinate's variance of the mean
    assert np.all(np.abs(res.theta_mean - mean) <= Z_TOL * sem + 1e-12)
    if alg.skip == 1 and alg.config.num_local_steps > 1:  # power: the i.i.d. curve is far outside
        iid = fj.theory.exact_mse(small_garnet(3, 4, sampling="generative"), alg, T, theta0=THETA0)
        assert np.max(np.abs(res.mse_mean[1:] - iid[1:]) / res.mse_sem[1:]) > 3 * Z_TOL


def test_mean_stability_under_markov_sampling():
    """``mean_spectral_radius`` (hence ``max_stable_step_size``) under Markov sampling is the radius
    of the conditional means' round: the exact Markov mean settles below the bound and blows up
    above it, where the generative radius (and bound) would call the step stable."""
    problem, iid = small_garnet(2, 3), small_garnet(2, 3, sampling="generative")
    bound = fj.theory.max_stable_step_size(problem, "fedlsa", 2)
    assert bound < 0.85 * fj.theory.max_stable_step_size(iid, "fedlsa", 2)  # power
    for factor, stable in ((0.97, True), (1.03, False)):
        alg = fj.fedlsa(factor * bound, 2)
        assert bool(fj.theory.mean_spectral_radius(problem, alg) < 1.0) == stable
        assert fj.theory.mean_spectral_radius(iid, alg) < 0.5
        norms = np.linalg.norm(fj.theory.exact_mean(problem, alg, 1500, theta0=[3.0, -2.0]), axis=1)
        assert bool(norms[-1] < 10.0) == stable and bool(norms[-1] > 1e30) != stable
    # the radius is the exact mean's rate of convergence (skip 2: one real dominant mode)
    alg = fj.fedlsa(0.6, 2, skip=2)
    radius = fj.theory.mean_spectral_radius(problem, alg)
    mean = fj.theory.exact_mean(problem, alg, 150, theta0=[3.0, -2.0])
    gap = np.linalg.norm(mean - fj.theory.stationary_mean(problem, alg), axis=1)
    np.testing.assert_allclose((gap[150] / gap[100]) ** (1 / 50), radius, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "alg",
    [
        fj.scaffnew(0.5, 0.4, 3, skip=2),
        fj.fedlsa(0.5, 3, server_optimizer=optax.sgd(1.0, momentum=0.3)),
        fj.fedlsa(0.5, 3, quantizer=fj.channel.rand_k(1), success_prob=0.6, aggregation="divide_by_received"),
    ],
    ids=["scaffnew-skip2", "fedlsa-momentum", "fedlsa-lossy"],
)
def test_monte_carlo_other_rounds(alg):
    """The other phases act on each conditional moment as on an unconditional one: Scaffnew's coins
    around its local steps, a server optimizer, a lossy channel."""
    problem = small_garnet(3, 4)
    T, n = 8, 4000
    res = fj.simulate(jax.random.key(2), problem, alg, T, n, theta0=THETA0)
    exact = fj.theory.exact_mse(problem, alg, T, theta0=THETA0)
    assert np.all(np.abs(res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:] < Z_TOL)
    mean = fj.theory.exact_mean(problem, alg, T, theta0=THETA0)
    assert np.all(np.abs(res.theta_mean - mean) <= Z_TOL * np.sqrt(exact[:, None] / n) + 1e-12)


def test_refusals_name_the_sizes():
    big = fj.problems.garnet(jax.random.key(0), num_agents=4, num_states=30, dim=2, sampling="markov")
    with pytest.raises(ValueError, match=r"S\^N \* D\^2 = 30\^4 \* 11\^2 = 98010000 entries.*limit"):
        fj.theory.exact_mse(big, fj.fedlsa(0.1, 2), 3)
    with pytest.raises(ValueError, match=r"S\^N \* D = 30\^4 \* 11 = 8910000 entries.*8388608"):
        fj.theory.exact_mean(big, fj.fedlsa(0.1, 2), 3)
    problem = small_garnet(3, 4)

    class NoChains:  # Markov sampling from a problem that does not describe its chains
        def __init__(self, problem):
            self.problem = problem

        def __getattr__(self, name):
            if name == "markov_observations":
                raise AttributeError(name)
            return getattr(self.problem, name)

    with pytest.raises(ValueError, match="problem.sampling='markov' is invalid.*markov_observations"):
        fj.theory.exact_mean(NoChains(problem), fj.fedlsa(0.1, 2), 3)
    with pytest.raises(ValueError, match="clients_per_round=2 is invalid.*Markov sampling.*every agent"):
        fj.theory.exact_mse(problem, fj.fedlsa(0.1, 2, clients_per_round=2), 3)
    with pytest.raises(ValueError, match="clients_per_round=2 is invalid.*Markov sampling"):
        fj.theory.exact_mean(problem, fj.scafflsa(0.1, 2, clients_per_round=2), 3)


@pytest.mark.parametrize(
    "algorithm",
    [fj.fedlsa(0.6, 2, skip=2), fj.scafflsa(0.6, 2), fj.qfedtd(0.9, fj.channel.rand_k(1), success_prob=0.7)],
    ids=["fedlsa-skip2", "scafflsa", "qfedtd"],
)
def test_stationary_values_are_the_long_run_exact_values(algorithm):
    """Under Markov sampling the stationary mean and MSE (fixed points of the conditional moments'
    round) equal exact_mean / exact_mse at a horizon where the recursion has converged."""
    problem = small_garnet(2, 3)
    radius = fj.theory.mean_square_spectral_radius(problem, algorithm)
    assert 0.5 < radius < 1.0
    T = int(np.ceil(np.log(1e-15) / np.log(radius)))
    mean = fj.theory.stationary_mean(problem, algorithm)
    np.testing.assert_allclose(mean, fj.theory.exact_mean(problem, algorithm, T)[-1], rtol=0, atol=1e-11)
    mse = fj.theory.stationary_mse(problem, algorithm)
    np.testing.assert_allclose(mse, fj.theory.exact_mse(problem, algorithm, T)[-1], rtol=1e-10)
    # power: the generative limit is another point
    iid = fj.theory.stationary_mean(small_garnet(2, 3, sampling="generative"), algorithm)
    assert np.max(np.abs(iid - mean)) > 1e-3


def test_stationary_refusals_name_the_sizes():
    problem = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=12, dim=2, sampling="markov")
    with pytest.raises(
        ValueError, match=r"stationary mean under Markov.*S\^N \* 6 = 12\^3 \* 6 = 10368 unknowns"
    ):
        fj.theory.stationary_mean(problem, fj.scafflsa(0.1, 2))
    with pytest.raises(
        ValueError, match=r"second moment under Markov.*S\^N \* 5 = 12\^3 \* 5 = 8640 unknowns"
    ):
        fj.theory.stationary_mse(problem, fj.fedlsa(0.1, 2))
