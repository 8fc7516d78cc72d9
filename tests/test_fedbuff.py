"""FedBuff (fj.fedbuff): buffered asynchronous aggregation on a simulated clock.

* Every seed's server iterate, and every agent's start, version, next arrival and the clock, round
  by round, equal a numpy loop written from the definition (arrival by arrival), on Gaussian LSA
  and TD (generative and Markov), with staleness weights, a quantizer and random durations.
* A buffer of N with every job one tick long is FedLSA: the same observations, the same iterates
  (float64 rounding), so FedLSA's exact MSE is FedBuff's there.
* The clock: wall_clock and staleness metrics against the loop's clock; a fast agent contributes
  more often (renewal rate 1 / E[D_c]).
* Bad input (K > N, K < 1, a negative exponent, a law for another N, options it does not take)
  is a one-line error before compiling; the exact theory refuses it with the reason.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from reference import fedbuff_loop, gaussian_loop, step_trajectories, td_loop

import fedsa_jax as fj
from fedsa_jax._runtime.kernel import per_seed_keys

KEY = jax.random.key(11)


def _sqrt_weight(tau):
    return 1.0 / jnp.sqrt(1.0 + tau)


@functools.partial(jax.jit, static_argnums=(1, 3))
def _states(problem, algorithm, key, T, seed):
    """One seed's states after rounds 1..T, from the algorithm's own init and step (driver keys)."""
    init_keys, round_keys = per_seed_keys(key, jnp.asarray(seed, jnp.uint32)[None])

    def one_round(state, t):
        state, _ = algorithm.step(jax.random.fold_in(round_keys[0], t), state, problem)
        return state, state

    state = algorithm.init(init_keys[0], problem, jnp.zeros(problem.dim, problem.dtype))
    return jax.lax.scan(one_round, state, jnp.arange(T, dtype=jnp.uint32))[1]


def _loop_with_states(problem, alg, loop, seed, T):
    """The reference loop's (thetas, states): ``loop`` builds the observations, fedbuff_loop runs."""
    captured = {}

    def capture(problem, algorithm, T, theta0, agent_round, key, seed):
        out = fedbuff_loop(problem, algorithm, T, theta0, agent_round, key, seed)
        captured["states"] = out[1]
        return out

    import reference

    original = reference.fedbuff_loop
    reference.fedbuff_loop = capture
    try:
        thetas = loop(problem, alg, KEY, seed, T)
    finally:
        reference.fedbuff_loop = original
    return thetas, captured["states"]


def _check(problem, alg, loop, T=8, seeds=2):
    for seed in range(seeds):
        thetas, states = _loop_with_states(problem, alg, loop, seed, T)
        got = _states(problem, alg, KEY, T, seed)
        np.testing.assert_allclose(np.asarray(got.theta), thetas[1:], rtol=1e-12, atol=1e-13)
        star = np.asarray(problem.theta_star)
        for t, ref in enumerate(states):
            np.testing.assert_allclose(np.asarray(got.start[t]) + star, ref["start"], rtol=1e-12, atol=1e-13)
            np.testing.assert_array_equal(np.asarray(got.version[t]), ref["version"])
            np.testing.assert_array_equal(np.asarray(got.finish[t]), ref["finish"])
            np.testing.assert_array_equal(np.asarray(got.pending[t]), ref["pending"])
            assert int(got.clock[t]) == ref["clock"]


def test_gaussian_round_by_round_against_numpy(het_gaussian):
    for alg in (
        fj.fedbuff(0.05, 3, buffer_size=2, durations=fj.clock.geometric(2.0, 5)),
        fj.fedbuff(0.05, 2, buffer_size=1, durations=fj.clock.uniform(1, 3), staleness=0.0),
        fj.fedbuff(0.05, 2, buffer_size=3, durations=fj.clock.fixed([1, 3, 2]), staleness=_sqrt_weight),
    ):
        _check(het_gaussian, alg, gaussian_loop)


