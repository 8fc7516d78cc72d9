"""Compressed downlink: every algorithm's round with a broadcast to the agents' copy of the model
against a numpy loop written here from its definition, round by round; bits counted per direction;
``downlink=None`` is today's code, bitwise; exact theory; bad values."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from reference import (
    _round_keys,
    assert_result_matches_exact,
    monte_carlo_by_family,
    run_jointly,
    scaffnew_coins,
)
from test_error_feedback import compress

import fedsa_jax as fj

N, D = 3, 4  # agents, dimension
KEY = jax.random.key(5)
THETA0 = np.linspace(-1.0, 2.0, D)


@pytest.fixture(scope="module")
def flat():
    """A noise-free heterogeneous Gaussian LSA problem: runs are deterministic without erasures."""
    p = fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=N, dim=D, heterogeneity=1.0)
    return fj.problems.expected(p)


def downlink_uniforms(t, H=None):
    """The uniforms ``(d,)`` of seed 0's round-t broadcast: the downlink key is ``fold_in(k_channel,
    1)``, its quantizer draws as the uplink's agent 0 of one sender; Scaffnew: one per local step."""
    key = jax.random.fold_in(_round_keys(KEY, 0, t)[1], 1)
    keys = [key] if H is None else list(jax.random.split(key, H))
    out = [jax.random.uniform(jax.random.split(jax.random.split(k)[0], 1)[0], (D,), np.float64) for k in keys]
    return [np.asarray(u) for u in out]


class Downlink:
    """The server's side of the broadcast in numpy: ``hat <- hat + C(theta - hat)``."""

    def __init__(self, ch):
        self.ch, self.hat = ch, THETA0.copy()

    def send(self, theta, u):
        if self.ch.quantizer.kind == "identity":
            self.hat = theta.copy()
        else:
            self.hat = self.hat + compress(self.ch.quantizer, u, theta - self.hat)


def loop(problem, name, alg, T):
    """FedLSA, SCAFFLSA, QFedTD or Scaffnew with an exact uplink and a compressed downlink on the
    noise-free problem: ``(thetas (T+1, d), hats (T+1, d))``, the random draws those of seed 0."""
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    cfg = alg.config
    eta, H = float(cfg.step_size), cfg.num_local_steps
    down = Downlink(cfg.downlink)
    theta, xi, x = THETA0.copy(), np.zeros((N, D)), np.tile(THETA0, (N, 1))
    thetas, hats = [theta.copy()], [down.hat.copy()]
    for t in range(T):
        if name == "scaffnew":
            p = float(cfg.comm_prob)
            coins, us = scaffnew_coins(KEY, 0, t, H, p), downlink_uniforms(t, H)
            for h in range(H):
                x = np.stack([x[c] - eta * (A[c] @ x[c] - b[c] - xi[c]) for c in range(N)])
                if coins[h]:
                    m = x - down.hat
                    xi = xi + (p / eta) * (m.mean(0) - m)
                    theta = theta + m.mean(0)  # the server's x_sync
                    down.send(theta, us[h])
                    x = np.tile(down.hat, (N, 1))
            thetas.append(x.mean(0))
            hats.append(down.hat.copy())
            continue
        if name == "qfedtd":
            theta = theta + eta * np.mean([b[c] - A[c] @ down.hat for c in range(N)], axis=0)
        else:
            local = np.tile(down.hat, (N, 1))
            for _ in range(H):
                local = np.stack([local[c] - eta * (A[c] @ local[c] - b[c] - xi[c]) for c in range(N)])
            m = local - down.hat
            if name == "scafflsa":
                xi = xi + (m.mean(0) - m) / (eta * H)
            theta = theta + m.mean(0)
        down.send(theta, downlink_uniforms(t)[0])
        thetas.append(theta.copy())
        hats.append(down.hat.copy())
    return np.array(thetas), np.array(hats)


