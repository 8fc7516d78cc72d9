"""The newer features against exact references, each test shown to fail for a plausible bug in
them (the mutations of ``tests/mutations.py``, section "newer features").

* SCAFFLSA with a schedule that varies within a round: its control variates divide by the sum of
  the round's step sizes (the kernel against the enumeration of ``tests/reference.py``);
* ``fj.schedule(...).scaled`` keeps the schedule's own scale, and Richardson's second run uses
  ``2 eta_k`` at every local step k (values, and trajectories seed by seed);
* a server optimizer sees the iterate theta as its parameters (``optax.add_decayed_weights``):
  the kernel against a numpy loop, ``exact_mean`` against the same loop and ``exact_mse``
  against its closed second-moment recursion;
* ``last_iterate_mse`` through ``fj.richardson(fj.averaged(...))`` is the plain algorithm's MSE
  on the same seeds;
* ``client_drift`` is ``mean_c |theta^c_{t,H} - theta_{t+1}|^2`` for every algorithm, Scaffnew
  included, against numpy loops on the noise-free problem (Scaffnew with the kernel's coins);
* in float32 at a tiny step size near theta_star the driver scores the state's accurate
  ``error`` (seed by seed against the float64 loop fed the kernel's normals);
* a Gaussian subclass with its own noise declines the laid-out local steps: its trajectories
  are those of its own noise (numpy loop fed the kernel's normals).

Noise-free problems (``fj.problems.expected``) make the kernel deterministic, so a loop of a
few lines is an exact reference (agreement to float64 rounding); their trajectory is also the
mean of the noisy problem's (the noise is independent and enters affinely).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st
from reference import (
    check_against_loop,
    enumerated_mse,
    federated_loop,
    gaussian_loop,
    round_randomness,
    scaffnew_coins,
    step_trajectories,
)

import fedsa_jax as fj


def noise_free_rounds(
    problem, name, eta, H, T, theta0, server=None, coins=None, p=1.0, cv_denominator=np.sum
):
    """FedLSA / SCAFFLSA / Scaffnew on the mean system ``A_c(Z) = A_bar[c]``, ``b_c(Z) = b_bar[c]``
    in numpy (float64, theta coordinates): ``(theta_0..theta_T (T + 1, d), drift (T + 1,))``
    with ``drift[t] = mean_c |theta^c - theta_t|^2`` for the agents' iterates at the end of round
    t (0 at t = 0). ``eta``: a float or the ``(T, H)`` step sizes of a schedule; SCAFFLSA divides
    its control-variate step by ``cv_denominator(etas of the round)``. ``server=(lr, wd, center)``:
    the server step is ``theta <- theta - lr (g + wd (theta - center))`` with the pseudo-gradient
    ``g = theta - mean_c theta^c`` (optax.add_decayed_weights then optax.sgd: ``center = 0``).
    Scaffnew (constant step): ``coins[t][k]`` says whether local step k of round t communicates."""
    A, b = np.asarray(problem.A_bar, float), np.asarray(problem.b_bar, float)
    N, d = b.shape
    etas = np.broadcast_to(np.asarray(eta, float), (T, H))
    theta = np.array(theta0, float)
    xi, x = np.zeros((N, d)), np.tile(theta, (N, 1))

    def step(x, eta):
        return x - eta * (np.einsum("cij,cj->ci", A, x) - b - xi)

    thetas, drift = [theta], [0.0]
    for t in range(T):
        if name == "scaffnew":
            for k, eta in enumerate(etas[t]):
                xh = step(x, eta)
                if coins[t][k]:
                    xbar = xh.mean(0)
                    xi = xi + (p / eta) * (xbar - xh)
                    x = np.tile(xbar, (N, 1))
                else:
                    x = xh
            local, theta = x, x.mean(0)
        else:
            local = np.tile(theta, (N, 1))
            for eta in etas[t]:
                local = step(local, eta)
            aggregate = local.mean(0)
            if name == "scafflsa":
                xi = xi + (aggregate - local) / cv_denominator(etas[t])
            if server is None:
                theta = aggregate
            else:
                lr, wd, center = server
                theta = theta - lr * ((theta - aggregate) + wd * (theta - center))
        thetas.append(theta)
        drift.append(np.mean(np.sum((local - theta) ** 2, axis=-1)))
    return np.array(thetas), np.array(drift)


@pytest.fixture(scope="module")
def mean_path(het_gaussian):
    return fj.problems.expected(het_gaussian)


THETA0 = np.array([1.0, -1.0, 0.5])


# --------------------------------------------------------------------------------------------
# SCAFFLSA with a schedule that varies within a round


def test_scafflsa_control_variates_divide_by_the_rounds_step_sum(mean_path):
    """The kernel's trajectory on the noise-free problem is the enumeration's mean, which moves the
    control variates by ``(a - theta^c) / sum_h eta_{tH+h}``; dividing by ``H eta_{tH}`` or
    ``H eta_{tH+H-1}`` (both equal to the sum for a constant step) is far from it."""
    H, T = 3, 5
    sched = fj.schedule(fj.optim.inverse_time, eta0=0.5, k0=2.0)
    etas = 0.5 / (1.0 + np.arange(T * H).reshape(T, H) / 2.0)
    A, b = np.asarray(mean_path.A_bar), np.asarray(mean_path.b_bar)
    support = [(np.ones(1), A[c][None], b[c][None]) for c in range(mean_path.num_agents)]
    ref, _ = enumerated_mse(mean_path, "scafflsa", etas, H, T, THETA0, support=support, with_mean=True)
    got = step_trajectories(mean_path, fj.scafflsa(sched, H), jax.random.key(0), T, 2, THETA0)
    np.testing.assert_allclose(got, np.broadcast_to(ref, got.shape), rtol=1e-12, atol=1e-13)
    loop, _ = noise_free_rounds(mean_path, "scafflsa", etas, H, T, THETA0)
    np.testing.assert_allclose(loop, ref, rtol=1e-12, atol=1e-13)
    for wrong in (lambda e: H * e[0], lambda e: H * e[-1]):  # power: the other denominators are far
        other, _ = noise_free_rounds(mean_path, "scafflsa", etas, H, T, THETA0, cv_denominator=wrong)
        assert np.max(np.abs(other - ref)) > 1e-3


# --------------------------------------------------------------------------------------------
# schedules scaled, Richardson doubling them


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(0.05, 5.0), factor=st.floats(0.05, 5.0), eta0=st.floats(0.01, 1.0))
def test_a_scaled_schedule_keeps_its_own_scale(scale, factor, eta0):
    """``s.scaled(f)(k) = f * s(k)``: a schedule that already has a scale multiplies it."""
    k = jnp.arange(12, dtype=jnp.int32)
    sched = fj.schedule(fj.optim.inverse_time, eta0=eta0, k0=3.0, scale=scale)
    base = eta0 / (1.0 + np.arange(12) / 3.0)
    np.testing.assert_allclose(np.asarray(sched(k)), scale * base, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sched.scaled(factor)(k)), factor * scale * base, rtol=1e-12)
    twice = sched.scaled(factor).scaled(2.0)
    np.testing.assert_allclose(np.asarray(twice(k)), 2 * factor * scale * base, rtol=1e-12)


def test_richardson_runs_the_doubled_schedule_at_every_step(het_gaussian):
    """Richardson's second run uses ``2 eta_k`` at every local step k, through a wrapper too, and
    its trajectories are ``2 theta(eta) - theta(2 eta)`` of the plain runs on the same seeds."""
    H, T = 2, 6
    sched = fj.schedule(fj.optim.inverse_time, eta0=0.4, k0=3.0, scale=0.5)
    twice = fj.schedule(fj.optim.inverse_time, eta0=0.4, k0=3.0, scale=1.0)
    k = jnp.arange(T * H, dtype=jnp.int32)
    nested = fj.richardson(fj.averaged(fj.scafflsa(sched, H), burn_in=1))
    doubled = nested.config.doubled.config.inner.config.step_size
    np.testing.assert_allclose(np.asarray(doubled(k)), 2 * np.asarray(sched(k)), rtol=1e-15)
    np.testing.assert_allclose(
        np.asarray(nested.config.inner.config.inner.config.step_size(k)), np.asarray(sched(k)), rtol=1e-15
    )
    key, n = jax.random.key(5), 3
    rr = step_trajectories(het_gaussian, fj.richardson(fj.scafflsa(sched, H)), key, T, n, THETA0)
    plain = step_trajectories(het_gaussian, fj.scafflsa(sched, H), key, T, n, THETA0)
    fast = step_trajectories(het_gaussian, fj.scafflsa(twice, H), key, T, n, THETA0)
    np.testing.assert_allclose(rr, 2 * plain - fast, rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(fast - plain)) > 1e-2  # the two runs differ


# --------------------------------------------------------------------------------------------
# server optimizers see theta


def decayed(lr, wd):
    return optax.chain(optax.add_decayed_weights(wd), optax.sgd(lr))


def test_server_optimizer_sees_theta_in_the_kernel_and_the_mean(het_gaussian, mean_path):
    """Weight decay ``theta <- theta - lr (g + wd theta)`` acts on theta (not on theta - theta_star,
    nor on zeros): the kernel on the noise-free problem and ``exact_mean`` of the noisy one are the
    numpy loop's trajectory."""
    eta, H, T, lr, wd = 0.3, 2, 6, 0.8, 0.5
    alg = fj.fedlsa(eta, H, server_optimizer=decayed(lr, wd))
    ref, _ = noise_free_rounds(mean_path, "fedlsa", eta, H, T, THETA0, server=(lr, wd, 0.0))
    got = step_trajectories(mean_path, alg, jax.random.key(0), T, 2, THETA0)
    np.testing.assert_allclose(got, np.broadcast_to(ref, got.shape), rtol=1e-12, atol=1e-13)
    exact = fj.theory.exact_mean(het_gaussian, alg, T, theta0=THETA0)
    np.testing.assert_allclose(exact, ref, rtol=1e-11, atol=1e-12)
    star = np.asarray(het_gaussian.theta_star)
    for wrong in ((lr, wd, star), (lr, 0.0, 0.0)):  # power: decay of theta - theta_star, or of zeros
        other, _ = noise_free_rounds(mean_path, "fedlsa", eta, H, T, THETA0, server=wrong)
        assert np.max(np.abs(other - ref)) > 1e-2


