"""A user's algorithm gets exact moments by describing its round with the public blocks of fj.theory.

Two algorithms written from the public API only, as the documentation shows them: FedAvgM (server
momentum on FedLSA's average) and a relaxed FedLSA whose server moves a fraction beta toward the
agents' mean. Each describes its round in at most 25 lines; Monte Carlo (``fj.simulate``) then
matches ``fj.theory.exact_mean`` and ``exact_mse`` within Z_TOL standard errors at every recorded
round, on Gaussian LSA and on generative TD (garnet). An algorithm without a description gets one
ValueError saying how to add one.
"""

import dataclasses
import inspect

import jax
import numpy as np
import pytest
from conftest import Z_TOL
from test_extension import MyConfig, my_init, my_step  # server momentum, as the docs write it

import fedsa_jax as fj
from fedsa_jax.algorithms.fedlsa import init as fedlsa_init, step as fedlsa_step

# ---------------------------- server momentum, FedAvgM (docs/write-your-own/algorithm.md)


def fedavgm_theory(config, problem):
    """v <- beta v + (mean - theta), theta <- theta + v = beta v + mean."""
    y = fj.theory.Augmented(problem)
    y.add("loc", per_agent=True)  # the agents' iterates during a round
    y.add("velocity", carried=True)  # kept across rounds, starts at 0
    y.add("mean")  # scratch block: the aggregate
    b = float(config.momentum)
    server = fj.theory.assign(
        y, velocity={"velocity": b, "mean": 1.0, "theta": -1.0}, theta={"velocity": b, "mean": 1.0}
    )
    send = fj.theory.broadcast(y)

    def round(t, etas):
        return [
            send,
            *(fj.theory.local_step(y, eta) for eta in etas),
            fj.theory.aggregate(y, fj.channel.channel(), into="mean"),
            server,
        ]

    return fj.theory.Recursion(y, round, config.step_size, config.num_local_steps)


def fedavgm(step_size, momentum, num_local_steps):
    return fj.Algorithm(
        MyConfig(step_size, momentum, num_local_steps), "fedavgm", my_init, my_step, theory=fedavgm_theory
    )


# ------------------------------------- relaxed FedLSA (docs/write-your-own/theory.md, "Example")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RelaxedConfig:
    step_size: float
    beta: float
    channel: object
    num_local_steps: int = dataclasses.field(metadata=dict(static=True))
    skip: int = dataclasses.field(default=1, metadata=dict(static=True))


def relaxed_step(rand, state, problem, config):
    new, info = fedlsa_step(rand, state, problem, config)
    error = state.error + config.beta * (new.error - state.error)
    return new._replace(theta=problem.theta_star + error, error=error), info


def relaxed_theory(config, problem):
    """theta <- theta + beta (aggregate - theta), the aggregate through the config's channel."""
    y = fj.theory.Augmented(problem)
    y.add("loc", per_agent=True)
    y.add("mean")
    b = float(config.beta)
    server = fj.theory.assign(y, theta={"theta": 1.0 - b, "mean": b})
    send = fj.theory.broadcast(y)

    def round(t, etas):
        return [
            send,
            *(fj.theory.local_step(y, eta) for eta in etas),
            fj.theory.aggregate(y, config.channel, into="mean"),
            server,
        ]

    return fj.theory.Recursion(y, round, config.step_size, config.num_local_steps)


def relaxed(beta, step_size, num_local_steps, **channel):
    base = fj.fedlsa(step_size, num_local_steps, **channel).config
    return fj.Algorithm(
        RelaxedConfig(base.step_size, float(beta), base.channel, num_local_steps),
        "relaxed",
        fedlsa_init,
        relaxed_step,
        theory=relaxed_theory,
    )


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def problems(het_gaussian):
    td = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=3)
    return {"gaussian": (het_gaussian, 0.1), "td": (td, 0.3)}


