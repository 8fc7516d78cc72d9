"""fj.theory against independent exact references and Monte Carlo.

* exact_mse (generative TD, channels) against a brute-force enumeration of every
  outcome of a round's randomness (tests/reference.py), to 1e-10 relative error;
* exact_mse against Monte Carlo within Z_TOL standard errors;
* FedLSA's per-round bias against the exact mean recursion and its limit;
* step-size bounds against closed forms; mixing times of a two-state chain;
* clear errors where the exact recursion does not apply.
"""

import jax
import numpy as np
import pytest
from conftest import Z_TOL
from reference import enumerated_algorithm_mse

import fedsa_jax as fj


@pytest.fixture(scope="module")
def td2(tiny_td):
    P, r, Phi = tiny_td
    return fj.problems.federated_td(P[:2], r[:2], Phi, 0.9)


CASES = {
    "fedlsa": lambda: fj.fedlsa(0.4, 2),
    "scafflsa": lambda: fj.scafflsa(0.4, 2),
    "qfedtd": lambda: fj.qfedtd(0.6),
    "qfedtd_randk_erasures": lambda: fj.qfedtd(0.6, fj.channel.rand_k(1), success_prob=0.7),
    "qfedtd_received": lambda: fj.qfedtd(0.6, success_prob=0.5, aggregation="divide_by_received"),
    "fedlsa_randk_received": lambda: fj.fedlsa(
        0.4, 2, quantizer=fj.channel.rand_k(1), success_prob=0.6, aggregation="divide_by_received"
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exact_mse_matches_enumeration(td2, case):
    alg = CASES[case]()
    theta0 = np.array([0.7, -0.4])
    T = 5
    got = fj.theory.exact_mse(td2, alg, T, theta0=theta0)
    ref = enumerated_algorithm_mse(td2, alg, T, theta0=theta0)
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    assert np.all(np.diff(got[:2]) != 0)  # a moving curve, not a constant


@pytest.mark.parametrize("case", ["fedlsa", "scafflsa", "qfedtd_randk_erasures", "fedlsa_randk_received"])
def test_exact_td_mse_matches_monte_carlo(tiny_td, case):
    """Generative TD on 3 heterogeneous agents: MC MSE within Z_TOL s.e. of exact, every 4th round."""
    P, r, Phi = tiny_td
    problem = fj.problems.federated_td(P, r, Phi, 0.9)
    alg = CASES[case]()
    T, n = 24, 20000
    theta0 = np.array([1.0, -1.0])
    res = fj.simulate(jax.random.key(5), problem, alg, T, n, theta0=theta0, record_every=4)
    exact = fj.theory.exact_mse(problem, alg, T, theta0=theta0)[res.rounds]
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    assert exact[-1] < 0.8 * exact[0]  # a converging curve, not a constant


@pytest.mark.parametrize("aggregation", ["divide_by_n", "divide_by_received"])
def test_exact_gaussian_mse_with_lossy_channel_matches_monte_carlo(het_gaussian, aggregation):
    alg = fj.fedlsa(0.15, 3, quantizer=fj.channel.rand_k(2), success_prob=0.5, aggregation=aggregation)
    T, n = 30, 20000
    theta0 = np.array([1.0, -1.0, 0.5])
    res = fj.simulate(jax.random.key(8), het_gaussian, alg, T, n, theta0=theta0, record_every=3)
    exact = fj.theory.exact_mse(het_gaussian, alg, T, theta0=theta0)
    z = (res.mse_mean[1:] - exact[res.rounds][1:]) / res.mse_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    # the channel terms matter: without them the curve is well outside the Monte Carlo band
    lossless = fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.15, 3), T, theta0=theta0)
    assert np.max(np.abs(res.mse_mean[1:] - lossless[res.rounds][1:]) / res.mse_sem[1:]) > 3 * Z_TOL


