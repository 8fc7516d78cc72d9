"""FedLSA and SCAFFLSA against exact references.

* numpy loops on tiny problems, fed the kernel's own random numbers: trajectories
  agree to float64 rounding;
* Monte Carlo means and MSEs against exact first/second-moment recursions, within
  Z_TOL standard errors, round by round;
* FedLSA's closed-form bias; SCAFFLSA's mean reaching theta_star;
* reductions: N=1 (SCAFFLSA is FedLSA), H=1 (no bias), noise-free runs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL
from reference import check_against_loop, gaussian_loop, run_jointly, td_loop

import fedsa_jax as fj
from fedsa_jax.problems import td as td_module

ALGS = {"fedlsa": fj.fedlsa, "scafflsa": fj.scafflsa}


TD_THETA0 = np.array([0.5, -0.2])


def _td_problem(tiny_td, sampling):
    """``sampling``'s problem; "state-tables": generative, on the path of large S (per-state alias
    tables and feature rows; build and run it under ``PAIR_TABLE_MAX = 0``)."""
    P, r, Phi = tiny_td
    problem = fj.problems.federated_td(
        P, r, Phi, 0.9, sampling=sampling.replace("state-tables", "generative")
    )
    assert problem.pair_tables == (td_module.PAIR_TABLE_MAX > 0)
    return problem


@pytest.fixture(scope="module")
def td_runs(tiny_td):
    """``(name, sampling, skip) -> (problem, result)``: the driver's runs of the test below (6 rounds, 3
    seeds, key 11), FedLSA and SCAFFLSA of one problem side by side in one compiled program
    (``run_jointly``: each the lone ``fj.simulate``, to float rounding)."""
    runs = {}
    for sampling, skip in TD_CASES:
        with pytest.MonkeyPatch.context() as mp:
            if sampling == "state-tables":
                mp.setattr(td_module, "PAIR_TABLE_MAX", 0)
            problem = _td_problem(tiny_td, sampling)
            algs = [ALGS[name](0.3, 4, skip=skip) for name in ALGS]
            results = run_jointly(jax.random.key(11), problem, algs, 6, 3, theta0=TD_THETA0)
        runs.update({(name, sampling, skip): (problem, res) for name, res in zip(ALGS, results)})
    return runs


TD_CASES = [("generative", 1), ("markov", 1), ("markov", 3), ("state-tables", 1)]


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
@pytest.mark.parametrize("sampling,skip", TD_CASES)
def test_td_matches_numpy_loop(tiny_td, td_runs, name, sampling, skip):
    problem, res = td_runs[name, sampling, skip]
    assert problem.pair_tables == (sampling != "state-tables")
    alg = ALGS[name](0.3, 4, skip=skip)
    # seed by seed, and the seeds' mean, standard error and MSE statistics at every recorded round
    check_against_loop(
        problem, alg, td_loop, T=6, num_seeds=3, theta0=TD_THETA0, key=jax.random.key(11), result=res
    )


@pytest.fixture(scope="module")
def pair_runs(het_gaussian):
    """``name -> result`` per test below, FedLSA and SCAFFLSA side by side in one compiled program
    (``run_jointly``: each the lone ``fj.simulate``, to float rounding)."""

    def both(key, problem, H, eta, T, n, theta0=None):
        algs = [ALGS[name](eta, H) for name in ALGS]
        return dict(zip(ALGS, run_jointly(jax.random.key(key), problem, algs, T, n, theta0=theta0)))

    garnet = fj.problems.garnet(jax.random.key(1), num_agents=4, num_states=8, dim=3)
    return {
        "gaussian_loop": both(2, het_gaussian, 3, 0.1, 5, 2),
        "second_moments": both(7, het_gaussian, 4, 0.15, 40, 4000, np.array([1.0, -1.0, 0.5])),
        "td_mean": (garnet, both(2, garnet, 5, 0.5, 30, 4000, np.ones(3))),
    }


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_gaussian_matches_numpy_loop(het_gaussian, pair_runs, name):
    res = pair_runs["gaussian_loop"][name]
    check_against_loop(
        het_gaussian, ALGS[name](0.1, 3), gaussian_loop, T=5, num_seeds=2, key=jax.random.key(2), result=res
    )


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_gaussian_mse_matches_exact_second_moments(het_gaussian, pair_runs, name):
    """Monte Carlo MSE vs the exact second-moment recursion, every round."""
    alg = ALGS[name](0.15, 4)
    T, theta0 = 40, np.array([1.0, -1.0, 0.5])
    res = pair_runs["second_moments"][name]  # fj.simulate(key(7), het_gaussian, alg, T, 4000, theta0=theta0)
    assert res.num_seeds == 4000
    exact = fj.theory.exact_mse(het_gaussian, alg, T, theta0=theta0)
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), z
    assert res.mse_mean[0] == pytest.approx(exact[0], rel=1e-12)  # deterministic start
    # the test has power: the MSE moves far more than the tolerance over the run
    assert exact[0] - exact[-1] > 100 * Z_TOL * res.mse_sem[-1]


def scalar_recursion(a, b, sA, sb, eta, T, x0):
    """N = 1, H = 1, d = 1: m' = (1 - eta a) m + eta b,
    M' = (1 - eta a)^2 M + 2 (1 - eta a) eta b m + eta^2 b^2 + eta^2 (sA^2 M + sb^2)."""
    m, M = x0, x0**2
    out = [M - 2 * m * (b / a) + (b / a) ** 2]
    for _ in range(T):
        B = 1 - eta * a
        M = B**2 * M + 2 * B * eta * b * m + (eta * b) ** 2 + eta**2 * (sA**2 * M + sb**2)
        m = B * m + eta * b
        out.append(M - 2 * m * (b / a) + (b / a) ** 2)
    return np.array(out)


