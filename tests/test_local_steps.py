"""Local steps that change with the round (``num_local_steps`` a table ``H_t``) and step sizes of the
round (``fj.schedule(..., per_round=True)``), against exact references:

* FedLSA, SCAFFLSA and Scaffnew round by round against numpy loops fed the kernel's random numbers
  (generative and Markov sampling, skip, schedules of the step and of the round), through the driver
  and across chunks;
* ``exact_mean`` against a numpy mean recursion written from the update rule, ``exact_mse`` against
  an enumeration of every Markov chain path, Monte Carlo within Z_TOL standard errors of
  ``exact_mse`` (power: the constant-H curve at the same horizon is far outside);
* the accounting (observations, bits, communications) and the recorded configuration;
* reductions (a constant table is the integer H, a per-round schedule with an integer H is
  ``k // H``) and every refusal, in Python and on the command line.
"""

import json
import math

import jax
import numpy as np
import pytest
from conftest import Z_TOL
from reference import check_against_loop, gaussian_loop, markov_enumerated_moments, td_loop
from test_markov_theory import THETA0, small_garnet

import fedsa_jax as fj
from fedsa_jax.cli import main

TABLE = fj.local_steps([1, 3, 2, 4, 1, 2])
ROUND_STEP = fj.schedule(fj.optim.inverse_power, eta0=0.5, t0=2.0, power=0.6, per_round=True)
STEP_SCHEDULE = fj.schedule(fj.optim.inverse_time, eta0=0.4, k0=5.0)


def td_problem(tiny_td, sampling):
    P, r, Phi = tiny_td
    return fj.problems.federated_td(P, r, Phi, 0.9, sampling=sampling)


@pytest.mark.parametrize("sampling", ["generative", "markov"])
@pytest.mark.parametrize(
    "alg",
    [fj.fedlsa(0.3, TABLE), fj.scafflsa(0.3, TABLE, skip=2), fj.scaffnew(0.3, 0.4, TABLE)],
    ids=["fedlsa", "scafflsa-skip2", "scaffnew"],
)
def test_table_matches_numpy_loop(tiny_td, sampling, alg):
    """Round t runs H_t local steps (Markov: the chain moves only on those), every round of every seed."""
    problem = td_problem(tiny_td, sampling)
    check_against_loop(problem, alg, td_loop, T=6, num_seeds=3, theta0=np.array([0.5, -0.2]), driver=False)


@pytest.mark.parametrize(
    "alg",
    [fj.fedlsa(ROUND_STEP, TABLE), fj.scafflsa(STEP_SCHEDULE, TABLE)],
    ids=["round-step", "step-schedule"],
)
def test_schedules_with_a_table_through_the_driver(tiny_td, alg):
    """Per-round step sizes eta_t, and eta_k at k = K_t + h, under Markov sampling, through the driver."""
    check_against_loop(
        td_problem(tiny_td, "markov"), alg, td_loop, T=6, num_seeds=3, theta0=np.array([0.5, -0.2])
    )


def test_gaussian_table_matches_numpy_loop(het_gaussian):
    check_against_loop(het_gaussian, fj.scafflsa(0.1, TABLE), gaussian_loop, T=6, num_seeds=2, driver=False)


class Interrupted(Exception):
    pass


def test_chunks_resume_and_samples(tiny_td, tmp_path):
    """Chunks (the round count carried across compiled calls) and a run resumed from its checkpoint
    change nothing; the file keeps the table; observations are N sum_t H_t (times skip under Markov
    sampling); Scaffnew sends no message past H_t."""
    problem = td_problem(tiny_td, "markov")
    alg = fj.fedlsa(0.3, TABLE, skip=2)
    whole = fj.simulate(jax.random.key(0), problem, alg, 6, 8)
    chunks = dict(chunk_rounds=2, checkpoint_dir=tmp_path / "ck")

    def stop(record):
        if record.rounds[-1] == 2:  # after the first chunk's checkpoint
            raise Interrupted

    with pytest.raises(Interrupted):
        fj.simulate(jax.random.key(0), problem, alg, 6, 8, execution=fj.Execution(**chunks), on_record=stop)
    resumed = fj.simulate(jax.random.key(0), problem, alg, 6, 8, execution=fj.Execution(**chunks))
    assert resumed.config["execution"]["resumed_from"]["round"] == 2
    np.testing.assert_array_equal(whole.final_theta, resumed.final_theta)
    whole.save(tmp_path / "r.npz")
    assert fj.load(tmp_path / "r.npz").config["algorithm"]["num_local_steps"] == list(TABLE.table)
    np.testing.assert_array_equal(whole.samples, 3 * 2 * np.cumsum([0, *TABLE.table]))
    np.testing.assert_array_equal(whole.communications, 3 * np.arange(7))
    # Scaffnew with p = 1 communicates after every step it runs: N H_t messages in round t
    res = fj.simulate(jax.random.key(0), problem, fj.scaffnew(0.3, 1.0, TABLE), 6, 4)
    np.testing.assert_array_equal(res.communications, 3 * np.cumsum([0, *TABLE.table]))