def simulate_jointly(problem, algs, T):
    """The library's runs of seed 0 of ``algs``, side by side in one compiled program (``run_jointly``:
    each is the algorithm's lone run with the driver's keys, to float rounding): a list of
    ``(thetas (T+1, d), hats (T+1, d))`` (the copy in the state)."""

    def coordinate(i):
        return lambda s, p: s.hat[i] + p.theta_star[i]

    metrics = {f"h{i}": coordinate(i) for i in range(D)}
    results = run_jointly(KEY, problem, algs, T, 1, group=len(algs), theta0=THETA0, metrics=metrics)
    return [
        (np.asarray(res.theta_mean), np.stack([res.metrics[f"h{i}"].mean for i in range(D)], axis=-1))
        for res in results
    ]


MAKERS = {
    "fedlsa": lambda **kw: fj.fedlsa(0.1, 3, **kw),
    "scafflsa": lambda **kw: fj.scafflsa(0.1, 3, **kw),
    "qfedtd": lambda **kw: fj.qfedtd(0.2, **kw),
    "scaffnew": lambda **kw: fj.scaffnew(0.1, 0.5, 3, **kw),
}
DOWNLINKS = {
    "top_k": fj.channel.channel(fj.channel.top_k(2)),
    "rand_k_unscaled": fj.channel.channel(fj.channel.rand_k(2, unbiased=False)),
    "identity": fj.channel.channel(),
    "rand_k": fj.channel.channel(fj.channel.rand_k(2)),
    "scaled_sign": fj.channel.channel(fj.channel.scaled_sign()),
}
CASES = [
    ("fedlsa", "top_k"),
    ("fedlsa", "rand_k_unscaled"),
    ("scafflsa", "identity"),
    ("scafflsa", "rand_k"),
    ("qfedtd", "scaled_sign"),
    ("scaffnew", "rand_k_unscaled"),
]


@pytest.fixture(scope="module")
def seed_0_runs(flat):
    """``case -> (thetas, hats)``: the library's seed 0 of every case of CASES over 6 rounds, all in
    one compiled program; each test below checks its own case."""
    runs = simulate_jointly(flat, [MAKERS[name](downlink=DOWNLINKS[down]) for name, down in CASES], 6)
    return dict(zip(CASES, runs))


@pytest.mark.parametrize(("name", "downlink"), CASES)
def test_rounds_match_numpy_loop(flat, seed_0_runs, name, downlink):
    """Without erasures each algorithm with a compressed downlink is the numpy loop, round by round
    (the server's model and the agents' copy), to float64 rounding."""
    alg = MAKERS[name](downlink=DOWNLINKS[downlink])
    got, got_hat = seed_0_runs[name, downlink]
    want, want_hat = loop(flat, name, alg, 6)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_hat, want_hat, rtol=1e-12, atol=1e-12)
    if downlink != "identity":  # the copy lags the model: the test sees the downlink at work
        assert np.max(np.abs(got_hat - got)) > 1e-6


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_downlink_none_is_todays_code_bitwise(het_gaussian, name):
    """``downlink=None`` is the algorithm as before: same config and description, no downlink state,
    and an identity downlink runs the same iterates (bitwise) with its bits counted on top."""
    q = fj.channel.rand_k(2)
    alg = MAKERS[name](quantizer=q)
    assert MAKERS[name](quantizer=q, downlink=None) == alg
    assert "downlink" not in alg.describe()
    assert alg.init(KEY, het_gaussian, np.zeros(3)).hat == ()
    exact = MAKERS[name](quantizer=q, downlink=fj.channel.channel())
    a = fj.simulate(KEY, het_gaussian, alg, 4, 8)
    b = fj.simulate(KEY, het_gaussian, exact, 4, 8)
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    np.testing.assert_array_equal(a.mse_mean, b.mse_mean)