def test_exact_mse_against_scalar_closed_recursion():
    p = fj.problems.gaussian_lsa([[[0.8]]], [[0.4]], noise_A=0.3, noise_b=0.7)
    for name in ALGS:
        got = fj.theory.exact_mse(p, ALGS[name](0.2, 1), 25, theta0=[2.0])
        np.testing.assert_allclose(got, scalar_recursion(0.8, 0.4, 0.3, 0.7, 0.2, 25, 2.0), rtol=1e-12)


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_td_mean_matches_exact_mean_recursion(pair_runs, name):
    """Generative TD: E[theta_t] follows the noise-free mean recursion exactly."""
    p, runs = pair_runs["td_mean"]  # garnet(key(1), num_agents=4, num_states=8, dim=3)
    alg = ALGS[name](0.5, 5)
    T = 30
    res = runs[name]  # fj.simulate(key(2), p, alg, T, 4000, theta0=ones(3))
    assert res.num_seeds == 4000
    exact = fj.theory.exact_mean(p, alg, T, theta0=np.ones(3))
    z = (res.theta_mean[1:] - exact[1:]) / res.theta_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), np.abs(z).max()
    assert np.linalg.norm(exact[0] - exact[-1]) > 50 * Z_TOL * res.theta_sem[-1].max()


@pytest.fixture(scope="module")
def quiet_runs(het_gaussian):
    """``name -> result``: FedLSA and SCAFFLSA (eta 0.1, H = 8) on ``het_gaussian`` without noise, one
    seed, 3000 rounds from 0, side by side in one compiled program (each the lone run, key 0)."""
    quiet = fj.problems.gaussian_lsa(het_gaussian.A_bar, het_gaussian.b_bar, 0.0, 0.0)
    algs = [ALGS[name](0.1, 8) for name in ALGS]
    return dict(zip(ALGS, run_jointly(jax.random.key(0), quiet, algs, 3000, 1, record_every=3000)))


def test_fedlsa_bias_closed_form(het_gaussian, quiet_runs):
    eta, H = 0.1, 8
    bias = fj.theory.fedlsa_bias(het_gaussian, eta, H)
    theta_star = np.asarray(het_gaussian.theta_star)
    assert np.linalg.norm(bias) > 1e-2  # heterogeneous: a real bias
    # definition: [mean(I - B^H)]^{-1} mean (I - B^H)(theta_c* - theta*), evaluated directly
    A = np.asarray(het_gaussian.A_bar)
    I = np.eye(3)
    M = [I - np.linalg.matrix_power(I - eta * A[c], H) for c in range(3)]
    direct = np.linalg.solve(
        np.mean(M, 0),
        np.mean([M[c] @ (np.asarray(het_gaussian.local_theta_star[c]) - theta_star) for c in range(3)], 0),
    )
    np.testing.assert_allclose(bias, direct, rtol=1e-10)
    # the exact mean recursion converges there ...
    mean = fj.theory.exact_mean(het_gaussian, fj.fedlsa(eta, H), 3000)
    np.testing.assert_allclose(mean[-1] - theta_star, bias, rtol=1e-9, atol=1e-12)
    # ... and so does a noise-free simulation: fj.simulate(key(0), quiet, fj.fedlsa(eta, H), 3000, 1)
    res = quiet_runs["fedlsa"]
    np.testing.assert_allclose(res.final_theta[0] - theta_star, bias, rtol=1e-9, atol=1e-12)
    # ... and the Monte Carlo mean of the noisy run, within standard errors
    noisy = fj.simulate(jax.random.key(0), het_gaussian, fj.fedlsa(eta, H), 400, 4000, record_every=400)
    z = (noisy.theta_mean[-1] - (theta_star + bias)) / noisy.theta_sem[-1]
    assert np.all(np.abs(z) < Z_TOL), z
    # no bias with one local step or identical agents
    assert np.linalg.norm(fj.theory.fedlsa_bias(het_gaussian, eta, 1)) < 1e-12
    same = fj.problems.random_gaussian_lsa(jax.random.key(3), 3, 3, heterogeneity=0.0)
    assert np.linalg.norm(fj.theory.fedlsa_bias(same, eta, H)) < 1e-12


