"""The fused threefry uniforms are jax.random.uniform bit for bit (else seeds would change)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsa_jax import _prng


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 2, 5), (10, 2, 10)])
def test_uniform_matches_jax_bit_for_bit(shape):
    for seed in range(3):
        key = jax.random.key(seed)
        a = jax.random.uniform(key, shape, jnp.float32)
        b = jax.jit(lambda k: _prng.uniform(k, shape, jnp.float32))(key)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        keys = jax.random.split(key, 4)  # and under vmap
        a = jax.vmap(lambda k: jax.random.uniform(k, shape, jnp.float32))(keys)
        b = jax.jit(jax.vmap(lambda k: _prng.uniform(k, shape, jnp.float32)))(keys)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_uniform_matches_jax_float64():
    key = jax.random.key(5)  # x64 is on in conftest
    a = jax.random.uniform(key, (4, 9), jnp.float64)
    b = _prng.uniform(key, (4, 9), jnp.float64)
    assert b.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_normal_matches_jax_bit_for_bit(dtype):
    for seed in range(3):
        key = jax.random.key(seed)
        a = jax.random.normal(key, (3, 40), dtype)
        b = jax.jit(lambda k: _prng.normal(k, (3, 40), dtype))(key)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        keys = jax.random.split(key, 4)  # and under vmap
        a = jax.vmap(lambda k: jax.random.normal(k, (5, 20), dtype))(keys)
        b = jax.jit(jax.vmap(lambda k: _prng.normal(k, (5, 20), dtype)))(keys)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_split_matches_jax_bit_for_bit():
    keys = jax.random.split(jax.random.key(3), 5)
    for num in (1, 2, 40):
        a = jax.vmap(lambda k: jax.random.split(k, num))(keys)  # noqa: B023 (called at once)
        b = jax.jit(jax.vmap(lambda k: _prng.split(k, num)))(keys)  # noqa: B023 (called at once)
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(a)), np.asarray(jax.random.key_data(b)))


def test_bits_match_jax_bit_for_bit():
    keys = jax.random.split(jax.random.key(4), 3)
    a = jax.vmap(lambda k: jax.random.bits(k, (10, 7), jnp.uint32))(keys)
    b = jax.jit(jax.vmap(lambda k: _prng.bits(k, (10, 7))))(keys)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
