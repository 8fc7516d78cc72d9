"""Behaviours no test pinned down before, each against an exact reference and each shown to fail
on a hand-made breakage of it (``tests/mutations.py``, section "untested behaviours"):

* ``client_drift`` under a cohort of m agents is ``(1/m) sum_{c in S} |theta^c_{t,H} - theta_{t+1}|^2``
  (FedLSA, SCAFFLSA: a numpy loop on the noise-free problem; Scaffnew: the round's own state), with
  d = 3: a mean over the cohort's agents of a squared norm, not over N nor over coordinates;
* top-k with k above the argmax passes (the ``lax.top_k`` branch) keeps the k largest ``|x_i|``, the
  lower index first among equals, equal to a numpy loop;
* ``fj.until`` stops at the first seed batch with at least ``min_seeds`` seeds where the target holds
  at the rounds it checks (``rounds=``: those rounds only), read off the kept per-seed values;
* the BCa interval uses the jackknife acceleration: equal to Efron's interval recomputed by hand
  (same resamples, leave-one-out means), and measurably away from the bias-corrected percentile one;
* ``--clients-per-round`` reaches every built-in algorithm's factory from the command line and from a
  sweep grid: the recorded config says so, messages are m per round, the MSE is not the full run's;
* the factored many-agent recursion with control variates (SCAFFLSA, Scaffnew) keeps the observation
  noise's contribution to the control-variate rows: equal to the full second moment, to 1e-9;
* the mean-square stability certificate solves ``X - T(X) = I`` (the identity's vectorisation):
  a stable round whose linear part is a multiple of the identity is certified, where solving
  against the all-ones matrix (rank one, kept rank one by such a T) would refuse it;
* ``on_record`` over several seed batches: statistics and per-seed counts over the seeds run so far
  (3, 6, 7 of 7), equal to the kept seeds' values and to runs of that many seeds;
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import fedsa_jax as fj
from fedsa_jax import cli
from fedsa_jax.channel import quantizers
from fedsa_jax.theory import _agents, _operator, engine, stationary

COHORT_STREAM = 0x636F68  # the cohort's documented key stream: fold_in(round_key, 0x636F68)


def cohort_of(round_key, N, m):
    """The documented cohort: the first m of a permutation from the round key's cohort stream."""
    chosen = np.asarray(jax.random.permutation(jax.random.fold_in(round_key, COHORT_STREAM), N))[:m]
    mask = np.zeros(N, bool)
    mask[chosen] = True
    return mask


# --------------------------------------------------------------------------------------------
# client drift under a cohort


@pytest.fixture(scope="module")
def cohort_problem():
    base = fj.problems.random_gaussian_lsa(jax.random.key(4), num_agents=5, dim=3, heterogeneity=1.0)
    return fj.problems.expected(base)


@pytest.mark.parametrize("name", ["fedlsa", "scafflsa"])
def test_cohort_client_drift_is_the_cohorts_mean_squared_norm(cohort_problem, name):
    """N = 5, m = 2, d = 3: ``client_drift`` of each round equals, to float64 rounding,
    ``(1/m) sum_{c in S} |theta^c_H - theta_{t+1}|^2`` from a numpy loop (the documented cohort,
    SCAFFLSA's control variates moving for the cohort only); dividing by N (a factor 5/2) or
    averaging over coordinates (a factor 3) is many tolerances away."""
    problem, N, m, H, eta, T, d = cohort_problem, 5, 2, 3, 0.15, 6, 3
    alg = getattr(fj, name)(eta, H, clients_per_round=m)
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    theta, xi = np.array([1.0, -1.0, 0.5]), np.zeros((N, d))
    state = alg.init(jax.random.key(0), problem, jnp.asarray(theta))
    step = jax.jit(lambda k, s: alg.step(k, s, problem))
    for t in range(T):
        key = jax.random.fold_in(jax.random.key(9), t)
        S = cohort_of(key, N, m)
        state, info = step(key, state)
        local = np.empty((N, d))
        for c in range(N):
            x = theta.copy()
            for _ in range(H):
                x = x - eta * (A[c] @ x - b[c] - xi[c])
            local[c] = x
        msg = local - theta
        mean_msg = msg[S].mean(axis=0)
        theta = theta + mean_msg
        if name == "scafflsa":
            xi = xi + np.where(S[:, None], (mean_msg - msg) / (eta * H), 0.0)
        np.testing.assert_allclose(np.asarray(state.theta), theta, rtol=1e-12, atol=1e-14)
        drift = np.sum((local[S] - theta) ** 2) / m
        assert drift > 1e-4  # power: the competing values (x 2/5, x 1/3) are far outside rtol
        np.testing.assert_allclose(float(info.client_drift), drift, rtol=1e-10)


