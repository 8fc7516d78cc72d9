"""Linear features of a continuous observation against numpy written from their definitions: tile
coding's active tiles and values (points inside and outside the box), the Fourier basis, radial basis
functions, state-action blocks; the feature texts of the command line; bad values."""

import itertools

import jax
import numpy as np
import pytest

import fedsa_jax as fj

LOW, HIGH = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 0.5, 5.0])


def _points(n=200, seed=0):
    rng = np.random.default_rng(seed)
    inside = rng.uniform(LOW, HIGH, size=(n, 3))
    outside = rng.uniform(LOW - 1.0, HIGH + 1.0, size=(n, 3))  # clipped to the nearest face
    return np.concatenate([inside, outside, LOW[None], HIGH[None]])


def _unit(x):
    return np.clip((x - LOW) / (HIGH - LOW), 0.0, 1.0)


def _tiles_numpy(x, tiles, n):
    """Sutton & Barto's offsets ((t (2 j + 1)) mod n) / n of a tile, one extra tile per coordinate."""
    tiles = np.asarray(tiles)
    active = []
    for t in range(n):
        cell = [
            min(int(np.floor(_unit(x)[j] * tiles[j] + ((t * (2 * j + 1)) % n) / n)), tiles[j])
            for j in range(3)
        ]
        active.append(t * np.prod(tiles + 1) + np.ravel_multi_index(cell, tuple(tiles + 1)))
    return np.array(active)


@pytest.mark.parametrize("tiles, n", [((3, 4, 2), 5), (4, 1), ((1, 1, 1), 3)])
def test_tile_coding_equals_its_definition(tiles, n):
    phi = fj.problems.tile_coding(LOW, HIGH, tiles, n)
    sizes = np.broadcast_to(tiles, (3,))
    assert phi.dim == n * np.prod(np.asarray(sizes) + 1)
    xs = _points()
    active = np.asarray(jax.vmap(phi.active)(xs))
    dense = np.asarray(jax.vmap(phi)(xs))
    for x, got, row in zip(xs, active, dense):
        want = _tiles_numpy(x, sizes, n)
        np.testing.assert_array_equal(got, want)
        expected = np.zeros(phi.dim)
        expected[want] = 1.0 / np.sqrt(n)
        np.testing.assert_allclose(row, expected, rtol=1e-15)
    assert np.all(np.abs(np.linalg.norm(dense, axis=1) - 1.0) < 1e-12)  # unit norm
    assert len(np.unique(active)) >= min(phi.dim // 2, 50)  # the points fall in many tiles (power)


def test_fourier_and_radial_bases_equal_their_definitions():
    xs = _points(50)
    fourier = fj.problems.fourier_basis(LOW, HIGH, order=2)
    c = np.array(list(itertools.product(range(3), repeat=3)))
    want = np.cos(np.pi * _unit(xs) @ c.T)
    np.testing.assert_allclose(np.asarray(jax.vmap(fourier)(xs)), want, rtol=1e-12, atol=1e-12)
    rbf = fj.problems.radial_basis(LOW, HIGH, centres=4, width=0.3)
    m = np.array(list(itertools.product(np.linspace(0, 1, 4), repeat=3)))
    want = np.exp(-np.sum((_unit(xs)[:, None] - m[None]) ** 2, -1) / (2 * 0.3**2))
    np.testing.assert_allclose(np.asarray(jax.vmap(rbf)(xs)), want, rtol=1e-12)
    for features in (fourier, rbf):  # their sparse form is every entry
        i, v = features.sparse(xs[0])
        np.testing.assert_array_equal(np.asarray(i), np.arange(features.dim))
        np.testing.assert_array_equal(np.asarray(v), np.asarray(features(xs[0])))


def test_state_action_blocks():
    state = fj.problems.tile_coding(LOW, HIGH, 2, 2)
    phi = fj.problems.state_action(state, 3)
    x = _points(1)[0]
    assert phi.dim == 3 * state.dim
    for a in range(3):
        row = np.asarray(phi(x, a)).reshape(3, state.dim)
        np.testing.assert_array_equal(row[a], np.asarray(state(x)))
        assert np.all(np.delete(row, a, axis=0) == 0)


def test_feature_texts():
    assert fj.problems.features.parse("tiles:3x4x2:5", LOW, HIGH).dim == 5 * 4 * 5 * 3
    assert fj.problems.features.parse("tiles:4", LOW, HIGH).dim == 125
    assert fj.problems.features.parse("fourier:2", LOW, HIGH).dim == 27
    assert fj.problems.features.parse("rbf:3", LOW, HIGH).dim == 27
    for bad in ("tiles", "tiles:3x4:2", "fourier:x", "hash:3", "rbf:1", "tiles:0:2"):
        with pytest.raises(ValueError, match=r"^features=.* is invalid: .*tiles:T:N") as info:
            fj.problems.features.parse(bad, LOW, HIGH)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fj.problems.tile_coding([0.0], [0.0], 2), r"^high=.* is invalid: expected finite bounds"),
        (lambda: fj.problems.tile_coding([0.0, 0.0], [1.0], 2), r"^high=.* is invalid: expected as many"),
        (lambda: fj.problems.tile_coding([0.0], [1.0], 0), r"^tiles=0 is invalid"),
        (lambda: fj.problems.tile_coding([0.0], [1.0], 2, tilings=True), r"^tilings=True is invalid"),
        (lambda: fj.problems.fourier_basis([0.0], [1.0], order=-1), r"^order=-1 is invalid"),
        (lambda: fj.problems.radial_basis([0.0], [1.0], centres=3, width=0.0), r"^width=0\.0 is invalid"),
    ],
)
def test_bad_values_are_one_line_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
