"""Biased compressors (top-k, scaled sign, unscaled rand-k) and error feedback (EF14, EF21) on the
uplink: each rule against a numpy loop written here from its definition, round by round, with the
memories under erasures; EF21's convergence to FedLSA's limit; bad values."""

import json

import jax
import numpy as np
import pytest
from reference import assert_result_matches_exact, channel_uniforms, monte_carlo_by_family, run_jointly

import fedsa_jax as fj

N, D = 3, 4  # agents, dimension
KEY = jax.random.key(5)


@pytest.fixture(scope="module")
def flat():
    """A noise-free heterogeneous Gaussian LSA problem: runs are deterministic without erasures."""
    p = fj.problems.random_gaussian_lsa(jax.random.key(3), num_agents=N, dim=D, heterogeneity=1.0)
    return fj.problems.expected(p)


# -- the compressors, written from their definitions -----------------------------------------------


def compress(q, u, x):
    """``q`` on ``x (d,)`` with the uniforms ``u (d,)`` (read by rand-k only)."""
    d = x.shape[0]
    if q.kind == "top_k":  # the k largest |x_i|, the lower index first among equals
        keep = sorted(range(d), key=lambda i: (-abs(x[i]), i))[: q.k]
    elif q.kind == "rand_k":  # the k smallest uniforms; d/k unless unscaled
        keep = list(np.argsort(u)[: q.k])
    else:
        assert q.kind == "scaled_sign"
        return np.sum(np.abs(x)) / d * np.sign(x)
    out = np.zeros(d)
    out[keep] = x[keep] * (1.0 if q.unscaled or q.kind == "top_k" else d / q.k)
    return out


def send(ch, messages, memory, u_q, u_e):
    """One uplink round: ``(received (N, d), delivered, weights, new memory)``; ``received`` is what
    the server adds up with ``weights`` (EF21: its copies g_c)."""
    delivered = u_e < ch.success_prob if ch.erasures else np.ones(N, bool)
    weights = delivered / (N if ch.aggregation == "divide_by_n" else max(delivered.sum(), 1))
    new = memory.copy()
    received = np.zeros_like(messages)
    for c in range(N):
        if ch.error_feedback == "ef21":
            v = compress(ch.quantizer, u_q[c], messages[c] - memory[c])
            if delivered[c]:
                new[c] = memory[c] + v  # both copies move only on delivery
        else:
            x = messages[c] + (memory[c] if ch.error_feedback == "ef14" else 0.0)
            v = compress(ch.quantizer, u_q[c], x)
            if delivered[c]:
                received[c] = v
                if ch.error_feedback == "ef14":
                    new[c] = x - v
    if ch.error_feedback == "ef21":
        return new, delivered, np.full(N, 1.0 / N), new
    return received, delivered, weights, new


def loop(problem, name, alg, T, theta0):
    """FedLSA, SCAFFLSA or QFedTD on the noise-free problem, in numpy: ``(thetas (T+1, d), memories
    (T+1, N, d))``, the uplink's uniforms those of the driver's seed 0."""
    A, b = np.asarray(problem.A_bar), np.asarray(problem.b_bar)
    cfg = alg.config
    ch, eta, H = cfg.channel, float(cfg.step_size), cfg.num_local_steps
    theta = np.array(theta0, float)
    xi, memory = np.zeros((N, D)), np.zeros((N, D))
    thetas, memories = [theta.copy()], [memory.copy()]
    for t in range(T):
        u_q, u_e = channel_uniforms(KEY, 0, t, N, D)
        if name == "qfedtd":
            messages = np.stack([b[c] - A[c] @ theta for c in range(N)])
        else:
            local = np.tile(theta, (N, 1))
            for _ in range(H):
                local = np.stack([local[c] - eta * (A[c] @ local[c] - b[c] - xi[c]) for c in range(N)])
            messages = local - theta
        received, delivered, w, memory = send(ch, messages, memory, u_q, u_e)
        step = w @ received
        if name == "scafflsa":
            mean_r = received[delivered].sum(0) / max(delivered.sum(), 1)
            xi = xi + np.where(delivered[:, None], (mean_r - received) / (eta * H), 0.0)
        theta = theta + (eta * step if name == "qfedtd" else step)
        thetas.append(theta.copy())
        memories.append(memory.copy())
    return np.array(thetas), np.array(memories)