def test_weights_for_many_agents(het_gaussian):
    """Binomial weights in log space: no overflow for N > 1000."""
    from fedsa_jax.moments.aggregation import _binomial_inverse_mean

    n, p = 3000, 0.3
    # closed form: E[1 / (1 + X)] = (1 - (1 - p)^(n+1)) / ((n + 1) p)
    assert _binomial_inverse_mean(n, p, 1) == pytest.approx(
        (1 - (1 - p) ** (n + 1)) / ((n + 1) * p), rel=1e-10
    )
    assert _binomial_inverse_mean(7, 0.4, 1) == pytest.approx((1 - 0.6**8) / (8 * 0.4), rel=1e-12)
    assert _binomial_inverse_mean(5, 1.0, 2, 2) == 1 / 49
    big = fj.problems.random_gaussian_lsa(jax.random.key(1), num_agents=1500, dim=1)
    m = fj.theory.exact_mean(big, fj.qfedtd(0.1, success_prob=0.5, aggregation="divide_by_received"), 3)
    assert np.all(np.isfinite(m))


def test_fedlsa_per_round_bias(het_gaussian):
    eta, H, T = 0.1, 5, 300
    per_round = fj.theory.fedlsa_bias(het_gaussian, eta, H, num_rounds=T)
    assert per_round.shape == (T + 1, het_gaussian.dim) and np.all(per_round[0] == 0)
    # started at theta_star, the mean's deviation is exactly the per-round bias
    star = np.asarray(het_gaussian.theta_star)
    mean = fj.theory.exact_mean(het_gaussian, fj.fedlsa(eta, H), T, theta0=star)
    np.testing.assert_allclose(mean - star, per_round, atol=1e-12)
    # first step is rho_bar_H, and the curve tends to the closed-form limit
    np.testing.assert_allclose(per_round[1], fj.theory.fedlsa_round_bias(het_gaussian, eta, H), atol=1e-14)
    limit = fj.theory.fedlsa_bias(het_gaussian, eta, H)
    np.testing.assert_allclose(per_round[-1], limit, rtol=1e-6)
    assert np.linalg.norm(limit) > 1e-3


def test_round_bias_vanishes_for_one_step_or_identical_agents(het_gaussian):
    assert np.linalg.norm(fj.theory.fedlsa_round_bias(het_gaussian, 0.1, 1)) < 1e-14
    A = np.asarray(het_gaussian.A_bar)[0]
    same = fj.problems.gaussian_lsa(
        np.stack([A, A]), np.stack([np.ones(3), np.ones(3)]), noise_A=0.1, noise_b=0.1
    )
    assert np.linalg.norm(fj.theory.fedlsa_round_bias(same, 0.1, 7)) < 1e-14


def test_step_size_bounds(het_gaussian):
    A = np.asarray(het_gaussian.A_bar).mean(0)
    lam = np.linalg.eigvals(A)
    closed = np.min(2 * lam.real / np.abs(lam) ** 2)
    assert fj.theory.lsa_step_size_bound(A) == pytest.approx(closed, rel=1e-12)
    assert fj.theory.max_stable_step_size(het_gaussian, "fedlsa", 1) == pytest.approx(closed, rel=1e-5)
    # identical scalar agents a: the round map is (1 - eta a)^H, stable iff eta < 2 / a
    a = 0.8
    scalar = fj.problems.gaussian_lsa(np.full((3, 1, 1), a), np.ones((3, 1)), noise_A=0.0, noise_b=0.0)
    for name in ("fedlsa", "scafflsa"):
        assert fj.theory.max_stable_step_size(scalar, name, 4) == pytest.approx(2 / a, rel=1e-5)
    # erasures with divide_by_n shrink the mean step by p: the bound grows by 1/p
    lossy = fj.theory.max_stable_step_size(het_gaussian, fj.qfedtd(0.1, success_prob=0.5))
    assert lossy == pytest.approx(2 * closed, rel=1e-5)
    with pytest.raises(ValueError, match="num_local_steps=2 is invalid: leave it out"):
        fj.theory.max_stable_step_size(het_gaussian, fj.fedlsa(0.1, 3), 2)
    # the exact mean recursion grows just above the bound and contracts just below
    eta = fj.theory.max_stable_step_size(het_gaussian, "scafflsa", 5)
    far = np.ones(3) * 10
    for factor, grows in ((0.98, False), (1.02, True)):
        m = fj.theory.exact_mean(het_gaussian, fj.scafflsa(eta * factor, 5), 400, theta0=far)
        dist = np.linalg.norm(m - np.asarray(het_gaussian.theta_star), axis=1)
        assert (dist[-1] > dist[0]) == grows


