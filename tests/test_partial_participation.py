"""Partial participation (``clients_per_round``): numpy loops on the noise-free problem, idle agents'
samplers, accounting, Monte Carlo against the exact recursions, bad values, and the full cohort being
today's code bit for bit."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Z_TOL
from hypothesis import given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax import cli

COHORT_STREAM = 0x636F68  # the cohort's documented key stream: fold_in(round_key, 0x636F68)

ALGORITHMS = {
    "fedlsa": lambda **kw: fj.fedlsa(0.2, 2, **kw),
    "scafflsa": lambda **kw: fj.scafflsa(0.2, 2, **kw),
    "qfedtd": lambda **kw: fj.qfedtd(0.2, **kw),
    "scaffnew": lambda **kw: fj.scaffnew(0.2, 0.5, 2, **kw),
}


def cohort_of(round_key, N, m):
    """The documented draw: the first m of a permutation from the round key's cohort stream."""
    chosen = np.asarray(jax.random.permutation(jax.random.fold_in(round_key, COHORT_STREAM), N))[:m]
    mask = np.zeros(N, bool)
    mask[chosen] = True
    return mask


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_noise_free_rounds_equal_a_numpy_loop(name):
    """theta_{t+1} = theta_t + (1/m) sum_{c in S} (theta^c_H - theta_t); SCAFFLSA's control variates
    move for the cohort only, against the cohort's mean message, and keep summing to zero."""
    N, m, H, eta, T = 5, 2, 3, 0.15, 12
    base = fj.problems.random_gaussian_lsa(jax.random.key(4), num_agents=N, dim=3, heterogeneity=1.0)
    problem = fj.problems.expected(base)
    alg = getattr(fj, name)(eta, H, clients_per_round=m)
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    theta, xi = np.zeros(3), np.zeros((N, 3))
    state = alg.init(jax.random.key(0), problem, jnp.zeros(3))
    step = jax.jit(lambda k, s: alg.step(k, s, problem))
    cohorts = []
    for t in range(T):
        key = jax.random.fold_in(jax.random.key(9), t)
        S = cohort_of(key, N, m)
        cohorts.append(tuple(np.flatnonzero(S)))
        old_xi = np.asarray(state.xi) if name == "scafflsa" else None
        state, info = step(key, state)
        local = np.empty((N, 3))
        for c in range(N):
            x = theta.copy()
            for _ in range(H):
                x = x - eta * (A[c] @ x - b[c] - (xi[c] if name == "scafflsa" else 0.0))
            local[c] = x
        msg = local - theta
        mean_msg = msg[S].mean(axis=0)
        theta = theta + mean_msg
        if name == "scafflsa":
            xi = xi + np.where(S[:, None], (mean_msg - msg) / (eta * H), 0.0)
            np.testing.assert_allclose(np.asarray(state.xi), xi, rtol=1e-11, atol=1e-13)
            np.testing.assert_array_equal(np.asarray(state.xi)[~S], old_xi[~S])  # idle: unchanged
            assert np.max(np.abs(np.asarray(state.xi).sum(axis=0))) < 1e-13
        np.testing.assert_allclose(np.asarray(state.theta), theta, rtol=1e-12, atol=1e-14)
        assert int(info.messages_sent) == m and int(info.observations) == m * H
    assert len(set(cohorts)) > 3  # the cohort changes from round to round


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_idle_agents_samplers_do_not_move_and_accounting(name, tiny_td):
    """Markov sampling: an agent outside the round's cohort keeps its chain state; the counts are the
    cohort's (Scaffnew: m messages per communication, with H = 1 the period's cohort is the round's)."""
    P, r, Phi = tiny_td
    problem = fj.problems.federated_td(P, r, Phi, 0.9, sampling="markov")
    N, m, skip = 3, 1, 2
    if name == "scaffnew":
        alg = fj.scaffnew(0.2, 0.5, 1, skip=skip, clients_per_round=m)
        H = 1
    elif name == "qfedtd":
        alg, H, skip = fj.qfedtd(0.2, clients_per_round=m), 1, 1
    else:
        alg, H = getattr(fj, name)(0.2, 2, skip=skip, clients_per_round=m), 2
    state = alg.init(jax.random.key(1), problem, jnp.zeros(2))
    step = jax.jit(lambda k, s: alg.step(k, s, problem))
    moved = np.zeros(N, int)
    for t in range(30):
        key = jax.random.fold_in(jax.random.key(2), t)
        S = np.asarray(state.cohort) if name == "scaffnew" else cohort_of(key, N, m)
        before = np.asarray(state.sampler)
        state, info = step(key, state)
        after = np.asarray(state.sampler)
        np.testing.assert_array_equal(after[~S], before[~S])
        moved += after != before
        sends = int(info.messages_sent)
        assert sends in ((0, m) if name == "scaffnew" else (m,)) and int(info.messages_delivered) == sends
        assert int(info.bits_sent) == sends * 32 * 2
        assert int(info.observations) == m * H * skip
        if hasattr(state, "xi"):
            assert np.max(np.abs(np.asarray(state.xi).sum(axis=0))) < 1e-12
    assert np.all(moved > 0)  # every agent's chain moved when it was in the cohort


