"""A round's seeds in slices (``fj.Execution(cache_bytes=...)``) and nested vmaps merged into one
(:func:`fedsa_jax.problems.protocol.merged_vmaps`): speed settings that change no value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax._runtime import plan
from fedsa_jax._runtime.kernel import by_slices
from fedsa_jax.problems.protocol import merged_vmaps


def test_by_slices_gives_each_seed_the_values_of_one_call():
    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.normal(size=(12, 5)), jnp.float32)
    index = jnp.asarray(rng.integers(0, 5, size=12), jnp.int32)
    table = jnp.asarray(rng.normal(size=7), jnp.float32)

    def one(row, i):  # a gather from the seed's own row and from a shared table, a pytree out
        return {"picked": row[i] * table[i], "sum": jnp.cumsum(row)}, i + 1

    fn = jax.vmap(one)
    whole = fn(rows, index)
    for k in (1, 2, 3, 6):
        sliced = jax.jit(lambda r, i, k=k: by_slices(fn, k, r, i))(rows, index)
        for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(sliced)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_seed_slices_are_divisors_with_enough_agents(monkeypatch):
    monkeypatch.setattr(plan, "MIN_SLICE_AGENTS", 100)
    assert plan._seed_slices(1000, 10_000, 10, 0) == 1  # cache_bytes = 0: one pass
    assert plan._seed_slices(1000, 10_000, 10, 2**19) == 20  # 19.1 wanted: the nearest divisor
    assert plan._seed_slices(1000, 100, 10, 2**19) == 1  # everything fits
    assert plan._seed_slices(997, 10_000, 10, 2**19) == 1  # a prime: no divisor but 1 and itself
    assert plan._seed_slices(1000, 10_000, 1, 2**19) == 10  # slices of at least 100 agents


PROBLEMS = {
    "gaussian": lambda: fj.problems.random_gaussian_lsa(jax.random.key(1), num_agents=4, dim=5),
    "td_markov": lambda: fj.problems.garnet(
        jax.random.key(1), num_agents=4, num_states=8, dim=4, sampling="markov"
    ),
    "sarsa": lambda: fj.problems.garnet_control(num_agents=4),
}
ALGORITHMS = {
    "fedlsa": lambda: fj.fedlsa(0.05, 5),
    "scafflsa": lambda: fj.scafflsa(0.05, 5),
    "qfedtd": lambda: fj.qfedtd(0.05),
    "cohort_qsgd": lambda: fj.fedlsa(0.05, 5, clients_per_round=2, quantizer=fj.channel.qsgd(4)),
}


@pytest.mark.parametrize("family", PROBLEMS)
def test_seed_slices_change_no_value(monkeypatch, family):
    """60 seeds in 1 slice and in 5 or more (every agent count allowed), every algorithm of
    ALGORITHMS in one program (``fj.compare``): every seed's squared error and final iterate, and
    the statistics over seeds, are those of one pass to float rounding (XLA may vectorise a slice's
    arithmetic differently: a few units in the last place, a few dozen where SARSA's softmax carries
    them across rounds)."""
    monkeypatch.setattr(plan, "MIN_SLICE_AGENTS", 1)
    problem = PROBLEMS[family]()

    def run(cache_bytes):
        ex = fj.Execution(cache_bytes=cache_bytes, progress=False)
        algorithms = {name: make() for name, make in ALGORITHMS.items()}
        return fj.compare(
            jax.random.key(0), problem, algorithms, 12, 60, record_every=3, keep_seeds=60, execution=ex
        ).results

    whole, sliced = run(0), run(256)
    rtol = 64 * np.finfo(problem.dtype).eps
    for algorithm in ALGORITHMS:
        assert whole[algorithm].config["execution"]["seed_slices"] == 1
        assert sliced[algorithm].config["execution"]["seed_slices"] >= 5
        assert (
            sliced[algorithm].config["execution"]["padded_batch"]
            == whole[algorithm].config["execution"]["padded_batch"]
        )
        for name in ("seed_mse", "final_theta", "mse_mean", "mse_sem", "mse_quantiles"):
            want = np.asarray(getattr(whole[algorithm], name))
            got = getattr(sliced[algorithm], name)
            np.testing.assert_allclose(
                got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=f"{algorithm} {name}"
            )


def test_cache_bytes_is_checked():
    problem = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=2, dim=2)
    with pytest.raises(ValueError, match=r"^cache_bytes=-1 is invalid: expected an integer in \[0, "):
        fj.simulate(0, problem, fj.fedlsa(0.1, 2), 2, 2, execution=fj.Execution(cache_bytes=-1))


def test_merged_vmaps_equal_nested_vmaps():
    """Arguments batched over both axes, only the outer (seeds), only the inner (agents), or
    neither; a pytree argument and a pytree result: the values of ``vmap(vmap(fn))``."""
    rng = np.random.default_rng(1)
    S, N, d = 3, 4, 6
    state = jnp.asarray(rng.normal(size=(S, N, d)), jnp.float32)  # both
    index = jnp.asarray(rng.integers(0, d, size=(S, N)), jnp.int32)  # both
    scale = jnp.asarray(rng.normal(size=(S,)), jnp.float32)  # seeds only
    agent = jnp.arange(N, dtype=jnp.int32)  # agents only
    tables = {"w": jnp.asarray(rng.normal(size=(N * d,)), jnp.float32)}  # neither

    def fn(tables, x, i, s, c):
        row = jax.lax.dynamic_slice(x, (jnp.minimum(i, d - 2),), (2,))
        return {"out": x.at[i].add(s * tables["w"][c * d + i]), "row": row}, i * c

    nested = jax.vmap(jax.vmap(fn, in_axes=(None, 0, 0, None, 0)), in_axes=(None, 0, 0, 0, None))
    merged = jax.vmap(
        jax.vmap(merged_vmaps(fn), in_axes=(None, 0, 0, None, 0)), in_axes=(None, 0, 0, 0, None)
    )
    want = nested(tables, state, index, scale, agent)
    got = jax.jit(merged)(tables, state, index, scale, agent)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # unbatched, it is the function itself
    single = merged_vmaps(fn)(tables, state[0, 0], index[0, 0], scale[0], agent[0])
    for a, b in zip(
        jax.tree.leaves(fn(tables, state[0, 0], index[0, 0], scale[0], agent[0])), jax.tree.leaves(single)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
