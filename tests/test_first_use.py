"""What a new user meets first: SCAFFLSA refuses random per-agent local work with plain averaging (a
numpy loop of the definition shows why), warnings name the algorithm in a few settings, figure titles
name every law and the privacy mechanism, ``fedsa-jax --version``."""

import functools
import re
import warnings

import jax
import numpy as np
import pytest

import fedsa_jax as fj
from fedsa_jax import cli
from fedsa_jax._runtime.driver import settings


def scafflsa_mean_loop(A, b, eta, counts, rule):
    """SCAFFLSA (Mangold et al. 2024, Algorithm 2) on the noise-free mean system ``(A_c, b_c)`` from
    its definition, with the agents' counts ``counts (T, N)``: local steps ``theta <- theta - eta
    (A_c theta - b_c - xi_c)``, plain averaging, and the control variates moved by ``"own"``:
    ``(theta_{t+1} - theta^c) / (eta H_c)`` (the agent's own count) or ``"scaffold"``: SCAFFOLD's
    option II with each agent's count, ``(theta_t - theta^c) / (eta H_c)`` less its mean over the
    agents. Returns ``|theta_t - theta*|^2`` per round."""
    N, d = b.shape
    star = np.linalg.solve(A.sum(0), b.sum(0))
    theta, xi, out = np.zeros(d), np.zeros((N, d)), []
    for H in counts:
        local = np.repeat(theta[None], N, 0)
        for c in range(N):
            for _ in range(H[c]):
                local[c] -= eta * (A[c] @ local[c] - b[c] - xi[c])
        new = local.mean(0)
        if rule == "own":
            xi = xi + (new - local) / (eta * H[:, None])
        else:
            g = (theta - local) / (eta * H[:, None])
            xi = xi + g - g.mean(0)
        theta = new
        out.append(np.sum((theta - star) ** 2))
    return np.array(out)


def test_scafflsa_own_count_rule_diverges_from_its_definition():
    """The reason for the refusal below: with counts drawn per agent each round, the rule that divides
    by the agent's own count (what the kernel runs, tests/test_local_work.py) grows without bound on
    the noise-free mean system, faster at the smaller step; a shared count and fixed counts do not,
    and SCAFFOLD's centred rule converges to theta* (power: the same loop, the same counts)."""
    rng = np.random.default_rng(0)
    N, d, T = 6, 3, 150
    Q = rng.normal(size=(N, d, d))
    A = np.eye(d) + 0.3 * Q @ Q.transpose(0, 2, 1) / d
    b = 2.0 * rng.normal(size=(N, d))
    draws = np.random.default_rng(1)
    independent = draws.integers(1, 11, size=(T, N))  # uniform:1,10 per agent
    shared = np.repeat(draws.integers(1, 11, size=(T, 1)), N, 1)
    fixed = np.tile(np.arange(1, N + 1), (T, 1))
    for eta in (0.01, 0.002):
        own = scafflsa_mean_loop(A, b, eta, independent, "own")
        assert own[-1] > 1e6 * own[0], (eta, own[[0, -1]])
        assert scafflsa_mean_loop(A, b, eta, shared, "own")[-1] < 0.05 * own[0]
        assert scafflsa_mean_loop(A, b, eta, independent, "scaffold")[-1] < 0.05 * own[0]
    assert np.isfinite(scafflsa_mean_loop(A, b, 0.01, fixed, "own")[-1])  # bounded: theta_H, not theta*


@pytest.mark.parametrize(
    "law",
    [
        lambda: fj.local_work.uniform(1, 10),
        lambda: fj.local_work.straggler(10, 0.3, 0.5),
        lambda: fj.local_work.geometric(4, 10),
    ],
)
def test_scafflsa_refuses_random_counts_per_agent_with_plain_averaging(law):
    with pytest.raises(
        ValueError, match=r"^local_work='\w+' is invalid: SCAFFLSA diverges with counts drawn per"
    ):
        fj.scafflsa(0.05, law())