def test_scaffnew_cohort_client_drift_is_the_cohorts_mean_squared_norm(cohort_problem):
    """Scaffnew with a cohort of 2 of 5: ``client_drift`` is the mean over the cohort's agents
    (the mask the round ends with) of ``|x_c - x_bar|^2``, ``x_bar`` their mean (the new server
    iterate), read off the round's own state; rounds whose last step did not communicate have a
    drift far from 0, and both kinds of round occur."""
    problem, m = cohort_problem, 2
    alg = fj.scaffnew(0.15, 0.5, 3, clients_per_round=m)
    state = alg.init(jax.random.key(0), problem, jnp.array([1.0, -1.0, 0.5]))
    step = jax.jit(lambda k, s: alg.step(k, s, problem))
    drifts = []
    for t in range(10):
        state, info = step(jax.random.fold_in(jax.random.key(9), t), state)
        S = np.asarray(state.cohort)
        assert S.sum() == m
        x, error = np.asarray(state.x), np.asarray(state.error)
        np.testing.assert_allclose(x[S].mean(axis=0), error, rtol=1e-12, atol=1e-14)
        drift = np.sum((x[S] - error) ** 2) / m
        np.testing.assert_allclose(float(info.client_drift), drift, rtol=1e-10, atol=1e-15)
        drifts.append(drift)
    assert np.sum(np.array(drifts) > 1e-4) >= 2 and np.sum(np.array(drifts) == 0.0) >= 1


# --------------------------------------------------------------------------------------------
# top-k through lax.top_k


def top_k_loop(x, k):
    """The k largest ``|x_i|`` kept (the lower index first among equals), the others zeroed."""
    out = np.zeros_like(x)
    keep = sorted(range(len(x)), key=lambda i: (-abs(x[i]), i))[:k]
    out[keep] = x[keep]
    return out


@pytest.mark.parametrize("k", [5, 8, 11])
def test_top_k_above_the_argmax_passes_keeps_the_largest(k):
    """k > 4 takes ``lax.top_k`` instead of k argmax passes: on 6 messages of d = 12 (one with tied
    magnitudes of both signs), the compressor equals the numpy loop exactly, batched and per message
    inside ``jit(vmap)``; the k smallest, or k - 1 of the largest, are other vectors."""
    assert k > quantizers._ARGMAX_K  # the branch under test
    rng = np.random.default_rng(k)
    x = rng.normal(size=(6, 12))
    x[0] = [2.0, -2.0, 1.0, 1.0, -3.0, 0.5, -1.0, 2.0, 0.0, -0.5, 3.0, 1.0]  # ties at every magnitude
    q = fj.channel.top_k(k)
    ref = np.stack([top_k_loop(row, k) for row in x])
    np.testing.assert_array_equal(np.asarray(q.apply(None, jnp.asarray(x))), ref)
    per_message = jax.jit(jax.vmap(q))(jax.random.split(jax.random.key(0), 6), jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(per_message), ref)
    assert np.all(np.count_nonzero(ref[1:], axis=1) == k)
    smallest = np.stack([row - top_k_loop(row, len(row) - k) for row in x])
    assert not np.array_equal(smallest, ref)


