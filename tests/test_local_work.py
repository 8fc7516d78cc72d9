"""Heterogeneous and random local work (fj.local_work): agent c runs H_{c,t} local steps.

* Every seed's iterate, round by round, equals a numpy loop written from the definitions (agent c
  runs its round's H_c steps, FedNova sends tau / H_c times its update), on Gaussian LSA and TD
  (generative and Markov, where a chain moves only on the steps its agent runs).
* Every agent running the same fixed H is lockstep: the same configuration, bitwise the same run.
* Monte Carlo within Z_TOL standard errors of exact_mse at every round (fixed, random per agent,
  shared, straggler, FedNova; Gaussian LSA and generative TD, float64).
* The closed forms: the exact mean's limit is fedlsa_bias with the law; plain averaging's limit
  tends to the H_c-weighted solution theta_H as eta -> 0, with the first-order term of the guide
  (error O(eta^2)); FedNova's to theta* with its first-order term.
* The counts report the observations drawn, sum_c H_c a round; bad input is a one-line error.
"""

import jax
import numpy as np
import pytest
from conftest import Z_TOL
from reference import (
    assert_result_matches_exact,
    check_against_loop,
    gaussian_loop,
    monte_carlo_jointly,
    run_jointly,
    step_trajectories_jointly,
    td_loop,
)

import fedsa_jax as fj

LAWS = {
    "fixed": lambda: fj.local_work.fixed([1, 3, 5]),
    "uniform": lambda: fj.local_work.uniform(1, 4),
    "shared": lambda: fj.local_work.uniform(2, 5, shared=True),
    "straggler-fednova": lambda: fj.local_work.straggler(4, 0.4, 0.5, normalization="fednova"),
    "geometric": lambda: fj.local_work.geometric(2.0, 5),
}


TD_LAWS = ["fixed", "uniform", "straggler-fednova"]


def _scafflsa_round_cases(law):
    """SCAFFLSA's round-by-round cases of ``law``: ``(problem key, alg)``, Gaussian and lossy Markov TD."""
    return [
        ("gaussian", fj.scafflsa(0.05, SCAFFLSA_LAWS[law]())),
        ("markov", fj.scafflsa(0.1, SCAFFLSA_LAWS[law](), success_prob=0.7)),
    ]


@pytest.fixture(scope="module")
def step_runs(het_gaussian, tiny_td_sampled):
    """``(test, law, problem key) -> (problem, alg, trajectories)``: every seed's every round (3 seeds, 6
    rounds, key 11) of the round-by-round tests below from the algorithms' own steps, the algorithms of
    one problem traced into one compiled program (``step_trajectories_jointly``)."""
    problems = {"gaussian": het_gaussian, **tiny_td_sampled}
    cases = [("fedlsa", law, "gaussian", fj.fedlsa(0.05, LAWS[law]())) for law in LAWS]
    cases += [
        ("td", law, s, fj.fedlsa(0.1, LAWS[law]())) for s in ("generative", "markov") for law in TD_LAWS
    ]
    cases += [("scafflsa", law, p, alg) for law in SCAFFLSA_LAWS for p, alg in _scafflsa_round_cases(law)]
    runs = {}
    for name, problem in problems.items():
        mine = [c for c in cases if c[2] == name]
        got = step_trajectories_jointly(problem, [c[3] for c in mine], jax.random.key(11), 6, 3)
        runs.update({c[:3]: (problem, c[3], g) for c, g in zip(mine, got)})
    return runs


@pytest.mark.parametrize("law", list(LAWS))
def test_gaussian_round_by_round_against_numpy(step_runs, law):
    problem, alg, got = step_runs["fedlsa", law, "gaussian"]
    check_against_loop(problem, alg, gaussian_loop, T=6, num_seeds=3, driver=False, trajectories=got)


@pytest.mark.parametrize("sampling", ["generative", "markov"])
@pytest.mark.parametrize("law", TD_LAWS)
def test_td_round_by_round_against_numpy(step_runs, sampling, law):
    problem, alg, got = step_runs["td", law, sampling]
    check_against_loop(problem, alg, td_loop, T=6, num_seeds=3, driver=False, trajectories=got)


