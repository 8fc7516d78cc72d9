"""Federated TD(0) on gymnax's classic control (skipped without the envs extra): the kernel's
environment steps are gymnax's own for the same keys and each agent's parameters, resets included;
per-agent physics really differ; the Monte Carlo reference is reproducible, its standard error is the
spread of independent references and shrinks as 1/sqrt(samples); FedLSA with H = 1 settles on the
reference within its own error bar; refusals; the command line."""

import functools
import json
import operator

import jax
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj

gymnax = pytest.importorskip("gymnax")
from fedsa_jax.problems import classic_control as cc  # noqa: E402

LENGTHS = [0.25, 1.0]


@pytest.fixture(scope="module")
def cartpole():
    return fj.problems.classic_control_td(
        "cartpole", 2, {"length": LENGTHS}, chains=256, steps=1000, burn_in=500, key=jax.random.key(0)
    )


def _gymnax_loop(problem, c, key, rand):
    """Agent c's trajectory stepped by gymnax itself, with its own parameters and the same keys."""
    env, _ = gymnax.make(cc.ENVIRONMENTS[problem.env].gymnax_id)
    torques = cc.ENVIRONMENTS[problem.env].actions
    params = jax.tree.map(operator.itemgetter(c), problem.env_params)
    x, state = env.reset(key, params)
    rows = []
    for bits, u in zip(np.asarray(rand.keys[c]), np.asarray(rand.u[c])):
        action = problem.policy(x, u)
        action = action if torques is None else np.float64(torques[int(action)])
        new_x, state, reward, terminated, _, info = env.step(
            jax.random.wrap_key_data(bits), state, action, params
        )
        rows.append((np.asarray(x), float(reward), np.asarray(info["final_observation"]), bool(terminated)))
        x = new_x
    return rows, np.asarray(x)


def _kernel_against_gymnax(problem, H):
    keys = jax.random.split(jax.random.key(5), problem.num_agents)
    rand = problem.randomness(jax.random.key(6), problem.num_agents, H)
    samplers = jax.vmap(problem.init_sampler)(keys, problem.agent_params())
    moves, after = jax.jit(jax.vmap(problem.observe))(problem.agent_params(), samplers, rand)
    # to float rounding: XLA compiles the vmapped scan and gymnax's own jitted step apart, and may
    # contract a multiply-add in one and not the other (a unit in the last place, MountainCar)
    same = functools.partial(np.testing.assert_allclose, rtol=1e-10, atol=1e-12)
    for c in range(problem.num_agents):
        rows, last = _gymnax_loop(problem, c, keys[c], rand)
        same(np.asarray(moves.x[c]), np.stack([r[0] for r in rows]))
        same(np.asarray(moves.reward[c]), [r[1] for r in rows])
        same(np.asarray(moves.next_x[c]), np.stack([r[2] for r in rows]))
        np.testing.assert_array_equal(np.asarray(moves.terminated[c]), [r[3] for r in rows])
        same(np.asarray(after[0][c]), last)
    return moves


@pytest.mark.parametrize(
    "env, params",
    [
        ("mountaincar", {"force": [0.0008, 0.0012]}),
        ("acrobot", {"link_mass_2": [0.5, 2.0]}),
        ("pendulum", {"l": [0.5, 2.0]}),
    ],  # fmt: skip
)
def test_every_environment_steps_as_gymnax_does(env, params):
    problem = fj.problems.classic_control_td(env, 2, params, chains=2, steps=2, burn_in=0)
    moves = _kernel_against_gymnax(problem, 40)
    assert np.abs(np.asarray(moves.x[0]) - np.asarray(moves.x[1])).max() > 1e-6  # their own physics


def test_the_kernels_steps_are_gymnax_steps_with_each_agents_parameters(cartpole):
    moves = _kernel_against_gymnax(cartpole, 300)
    terminated = np.asarray(moves.terminated)
    assert terminated[0].sum() >= 1  # the short pole falls: the reset path is exercised (power)
    assert terminated[0].sum() > terminated[1].sum()  # and sooner than the long one
    # the agents share the keys and the policy's uniforms: only their physics tell them apart
    assert np.abs(np.asarray(moves.x[0]) - np.asarray(moves.x[1])).max() > 1e-2