def test_bits_counted_per_direction(flat, tmp_path):
    """Uplink and downlink bits are counted apart (a broadcast once per receiving agent, Scaffnew's at
    each communication), the totals are their sum, and files and tables carry both."""
    T, up, down = 5, fj.channel.rand_k(2), fj.channel.top_k(1)
    res = fj.simulate(KEY, flat, fj.fedlsa(0.1, 2, quantizer=up, downlink=fj.channel.channel(down)), T, 2)
    t = np.arange(T + 1)
    np.testing.assert_array_equal(res.uplink_bits_sent, t * N * up.bits(D))
    np.testing.assert_array_equal(res.downlink_bits_sent, t * N * down.bits(D))
    np.testing.assert_array_equal(res.downlink_bits_delivered, res.downlink_bits_sent)
    np.testing.assert_array_equal(res.bits_sent, t * N * (up.bits(D) + down.bits(D)))
    np.testing.assert_array_equal(res.bits_delivered, res.uplink_bits_delivered + res.downlink_bits_delivered)
    res.save(tmp_path / "r.npz")
    back = fj.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(back.downlink_bits_sent, res.downlink_bits_sent)
    np.testing.assert_array_equal(back.uplink_bits_sent, res.uplink_bits_sent)
    table = res.table()
    np.testing.assert_array_equal(table["downlink_bits_sent"], res.downlink_bits_sent)
    np.testing.assert_array_equal(table["uplink_bits_delivered"], res.uplink_bits_delivered)
    alg = fj.scaffnew(0.1, 0.5, 3, downlink=fj.channel.channel(down))
    res = fj.simulate(KEY, flat, alg, 3, 1)
    talks = sum(scaffnew_coins(KEY, 0, r, 3, 0.5).sum() for r in range(3))
    assert res.downlink_bits_sent[-1] == talks * N * down.bits(D)
    assert res.uplink_bits_sent[-1] == talks * N * 32 * D


def test_files_without_directions_load_and_damaged_directions_refused(het_gaussian, tmp_path):
    """A file of an earlier version (no arrays per direction) loads as all uplink; a file whose uplink
    and downlink bits do not add up to the totals is refused, naming them."""
    res = fj.simulate(KEY, het_gaussian, fj.fedlsa(0.1, 2, quantizer=fj.channel.rand_k(2)), 3, 2)
    res.save(tmp_path / "r.npz")
    arrays = dict(np.load(tmp_path / "r.npz"))
    old = {k: v for k, v in arrays.items() if not k.startswith(("uplink_", "downlink_"))}
    np.savez(tmp_path / "old.npz", **old)
    back = fj.load(tmp_path / "old.npz")
    np.testing.assert_array_equal(back.uplink_bits_sent, res.bits_sent)
    np.testing.assert_array_equal(back.downlink_bits_delivered, 0 * res.bits_sent)
    arrays["downlink_bits_sent"] = arrays["downlink_bits_sent"] + 1
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="uplink_bits_sent \\+ downlink_bits_sent is not bits_sent"):
        fj.load(tmp_path / "bad.npz")


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: fj.fedlsa(0.1, 2, downlink=fj.channel.top_k(1)), "downlink"),
        (lambda: fj.scafflsa(0.1, 2, downlink=fj.channel.channel(success_prob=0.5)), "downlink.success_prob"),
        (
            lambda: fj.qfedtd(0.1, downlink=fj.channel.channel(fj.channel.top_k(1), error_feedback="ef21")),
            "downlink.error_feedback",
        ),
        (
            lambda: fj.fedlsa(
                0.1, 2, downlink=fj.channel.channel(fj.channel.top_k(1), error_feedback="ef14")
            ),
            "downlink.error_feedback",
        ),
        (lambda: fj.scaffnew(0.1, 0.5, 2, downlink="top-k"), "downlink"),
    ],
)
def test_bad_downlinks_raise_one_line(make, param):
    with pytest.raises(ValueError, match=rf"^{param}=") as err:
        make()
    assert "\n" not in str(err.value)


def _cli(out, *extra):
    from fedsa_jax import cli

    base = ["run", "--problem", "gaussian", "--agents", "2", "--algorithms", "fedlsa", "--local-steps", "2"]
    return cli.main([*base, "--rounds", "3", "--seeds", "4", "--no-plot", "--out", str(out), *extra])