def test_exact_mse_with_weight_decay_matches_its_second_moment_recursion(het_gaussian):
    """FedLSA with H = 1 and weight decay on Gaussian LSA, in closed form: with
    ``C = (1 - lr wd) I - lr eta A`` (A the agents' mean) and ``u = lr eta b``,
    ``m' = C m + u`` and ``S' = C S C^T + C m u^T + u m^T C^T + u u^T
    + (lr eta / N)^2 sum_c (sA_c^2 tr S + sb_c^2) I``; the MSE is
    ``tr S - 2 theta_star^T m + |theta_star|^2``."""
    eta, T, lr, wd = 0.3, 8, 0.9, 0.4
    alg = fj.fedlsa(eta, 1, server_optimizer=decayed(lr, wd))
    A, b = np.asarray(het_gaussian.A_bar).mean(0), np.asarray(het_gaussian.b_bar).mean(0)
    sA, sb = np.asarray(het_gaussian.noise_A), np.asarray(het_gaussian.noise_b)
    N, d = het_gaussian.num_agents, het_gaussian.dim
    star = np.asarray(het_gaussian.theta_star)
    C, u = (1 - lr * wd) * np.eye(d) - lr * eta * A, lr * eta * b
    m, S = THETA0.copy(), np.outer(THETA0, THETA0)
    ref = [np.trace(S) - 2 * star @ m + star @ star]
    for _ in range(T):
        noise = (lr * eta / N) ** 2 * np.sum(sA**2 * np.trace(S) + sb**2) * np.eye(d)
        S = C @ S @ C.T + np.outer(C @ m, u) + np.outer(u, C @ m) + np.outer(u, u) + noise
        m = C @ m + u
        ref.append(np.trace(S) - 2 * star @ m + star @ star)
    np.testing.assert_allclose(fj.theory.exact_mse(het_gaussian, alg, T, theta0=THETA0), ref, rtol=1e-10)