# --------------------------------------------------------------------------------------------
# fj.until: min_seeds and rounds=


UNTIL_T, UNTIL_EVERY, UNTIL_BATCH, UNTIL_MAX = 12, 4, 16, 256


@pytest.fixture(scope="module")
def until_seeds(het_gaussian):
    """Every seed's squared error ``(R, 256)`` of FedLSA at rounds 0, 4, 8, 12, from one batch that
    keeps them all (seed i depends only on (key, i): the seeds of a batched run are these)."""
    res = fj.simulate(
        0,
        het_gaussian,
        fj.fedlsa(0.1, 2),
        UNTIL_T,
        UNTIL_MAX,
        record_every=UNTIL_EVERY,
        seed_batch_size=UNTIL_MAX,
        keep_seeds=UNTIL_MAX,
    )
    return res.rounds, res.seed_mse


def first_stop(rounds, values, rel_sem, min_seeds, checked=None):
    """The seed count where ``fj.until`` must stop, by hand: the first multiple of the batch size
    with at least ``min_seeds`` seeds where ``sem <= rel_sem * mean`` (sample std / sqrt(n)) at
    every checked round (None: every recorded round), else the maximum."""
    rows = np.ones(len(rounds), bool) if checked is None else np.isin(rounds, checked)
    for n in range(UNTIL_BATCH, values.shape[1] + 1, UNTIL_BATCH):
        x = values[rows, :n]
        sem, mean = x.std(axis=1, ddof=1) / np.sqrt(n), x.mean(axis=1)
        if n >= min_seeds and np.all(sem <= rel_sem * mean):
            return n
    return values.shape[1]


def until_run(problem, target):
    return fj.simulate(
        0,
        problem,
        fj.fedlsa(0.1, 2),
        UNTIL_T,
        target,
        record_every=UNTIL_EVERY,
        seed_batch_size=UNTIL_BATCH,
    )


def test_until_runs_min_seeds_even_when_the_target_is_met_earlier(het_gaussian, until_seeds):
    """rel_sem = 0.2 holds at every round after the first batch of 16 seeds; with min_seeds = 48
    the run stops after the third batch (48 seeds), not before."""
    rounds, values = until_seeds
    assert first_stop(rounds, values, 0.2, min_seeds=2) == 16  # power: met after one batch
    expected = first_stop(rounds, values, 0.2, min_seeds=48)
    assert expected == 48
    res = until_run(het_gaussian, fj.until(rel_sem=0.2, max_seeds=UNTIL_MAX, min_seeds=48))
    assert res.num_seeds == expected and res.config["until"]["stopped"] == "target met"
    assert res.config["until"]["min_seeds"] == 48


