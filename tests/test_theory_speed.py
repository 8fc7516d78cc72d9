"""Faster exact recursions equal the plain ones.

* A long constant-step horizon runs through the assembled operator of the persistent coordinates
  (``z_{t+1} = M z_t + c``) instead of the phases: the same curve as round by round, to 1e-10.
* Many agents: the agents' blocks factored (independent given the server, theory._agents) give
  the same curve as the full moment, to 1e-10, and Monte Carlo agrees at N=100.
"""

import jax
import numpy as np
import optax
import pytest
from conftest import Z_TOL

import fedsa_jax as fj
from fedsa_jax.moments import state as moments_state
from fedsa_jax.theory import _agents, _operator, _rounds, engine

T = 600


@pytest.fixture(scope="module")
def problems(het_gaussian):
    td = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=2)
    return {"gaussian": (het_gaussian, 0.1), "td": (td, 0.3)}


FAST = {
    "fedlsa": lambda eta: fj.fedlsa(eta, 3),
    "fedlsa_momentum": lambda eta: fj.fedlsa(eta, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)),
    "qfedtd_randk_erasures": lambda eta: fj.qfedtd(eta, quantizer=fj.channel.rand_k(2), success_prob=0.7),
    "scaffnew": lambda eta: fj.scaffnew(eta, 0.4, 2),
}


def _round_by_round(problem, alg, T, monkeypatch, theta0=None):
    with monkeypatch.context() as m:
        m.setattr(_operator, "CURVE_RATIO", 10**9)
        return fj.theory.exact_mse(problem, alg, T, theta0)


def _taken(monkeypatch):
    calls = []
    assemble = _operator.Operator.assemble
    monkeypatch.setattr(_operator.Operator, "assemble", lambda self: calls.append(self.n) or assemble(self))
    return calls


@pytest.mark.parametrize("family", ["gaussian", "td"])
@pytest.mark.parametrize("name", list(FAST))
def test_long_constant_horizon_through_the_assembled_operator(problems, family, name, monkeypatch):
    problem, eta = problems[family]
    alg = FAST[name](eta)
    theta0 = np.linspace(-1.0, 1.0, problem.dim)
    calls = _taken(monkeypatch)
    fast = fj.theory.exact_mse(problem, alg, T, theta0)
    assert calls and 3 * (calls[0] + 1) <= T  # the shortcut was taken
    slow = _round_by_round(problem, alg, T, monkeypatch, theta0)
    np.testing.assert_allclose(fast, slow, rtol=1e-10, atol=0)


def test_zero_sum_control_variates_in_their_subspace(problems, monkeypatch):
    problem, eta = problems["td"]  # d = 2, N = 3: 7 persistent coordinates (xi in its 4-dim subspace)
    alg = fj.scafflsa(eta, 3)
    calls = _taken(monkeypatch)
    fast = fj.theory.exact_mse(problem, alg, T)
    assert calls == [28]
    np.testing.assert_allclose(fast, _round_by_round(problem, alg, T, monkeypatch), rtol=1e-10, atol=0)


def test_the_shortcut_declines_where_it_does_not_apply(problems, monkeypatch):
    problem, eta = problems["gaussian"]
    calls = _taken(monkeypatch)
    for alg, horizon in (
        (fj.averaged(fj.fedlsa(eta, 2)), T),  # the round changes with t
        (fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=eta, k0=10.0), 2), T),  # a schedule
        (fj.fedlsa(eta, 2), 20),  # a horizon shorter than 3 x the unknowns (10 + 2)
    ):
        fj.theory.exact_mse(problem, alg, horizon)
    assert calls == []


# ------------------------------------------------------------------ the factored recursion