@pytest.mark.parametrize("sampling", ["generative", "markov"])
def test_td_round_by_round_against_numpy(tiny_td_sampled, sampling):
    q = fj.channel.stochastic_uniform(bits=3)
    for alg in (
        fj.fedbuff(0.1, 2, buffer_size=2, durations=fj.clock.straggler(1, 0.3, 4.0), skip=2),
        fj.fedbuff(0.1, 3, buffer_size=1, durations=fj.clock.geometric([1.0, 2.0, 4.0], 8), quantizer=q),
        fj.fedbuff(0.1, 2, buffer_size=3, durations=fj.clock.uniform(1, 2), quantizer=q),  # a key each
    ):
        _check(tiny_td_sampled[sampling], alg, td_loop, T=7)


@pytest.mark.parametrize("family", ["gaussian", "td"])
def test_full_buffer_of_one_tick_jobs_is_fedlsa(het_gaussian, tiny_td_sampled, family):
    """K = N, every job one tick: each server step takes every agent's update from the current
    iterate (staleness 0), on the observations FedLSA draws: FedLSA's iterates."""
    problem = het_gaussian if family == "gaussian" else tiny_td_sampled["markov"]
    H = 3
    fedlsa = step_trajectories(problem, fj.fedlsa(0.1, H), KEY, 6, 3)
    for staleness in (0.0, 0.5):
        buff = fj.fedbuff(0.1, H, buffer_size=problem.num_agents, staleness=staleness)
        np.testing.assert_allclose(
            step_trajectories(problem, buff, KEY, 6, 3), fedlsa, rtol=1e-12, atol=1e-13
        )
    opt = optax.sgd(0.5, momentum=0.9)  # the server optimizer takes FedLSA's pseudo-gradient
    with_opt = step_trajectories(problem, fj.fedlsa(0.1, H, server_optimizer=opt), KEY, 6, 3)
    buff = fj.fedbuff(0.1, H, buffer_size=problem.num_agents, server_optimizer=opt)
    np.testing.assert_allclose(step_trajectories(problem, buff, KEY, 6, 3), with_opt, rtol=1e-12, atol=1e-13)


def test_full_buffer_matches_fedlsa_exact_mse(het_gaussian):
    """Through the driver: FedBuff(K = N, one-tick jobs) within Z_TOL s.e. of FedLSA's exact_mse."""
    from conftest import Z_TOL

    T = 6
    res = fj.simulate(KEY, het_gaussian, fj.fedbuff(0.1, 3, buffer_size=3), T, 2000)
    exact = fj.theory.exact_mse(het_gaussian, fj.fedlsa(0.1, 3), T)
    z = (res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), z


def test_clock_metrics_and_counts(tiny_td_sampled):
    """wall_clock is the loop's clock; counts K per round; an
    agent with jobs 4x faster contributes about 4x as often (every agent is always busy)."""
    problem = tiny_td_sampled["generative"]
    law = fj.clock.fixed([1, 4, 4])
    alg = fj.fedbuff(0.1, 2, buffer_size=2, durations=law)
    res = fj.simulate(KEY, problem, alg, 12, 4, metrics=["wall_clock", "staleness"])
    _, states = _loop_with_states(problem, alg, td_loop, 0, 12)
    np.testing.assert_array_equal(res.metrics["wall_clock"].mean[1:], [s["clock"] for s in states])
    np.testing.assert_array_equal(res.communications, res.rounds * 2)
    np.testing.assert_array_equal(res.samples, res.rounds * 2 * 2)
    # in 12 ticks agent 0 finishes 12 jobs, agents 1 and 2 three each: 18 arrivals, 9 server steps
    assert [s["clock"] for s in states][8] == 12
    assert law.throughput(3) == pytest.approx(1.5)
    assert law.sync_round_time(3) == pytest.approx(4.0)
    assert fj.clock.uniform(1, 2).sync_round_time(2) == pytest.approx(1 + 3 / 4)


