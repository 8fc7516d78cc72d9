"""Stationary values and mean-square stability, solved directly (fj.theory.stationary_*).

References: the exact recursions run until they have converged (exact_mean / exact_mse at a horizon
where the second-moment operator's radius to that power is below 1e-13), Monte Carlo's long-run MSE
within Z_TOL standard errors, and simulation on both sides of the mean-square threshold.
"""

import math

import jax
import numpy as np
import optax
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax.theory import stationary


@pytest.fixture(scope="module")
def problems(het_gaussian):
    td = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=3)
    return {"gaussian": (het_gaussian, 0.1), "td": (td, 0.3)}


CASES = {
    "fedlsa": lambda eta: fj.fedlsa(eta, 3),
    "scafflsa": lambda eta: fj.scafflsa(eta, 3),
    "qfedtd_randk_erasures": lambda eta: fj.qfedtd(eta, quantizer=fj.channel.rand_k(2), success_prob=0.7),
    "fedlsa_received": lambda eta: fj.fedlsa(
        eta, 2, success_prob=0.6, quantizer=fj.channel.rand_k(2), aggregation="divide_by_received"
    ),
    "scaffnew": lambda eta: fj.scaffnew(eta, 0.4, 3),
    "fedlsa_momentum": lambda eta: fj.fedlsa(eta, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)),
    "scaffnew_momentum": lambda eta: fj.scaffnew(eta, 0.5, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)),
}


def _converged_horizon(problem, alg, precision=1e-13):
    rho = fj.theory.mean_square_spectral_radius(problem, alg)
    assert rho < 1
    return math.ceil(np.log(precision) / np.log(rho))


@pytest.mark.parametrize("family", ["gaussian", "td"])
@pytest.mark.parametrize("name", list(CASES))
def test_stationary_values_equal_the_converged_recursions(problems, family, name):
    problem, eta = problems[family]
    alg = CASES[name](eta)
    mse = fj.theory.stationary_mse(problem, alg)
    T = _converged_horizon(problem, alg)
    np.testing.assert_allclose(mse, fj.theory.exact_mse(problem, alg, T)[-1], rtol=1e-10)
    mean = fj.theory.stationary_mean(problem, alg)
    np.testing.assert_allclose(mean, fj.theory.exact_mean(problem, alg, T)[-1], rtol=1e-10, atol=1e-12)


def test_stationary_mean_of_fedlsa_is_theta_star_plus_its_bias(problems):
    problem, eta = problems["gaussian"]
    np.testing.assert_allclose(
        fj.theory.stationary_mean(problem, fj.fedlsa(eta, 4)),
        np.asarray(problem.theta_star) + fj.theory.fedlsa_bias(problem, eta, 4),
        rtol=1e-12,
    )
    np.testing.assert_allclose(  # SCAFFLSA has no heterogeneity bias
        fj.theory.stationary_mean(problem, fj.scafflsa(eta, 4)), problem.theta_star, rtol=1e-12, atol=1e-13
    )


@pytest.mark.parametrize("family", ["gaussian", "td"])
def test_monte_carlo_long_run_mse_matches_the_stationary_mse(problems, family):
    problem, eta = problems[family]
    for alg in (fj.fedlsa(eta, 3), fj.scafflsa(eta, 3)):
        T = _converged_horizon(problem, alg, precision=1e-5)
        res = fj.simulate(jax.random.key(5), problem, alg, T, 2000, record_every=T)
        target = fj.theory.stationary_mse(problem, alg)
        exact_T = fj.theory.exact_mse(problem, alg, T)[-1]
        assert abs(exact_T - target) < 0.05 * res.mse_sem[-1]  # the horizon has converged
        assert abs(res.mse_mean[-1] - target) < Z_TOL * res.mse_sem[-1], (alg.name, res.mse_mean[-1], target)


# ------------------------------------------------------------------ mean-square stability