# --------------------------------------------------------------------------------------------
# metrics through wrappers, client drift


def test_last_iterate_mse_reads_through_nested_wrappers(het_gaussian):
    """``fj.richardson(fj.averaged(alg))`` runs alg at eta on the same random numbers as alg alone:
    its ``last_iterate_mse`` is alg's MSE, seed by seed (not the average's, nor the extrapolation's)."""
    alg, key, T, n = fj.fedlsa(0.2, 2), jax.random.key(1), 8, 4
    nested = fj.richardson(fj.averaged(alg, burn_in=2))
    res = fj.simulate(key, het_gaussian, nested, T, n, THETA0, metrics=["last_iterate_mse"], keep_seeds=n)
    plain = fj.simulate(key, het_gaussian, alg, T, n, THETA0, keep_seeds=n)
    last = res.metrics["last_iterate_mse"]
    np.testing.assert_allclose(last.seeds, plain.seed_mse, rtol=1e-12)
    np.testing.assert_allclose(last.mean, plain.mse_mean, rtol=1e-12)
    averaged = fj.simulate(key, het_gaussian, fj.averaged(alg, burn_in=2), T, n, THETA0)
    assert np.max(np.abs(averaged.mse_mean / plain.mse_mean - 1)) > 1e-2  # power: the average is elsewhere
    assert np.max(np.abs(res.mse_mean / plain.mse_mean - 1)) > 1e-2