CASES = [  # (name, m of N = 3, channel): m = 2 for the control variates (with m = 1 they cannot move)
    ("fedlsa", 1, dict(quantizer=fj.channel.rand_k(2), success_prob=0.7, aggregation="divide_by_received")),
    ("scafflsa", 2, {}),
    ("qfedtd", 1, dict(success_prob=0.6)),
    ("scaffnew", 2, {}),
]


@pytest.fixture(scope="module")
def cohort_runs(het_gaussian, tiny_td):
    """``(case name, family) -> (problem, result)``: every case of CASES on Gaussian LSA and generative
    TD, 6 rounds, 6000 seeds started at theta_star, the cases of one problem side by side in one
    compiled program (each result the case's lone ``fj.simulate`` with key 1, to float rounding)."""
    from reference import run_jointly

    P, r, Phi = tiny_td
    td = fj.problems.federated_td(P, r, Phi, 0.9)
    runs = {}
    for problem in (het_gaussian, td):
        algs = [ALGORITHMS[name](clients_per_round=m, **channel) for name, m, channel in CASES]
        star = np.asarray(problem.theta_star)
        results = run_jointly(jax.random.key(1), problem, algs, 6, 6000, theta0=star)
        family = problem.describe()["family"]
        runs.update({(name, family): (problem, res) for (name, _, _), res in zip(CASES, results)})
    return runs