def test_through_the_driver_and_the_counts(tiny_td_sampled):
    problem = tiny_td_sampled["markov"]
    law = fj.local_work.fixed([1, 3, 5])
    check_against_loop(problem, fj.fedlsa(0.1, law), td_loop, T=5, num_seeds=8)  # statistics too
    res = fj.simulate(0, problem, fj.fedlsa(0.1, law), 5, 8)  # the same compiled kernel, another key
    np.testing.assert_array_equal(res.samples, 9 * res.rounds)  # 1 + 3 + 5 observations a round
    # random counts and a cohort's, side by side in one compiled program (each its lone run)
    random, cohort = run_jointly(
        0,
        problem,
        [fj.fedlsa(0.1, fj.local_work.uniform(1, 4)), fj.fedlsa(0.1, law, clients_per_round=2)],
        400,
        64,
    )
    per_round = random.samples[-1] / 400  # E sum_c H_c = 3 x 2.5, a mean over 400 x 64 draws
    assert abs(per_round - 7.5) < Z_TOL * np.sqrt(3 * 1.25 / (400 * 64))
    assert np.all(cohort.samples[1:] < 9 * cohort.rounds[1:])  # only the cohort's counts


def test_lockstep_is_the_integer_and_bitwise_today(het_gaussian):
    assert fj.local_work.fixed([4, 4, 4]) == 4
    assert fj.local_work.law([0, 0, 0, 1]) == 4
    assert fj.local_work.uniform(4, 4, shared=True) == 4
    assert fj.local_work.fixed([4, 4, 4], normalization="fednova") == 4  # tau / H_c = 1
    a = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, fj.local_work.fixed([4, 4, 4])), 5, 16, keep_seeds=16)
    b = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 4), 5, 16, keep_seeds=16)
    np.testing.assert_array_equal(a.seed_mse, b.seed_mse)
    assert a.config == b.config


MC_GAUSSIAN_LAWS = ["fixed", "uniform", "shared", "straggler-fednova"]
MC_TD_LAWS = ["fixed", "geometric", "straggler-fednova"]
MC_SCAFFLSA_LAWS = ["fixed", "fixed-fednova", "uniform-fednova"]


@pytest.fixture(scope="module")
def monte_carlo_runs(het_gaussian, tiny_td_sampled):
    """``(test, law) -> (problem, alg, T, result)``: the Monte Carlo runs (4000 seeds) of the three
    tests below, those of one problem and horizon side by side (``monte_carlo_jointly``: each is the
    lone run, checked on its own with the same tolerance)."""
    td = tiny_td_sampled["generative"]
    groups = [
        (
            het_gaussian,
            8,
            [("fedlsa", law, fj.fedlsa(0.05, LAWS[law]())) for law in MC_GAUSSIAN_LAWS]
            + [("scafflsa", law, fj.scafflsa(0.05, SCAFFLSA_LAWS[law]())) for law in MC_SCAFFLSA_LAWS],
        ),
        (td, 8, [("td", law, fj.fedlsa(0.1, LAWS[law]())) for law in MC_TD_LAWS]),
        (td, 6, [("scafflsa-td", law, fj.scafflsa(0.1, SCAFFLSA_LAWS[law]())) for law in MC_SCAFFLSA_LAWS]),
    ]
    runs = {}
    for problem, T, cases in groups:
        results = monte_carlo_jointly(problem, [alg for _, _, alg in cases], T=T, n=4000)
        runs.update({(test, law): (problem, alg, T, res) for (test, law, alg), res in zip(cases, results)})
    return runs


def _check_monte_carlo(runs, test, law):
    problem, alg, T, res = runs[test, law]
    assert_result_matches_exact(problem, alg, res, T=T, n=4000)


@pytest.mark.parametrize("law", MC_GAUSSIAN_LAWS)
def test_monte_carlo_matches_exact_mse_gaussian(monte_carlo_runs, law):
    _check_monte_carlo(monte_carlo_runs, "fedlsa", law)