def _memory_metrics():
    def coordinate(c, i):
        return lambda s, p: s.memory[c, i] if len(s.memory) else 0.0 * s.error[0]

    return {f"m{c}_{i}": coordinate(c, i) for c in range(N) for i in range(D)}


def _seed_0(res):
    """``(thetas (T+1, d), memories (T+1, N, d))`` of a run of seed 0 (zeros without error feedback)."""
    memory = np.array([[res.metrics[f"m{c}_{i}"].mean for i in range(D)] for c in range(N)])
    return np.asarray(res.theta_mean), np.moveaxis(memory, -1, 0)


def simulate_jointly(problem, algs, T, theta0):
    """The library's runs of seed 0 of ``algs``, side by side in a few compiled programs
    (``run_jointly``: each is the algorithm's lone run with the driver's keys, to float rounding):
    a list of ``(thetas (T+1, d), memories (T+1, N, d))``."""
    results = run_jointly(KEY, problem, algs, T, 1, theta0=theta0, metrics=_memory_metrics())
    return [_seed_0(res) for res in results]


MAKERS = {
    "fedlsa": lambda **kw: fj.fedlsa(0.1, 3, **kw),
    "scafflsa": lambda **kw: fj.scafflsa(0.1, 3, **kw),
    "qfedtd": lambda **kw: fj.qfedtd(0.2, **kw),
}
COMPRESSORS = {
    "top_k": fj.channel.top_k(2),
    "scaled_sign": fj.channel.scaled_sign(),
    "rand_k_unscaled": fj.channel.rand_k(2, unbiased=False),
}


ROUND_CASES = [("fedlsa", c, ef) for c in COMPRESSORS for ef in (None, "ef14", "ef21")] + [
    (name, c, ef)
    for name in ("scafflsa", "qfedtd")
    for c, ef in (("top_k", None), ("top_k", "ef14"), ("scaled_sign", "ef21"), ("rand_k_unscaled", "ef21"))
]


def _round_alg(name, compressor, error_feedback):
    return MAKERS[name](quantizer=COMPRESSORS[compressor], error_feedback=error_feedback)


ERASURE_CASES = [
    ("fedlsa", "ef14", "divide_by_n"),
    ("fedlsa", "ef14", "divide_by_received"),
    ("fedlsa", "ef21", "divide_by_n"),
    ("scafflsa", "ef21", "divide_by_n"),
    ("scafflsa", "ef14", "divide_by_received"),
    ("qfedtd", "ef21", "divide_by_n"),
]


def _erasure_alg(name, error_feedback, aggregation):
    return MAKERS[name](
        quantizer=fj.channel.rand_k(2, unbiased=False),
        error_feedback=error_feedback,
        success_prob=0.5,
        aggregation=aggregation,
    )


@pytest.fixture(scope="module")
def seed_0_runs(flat):
    """``case -> (thetas, memories)``: the library's seed 0 of every case of ROUND_CASES (6 rounds)
    and ERASURE_CASES (8 rounds), from ``linspace(-1, 2, D)``, run side by side (one compile per few
    cases instead of one per case); each test below checks its own case."""
    theta0 = np.linspace(-1.0, 2.0, D)
    rounds = simulate_jointly(flat, [_round_alg(*c) for c in ROUND_CASES], 6, theta0)
    erasures = simulate_jointly(flat, [_erasure_alg(*c) for c in ERASURE_CASES], 8, theta0)
    return dict(zip(ROUND_CASES + ERASURE_CASES, rounds + erasures))


