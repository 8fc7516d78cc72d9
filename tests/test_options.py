"""The option groups ``fj.Recording`` and ``fj.Execution``: the same run as the flat keywords, bit for bit;
a group together with one of its flat keywords is refused; a sweep records metrics through them."""

import jax
import numpy as np
import pytest

import fedsa_jax as fj


@pytest.fixture(scope="module")
def problem():
    return fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=5, dim=2)


FIELDS = (
    "rounds",
    "mse_mean",
    "mse_sem",
    "theta_mean",
    "num_diverged",
    "mse_quantiles",
    "final_theta",
    "seed_mse",
)


def assert_same(a, b, rtol=0.0):
    """Equal results (bitwise by default; ``rtol``: to float rounding, for runs in batches of other
    shapes, which XLA may vectorise differently)."""
    for f in FIELDS:
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=rtol, atol=0, err_msg=f)
    assert a.metrics.keys() == b.metrics.keys()
    for m in a.metrics:
        np.testing.assert_allclose(a.metrics[m].mean, b.metrics[m].mean, rtol=rtol, atol=0)
    assert a.config["execution"] == b.config["execution"]


def test_grouped_options_run_as_the_flat_keywords(problem, tmp_path):
    alg = fj.fedlsa(0.2, 2)
    seen_flat, seen_grouped = [], []
    flat = fj.simulate(
        3,
        problem,
        alg,
        7,
        5,
        record_every=2,
        metrics=["client_drift"],
        keep_seeds=2,
        quantiles=False,
        on_record=seen_flat.append,
        seed_batch_size=3,
        chunk_rounds=4,
        checkpoint_dir=tmp_path / "a",
        progress=False,
    )
    grouped = fj.simulate(
        3,
        problem,
        alg,
        7,
        5,
        recording=fj.Recording(
            record_every=2,
            metrics=["client_drift"],
            keep_seeds=2,
            quantiles=False,
            on_record=seen_grouped.append,
        ),
        execution=fj.Execution(
            seed_batch_size=3, chunk_rounds=4, checkpoint_dir=tmp_path / "b", progress=False
        ),
    )
    assert_same(flat, grouped)
    assert flat.config["execution"]["seed_batch_size"] == 3 and flat.config["keep_seeds"] == 2
    assert [r.rounds.tolist() for r in seen_grouped] == [r.rounds.tolist() for r in seen_flat]
    assert len(list((tmp_path / "b").glob("checkpoint-*.npz"))) == 1  # the group's checkpoint folder is used


def test_a_group_and_its_own_flat_keyword_are_refused_together(problem):
    alg = fj.fedlsa(0.2, 2)
    with pytest.raises(ValueError, match=r"^record_every=2 is invalid: .*recording= is given"):
        fj.simulate(0, problem, alg, 4, 2, record_every=2, recording=fj.Recording(record_every=2))
    with pytest.raises(ValueError, match=r"^seed_batch_size=1 is invalid: .*execution= is given"):
        fj.simulate(0, problem, alg, 4, 2, seed_batch_size=1, execution=fj.Execution())
    with pytest.raises(ValueError, match=r"^recording=.* is invalid: expected fj.Recording"):
        fj.simulate(0, problem, alg, 4, 2, recording={"record_every": 2})
    with pytest.raises(ValueError, match=r"^memory_budget=0 is invalid"):
        fj.simulate(0, problem, alg, 4, 2, execution=fj.Execution(memory_budget=0))
    # a flat keyword of the other group, or one left at its default, goes with a group
    res = fj.simulate(
        0, problem, alg, 4, 2, record_every=1, seed_batch_size=1, recording=fj.Recording(record_every=2)
    )
    assert res.rounds.tolist() == [0, 2, 4] and res.config["execution"]["num_batches"] == 2


def test_memory_budget_sets_the_default_seed_batch(problem):
    res = fj.simulate(0, problem, fj.fedlsa(0.2, 2), 2, 7, execution=fj.Execution(memory_budget=1))
    assert res.config["execution"]["seed_batch_size"] == 1 and res.config["execution"]["num_batches"] == 7
    whole = fj.simulate(0, problem, fj.fedlsa(0.2, 2), 2, 7)
    assert whole.config["execution"]["num_batches"] == 1
    np.testing.assert_allclose(res.mse_mean, whole.mse_mean, rtol=1e-12)


def test_sweep_records_metrics_through_recording_and_reuses_only_the_same(problem, tmp_path):
    configs = fj.grid(step_size=[0.1, 0.2])

    def build(c):
        return problem, fj.scafflsa(c["step_size"], 2)

    recording = fj.Recording(record_every=2, metrics=["control_variate_error"], keep_seeds=1)
    entries = fj.sweep(1, configs, build, 4, 3, out_dir=tmp_path, recording=recording)
    single = fj.simulate(1, problem, fj.scafflsa(0.2, 2), 4, 3, recording=recording)
    assert_same(entries[1].result, single, rtol=1e-14)  # two step sizes side by side: another batch shape
    again = fj.sweep(1, configs, build, 4, 3, out_dir=tmp_path, recording=recording)
    assert [e.status for e in again] == ["loaded", "loaded"]
    plain = fj.sweep(1, configs, build, 4, 3, out_dir=tmp_path, record_every=2)  # no metrics, no kept seeds
    assert [e.status for e in plain] == ["ran", "ran"] and plain[0].result.metrics == {}
    with pytest.raises(ValueError, match=r"^checkpoint_dir=.* is invalid: expected None in a sweep"):
        fj.sweep(1, configs, build, 4, 3, execution=fj.Execution(checkpoint_dir=tmp_path / "c"))