def test_scafflsa_mean_reaches_theta_star(het_gaussian, quiet_runs):
    eta, H = 0.1, 8
    theta_star = np.asarray(het_gaussian.theta_star)
    mean = fj.theory.exact_mean(het_gaussian, fj.scafflsa(eta, H), 3000)
    np.testing.assert_allclose(mean[-1], theta_star, rtol=1e-9, atol=1e-12)
    quiet = fj.problems.gaussian_lsa(het_gaussian.A_bar, het_gaussian.b_bar, 0.0, 0.0)
    # fj.simulate(key(0), quiet, fj.scafflsa(eta, H), 3000, 1, record_every=3000)
    res = quiet_runs["scafflsa"]
    np.testing.assert_allclose(res.final_theta[0], theta_star, rtol=1e-9, atol=1e-12)
    # and the ideal control variates are reached: xi_c* = A_c theta* - b_c, summing to 0
    problem = het_gaussian
    alg = fj.scafflsa(eta, H)
    state = alg.init(jax.random.key(0), quiet, jnp.zeros(3))
    step = jax.jit(lambda k, s: alg.step(k, s, quiet))
    for t in range(3000):
        state, _ = step(jax.random.key(t), state)
    xi_star = np.einsum("cij,j->ci", np.asarray(problem.A_bar), theta_star) - np.asarray(problem.b_bar)
    np.testing.assert_allclose(np.asarray(state.xi), xi_star, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(state.xi).sum(0), 0.0, atol=1e-10)


def test_reductions(tiny_td):
    P, r, Phi = tiny_td
    one = fj.problems.federated_td(P[:1], r[:1], Phi, 0.9)
    key = jax.random.key(4)
    # N = 1: the control variate stays 0 and SCAFFLSA is FedLSA, seed by seed
    a = fj.simulate(key, one, fj.fedlsa(0.2, 5), 10, 16)
    b = fj.simulate(key, one, fj.scafflsa(0.2, 5), 10, 16)
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    # N = 1, noise-free: H local steps per round for T rounds is plain LSA for H*T steps
    quiet = fj.problems.gaussian_lsa(np.asarray(one.A_bar), np.asarray(one.b_bar), 0.0, 0.0)
    x = fj.simulate(key, quiet, fj.fedlsa(0.2, 5), 6, 1).final_theta
    y = fj.simulate(key, quiet, fj.fedlsa(0.2, 1), 30, 1).final_theta
    np.testing.assert_allclose(x, y, rtol=1e-13)
    # H = 1: FedLSA is unbiased and its mean follows (I - eta mean A) m + eta mean b
    p = fj.problems.federated_td(P, r, Phi, 0.9)
    m = fj.theory.exact_mean(p, fj.fedlsa(0.2, 1), 20)
    A, bb = np.mean(np.asarray(p.A_bar), 0), np.mean(np.asarray(p.b_bar), 0)
    ref = [np.zeros(2)]
    for _ in range(20):
        ref.append(ref[-1] - 0.2 * (A @ ref[-1] - bb))
    np.testing.assert_allclose(m, np.array(ref), rtol=1e-12, atol=1e-15)


def test_scafflsa_h1_float32_stays_fedlsa():
    """With H = 1 SCAFFLSA's iterate is FedLSA's in exact arithmetic (sum_c xi_c = 0 cancels).
    In float32 the control-variate increments carry rounding errors amplified by 1/eta; unless
    their sum is removed each round, sum_c xi_c drifts and the iterate runs away."""
    p = fj.problems.garnet(jax.random.key(0), num_agents=10, dtype="float32")
    eta, T = 0.01, 20_000
    a = fj.simulate(jax.random.key(1), p, fj.scafflsa(eta, 1), T, 4, record_every=T)
    b = fj.simulate(jax.random.key(1), p, fj.fedlsa(eta, 1), T, 4, record_every=T)
    alg = fj.scafflsa(eta, 1)
    state = alg.init(jax.random.key(0), p, jnp.zeros(p.dim, jnp.float32))

    def body(s, t):
        return alg.step(jax.random.fold_in(jax.random.key(2), t), s, p)[0], None

    state = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(T))[0])(state)
    scale = float(jnp.max(jnp.abs(state.xi)))
    assert float(jnp.max(jnp.abs(state.xi.sum(0)))) < 1e-4 * scale
    np.testing.assert_allclose(a.final_theta, b.final_theta, rtol=1e-2, atol=1e-2)