@pytest.mark.parametrize("law", MC_TD_LAWS)
def test_monte_carlo_matches_exact_mse_td(monte_carlo_runs, law):
    _check_monte_carlo(monte_carlo_runs, "td", law)


def _theta_H(problem, law):
    """The H_c-weighted solution ``(sum_c E[H_c] A_c)^{-1} sum_c E[H_c] b_c``."""
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    w = law.mean_steps(problem.num_agents)
    return np.linalg.solve(np.einsum("c,cij->ij", w, A), w @ b)


def _first_order(problem, law, eta):
    """The guide's first-order limits: plain averaging
    ``theta_H - eta P^{-1} sum_c E[H_c (H_c - 1) / 2] A_c (b_c - A_c theta_H)``, FedNova
    ``theta* - eta [sum_c A_c]^{-1} sum_c (E[H_c] - 1) / 2 A_c^2 (theta_c* - theta*)``."""
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    N = problem.num_agents
    h = np.arange(1, law.max + 1)
    pmf = law.table(N)
    if law.normalization == "fednova":
        star = np.linalg.solve(A.sum(0), b.sum(0))
        local = np.linalg.solve(A, b[..., None])[..., 0]
        half = (pmf @ h - 1) / 2
        return star - eta * np.linalg.solve(A.sum(0), np.einsum("c,cij,cj->i", half, A @ A, local - star))
    th = _theta_H(problem, law)
    P = np.einsum("c,cij->ij", pmf @ h, A)
    pairs = pmf @ (h * (h - 1) / 2)
    return th - eta * np.linalg.solve(P, np.einsum("c,cij,cj->i", pairs, A, b - A @ th))


@pytest.mark.parametrize("normalization", ["none", "fednova"])
@pytest.mark.parametrize(
    "make",
    [lambda n: fj.local_work.fixed([1, 3, 6], n), lambda n: fj.local_work.uniform(1, 5, normalization=n)],
)
def test_closed_form_limit_and_first_order(het_gaussian, normalization, make):
    problem, law = het_gaussian, make(normalization)
    star = np.asarray(problem.theta_star)
    errors = []
    for eta in (0.02, 0.01, 0.005):
        limit = star + fj.theory.fedlsa_bias(problem, eta, law)
        mean = fj.theory.exact_mean(problem, fj.fedlsa(eta, law), 6000)[-1]
        np.testing.assert_allclose(mean, limit, rtol=0, atol=1e-9)
        errors.append(np.linalg.norm(limit - _first_order(problem, law, eta)))
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    np.testing.assert_allclose(ratios, 4.0, rtol=0.1)  # the first-order term is right: O(eta^2) left
    gap = np.linalg.norm(_theta_H(problem, law) - star)  # objective inconsistency, whatever eta
    bias = np.linalg.norm(fj.theory.fedlsa_bias(problem, 0.005, law))
    if len(set(law.pmf)) == 1:  # one law for every agent: E[H_c] equal, theta_H = theta*
        assert gap < 1e-12
    elif normalization == "none":
        assert gap > 0.05 and bias > 0.5 * gap  # plain averaging stays near theta_H
    else:
        assert bias < 0.1 * gap  # FedNova: O(eta) only


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: fj.local_work.fixed([2, 0, 3]), r"^steps\[1\]=0 is invalid: expected an integer >= 1"),
        (lambda: fj.local_work.fixed([]), r"^steps=.* is invalid: expected one integer >= 1 per agent"),
        (lambda: fj.local_work.uniform(3, 2), r"^high=2 is invalid: expected an integer >= 3"),
        (lambda: fj.local_work.geometric(0.5, 4), r"^mean=0.5 is invalid: expected a real number >= 1"),
        (lambda: fj.local_work.straggler(4, 1.5, 0.5), r"^prob=1.5 is invalid"),
        (lambda: fj.local_work.straggler(4, 0.5, 0.0), r"^fraction=0.0 is invalid"),
        (lambda: fj.local_work.law([0.5, -0.1]), r"^pmf=.* is invalid: expected finite probabilities >= 0"),
        (lambda: fj.local_work.uniform(1, 3, normalization="x"), r"^normalization='x' is invalid"),
        (lambda: fj.local_work.law([[0.5, 0.5], [1, 0]], shared=True), r"^shared=True is invalid"),
    ],
)
def test_bad_laws_are_one_line_errors(build, match):
    with pytest.raises(ValueError, match=match) as e:
        build()
    assert "\n" not in str(e.value)