FACTORED = {
    "fedlsa": lambda eta: fj.fedlsa(eta, 3),
    "schedule": lambda eta: fj.fedlsa(fj.schedule(fj.optim.inverse_time, eta0=eta, k0=10.0), 3),
    "averaged": lambda eta: fj.averaged(fj.fedlsa(eta, 2), burn_in=5),
    "randk_erasures_received": lambda eta: fj.fedlsa(
        eta, 2, quantizer=fj.channel.rand_k(2), success_prob=0.6, aggregation="divide_by_received"
    ),
    "cohort": lambda eta: fj.fedlsa(eta, 2, clients_per_round=2, success_prob=0.7),
    "momentum": lambda eta: fj.fedlsa(eta, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)),
    "qfedtd": lambda eta: fj.qfedtd(eta, quantizer=fj.channel.rand_k(2), success_prob=0.7),
    # control variates: carried per agent, read across agents through the aggregate
    "scafflsa": lambda eta: fj.scafflsa(eta, 3),
    "scafflsa_schedule": lambda eta: fj.scafflsa(fj.schedule(fj.optim.inverse_time, eta0=eta, k0=10.0), 3),
    "scafflsa_averaged": lambda eta: fj.averaged(fj.scafflsa(eta, 2), burn_in=5),
    "scafflsa_momentum": lambda eta: fj.scafflsa(eta, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)),
    # a coin, and the agents' own iterates carried
    "scaffnew": lambda eta: fj.scaffnew(eta, 0.4, 2),
    "scaffnew_momentum": lambda eta: fj.scaffnew(eta, 0.5, 3, server_optimizer=optax.sgd(0.5, momentum=0.3)),
}


def _mse(problem, alg, T, monkeypatch, factored, assembled=False, theta0=None):
    with monkeypatch.context() as m:
        m.setattr(_agents, "FACTORED_RATIO", 0 if factored else 10**9)
        if not assembled:
            m.setattr(_operator, "CURVE_RATIO", 10**9)
        return fj.theory.exact_mse(problem, alg, T, theta0)


@pytest.mark.parametrize("family", ["gaussian", "td"])
@pytest.mark.parametrize("name", list(FACTORED))
def test_factored_recursion_equals_the_full_moment(problems, family, name, monkeypatch):
    problem, eta = problems[family]
    alg = FACTORED[name](eta)
    theta0 = np.linspace(-1.0, 1.0, problem.dim)
    full = _mse(problem, alg, 40, monkeypatch, factored=False, theta0=theta0)
    calls = []
    run = _agents.factored_mse
    monkeypatch.setattr(engine, "factored_mse", lambda *a: calls.append(1) or run(*a))
    factored = _mse(problem, alg, 40, monkeypatch, factored=True, theta0=theta0)
    assert calls  # the factored recursion ran (and raised nothing)
    np.testing.assert_allclose(factored, full, rtol=1e-10, atol=0)


def test_a_coin_on_the_globals_after_a_snapshot(problems):
    """A coin whose phase moves only the globals, taken when the moment is a snapshot: both branches
    keep their own moment (the full recursion's values)."""
    problem, eta = problems["gaussian"]
    y = fj.theory.Augmented(problem)
    y.add("loc", per_agent=True)
    y.add("memory", per_agent=True, carried=True)  # carried, read by nothing: in the snapshot
    shrink = fj.theory.coin(0.4, fj.theory.assign(y, theta={"theta": 0.5}))

    def round(t, etas):
        steps = [fj.theory.local_step(y, float(e)) for e in etas]
        return [fj.theory.broadcast(y), *steps, fj.theory.aggregate(y, fj.channel.channel()), shrink]

    rec = fj.theory.Recursion(y, round, eta, 2)
    m0 = y.initial(np.linspace(-1.0, 1.0, problem.dim))
    factored, full = _factored_and_full(rec, np.full((8, 2), eta), m0)
    np.testing.assert_allclose(factored, full, rtol=1e-12)


