"""Delayed updates (fj.delays): agent c's update of round t starts from theta_{t - tau_c} (FedLSA, SCAFFLSA).

* Every seed's iterate, round by round, equals a numpy loop written from the definition (the
  buffer of past iterates, each agent's stale start, the message against it moving the current
  iterate), on Gaussian LSA and TD (generative and Markov), with local work and a lossy channel too.
* No delay (``fixed(0)``) is no argument: the same configuration, bitwise the same run.
* Monte Carlo within Z_TOL standard errors of exact_mse at every round (fixed, uniform, shared,
  geometric delays; Gaussian LSA and generative TD, float64); the limit is the undelayed one.
* Bad input is a one-line error before compiling.
"""

import jax
import numpy as np
import pytest
from reference import (
    assert_result_matches_exact,
    check_against_loop,
    gaussian_loop,
    monte_carlo_jointly,
    step_trajectories_jointly,
    td_loop,
)

import fedsa_jax as fj

LAWS = {
    "fixed": lambda: fj.delays.fixed(2),
    "uniform": lambda: fj.delays.uniform(3),
    "shared": lambda: fj.delays.uniform(2, shared=True),
    "geometric": lambda: fj.delays.geometric(1.0, 3),
}


def _td_round_cases():
    """The TD round-by-round cases (FedLSA and SCAFFLSA): ``(test, index, alg)``."""
    work = fj.local_work.uniform(1, 3, normalization="fednova")
    q = fj.channel.stochastic_uniform(bits=3)
    return [
        ("fedlsa", 0, fj.fedlsa(0.1, 2, delays=fj.delays.uniform(2))),
        ("fedlsa", 1, fj.fedlsa(0.1, work, delays=fj.delays.fixed(1), success_prob=0.7)),
        ("scafflsa", 0, fj.scafflsa(0.1, 2, delays=fj.delays.uniform(2))),
        ("scafflsa", 1, fj.scafflsa(0.1, 3, delays=fj.delays.fixed(1), quantizer=q, success_prob=0.7)),
    ]


@pytest.fixture(scope="module")
def step_runs(het_gaussian, tiny_td_sampled):
    """``(test, case, problem key) -> (problem, alg, T, trajectories)``: every seed's every round (3
    seeds, key 11) of the round-by-round tests below from the algorithms' own steps, the algorithms of
    one problem traced into one compiled program (``step_trajectories_jointly``)."""
    gaussian = [("fedlsa", law, fj.fedlsa(0.05, 3, delays=LAWS[law]())) for law in LAWS]
    gaussian.append(("scafflsa", "geometric", fj.scafflsa(0.05, 3, delays=fj.delays.geometric(1.0, 3))))
    groups = [(het_gaussian, "gaussian", 7, gaussian)]
    groups += [(tiny_td_sampled[s], s, 6, _td_round_cases()) for s in ("generative", "markov")]
    runs = {}
    for problem, name, T, cases in groups:
        got = step_trajectories_jointly(problem, [c[2] for c in cases], jax.random.key(11), T, 3)
        runs.update({(test, case, name): (problem, alg, T, g) for (test, case, alg), g in zip(cases, got)})
    return runs


def _check_steps(runs, loop, *case):
    problem, alg, T, got = runs[case]
    check_against_loop(problem, alg, loop, T=T, num_seeds=3, driver=False, trajectories=got)


@pytest.mark.parametrize("law", list(LAWS))
def test_gaussian_round_by_round_against_numpy(step_runs, law):
    _check_steps(step_runs, gaussian_loop, "fedlsa", law, "gaussian")


@pytest.mark.parametrize("sampling", ["generative", "markov"])
def test_td_round_by_round_against_numpy(step_runs, sampling):
    for case in (0, 1):
        _check_steps(step_runs, td_loop, "fedlsa", case, sampling)