def test_a_law_for_other_agents_is_refused_before_compiling(het_gaussian):
    alg = fj.fedlsa(0.05, fj.local_work.fixed([1, 2]))  # 2 laws, 3 agents
    with pytest.raises(
        ValueError, match=r"^num_local_steps=.* is invalid: expected one law, or one per agent \(3\)"
    ):
        fj.simulate(0, het_gaussian, alg, 2, 2)
    with pytest.raises(ValueError, match="one law, or one per agent"):
        fj.theory.exact_mse(het_gaussian, alg, 2)


def test_command_line(tmp_path, capsys):
    """``--local-work``: the law in the result file, the counts, the predicted bias of the law; a
    sweep axis over laws; a bad law exits 2 in one line naming the option."""
    import json

    from fedsa_jax.cli import main

    out = tmp_path / "run"
    base = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "8"]
    args = [*base, "--rounds", "4", "--out", str(out), "--algorithms", "fedlsa", "--step-size", "0.1"]
    assert main([*args, "--local-work", "fixed:1,2,4", "--work-normalization", "fednova"]) == 0
    res = fj.load(out / "result_fedlsa.npz")
    work = res.config["algorithm"]["local_work"]
    assert work["law"] == "fixed" and work["normalization"] == "fednova"
    np.testing.assert_array_equal(res.samples, 7 * res.rounds)
    summary = json.loads((out / "summary.json").read_text())
    problem = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=5, dim=2, dtype=np.float32)
    law = fj.local_work.fixed([1, 2, 4], normalization="fednova")
    expected = np.sum(fj.theory.fedlsa_bias(problem, 0.1, law) ** 2)
    np.testing.assert_allclose(summary["fedlsa_predicted_squared_bias"], expected, rtol=1e-6)
    assert (
        main([*args, "--local-steps", "4", "--local-work", "straggler:0.5,0.5", "--local-work-shared"]) == 0
    )
    assert fj.load(out / "result_fedlsa.npz").config["algorithm"]["local_work"]["shared"] is True
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        '[run]\nrounds = 3\nseeds = 4\n[grid]\nproblem = "garnet"\nstates = 5\ndim = 2\nagents = 3\n'
        'algorithm = "fedlsa"\nlocal_work = ["none", "uniform:1,3"]\n'
    )
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "sweep"), "--no-progress"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # its form: refused by the parser
        main([*args, "--local-work", "uniform:1"])
    assert e.value.code == 2 and "--local-work: expected none, fixed:H1" in capsys.readouterr().err
    assert main([*args, "--local-work", "fixed:1,0,2"]) == 2  # its values: by fj.local_work
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "--local-work='fixed:1,0,2' is invalid: steps[1]=0: expected" in err
    ), err


SCAFFLSA_LAWS = {
    "fixed": lambda: fj.local_work.fixed([1, 3, 5]),
    "uniform-shared": lambda: fj.local_work.uniform(1, 4, shared=True),
    "fixed-fednova": lambda: fj.local_work.fixed([1, 3, 5], normalization="fednova"),
    "uniform-fednova": lambda: fj.local_work.uniform(1, 4, normalization="fednova"),
}


@pytest.mark.parametrize("law", list(SCAFFLSA_LAWS))
def test_scafflsa_round_by_round_against_numpy(step_runs, law):
    """SCAFFLSA's control variates divide by the agent's own step sum (plain) or by tau eta
    (FedNova's normalised messages); through a lossy channel too."""
    for p, loop in (("gaussian", gaussian_loop), ("markov", td_loop)):
        problem, alg, got = step_runs["scafflsa", law, p]
        check_against_loop(problem, alg, loop, 6, 3, driver=False, trajectories=got)