@pytest.mark.parametrize(
    "alg",
    [fj.fedlsa(0.05, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)), fj.scafflsa(0.05, 2)],
    ids=["fedlsa_momentum", "scafflsa"],
)
def test_beyond_the_full_recursions_size_on_factored_blocks(alg, monkeypatch):
    """More coordinates than MAX_AUGMENTED_DIM: exact_mse runs on the factored blocks, and gives the
    full recursion's values (run here with the limit raised)."""
    N = 400 if alg.name == "fedlsa" else 200  # 1 + 5 + 400 x 5 (+ 10): D > 2000
    problem = fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=N, dim=5)
    theta0 = np.linspace(-1.0, 1.0, 5)
    fast = fj.theory.exact_mse(problem, alg, 3, theta0)
    with pytest.raises(ValueError, match="MAX_AUGMENTED_DIM = 2000"):
        fj.theory.exact_mean(problem, alg, 3)  # no factored form of the mean: refused with the sizes
    monkeypatch.setattr(moments_state, "MAX_AUGMENTED_DIM", 3000)
    monkeypatch.setattr(_agents, "FACTORED_RATIO", 10**9)
    np.testing.assert_allclose(fast, fj.theory.exact_mse(problem, alg, 3, theta0), rtol=1e-10)


def test_scaffnew_beyond_the_full_recursions_size_on_factored_blocks(monkeypatch):
    """Scaffnew's round ends on the agents' mean, read from its coefficients: past MAX_AUGMENTED_DIM
    exact_mse runs on the factored blocks (no D x D map built) and equals the full recursion (run
    with the limit raised). Here the limit is lowered to 100 for N = 30, d = 2 (D = 125); at the
    real limit N = 600, d = 2 (2405 coordinates) runs the same way."""
    problem = fj.problems.random_gaussian_lsa(
        jax.random.key(0), num_agents=30, dim=2, heterogeneity=1.0, noise_A=0.2, noise_b=0.5
    )
    alg, theta0 = fj.scaffnew(0.05, 0.5, 2), np.array([1.0, -1.0])
    with monkeypatch.context() as m:
        m.setattr(moments_state, "MAX_AUGMENTED_DIM", 100)
        m.setattr(_operator, "CURVE_RATIO", 10**9)
        fast = fj.theory.exact_mse(problem, alg, 4, theta0)
        downlink = fj.scaffnew(0.05, 0.5, 2, downlink=fj.channel.channel(fj.channel.rand_k(1)))
        with pytest.raises(ValueError, match="> MAX_AUGMENTED_DIM = 100 .*factored blocks does not apply"):
            fj.theory.exact_mse(problem, downlink, 4)  # refused with the reason
    monkeypatch.setattr(_agents, "FACTORED_RATIO", 10**9)
    np.testing.assert_allclose(fast, fj.theory.exact_mse(problem, alg, 4, theta0), rtol=1e-10)


def _factored_and_full(rec, etas, m0):
    factored = _agents.factored_mse(rec, etas, len(etas), m0)
    advance, S, theta = _rounds.second_moment_round(rec), np.outer(m0, m0), rec.state["theta"]
    full = [np.trace(S[theta, theta])]
    for t in range(len(etas)):
        S = advance(S, t, etas[t])
        full.append(np.trace(S[theta, theta]))
    return factored, np.array(full)


def test_aggregations_through_different_channels_use_their_own_maps(problems):
    """Two aggregations of a round through different channels, and a channel rebuilt every round
    (freed channels' ids are reused): each gets its own weights, in both recursions."""
    problem, eta = problems["gaussian"]
    y = fj.theory.Augmented(problem)
    y.add("loc", per_agent=True, carried=True)
    lossy = fj.channel.channel(success_prob=0.5)
    received = fj.channel.channel(success_prob=0.5, aggregation="divide_by_received")

    def two(t, etas):
        step = fj.theory.local_step(y, float(etas[0]))
        return [
            fj.theory.broadcast(y),
            step,
            fj.theory.aggregate(y, lossy),
            step,
            fj.theory.aggregate(y, received),
        ]

    def changing(t, etas):  # a new channel object each round, success probability 0.3..0.9
        channel = fj.channel.channel(success_prob=0.3 + 0.6 * (t % 4) / 3)
        return [
            fj.theory.broadcast(y),
            fj.theory.local_step(y, float(etas[0])),
            fj.theory.aggregate(y, channel),
        ]

    m0 = y.initial(np.linspace(-1.0, 1.0, problem.dim))
    curves = [
        _factored_and_full(fj.theory.Recursion(y, r, eta, 1), np.full((12, 1), eta), m0)
        for r in (two, changing)
    ]
    for factored, full in curves:
        np.testing.assert_allclose(factored, full, rtol=1e-12)
    with_one = _factored_and_full(
        fj.theory.Recursion(y, lambda t, e: [*two(t, e)[:3], *two(t, e)[1:3]], eta, 1),
        np.full((12, 1), eta),
        m0,
    )[1]
    assert np.max(np.abs(with_one - curves[0][1])) > 1e-3  # the second channel matters