def fedlsa_mean_recursion(problem, etas, theta0):
    """E[theta_t] of FedLSA from its update rule: each agent's mean is affine,
    ``m^c <- m^c - eta_h (A_bar[c] m^c - b_bar[c])`` over round t's steps; the server averages."""
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    m, out = np.asarray(theta0, float), [np.asarray(theta0, float)]
    for round_etas in etas:
        local = []
        for c in range(A.shape[0]):
            x = m.copy()
            for eta in round_etas:
                x = x - eta * (A[c] @ x - b[c])
            local.append(x)
        m = np.mean(local, axis=0)
        out.append(m)
    return np.array(out)


def test_exact_mean_against_the_update_rule(het_gaussian):
    """Growing H_t with both kinds of schedule: ``exact_mean`` is the mean recursion to rounding."""
    H = fj.growing_local_steps(2, 0.5, 12)
    theta0 = np.array([1.0, -1.0, 0.5])
    starts = np.concatenate([[0], np.cumsum(H.table)])
    cases = [
        (0.1, [[0.1] * h for h in H.table]),
        (ROUND_STEP, [[0.5 * (t + 2.0) ** -0.6] * h for t, h in enumerate(H.table)]),
        (
            STEP_SCHEDULE,
            [[0.4 / (1 + (starts[t] + j) / 5.0) for j in range(h)] for t, h in enumerate(H.table)],
        ),
    ]
    for step, etas in cases:
        got = fj.theory.exact_mean(het_gaussian, fj.fedlsa(step, H), 12, theta0)
        np.testing.assert_allclose(
            got, fedlsa_mean_recursion(het_gaussian, etas, theta0), rtol=1e-12, atol=1e-14
        )


@pytest.mark.parametrize("kind", ["fedlsa", "scafflsa"])
def test_markov_exact_equals_path_enumeration(kind):
    """Under Markov sampling the exact moments follow the chain through H_t steps a round."""
    problem = small_garnet(2, 3)
    table = [1, 2, 1]
    alg = getattr(fj, kind)(0.6, table)
    mean, mse = markov_enumerated_moments(problem, kind, 0.6, table, 3, 1, THETA0)
    np.testing.assert_allclose(fj.theory.exact_mean(problem, alg, 3, THETA0), mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fj.theory.exact_mse(problem, alg, 3, THETA0), mse, rtol=0, atol=1e-12)
    # power: two local steps every round read other transitions
    assert np.max(np.abs(fj.theory.exact_mse(problem, getattr(fj, kind)(0.6, 2), 3, THETA0) - mse)) > 1e-3


@pytest.mark.parametrize(
    "alg",
    [
        fj.fedlsa(0.15, fj.growing_local_steps(1, 0.7, 16)),
        fj.scafflsa(
            fj.schedule(fj.optim.inverse_power, eta0=0.3, t0=1.0, power=0.5, per_round=True),
            fj.growing_local_steps(1, 0.7, 16),
        ),
        fj.scaffnew(0.1, 0.3, fj.growing_local_steps(1, 0.7, 16)),
    ],
    ids=["fedlsa", "scafflsa-round-step", "scaffnew"],
)
def test_monte_carlo_matches_exact_mse(het_gaussian, alg):
    """H_t = ceil((t + 1)^0.7) over 16 rounds: Monte Carlo within Z_TOL s.e. of exact_mse at every round."""
    theta0 = np.array([1.0, -1.0, 0.5])
    T, n = 16, 4000
    res = fj.simulate(jax.random.key(7), het_gaussian, alg, T, n, theta0=theta0)
    exact = fj.theory.exact_mse(het_gaussian, alg, T, theta0=theta0)
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), z
    # power: a constant H = 4 (about the mean H_t) is far outside
    constant = fj.Algorithm(
        type(alg.config)(**{**vars(alg.config), "num_local_steps": 4}),
        alg.name,
        alg.init_fn,
        alg.step_fn,
        alg.theory,
    )
    other = fj.theory.exact_mse(het_gaussian, constant, T, theta0=theta0)
    assert np.max(np.abs(res.mse_mean[1:] - other[1:]) / res.mse_sem[1:]) > 10 * Z_TOL