@pytest.mark.parametrize("law", MC_SCAFFLSA_LAWS)
def test_scafflsa_monte_carlo_matches_exact_mse(monte_carlo_runs, law):
    _check_monte_carlo(monte_carlo_runs, "scafflsa", law)  # Gaussian LSA, 8 rounds
    _check_monte_carlo(monte_carlo_runs, "scafflsa-td", law)  # generative TD, 6 rounds


def test_scafflsa_limits(het_gaussian):
    """With its own step counts and plain averaging SCAFFLSA's limit is exactly theta_H, the H_c-weighted
    solution (the control variates' conserved quantity is sum_c D_c xi_c, not sum_c xi_c), at every
    step size; FedNova's normalised messages bring it to theta* exactly."""
    star = np.asarray(het_gaussian.theta_star)
    plain, nova = fj.local_work.fixed([1, 3, 6]), fj.local_work.fixed([1, 3, 6], normalization="fednova")
    theta_H = _theta_H(het_gaussian, plain)
    assert np.linalg.norm(theta_H - star) > 0.05
    for eta in (0.05, 0.01):
        limit = fj.theory.exact_mean(het_gaussian, fj.scafflsa(eta, plain), 4000)[-1]
        np.testing.assert_allclose(limit, theta_H, rtol=0, atol=1e-9)
        limit = fj.theory.exact_mean(het_gaussian, fj.scafflsa(eta, nova), 4000)[-1]
        np.testing.assert_allclose(limit, star, rtol=0, atol=1e-9)
    with pytest.raises(
        ValueError, match=r"^algorithm='scafflsa with uniform local work' is invalid: no exact"
    ):
        fj.theory.exact_mse(het_gaussian, fj.scafflsa(0.05, fj.local_work.uniform(1, 4, shared=True)), 3)


def test_with_the_bootstrap_and_the_plug_in(het_gaussian):
    """The bootstrap's main trajectory is the run itself, bit for bit; the plug-in refuses unequal work."""
    alg = fj.fedlsa(0.05, fj.local_work.uniform(1, 4))
    plain = fj.simulate(1, het_gaussian, alg, 5, 8, keep_seeds=8)
    boot = fj.simulate(1, het_gaussian, fj.bootstrap(alg, 4), 5, 8, keep_seeds=8)
    np.testing.assert_array_equal(boot.seed_mse, plain.seed_mse)
    with pytest.raises(ValueError, match="unequal local work"):
        fj.plug_in(alg)


def test_scaffnew_refuses_local_work():
    with pytest.raises(ValueError, match=r"^num_local_steps='uniform' is invalid: Scaffnew's agents"):
        fj.scaffnew(0.1, 0.2, fj.local_work.uniform(1, 3))


def test_exact_recursions_refuse_random_work_under_markov_sampling(tiny_td_sampled):
    alg = fj.fedlsa(0.1, fj.local_work.uniform(1, 3))
    with pytest.raises(ValueError, match="local work under Markov sampling.* is invalid: no exact recursion"):
        fj.theory.exact_mean(tiny_td_sampled["markov"], alg, 3)


def test_scafflsa_plain_stability_on_the_subspace_it_keeps(het_gaussian):
    """With fixed unequal counts and plain averaging SCAFFLSA keeps sum_c H_c xi_c = 0, not sum_c xi_c:
    the stationary mean is theta_H, the long-horizon MSE (assembled operator) equals the round-by-round
    one, and the mean recursion contracts there."""
    alg = fj.scafflsa(0.05, fj.local_work.fixed([1, 3, 5]))
    theta_H = _theta_H(het_gaussian, fj.local_work.fixed([1, 3, 5]))
    np.testing.assert_allclose(fj.theory.stationary_mean(het_gaussian, alg), theta_H, rtol=0, atol=1e-9)
    long, short = fj.theory.exact_mse(het_gaussian, alg, 300), fj.theory.exact_mse(het_gaussian, alg, 20)
    np.testing.assert_allclose(long[:21], short, rtol=1e-9)
    assert fj.theory.mean_spectral_radius(het_gaussian, alg) < 1.0
    bias = np.sum((theta_H - np.asarray(het_gaussian.theta_star)) ** 2)
    assert long[-1] > bias  # the MSE is above its squared bias


