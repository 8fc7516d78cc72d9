"""Federated least squares: systems against numpy, the row sampler against its law,
the exact MSE against enumeration and Monte Carlo, bad input."""

import dataclasses
import re

import jax
import numpy as np
import pytest
from conftest import Z_TOL
from reference import enumerated_algorithm_mse

import fedsa_jax as fj


def data(sizes, d, seed=0, noise=0.5):
    """Heterogeneous regression data: each agent's own true parameter, uneven row counts."""
    rng = np.random.default_rng(seed)
    X = [rng.normal(size=(n, d)) + 0.3 * c for c, n in enumerate(sizes)]
    y = [x @ rng.normal(size=d) + noise * rng.normal(size=len(x)) for x in X]
    return X, y


@pytest.fixture(scope="module")
def ls3():
    X, y = data((7, 12, 4), 3)
    return X, y, fj.problems.least_squares(X, y)


def test_systems_match_numpy(ls3):
    X, y, p = ls3
    assert (p.num_agents, p.dim, p.dtype) == (3, 3, np.float64)
    assert p.describe() == {
        "family": "least_squares",
        "num_agents": 3,
        "dim": 3,
        "rows_per_agent": [7, 12, 4],
    }
    for c in range(3):
        n = len(y[c])
        np.testing.assert_allclose(p.A_bar[c], X[c].T @ X[c] / n, rtol=1e-13)
        np.testing.assert_allclose(p.b_bar[c], X[c].T @ y[c] / n, rtol=1e-13)
        np.testing.assert_allclose(
            p.local_theta_star[c], np.linalg.lstsq(X[c], y[c], rcond=None)[0], rtol=1e-10
        )
    # theta_star minimises sum_c |X_c theta - y_c|^2 / n_c: least squares on rows scaled by 1/sqrt(n_c)
    w = [1 / np.sqrt(len(t)) for t in y]
    pooled = np.linalg.lstsq(
        np.concatenate([x * s for x, s in zip(X, w)]),
        np.concatenate([t * s for t, s in zip(y, w)]),
        rcond=None,
    )[0]
    np.testing.assert_allclose(p.theta_star, pooled, rtol=1e-10)
    # the mean recursion and FedLSA's closed-form bias read the same systems
    bias = fj.theory.fedlsa_bias(p, 0.1, 3)
    limit = fj.theory.exact_mean(p, fj.fedlsa(0.1, 3), 500)[-1]
    np.testing.assert_allclose(limit - np.asarray(p.theta_star), bias, rtol=1e-8)
    assert np.linalg.norm(bias) > 1e-3
    # an agent with fewer rows than d has no local solution; integer data are converted
    q = fj.problems.least_squares([np.eye(2, dtype=int), [[1, 1]]], [np.array([1, 2]), [3]])
    assert np.all(np.isnan(q.local_theta_star[1])) and q.A_bar.dtype == np.float64
    assert fj.problems.least_squares(X, y, dtype="float32").rows.dtype == np.float32


def test_rows_are_drawn_uniformly():
    sizes = (3, 7, 1)
    X = [np.random.default_rng(c).normal(size=(n, 2)) for c, n in enumerate(sizes)]
    y = [100.0 * c + np.arange(n) for c, n in enumerate(sizes)]  # the target names the row
    p = fj.problems.least_squares(X, y)
    n = 100_000
    u = p.randomness(jax.random.key(0), 3, n)
    obs, _ = jax.vmap(p.observe, (0, None, 0))(p.agent_params(), 0, u)
    for c, k in enumerate(sizes):
        row = np.asarray(obs.y[c]) - 100.0 * c
        np.testing.assert_array_equal(np.asarray(obs.x[c]), X[c][row.astype(int)])
        counts = np.bincount(row.astype(int), minlength=k)
        assert len(counts) == k
        z = np.abs(counts - n / k) / (np.sqrt(n * (1 / k) * (1 - 1 / k)) + 1e-12)
        assert np.all(z < Z_TOL), z
    # the direction is the squared-loss gradient (x^T theta - y) x
    theta = np.array([0.3, -1.2])
    g = p.direction(None, jax.tree.map(lambda a: a[1, 0], obs), theta)
    x, t = np.asarray(obs.x[1, 0]), float(obs.y[1, 0])
    np.testing.assert_allclose(g, (x @ theta - t) * x, rtol=1e-14)


ALGORITHMS = {
    "fedlsa": lambda: fj.fedlsa(0.3, 2),
    "scafflsa": lambda: fj.scafflsa(0.3, 2),
    "qfedtd_randk_erasures": lambda: fj.qfedtd(0.5, fj.channel.rand_k(1), success_prob=0.7),
}


