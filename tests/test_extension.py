"""The public extension API: your own algorithm, metrics, recording hooks, per-seed curves.

References are independent of the driver: each seed is stepped by hand with the
documented randomness (seed i: ``k_i = fold_in(key, i)``, ``(k_init, k_rounds) =
split(k_i)``, round t from ``fold_in(k_rounds, t)``) through ``alg.init``/``alg.step``.
"""

import dataclasses
import types
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax.algorithms import (
    RoundInfo,
    init_samplers,
    initial_theta,
    round_info,
    run_agents,
    server_update,
)

# --- a custom FedLSA written with the public blocks only (config without a channel field) ---


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MyConfig:
    step_size: float
    momentum: float
    num_local_steps: int = dataclasses.field(metadata=dict(static=True))
    label: str = dataclasses.field(default="mine", metadata=dict(static=True))


class MyState(NamedTuple):
    theta: jax.Array
    velocity: jax.Array
    sampler: jax.Array


def my_init(key, problem, theta0, config):
    theta = initial_theta(problem, theta0)
    return MyState(theta, jnp.zeros_like(theta), init_samplers(key, problem))


def my_step(rand, state, problem, config):
    eta = jnp.asarray(config.step_size, problem.dtype)
    local, sampler = run_agents(rand.obs, problem, state.sampler, state.theta, eta)
    aggregate, delivery = server_update(rand.channel, state.theta, local, fj.channel.channel())
    velocity = config.momentum * state.velocity + (aggregate - state.theta)  # FedAvgM; momentum 0 is FedLSA
    theta = state.theta + velocity
    return MyState(theta, velocity, sampler), round_info(local, theta, delivery, config, problem)


def my_alg(step_size, num_local_steps, momentum=0.0):
    return fj.Algorithm(MyConfig(step_size, momentum, num_local_steps), "mine", my_init, my_step)


def by_hand(key, problem, alg, seed, T, theta0=None):
    """States and infos of one seed, stepped outside the driver."""
    k_init, k_rounds = jax.random.split(jax.random.fold_in(key, seed))
    theta0 = jnp.zeros(problem.dim) if theta0 is None else jnp.asarray(theta0)
    state = alg.init(k_init, problem, theta0)
    step = jax.jit(lambda k, s: alg.step(k, s, problem))
    states, infos = [state], []
    for t in range(T):
        state, info = step(jax.random.fold_in(k_rounds, t), state)
        states.append(state)
        infos.append(info)
    return states, infos


@pytest.fixture(scope="module")
def garnet():
    return fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=3)