@pytest.mark.parametrize("name,m,channel", CASES, ids=[c[0] for c in CASES])
def test_monte_carlo_matches_exact_mse_with_cohorts(name, m, channel, cohort_runs):
    """MC within Z_TOL s.e. of exact_mse at every recorded round, on Gaussian LSA and generative TD;
    the full-participation curve is far outside (the test has power). Started at theta_star, the MSE
    is all noise, which a cohort of one or two agents in three multiplies."""
    T = 6
    mine = [(family, run) for (case, family), run in cohort_runs.items() if case == name]
    assert len(mine) == 2  # both problems
    for family, (problem, res) in mine:
        alg = ALGORITHMS[name](clients_per_round=m, **channel)
        star = np.asarray(problem.theta_star)
        exact = fj.theory.exact_mse(problem, alg, T, theta0=star)[res.rounds]
        z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
        assert np.max(np.abs(z)) < Z_TOL, (family, z)
        full = fj.theory.exact_mse(problem, ALGORITHMS[name](**channel), T, theta0=star)[res.rounds]
        assert np.max(np.abs(res.mse_mean[1:] - full[1:]) / res.mse_sem[1:]) > 3 * Z_TOL


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_full_cohort_is_todays_code_bitwise(name, het_gaussian):
    """clients_per_round = N runs the full round: results, counts and exact curves identical."""
    a = fj.simulate(jax.random.key(5), het_gaussian, ALGORITHMS[name](), 4, 16)
    b = fj.simulate(jax.random.key(5), het_gaussian, ALGORITHMS[name](clients_per_round=3), 4, 16)
    for field in ("mse_mean", "theta_mean", "final_theta", "communications", "samples", "bits_sent"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (
        "clients_per_round" not in a.config["algorithm"] and b.config["algorithm"]["clients_per_round"] == 3
    )
    np.testing.assert_array_equal(
        fj.theory.exact_mse(het_gaussian, ALGORITHMS[name](), 3),
        fj.theory.exact_mse(het_gaussian, ALGORITHMS[name](clients_per_round=3), 3),
    )


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(list(ALGORITHMS)),
    bad=st.one_of(st.integers(max_value=0), st.sampled_from([2.5, 1.5, float("nan"), "2", True, [2]])),
)
def test_bad_clients_per_round_is_one_line(name, bad):
    with pytest.raises(ValueError, match=r"^clients_per_round=.* is invalid") as err:
        ALGORITHMS[name](clients_per_round=bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_more_clients_than_agents_is_refused_before_compiling(name, het_gaussian):
    alg = ALGORITHMS[name](clients_per_round=4)
    for run in (
        lambda: fj.simulate(jax.random.key(0), het_gaussian, alg, 2, 2),
        lambda: fj.theory.exact_mse(het_gaussian, alg, 2),
        lambda: fj.theory.exact_mean(het_gaussian, alg, 2),
    ):
        with pytest.raises(ValueError, match=r"^clients_per_round=4 is invalid: expected at most N = 3"):
            run()


def test_command_line_flag_and_sweep_axis(tmp_path, capsys):
    common = ["--agents", "4", "--states", "10", "--rounds", "3", "--seeds", "4", "--local-steps", "2"]
    out = tmp_path / "run"
    assert cli.main(["run", *common, "--clients-per-round", "2", "--out", str(out)]) == 0
    res = fj.load(out / "result_scafflsa.npz")
    assert res.config["algorithm"]["clients_per_round"] == 2
    np.testing.assert_array_equal(res.communications, 2 * res.rounds)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *common, "--clients-per-round", "0"])
    assert exit_.value.code == 2 and "--clients-per-round" in capsys.readouterr().err
    assert cli.main(["run", *common, "--clients-per-round", "5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--clients-per-round=5 is invalid: expected at most N = 4" in err and err.count("\n") == 1
    cfg = tmp_path / "grid.toml"
    cfg.write_text(
        '[run]\nseeds = 4\nrounds = 2\n[grid]\nproblem = "garnet"\nstates = 10\nagents = 4\n'
        'algorithm = "qfedtd"\nclients_per_round = [1, 4]\n'
    )
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    index = json.loads((tmp_path / "s" / "sweep.json").read_text())
    sent = {
        row["config"]["clients_per_round"]: fj.load(tmp_path / "s" / row["file"]).communications[-1]
        for row in index
    }
    assert sent == {1: 2, 4: 8}


# -- cohorts with the other channel options -------------------------------------------------------


def _top_k(x, k):
    out = np.zeros_like(x)
    keep = np.argsort(-np.abs(x))[:k]
    out[keep] = x[keep]
    return out


def test_cohort_with_error_feedback_equals_a_numpy_loop():
    """FedLSA, top-1 with EF14 and a cohort of 2 of 4: only the cohort sends ``C(m_c + e_c)`` and
    updates ``e_c``; the others' memory stays; the server divides by m."""
    N, m, H, eta, T, d = 4, 2, 2, 0.2, 10, 3
    base = fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=N, dim=d, heterogeneity=1.0)
    problem = fj.problems.expected(base)
    alg = fj.fedlsa(eta, H, quantizer=fj.channel.top_k(1), error_feedback="ef14", clients_per_round=m)
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    theta0 = np.array([1.0, -0.5, 0.25])
    theta, e = theta0.copy(), np.zeros((N, d))
    state = alg.init(jax.random.key(0), problem, jnp.asarray(theta0))
    step = jax.jit(lambda k, s: alg.step(k, s, problem))
    for t in range(T):
        key = jax.random.fold_in(jax.random.key(2), t)
        S = cohort_of(key, N, m)
        state, _ = step(key, state)
        sent = np.zeros(d)
        for c in np.flatnonzero(S):
            x = theta.copy()
            for _ in range(H):
                x = x - eta * (A[c] @ x - b[c])
            v = _top_k(x - theta + e[c], 1)
            e[c] = x - theta + e[c] - v
            sent += v
        theta = theta + sent / m
        np.testing.assert_allclose(np.asarray(state.theta), theta, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(state.memory), e, rtol=1e-12, atol=1e-14)


def test_cohort_with_a_downlink_matches_exact_mse(het_gaussian):
    """A cohort and an unscaled rand-k downlink together: MC within Z_TOL s.e. of the exact curve
    (FedLSA and Scaffnew), the cohort's exact theory composed with the downlink's."""
    from reference import assert_monte_carlo_matches_exact_jointly

    down = fj.channel.channel(fj.channel.rand_k(2, unbiased=False))
    algorithms = {  # side by side in one compiled program, each checked on its own
        "fedlsa": fj.fedlsa(0.2, 2, downlink=down, clients_per_round=2),
        "scaffnew": fj.scaffnew(0.2, 0.5, 2, downlink=down, clients_per_round=2),
    }
    assert_monte_carlo_matches_exact_jointly(het_gaussian, algorithms, T=6, n=4000)


def test_cohort_exact_theory_with_error_feedback_is_refused(het_gaussian):
    alg = fj.fedlsa(0.2, 2, quantizer=fj.channel.rand_k(2), error_feedback="ef21", clients_per_round=2)
    with pytest.raises(ValueError, match=r"^clients_per_round=2 is invalid: no exact recursion for a cohort"):
        fj.theory.exact_mse(het_gaussian, alg, 3)
    res = fj.simulate(jax.random.key(0), het_gaussian, alg, 3, 8)  # the simulation runs
    assert np.all(np.isfinite(res.mse_mean))
