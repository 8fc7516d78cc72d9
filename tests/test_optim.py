"""Step-size schedules, server optimizers (optax), Polyak-Ruppert averaging and Richardson-Romberg.

* reductions: a constant schedule is the float step; ``optax.sgd(1.0)`` is the plain server
  update; averaging is the running mean of the plain iterates, seed by seed;
* the exact theory (``exact_mean``/``exact_mse`` with schedules, server momentum, averaging)
  against the brute-force enumeration of ``tests/reference.py`` in theta coordinates
  (independent of ``fedsa_jax.theory``), against a hand mean recursion, and against Monte Carlo within
  Z_TOL standard errors on Gaussian LSA and generative TD;
* clear errors before anything compiles.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import Z_TOL
from reference import enumerated_mse

import fedsa_jax as fj
from fedsa_jax._runtime import kernel as sim_mod


@pytest.fixture(scope="module")
def td2(tiny_td):
    P, r, Phi = tiny_td
    return fj.problems.federated_td(P[:2], r[:2], Phi, 0.9)


def decay(k):
    return 0.5 / (1.0 + k / 4.0)


# --------------------------------------------------------------------------------------------
# reductions


def final_thetas(problem, alg, key, T, n):
    """Every seed's theta_T from the algorithm's own init and step (one small compiled loop)."""

    def one(k):
        state = alg.init(k, problem, jnp.zeros(problem.dim, problem.dtype))
        state = jax.lax.fori_loop(0, T, lambda t, s: alg.step(jax.random.fold_in(k, t), s, problem)[0], state)
        return state.theta

    return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(key, n)))


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa", "qfedtd", "scaffnew"])
def test_constant_schedule_and_sgd_one_equal_the_plain_algorithm(td2, name):
    make = {
        "fedlsa": lambda eta, **kw: fj.fedlsa(eta, 3, **kw),
        "scafflsa": lambda eta, **kw: fj.scafflsa(eta, 3, **kw),
        "qfedtd": lambda eta, **kw: fj.qfedtd(eta, fj.channel.rand_k(1), success_prob=0.7, **kw),
        "scaffnew": lambda eta, **kw: fj.scaffnew(eta, 0.4, 3, **kw),
    }[name]
    key, T, n = jax.random.key(2), 12, 6
    plain = final_thetas(td2, make(0.3), key, T, n)
    constant = final_thetas(td2, make(lambda k: 0.3 + 0.0 * k), key, T, n)
    sgd = final_thetas(td2, make(0.3, server_optimizer=optax.sgd(1.0)), key, T, n)
    assert np.max(np.abs(plain - np.asarray(td2.theta_star))) > 1e-3  # runs that moved
    # SCAFFLSA divides by sum_h eta_h = 3 * 0.3 (rounding differs from eta * H); the others are equal
    np.testing.assert_allclose(constant, plain, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(sgd, plain, rtol=1e-12, atol=1e-13)
    assert make(lambda k: 0.3).describe()["step_size"]["schedule"]["name"].endswith("<lambda>")
    desc = make(0.3, server_optimizer=optax.sgd(1.0)).describe()["server_optimizer"]
    assert desc == {
        "name": "optax.GradientTransformation",
        "fingerprint": fj.optim.fingerprint(optax.scale(-1.0)),
    }  # what optax.sgd(1.0) does


def test_averaging_is_the_running_mean_seed_by_seed(het_gaussian):
    """Hand-stepped with the same keys: the averaged state's theta is the mean of the plain iterates
    after the burn-in, and theta itself before; the last iterate is the plain one."""
    alg = fj.scafflsa(0.2, 2)
    b, T = 3, 9
    avg = fj.averaged(alg, burn_in=b)
    key = jax.random.key(4)
    s_plain = alg.init(key, het_gaussian, jnp.zeros(3))
    s_avg = avg.init(key, het_gaussian, jnp.zeros(3))
    iterates = []
    for t in range(1, T + 1):
        k = jax.random.fold_in(key, t)
        s_plain, _ = alg.step(k, s_plain, het_gaussian)
        s_avg, _ = avg.step(k, s_avg, het_gaussian)
        iterates.append(np.asarray(s_plain.theta))
        expected = iterates[-1] if t <= b else np.mean(iterates[b:], axis=0)
        np.testing.assert_allclose(np.asarray(s_avg.theta), expected, rtol=1e-13, atol=1e-14)
        np.testing.assert_array_equal(np.asarray(s_avg.inner.theta), iterates[-1])
    assert (
        np.max(np.abs(np.asarray(s_avg.theta) - iterates[-1])) > 1e-3
    )  # the average is not the last iterate


def test_last_iterate_metric_and_configuration(het_gaussian):
    alg = fj.fedlsa(0.2, 2)
    key, T, n = jax.random.key(1), 30, 64
    plain = fj.simulate(key, het_gaussian, alg, T, n)
    res = fj.simulate(key, het_gaussian, fj.averaged(alg, burn_in=10), T, n, metrics=["last_iterate_mse"])
    np.testing.assert_allclose(res.metrics["last_iterate_mse"].mean, plain.mse_mean, rtol=1e-12)
    np.testing.assert_allclose(res.mse_mean[:11], plain.mse_mean[:11], rtol=1e-12)
    assert res.mse_mean[-1] < 0.5 * plain.mse_mean[-1]  # averaging removes most of the fluctuation
    assert res.config["algorithm"]["algorithm"] == "averaged_fedlsa"
    assert res.config["algorithm"]["burn_in"] == 10
    assert res.config["algorithm"]["inner"]["step_size"] == 0.2


def test_sweep_over_a_schedule_scale_compiles_once(td2):
    key = jax.random.key(0)

    def alg(eta0):
        return fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=eta0, k0=10.0), 2)

    fj.simulate(key, td2, alg(0.3), 4, 3)
    before = sim_mod._num_traces
    a = fj.simulate(key, td2, alg(0.2), 4, 3)
    b = fj.simulate(
        key, td2, fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=0.2, k0=10.0, scale=1.0), 2), 4, 3
    )
    assert sim_mod._num_traces == before
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    # the optimizer's float hyperparameters are traced too
    opt = lambda lr: fj.fedlsa(
        0.3, 2, server_optimizer=fj.optimizer(optax.sgd, learning_rate=lr, momentum=0.5)
    )
    fj.simulate(key, td2, opt(1.0), 4, 3)
    before = sim_mod._num_traces
    fj.simulate(key, td2, opt(0.5), 4, 3)
    assert sim_mod._num_traces == before


# --------------------------------------------------------------------------------------------
# exact theory against an independent enumeration (theta coordinates, dense maps)


THEORY_CASES = {
    # name, schedule (or float), optimizer (lr, beta) or None, burn-in or None
    "fedlsa_decay": ("fedlsa", decay, None, None),
    "scafflsa_decay": ("scafflsa", decay, None, None),
    "fedlsa_momentum": ("fedlsa", 0.4, (0.7, 0.5), None),
    "scafflsa_momentum_decay": ("scafflsa", decay, (1.2, 0.3), None),
    "fedlsa_averaged": ("fedlsa", 0.4, None, 1),
    "scafflsa_all": ("scafflsa", decay, (0.8, 0.4), 2),
}


def build(name, step, opt, burn_in, H=2):
    server = None if opt is None else optax.sgd(opt[0], momentum=opt[1])
    alg = getattr(fj, name)(step, H, server_optimizer=server)
    return alg if burn_in is None else fj.averaged(alg, burn_in=burn_in)


@pytest.mark.parametrize("case", list(THEORY_CASES))
def test_exact_theory_matches_enumeration(td2, case):
    name, step, opt, burn_in = THEORY_CASES[case]
    H, T = 2, 4
    alg = build(name, step, opt, burn_in, H)
    theta0 = np.array([0.7, -0.4])
    etas = [[step(t * H + h) if callable(step) else step for h in range(H)] for t in range(T)]
    mean_ref, mse_ref = enumerated_mse(
        td2, name, etas, H, T, theta0, server=opt, burn_in=burn_in, with_mean=True
    )
    np.testing.assert_allclose(
        fj.theory.exact_mean(td2, alg, T, theta0=theta0), mean_ref, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(fj.theory.exact_mse(td2, alg, T, theta0=theta0), mse_ref, rtol=1e-10)
    # power: the plain algorithm's curve is elsewhere
    plain = fj.theory.exact_mse(td2, getattr(fj, name)(0.4, H), T, theta0=theta0)
    assert np.max(np.abs(plain[1:] / mse_ref[1:] - 1)) > 1e-3


def test_server_momentum_mean_against_a_hand_recursion(het_gaussian):
    """FedLSA's mean aggregate is ``Gamma_bar e + rho_bar`` (fedlsa_round_bias); server SGD with momentum
    then maps ``m <- (e - a) + beta m``, ``e <- e - lr m``: a recursion on (e, m) by hand."""
    eta, H, lr, beta, T = 0.15, 3, 0.9, 0.6, 25
    alg = fj.fedlsa(eta, H, server_optimizer=optax.sgd(lr, momentum=beta))
    A = np.asarray(het_gaussian.A_bar)
    star = np.asarray(het_gaussian.theta_star)
    gamma = np.mean([np.linalg.matrix_power(np.eye(3) - eta * A[c], H) for c in range(3)], axis=0)
    rho = fj.theory.fedlsa_round_bias(het_gaussian, eta, H)
    e, m = -star, np.zeros(3)
    ref = [e + star]
    for _ in range(T):
        a = gamma @ e + rho
        m = (e - a) + beta * m
        e = e - lr * m
        ref.append(e + star)
    np.testing.assert_allclose(
        fj.theory.exact_mean(het_gaussian, alg, T), np.asarray(ref), rtol=1e-10, atol=1e-12
    )


MC_CASES = {
    "fedlsa_decay": lambda: fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=0.3, k0=6.0), 2),
    "scafflsa_momentum": lambda: fj.scafflsa(0.15, 2, server_optimizer=optax.sgd(0.8, momentum=0.5)),
    "scafflsa_averaged": lambda: fj.averaged(fj.scafflsa(0.2, 2), burn_in=4),
    "scaffnew_momentum": lambda: fj.scaffnew(0.15, 0.5, 2, server_optimizer=optax.sgd(0.9, momentum=0.3)),
    "qfedtd_decay_erasures": lambda: fj.qfedtd(
        optax.polynomial_schedule(0.5, 0.05, 1.0, 30), fj.channel.rand_k(2), success_prob=0.7
    ),
}


# the three (decaying step, server momentum, averaging) on both families; the others on one
MC_RUNS = [
    (case, family)
    for case in ("fedlsa_decay", "scafflsa_momentum", "scafflsa_averaged")
    for family in ("gaussian", "td")
] + [("scaffnew_momentum", "gaussian"), ("qfedtd_decay_erasures", "td")]


@pytest.mark.parametrize("case,family", MC_RUNS)
def test_exact_mse_matches_monte_carlo(het_gaussian, tiny_td, family, case):
    if family == "gaussian":
        problem, theta0 = het_gaussian, np.array([1.0, -1.0, 0.5])
    else:
        P, r, Phi = tiny_td
        problem, theta0 = fj.problems.federated_td(P, r, Phi, 0.9), np.array([1.0, -1.0])
    alg = MC_CASES[case]()
    T, n = 30, 8000
    res = fj.simulate(jax.random.key(11), problem, alg, T, n, theta0=theta0, record_every=3)
    exact = fj.theory.exact_mse(problem, alg, T, theta0=theta0)[res.rounds]
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    assert exact[-1] < 0.9 * exact[0]  # a moving curve


def test_richardson_mean(het_gaussian):
    """``2 E[theta(eta)] - E[theta(2 eta)]`` in exact_mean, Monte Carlo within Z_TOL of it, and the
    heterogeneity bias of FedLSA reduced: at first order it cancels."""
    eta, H, T = 0.05, 4, 400
    base = fj.averaged(fj.fedlsa(eta, H), burn_in=100)
    rr = fj.richardson(base)
    exact = fj.theory.exact_mean(het_gaussian, rr, T)
    np.testing.assert_allclose(
        exact,
        2 * fj.theory.exact_mean(het_gaussian, base, T)
        - fj.theory.exact_mean(het_gaussian, fj.averaged(fj.fedlsa(2 * eta, H), 100), T),
    )
    star = np.asarray(het_gaussian.theta_star)
    bias = fj.theory.fedlsa_bias(het_gaussian, eta, H)
    assert np.linalg.norm(exact[-1] - star) < 0.1 * np.linalg.norm(bias)
    res = fj.simulate(jax.random.key(3), het_gaussian, rr, T, 400, record_every=100)
    z = (res.theta_mean - exact[res.rounds]) / np.maximum(res.theta_sem, 1e-300)
    assert np.max(np.abs(z[1:])) < Z_TOL, z
    assert res.communications[-1] == pytest.approx(2 * 3 * T)  # both runs' messages are counted
    with pytest.raises(ValueError, match="exact_mse does not cover Richardson"):
        fj.theory.exact_mse(het_gaussian, rr, 3)


# --------------------------------------------------------------------------------------------
# errors


def test_bad_inputs_raise_before_compiling(td2):
    key = jax.random.key(0)
    before = sim_mod._num_traces
    with pytest.raises(ValueError, match=r"step_size=.* gives -0.1 at local step k=4"):
        fj.simulate(key, td2, fj.fedlsa(lambda k: jnp.where(k < 4, 0.1, -0.1), 2), 5, 3)
    with pytest.raises(ValueError, match=r"step_size=.* gives nan at local step k=0"):
        fj.simulate(key, td2, fj.fedlsa(lambda k: jnp.nan * k, 2), 5, 3)
    with pytest.raises(ValueError, match=r"step_size=.*must map an integer count to a real scalar"):
        fj.fedlsa(lambda k: jnp.ones(2) * 0.1, 2)
    with pytest.raises(
        ValueError, match=r"step_size='0.1' is invalid: expected a real number > 0 or an optax"
    ):
        fj.fedlsa("0.1", 2)
    with pytest.raises(ValueError, match=r"burn_in=-1 is invalid: expected an integer >= 0"):
        fj.averaged(fj.fedlsa(0.1, 2), burn_in=-1)
    with pytest.raises(ValueError, match=r"server_optimizer='adam' is invalid: expected None, an optax"):
        fj.scafflsa(0.1, 2, server_optimizer="adam")
    with pytest.raises(ValueError, match=r"server_optimizer=.*the factory returned float"):
        fj.optimizer(lambda learning_rate: learning_rate, learning_rate=0.1)
    with pytest.raises(ValueError, match=r"algorithm=.int. is invalid: expected an fj.Algorithm"):
        fj.averaged(3)
    assert sim_mod._num_traces == before
    # theory: Adam is not affine, a schedule is not a constant step
    adam = fj.fedlsa(0.1, 2, server_optimizer=optax.adam(0.01))
    with pytest.raises(ValueError, match="need a constant affine server optimizer .*counts steps .Adam"):
        fj.theory.exact_mse(td2, adam, 3)
    rms = fj.fedlsa(0.1, 2, server_optimizer=optax.rmsprop(0.01))
    with pytest.raises(ValueError, match="need an affine server optimizer .*RMSProp"):
        fj.theory.exact_mean(td2, rms, 3)
    with pytest.raises(ValueError, match="fedlsa_bias and fedlsa_round_bias take a constant step size"):
        fj.theory.fedlsa_bias(td2, decay, 2)
    with pytest.raises(ValueError, match="has a schedule"):
        fj.theory.max_stable_step_size(td2, fj.fedlsa(decay, 2))


def test_descriptions_tell_schedules_and_optimizers_apart():
    """Checkpoint fingerprints hash the description: same-named functions with other bodies or captured
    numbers must describe differently; equal ones equally."""

    def make(c):
        return lambda k: c / (1.0 + k)

    a, b = fj.fedlsa(make(0.1), 2).describe(), fj.fedlsa(make(0.2), 2).describe()
    assert a["step_size"]["schedule"]["name"] == b["step_size"]["schedule"]["name"]
    assert a != b
    assert fj.fedlsa(make(0.1), 2).describe() == a
    sgd = lambda lr: fj.fedlsa(0.1, 2, server_optimizer=optax.sgd(lr, momentum=0.9)).describe()  # noqa: E731
    assert sgd(0.5) == sgd(0.5) and sgd(0.5) != sgd(0.6)
    momentum = optax.chain(optax.trace(decay=0.9), optax.scale(-0.5))  # = optax.sgd(0.5, momentum=0.9)
    assert sgd(0.5)["server_optimizer"]["fingerprint"] == fj.optim.fingerprint(momentum)
    built = fj.fedlsa(0.1, 2, server_optimizer=fj.optimizer(optax.sgd, learning_rate=0.5)).describe()
    assert built["server_optimizer"] == {"name": "optax.sgd", "learning_rate": 0.5}