@pytest.fixture(scope="module")
def noisy():
    """Large multiplicative noise: mean-square stability needs a much smaller step than the mean."""
    return fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=1.0, noise_A=1.0, noise_b=0.5
    )


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa", "qfedtd"])
def test_the_mean_square_threshold_separates_bounded_from_growing_second_moments(noisy, name):
    tol = 1e-6
    H = 1 if name == "qfedtd" else 3
    factory = {
        "fedlsa": lambda eta: fj.fedlsa(eta, H),
        "scafflsa": lambda eta: fj.scafflsa(eta, H),
        "qfedtd": lambda eta: fj.qfedtd(eta, quantizer=fj.channel.rand_k(2), success_prob=0.8),
    }[name]
    alg = factory(0.1)
    mean_bound = fj.theory.max_stable_step_size(noisy, alg, tol=tol)
    ms_bound = fj.theory.max_stable_step_size(noisy, alg, tol=tol, kind="mean_square")
    assert ms_bound < 0.8 * mean_bound  # mean-stable, not mean-square stable, in between
    # exactly, within one bisection tolerance on each side
    below, above = factory(ms_bound * (1 - 2 * tol)), factory(ms_bound * (1 + 2 * tol))
    assert (
        fj.theory.mean_square_spectral_radius(noisy, below)
        < 1
        <= fj.theory.mean_square_spectral_radius(noisy, above)
    )
    between = factory(0.5 * (ms_bound + mean_bound))
    assert fj.theory.mean_spectral_radius(noisy, between) < 1
    with pytest.raises(ValueError, match="spectral radius .* >= 1: no limit"):
        fj.theory.stationary_mse(noisy, between)
    # in simulation: bounded at 0.7 x the threshold; at 1.4 x more and more seeds run away (the
    # driver counts them as diverged; the second moment is carried by that growing tail)
    T, n = 200, 2000
    res = fj.simulate(jax.random.key(1), noisy, factory(0.7 * ms_bound), T, n, record_every=T // 2)
    exact = fj.theory.exact_mse(noisy, factory(0.7 * ms_bound), T)
    assert exact[T] < 1.01 * exact[T // 2]
    assert res.num_diverged[-1] == 0
    assert res.mse_mean[2] < res.mse_mean[1] + Z_TOL * np.hypot(res.mse_sem[1], res.mse_sem[2])
    with pytest.warns(RuntimeWarning, match="seeds diverged"):
        res = fj.simulate(jax.random.key(1), noisy, factory(1.4 * ms_bound), T, n, record_every=T // 2)
    exact = fj.theory.exact_mse(noisy, factory(1.4 * ms_bound), T)
    assert exact[T] > 10 * exact[T // 2]
    runaway = res.num_diverged  # seeds past the divergence threshold, at rounds 0, T/2, T
    assert runaway[-1] == n or runaway[2] > runaway[1] > 0, runaway


def test_mean_square_radius_is_at_least_the_mean_radius(problems):
    problem, _ = problems["td"]
    for eta in (0.05, 0.3, 1.0):
        for alg in (fj.fedlsa(eta, 3), fj.scafflsa(eta, 3)):
            assert fj.theory.mean_square_spectral_radius(problem, alg) >= fj.theory.mean_spectral_radius(
                problem, alg
            ) * (1 - 1e-12)


# ------------------------------------------------------------------ refusals


def test_refusals_name_the_reason_and_the_sizes(problems, monkeypatch):
    problem, eta = problems["gaussian"]
    with pytest.raises(ValueError, match="stationary_mse needs a constant step size"):
        fj.theory.stationary_mse(problem, fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=eta, k0=10.0), 2))
    with pytest.raises(ValueError, match="its round changes with t"):
        fj.theory.stationary_mean(problem, fj.averaged(fj.fedlsa(eta, 2)))
    with pytest.raises(ValueError, match="stationary_mean does not cover"):
        fj.theory.stationary_mean(problem, fj.richardson(fj.fedlsa(eta, 2)))
    with pytest.raises(ValueError, match=r"spectral radius [0-9.]+ >= 1"):
        fj.theory.stationary_mean(problem, fj.fedlsa(100.0, 2))
    monkeypatch.setattr(stationary, "MAX_STATIONARY_UNKNOWNS", 10)
    with pytest.raises(
        ValueError,
        match=r"has 54 unknowns \(10 persistent coordinates of the 22 .*N=3, d=3\) > MAX_STATIONARY",
    ):
        fj.theory.stationary_mse(problem, fj.scafflsa(eta, 2))
    with pytest.raises(ValueError, match="kind='variance' is invalid"):
        fj.theory.max_stable_step_size(problem, "fedlsa", 2, kind="variance")


# ------------------------------------------------------------------ the matrix-free solve


def test_gmres_solves_a_nonsymmetric_system_like_a_dense_solve():
    from fedsa_jax.theory._operator import gmres

    rng = np.random.default_rng(0)
    n = 120
    A = np.eye(n) + 0.9 * rng.standard_normal((n, n)) / np.sqrt(n)  # nonsymmetric, well conditioned
    b = rng.standard_normal(n)
    for restart in (200, 7):  # full, and restarted every 7 applications
        x, residual, used = gmres(lambda v: A @ v, b, tol=1e-13, restart=restart, maxiter=5000)
        assert residual <= 1e-13 and used < 5000
        np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-10, atol=1e-12)


def test_stationary_mse_applies_few_rounds_and_equals_the_assembled_solve(monkeypatch):
    """The fixed point by GMRES (a few dozen rounds) equals the dense solve of the assembled operator
    (one round per unknown), on a problem where the operator has hundreds of unknowns."""
    problem = fj.problems.garnet(jax.random.key(0), num_agents=8, num_states=8, dim=4)
    alg = fj.scafflsa(0.2, 3)
    st = stationary._setup(problem, alg, "stationary_mse")
    op = stationary._operator(st, alg.name, "MAX_ASSEMBLED_UNKNOWNS")
    M, _ = op.assemble()
    dense = op.second_moment(np.linalg.solve(np.eye(len(M)) - M, op.constant))
    scored = st.rec.state["theta"]
    rounds = []
    linear = stationary.Operator.linear
    monkeypatch.setattr(stationary.Operator, "linear", lambda self, v: rounds.append(1) or linear(self, v))
    mse = fj.theory.stationary_mse(problem, alg)
    assert op.n > 200 and len(rounds) < op.n / 4, (op.n, len(rounds))
    np.testing.assert_allclose(mse, np.trace(dense[scored, scored]), rtol=1e-10)


def test_the_matrix_free_certificate_refuses_between_the_mean_and_the_mean_square_bounds(noisy, monkeypatch):
    """With the Krylov path forced on a small problem: the same value as the dense path where stable,
    and the positive-definiteness certificate refuses where only the mean is stable."""
    alg = fj.scafflsa(0.1, 3)
    mean_bound = fj.theory.max_stable_step_size(noisy, alg, tol=1e-4)
    ms_bound = fj.theory.max_stable_step_size(noisy, alg, tol=1e-4, kind="mean_square")
    stable, between = fj.scafflsa(0.5 * ms_bound, 3), fj.scafflsa(0.5 * (ms_bound + mean_bound), 3)
    dense = fj.theory.stationary_mse(noisy, stable)
    monkeypatch.setattr(stationary, "DENSE_UNKNOWNS", 0)
    np.testing.assert_allclose(fj.theory.stationary_mse(noisy, stable), dense, rtol=1e-10)
    with pytest.raises(ValueError, match="spectral radius .* >= 1: no limit"):
        fj.theory.stationary_mse(noisy, between)


def _rounded(A, calls):
    """``A v`` good to about 1e-11 relative, as a round of the recursion is (its rounding): GMRES on it
    stagnates between the target 1e-13 and the accepted 1e-10."""
    n, noise = len(A), np.random.default_rng(7)

    def matvec(v):
        calls.append(1)
        return A @ v + 1e-11 * np.linalg.norm(v) * noise.standard_normal(n) / np.sqrt(n)

    return matvec


def test_a_solve_stagnating_above_the_target_stops_and_is_kept():
    """GMRES stops once a cycle no longer lowers the true residual (the old solver spent its 3000
    rounds there, then refused a residual of 1e-11 as "invalid"); the fixed point is kept up to the
    accepted residual 1e-10, its error then within what the printed digits need."""
    from fedsa_jax.theory._operator import gmres

    rng = np.random.default_rng(1)
    n = 60
    A = np.eye(n) + 0.5 * rng.standard_normal((n, n)) / np.sqrt(n)
    b = rng.standard_normal(n)
    calls = []
    _, residual, used = gmres(
        _rounded(A, calls), b, tol=stationary._TOL, maxiter=stationary._MAX_APPLICATIONS
    )
    assert stationary._TOL < residual <= stationary._ACCEPT and used < 300, (residual, used)
    calls.clear()
    x = stationary._solve(None, _rounded(A, calls), b, "fedlsa", "the stationary moment")
    assert len(calls) < 300
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-8)


def test_a_failed_solve_names_the_solver_not_the_algorithm():
    """(I - M) singular along b (M has eigenvalue 1): no fixed point; GMRES stops after its first
    cycles, and the message says what failed (the solver, its residual, the tolerance) without calling
    the algorithm invalid."""
    n = 40
    scale = np.r_[0.0, np.linspace(0.5, 1.5, n - 1)]
    calls = []
    singular = lambda v: calls.append(1) or scale * v  # noqa: E731
    with pytest.raises(ValueError) as caught:
        stationary._solve(None, singular, np.ones(n), "fedlsa", "the stationary moment")
    message = str(caught.value)
    assert message.startswith(
        "fedlsa: GMRES did not solve for the stationary moment: it stopped improving after"
    ), message
    assert "relative residual 0.158 > 1e-10 (tolerance 1e-13)" in message and "invalid" not in message
    assert len(calls) < 100