DRIFT_ALGORITHMS = {
    "fedlsa": lambda: fj.fedlsa(0.2, 3),
    "scafflsa": lambda: fj.scafflsa(0.2, 3),
    "scaffnew": lambda: fj.scaffnew(0.2, 0.5, 3),
    "qfedtd": lambda: fj.qfedtd(0.2),
}


@pytest.mark.parametrize("name", list(DRIFT_ALGORITHMS))
def test_client_drift_is_the_documented_mean_over_agents(mean_path, name):
    """``client_drift`` at round t is ``mean_c |theta^c_{t,H} - theta_{t+1}|^2`` (the agents' last
    local iterates against the new server iterate; Scaffnew: the agents' iterates against their
    mean at the end of the round), seed by seed against numpy loops; 0 at round 0 and for QFedTD,
    whose agents send directions, not iterates (no local steps)."""
    alg, key, T, n = DRIFT_ALGORITHMS[name](), jax.random.key(3), 4, 4
    res = fj.simulate(key, mean_path, alg, T, n, THETA0, metrics=["client_drift"], keep_seeds=n)
    got = res.metrics["client_drift"].seeds  # (T + 1, n)
    if name == "qfedtd":
        np.testing.assert_array_equal(got, 0.0)
        return
    cfg, H = alg.config, alg.num_local_steps
    p = float(getattr(cfg, "comm_prob", 1.0))
    for s in range(n):
        coins = [scaffnew_coins(key, s, t, H, p) for t in range(T)] if name == "scaffnew" else None
        eta = float(cfg.step_size)
        thetas, drift = noise_free_rounds(mean_path, name, eta, H, T, THETA0, coins=coins, p=p)
        np.testing.assert_allclose(res.final_theta[s], thetas[-1], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(got[:, s], drift, rtol=1e-10, atol=1e-15)
        # power: the drift is measurably away from 0, except after a Scaffnew round whose last step
        # communicated (every agent restarts from the server's iterate)
        synced = np.array([c[-1] for c in coins]) if name == "scaffnew" else np.zeros(T, bool)
        assert np.all(drift[1:][~synced] > 1e-6) and np.all(drift[1:][synced] == 0)
    if name == "scaffnew":  # both kinds of round occur
        last = np.array([[scaffnew_coins(key, s, t, H, p)[-1] for t in range(T)] for s in range(n)])
        assert not last.all() and last.any()


# --------------------------------------------------------------------------------------------
# the driver scores the error field


def test_float32_mse_is_the_accurate_error_at_a_tiny_step_near_theta_star():
    """Started at theta_star = (3, -4) in float32 with eta = 1e-8, the error (about 1e-8) stays
    far below the resolution of theta (a unit in the last place is 2.4e-7 and 4.8e-7), so
    ``theta - theta_star`` is 0 or a few units; the recorded MSE is the state's accurate ``error``
    squared, seed by seed against the float64 loop fed the kernel's float32 normals (measured:
    relative 1e-6, float32 rounding; the tolerance 1e-4 leaves 100x, the competing value is 0)."""
    A = np.array([[[1.0, 0.2], [0.0, 0.8]], [[0.9, -0.1], [0.1, 1.1]]])
    star = np.array([3.0, -4.0])
    b = np.einsum("cij,j->ci", A, star) + np.array([[0.3, -0.2], [-0.3, 0.2]])
    p32 = fj.problems.gaussian_lsa(A, b, noise_A=0.2, noise_b=0.5, dtype="float32")
    alg, key, T, n = fj.fedlsa(1e-8, 2), jax.random.key(7), 4, 4
    theta0 = np.asarray(p32.theta_star, np.float64)
    res = fj.simulate(key, p32, alg, T, n, theta0=theta0, keep_seeds=n)
    refs = np.stack([gaussian_loop(p32, alg, key, s, T, theta0=theta0) for s in range(n)])  # (n, T + 1, d)
    ref_mse = np.sum((refs - theta0) ** 2, axis=-1).T  # (T + 1, n)
    assert np.all(ref_mse[1:] > 0) and np.all(ref_mse[1:] < 1e-14)  # far below theta's resolution
    np.testing.assert_allclose(res.seed_mse, ref_mse, rtol=1e-4, atol=0)
    np.testing.assert_allclose(res.mse_mean, ref_mse.mean(1), rtol=1e-4, atol=0)
    # power: the squared float32 differences theta - theta_star are elsewhere (0 or ulp-sized)
    coarse = np.sum((res.final_theta.astype(np.float64) - theta0) ** 2, axis=-1)
    assert np.all(np.abs(coarse - ref_mse[-1]) > 0.5 * ref_mse[-1])


# --------------------------------------------------------------------------------------------
# a subclass with its own noise declines the laid-out local steps


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _L1Noise(fj.problems.GaussianLSA):
    """Gaussian LSA whose noise scales with the l1 norm of theta:
    ``(noise_A |theta|_1 + noise_b) z`` instead of ``sqrt(noise_A^2 |theta|^2 + noise_b^2) z``."""

    @staticmethod
    def _noise(params, z, theta):
        return (params.noise_A * jnp.sum(jnp.abs(theta)) + params.noise_b) * z


def l1_noise_loop(problem, algorithm, key, seed, T, theta0=None):
    """:class:`_L1Noise` in numpy, fed the kernel's normals (``tests/reference.py`` key derivation)."""
    H = algorithm.config.num_local_steps
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    sA, sb = np.asarray(problem.noise_A), np.asarray(problem.noise_b)

    def agent_round(t):
        z = round_randomness(problem, key, seed, t, H).reshape(problem.num_agents, H, -1)
        return lambda c, h, th: A[c] @ th - b[c] + (sA[c] * np.sum(np.abs(th)) + sb[c]) * z[c, h]

    return federated_loop(problem, algorithm, T, theta0, agent_round, key, seed)


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_a_subclass_with_its_own_noise_runs_its_own_noise(het_gaussian, name):
    """A Gaussian subclass that overrides ``_noise`` declines ``error_local_steps`` (the laid-out
    steps hard-code the family's noise): FedLSA and SCAFFLSA then scan its own directions, seed by
    seed and round by round against the numpy loop with that noise."""
    problem = _L1Noise(**{f.name: getattr(het_gaussian, f.name) for f in dataclasses.fields(het_gaussian)})
    alg = getattr(fj, name)(0.1, 3)
    refs = check_against_loop(problem, alg, l1_noise_loop, 4, 3, theta0=THETA0, driver=False)
    # power: the family's own noise gives other trajectories on the same random numbers
    plain = step_trajectories(het_gaussian, alg, jax.random.key(11), 4, 3, THETA0)
    assert np.max(np.abs(plain - refs)) > 1e-3