@pytest.mark.parametrize(("name", "compressor", "error_feedback"), ROUND_CASES)
def test_rounds_match_numpy_loop(flat, seed_0_runs, name, compressor, error_feedback):
    """Without erasures, each compressor and error-feedback rule is the numpy loop, round by round
    (iterate and memory), to float64 rounding."""
    alg = _round_alg(name, compressor, error_feedback)
    theta0 = np.linspace(-1.0, 2.0, D)
    got, got_mem = seed_0_runs[name, compressor, error_feedback]
    want, want_mem = loop(flat, name, alg, 6, theta0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_mem, want_mem, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "error_feedback", "aggregation"), ERASURE_CASES)
def test_memories_under_erasures_match_numpy_loop(flat, seed_0_runs, name, error_feedback, aggregation):
    """A lost message leaves the agent's memory as it was (EF14's e_c, EF21's g_c); EF21's server
    keeps the last g_c it received and averages all N of them."""
    alg = _erasure_alg(name, error_feedback, aggregation)
    theta0 = np.linspace(-1.0, 2.0, D)
    got, got_mem = seed_0_runs[name, error_feedback, aggregation]
    want, want_mem = loop(flat, name, alg, 8, theta0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_mem, want_mem, rtol=1e-12, atol=1e-12)


def test_ef21_reaches_fedlsa_limit_and_top_k_alone_does_not(flat):
    """FedLSA with top-k and EF21 converges to ``theta_star + fedlsa_bias`` (the uncompressed limit);
    top-k alone stays away from it, and so does EF14 (it cycles around the limit)."""
    eta, H, T = 0.1, 4, 300
    limit = np.asarray(flat.theta_star) + fj.theory.fedlsa_bias(flat, eta, H)
    theta0 = np.linspace(-1.0, 2.0, D)

    def distance(error_feedback):
        alg = fj.fedlsa(eta, H, quantizer=fj.channel.top_k(1), error_feedback=error_feedback)
        res = fj.simulate(KEY, flat, alg, T, 1, theta0=theta0, record_every=T)
        return np.linalg.norm(np.asarray(res.theta_mean)[-1] - limit)

    assert distance("ef21") < 1e-6
    assert distance(None) > 1e-2
    assert distance("ef14") > 1e-2


def test_compressor_flags_and_bits():
    d = 10
    top, sign = fj.channel.top_k(3), fj.channel.scaled_sign()
    unscaled, scaled = fj.channel.rand_k(3, unbiased=False), fj.channel.rand_k(3)
    assert (top.unbiased, sign.unbiased, unscaled.unbiased, scaled.unbiased) == (False, False, False, True)
    assert top.bits(d) == unscaled.bits(d) == scaled.bits(d) == 3 * (32 + 4)
    assert sign.bits(d) == d + 32
    assert scaled == fj.channel.rand_k(3, unbiased=True)
    x = np.array([3.0, -1.0, 3.0, 0.5])
    np.testing.assert_array_equal(fj.channel.top_k(2)(jax.random.key(0), x), [3.0, 0.0, 3.0, 0.0])
    np.testing.assert_allclose(sign(jax.random.key(0), x), 7.5 / 4 * np.sign(x))
    kept = np.asarray(unscaled(jax.random.key(0), x))
    assert np.count_nonzero(kept) == 3 and set(kept[kept != 0]) <= set(x)


