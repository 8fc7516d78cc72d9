"""The plug-in baseline (``fj.plug_in``) against exact references:

* the run is the algorithm's, bit for bit, and the plug-in observes what the algorithm observes:
  its agents' streams equal the algorithm's after every round (Markov chains, local steps that
  change with the round, a cohort; FedLSA, SCAFFLSA, Scaffnew, QFedTD), its counts are the
  observations the algorithm used;
* its running sums equal a numpy loop over the Gaussian problem's draws, round by round;
* the in-kernel Lyapunov solve equals scipy's;
* its mean estimates are unbiased for ``A_bar`` and for the noise covariance (Monte Carlo, Z_TOL s.e.);
* its interval's standard deviation is the exact one to first order in the step size, and it covers
  at its level (within 3 binomial standard errors);
* refusals are one-line errors.
"""

import jax
import numpy as np
import optax
import pytest
import scipy.linalg
from conftest import Z_TOL
from reference import _seed_keys, round_randomness

import fedsa_jax as fj
from fedsa_jax.algorithms.plug_in import lyapunov, plug_in_covariance


def garnet(sampling):
    return fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=5, dim=2, sampling=sampling)


def stepped(problem, alg, T, key=None, seed=0, theta0=None):
    """Seed ``seed``'s states after rounds 0..T, stepped as the driver steps it (its keys)."""
    init_key, round_key = _seed_keys(jax.random.key(1) if key is None else key, seed)
    theta0 = np.zeros(problem.dim) if theta0 is None else theta0
    state = alg.init(init_key, problem, jax.numpy.asarray(theta0, problem.dtype))
    step = jax.jit(lambda k, s: alg.step(k, s, problem)[0])
    states = [state]
    for t in range(T):
        state = step(jax.random.fold_in(round_key, t), state)
        states.append(state)
    return states