ALGORITHMS = {
    "fedavgm": lambda eta: fedavgm(eta, 0.5, 3),
    "relaxed": lambda eta: relaxed(0.5, eta, 3),
    "relaxed_lossy": lambda eta: relaxed(
        0.6, eta, 3, success_prob=0.7, quantizer=fj.channel.rand_k(2), aggregation="divide_by_received"
    ),
}


@pytest.mark.parametrize("family", ["gaussian", "td"])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_user_algorithm_matches_monte_carlo(problems, family, name):
    problem, eta = problems[family]
    alg = ALGORITHMS[name](eta)
    T, n = 12, 4000
    theta0 = np.array([1.0, -1.0, 0.5])
    res = fj.simulate(jax.random.key(7), problem, alg, T, n, theta0=theta0, record_every=3)
    mse = fj.theory.exact_mse(problem, alg, T, theta0=theta0)[res.rounds]
    mean = fj.theory.exact_mean(problem, alg, T, theta0=theta0)[res.rounds]
    assert mse[0] == pytest.approx(res.mse_mean[0], rel=1e-12)
    z = (res.mse_mean[1:] - mse[1:]) / res.mse_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    z = (res.theta_mean[1:] - mean[1:]) / res.theta_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    # power: FedLSA's exact curve (no momentum, no relaxation) lies far outside that band
    plain = fj.theory.exact_mse(
        problem, fj.fedlsa(eta, 3, success_prob=alg.channel.success_prob), T, theta0=theta0
    )[res.rounds]
    assert np.max(np.abs(res.mse_mean[1:] - plain[1:]) / res.mse_sem[1:]) > 3 * Z_TOL


def test_blocks_rebuild_the_built_in_recursion_exactly(het_gaussian):
    """beta = 1 is FedLSA itself: the user's description (at most 25 lines) gives the built-in exact
    curves, to rounding, through a lossy channel too, and under Polyak-Ruppert averaging (a wrapper
    around a user's algorithm)."""
    for description in (fedavgm_theory, relaxed_theory):
        assert len(inspect.getsource(description).splitlines()) <= 25
    channel = dict(success_prob=0.6, quantizer=fj.channel.rand_k(2))
    for mine, ref in (
        (relaxed(1.0, 0.1, 3, **channel), fj.fedlsa(0.1, 3, **channel)),
        (fj.averaged(relaxed(1.0, 0.1, 3), 4), fj.averaged(fj.fedlsa(0.1, 3), 4)),
    ):
        np.testing.assert_allclose(
            fj.theory.exact_mse(het_gaussian, mine, 10),
            fj.theory.exact_mse(het_gaussian, ref, 10),
            rtol=1e-12,
        )
        np.testing.assert_allclose(
            fj.theory.exact_mean(het_gaussian, mine, 10),
            fj.theory.exact_mean(het_gaussian, ref, 10),
            rtol=1e-12,
        )
    # and the momentum of FedAvgM at 0 is FedLSA too
    np.testing.assert_allclose(
        fj.theory.exact_mse(het_gaussian, fedavgm(0.1, 0.0, 3), 10),
        fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.1, 3), 10),
        rtol=1e-12,
    )


def test_an_algorithm_without_description_says_how_to_add_one(het_gaussian):
    bare = fj.Algorithm(MyConfig(0.1, 0.5, 2), "fedavgm", my_init, my_step)
    for exact in (fj.theory.exact_mean, fj.theory.exact_mse):
        with pytest.raises(
            ValueError,
            match=r"algorithm='fedavgm' is invalid: has no exact moment "
            r"description: pass theory=fn to fj.Algorithm.*Recursion",
        ):
            exact(het_gaussian, bare, 3)
    with pytest.raises(ValueError, match="has no exact moment description"):
        fj.theory.exact_mse(het_gaussian, fj.averaged(bare), 3)
    with pytest.raises(ValueError, match="has no exact moment description"):
        fj.theory.max_stable_step_size(het_gaussian, bare)
