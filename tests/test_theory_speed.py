"""Faster exact recursions equal the plain ones.

* A long constant-step horizon runs through the assembled operator of the persistent coordinates
  (``z_{t+1} = M z_t + c``) instead of the phases: the same curve as round by round, to 1e-10.
"""

import jax
import numpy as np
import optax
import pytest

import fedsa_jax as fj
from fedsa_jax.theory import _operator

T = 600


@pytest.fixture(scope="module")
def problems(het_gaussian):
    td = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=2)
    return {"gaussian": (het_gaussian, 0.1), "td": (td, 0.3)}


FAST = {
    "fedlsa": lambda eta: fj.fedlsa(eta, 3),
    "fedlsa_momentum": lambda eta: fj.fedlsa(eta, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)),
    "qfedtd_randk_erasures": lambda eta: fj.qfedtd(eta, quantizer=fj.channel.rand_k(2), success_prob=0.7),
    "scaffnew": lambda eta: fj.scaffnew(eta, 0.4, 2),
}


def _round_by_round(problem, alg, T, monkeypatch, theta0=None):
    with monkeypatch.context() as m:
        m.setattr(_operator, "CURVE_RATIO", 10**9)
        return fj.theory.exact_mse(problem, alg, T, theta0)


def _taken(monkeypatch):
    calls = []
    assemble = _operator.Operator.assemble
    monkeypatch.setattr(_operator.Operator, "assemble", lambda self: calls.append(self.n) or assemble(self))
    return calls


@pytest.mark.parametrize("family", ["gaussian", "td"])
@pytest.mark.parametrize("name", list(FAST))
def test_long_constant_horizon_through_the_assembled_operator(problems, family, name, monkeypatch):
    problem, eta = problems[family]
    alg = FAST[name](eta)
    theta0 = np.linspace(-1.0, 1.0, problem.dim)
    calls = _taken(monkeypatch)
    fast = fj.theory.exact_mse(problem, alg, T, theta0)
    assert calls and 3 * (calls[0] + 1) <= T  # the shortcut was taken
    slow = _round_by_round(problem, alg, T, monkeypatch, theta0)
    np.testing.assert_allclose(fast, slow, rtol=1e-10, atol=0)


def test_zero_sum_control_variates_in_their_subspace(problems, monkeypatch):
    problem, eta = problems["td"]  # d = 2, N = 3: 7 persistent coordinates (xi in its 4-dim subspace)
    alg = fj.scafflsa(eta, 3)
    calls = _taken(monkeypatch)
    fast = fj.theory.exact_mse(problem, alg, T)
    assert calls == [28]
    np.testing.assert_allclose(fast, _round_by_round(problem, alg, T, monkeypatch), rtol=1e-10, atol=0)


def test_the_shortcut_declines_where_it_does_not_apply(problems, monkeypatch):
    problem, eta = problems["gaussian"]
    calls = _taken(monkeypatch)
    for alg, horizon in (
        (fj.averaged(fj.fedlsa(eta, 2)), T),  # the round changes with t
        (fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=eta, k0=10.0), 2), T),  # a schedule
        (fj.fedlsa(eta, 2), 20),  # a horizon shorter than 3 x the unknowns (10 + 2)
    ):
        fj.theory.exact_mse(problem, alg, horizon)
    assert calls == []