CASES = {
    "fedlsa-markov": fj.fedlsa(0.2, 3),
    "fedlsa-growing-markov": fj.fedlsa(0.2, [1, 3, 2, 2, 1]),
    "fedlsa-cohort-markov": fj.fedlsa(0.2, 3, clients_per_round=2),
    "scafflsa-skip-markov": fj.scafflsa(0.2, 2, skip=2),
    "scaffnew-growing-markov": fj.scaffnew(0.2, 0.5, [2, 1, 3, 3, 2]),
    "qfedtd-markov": fj.qfedtd(0.3, fj.channel.stochastic_uniform(4), success_prob=0.8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_plug_in_observes_what_the_algorithm_observes(name):
    alg = CASES[name]
    problem = garnet("markov")
    states = stepped(problem, fj.plug_in(alg), 5)
    plain = stepped(problem, alg, 5)
    np.testing.assert_array_equal(states[-1].theta, plain[-1].theta)  # the run, bit for bit
    for s in states:
        np.testing.assert_array_equal(s.plug_in.sampler, s.inner.sampler)  # the chains, in step
    H = alg.config.num_local_steps
    table = H.table[:5] if hasattr(H, "table") else [H] * 5
    counts = np.asarray(states[-1].plug_in.count)
    if alg.clients_per_round is None:
        np.testing.assert_array_equal(counts, np.full(3, sum(table)))
    else:  # each agent observed H in the rounds of its cohort: 2 of 3 agents a round
        assert counts.sum() == 2 * sum(table) and set(counts) <= set(range(0, sum(table) + 1, H))


def test_the_sums_equal_a_numpy_loop(het_gaussian):
    """Gaussian LSA draws ``g = A_bar[c] theta - b_bar[c] + sqrt(s_A^2 |theta|^2 + s_b^2) z``: its
    Jacobian in theta is ``A_bar[c] + s_A^2 z theta^T / sqrt(...)``; the sums of A, b and
    ``eps eps^T`` (A_hat, b_hat including the round) by hand, from the round's z and theta_t."""
    problem, T, H, N = het_gaussian, 4, 3, 3
    alg = fj.plug_in(fj.fedlsa(0.1, H))
    key = jax.random.key(5)
    states = stepped(problem, alg, T, key=key, theta0=np.array([1.0, -1.0, 0.5]))
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    sA, sb = np.asarray(problem.noise_A), np.asarray(problem.noise_b)
    sum_A, sum_b, sum_noise, n = np.zeros((N, 3, 3)), np.zeros((N, 3)), np.zeros((N, 3, 3)), 0
    for t in range(T):
        theta = np.asarray(states[t].theta)
        z = round_randomness(problem, key, 0, t, H).reshape(N, H, -1)
        n += H
        for c in range(N):
            scale = np.sqrt(sA[c] ** 2 * (theta @ theta) + sb[c] ** 2)
            g = A[c] @ theta - b[c] + scale * z[c]  # (H, d)
            J = A[c] + sA[c] ** 2 * z[c][:, :, None] * theta[None, None, :] / scale  # (H, d, d)
            sum_A[c] += J.sum(0)
            sum_b[c] += (J @ theta - g).sum(0)
            eps = g - (sum_A[c] / n @ theta - sum_b[c] / n)
            sum_noise[c] += eps.T @ eps
        m = states[t + 1].plug_in
        np.testing.assert_allclose(m.sum_A, sum_A, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(m.sum_b, sum_b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(m.sum_noise, sum_noise, rtol=1e-12, atol=1e-12)
        assert np.all(np.asarray(m.count) == n) and float(m.step_size) == 0.1


def test_lyapunov_equals_scipy():
    """Random stable matrices, and one whose first pivot is 0 (``A[0, 0] = 0``: elimination must
    exchange rows)."""
    rng = np.random.default_rng(0)
    cases = [rng.normal(size=(d, d)) + d * np.eye(d) for d in (1, 3, 6)] + [
        np.array([[0.0, 1.0], [-2.0, 1.0]])
    ]
    for A in cases:
        d = A.shape[0]
        Q = rng.normal(size=(d, d))
        Q = Q @ Q.T
        np.testing.assert_allclose(
            lyapunov(jax.numpy.asarray(A), jax.numpy.asarray(Q)),
            scipy.linalg.solve_continuous_lyapunov(A, Q),
            rtol=1e-10,
            atol=1e-12,
        )


def test_the_estimates_are_unbiased():
    """Homogeneous Gaussian LSA with noise on b only (``eps = -s_b z``, covariance ``s_b^2 I`` at every
    theta): over 400 seeds the mean ``A_hat_c`` is ``A_bar[c]`` to rounding (the law's Jacobian is
    A_bar when ``s_A = 0``) and the mean ``S_hat_c`` is its exact expectation within Z_TOL standard
    errors: ``s_b^2 I`` times the mean over observations of ``1 - 1/n_t``, an observation of round t
    centred by the mean of the ``n_t = H (t + 1)`` observations so far, itself included (2.2 % below
    ``s_b^2`` at T = 120: 5 standard errors, so the test sees the centring)."""
    problem = fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=0.0, noise_A=0.0, noise_b=0.5
    )
    entries = {f"S{c}{i}{j}": (c, i, j) for c in range(3) for i in range(3) for j in range(i, 3)}

    def noise_entry(c, i, j):
        return lambda s, p: s.plug_in.sum_noise[c, i, j] / s.plug_in.count[c]

    metrics = {k: noise_entry(*v) for k, v in entries.items()}
    metrics["A_err"] = lambda s, p: jax.numpy.max(
        jax.numpy.abs(s.plug_in.sum_A / s.plug_in.count[:, None, None] - p.A_bar)
    )
    T, H = 120, 2
    res = fj.simulate(1, problem, fj.plug_in(fj.fedlsa(0.05, H)), T, 400, metrics=metrics, record_every=T)
    assert res.metrics["A_err"].mean[-1] < 1e-12
    centring = np.mean(1 - 1 / (H * (np.arange(T) + 1)))
    for k, (_, i, j) in entries.items():
        exact = 0.25 * centring if i == j else 0.0
        stats = res.metrics[k]
        assert abs(stats.mean[-1] - exact) <= Z_TOL * stats.sem[-1], (k, stats.mean[-1], stats.sem[-1])


@pytest.mark.parametrize("cohort", [None, 2])
def test_the_interval_is_the_exact_one_to_first_order_and_covers(cohort):
    """Homogeneous Gaussian LSA from theta*, FedLSA with a small step: the plug-in's
    ``sqrt(eta u^T Sigma_hat u)`` is within 5 % of the exact stationary standard deviation, and the
    0.9 interval covers ``u^T theta*`` within 3 binomial standard errors of 0.9 over 800 seeds;
    at round 0 (nothing observed) it is the point ``u^T theta_0``. With a cohort of 2 of 3 agents a
    step averages 2 agents' noise, not 3."""
    problem = fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=0.0, noise_A=0.2, noise_b=0.5
    )
    u, T, n = np.array([1.0, 0.0, 0.0]), 300, 800
    alg = fj.fedlsa(0.02, 2, clients_per_round=cohort)
    exact = np.sqrt(u @ fj.theory.exact_covariance(problem, alg, T, problem.theta_star)[-1] @ u)
    metrics = fj.inference.intervals(u, levels=0.9, methods="plug_in")
    metrics["sd"] = lambda s, p: jax.numpy.sqrt(u @ plug_in_covariance(s.plug_in) @ u)
    res = fj.simulate(
        1, problem, fj.plug_in(alg), T, n, metrics=metrics, record_every=T, theta0=problem.theta_star
    )
    assert abs(res.metrics["sd"].mean[-1] / exact - 1) < 0.05, res.metrics["sd"].mean[-1] / exact
    cover = res.metrics["covers_plug_in_9"].mean
    assert abs(cover[-1] - 0.9) <= 3 * np.sqrt(0.9 * 0.1 / n), cover
    assert (
        res.metrics["lower_plug_in_9"].mean[0]
        == res.metrics["upper_plug_in_9"].mean[0]
        == u @ problem.theta_star
    )


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: fj.plug_in("fedlsa"), r"algorithm='str' is invalid"),
        (
            lambda: fj.plug_in(fj.scaffnew(0.1, 0.5, 2, clients_per_round=2)),
            r"algorithm='scaffnew' is invalid: its cohort changes within a round",
        ),
        (lambda: fj.bootstrap(fj.plug_in(fj.fedlsa(0.1, 2)), 4), r"algorithm='plug_in_fedlsa' is invalid"),
        (
            lambda: fj.plug_in(fj.averaged(fj.fedlsa(0.1, 2))),
            r"algorithm='averaged_fedlsa' is invalid: it reports another iterate",
        ),
        (
            lambda: fj.plug_in(fj.bootstrap(fj.richardson(fj.fedlsa(0.1, 2)), 4)),
            r"algorithm='bootstrap_richardson_fedlsa' is invalid: it reports another iterate",
        ),
        (
            lambda: fj.plug_in(fj.fedlsa(0.1, 2, server_optimizer=optax.sgd(0.5))),
            r"algorithm='fedlsa' is invalid: its server optimizer",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(build, match):
    with pytest.raises(ValueError, match=match) as err:
        build()
    assert "\n" not in str(err.value)


def test_a_plug_in_metric_without_the_wrapper_names_it():
    metrics = fj.inference.intervals([1.0, 0.0], levels=0.9, methods="plug_in")
    with pytest.raises(ValueError, match=r"fj.plug_in\(algorithm\)"):
        fj.simulate(0, garnet("generative"), fj.fedlsa(0.1, 2), 3, 4, metrics=metrics)


@pytest.mark.parametrize("local_steps", [3, [1, 3, 2, 2]])
def test_the_step_size_is_the_rounds_last_local_step(local_steps):
    """Under a schedule of the local step, ``eta_t`` recorded after round t is the schedule at the
    round's last local step ``K_t + H_t - 1`` (not its first, nor ``H_max - 1`` when H_t < H_max)."""
    schedule = fj.schedule(fj.optim.inverse_time, eta0=0.3, k0=2.0)
    states = stepped(garnet("generative"), fj.plug_in(fj.fedlsa(schedule, local_steps)), 4)
    H = local_steps if isinstance(local_steps, list) else [local_steps] * 4
    etas = fj.optim.schedule_values(schedule, sum(H))
    last = np.cumsum(H) - 1  # K_t + H_t - 1
    got = [float(s.plug_in.step_size) for s in states[1:]]
    np.testing.assert_allclose(got, etas[last], rtol=1e-14)
    assert np.all(np.abs(etas[last] - etas[last - np.array(H) + 1])[np.array(H) > 1] > 1e-3)  # power