def test_custom_algorithm_equals_fedlsa_seed_by_seed(garnet):
    key = jax.random.key(5)
    ref = fj.simulate(key, garnet, fj.fedlsa(0.2, 4), 8, 16)
    mine = fj.simulate(key, garnet, my_alg(0.2, 4), 8, 16)
    fields = (
        "final_theta",
        "mse_mean",
        "mse_sem",
        "theta_mean",
        "communications",
        "messages_delivered",
        "bits_sent",
        "bits_delivered",
        "samples",
    )
    chex.assert_trees_all_close(
        {f: getattr(mine, f) for f in fields}, {f: getattr(ref, f) for f in fields}, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_array_equal(ref.communications, ref.rounds * 3)
    np.testing.assert_array_equal(ref.samples, ref.rounds * 3 * 4)
    # momentum changes the trajectory (the test above is not vacuous)
    other = fj.simulate(key, garnet, my_alg(0.2, 4, momentum=0.5), 8, 16)
    assert np.abs(other.final_theta - ref.final_theta).max() > 1e-3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """Every field static: the config has no array leaf for the driver to map over."""

    num_local_steps: int = dataclasses.field(default=4, metadata=dict(static=True))


def static_step(rand, state, problem, config):
    return my_step(rand, state, problem, MyConfig(0.2, 0.0, config.num_local_steps))


def test_a_config_without_array_leaves_runs(garnet):
    """A config whose fields are all static (step size written into the step function) runs, and
    equals the same algorithm with the step size as a leaf seed by seed."""
    key = jax.random.key(5)
    leafless = fj.Algorithm(StaticConfig(), "static", my_init, static_step)
    assert jax.tree.leaves(leafless.config) == []
    np.testing.assert_array_equal(
        fj.simulate(key, garnet, leafless, 8, 16).final_theta,
        fj.simulate(key, garnet, my_alg(0.2, 4), 8, 16).final_theta,
    )


def test_config_fields_are_recorded(garnet):
    res = fj.simulate(0, garnet, my_alg(0.2, 4, momentum=0.9), 2, 2)
    alg = res.config["algorithm"]
    assert alg["algorithm"] == "mine"
    assert alg["momentum"] == pytest.approx(0.9) and alg["step_size"] == pytest.approx(0.2)
    assert alg["num_local_steps"] == 4 and alg["label"] == "mine"
    assert alg["channel"]["quantizer"] == {"kind": "identity"}  # the default channel, described
    assert fj.scafflsa(0.1, 3, quantizer=fj.channel.qsgd(2)).describe()["channel"]["quantizer"]["levels"] == 2


# --- accounting reported by the algorithm ---


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CoinConfig:
    step_size: float
    participation: float


def coin_step(rand, state, problem, config):
    """FedLSA with H=1 where each agent takes part with probability q (partial participation)."""
    eta = jnp.asarray(config.step_size, problem.dtype)
    local, sampler = run_agents(rand.obs, problem, state.sampler, state.theta, eta)
    part = jax.random.uniform(rand.channel, (problem.num_agents,)) < config.participation
    count = jnp.sum(part)
    mean = jnp.sum(jnp.where(part[:, None], local, 0.0), 0) / jnp.maximum(count, 1)
    theta = jnp.where(count > 0, mean, state.theta)
    bits = 32 * problem.dim
    n = count.astype(jnp.int32)
    info = RoundInfo(jnp.zeros((), problem.dtype), n, n, n * bits, n * bits, jnp.int32(problem.num_agents))
    return state._replace(theta=theta, sampler=sampler), info


def test_random_communication_is_counted_as_reported(garnet):
    alg = fj.Algorithm(CoinConfig(0.2, 0.3), "coin", lambda k, p, t, c: my_init(k, p, t, c), coin_step)
    key, T, n = jax.random.key(2), 12, 400
    res = fj.simulate(key, garnet, alg, T, n, record_every=4)
    sent = np.zeros((n, T + 1))
    for seed in range(6):  # exact, seed by seed, against hand stepping (counts summed per seed)
        _, infos = by_hand(key, garnet, alg, seed, T)
        sent[seed, 1:] = np.cumsum([int(i.messages_sent) for i in infos])
    one = fj.simulate(key, garnet, alg, T, 6, record_every=4)
    np.testing.assert_allclose(one.communications, sent[:6, one.rounds].mean(0), rtol=1e-15)
    np.testing.assert_allclose(one.bits_sent, one.communications * 32 * 3, rtol=1e-15)
    np.testing.assert_array_equal(one.samples, one.rounds * 3)
    # and in distribution: Binomial(T N, q) per seed
    mean, sd = T * 3 * 0.3, np.sqrt(T * 3 * 0.3 * 0.7)
    assert abs(res.communications[-1] - mean) < Z_TOL * sd / np.sqrt(n)
    assert abs(res.communications[-1] - T * 3) > 20 * sd / np.sqrt(n)  # not the rounds x N formula


def test_counters_do_not_overflow():
    from fedsa_jax.stats import _counter_digits, add_counts, counter_totals

    c = jnp.zeros((3, 2, 2), jnp.uint32)
    inc = jnp.array([[2**31 - 1, 7]] * 3, jnp.int32)
    for _ in range(5):
        c = add_counts(c, inc)
    total = counter_totals(np.asarray(_counter_digits(c, jnp.array([True, True, False]))))
    np.testing.assert_array_equal(total, [2 * 5 * (2**31 - 1), 2 * 5 * 7])


# --- up-front checks ---


def _state_without_theta(key, problem, theta0, config):
    return types.SimpleNamespace(th=theta0)


BAD_ALGS = {
    "no theta": fj.Algorithm(MyConfig(0.1, 0.0, 1), "nothing", lambda k, p, t, c: (t,), my_step),
    "theta shape": fj.Algorithm(
        MyConfig(0.1, 0.0, 1),
        "shape",
        lambda k, p, t, c: my_init(k, p, t, c)._replace(theta=jnp.zeros(2)),
        my_step,
    ),
    "no info": fj.Algorithm(
        MyConfig(0.1, 0.0, 1), "noinfo", my_init, lambda r, s, p, c: my_step(r, s, p, c)[0]
    ),
    "structure": fj.Algorithm(
        MyConfig(0.1, 0.0, 1),
        "struct",
        my_init,
        lambda r, s, p, c: (my_step(r, s, p, c)[0]._replace(velocity=jnp.zeros(5)), my_step(r, s, p, c)[1]),
    ),
}


@pytest.mark.parametrize("case", list(BAD_ALGS))
def test_contract_checked_before_compiling(garnet, case):
    alg = BAD_ALGS[case]
    with pytest.raises(ValueError, match=f"algorithm={alg.name!r}.*'federated_td'"):
        fj.simulate(0, garnet, alg, 3, 2)


def test_problem_and_metric_checks(garnet):
    @dataclasses.dataclass(frozen=True)
    class Half:
        num_agents: int = 2
        dim: int = 1

    with pytest.raises(ValueError, match="problem=.*lacks.*agent_params"):
        fj.simulate(0, Half(), fj.fedlsa(0.1, 1), 3, 2)
    alg = fj.fedlsa(0.1, 2)
    for metrics, match in [
        ({"v": lambda s, p: s.theta}, r"metrics\['v'\].*real scalar"),
        ({"bad name": lambda s, p: 0.0}, "metric names"),
        ({"mse": lambda s, p: 0.0}, "metric names"),
        ({"x": "no_such_metric"}, r"metrics\['x'\].*built-in"),
        ({"x": 3}, r"metrics\['x'\]"),
        ({"x": "control_variate_error"}, r"metrics\['x'\].*cannot be evaluated"),  # FedLSA has no xi
        ("client_drift", "metrics="),
    ]:
        with pytest.raises(ValueError, match=match):
            fj.simulate(0, garnet, alg, 3, 2, metrics=metrics)


# --- metrics, keep_seeds, on_record ---


def test_metrics_and_kept_seeds_against_hand_stepping(garnet):
    key, T, n, K = jax.random.key(4), 6, 5, 3
    theta0 = np.array([0.3, -0.2, 0.1])
    alg = fj.scafflsa(0.3, 3)
    res = fj.simulate(
        key,
        garnet,
        alg,
        T,
        n,
        theta0,
        record_every=2,
        keep_seeds=K,
        metrics={
            "norm": lambda s, p: jnp.sum(s.theta**2),
            "drift": "client_drift",
            "cv": "control_variate_error",
        },
    )
    A, b, ts = (np.asarray(x) for x in (garnet.A_bar, garnet.b_bar, garnet.theta_star))
    xi_star = np.einsum("cij,j->ci", A, ts) - b
    norms = np.zeros((n, T + 1))
    for seed in range(n):
        states, infos = by_hand(key, garnet, alg, seed, T, theta0)
        norms[seed] = [np.sum(np.asarray(s.theta) ** 2) for s in states]
        drift = [0.0] + [float(i.client_drift) for i in infos]
        cv = [np.mean(np.sum((np.asarray(s.xi) - xi_star) ** 2, -1)) for s in states]
        err = [np.sum((np.asarray(s.theta) - ts) ** 2) for s in states]
        if seed < K:
            chex.assert_shape([res.seed_mse, res.metrics["cv"].seeds], (len(res.rounds), K))
            np.testing.assert_allclose(res.seed_mse[:, seed], np.take(err, res.rounds), rtol=1e-12)
            np.testing.assert_allclose(
                res.metrics["drift"].seeds[:, seed], np.take(drift, res.rounds), rtol=1e-12
            )
            np.testing.assert_allclose(res.metrics["cv"].seeds[:, seed], np.take(cv, res.rounds), rtol=1e-12)
    m = res.metrics["norm"]
    np.testing.assert_allclose(m.mean, norms[:, res.rounds].mean(0), rtol=1e-12)
    np.testing.assert_allclose(m.sem[1:], norms[:, res.rounds[1:]].std(0, ddof=1) / np.sqrt(n), rtol=1e-9)
    np.testing.assert_allclose(m.mean[-1], np.mean(np.sum(res.final_theta**2, -1)), rtol=1e-12)
    assert res.metrics["drift"].mean[0] == 0.0 and np.all(res.metrics["drift"].mean[1:] > 0)


def test_results_files_tables_and_plots_carry_metrics(garnet, tmp_path):
    res = fj.simulate(
        1, garnet, fj.scafflsa(0.3, 3), 10, 40, keep_seeds=4, metrics={"cv": "control_variate_error"}
    )
    q = res.metrics["cv"].quantiles
    assert np.all(np.isfinite(q)) and np.all(np.diff(q, axis=1) >= 0)
    res.save(tmp_path / "r.npz")
    back = fj.load(tmp_path / "r.npz")
    for f in ("mean", "sem", "quantiles", "seeds"):
        np.testing.assert_array_equal(getattr(back.metrics["cv"], f), getattr(res.metrics["cv"], f))
    np.testing.assert_array_equal(back.seed_mse, res.seed_mse)
    np.testing.assert_array_equal(back.communications, res.communications)
    table = res.table()
    np.testing.assert_array_equal(table["cv_mean"], res.metrics["cv"].mean)
    assert "cv_q50" in table
    fig = fj.plotting.plot_mse({"S": res}, metric="cv")
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), res.metrics["cv"].mean)
    fig = fj.plotting.plot_mse({"S": res})
    faint = [ln for ln in fig.axes[0].lines if ln.get_alpha() is not None and ln.get_alpha() < 0.5]
    assert len(faint) == 4  # one per kept seed, under the mean
    np.testing.assert_allclose(faint[0].get_ydata(), res.seed_mse[:, 0])