def test_cli_downlink(tmp_path):
    """``--downlink-quantizer`` builds the downlink (its parameters the uplink's options); its bits go
    to the result apart from the uplink's."""
    assert _cli(tmp_path, "--downlink-quantizer", "top-k", "--k", "2") == 0
    (path,) = tmp_path.glob("*.npz")
    res = fj.load(path)
    assert res.config["algorithm"]["downlink"]["quantizer"]["kind"] == "top_k"
    assert res.downlink_bits_sent[-1] == 3 * 2 * fj.channel.top_k(2).bits(5)
    assert res.uplink_bits_sent[-1] == 3 * 2 * 32 * 5  # the exact uplink: 32 bits a coordinate


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--downlink-quantizer", "gzip"], "argument --downlink-quantizer: invalid choice"),
        (["--downlink-quantizer", "top-k", "--k", "9"], "--k"),
        (["--k", "2", "--downlink-quantizer", "none"], "--k=2 is invalid"),
    ],
)
def test_cli_bad_downlink_exits_2(tmp_path, capsys, extra, option):
    try:
        code = _cli(tmp_path, *extra)
    except SystemExit as err:  # refused by the parser
        code = err.code
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert option in lines[-1] and len(lines[-1]) < 500  # one line, naming the option


def test_sweep_grid_downlink_axes(tmp_path):
    from fedsa_jax import cli

    cfg = tmp_path / "grid.toml"
    cfg.write_text(
        '[run]\nrounds = 3\nseeds = 4\n[grid]\nproblem = "gaussian"\nagents = 2\nlocal_steps = 2\n'
        'algorithm = "fedlsa"\nk = 2\ndownlink_quantizer = ["none", "rand-k-unscaled"]\n'
    )
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress", "--no-plot"]) == 0
    index = json.loads((tmp_path / "o" / "sweep.json").read_text())
    down = {r["config"]["downlink_quantizer"]: fj.load(tmp_path / "o" / r["file"]) for r in index}
    assert "downlink" not in down["none"].config["algorithm"]
    assert down["rand-k-unscaled"].config["algorithm"]["downlink"]["quantizer"]["kind"] == "rand_k"
    assert down["none"].downlink_bits_sent[-1] == 0 < down["rand-k-unscaled"].downlink_bits_sent[-1]


# -- exact theory ---------------------------------------------------------------------------------------

THEORY_CASES = [
    ("gaussian", "fedlsa", fj.channel.rand_k(2), None),
    ("gaussian", "fedlsa", fj.channel.rand_k(1, unbiased=False), fj.channel.rand_k(1, unbiased=False)),
    ("gaussian", "scafflsa", fj.channel.rand_k(2), None),
    ("gaussian", "scaffnew", fj.channel.rand_k(2), None),
    ("td", "qfedtd", fj.channel.rand_k(1), fj.channel.rand_k(1)),
    ("td", "fedlsa", fj.channel.rand_k(1, unbiased=False), None),
]


def _theory_case(tiny_td, het_gaussian, family, name, down, up):
    P, r, Phi = tiny_td
    problem = het_gaussian if family == "gaussian" else fj.problems.federated_td(P, r, Phi, 0.9)
    kw = dict(quantizer=up, downlink=fj.channel.channel(down))
    makers = {
        "fedlsa": lambda: fj.fedlsa(0.2, 2, **kw),
        "scafflsa": lambda: fj.scafflsa(0.2, 2, **kw),
        "scaffnew": lambda: fj.scaffnew(0.2, 0.5, 2, **kw),
        "qfedtd": lambda: fj.qfedtd(0.5, **kw),
    }
    return problem, makers[name]()