def test_skip_keeps_every_kth_transition(cartpole):
    rand = cartpole.randomness(jax.random.key(1), 1, 6, skip=3)
    params = jax.tree.map(lambda x: x[:1], cartpole.agent_params())
    sampler = jax.vmap(cartpole.init_sampler)(jax.random.split(jax.random.key(2), 1), params)
    observe = jax.vmap(cartpole.observe, in_axes=(0, 0, 0, None))
    every, _ = observe(params, sampler, rand, 1)
    kept, _ = observe(params, sampler, rand, 3)
    np.testing.assert_array_equal(np.asarray(kept.x), np.asarray(every.x)[:, 2::3])


def test_the_direction_is_td0s_with_the_target_stopped_at_a_terminal_state(cartpole):
    phi = cartpole.features
    x, y = np.array([0.1, -0.2, 0.05, 0.3]), np.array([0.2, 0.1, -0.1, -0.4])
    theta = np.random.default_rng(0).normal(size=cartpole.dim)
    for terminated in (False, True):
        obs = cc.Transition(x, np.float64(1.0), y, np.bool_(terminated))
        got = np.asarray(cartpole.direction(None, obs, theta))
        f, g = np.asarray(phi(x)), np.asarray(phi(y))
        target = 1.0 + (0.0 if terminated else 0.9 * g @ theta)
        np.testing.assert_allclose(got, (f @ theta - target) * f, rtol=1e-12)


def test_the_reference_is_reproducible_and_its_error_is_the_spread_of_independent_ones(cartpole):
    refs = [cc.reference_systems(cartpole, jax.random.key(k), 32, 400, 400) for k in range(1, 13)]
    again = cc.reference_systems(cartpole, jax.random.key(1), 32, 400, 400)
    for a, b in zip(again, refs[0]):
        np.testing.assert_array_equal(a, b)
    stars = np.stack([r.theta_star for r in refs])
    spread, reported = stars.var(0, ddof=1).sum(), np.mean([np.sum(r.theta_star_sem**2) for r in refs])
    assert 0.5 < spread / reported < 2.0, (spread, reported)  # 12 references: about +-40 %
    locals_ = np.stack([r.local_theta_star for r in refs])
    local_reported = np.mean([np.sum(r.local_theta_star_sem**2, -1) for r in refs], 0)
    assert np.all(np.abs(np.log(locals_.var(0, ddof=1).sum(-1) / local_reported)) < np.log(2.0))
    # 4x the chains: a quarter of the variance (the estimate of it is good to about 25 % at 32 chains)
    more = cc.reference_systems(cartpole, jax.random.key(1), 128, 400, 400)
    ratio = np.sum(again.theta_star_sem**2) / np.sum(more.theta_star_sem**2)
    assert 2.5 < ratio < 6.4, ratio


def test_fedlsa_with_one_local_step_reaches_the_references_floor(cartpole):
    """With decreasing steps (1/k) FedLSA with H = 1 converges to theta_star: against the reference
    its mean is within Z_TOL joint standard errors (the seeds' and the reference's) and its MSE falls
    towards the reference's own error |theta_hat - theta_star|^2 (a constant step keeps a Markov bias
    of order eta on these correlated trajectories: an MSE of about 2 after 3000 steps at eta = 0.1)."""
    star, ref = np.asarray(cartpole.theta_star), cartpole.reference_mse
    steps = fj.schedule(fj.optim.inverse_time, eta0=0.2, k0=500.0)
    res = fj.simulate(0, cartpole, fj.fedlsa(steps, 1), 20_000, 64, record_every=2000, theta0=star)
    z = (res.theta_mean[-1] - star) / np.sqrt(
        res.theta_sem[-1] ** 2 + np.asarray(cartpole.theta_star_sem) ** 2
    )
    assert np.all(np.abs(z) < Z_TOL), z
    mse = res.mse_mean[1:]
    assert np.all(np.diff(mse) < 0), mse  # falling at every record
    assert mse[-1] < mse[0] / 2 and mse[-1] < 5 * ref, (mse, ref)