def test_no_delay_is_today_bitwise(het_gaussian):
    assert fj.delays.fixed(0) is None and fj.delays.uniform(0) is None
    a = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 3, delays=fj.delays.fixed(0)), 5, 16, keep_seeds=16)
    b = fj.simulate(1, het_gaussian, fj.fedlsa(0.05, 3), 5, 16, keep_seeds=16)
    np.testing.assert_array_equal(a.seed_mse, b.seed_mse)
    assert a.config == b.config


@pytest.fixture(scope="module")
def monte_carlo_runs(het_gaussian, tiny_td_sampled):
    """``(test, law) -> (problem, alg, result)``: the Monte Carlo runs (8 rounds, 4000 seeds) of the
    tests below, those of one problem side by side (``monte_carlo_jointly``: each is the lone run,
    checked on its own with the same tolerance)."""
    td = tiny_td_sampled["generative"]
    groups = [
        (
            het_gaussian,
            [("fedlsa", law, fj.fedlsa(0.05, 3, delays=LAWS[law]())) for law in LAWS]
            + [("scafflsa", law, fj.scafflsa(0.05, 3, delays=LAWS[law]())) for law in ("uniform", "shared")],
        ),
        (td, [("td", law, fj.fedlsa(0.1, 2, delays=LAWS[law]())) for law in ("uniform", "shared")]),
    ]
    runs = {}
    for problem, cases in groups:
        results = monte_carlo_jointly(problem, [alg for _, _, alg in cases], T=8, n=4000)
        runs.update({(test, law): (problem, alg, res) for (test, law, alg), res in zip(cases, results)})
    return runs


def _check_monte_carlo(runs, test, law):
    problem, alg, res = runs[test, law]
    assert_result_matches_exact(problem, alg, res, T=8, n=4000)
    return alg


@pytest.mark.parametrize("law", list(LAWS))
def test_monte_carlo_matches_exact_mse_gaussian(monte_carlo_runs, law):
    _check_monte_carlo(monte_carlo_runs, "fedlsa", law)


@pytest.mark.parametrize("sampling", ["generative", "markov"])
def test_scafflsa_round_by_round_against_numpy(step_runs, sampling):
    """SCAFFLSA: agent c's steps from its stale start with its current xi_c, its update against that
    start moving the current iterate and its control variate (the loop's messages)."""
    for case in (0, 1):
        _check_steps(step_runs, td_loop, "scafflsa", case, sampling)
    _check_steps(step_runs, gaussian_loop, "scafflsa", "geometric", "gaussian")


@pytest.mark.parametrize("law", ["uniform", "shared"])
def test_scafflsa_monte_carlo_matches_exact_and_the_limit_is_theta_star(het_gaussian, monte_carlo_runs, law):
    alg = _check_monte_carlo(monte_carlo_runs, "scafflsa", law)
    mean = fj.theory.exact_mean(het_gaussian, alg, 3000)[-1]
    np.testing.assert_allclose(mean, np.asarray(het_gaussian.theta_star), rtol=0, atol=1e-9)


@pytest.mark.parametrize("law", ["uniform", "shared"])
def test_monte_carlo_matches_exact_mse_td(monte_carlo_runs, law):
    _check_monte_carlo(monte_carlo_runs, "td", law)