def test_until_checks_only_the_named_rounds(het_gaussian, until_seeds):
    """rel_sem = 0.03 at round 4 alone is met at 64 seeds (by hand from the kept seeds); at every
    round it is not met within 256 seeds (round 12 is noisier), and checking nothing would stop at
    min_seeds = 16: the run stops at 64."""
    rounds, values = until_seeds
    expected = first_stop(rounds, values, 0.03, min_seeds=16, checked=[4])
    assert expected == 64
    assert first_stop(rounds, values, 0.03, min_seeds=16) == UNTIL_MAX  # power: every round
    res = until_run(het_gaussian, fj.until(rel_sem=0.03, max_seeds=UNTIL_MAX, rounds=[4], min_seeds=16))
    assert res.num_seeds == expected and res.config["until"]["stopped"] == "target met"
    np.testing.assert_allclose(res.mse_mean, values[:, :expected].mean(axis=1), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# BCa: the acceleration


def efron_interval(x, level, resamples, seed, accelerated=True):
    """Efron's BCa interval of the mean of one row ``x (n,)``, by hand: the bootstrap means of
    ``resamples`` resamples drawn as documented (one generator, ``integers(0, n, (B, n))``), the
    median bias ``z0``, the acceleration from the leave-one-out means (jackknife), and the
    ``Phi(z0 + (z0 + z) / (1 - a (z0 + z)))`` quantiles; ``accelerated=False``: a = 0 (the
    bias-corrected percentile interval)."""
    n, m = x.size, x.mean()
    means = x[np.random.default_rng(seed).integers(0, n, size=(resamples, n))].mean(axis=1)
    z0 = scipy_stats.norm.ppf((np.sum(means < m) + 0.5 * np.sum(means == m)) / resamples)
    loo = (x.sum() - x) / (n - 1)
    u = loo.mean() - loo
    a = np.sum(u**3) / (6 * np.sum(u**2) ** 1.5) if accelerated else 0.0
    z = scipy_stats.norm.ppf((1 + level) / 2)
    alphas = [scipy_stats.norm.cdf(z0 + (z0 + s) / (1 - a * (z0 + s))) for s in (-z, z)]
    return np.quantile(means, alphas)


def test_bca_interval_uses_the_jackknife_acceleration():
    """30 squared log-normal values (a long right tail, like a seed's squared error): the interval
    equals Efron's BCa recomputed by hand to float64 rounding; the bias-corrected percentile
    interval (no acceleration) has its upper bound more than 10 % of the width lower."""
    x = np.random.default_rng(5).lognormal(0.0, 1.0, size=30) ** 2
    low, high = fj.stats.bca_interval(x[None, :], 0.95)
    ref = efron_interval(x, 0.95, fj.stats.BOOTSTRAP_RESAMPLES, seed=0)
    np.testing.assert_allclose([low[0], high[0]], ref, rtol=1e-12)
    bc = efron_interval(x, 0.95, fj.stats.BOOTSTRAP_RESAMPLES, seed=0, accelerated=False)
    assert high[0] - bc[1] > 0.1 * (high[0] - low[0])  # power: a = 0 is far outside rtol


# --------------------------------------------------------------------------------------------
# --clients-per-round reaches every algorithm's factory


BUILT_IN = ("fedlsa", "scafflsa", "qfedtd", "scaffnew")


def check_cohort_result(res, name, N, m):
    """A run of ``name`` with a cohort of m of N agents on the noise-free Gaussian problem with an
    exact channel (Scaffnew: p = 1): full participation is then deterministic (every seed the same
    iterate, a standard error of exactly 0, N messages per round, N H for Scaffnew), a cohort is
    not (m messages per round, seeds apart: a standard error above 0 after round 0)."""
    assert res.config["algorithm"]["algorithm"] == name
    assert res.config["algorithm"]["clients_per_round"] == m
    H = res.config["algorithm"]["num_local_steps"]
    per_round = m * (H if name == "scaffnew" else 1)
    np.testing.assert_array_equal(res.communications, per_round * res.rounds)
    assert res.mse_sem[0] == 0 and np.all(res.mse_sem[1:] > 1e-6 * res.mse_mean[1:])


def test_clients_per_round_reaches_every_factory_from_the_command_line_and_a_grid(tmp_path):
    """``--clients-per-round 2`` with ``--agents 3`` (and the sweep grid's ``clients_per_round``)
    reaches FedLSA, SCAFFLSA, QFedTD and Scaffnew: each result records the cohort, counts 2 messages
    per round and is not the deterministic full-participation run; the grid's results are the
    command line's, bitwise."""
    N, m, rounds, seeds = 3, 2, 3, 4
    options = {"problem": "gaussian", "agents": N, "dim": 2, "noise_A": 0.0, "noise_b": 0.0}
    options |= {"local_steps": 2, "comm_prob": 1.0}
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    run = ["run", *flags, f"--rounds={rounds}", f"--seeds={seeds}", "--no-plot"]
    out = tmp_path / "run"
    algorithms = ["--algorithms", ",".join(BUILT_IN), f"--clients-per-round={m}"]
    assert cli.main([*run, *algorithms, "--out", str(out)]) == 0
    runs = {name: fj.load(out / f"result_{name}.npz") for name in BUILT_IN}
    for name, res in runs.items():
        check_cohort_result(res, name, N, m)

    grid = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    (tmp_path / "grid.toml").write_text(
        f"[run]\nseeds = {seeds}\nrounds = {rounds}\n[grid]\n{grid}"
        f"algorithm = {json.dumps(list(BUILT_IN))}\nclients_per_round = [{m}]\n"
    )
    sweep = ["sweep", str(tmp_path / "grid.toml"), "--out", str(tmp_path / "s"), "--no-progress"]
    assert cli.main(sweep) == 0
    index = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sorted(row["config"]["algorithm"] for row in index) == sorted(BUILT_IN)
    for row in index:
        name = row["config"]["algorithm"]
        res = fj.load(tmp_path / "s" / row["file"])
        check_cohort_result(res, name, N, m)
        np.testing.assert_array_equal(res.seed_mse, runs[name].seed_mse)
        np.testing.assert_array_equal(res.mse_mean, runs[name].mse_mean)


# --------------------------------------------------------------------------------------------
# the factored recursion with control variates and observation noise


FACTORED_N, FACTORED_T = 8, 30


@pytest.fixture(scope="module")
def noisy_and_noiseless():
    """N = 8 agents, d = 2, heterogeneous; the same problem with and without observation noise."""
    make = lambda a, b: fj.problems.random_gaussian_lsa(  # noqa: E731
        jax.random.key(11), num_agents=FACTORED_N, dim=2, heterogeneity=1.0, noise_A=a, noise_b=b
    )
    return make(0.3, 0.6), make(0.0, 0.0)


def exact_mse_through(problem, alg, monkeypatch, factored):
    """``fj.theory.exact_mse`` round by round (no assembled operator) through the factored blocks
    (``factored=True``: checked to run and raise nothing) or the full D x D moment."""
    calls = []
    run = _agents.factored_mse
    with monkeypatch.context() as m:
        m.setattr(_agents, "FACTORED_RATIO", 0 if factored else 10**9)
        m.setattr(_operator, "CURVE_RATIO", 10**9)
        m.setattr(engine, "factored_mse", lambda *a: calls.append(1) or run(*a))
        mse = fj.theory.exact_mse(problem, alg, FACTORED_T, np.array([1.0, -1.0]))
    assert bool(calls) == factored
    return mse


@pytest.mark.parametrize("alg", [fj.scafflsa(0.1, 3), fj.scaffnew(0.1, 0.4, 3)], ids=["scafflsa", "scaffnew"])
def test_factored_control_variates_keep_the_noise_in_their_rows(noisy_and_noiseless, alg, monkeypatch):
    """SCAFFLSA (H = 3) and Scaffnew (p = 0.4, H = 3) with N = 8 on a noisy Gaussian problem: the
    factored recursion (the agents' fresh noise ``Q R Q^T`` on the control variates' diagonal
    blocks, and its cross term ``Q R G^T`` with the globals) equals the full second moment to 1e-9
    over 30 rounds; the noise moves the MSE by far more than that (against the noise-free problem)."""
    noisy, noiseless = noisy_and_noiseless
    full = exact_mse_through(noisy, alg, monkeypatch, factored=False)
    factored = exact_mse_through(noisy, alg, monkeypatch, factored=True)
    np.testing.assert_allclose(factored, full, rtol=1e-9, atol=0)
    quiet = exact_mse_through(noiseless, alg, monkeypatch, factored=True)
    assert np.all(np.abs(full[5:] - quiet[5:]) > 1e-2 * full[5:])  # power: the noise's share is large


# --------------------------------------------------------------------------------------------
# the mean-square stability certificate's right-hand side


def test_stability_certificate_solves_against_the_identity(monkeypatch):
    """FedLSA (eta = 0.3, H = 2) on two agents with ``A_bar = I`` (d = 2), heterogeneous ``b_bar``,
    additive noise only: the round's linear part is ``c I``, c = 0.49, so ``T(X) = c^2 X``. With
    the dense path off (``DENSE_UNKNOWNS = 0``: GMRES after the certificate) ``stationary_mse``
    equals the dense solve and the converged recursion; the certificate's solution is
    ``I / (1 - c^2)``, positive definite (against the all-ones matrix J it would be the singular
    ``J / (1 - c^2)``, and the stable run refused). Past the threshold (eta = 2.5: c = -2.25) the
    certificate refuses, naming the radius c^2."""
    problem = fj.problems.gaussian_lsa(
        np.stack([np.eye(2)] * 2), np.array([[1.0, -0.5], [0.3, 2.0]]), 0.0, 0.5
    )
    alg = fj.fedlsa(0.3, 2)
    dense = fj.theory.stationary_mse(problem, alg)
    np.testing.assert_allclose(fj.theory.mean_square_spectral_radius(problem, alg), 0.49, rtol=1e-12)
    monkeypatch.setattr(stationary, "DENSE_UNKNOWNS", 0)
    certified = []
    check = stationary._require_mean_square_stable
    monkeypatch.setattr(
        stationary, "_require_mean_square_stable", lambda *a: certified.append(1) or check(*a)
    )
    np.testing.assert_allclose(fj.theory.stationary_mse(problem, alg), dense, rtol=1e-10)
    assert certified  # the certificate ran (and passed)
    np.testing.assert_allclose(dense, fj.theory.exact_mse(problem, alg, 60)[-1], rtol=1e-10)
    with pytest.raises(ValueError, match=r"spectral radius 5\.0625 >= 1: no limit"):
        fj.theory.stationary_mse(problem, fj.fedlsa(2.5, 2))


# --------------------------------------------------------------------------------------------
# on_record over seed batches


def test_on_record_statistics_and_counts_cover_the_seeds_run_so_far(het_gaussian):
    """7 seeds in batches of 3, FedLSA over an uplink that delivers half the messages: the records
    of batch b count the ``3, 6, 7`` seeds run so far; their MSE mean and standard error are those
    of seeds ``0..n-1`` by hand (kept by a one-batch run of the 7: seed i depends on (key, i)
    only), and their per-seed counts (samples, and the random delivered messages) those of a run
    of n seeds, not the run's 7. The delivered counts of 3 and 6 seeds differ from 7's (power)."""
    T, n, batch = 4, 7, 3
    alg = fj.fedlsa(0.1, 2, success_prob=0.5)
    run = lambda seeds, **kw: fj.simulate(0, het_gaussian, alg, T, seeds, record_every=2, **kw)  # noqa: E731
    records = []
    res = run(n, seed_batch_size=batch, on_record=records.append)
    kept = run(n, seed_batch_size=n, keep_seeds=n).seed_mse  # (R, 7) every seed's squared error
    assert res.config["execution"]["num_batches"] == 3
    by_batch = {}
    for r in records:
        by_batch.setdefault(r.batch, []).append(r)
    assert sorted(by_batch) == [0, 1, 2]
    for b, seeds in enumerate([3, 6, 7]):
        rows = by_batch[b]
        assert {r.num_seeds for r in rows} == {seeds}
        rounds = np.concatenate([r.rounds for r in rows])
        np.testing.assert_array_equal(rounds, res.rounds)
        x = kept[:, :seeds]
        mean = np.concatenate([r.mse_mean for r in rows])
        sem = np.concatenate([r.mse_sem for r in rows])
        np.testing.assert_allclose(mean, x.mean(axis=1), rtol=1e-10)
        np.testing.assert_allclose(sem[1:], x.std(axis=1, ddof=1)[1:] / np.sqrt(seeds), rtol=1e-8)
        alone = run(seeds)
        for name in ("samples", "messages_delivered"):
            got = np.concatenate([r.counts[name] for r in rows])
            np.testing.assert_allclose(got, getattr(alone, name), rtol=1e-12, err_msg=name)
        if seeds < n:
            assert not np.allclose(alone.messages_delivered, res.messages_delivered)