@pytest.mark.parametrize("case", list(ALGORITHMS))
def test_exact_mse_matches_enumeration(case):
    """Tiny case (N=2, n_c = 2 and 3, d=2, H=2): every row sequence enumerated."""
    X, y = data((2, 3), 2, seed=4)
    p = fj.problems.least_squares(X, y)
    # per agent, each row (x, t) with probability 1/n_c: A(z) = x x^T, b(z) = t x
    support = [
        (np.full(len(t), 1 / len(t)), np.einsum("ki,kj->kij", xs, xs), t[:, None] * xs) for xs, t in zip(X, y)
    ]
    alg = ALGORITHMS[case]()
    theta0 = np.array([0.5, -1.0])
    got = fj.theory.exact_mse(p, alg, 4, theta0=theta0)
    ref = enumerated_algorithm_mse(p, alg, 4, theta0=theta0, support=support)
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    assert np.all(np.diff(got[:2]) != 0)


def test_explicit_support_equals_rank_one(ls3):
    """The same law given as explicit A(z) = x x^T gives the same exact curve."""
    _, _, p = ls3

    class Explicit(fj.problems.LeastSquares):
        def finite_support(self):
            s = super().finite_support()
            return fj.problems.FiniteSupport(s.weights, s.b, A=s.left[..., :, None] * s.right[..., None, :])

    q = Explicit(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
    alg = fj.scafflsa(0.2, 3)
    np.testing.assert_allclose(fj.theory.exact_mse(q, alg, 6), fj.theory.exact_mse(p, alg, 6), rtol=1e-12)


@pytest.mark.parametrize(
    "make", [lambda eta: fj.fedlsa(eta, 3), lambda eta: fj.scafflsa(eta, 3)], ids=["fedlsa", "scafflsa"]
)
def test_exact_mse_matches_monte_carlo(ls3, make):
    _, _, p = ls3
    eta, T, n = 0.1, 24, 4000
    theta0 = np.array([1.0, -1.0, 0.5])
    res = fj.simulate(jax.random.key(2), p, make(eta), T, n, theta0=theta0, record_every=4)
    exact = fj.theory.exact_mse(p, make(eta), T, theta0=theta0)[res.rounds]
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.max(np.abs(z)) < Z_TOL, z
    assert exact[-1] < 0.5 * exact[0]
    # power: the exact curve of a 20 % larger step size is far outside the band
    other = fj.theory.exact_mse(p, make(1.2 * eta), T, theta0=theta0)[res.rounds]
    assert np.max(np.abs(res.mse_mean[1:] - other[1:]) / res.mse_sem[1:]) > 2 * Z_TOL
    # and so is the noise-free curve: the sampling noise term matters
    mean_path = fj.theory.exact_mse(fj.problems.expected(p), make(eta), T, theta0=theta0)[res.rounds]
    assert np.max(np.abs(res.mse_mean[1:] - mean_path[1:]) / res.mse_sem[1:]) > 2 * Z_TOL


X2, Y2 = data((4, 5), 2)
RAGGED = [np.ones((3, 2)), np.ones((2, 3))]

BAD = [
    ("features[1]", lambda: fj.problems.least_squares([X2[0], np.full((5, 2), np.nan)], Y2)),
    ("targets[0]", lambda: fj.problems.least_squares(X2, [np.append(Y2[0][:-1], np.inf), Y2[1]])),
    ("targets", lambda: fj.problems.least_squares(X2, Y2[:1])),
    ("targets[1]", lambda: fj.problems.least_squares(X2, [Y2[0], Y2[1][:-1]])),
    ("features[0]", lambda: fj.problems.least_squares([X2[0][:, 0], X2[1]], Y2)),  # 1-d
    ("targets[0]", lambda: fj.problems.least_squares(X2, [Y2[0][:, None], Y2[1]])),  # 2-d
    ("features[1]", lambda: fj.problems.least_squares([X2[0], np.zeros((0, 2))], [Y2[0], np.zeros(0)])),
    ("features[1]", lambda: fj.problems.least_squares(RAGGED, [np.ones(3), np.ones(2)])),  # d differs
    (
        "features",
        lambda: fj.problems.least_squares([np.ones((3, 2)), np.ones((4, 2))], [np.ones(3), np.ones(4)]),
    ),
    ("features", lambda: fj.problems.least_squares([], [])),
    ("features[0]", lambda: fj.problems.least_squares(np.ones(3), np.ones(3))),  # not a list of 2-d arrays
    ("features", lambda: fj.problems.least_squares(5, [1.0])),
    ("dtype", lambda: fj.problems.least_squares(X2, Y2, dtype="int32")),
    ("features[0]", lambda: fj.problems.least_squares([[["a", "b"]]], [[1.0]])),
]


@pytest.mark.parametrize("param,make", BAD, ids=[f"{i}-{p}" for i, (p, _) in enumerate(BAD)])
def test_bad_input(param, make):
    with pytest.raises(ValueError, match=rf"^{re.escape(param)}=.* is invalid: "):
        make()


def test_singular_message_names_features():
    with pytest.raises(
        ValueError, match=r"features='list of 2 arrays' is invalid: .*singular.*full column rank"
    ):
        fj.problems.least_squares([np.ones((3, 2)), np.ones((4, 2))], [np.ones(3), np.ones(4)])
