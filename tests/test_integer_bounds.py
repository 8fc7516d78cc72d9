"""Every integer argument gets the library's one-line error, naming it, for a value Python holds but
JAX cannot (``2**64``): never an ``OverflowError`` from a conversion."""

import jax
import numpy as np
import pytest

import fedsa_jax as fj

BIG = 2**64


@pytest.fixture(scope="module")
def problem():
    return fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)


ALG = fj.fedlsa(0.1, 2)

CASES = {
    "key": lambda p: fj.simulate(BIG, p, ALG, 4, 3),
    "num_rounds": lambda p: fj.simulate(0, p, ALG, BIG, 3),
    "num_seeds": lambda p: fj.simulate(0, p, ALG, 4, BIG),
    "record_every": lambda p: fj.simulate(0, p, ALG, 4, 3, record_every=BIG),
    "seed_batch_size": lambda p: fj.simulate(0, p, ALG, 4, 3, seed_batch_size=BIG),
    "chunk_rounds": lambda p: fj.simulate(0, p, ALG, 4, 3, chunk_rounds=BIG),
    "keep_seeds": lambda p: fj.simulate(0, p, ALG, 4, 3, keep_seeds=BIG),
    "num_local_steps": lambda p: fj.fedlsa(0.1, BIG),
    "clients_per_round": lambda p: fj.scafflsa(0.1, 2, clients_per_round=BIG),
    "k": lambda p: fj.channel.top_k(BIG),
    "bits": lambda p: fj.channel.stochastic_uniform(BIG),
    "num_agents": lambda p: fj.problems.garnet(0, num_agents=BIG, num_states=4, dim=2),
    "num_rounds ": lambda p: fj.theory.exact_mse(p, ALG, BIG),
    "max_seeds": lambda p: fj.until(max_seeds=BIG),
}


@pytest.mark.parametrize("name", list(CASES))
def test_an_integer_too_large_for_jax_is_a_one_line_error_naming_it(problem, name):
    with pytest.raises(ValueError, match=rf"^{name.strip()}=18446744073709551616 is invalid") as err:
        CASES[name](problem)
    assert "\n" not in str(err.value) and len(str(err.value)) <= 500


def test_the_bounds_are_those_of_the_kernels(problem):
    """Seeds and rounds up to 2**31 - 1 are allowed (int32/uint32 inside the kernels), one more is
    refused; an int seed in [0, 2**32 - 1] (larger ones collide in 32-bit mode: jax.random.key keeps
    the low 32 bits), a negative one refused; a typed key of any seed is used as it is."""
    with pytest.raises(
        ValueError, match=r"num_seeds=2147483648 is invalid: expected an integer in \[1, 2\*\*31 - 1\]"
    ):
        fj.simulate(0, problem, ALG, 4, 2**31)
    with pytest.raises(ValueError, match=r"key=-1 is invalid: expected an int seed in \[0, 4294967295\]"):
        fj.simulate(-1, problem, ALG, 4, 3)
    top = fj.simulate(2**32 - 1, problem, ALG, 2, 3)
    same = fj.simulate(jax.random.key(2**32 - 1), problem, ALG, 2, 3)
    np.testing.assert_array_equal(top.mse_mean, same.mse_mean)
    with pytest.raises(
        ValueError, match=r"memory_budget=.* is invalid: expected an integer in \[1, 9223372036854775807\]"
    ):
        fj.simulate(0, problem, ALG, 4, 3, execution=fj.Execution(memory_budget=2**64))