def test_scafflsa_takes_the_laws_that_converge():
    for law in (
        fj.local_work.uniform(1, 10, shared=True),
        fj.local_work.uniform(1, 10, normalization="fednova"),
        fj.local_work.fixed([1, 3, 6]),
    ):
        assert fj.scafflsa(0.05, law).config.local_work == law
    assert fj.fedlsa(0.05, fj.local_work.uniform(1, 10)).config.local_work is not None


def test_cli_refuses_scafflsa_random_work_naming_the_flag(tmp_path, capsys):
    argv = ["run", "--local-work", "straggler:0.3,0.5", "--no-plot", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedsa-jax: error: --local-work='straggler:0.3,0.5'")
    assert "--work-normalization fednova" in err and "--local-work-shared" in err, err


def test_settings_name_each_law_and_no_table():
    alg = fj.fedbuff(0.05, 1000, buffer_size=5, durations=fj.clock.straggler(1, 0.1, 20.0))
    assert settings(alg) == (
        "fedbuff (step_size=0.05, num_local_steps=1000, buffer_size=5, durations=straggler, staleness=0.5)"
    )
    lossy = fj.fedlsa(
        0.05,
        fj.local_work.straggler(10, 0.3, 0.5, normalization="fednova"),
        delays=fj.delays.uniform(6),
        quantizer=fj.channel.stochastic_uniform(4),
        success_prob=0.6,
    )
    text = settings(lossy)
    assert "local_work=straggler fednova" in text and "delays=uniform" in text and "pmf" not in text
    assert "quantizer=stochastic_uniform" in text and "success_prob=0.6" in text, text
    assert (
        settings(fj.fedlsa(0.05, [1, 2, 3, 4, 5, 6])) == "fedlsa (step_size=0.05, num_local_steps=[6 values])"
    )


def test_divergence_warning_is_short_with_a_long_law():
    problem = fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=3, dim=4, heterogeneity=1.0)
    law = fj.local_work.law(np.full(60, 1 / 60), normalization="fednova")  # a 60-entry table
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fj.simulate(0, problem, fj.scafflsa(5.0, law), 5, 4)
    (text,) = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert text.startswith("scafflsa (step_size=5.0, num_local_steps=60, local_work=law fednova)"), text
    assert "seeds diverged" in text and len(text) < 400 and "0.0166" not in text


def test_titles_name_delays_fedbuff_and_the_privacy_mechanism():
    from types import SimpleNamespace

    from fedsa_jax.cli.parser import build_parser
    from fedsa_jax.cli.titles import run_title

    problem = SimpleNamespace(num_agents=10, dim=8)
    title = lambda *argv: run_title(build_parser().parse_args(["run", *argv]), problem)  # noqa: E731
    assert "delays uniform:6" in title("--delays", "uniform:6")
    assert "delays uniform:6 shared" in title("--delays", "uniform:6", "--delays-shared")
    buffered = title("--algorithms", "fedbuff", "--buffer-size", "5", "--durations", "straggler:1,0.1,20")
    assert "buffer K=5" in buffered and "durations straggler:1,0.1,20" in buffered, buffered
    assert "staleness $(1+\\tau)^{-0.5}$" in buffered, buffered
    plain = title()
    assert not any(word in plain for word in ("delays", "buffer", "durations", "DP")), plain
    private = title(
        "--algorithms", "fedlsa", "--clip-norm", "1", "--noise-multiplier", "1.1", "--dp-mode", "local"
    )
    assert private.endswith(r", DP local: clip C=1, $\sigma$=1.1"), private
    adaptive = title("--algorithms", "fedlsa", "--clip-norm", "1", "--target-quantile", "0.5")
    assert "clip C=1 adaptive (quantile 0.5), no noise" in adaptive, adaptive