# --- each law against its pmf written from its documented definition (not the library's table) ---------


def _geometric_from_one(mean, largest):
    """Geometric on {1, 2, ...} with success probability p = 1 / mean (mean ``mean``), conditioned on
    ``<= largest``: ``P(k) ~ p (1 - p)^(k - 1)``."""
    p = 1.0 / mean
    pmf = {k: p * (1 - p) ** (k - 1) for k in range(1, largest + 1)}
    total = sum(pmf.values())
    return {k: v / total for k, v in pmf.items()}


def _delay_geometric(mean, largest):
    """Geometric on {0, 1, ...} with mean ``mean``: ``P(k) ~ q (1 - q)^k``, q = 1 / (1 + mean)."""
    q = 1.0 / (1.0 + mean)
    pmf = {k: q * (1 - q) ** k for k in range(largest + 1)}
    total = sum(pmf.values())
    return {k: v / total for k, v in pmf.items()}


INDEPENDENT_PMFS = {  # law -> (the library's, its pmf from the definition {count: probability})
    "work-uniform": (lambda: fj.local_work.uniform(2, 5), {h: 0.25 for h in (2, 3, 4, 5)}),
    "work-geometric": (lambda: fj.local_work.geometric(4.0, 30), _geometric_from_one(4.0, 30)),
    "work-straggler": (lambda: fj.local_work.straggler(5, 0.3, 0.5), {5: 0.7, 3: 0.3}),  # ceil(2.5) = 3
    "delays-uniform": (lambda: fj.delays.uniform(3), {k: 0.25 for k in range(4)}),
    "delays-geometric": (lambda: fj.delays.geometric(1.0, 12), _delay_geometric(1.0, 12)),
    "delays-fixed": (lambda: fj.delays.fixed(2), {2: 1.0}),
    "clock-uniform": (lambda: fj.clock.uniform(1, 3), {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}),
    "clock-geometric": (lambda: fj.clock.geometric(4.0, 30), _geometric_from_one(4.0, 30)),
    "clock-straggler": (lambda: fj.clock.straggler(2, 0.2, 2.5), {2: 0.8, 5: 0.2}),  # ceil(5.0) = 5
}


@pytest.mark.parametrize("name", list(INDEPENDENT_PMFS))
def test_each_law_is_its_definition(name):
    """The law's table equals its pmf written here from the documented definition, and 200000 draws
    of ``draw`` (one per agent) follow it: a chi-square test within Z_TOL of its df, each cell's
    frequency within Z_TOL binomial s.e. (power: a geometric with success probability 1 - p, mean
    1.33 for 4, or a straggler's floor instead of its ceiling is far outside)."""
    law, want = INDEPENDENT_PMFS[name][0](), INDEPENDENT_PMFS[name][1]
    counts = np.arange(law.first, law.largest + 1)
    table = dict(zip(counts.tolist(), law.table(1)[0]))
    assert set(k for k, v in table.items() if v > 0) == set(want)
    np.testing.assert_allclose([table[k] for k in want], list(want.values()), rtol=1e-12, atol=0)
    n = 200_000
    drawn = np.asarray(law.draw(jax.random.key(5), n))
    assert set(np.unique(drawn).tolist()) <= set(want)
    p = np.array(list(want.values()))
    seen = np.array([np.sum(drawn == k) for k in want])
    z = (seen / n - p) / np.sqrt(np.maximum(p * (1 - p), 1e-300) / n)
    assert np.all(np.abs(z[p > 0]) < Z_TOL), z
    cells = p * n >= 5
    if cells.sum() > 1:
        chi2 = np.sum((seen[cells] - n * p[cells]) ** 2 / (n * p[cells]))
        df = cells.sum() - 1
        assert (chi2 - df) / np.sqrt(2 * df) < Z_TOL, (chi2, df)
    mean = sum(k * v for k, v in want.items())
    assert abs(drawn.mean() - mean) <= Z_TOL * np.sqrt(sum((k - mean) ** 2 * v for k, v in want.items()) / n)