AGGREGATIONS = {
    "exact": (fj.channel.channel(), None),
    "erasures_received": (fj.channel.channel(success_prob=0.6, aggregation="divide_by_received"), None),
    "cohort": (fj.channel.channel(success_prob=0.7), 2),
}


@pytest.mark.parametrize("control_variates", [False, True])
@pytest.mark.parametrize("name", list(AGGREGATIONS))
def test_aggregations_and_assignments_are_read_from_their_coefficients(problems, name, control_variates):
    """The blocks the factored recursion reads from an aggregation's, an assignment's (an average, a
    server step) or a broadcast's coefficients are those of their D x D maps."""
    problem, _ = problems["gaussian"]
    channel, m = AGGREGATIONS[name]
    d = problem.dim
    y = fj.theory.Augmented(problem)
    y.add("xi", per_agent=True, zero_sum=True)
    y.add("loc", per_agent=True)
    y.add("avg")
    momentum = fj.fedlsa(0.1, 2, server_optimizer=optax.sgd(0.5, momentum=0.3)).config.server_optimizer
    _, server = fj.theory.server_step(y, momentum)
    cv = {"control_variates": "xi", "denominator": 0.7} if control_variates else {}
    rec = fj.theory.Recursion(y, lambda t, etas: [], 0.1)
    layout = _agents._Layout(rec)
    phases = [
        fj.theory.aggregate(y, channel, clients_per_round=m, **cv),
        fj.theory.averaging(y, 7, "avg"),
        fj.theory.assign(y, theta={"theta": 0.5, "avg": np.ones((d, d)), "one": np.arange(d)}),
        fj.theory.broadcast(y, source="avg"),
        fj.theory.agents_mean(y),  # Scaffnew's end of round
        server,
    ]
    for phase in phases:
        fast = _agents._info(layout, phase, {})
        dense = _agents._analyse(layout, phase.mean())
        assert fast.keys() == dense.keys()
        for key in fast:
            np.testing.assert_allclose(fast[key], dense[key], rtol=1e-13, atol=1e-15, err_msg=key)
    assert _agents._info(layout, phases[1], {})["globals_only"]
    assert not _agents._info(layout, phases[0], {})["globals_only"] and fast["globals_only"]


@pytest.mark.parametrize("name", ["scafflsa", "scafflsa_momentum", "scaffnew", "qfedtd"])
def test_stationary_values_from_factored_rounds(problems, name, monkeypatch):
    """GMRES on factored rounds (control variates and a coin included) solves the same system."""
    problem, eta = problems["td"]
    alg = FACTORED[name](eta)
    values, calls = [], []
    build = _agents.factored_round
    monkeypatch.setattr(_operator, "factored_round", lambda rec: calls.append(1) or build(rec))
    for ratio in (0, 10**9):
        with monkeypatch.context() as m:
            m.setattr(_agents, "FACTORED_RATIO", ratio)
            values.append(fj.theory.stationary_mse(problem, alg))
        assert len(calls) == 1  # the first on factored rounds, the second not
    np.testing.assert_allclose(values[0], values[1], rtol=1e-10)