def test_on_record_streams_what_the_result_holds(garnet):
    seen = []
    res = fj.simulate(
        3,
        garnet,
        fj.fedlsa(0.2, 2),
        30,
        12,
        record_every=3,
        chunk_rounds=6,
        metrics=["client_drift"],
        on_record=seen.append,
    )
    assert len(seen) == 1 + 5  # round 0, then one call per chunk of 6 rounds
    rounds = np.concatenate([r.rounds for r in seen])
    np.testing.assert_array_equal(rounds, res.rounds)
    np.testing.assert_allclose(np.concatenate([r.mse_mean for r in seen]), res.mse_mean, rtol=1e-15)
    np.testing.assert_allclose(
        np.concatenate([r.metrics["client_drift"][0] for r in seen]),
        res.metrics["client_drift"].mean,
        rtol=1e-15,
    )
    np.testing.assert_allclose(np.concatenate([r.counts["communications"] for r in seen]), res.communications)
    # several seed batches: the last batch's records hold the statistics of every seed
    seen.clear()
    res = fj.simulate(
        3,
        garnet,
        fj.fedlsa(0.2, 2),
        30,
        12,
        record_every=3,
        chunk_rounds=6,
        seed_batch_size=5,
        on_record=seen.append,
    )
    last = [r for r in seen if r.batch == 2]
    assert {r.num_seeds for r in last} == {12} and {r.num_batches for r in seen} == {3}
    np.testing.assert_allclose(np.concatenate([r.mse_mean for r in last]), res.mse_mean, rtol=1e-12)
    np.testing.assert_allclose(np.concatenate([r.mse_sem for r in last]), res.mse_sem, rtol=1e-9)


def test_keep_seeds_bounds(garnet):
    with pytest.raises(ValueError, match="keep_seeds"):
        fj.simulate(0, garnet, fj.fedlsa(0.1, 1), 3, 2, keep_seeds=3)
    with pytest.raises(ValueError, match="keep_seeds.*<= 16777216"):
        fj.simulate(0, garnet, fj.fedlsa(0.1, 1), 100_000, 2000, keep_seeds=2000)


def test_simulate_and_sweep_are_plain_functions():
    import fedsa_jax._runtime.driver as driver
    import fedsa_jax._runtime.sweep as sweep_mod

    assert isinstance(fj.simulate, types.FunctionType) and isinstance(fj.sweep, types.FunctionType)
    assert fj.simulate is driver.simulate and fj.sweep is sweep_mod.sweep
    assert fj.Record is driver.Record and fj.sweep.MAX_GRID == sweep_mod.MAX_GRID