def test_describe_and_theory_refusals(cartpole):
    d = cartpole.describe()
    assert d["env"] == "cartpole" and d["agent_env_params"]["length"] == LENGTHS
    assert d["reference"]["chains"] == 256 and d["reference"]["reference_mse"] == cartpole.reference_mse
    with pytest.raises(ValueError, match="markov"):
        fj.theory.exact_mse(cartpole, fj.fedlsa(0.1, 2), 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(env="lunarlander"), r"^env='lunarlander' is invalid"),
        (dict(env_params={"lenght": 0.5}), r"^lenght=0\.5 is invalid: not a parameter of CartPole-v1"),
        (
            dict(env_params={"length": [0.5, 0.6, 0.7]}),
            r"^length=.* is invalid: expected one positive",
        ),
        (
            dict(features="fourier:1", env="mountaincar", policy=lambda x, u: 0, gamma=1.0),
            r"^gamma=1\.0 is invalid",
        ),
        (
            dict(features=fj.problems.fourier_basis([0.0], [1.0], 1)),
            r"^features=.* is invalid: expected a map of 4",
        ),
        (dict(chains=1), r"^chains=1 is invalid"),
    ],
)
def test_bad_values_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fj.problems.classic_control_td(**{"num_agents": 2, "chains": 2, "steps": 2, "burn_in": 0, **kwargs})


def test_command_line(tmp_path, capsys):
    from fedsa_jax.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--problem",
                "cartpole",
                "--agents",
                "2",
                "--env-params",
                "length=0.25:1.0",
                "--features",
                "fourier:1",
                "--reference",
                "8:100:100",
                "--rounds",
                "4",
                "--seeds",
                "8",
                "-H",
                "5",
                "--step-size",
                "0.1",
                "--out",
                str(out),
            ]  # fmt: skip
        )
        == 0
    )
    printed = capsys.readouterr()
    assert "reference theta*: estimated by Monte Carlo" in printed.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problem"]["agent_env_params"]["length"] == LENGTHS
    assert summary["problem"]["reference"]["chains"] == 8 and summary["reference_mse"] > 0
    assert any("within 10x of the reference" in w for w in summary["warnings"])  # 8 chains: not resolved
    assert (out / "mse.png").exists() and (out / "result_fedlsa.npz").exists()
    for flag, value in (("--env-params", "length"), ("--reference", "8:100"), ("--features", "tiles:x")):
        argv = [
            "run",
            "--problem",
            "cartpole",
            flag,
            value,
            "--rounds",
            "2",
            "--seeds",
            "2",
            "--out",
            str(out),
        ]
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse's own check of the option's text
            code = stop.code
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert flag in err[-1] and value in err[-1], err


def test_env_params_texts():
    """Every form of ``--env-params``; ``NAME~H`` spreads around gymnax's own default (CartPole's
    pole length 0.5: 0.25 to 0.75 at H = 0.5) and H = 0 is every agent the default."""
    parse = fj.problems.environments.parse_env_params
    assert parse("length=0.3", 3) == {"length": [0.3]}
    assert parse("length=0.3,0.5,0.7;masscart=2", 3) == {"length": [0.3, 0.5, 0.7], "masscart": [2.0]}
    np.testing.assert_allclose(parse("length=0.25:1.0", 4)["length"], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(parse("length~0.5", 3, "cartpole")["length"], [0.25, 0.5, 0.75])
    assert parse("length~0", 2, "cartpole") == {"length": [0.5, 0.5]}
    for text in ("length~1.0", "length~x", "length"):
        with pytest.raises(ValueError, match=r"^env_params=.* is invalid: expected NAME=V"):
            parse(text, 2, "cartpole")
    with pytest.raises(ValueError, match=r"^lenght=0\.5 is invalid: not a parameter of CartPole-v1"):
        parse("lenght~0.5", 2, "cartpole")