@pytest.fixture(scope="module")
def theory_runs(tiny_td, het_gaussian):
    """Case index -> ``(problem, alg, result)``: the Monte Carlo run of every case of THEORY_CASES
    (``monte_carlo_by_family``, 8 rounds, 4000 seeds), the cases of one problem side by side."""
    cases = [_theory_case(tiny_td, het_gaussian, *c) for c in THEORY_CASES]
    return monte_carlo_by_family(cases, [c[0] for c in THEORY_CASES], T=8)


@pytest.mark.parametrize(("family", "name", "down", "up"), THEORY_CASES)
def test_monte_carlo_matches_exact_mse(theory_runs, family, name, down, up):
    """A downlink through rand-k (scaled or not; an uplink compressor or not): the round is linear
    in (state, agents' copy), and the MC MSE is within Z_TOL standard errors of ``exact_mse``
    at every round, the MC mean within Z_TOL of ``exact_mean``."""
    problem, alg, res = theory_runs[THEORY_CASES.index((family, name, down, up))]
    exact = assert_result_matches_exact(problem, alg, res, T=8)
    # the downlink is seen: without it the exact curve differs by more than float64 rounding
    plain = fj.theory.exact_mse(
        problem, _without_downlink(alg), 8, theta0=np.linspace(1.0, -1.0, problem.dim)
    )
    assert np.max(np.abs(plain - exact) / exact) > 1e-8


def _without_downlink(alg):
    return dataclasses.replace(alg, config=dataclasses.replace(alg.config, downlink=None))


def test_theory_refuses_nonlinear_downlinks(het_gaussian):
    for q in (fj.channel.top_k(1), fj.channel.scaled_sign(), fj.channel.qsgd(2)):
        alg = fj.fedlsa(0.1, 2, downlink=fj.channel.channel(q))
        with pytest.raises(ValueError, match=r"^downlink=.*random linear map of the difference"):
            fj.theory.exact_mse(het_gaussian, alg, 3)


def test_identity_downlink_theory_is_todays(het_gaussian):
    """An identity downlink changes nothing in the exact curves (the agents' copy is the model)."""
    for make in (lambda **kw: fj.fedlsa(0.2, 2, **kw), lambda **kw: fj.scaffnew(0.2, 0.5, 2, **kw)):
        a = fj.theory.exact_mse(het_gaussian, make(), 5)
        b = fj.theory.exact_mse(het_gaussian, make(downlink=fj.channel.channel()), 5)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_k_above_dimension_raises_before_compiling(flat):
    alg = fj.fedlsa(0.1, 2, downlink=fj.channel.channel(fj.channel.top_k(5)))
    with pytest.raises(ValueError, match=r"^k=5 is invalid: expected k <= d = 4"):
        fj.simulate(KEY, flat, alg, 3, 2)


def test_x_axes_per_direction(flat, tmp_path):
    """The figure's x axis can be either direction or their sum (labelled so when there is a
    downlink; an uplink-only result keeps its label), and ``--x-axis downlink_bits_sent`` is an option."""
    import matplotlib.pyplot as plt

    from fedsa_jax.plotting import plot_mse

    both = fj.simulate(KEY, flat, fj.fedlsa(0.1, 2, downlink=fj.channel.channel(fj.channel.top_k(1))), 3, 2)
    up = fj.simulate(KEY, flat, fj.fedlsa(0.1, 2), 3, 2)
    labels = {}
    for name, res in (("both", both), ("up", up)):
        for x in ("bits_sent", "downlink_bits_sent", "uplink_bits_delivered"):
            ax = plot_mse({name: res}, x=x).axes[0]
            labels[name, x] = ax.get_xlabel()
            np.testing.assert_array_equal(ax.lines[0].get_xdata(), getattr(res, x))
            plt.close(ax.figure)
    assert labels["both", "bits_sent"] == "bits sent, uplink + downlink (all agents)"
    assert labels["up", "bits_sent"] == "uplink bits sent (all agents)"
    assert labels["both", "downlink_bits_sent"] == "downlink bits sent (to all agents)"
    code = _cli(tmp_path, "--downlink-quantizer", "top-k", "--k", "1", "--x-axis", "downlink_bits_sent")
    assert code == 0
