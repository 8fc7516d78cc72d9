"""The lossy, quantized uplink at the level of trajectories and of single messages.

* every algorithm through a quantizer and erasures against a numpy loop that
  includes the channel (``tests/reference.py``: the quantizers written from their
  definitions, fed the kernel's own uniforms), seed by seed, to float64 rounding,
  including SCAFFLSA's control variates and QFedTD under Markov sampling;
* QFedTD under Markov sampling reduces to FedLSA with one local step;
* each quantizer equals its definition draw by draw, its outputs lie on the grid
  its bits describe, and its per-coordinate variance (rand-k: covariance) is the
  exact one of its two-point law, within Z_TOL standard errors;
* ``divide_by_received`` weights are exactly ``1/|R|``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL
from reference import check_against_loop, gaussian_loop, quantize, step_trajectories, td_loop

import fedsa_jax as fj
from fedsa_jax.channel import transmit


@pytest.fixture(scope="module")
def problems(tiny_td, het_gaussian):
    P, r, Phi = tiny_td
    return {
        "td": fj.problems.federated_td(P, r, Phi, 0.9),
        "td_markov": fj.problems.federated_td(P, r, Phi, 0.9, sampling="markov"),
        "gaussian": het_gaussian,
    }


# One case per compiled structure (each costs seconds of compilation): together they cover every
# algorithm, both aggregation rules, four quantizer kinds, generative and Markov sampling (with
# skip), TD and Gaussian problems. The first runs through fj.simulate (statistics at every round);
# the others through the algorithms' init and step with the driver's keys (cheaper to compile).
LOOP_CASES = {
    "scafflsa-qsgd-erasures": (
        "td",
        lambda: fj.scafflsa(0.3, 4, quantizer=fj.channel.qsgd(2), success_prob=0.5),
    ),
    "scafflsa-uniform-received": (
        "gaussian",
        lambda: fj.scafflsa(
            0.1,
            3,
            quantizer=fj.channel.stochastic_uniform(3),
            success_prob=0.6,
            aggregation="divide_by_received",
        ),
    ),
    "fedlsa-natural-received-markov": (
        "td_markov",
        lambda: fj.fedlsa(
            0.3, 3, skip=2, quantizer=fj.channel.natural(), success_prob=0.7, aggregation="divide_by_received"
        ),
    ),
    "qfedtd-randk-erasures-markov": (
        "td_markov",
        lambda: fj.qfedtd(0.5, fj.channel.rand_k(1), success_prob=0.5),
    ),
}


@pytest.mark.parametrize("case", list(LOOP_CASES))
def test_channel_trajectories_match_numpy_loop(problems, case):
    name, make = LOOP_CASES[case]
    problem, alg = problems[name], make()
    loop = gaussian_loop if name == "gaussian" else td_loop
    theta0 = np.linspace(1.0, -0.5, problem.dim)
    refs = check_against_loop(
        problem, alg, loop, T=6, num_seeds=3, theta0=theta0, driver=case == "scafflsa-qsgd-erasures"
    )
    if alg.name == "scafflsa":
        # power: FedLSA through the same channel on the same random numbers (SCAFFLSA with its control
        # variates frozen) is far from SCAFFLSA's trajectory, many orders above the tolerance
        cfg = alg.config
        plain = fj.fedlsa(
            cfg.step_size,
            cfg.num_local_steps,
            quantizer=cfg.channel.quantizer,
            success_prob=cfg.channel.success_prob,
            aggregation=cfg.channel.aggregation,
        )
        frozen = np.stack([loop(problem, plain, jax.random.key(11), s, 6, theta0=theta0) for s in range(3)])
        assert np.abs(frozen[:, -1] - refs[:, -1]).max() > 1e-4


def test_qfedtd_markov_reduces_to_fedtd(problems):
    """p = 1 and no quantizer: QFedTD is FedLSA with H = 1, seed by seed, under Markov sampling
    too (each agent's chain carried across rounds by both)."""
    p = problems["td_markov"]
    key = jax.random.key(3)
    a = step_trajectories(p, fj.qfedtd(0.5), key, 15, 6)
    b = step_trajectories(p, fj.fedlsa(0.5, 1), key, 15, 6)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert np.abs(a[:, -1] - a[:, 0]).min() > 1e-3  # the iterates moved


# ---------------------------------------------------------------------------------------------
# Single messages

X = np.array([0.9, -0.35, 0.0, 2.0, -1.7, 0.05, 0.3, -0.0])  # d = 8, with zeros
D = X.shape[0]
M = 100_000

QUANTIZERS = {
    "uniform-1bit": fj.channel.stochastic_uniform(1),
    "uniform-3bit": fj.channel.stochastic_uniform(3),
    "uniform-fixed-range": fj.channel.stochastic_uniform(2, range=0.5),
    "qsgd-1": fj.channel.qsgd(1),
    "qsgd-3": fj.channel.qsgd(3),
    "rand-1": fj.channel.rand_k(1),
    "rand-3": fj.channel.rand_k(3),
    "natural": fj.channel.natural(),
}


@pytest.fixture(scope="module")
def keys():
    return jax.random.split(jax.random.key(0), M)


@pytest.fixture(scope="module")
def uniforms(keys):
    """The uniforms every quantizer draws from its key (one per coordinate)."""
    return np.asarray(jax.jit(jax.vmap(lambda k: jax.random.uniform(k, (D,), jnp.float64)))(keys))


_draws = {}


def draws(name, keys):
    if name not in _draws:
        _draws[name] = np.asarray(
            jax.jit(jax.vmap(QUANTIZERS[name], in_axes=(0, None)))(keys, jnp.asarray(X))
        )
    return _draws[name]


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantizer_is_its_definition_draw_by_draw(name, keys, uniforms):
    """The same uniforms through the numpy definition give the same message (first 2000 draws),
    and a zero message stays zero (except on the fixed range, which has no zero grid point)."""
    q = QUANTIZERS[name]
    y = draws(name, keys)
    ref = np.stack([quantize(q, uniforms[i], X) for i in range(2000)])
    np.testing.assert_allclose(y[:2000], ref, rtol=1e-12, atol=1e-15)
    if q.range is None:
        zero = np.asarray(q(jax.random.key(1), jnp.zeros(D)))
        np.testing.assert_array_equal(zero, np.zeros(D))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantizer_outputs_lie_on_the_grid_its_bits_describe(name, keys):
    """Each coordinate is one of the symbols the reported bits can name, and one of the two
    grid points around x (stochastic rounding never skips a level)."""
    q = QUANTIZERS[name]
    y = draws(name, keys)
    a = np.abs(X)
    per_coord = (q.bits(D) - (32 if q.kind in ("qsgd", "stochastic_uniform") and q.range is None else 0)) / D
    if q.kind == "stochastic_uniform":
        R = a.max() if q.range is None else q.range
        L = 2**q.bits_per_coordinate - 1
        level = (y + R) / (2 * R / L)  # grid points -R + j 2R/L, j = 0..L
        assert per_coord == q.bits_per_coordinate
        pos = (np.clip(X, -R, R) + R) / (2 * R / L)
    elif q.kind == "qsgd":
        norm = np.linalg.norm(X)
        level = np.abs(y) * q.levels / norm  # |x|_2 l / s, l = 0..s, plus a sign bit
        L = q.levels
        assert per_coord == 1 + math.ceil(math.log2(q.levels + 1))
        assert np.all((np.sign(y) == np.sign(X)) | (y == 0))
        pos = a * q.levels / norm
    elif q.kind == "natural":
        nz = y != 0
        exponent = np.log2(np.abs(y[nz]))
        np.testing.assert_array_equal(exponent, np.round(exponent))  # signed powers of two
        assert per_coord == 9 and np.ptp(exponent) < 2**8  # sign + 8-bit exponent
        lo = np.where(a > 0, 2.0 ** np.floor(np.log2(np.where(a > 0, a, 1.0))), 0.0)
        assert np.all((np.abs(y) == lo) | (np.abs(y) == 2 * lo))
        return
    else:  # rand-k: k (index, value) pairs
        assert np.all((y != 0).sum(1) <= q.k)
        np.testing.assert_allclose(y[y != 0], np.broadcast_to(X * D / q.k, y.shape)[y != 0], rtol=1e-14)
        return
    np.testing.assert_allclose(level, np.round(level), atol=1e-9)
    level = np.round(level)
    assert level.min() >= 0 and level.max() <= L and len(np.unique(level)) <= L + 1
    assert np.all((level == np.floor(pos + 1e-12)) | (level == np.ceil(pos - 1e-12)))


def two_point_law(q):
    """Per coordinate ``(lo, hi, f)``: Q(x)_i is hi with probability f, else lo (exact law)."""
    a, s = np.abs(X), np.sign(X)
    if q.kind == "qsgd":
        norm = np.linalg.norm(X)
        y = a * q.levels / norm
        lo = np.floor(y)
        return s * lo * norm / q.levels, s * (lo + 1) * norm / q.levels, y - lo
    if q.kind == "natural":
        lo = np.where(a > 0, 2.0 ** np.floor(np.log2(np.where(a > 0, a, 1.0))), 0.0)
        return s * lo, s * 2 * lo, np.where(a > 0, (a - lo) / np.where(lo > 0, lo, 1.0), 0.0)
    assert q.kind == "rand_k"
    return np.zeros(D), X * D / q.k, np.full(D, q.k / D)


@pytest.mark.parametrize("name", ["qsgd-1", "qsgd-3", "natural", "rand-1", "rand-3"])
def test_quantizer_exact_variance(name, keys):
    """Sample variance per coordinate within Z_TOL standard errors of ``(hi - lo)^2 f (1 - f)``;
    their sum is the exact ``E|Q(x) - x|^2``, below ``zeta |x|^2`` (equal for rand-k)."""
    q = QUANTIZERS[name]
    y = draws(name, keys)
    lo, hi, f = two_point_law(q)
    exact = (hi - lo) ** 2 * f * (1 - f)
    np.testing.assert_allclose(lo + (hi - lo) * f, X, atol=1e-15)  # unbiased
    mu4 = (hi - lo) ** 4 * f * (1 - f) * ((1 - f) ** 3 + f**3)
    se = np.sqrt(np.maximum(mu4 - exact**2, 0) / M)
    var = y.var(0, ddof=1)
    assert np.all(np.abs(var - exact) <= Z_TOL * se + Z_TOL**2 * exact / M + 1e-14), (var, exact)
    total = exact.sum()
    if q.kind == "rand_k":
        assert total == pytest.approx(q.zeta(D) * X @ X, rel=1e-12)
    else:
        assert total <= q.zeta(D) * X @ X
    if q.kind == "rand_k":
        # off-diagonal: both kept with probability k(k-1)/(d(d-1))
        both = q.k * (q.k - 1) / (D * (D - 1))
        cov_exact = np.outer(X, X) * ((D / q.k) ** 2 * both - 1)
        np.fill_diagonal(cov_exact, exact)
        e = y - X
        prod = e[:, :, None] * e[:, None, :]
        cov = prod.mean(0)
        se = prod.std(0, ddof=1) / np.sqrt(M)
        assert np.all(np.abs(cov - cov_exact) <= Z_TOL * se + 1e-12)


def test_divide_by_received_weights_are_one_over_received():
    ch = fj.channel.channel(fj.channel.rand_k(1), success_prob=0.3, aggregation="divide_by_received")
    N, trials = 7, 4000
    msgs = jnp.arange(1.0, 1.0 + 2 * N).reshape(N, 2)
    out = jax.jit(jax.vmap(lambda k: transmit(k, msgs, ch)))(jax.random.split(jax.random.key(0), trials))
    delivered, w, m = np.asarray(out.delivered), np.asarray(out.weights), np.asarray(out.messages)
    count = delivered.sum(1)
    expected = np.where(delivered, 1.0 / np.maximum(count, 1)[:, None], 0.0)
    np.testing.assert_array_equal(w, expected)
    assert (count == 0).any() and (count >= 4).any()  # the cases that matter occur
    assert np.all(m[~delivered] == 0) and np.all((m[delivered] != 0).sum(-1) == 1)