def test_error_feedback_none_adds_nothing(flat):
    """``error_feedback=None`` is today's algorithm: same config, no memory in the state."""
    q = fj.channel.rand_k(2)
    for make in MAKERS.values():
        alg = make(quantizer=q, error_feedback=None)
        assert alg == make(quantizer=q)
        assert "error_feedback" not in alg.describe()["channel"]
        state = alg.init(KEY, flat, np.zeros(D))
        assert state.memory == ()
    alg = fj.scaffnew(0.1, 0.5, 3, quantizer=q, error_feedback=None)
    assert alg.init(KEY, flat, np.zeros(D)).memory == ()


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: fj.channel.top_k(0), "k"),
        (lambda: fj.channel.rand_k(0, unbiased=False), "k"),
        (lambda: fj.channel.rand_k(2, unbiased="no"), "unbiased"),
        (lambda: fj.fedlsa(0.1, 2, error_feedback="ef14"), "error_feedback"),
        (lambda: fj.qfedtd(0.1, quantizer=fj.channel.top_k(1), error_feedback="ef3"), "error_feedback"),
        (lambda: fj.channel.channel(error_feedback="ef21"), "error_feedback"),
        (
            lambda: fj.scafflsa(
                0.1, 2, quantizer=fj.channel.top_k(1), error_feedback="ef21", aggregation="divide_by_received"
            ),
            "error_feedback",
        ),
        (lambda: fj.scaffnew(0.1, 0.5, 2, quantizer=fj.channel.top_k(1), error_feedback=1), "error_feedback"),
    ],
)
def test_bad_values_raise_one_line(make, param):
    with pytest.raises(ValueError, match=rf"^{param}=") as err:
        make()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("q", [fj.channel.top_k(5), fj.channel.rand_k(5, unbiased=False)])
def test_k_above_dimension_raises_before_compiling(flat, q):
    with pytest.raises(ValueError, match=r"^k=5 is invalid: expected k <= d = 4"):
        fj.simulate(KEY, flat, fj.fedlsa(0.1, 2, quantizer=q, error_feedback="ef21"), 3, 2)


# -- command line and sweeps ---------------------------------------------------------------------------


def _cli_run(out, *extra):
    from fedsa_jax import cli

    base = ["run", "--problem", "gaussian", "--agents", "2", "--algorithms", "fedlsa", "--local-steps", "2"]
    return cli.main([*base, "--rounds", "3", "--seeds", "4", "--no-plot", "--out", str(out), *extra])


@pytest.mark.parametrize(
    ("quantizer", "kind", "error_feedback"),
    [
        ("top-k", "top_k", "ef21"),
        ("scaled-sign", "scaled_sign", "ef14"),
        ("rand-k-unscaled", "rand_k", "none"),
    ],
)
def test_cli_compressors_and_error_feedback(tmp_path, quantizer, kind, error_feedback):
    extra = ["--quantizer", quantizer, "--error-feedback", error_feedback]
    assert _cli_run(tmp_path, *extra, *(["--k", "2"] if "k" in quantizer else [])) == 0
    ch = fj.load(tmp_path / "result_fedlsa.npz").config["algorithm"]["channel"]
    assert ch["quantizer"]["kind"] == kind and ch.get("error_feedback", "none") == error_feedback
    assert ch["quantizer"].get("unscaled") == (True if quantizer == "rand-k-unscaled" else None)


def test_cli_error_feedback_without_compressor_is_one_line_error(tmp_path, capsys):
    assert _cli_run(tmp_path, "--error-feedback", "ef21") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--error-feedback=" in err, err


def test_sweep_grid_error_feedback_axis(tmp_path):
    from fedsa_jax import cli

    cfg = tmp_path / "grid.toml"
    cfg.write_text(
        '[run]\nrounds = 3\nseeds = 4\n[grid]\nproblem = "gaussian"\nagents = 2\nlocal_steps = 2\n'
        'algorithm = "fedlsa"\nquantizer = ["top-k", "scaled-sign"]\n'
        'error_feedback = ["none", "ef21"]\n'
    )
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress", "--no-plot"]) == 0
    index = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert sorted((r["config"]["quantizer"], r["config"]["error_feedback"]) for r in index) == [
        ("scaled-sign", "ef21"),
        ("scaled-sign", "none"),
        ("top-k", "ef21"),
        ("top-k", "none"),
    ]
    kinds = {
        fj.load(tmp_path / "o" / r["file"]).config["algorithm"]["channel"].get("error_feedback")
        for r in index
    }
    assert kinds == {None, "ef21"}


# -- exact theory ---------------------------------------------------------------------------------------