def test_clipped_run_draws_no_unclipped_bias_line(tmp_path, capsys):
    tiny = "--agents 4 --states 6 --dim 2 --local-steps 2 --rounds 3 --seeds 4".split()
    argv = ["run", *tiny, "--algorithms", "fedlsa", "--no-plot", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    assert "predicted squared bias" in capsys.readouterr().out
    assert cli.main([*argv, "--clip-norm", "1", "--noise-multiplier", "1.1"]) == 0
    assert "predicted squared bias" not in capsys.readouterr().out


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedsa-jax {fj.__version__}"


# --- the exact theory's time: announced, timed, refused when it cannot finish


def _never(*args, **kwargs):
    raise AssertionError("ran: the refusal must come before anything runs")


def test_exact_refuses_what_cannot_finish_before_anything_runs(tmp_path, capsys, monkeypatch):
    """FedLSA with delays: 3000 rounds of the 217 x 217 moment (about an hour) are refused in one line
    naming the sizes, the limit and the flags, before the simulation and the exact curve."""
    monkeypatch.setattr(fj, "simulate", functools.wraps(fj.simulate)(_never))  # its arguments still checked
    monkeypatch.setattr(fj.theory, "exact_mse", _never)
    argv = ["run", "--algorithms", "fedlsa", "--delays", "uniform:6", "-H", "10", "--rounds", "3000"]
    assert cli.main([*argv, "--exact", "--no-plot", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(
        "fedsa-jax: error: --exact is invalid: the exact MSE of fedlsa would take roughly"
    ), err
    assert "(3000 rounds of 10 local steps and 11 maps on a 217 x 217 moment) > the limit of 30 min" in err
    assert err.endswith("lower --local-steps or --rounds, or run without --exact"), err


TINY = "--agents 3 --states 6 --dim 2 --local-steps 2 --rounds 3 --seeds 4 --algorithms fedlsa".split()


def test_exact_parts_are_announced_when_long_and_each_timed(tmp_path, capsys, monkeypatch):
    from fedsa_jax.cli import limits

    monkeypatch.setattr(limits, "LONG_EXACT_S", 0.0)  # every part "long"
    assert cli.main(["run", *TINY, "--exact", "--no-plot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "fedlsa    exact MSE: roughly 0 s (3 rounds of 2 local steps and 2 maps on a 9 x 9 moment)..." in out
    )
    assert "fedlsa    stationary MSE: roughly 0 s (GMRES, up to 45 rounds of 2 local steps" in out, out
    assert re.search(r"exact final MSE [0-9.e+-]+ \([0-9.]+ s\)", out), out
    assert re.search(r"stationary MSE [0-9.e+-]+ \(the limit with this constant step; [0-9.]+ s\)", out), out


def test_a_stationary_mse_too_long_is_skipped_with_its_sizes(tmp_path, capsys, monkeypatch):
    from fedsa_jax.cli import limits
    from fedsa_jax.theory.engine import exact_cost

    monkeypatch.setattr(fj.theory, "stationary_mse", _never)
    cost = exact_cost(*_tiny_problem_and_algorithm(), 3)
    assert cost is not None and cost.stationary_rounds == 45
    monkeypatch.setattr(limits, "MAX_EXACT_S", cost.seconds(10))  # the curve's 3 rounds pass, 45 do not
    assert cli.main(["run", *TINY, "--exact", "--no-plot", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "exact final MSE" in captured.out and "stationary MSE" not in captured.out
    assert "fedsa-jax: no stationary MSE for fedlsa: it would take roughly 0 s (GMRES, up to 45 rounds" in (
        captured.err
    ), captured.err


def _tiny_problem_and_algorithm():
    from fedsa_jax.cli.build import _make_algorithm, _make_problem
    from fedsa_jax.cli.parser import build_parser

    args = build_parser().parse_args(["run", *TINY])
    args.params = {}
    return _make_problem(args, jax.random.key(args.problem_seed)), _make_algorithm("fedlsa", args)
