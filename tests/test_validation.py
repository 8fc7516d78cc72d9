"""Bad input: a ValueError naming the parameter, raised before anything compiles."""

import importlib

import jax
import numpy as np
import pytest

import fedsa_jax as fj

sim_mod = importlib.import_module("fedsa_jax._runtime.kernel")

P = np.array([[[0.5, 0.5], [0.2, 0.8]]])
R = np.array([[1.0, 0.0]])
PHI = np.array([[1.0], [0.5]])


def td(**kw):
    args = dict(transitions=P, rewards=R, features=PHI, gamma=0.9)
    args.update(kw)
    return fj.problems.federated_td(**args)


def gaussian(**kw):
    args = dict(A_bar=np.stack([np.eye(2)] * 2), b_bar=np.ones((2, 2)), noise_A=0.1, noise_b=0.1)
    args.update(kw)
    return fj.problems.gaussian_lsa(**args)


GOOD = fj.problems.gaussian_lsa(np.stack([np.eye(2)] * 2), np.ones((2, 2)))

BAD = [
    ("step_size", lambda: fj.fedlsa(0.0, 1)),
    ("step_size", lambda: fj.scafflsa(-0.1, 1)),
    ("step_size", lambda: fj.fedlsa(float("nan"), 1)),
    ("num_local_steps", lambda: fj.fedlsa(0.1, 0)),
    ("num_local_steps", lambda: fj.scafflsa(0.1, 2.5)),
    ("skip", lambda: fj.fedlsa(0.1, 1, skip=0)),
    ("A_bar", lambda: gaussian(A_bar=np.ones((2, 2, 3)))),
    ("b_bar", lambda: gaussian(b_bar=np.ones((3, 2)))),
    ("A_bar", lambda: gaussian(A_bar=np.zeros((2, 2, 2)))),  # singular mean
    ("A_bar", lambda: gaussian(A_bar=np.full((2, 2, 2), np.nan))),
    ("b_bar", lambda: gaussian(b_bar=np.array([[1.0, np.inf], [0.0, 0.0]]))),
    ("noise_A", lambda: gaussian(noise_A=-1.0)),
    ("noise_b", lambda: gaussian(noise_b=[0.1, 0.2, 0.3])),
    ("transitions", lambda: td(transitions=np.array([[[0.5, 0.6], [0.2, 0.8]]]))),
    ("transitions", lambda: td(transitions=np.array([[[1.5, -0.5], [0.2, 0.8]]]))),
    ("transitions", lambda: td(transitions=np.eye(2)[None])),  # two recurrent classes
    ("transitions", lambda: td(transitions=np.ones((0, 2, 2)))),  # no agent
    ("A_bar", lambda: gaussian(A_bar=np.ones((0, 2, 2)), b_bar=np.ones((0, 2)))),
    ("rewards", lambda: td(rewards=np.ones((1, 3)))),
    ("features", lambda: td(features=np.ones((3, 1)))),
    ("features", lambda: td(features=np.ones((2, 2)))),  # rank deficient
    ("gamma", lambda: td(gamma=1.0)),
    ("gamma", lambda: td(gamma=-0.1)),
    ("sampling", lambda: td(sampling="offline")),
    ("dtype", lambda: td(dtype="int32")),
    ("num_agents", lambda: fj.problems.garnet(jax.random.key(0), num_agents=0)),
    ("heterogeneity", lambda: fj.problems.garnet(jax.random.key(0), heterogeneity="medium")),
    ("heterogeneity", lambda: fj.problems.garnet(jax.random.key(0), heterogeneity=1.5)),
    ("dim", lambda: fj.problems.garnet(jax.random.key(0), dim=40)),
    ("branching", lambda: fj.problems.garnet(jax.random.key(0), branching=31)),
    ("heterogeneity", lambda: fj.problems.random_gaussian_lsa(jax.random.key(0), heterogeneity=-1)),
    ("key", lambda: fj.problems.garnet("seed")),
    ("num_rounds", lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 0, 4)),
    ("num_seeds", lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 5, 0)),
    ("num_seeds", lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 5, 2**31)),
    (
        "num_rounds",
        lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 2**32, 4),
    ),  # uint32 counter
    (
        "record_every",
        lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 2**30, 4),
    ),  # 2**30 records
    ("record_every", lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 5, 4, record_every=6)),
    ("theta0", lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 5, 4, theta0=np.ones(3))),
    ("theta0", lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 5, 4, theta0=[np.nan, 0])),
    ("key", lambda: fj.simulate(jax.random.key(0, impl="rbg"), GOOD, fj.fedlsa(0.1, 1), 5, 4)),
    ("key", lambda: fj.simulate(jax.random.key(0, impl="unsafe_rbg"), GOOD, fj.fedlsa(0.1, 1), 5, 4)),
    ("key", lambda: fj.simulate("abc", GOOD, fj.fedlsa(0.1, 1), 5, 4)),
    ("problem", lambda: fj.simulate(jax.random.key(0), object(), fj.fedlsa(0.1, 1), 5, 4)),
    ("algorithm", lambda: fj.simulate(jax.random.key(0), GOOD, "fedlsa", 5, 4)),
    (
        "divergence_threshold",
        lambda: fj.simulate(jax.random.key(0), GOOD, fj.fedlsa(0.1, 1), 5, 4, divergence_threshold=0),
    ),
]


@pytest.mark.parametrize("param,make", BAD, ids=[f"{i}-{p}" for i, (p, _) in enumerate(BAD)])
def test_bad_input_raises_before_compiling(param, make):
    before = sim_mod._num_traces
    with pytest.raises(ValueError, match=rf"^{param}(\[\d+\])?=") as info:
        make()
    msg = str(info.value)
    assert "invalid" in msg and ":" in msg  # value, then what is allowed
    assert sim_mod._num_traces == before


def test_messages_name_value_and_range():
    with pytest.raises(
        ValueError, match=r"step_size=-0\.1 is invalid: expected a finite real number in \(0\.0"
    ):
        fj.fedlsa(-0.1, 3)
    with pytest.raises(
        ValueError, match=r"sampling='offline' is invalid: expected one of 'generative', 'markov'"
    ):
        td(sampling="offline")
    with pytest.raises(ValueError, match="rbg"):
        fj.simulate(jax.random.key(0, impl="rbg"), GOOD, fj.fedlsa(0.1, 1), 5, 4)


def test_legacy_uint32_keys_and_int_seeds_accepted():
    a = fj.simulate(jax.random.PRNGKey(3), GOOD, fj.fedlsa(0.1, 1), 3, 2)
    b = fj.simulate(jax.random.key(3), GOOD, fj.fedlsa(0.1, 1), 3, 2)
    c = fj.simulate(3, GOOD, fj.fedlsa(0.1, 1), 3, 2)
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    np.testing.assert_array_equal(a.final_theta, c.final_theta)