THEORY_CASES = [
    ("gaussian", "fedlsa", fj.channel.rand_k(1, unbiased=False), None, 1.0),
    ("gaussian", "fedlsa", fj.channel.rand_k(1, unbiased=False), "ef14", 0.7),
    ("gaussian", "fedlsa", fj.channel.rand_k(2, unbiased=False), "ef21", 0.7),
    ("gaussian", "fedlsa", fj.channel.rand_k(2), "ef14", 1.0),
    ("td", "qfedtd", fj.channel.rand_k(1, unbiased=False), None, 0.7),
    ("td", "qfedtd", fj.channel.rand_k(1, unbiased=False), "ef14", 1.0),
    ("td", "fedlsa", fj.channel.rand_k(1, unbiased=False), "ef21", 0.7),
]


def _theory_case(tiny_td, het_gaussian, family, name, q, error_feedback, p):
    P, r, Phi = tiny_td
    problem = het_gaussian if family == "gaussian" else fj.problems.federated_td(P, r, Phi, 0.9)
    kw = dict(quantizer=q, error_feedback=error_feedback, success_prob=p)
    return problem, (fj.fedlsa(0.2, 2, **kw) if name == "fedlsa" else fj.qfedtd(0.5, **kw))


@pytest.fixture(scope="module")
def theory_runs(tiny_td, het_gaussian):
    """Case index -> ``(problem, alg, result)``: the Monte Carlo run of every case of THEORY_CASES
    (``monte_carlo_by_family``, 8 rounds, 4000 seeds), the cases of one problem side by side."""
    cases = [_theory_case(tiny_td, het_gaussian, *c) for c in THEORY_CASES]
    return monte_carlo_by_family(cases, [c[0] for c in THEORY_CASES], T=8)


@pytest.mark.parametrize(("family", "name", "q", "error_feedback", "p"), THEORY_CASES)
def test_monte_carlo_matches_exact_mse(theory_runs, family, name, q, error_feedback, p):
    """Unscaled (biased) rand-k, and rand-k with EF14 or EF21, erasures or not: the round is linear in
    (state, memory), and the MC MSE is within Z_TOL standard errors of ``exact_mse`` at every round."""
    problem, alg, res = theory_runs[THEORY_CASES.index((family, name, q, error_feedback, p))]
    assert_result_matches_exact(problem, alg, res, T=8)


def test_theory_refuses_what_is_not_linear(het_gaussian):
    for q, name in ((fj.channel.top_k(1), "top-k"), (fj.channel.scaled_sign(), "scaled-sign")):
        for ef in (None, "ef21"):
            with pytest.raises(ValueError, match=rf"^quantizer=.* {name} is not linear in the message"):
                fj.theory.exact_mean(het_gaussian, fj.fedlsa(0.1, 2, quantizer=q, error_feedback=ef), 3)
    with pytest.raises(ValueError, match=r"^quantizer=.*qsgd.*random linear map"):
        fj.theory.exact_mse(
            het_gaussian, fj.fedlsa(0.1, 2, quantizer=fj.channel.qsgd(2), error_feedback="ef14"), 3
        )
    with pytest.raises(ValueError, match=r"^algorithm=.*without control variates"):
        fj.theory.exact_mean(
            het_gaussian, fj.scafflsa(0.1, 2, quantizer=fj.channel.rand_k(1), error_feedback="ef21"), 3
        )
    ef14_received = fj.fedlsa(
        0.1, 2, quantizer=fj.channel.rand_k(1), error_feedback="ef14", aggregation="divide_by_received"
    )
    with pytest.raises(ValueError, match=r"^aggregation='divide_by_received' is invalid"):
        fj.theory.exact_mse(het_gaussian, ef14_received, 3)
    schedule = fj.qfedtd(
        fj.schedule(fj.optim.inverse_time, eta0=0.1, k0=10.0), fj.channel.rand_k(1), error_feedback="ef14"
    )
    with pytest.raises(ValueError, match=r"^step_size=.*constant step size"):
        fj.theory.exact_mean(het_gaussian, schedule, 3)
