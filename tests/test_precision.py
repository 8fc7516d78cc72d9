"""Numerical edges: float32 at tiny step sizes, refused dtypes and underflowing
hyperparameters, exact zeros in the statistics, what is reproducible across batch shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj


def _problem(dtype):
    """N = 2, d = 2, |theta_star| = 5, equal noise levels: FedLSA H = 1 has a closed error recursion."""
    A = np.array([[[1.0, 0.2], [0.0, 0.8]], [[0.9, -0.1], [0.1, 1.1]]])
    theta_star = np.array([3.0, -4.0])
    b = np.einsum("cij,j->ci", A, theta_star) + np.array([[0.3, -0.2], [-0.3, 0.2]])  # heterogeneous
    return fj.problems.gaussian_lsa(A, b, noise_A=0.2, noise_b=0.5, dtype=dtype)


def error_recursion(problem, eta, T, record):
    """FedLSA, H = 1, started at theta_star, written on the error e = theta - theta_star (float64):
    E[e] stays 0 (mean_c (A_bar[c] theta_star - b_bar[c]) = 0) and
    S' = M S M^T + (eta^2 / N) (sA^2 (|theta_star|^2 + tr S) + sb^2) I,  M = I - eta mean_c A_bar[c]."""
    A = np.asarray(problem.A_bar, np.float64)
    N, d, _ = A.shape
    sA, sb = float(problem.noise_A[0]), float(problem.noise_b[0])
    ts2 = float(np.sum(np.asarray(problem.theta_star, np.float64) ** 2))
    M = np.eye(d) - eta * A.mean(0)
    S = np.zeros((d, d))
    out = {0: 0.0}
    for t in range(1, T + 1):
        S = M @ S @ M.T + (eta**2 / N) * (sA**2 * (ts2 + np.trace(S)) + sb**2) * np.eye(d)
        if t in record:
            out[t] = np.trace(S)
    return np.array([out[t] for t in sorted(out)])


@pytest.mark.parametrize("eta", [1e-6, 1e-7])
def test_float32_tiny_step_sizes_match_the_exact_error_recursion(eta):
    """The increments eta (A theta - b) are far below float32's resolution of theta (|theta| = 5);
    the built-in algorithms iterate on the error, so float32 stays within Monte Carlo error."""
    T, n = 100_000, 128
    p32 = _problem("float32")
    res = fj.simulate(
        jax.random.key(0),
        p32,
        fj.fedlsa(eta, 1),
        T,
        n,
        theta0=np.array([3.0, -4.0]),
        record_every=T // 4,
        quantiles=False,
    )
    exact = error_recursion(_problem("float64"), eta, T, set(res.rounds.tolist()))
    assert res.mse_mean[0] == 0.0 and res.mse_sem[0] == 0.0  # every seed starts at theta_star exactly
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), z
    assert np.all(exact[1:] > 2 * Z_TOL * res.mse_sem[1:])  # power: an MSE off by 2x (float32 before) fails


@pytest.mark.parametrize("dt", [np.float16, jnp.bfloat16, np.complex64, np.str_])
def test_refused_dtypes_name_the_argument(dt):
    A = np.stack([np.eye(2)] * 3)
    with pytest.raises(ValueError, match=r"A_bar=.*dtype.*float32 or float64"):
        fj.problems.gaussian_lsa(
            np.asarray(A).astype(dt) if dt is not np.str_ else A.astype(str), np.ones((3, 2))
        )
    with pytest.raises(ValueError, match=r"features\[0\]=.*float32 or float64"):
        fj.problems.least_squares(
            [np.ones((3, 2)).astype(dt) if dt is not np.str_ else np.ones((3, 2)).astype(str)], [np.ones(3)]
        )


def test_integer_arrays_are_converted():
    p = fj.problems.gaussian_lsa(np.stack([np.eye(2, dtype=int)] * 2), np.ones((2, 2), int))
    assert p.dtype == jnp.dtype(jax.dtypes.canonicalize_dtype(np.float64))


def test_underflowing_hyperparameters_and_infinite_threshold():
    p32 = _problem("float32")
    with pytest.raises(ValueError, match=r"channel.success_prob=1e-300.*underflows to 0 in float32"):
        fj.simulate(0, p32, fj.fedlsa(0.1, 1, success_prob=1e-300), 2, 2)
    with pytest.raises(ValueError, match=r"step_size=1e-60.*underflows"):
        fj.simulate(0, p32, fj.fedlsa(1e-60, 1), 2, 2)
    with pytest.raises(ValueError, match=r"divergence_threshold=0 .*> 0 \(inf: no threshold\)"):
        fj.simulate(0, p32, fj.fedlsa(0.1, 1), 2, 2, divergence_threshold=0)
    res = fj.simulate(0, p32, fj.fedlsa(0.1, 1), 2, 2, divergence_threshold=np.inf)
    assert res.num_diverged.sum() == 0


def test_identical_seeds_have_zero_standard_error_in_float32():
    p32 = _problem("float32")
    res = fj.simulate(0, fj.problems.expected(p32), fj.fedlsa(0.1, 3), 6, 1000, theta0=np.ones(2))
    assert np.all(res.mse_sem == 0.0) and np.all(res.theta_sem == 0.0)
    assert np.all(res.mse_mean == res.mse_mean)


def test_per_seed_results_across_batch_shapes():
    """What is reproducible (docs/guide/precision.md): seed i's random streams depend on (key, i)
    only; its trajectory is bitwise identical for the same batch shape (same call, resume, chunking)
    and equal up to float rounding when the batch shape changes. Measured here on a realistic
    float32 case: federated TD, d = 5, SCAFFLSA eta = 0.5, H = 5 (8 vs 512 seeds)."""
    p = fj.problems.garnet(jax.random.key(0), num_agents=4, dim=5, dtype="float32")
    alg = fj.scafflsa(0.5, 5)
    key = jax.random.key(9)
    a = fj.simulate(key, p, alg, 200, 8)
    b = fj.simulate(key, p, alg, 200, 512)  # another batch shape: XLA may vectorise differently
    c = fj.simulate(key, p, alg, 200, 16, seed_batch_size=8)  # seeds 0..7 in a batch of the shape of `a`
    np.testing.assert_array_equal(c.final_theta[:8], a.final_theta)
    scale = np.abs(a.final_theta).max()
    diff = np.abs(b.final_theta[:8] - a.final_theta).max()
    assert diff <= 1e-4 * scale, diff  # rounding only (measured: 2.2e-6 of the scale)
    other = np.abs(b.final_theta[8:16] - a.final_theta).max()
    assert other > 1e3 * max(diff, 1e-7 * scale)  # different seeds are far apart: the bound is not vacuous


def test_exact_mse_at_a_tiny_step_size_against_the_error_recursion():
    """``exact_mse`` runs in error coordinates: at eta = 1e-7 it matches the recursion written on
    the error to 1e-6 (reading the MSE off E[theta theta^T] instead loses digits to |theta_star|^2)."""
    p64 = _problem("float64")
    T = 20_000
    exact = fj.theory.exact_mse(p64, fj.fedlsa(1e-7, 1), T, theta0=np.asarray(p64.theta_star))
    ref = error_recursion(p64, 1e-7, T, {T // 2, T})
    np.testing.assert_allclose(exact[[T // 2, T]], ref[1:], rtol=1e-6)
    mean = fj.theory.exact_mean(p64, fj.fedlsa(1e-7, 1), 3, theta0=np.asarray(p64.theta_star))
    np.testing.assert_allclose(mean, np.tile(np.asarray(p64.theta_star), (4, 1)), rtol=1e-15)