def test_the_assembled_operator_from_factored_rounds(problems, monkeypatch):
    problem, eta = problems["td"]
    alg = fj.fedlsa(eta, 3, quantizer=fj.channel.rand_k(2), success_prob=0.6)
    calls = []
    build = _agents.factored_round
    monkeypatch.setattr(_operator, "factored_round", lambda rec: calls.append(1) or build(rec))
    fast = _mse(problem, alg, T, monkeypatch, factored=True, assembled=True)
    assert calls
    np.testing.assert_allclose(fast, _mse(problem, alg, T, monkeypatch, factored=False), rtol=1e-10, atol=0)


@pytest.mark.parametrize(
    "alg",
    [
        fj.scafflsa(0.1, 2, clients_per_round=2),  # control variates on random cohort weights
        fj.scaffnew(0.1, 0.4, 2, downlink=fj.channel.channel(fj.channel.rand_k(1))),  # a compressed downlink
        fj.fedlsa(0.1, 2, quantizer=fj.channel.rand_k(2), error_feedback="ef21"),  # error feedback
    ],
    ids=["scafflsa_cohort", "scaffnew_downlink", "ef21"],
)
def test_rounds_the_factored_form_does_not_cover_fall_back_to_the_full_moment(problems, alg, monkeypatch):
    problem, _ = problems["gaussian"]
    rec, _ = engine._second_moments(problem, alg, 3)
    with pytest.raises(_agents.Unfactored):
        _agents.factored_mse(rec, engine._etas(rec, 3), 3, rec.state.initial(None))
    np.testing.assert_allclose(
        _mse(problem, alg, 20, monkeypatch, factored=True),
        _mse(problem, alg, 20, monkeypatch, factored=False),
        rtol=1e-12,
        atol=0,
    )


@pytest.mark.parametrize("make", [fj.fedlsa, fj.scafflsa], ids=["fedlsa", "scafflsa"])
def test_monte_carlo_matches_the_factored_recursion_at_100_agents(make):
    problem = fj.problems.garnet(jax.random.key(0), num_agents=100, heterogeneity="heterogeneous")
    alg = make(fj.schedule(fj.optim.inverse_time, eta0=0.3, k0=100.0), 10)
    T, n = 30, 1000
    exact = fj.theory.exact_mse(problem, alg, T)
    res = fj.simulate(jax.random.key(11), problem, alg, T, n, record_every=5)
    assert res.rounds[0] == 0 and res.mse_sem[0] == 0  # the start is deterministic
    z = (res.mse_mean[1:] - exact[res.rounds[1:]]) / res.mse_sem[1:]
    assert np.all(np.abs(z) < Z_TOL), z
    assert exact[T] < 0.8 * exact[5]  # the curve moves over the horizon: the check has power


# ------------------------------------------------------------------ the exact theory's time


def test_a_random_stop_finishes_only_its_possible_outcomes(het_gaussian, monkeypatch):
    """A straggler's law puts its mass on two counts of 10: SCAFFLSA's control-variate update (a dense
    map of the whole moment) runs for those two outcomes only, not for all ten (five times the rounds'
    cost at H = 20, hours at H = 1000), and ``round_operations`` counts what runs."""
    from fedsa_jax.moments import recursion_of
    from fedsa_jax.moments.phases import RandomStop

    ended = []
    original = RandomStop._ended
    monkeypatch.setattr(
        RandomStop, "_ended", lambda self, k, *a, **kw: ended.append(k) or original(self, k, *a, **kw)
    )
    alg = fj.scafflsa(0.05, fj.local_work.straggler(10, 0.3, 0.5, normalization="fednova"))
    fj.theory.exact_mse(het_gaussian, alg, 2)
    assert set(ended) == {4, 9}, sorted(set(ended))
    rec, etas = _rounds._recursion(recursion_of(alg, het_gaussian), alg, 1)
    assert _rounds.round_operations(rec, 0, etas[0]) == (10, 5)  # a broadcast, the stop, 2 finishes, the sum
    cost = engine.exact_cost(het_gaussian, alg, 60)
    assert cost is not None and (cost.dim, cost.local_steps, cost.maps, cost.rounds) == (
        rec.state.D,
        10,
        5,
        60,
    )