def test_mixing_time_two_state_chain():
    a, b = 0.3, 0.1
    P = np.array([[1 - a, a], [b, 1 - b]])
    problem = fj.problems.federated_td(np.stack([P, P]), np.zeros((2, 2)), np.eye(2), 0.5)
    tv = fj.theory.tv_to_stationary(problem, 20)
    lam = abs(1 - a - b)
    np.testing.assert_allclose(tv[0], max(a, b) / (a + b) * lam ** np.arange(21), rtol=1e-12, atol=1e-15)
    eps = 0.05
    expected = int(np.ceil(np.log(eps * (a + b) / max(a, b)) / np.log(lam)))
    assert list(fj.theory.mixing_time(problem, eps)) == [expected, expected]


def test_theory_errors(tiny_td, het_gaussian):
    P, r, Phi = tiny_td
    markov = fj.problems.federated_td(np.tile(P, (4, 1, 1)), np.tile(r, (4, 1)), Phi, 0.9, sampling="markov")
    with pytest.raises(ValueError, match=r"S\^N \* D\^2 = 4\^12 \* 27\^2 = 12230590464 entries"):
        fj.theory.exact_mse(markov, fj.fedlsa(0.1, 2), 3)  # Markov sampling: small chains only
    with pytest.raises(ValueError, match="quantizer=.*qsgd.*identity\\(\\) or rand_k"):
        fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.1, 2, quantizer=fj.channel.qsgd(4)), 3)
    with pytest.raises(ValueError, match="SCAFFLSA with an exact channel"):
        fj.theory.exact_mse(het_gaussian, fj.scafflsa(0.1, 2, success_prob=0.5), 3)
    # beyond MAX_AUGMENTED_DIM: the maps over the whole state are refused (exact_mse runs on the
    # factored agents' blocks there, tests/test_theory_speed.py)
    big = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=200, dim=5)
    with pytest.raises(ValueError, match="problem='N=200, d=5' is invalid.*scafflsa has 2006 coordinates"):
        fj.theory.exact_mean(big, fj.scafflsa(0.1, 2), 3)
    bigger = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=400, dim=5)
    ef = fj.fedlsa(0.1, 2, error_feedback="ef14", quantizer=fj.channel.rand_k(2))  # not factored
    refusal = r"fedlsa has 4006 coordinates.*400 x 5 \(mem\)\) > MAX_AUGMENTED_DIM = 2000"
    with pytest.raises(ValueError, match=refusal):
        fj.theory.exact_mse(bigger, ef, 3)
    with pytest.raises(ValueError, match="problem='GaussianLSA' is invalid.*Markov chain"):
        fj.theory.mixing_time(het_gaussian)
    with pytest.raises(ValueError, match="eps=1.5 is invalid"):
        fj.theory.mixing_time(fj.problems.federated_td(P, r, Phi, 0.9), eps=1.5)
    with pytest.raises(ValueError, match="num_local_steps=3 is invalid: fj.qfedtd takes one local step"):
        fj.theory.max_stable_step_size(het_gaussian, "qfedtd", 3)
    with pytest.raises(ValueError, match="k=5 is invalid: expected k <= d = 3"):
        fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.1, 2, quantizer=fj.channel.rand_k(5)), 3)
    with pytest.raises(ValueError, match="theta0=.* is invalid: expected shape \\(3,\\)"):
        fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.1, 2), 3, theta0=[1.0, 2.0])
    with pytest.raises(ValueError, match="num_rounds=-1 is invalid"):
        fj.theory.exact_mean(het_gaussian, fj.fedlsa(0.1, 2), -1)
    periodic = fj.problems.federated_td(
        np.array([[[0.0, 1.0], [1.0, 0.0]]]), np.zeros((1, 2)), np.eye(2), 0.5
    )
    with pytest.raises(ValueError, match="did not mix"):
        fj.theory.mixing_time(periodic, max_steps=50)