def test_staleness_metric_is_the_buffer_mean(het_gaussian):
    alg = fj.fedbuff(0.05, 1, buffer_size=1, durations=fj.clock.fixed([1, 2, 3]))
    res = fj.simulate(KEY, het_gaussian, alg, 6, 1, metrics=["staleness"])
    _, states = _loop_with_states(het_gaussian, alg, gaussian_loop, 0, 6)
    np.testing.assert_allclose(res.metrics["staleness"].mean[1:], [s["staleness"] for s in states])
    assert max(s["staleness"] for s in states) > 0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(buffer_size=0), "buffer_size"),
        (dict(buffer_size=2, staleness=-1.0), "staleness"),
        (dict(buffer_size=2, durations=fj.local_work.uniform(1, 3)), "durations"),
        (dict(buffer_size=2, success_prob=0.5), "success_prob"),
        (dict(buffer_size=2, clients_per_round=2), "clients_per_round"),
        (dict(buffer_size=2, error_feedback="ef21"), "error_feedback"),
        (dict(buffer_size=2, num_local_steps=0), "num_local_steps"),
        (dict(buffer_size=2, staleness=lambda tau: jnp.ones(2)), "staleness"),
        (dict(buffer_size=2, staleness=lambda tau: -tau), "staleness"),
    ],
)
def test_bad_input_is_one_line(kwargs, name):
    args = dict(step_size=0.1, num_local_steps=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name) as err:
        fj.fedbuff(**args)
    assert "\n" not in str(err.value)


def test_refused_before_compiling(het_gaussian):
    N = het_gaussian.num_agents
    for alg, name in (
        (fj.fedbuff(0.1, 2, buffer_size=N + 1), "buffer_size"),
        (fj.fedbuff(0.1, 2, buffer_size=2, durations=fj.clock.fixed([1, 2])), "durations"),
        (fj.fedbuff(0.1, 2, buffer_size=2, durations=fj.clock.geometric([1.0, 2.0], 4)), "durations"),
    ):
        with pytest.raises(ValueError, match=name) as err:
            fj.simulate(KEY, het_gaussian, alg, 5, 4)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="simulated clock"):
        fj.theory.exact_mean(het_gaussian, fj.fedbuff(0.1, 2, buffer_size=2), 5)
    for bad, name in (
        (lambda: fj.clock.fixed(0), "durations"),
        (lambda: fj.clock.uniform(3, 2), "high"),
        (lambda: fj.clock.geometric(0.5, 4), "mean"),
        (lambda: fj.clock.straggler(2, 1.5, 2.0), "prob"),
        (lambda: fj.clock.straggler(2, 0.5, 0.5), "slowdown"),
    ):
        with pytest.raises(ValueError, match=name):
            bad()


def test_limit_is_the_rate_weighted_fixed_point_to_first_order(het_gaussian):
    """Noise-free, jobs of 1, 2 and 4 ticks (rates r = 1, 1/2, 1/4), K = 1, no weights: the clock is
    periodic (7 arrivals every 4 ticks) and so is the limit; its mean over a period tends to
    theta_r = [sum_c r_c A_c]^-1 sum_c r_c b_c at rate eta (the error halves with eta), while
    theta_r is far from theta*."""
    problem = fj.problems.expected(het_gaussian)
    law = fj.clock.fixed([1, 2, 4])
    r = 1.0 / law.mean_durations(3)
    A, b = np.asarray(het_gaussian.A_bar), np.asarray(het_gaussian.b_bar)
    theta_r = np.linalg.solve(np.einsum("c,cij->ij", r, A), r @ b)
    errors = []
    for eta in (0.02, 0.01):
        thetas = step_trajectories(problem, fj.fedbuff(eta, 2, 1, law, staleness=0.0), KEY, int(60 / eta), 1)[
            0
        ]
        np.testing.assert_array_equal(thetas[-7:], thetas[-14:-7])  # one period: the orbit is reached
        errors.append(np.linalg.norm(thetas[-7:].mean(0) - theta_r))
    assert 1.9 < errors[0] / errors[1] < 2.1, errors  # first order in eta
    assert errors[1] < 0.02 * np.linalg.norm(theta_r - np.asarray(het_gaussian.theta_star))


