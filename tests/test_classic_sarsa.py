"""Federated SARSA on gymnax's classic control (skipped without the envs extra): a local step is
gymnax's step and a softmax draw of the current iterate's Q-values (checked against a loop with
gymnax and numpy); the next action's law follows the iterate; the Monte Carlo deterministic limit is
reproducible and its error bar is the spread of independent ones; FedSARSA with one local step and
small decreasing steps keeps its mean on it; refusals; the command line."""

import json
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj

gymnax = pytest.importorskip("gymnax")
from fedsa_jax.problems import classic_sarsa as cs  # noqa: E402

LENGTHS = [0.25, 1.0]
# the test's reference: a burn-in of two CartPole time limits (a shorter one biases it: module doc),
# 16 chains per replica (fewer leave a bias of the order of one replica's variance)
SIZES = dict(chains=128, steps=1000, burn_in=1000, iterations=8)
# for the spread of independent ones: as many chains (one compiled program), fewer steps
SMALL = dict(chains=128, steps=150, burn_in=300, iterations=6)


@pytest.fixture(scope="module")
def cartpole():
    return fj.problems.classic_control_sarsa(
        "cartpole", 2, {"length": LENGTHS}, temperature=2.0, key=0, **SIZES
    )


def _tiny(**kwargs):
    args = dict(chains=2 * cs.REPLICAS, steps=2, burn_in=0, iterations=2)
    return fj.problems.classic_control_sarsa("cartpole", 2, {"length": LENGTHS}, **{**args, **kwargs})