def test_the_limit_is_the_undelayed_one_and_shared_differs_in_the_second_moment(het_gaussian):
    star = np.asarray(het_gaussian.theta_star)
    limit = star + fj.theory.fedlsa_bias(het_gaussian, 0.05, 3)
    for law in LAWS.values():
        mean = fj.theory.exact_mean(het_gaussian, fj.fedlsa(0.05, 3, delays=law()), 3000)[-1]
        np.testing.assert_allclose(mean, limit, rtol=0, atol=1e-9)
    own, shared = (fj.fedlsa(0.05, 3, delays=fj.delays.uniform(2, shared=s)) for s in (False, True))
    m_own, m_shared = (fj.theory.exact_mean(het_gaussian, a, 10) for a in (own, shared))
    np.testing.assert_allclose(m_own, m_shared, rtol=1e-12, atol=1e-12)  # the mean needs the marginals only
    e_own, e_shared = (fj.theory.exact_mse(het_gaussian, a, 10) for a in (own, shared))
    assert np.max(np.abs(e_own - e_shared)) > 1e-3  # the second moment needs the joint law


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: fj.delays.fixed(-1), r"^tau=-1 is invalid: expected an integer >= 0"),
        (lambda: fj.delays.uniform(-2), r"^tau_max=-2 is invalid: expected an integer >= 0"),
        (
            lambda: fj.delays.geometric(2.0),
            r"^tau_max=None is invalid: expected an integer >= 0: a delay law needs a bounded support",
        ),
        (lambda: fj.delays.law([0.5, -0.5]), r"^pmf=.* is invalid"),
        (lambda: fj.fedlsa(0.1, 2, delays=3), r"^delays=3 is invalid: expected None or a law of fj.delays"),
        (
            lambda: fj.fedlsa(
                0.1, 2, delays=fj.delays.fixed(1), downlink=fj.channel.channel(fj.channel.top_k(1))
            ),
            r"^delays='fixed' is invalid: delayed updates with a compressed downlink",
        ),
    ],
)
def test_bad_delays_are_one_line_errors(build, match):
    with pytest.raises(ValueError, match=match) as e:
        build()
    assert "\n" not in str(e.value)


def test_a_law_for_other_agents_is_refused_before_compiling(het_gaussian):
    alg = fj.fedlsa(0.05, 2, delays=fj.delays.law([[0.5, 0.5], [1.0, 0.0]]))  # 2 laws, 3 agents
    with pytest.raises(ValueError, match=r"^delays=.* is invalid: expected one law, or one per agent \(3\)"):
        fj.simulate(0, het_gaussian, alg, 2, 2)


def test_command_line(tmp_path, capsys):
    """``--delays``: the law in the result file, the exact curve beside it; a bad law exits 2."""
    from fedsa_jax.cli import main

    out = tmp_path / "run"
    args = ["run", "--problem", "garnet", "--states", "5", "--agents", "3", "--dim", "2", "--seeds", "8"]
    args += ["--rounds", "4", "--local-steps", "2", "--algorithms", "fedlsa", "--out", str(out)]
    assert main([*args, "--delays", "uniform:2", "--delays-shared"]) == 0
    delays = fj.load(out / "result_fedlsa.npz").config["algorithm"]["delays"]
    assert delays["law"] == "uniform" and delays["shared"] is True and len(delays["pmf"][0]) == 3
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*args, "--delays", "fixed:1,2"])
    assert e.value.code == 2 and "--delays: expected none, fixed:TAU" in capsys.readouterr().err
    assert main([*args, "--delays", "fixed:-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "--delays='fixed:-1' is invalid: tau=-1: expected an integer >= 0" in err
    )


def test_with_the_wrappers(het_gaussian):
    """Averaging and the bootstrap run delayed algorithms (the main trajectory bit for bit); the
    plug-in refuses them."""
    alg = fj.fedlsa(0.05, 3, delays=fj.delays.uniform(2))
    plain = fj.simulate(1, het_gaussian, alg, 5, 8, keep_seeds=8)
    boot = fj.simulate(1, het_gaussian, fj.bootstrap(alg, 3), 5, 8, keep_seeds=8)
    np.testing.assert_array_equal(boot.seed_mse, plain.seed_mse)
    avg = fj.averaged(alg)
    res = fj.simulate(1, het_gaussian, avg, 6, 2000)
    exact = fj.theory.exact_mse(het_gaussian, avg, 6)
    assert np.all(np.abs(res.mse_mean[1:] - exact[1:]) < 4.5 * res.mse_sem[1:])
    with pytest.raises(ValueError, match="delayed"):
        fj.plug_in(alg)