def test_the_geometric_laws_have_their_means():
    """``geometric(4, max)`` of the local work and the clock has mean 4 (to its truncation), not
    1.33; ``fj.delays.geometric(1.0, max)`` mean 1, not 0 (no delay)."""
    for law in (fj.local_work.geometric(4.0, 200), fj.clock.geometric(4.0, 200)):
        assert law.mean_counts(1)[0] == pytest.approx(4.0, rel=1e-12)
    delays = fj.delays.geometric(1.0, 200)
    assert delays is not None and delays.mean_counts(1)[0] == pytest.approx(1.0, rel=1e-12)
    assert fj.delays.geometric(3.0, 400).mean_counts(1)[0] == pytest.approx(3.0, rel=1e-12)


def test_fednova_tau_is_the_mean_expected_work(het_gaussian):
    """One noise-free FedNova round from theta_0 against numpy written from Wang et al.'s Eq. (6):
    agent c's update after its H_c steps, divided by H_c, averaged, times tau = mean_c E[H_c]
    (3 for H = 1, 3, 5; H_max = 5 would move the iterate 5/3 as far)."""
    from reference import step_trajectories

    problem = fj.problems.expected(het_gaussian)
    A, b = np.asarray(het_gaussian.A_bar), np.asarray(het_gaussian.b_bar)
    law, eta = fj.local_work.fixed([1, 3, 5], normalization="fednova"), 0.05
    assert law.tau(3) == 3.0 and fj.local_work.uniform(1, 4, normalization="fednova").tau(3) == 2.5
    theta0 = np.linspace(-1.0, 1.0, problem.dim)
    updates = []
    for c, H in enumerate([1, 3, 5]):
        theta = theta0.copy()
        for _ in range(H):
            theta = theta - eta * (A[c] @ theta - b[c])
        updates.append((theta - theta0) / H)
    want = theta0 + 3.0 * np.mean(updates, axis=0)
    got = step_trajectories(problem, fj.fedlsa(eta, law), jax.random.key(0), 1, 1, theta0)[0, 1]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert np.linalg.norm(got - (theta0 + 5.0 * np.mean(updates, axis=0))) > 1e-3  # power


# --- a law's table is bounded before it is allocated -------------------------------------------------------


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: fj.delays.uniform(10**9), "tau_max"),
        (lambda: fj.delays.fixed(10**8), "tau"),
        (lambda: fj.delays.geometric(2.0, 2**31 - 1), "tau_max"),
        (lambda: fj.local_work.uniform(1, 2**31 - 1), "high"),
        (lambda: fj.local_work.geometric(2.0, 10**9), "max"),
        (lambda: fj.local_work.straggler(2**30, 0.5, 0.5), "steps"),
        (lambda: fj.local_work.fixed([1, 2**25]), "steps"),
        (lambda: fj.clock.straggler(2**30, 0.5, 4.0), "slowdown"),
        (lambda: fj.clock.straggler(1, 0.5, 1e12), "slowdown"),
        (lambda: fj.clock.geometric([2.0] * 64, 2**19), "max"),
        (lambda: fj.clock.law(np.ones((2, 2**23 + 1))), "pmf"),
    ],
)
def test_huge_laws_are_refused_before_allocating(build, name):
    """A law whose table exceeds 2^24 probabilities is one line naming its parameter, refused before
    the table exists (peak traced memory under 1 MiB beyond the argument; the old code allocated
    up to 7 TiB and ended in MemoryError)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(
            ValueError, match=rf"^{name}=.* is invalid: the law's table .* more than 2\^24"
        ) as e:
            build()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value)
    assert peak < (2**23 + 1) * 2 * 8 + 2**20 if name == "pmf" else peak < 2**20, peak


def test_a_law_too_large_for_its_agents_is_refused_before_compiling(het_gaussian):
    """One row of 2^23 counts is a law; for 3 agents its (N, H_max) table is 3 x 2^23 > 2^24."""
    law = fj.delays.law(np.ones(2**23))
    with pytest.raises(ValueError, match=r"^delays='law' is invalid: the law's table .* = 25165824 values"):
        fj.simulate(0, het_gaussian, fj.fedlsa(0.1, 2, delays=law), 2, 2)