def test_reductions():
    """A constant table is the integer H (same kernel, no horizon); a per-round schedule with an
    integer H equals ``lambda k: f(k // H)`` bit for bit; the table is recorded as a list."""
    assert fj.local_steps([3, 3, 3]) == 3
    assert fj.growing_local_steps(4, 0.0, 10) == 4
    assert fj.local_steps(lambda t: t % 3 + 1, 5) == fj.optim.LocalSteps((1, 2, 3, 1, 2))
    assert fj.growing_local_steps(5, 0.2, 4).table == tuple(math.ceil(5 * (t + 1) ** 0.2) for t in range(4))
    assert fj.growing_local_steps(2, 1.0, total_local_steps=13).table == (2, 4, 6)  # 12 <= 13 < 20
    problem = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=5, dim=2)
    per_round = fj.schedule(lambda t: 0.5 / (1.0 + t), per_round=True)
    by_step = fj.schedule(lambda k: 0.5 / (1.0 + k // 4))
    a = fj.simulate(jax.random.key(1), problem, fj.fedlsa(per_round, 4), 5, 4)
    b = fj.simulate(jax.random.key(1), problem, fj.fedlsa(by_step, 4), 5, 4)
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    assert a.config["algorithm"]["step_size"]["per_round"] is True
    res = fj.simulate(jax.random.key(1), problem, fj.fedlsa(0.1, TABLE), 6, 4)
    assert res.config["algorithm"]["num_local_steps"] == [1, 3, 2, 4, 1, 2]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: fj.fedlsa(0.1, [2, 0, 1]), r"num_local_steps=.*H_t = 0 at round t=1"),
        (lambda: fj.fedlsa(0.1, [2, 1.5]), r"H_t = 1.5 at round t=1"),
        (lambda: fj.fedlsa(0.1, [True, 2]), r"H_t = True at round t=0"),
        (lambda: fj.fedlsa(0.1, []), r"num_local_steps=.*at least one round"),
        (lambda: fj.fedlsa(0.1, lambda t: t + 1), r"num_local_steps=.*fj.local_steps\(fn, num_rounds\)"),
        (lambda: fj.local_steps(lambda t: 1 / t, 3), r"num_local_steps=.*ZeroDivisionError"),
        (lambda: fj.local_steps([1, 2], num_rounds=2), r"num_rounds=2 is invalid"),
        (lambda: fj.growing_local_steps(5, 4.5, 10), r"power=4.5 is invalid"),
        (lambda: fj.growing_local_steps(5, 0.5), r"exactly one of num_rounds and total_local_steps"),
        (lambda: fj.schedule(lambda t: 0.1, per_round="yes"), r"per_round='yes' is invalid"),
    ],
)
def test_bad_tables_are_one_line_errors(build, match):
    with pytest.raises(ValueError, match=match) as err:
        build()
    assert "\n" not in str(err.value)


def test_runs_longer_than_the_table_are_refused():
    problem = fj.problems.garnet(jax.random.key(0), num_agents=2, num_states=4, dim=2)
    alg = fj.fedlsa(0.1, TABLE)
    for call in (
        lambda: fj.simulate(jax.random.key(0), problem, alg, 7, 2),
        lambda: fj.theory.exact_mse(problem, alg, 7),
    ):
        with pytest.raises(
            ValueError, match=r"num_rounds=7 is invalid: the table of local steps H_t covers 6"
        ):
            call()
    for call in (
        lambda: fj.theory.stationary_mse(problem, alg),
        lambda: fj.theory.max_stable_step_size(problem, alg),
    ):
        with pytest.raises(ValueError, match="local steps that change with the round"):
            call()
    bad = fj.fedlsa(fj.schedule(lambda t: 0.1 - 0.04 * t, per_round=True), 2)
    with pytest.raises(ValueError, match=r"gives -0.0199\d* at round t=3 .* every t < 4"):
        fj.simulate(jax.random.key(0), problem, bad, 4, 2)


def test_command_line(tmp_path, capsys):
    """``--local-steps-growth``: the recorded table, the title, the counts; a sweep axis over it at a
    fixed total of local steps; a bad value exits 2 naming the option."""
    out = tmp_path / "run"
    args = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "8"]
    assert (
        main([*args, "--local-steps", "2", "--local-steps-growth", "0.5", "--rounds", "5", "--out", str(out)])
        == 0
    )
    res = fj.load(out / "result_fedlsa.npz")
    table = [math.ceil(2 * (t + 1) ** 0.5 - 1e-9) for t in range(5)]
    assert res.config["algorithm"]["num_local_steps"] == table
    np.testing.assert_array_equal(res.samples, 3 * np.cumsum([0, *table]))
    assert "ceil" not in capsys.readouterr().err
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        "[run]\ntotal_local_steps = 40\nseeds = 4\n"
        '[grid]\nproblem = "garnet"\nlocal_steps_growth = [0.0, 1.0]\n'
        "local_steps = 4\nstates = 5\ndim = 2\nagents = 3\n"
    )
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "sweep"), "--no-progress"]) == 0
    index = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    rounds = sorted(int(fj.load(tmp_path / "sweep" / e["file"]).rounds[-1]) for e in index)
    assert rounds == [4, 10]  # 4 + 8 + 12 + 16 = 40 (and 4 x 10 = 40) local steps
    capsys.readouterr()
    assert main([*args, "--local-steps-growth", "-1", "--rounds", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--local-steps-growth=-1" in err and len(err.strip().splitlines()) == 1, err