def test_command_line(tmp_path, capsys):
    """``--algorithms fedbuff``: the buffer, the law and the staleness exponent in the result file, K
    messages a round; K > N and a malformed law are one-line errors."""
    from fedsa_jax.cli import main

    out = tmp_path / "run"
    args = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "8"]
    args += ["--rounds", "4", "--local-steps", "2", "--algorithms", "fedbuff", "--out", str(out)]
    assert main([*args, "--buffer-size", "2", "--durations", "straggler:1,0.5,3", "--staleness", "0"]) == 0
    res = fj.load(out / "result_fedbuff.npz")
    config = res.config["algorithm"]
    assert config["buffer_size"] == 2 and config["staleness"] == 0.0
    assert config["durations"]["law"] == "straggler" and config["durations"]["pmf"] == [[0.5, 0.0, 0.5]]
    np.testing.assert_array_equal(res.communications, 2 * res.rounds)
    np.testing.assert_array_equal(res.bits_sent, 2 * res.rounds * res.config["bits_per_message"])
    capsys.readouterr()
    assert main([*args, "--buffer-size", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--buffer-size=4 is invalid: expected at most N = 3" in err, err
    with pytest.raises(SystemExit) as e:
        main([*args, "--durations", "uniform:1"])
    assert e.value.code == 2 and "--durations: expected fixed:D" in capsys.readouterr().err


def test_with_the_wrappers(het_gaussian):
    """Averaging runs FedBuff through its own randomness (the last iterate bit for bit the plain run,
    the clock read through the wrapper); the bootstrap refuses it (no weighted local updates)."""
    alg = fj.fedbuff(0.05, 2, 2, fj.clock.geometric(2.0, 5))
    avg = fj.simulate(
        1, het_gaussian, fj.averaged(alg, burn_in=5), 12, 8, metrics=["last_iterate_mse", "wall_clock"]
    )
    plain = fj.simulate(1, het_gaussian, alg, 12, 8, metrics=["wall_clock"])
    np.testing.assert_array_equal(avg.metrics["last_iterate_mse"].mean, plain.mse_mean)
    np.testing.assert_array_equal(avg.metrics["wall_clock"].mean, plain.metrics["wall_clock"].mean)
    with pytest.raises(ValueError, match="rand.weights"):
        fj.bootstrap(alg, 10)
    with pytest.raises(ValueError, match="simulated clock") as err:
        fj.plug_in(alg)
    assert "\n" not in str(err.value)


def test_the_clock_runs_past_int32(het_gaussian):
    """With x64 the ticks are int64: a clock started 10 ticks below 2^31 (every agent's job and the
    clock shifted) runs the same server steps, in the same arrival order, its ticks shifted by the
    same amount past 2^31 (int32 ticks wrapped to -2^31 and broke the order, silently)."""
    alg = fj.fedbuff(0.05, 1, buffer_size=1, durations=fj.clock.fixed([1, 2, 3]))
    shift = 2**31 - 10
    init = alg.init(KEY, het_gaussian, jnp.zeros(het_gaussian.dim))
    assert init.clock.dtype == jnp.int64 and init.finish.dtype == jnp.int64
    moved = init._replace(clock=init.clock + shift, finish=init.finish + shift)
    step = jax.jit(lambda key, state: alg.step(key, state, het_gaussian)[0])
    a, b = init, moved
    for t in range(40):
        a, b = step(jax.random.key(t), a), step(jax.random.key(t), b)
        np.testing.assert_array_equal(b.theta, a.theta)
        assert int(b.clock) == int(a.clock) + shift
    assert int(b.clock) > 2**31  # the test crossed the int32 boundary


def test_int32_ticks_are_refused_where_they_could_wrap():
    """Without x64 (ticks int32) a run whose ticks could pass 2^31 - 1 is refused before compiling:
    the jobs running after T server steps end by (T + 1) D_max; at the boundary exactly."""
    law = fj.clock.fixed([1, 2**16])  # D_max = 65536: (T + 1) D_max <= 2^31 - 1 for T <= 32766
    law.check_ticks(32766, x64=False)
    with pytest.raises(ValueError, match=r"^durations='fixed' is invalid: \(num_rounds \+ 1\) x D_max = "):
        law.check_ticks(32767, x64=False)
    law.check_ticks(10**9, x64=True)  # int64 ticks


def _linear_weight(tau):
    return 1.0 - tau / 61.5  # > 0 up to the reachable staleness 61 of the law below, <= 0 past it


def _reversing_weight(tau):
    return 1.0 - tau / 30.0  # > 0 on 0..3: the old check passed it, a run then reversed updates


def test_a_staleness_function_is_checked_where_staleness_can_reach(het_gaussian):
    """Jobs of 1, 1 and 30 ticks, K = 1: agent 2's contributions are 60 server steps stale (reached;
    the bound is 61). A weight > 0 there runs; one <= 0 at a reachable staleness (s(30) = 0, s(60) =
    -1) is refused before compiling, naming the staleness and the bound; at construction 0..3."""
    law = fj.clock.fixed([1, 1, 30])
    res = fj.simulate(
        KEY, het_gaussian, fj.fedbuff(0.05, 1, 1, law, staleness=0.0), 200, 1, metrics=["staleness"]
    )
    assert res.metrics["staleness"].mean.max() == 60.0
    fj.simulate(KEY, het_gaussian, fj.fedbuff(0.05, 1, 1, law, staleness=_linear_weight), 3, 1)
    with pytest.raises(
        ValueError,
        match=r"^staleness=.* is invalid: s\(30\) = 0.0, at a staleness this run can reach \(up to 61",
    ) as e:
        fj.simulate(KEY, het_gaussian, fj.fedbuff(0.05, 1, 1, law, staleness=_reversing_weight), 3, 1)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^staleness=.* is invalid: s\(3\) = 0.0, at staleness 0..3"):
        fj.fedbuff(0.1, 1, 1, staleness=lambda tau: 3.0 - tau)


def test_client_drift_is_against_the_new_iterate_over_agents():
    """``client_drift`` is ``mean_k |theta^{c_k}_H - theta_{t+1}|^2`` over the buffer's contributions,
    the new server iterate, as FedLSA's (over agents): noise-free, K = N = 4, jobs of one tick (each
    round FedLSA's), d = 2, against numpy written from the definition (power: against theta_t, or a
    mean over coordinates, is far)."""
    base = fj.problems.random_gaussian_lsa(jax.random.key(7), num_agents=4, dim=2, heterogeneity=1.0)
    problem = fj.problems.expected(base)
    A, b = np.asarray(base.A_bar), np.asarray(base.b_bar)
    eta, H, T = 0.1, 3, 3
    theta0 = np.array([1.0, -2.0])
    theta, want, old = theta0, [], []
    for _ in range(T):
        local = []
        for c in range(4):
            x = theta.copy()
            for _ in range(H):
                x = x - eta * (A[c] @ x - b[c])
            local.append(x)
        local = np.array(local)
        new = theta + np.mean(local - theta, axis=0)
        want.append(np.mean(np.sum((local - new) ** 2, axis=1)))
        old.append(np.mean(np.sum((local - theta) ** 2, axis=1)))
        theta = new
    for alg in (fj.fedbuff(eta, H, buffer_size=4), fj.fedlsa(eta, H)):
        res = fj.simulate(KEY, problem, alg, T, 1, theta0, metrics=["client_drift"])
        got = res.metrics["client_drift"].mean[1:]
        np.testing.assert_allclose(got, want, rtol=1e-10)
        assert np.all(np.abs(np.array(old) - want) > 1e-3 * np.array(want))  # power: theta_t is far
        assert np.all(np.abs(np.array(want) / 2 - want) > 1e-3 * np.array(want))  # per coordinate is far
