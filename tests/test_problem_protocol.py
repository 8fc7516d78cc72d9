"""The problem protocol: a user-defined problem runs through the driver and the theory,
missing members are named, and the noise-free ``expected(problem)`` follows the
exact mean recursion."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax.problems.protocol import REQUIRED_MEMBERS


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Scalar:
    """The protocol's docstring example: ``A_c(Z) = a_c``, ``b_c(Z) = b_c + z``, z ~ N(0, 1)."""

    A_bar: jax.Array  # (N, 1, 1)
    b_bar: jax.Array  # (N, 1)
    theta_star: jax.Array  # (1,)
    local_theta_star: jax.Array  # (N, 1)
    num_agents = property(lambda self: self.A_bar.shape[0])
    dim = property(lambda self: 1)
    dtype = property(lambda self: self.A_bar.dtype)

    def agent_params(self):
        return (self.A_bar, self.b_bar)

    def init_sampler(self, key, params):
        return jnp.zeros((), jnp.int32)

    def randomness(self, key, num_agents, num_obs, skip=1):
        return jax.random.normal(key, (num_agents, num_obs), self.dtype)

    def observe(self, params, sampler, rand, skip=1):
        return rand, sampler

    def direction(self, params, z, theta):
        return params[0] @ theta - params[1] - z

    def describe(self):
        return {"family": "scalar", "num_agents": self.num_agents}


def scalar(a=(0.5, 1.5), b=(1.0, -2.0)):
    A = np.asarray(a, float)[:, None, None]
    bb = np.asarray(b, float)[:, None]
    star, local = fj.problems.fixed_points(A, bb)
    return Scalar(jnp.asarray(A), jnp.asarray(bb), jnp.asarray(star), jnp.asarray(local))


def test_members_match_the_protocol():
    P = fj.problems.Problem
    declared = set(P.__annotations__) | {n for n in vars(P) if not n.startswith("_")}
    assert set(REQUIRED_MEMBERS) == declared


def test_user_problem_runs_through_simulate_and_theory():
    p = scalar()
    assert fj.problems.missing_members(p) == [] and isinstance(p, fj.problems.Problem)
    alg = fj.fedlsa(0.2, 2)
    T = 12
    res = fj.simulate(jax.random.key(0), p, alg, T, 4000, theta0=np.array([3.0]), record_every=3)
    mean = fj.theory.exact_mean(p, alg, T, theta0=np.array([3.0]))[res.rounds]
    z = (res.theta_mean[1:] - mean[1:]) / res.theta_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    assert res.config["problem"] == {"family": "scalar", "num_agents": 2}
    # FedLSA's bias: the limit mean is theta_star + fedlsa_bias, not theta_star
    bias = fj.theory.fedlsa_bias(p, 0.2, 2)
    np.testing.assert_allclose(
        fj.theory.exact_mean(p, alg, 400)[-1] - np.asarray(p.theta_star), bias, rtol=1e-10
    )
    assert abs(bias[0]) > 1e-3
    # continuous noise and no finite_support(): exact_mse says what it covers
    with pytest.raises(ValueError, match=r"problem='Scalar' is invalid: .*finite_support\(\)"):
        fj.theory.exact_mse(p, alg, 3)


def test_missing_members():
    class Partial:
        A_bar = b_bar = np.zeros((1, 1, 1))
        direction = 3  # not callable

        def describe(self):
            return {}

    missing = fj.problems.missing_members(Partial())
    assert missing == [
        "num_agents",
        "dim",
        "dtype",
        "agent_params",
        "init_sampler",
        "randomness",
        "observe",
        "direction",
        "theta_star",
        "local_theta_star",
    ]
    assert fj.problems.missing_members(object()) == list(REQUIRED_MEMBERS)
    assert not isinstance(Partial(), fj.problems.Problem)
    with pytest.raises(
        ValueError, match=r"problem='Partial' is invalid: not a problem: it lacks num_agents, dim"
    ):
        fj.problems.expected(Partial())


def test_built_in_problems_follow_the_protocol(het_gaussian, tiny_td):
    P, r, Phi = tiny_td
    ls = fj.problems.least_squares([np.eye(2), np.ones((1, 2))], [np.ones(2), np.ones(1)])
    for p in (het_gaussian, fj.problems.federated_td(P, r, Phi, 0.9), ls, fj.problems.expected(ls)):
        assert fj.problems.missing_members(p) == [] and isinstance(p, fj.problems.Problem)


def test_finite_support_is_checked():
    p = fj.problems.expected(scalar())

    class Wrong(fj.problems.ExpectedProblem):
        def finite_support(self):
            s = super().finite_support()
            return s._replace(A=2 * s.A)

    wrong = Wrong(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
    with pytest.raises(ValueError, match=r"Wrong.finite_support\(\)=.* is invalid: expected sum_k weights A"):
        fj.theory.exact_mse(wrong, fj.fedlsa(0.1, 1), 2)


def test_expected_problem_is_the_mean_path(het_gaussian):
    base = het_gaussian
    p = fj.problems.expected(base)
    assert p.describe() == {"family": "expected", "of": base.describe()}
    for field in ("A_bar", "b_bar", "theta_star", "local_theta_star"):
        np.testing.assert_array_equal(getattr(p, field), getattr(base, field))
    assert p.dtype == base.dtype
    T, theta0 = 10, np.array([1.0, -2.0, 0.5])
    alg = fj.fedlsa(0.2, 4)
    res = fj.simulate(jax.random.key(1), p, alg, T, 64, theta0=theta0, record_every=2)
    # every seed follows the same path; the seed mean only adds the rounding of sum / n
    assert np.all(res.final_theta == res.final_theta[0])
    assert np.all(res.mse_sem == 0.0)  # identical seeds: exactly 0
    mean = fj.theory.exact_mean(p, alg, T, theta0=theta0)
    np.testing.assert_allclose(res.theta_mean, mean[res.rounds], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        res.mse_mean, fj.theory.exact_mse(p, alg, T, theta0=theta0)[res.rounds], rtol=1e-12
    )
    for alg in (fj.fedlsa(0.2, 4), fj.scafflsa(0.2, 4)):
        # zero noise: the exact MSE is the squared distance of the exact mean
        mean = fj.theory.exact_mean(p, alg, T, theta0=theta0)
        mse = fj.theory.exact_mse(p, alg, T, theta0=theta0)
        np.testing.assert_allclose(mse, np.sum((mean - np.asarray(base.theta_star)) ** 2, axis=1), rtol=1e-12)
        # the noisy problem has the same mean and a larger MSE
        np.testing.assert_array_equal(mean, fj.theory.exact_mean(base, alg, T, theta0=theta0))
        assert np.all(fj.theory.exact_mse(base, alg, T, theta0=theta0)[1:] > mse[1:])