def test_a_local_step_is_gymnaxs_step_and_a_softmax_draw_of_the_current_iterate():
    problem = _tiny(temperature=0.5)
    env, _ = gymnax.make("CartPole-v1")
    rng = np.random.default_rng(0)
    thetas = rng.normal(size=(300, problem.dim))  # a new iterate at every step
    rand = jax.tree.map(operator.itemgetter(0), problem.randomness(jax.random.key(3), 1, 300))
    phi = lambda x: np.asarray(problem.features.state(jnp.asarray(x)))  # noqa: E731

    def softmax_action(x, theta, u):  # numpy: inversion of the normalised cumulative sum
        q = theta.reshape(2, -1) @ phi(x)
        p = np.exp((q - q.max()) / 0.5)
        return int(np.sum(np.cumsum(p / p.sum())[:-1] <= u))

    for c in range(2):
        params = jax.tree.map(operator.itemgetter(c), problem.env_params)
        key = jax.random.key(7 + c)
        sampler = problem.init_sampler(key, params, jnp.asarray(thetas[0]))
        x, state = env.reset(jax.random.split(key)[0], params)
        a = softmax_action(x, thetas[0], float(jax.random.uniform(jax.random.split(key)[1], ())))
        assert int(sampler[2]) == a
        step = jax.jit(problem.observe_step)
        resets = 0
        for t in range(300):
            r = jax.tree.map(operator.itemgetter(t), rand)
            move, sampler = step(params, sampler, r, jnp.asarray(thetas[t]))
            new_x, state, reward, terminated, truncated, info = env.step(
                jax.random.wrap_key_data(r.keys), state, a, params
            )
            reached = np.asarray(info["final_observation"])
            u = float(r.u[0])
            a_next = softmax_action(reached, thetas[t], u)
            np.testing.assert_allclose(np.asarray(move.x), np.asarray(x), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(np.asarray(move.next_x), reached, rtol=1e-6, atol=1e-6)
            assert (int(move.action), int(move.next_action), bool(move.terminated)) == (
                a,
                a_next,
                bool(terminated),
            )
            done = bool(terminated) or bool(truncated)
            resets += done
            x, a = new_x, softmax_action(new_x, thetas[t], u) if done else a_next
            assert int(sampler[2]) == a
        assert resets >= 1 or c == 1  # the short pole falls: the reset path is exercised


def test_the_next_actions_law_follows_the_iterate():
    """With ``theta`` putting ``c`` on action 1's constant feature, ``pi(1 | x) = 1 / (1 + e^{-c/tau})``
    at every x: the drawn next actions' frequency matches it for each c, to binomial error."""
    problem = _tiny(temperature=2.0)
    params = jax.tree.map(operator.itemgetter(0), problem.env_params)
    n, constant = 4000, problem.features.state.dim  # Fourier's first feature is the constant 1
    rand = jax.tree.map(operator.itemgetter(0), problem.randomness(jax.random.key(1), 1, n))
    for c in (-2.0, 0.0, 3.0):
        theta = jnp.zeros(problem.dim).at[constant].set(c)

        def one(sampler, r, theta=theta):
            move, sampler = problem.observe_step(params, sampler, r, theta)
            return sampler, move.next_action

        sampler = problem.init_sampler(jax.random.key(2), params, theta)
        _, actions = jax.lax.scan(one, sampler, rand)
        p = 1.0 / (1.0 + np.exp(-c / 2.0))
        assert abs(np.mean(actions) - p) < Z_TOL * np.sqrt(p * (1 - p) / n), (c, np.mean(actions), p)


def test_the_references_target_is_the_policys_average_of_the_sampled_ones():
    """``pairs(move, theta)`` (the reference's target features) equals the average over
    ``pi_theta(. | x')`` of ``pairs`` with each next action drawn."""
    problem = _tiny(temperature=0.7)
    theta = jnp.asarray(np.random.default_rng(1).normal(size=problem.dim))
    x, y = jnp.array([0.1, -0.2, 0.05, 0.3]), jnp.array([0.2, 0.1, -0.1, -0.4])
    dense = lambda i, v: np.asarray(jnp.zeros(problem.dim).at[i].add(v))  # noqa: E731
    move = lambda a: cs.SARSATransition(x, jnp.int32(1), 1.0, y, jnp.int32(a), jnp.bool_(False))  # noqa: E731
    q = np.asarray(problem.q_values(y, theta))
    pi = np.exp((q - q.max()) / 0.7) / np.exp((q - q.max()) / 0.7).sum()
    i, v, j, w = problem.pairs(move(0), theta)
    average = sum(p * dense(*problem.pairs(move(a))[2:]) for a, p in enumerate(pi))
    np.testing.assert_allclose(dense(j, w), average, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(dense(i, v), dense(*problem.pairs(move(0))[:2]))
    with pytest.raises(ValueError, match=r"^skip=2 is invalid"):
        problem.randomness(jax.random.key(0), 2, 3, skip=2)


def test_the_reference_is_reproducible_and_its_error_is_the_spread_of_independent_ones(cartpole):
    build = lambda k: fj.problems.classic_control_sarsa(  # noqa: E731
        "cartpole", 2, {"length": LENGTHS}, temperature=2.0, key=k, **SMALL
    )
    refs = [build(k) for k in range(5)]
    np.testing.assert_array_equal(np.asarray(build(0).theta_star), np.asarray(refs[0].theta_star))
    stars = np.stack([np.asarray(p.theta_star, np.float64) for p in refs])
    reported = np.mean([p.reference_mse for p in refs])
    spread = stars.var(0, ddof=1).sum()
    assert 0.4 < spread / reported < 2.5, (spread, reported)  # 5 references of 32 coordinates
    d = cartpole.describe()
    assert d["family"] == "classic_control_sarsa" and d["policy"] == "softmax" and d["temperature"] == 2.0
    assert d["reference"]["method"] == "monte carlo fixed point" and d["reference"]["replicas"] == cs.REPLICAS


def test_fedsarsa_with_one_local_step_keeps_its_mean_on_the_deterministic_limit(cartpole):
    """Started at theta_star with small decreasing steps, FedSARSA (fedlsa on this problem) stays
    there on average: its mean is within Z_TOL joint standard errors (the seeds' and the
    reference's) of theta_star at every record, coordinate by coordinate and jointly. Larger first
    steps (eta0 = 0.2) leave a transient bias that decays slowly (measured: |mean - theta_star|^2
    about 0.05 after 1.6e5 steps). The run moves slowly along the problem's slow directions, so the
    check has little power against a nearby wrong limit: the limit at temperature 2.6 (|difference|^2
    3.7) gives sum z^2 of 49 to 65 here, under the bound of 68."""
    star = np.asarray(cartpole.theta_star)
    steps = fj.schedule(fj.optim.inverse_time, eta0=0.05, k0=500.0)
    res = fj.simulate(0, cartpole, fj.fedlsa(steps, 1), 20_000, 64, record_every=5000, theta0=star)
    z = (res.theta_mean[1:] - star) / np.sqrt(
        res.theta_sem[1:] ** 2 + np.asarray(cartpole.theta_star_sem) ** 2
    )
    assert np.all(np.abs(z) < Z_TOL), np.abs(z).max(1)
    d = star.size  # and jointly: sum z^2 about chi-square with d degrees of freedom (measured 22-28)
    assert np.all(np.sum(z**2, 1) < d + Z_TOL * np.sqrt(2 * d)), np.sum(z**2, 1)
    drift = fj.simulate(
        0, cartpole, fj.scafflsa(0.02, 10), 50, 16, theta0=star
    )  # the drift-corrected one runs
    assert np.all(np.isfinite(drift.mse_mean)) and drift.mse_mean[-1] < 10 * res.mse_mean[-1] + 1.0


def test_refusals_and_bad_values(cartpole):
    with pytest.raises(
        ValueError, match=r"^problem='sarsa-cartpole' is invalid: this algorithm draws a round"
    ):
        fj.simulate(0, cartpole, fj.scaffnew(0.1, 0.5, 4), 2, 2, progress=False)
    with pytest.raises(ValueError, match="follow the iterate"):
        fj.theory.exact_mse(cartpole, fj.fedlsa(0.1, 2), 3)
    with pytest.raises(ValueError, match=r"^temperature=0\.0 is invalid"):
        _tiny(temperature=0.0)
    with pytest.raises(ValueError, match=r"^chains=8 is invalid"):
        _tiny(chains=8)


def test_command_line(tmp_path, capsys):
    from fedsa_jax.cli import main

    out = tmp_path / "run"
    argv = [
        "run", "--problem", "sarsa-cartpole", "--agents", "2", "--env-params", "length=0.25:1.0",
        "--temperature", "2", "--reference", "16:50:50:2", "--rounds", "3", "--seeds", "4", "-H", "5",
        "--step-size", "0.05", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "reference theta*: estimated by Monte Carlo" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problem"]["family"] == "classic_control_sarsa"
    assert summary["problem"]["temperature"] == 2.0 and summary["reference_mse"] > 0
