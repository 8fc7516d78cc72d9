"""The notebooks run top to bottom with small sizes (their ``parameters`` cell replaced), and
check cells inserted after the cells that compute something assert what those cells show:
Monte Carlo curves within Z_TOL standard errors of the exact ones at every recorded round,
the figures' theory curves and reference levels, the saved table, the bias growing with the
heterogeneity level."""

import os
from pathlib import Path

import pytest
from conftest import Z_TOL

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SMALL = {
    "00_quickstart.ipynb": "SEEDS = 64\nROUNDS = 10\nAGENTS = 4\nH = 10",
    "01_heterogeneity_fedlsa_vs_scafflsa.ipynb": "SEEDS = 32\nROUNDS = 10\nAGENTS = 4\nH = 5\nETA = 0.1",
    "02_quantization_and_erasures.ipynb": "SEEDS = 32\nROUNDS = 12\nAGENTS = 4",
    "03_your_own_algorithm.ipynb": "SEEDS = 64\nROUNDS = 12\nH = 4",
    "04_confidence_sets.ipynb": "SEEDS = 200\nROUNDS = 20\nB = 20",
    "05_federated_sarsa.ipynb": "SEEDS = 16\nSTEPS = 200\nLONG = 2000\nETA = 0.01",
    "06_federated_q_learning.ipynb": "SEEDS = 8\nSTEPS = 400\nETA = 0.1",
    "07_classic_control.ipynb": "SEEDS = 16\nSTEPS = 400\nCHAINS = 16",
}

# (marker, source): the source runs in a cell inserted after the first code cell containing marker.
_MC_VS_EXACT = f"""
for _k in res:
    _z = (res[_k].mse_mean[1:] - exact[_k][res[_k].rounds][1:]) / res[_k].mse_sem[1:]
    assert np.all(np.abs(_z) < {Z_TOL}), (_k, _z)
_dotted = [line for line in fig.axes[0].lines if line.get_linestyle() == ":"]
assert len(_dotted) == len(exact)
for _line, _k in zip(_dotted, exact):
    np.testing.assert_array_equal(_line.get_ydata(), exact[_k])
"""
CHECKS = {
    "00_quickstart.ipynb": [
        (
            "bias = fj.theory.fedlsa_bias(problem, 0.1, H)",
            f"""
res = results
{_MC_VS_EXACT}
_dashed = [line for line in fig.axes[0].lines if line.get_linestyle() == "--"]
np.testing.assert_allclose(_dashed[0].get_ydata(), [np.sum(bias ** 2)] * 2, rtol=1e-12)
""",
        ),
        (
            "back = fj.load(path)",
            """
np.testing.assert_array_equal(back.mse_mean, results["SCAFFLSA"].mse_mean)
np.testing.assert_array_equal(table["mse_q50"], back.mse_quantiles[:, 2])
np.testing.assert_array_equal(table["round"], results["SCAFFLSA"].rounds)
""",
        ),
    ],
    "01_heterogeneity_fedlsa_vs_scafflsa.ipynb": [
        (
            "rows.append(",
            f"""
for _h, _name, _mc, _sem, _exact, _bias in rows:
    assert abs(_mc - _exact) < {Z_TOL} * _sem, (_h, _name, _mc, _exact, _sem)
_biases = [r[5] for r in rows if r[1] == "fedlsa"]
assert all(a < b for a, b in zip(_biases, _biases[1:])), _biases  # every level is its own problem
for _h, _diff, _sem, _unpaired, _exact_diff in paired:  # the paired difference, to its own s.e.
    assert abs(_diff - _exact_diff) < {Z_TOL} * _sem, (_h, _diff, _exact_diff, _sem)
    assert _sem < _unpaired, (_h, _sem, _unpaired)
""",
        ),
        (
            "curve = fj.theory.fedlsa_bias(",
            f"""
_z = (res.theta_mean - star - curve[res.rounds])[1:] / res.theta_sem[1:]
assert np.all(np.abs(_z) < {Z_TOL}), _z
np.testing.assert_allclose(ax.lines[1].get_ydata(), np.linalg.norm(curve, axis=1), rtol=1e-12)
""",
        ),
    ],
    "02_quantization_and_erasures.ipynb": [
        ("for p in (0.2, 0.5, 1.0)", _MC_VS_EXACT),
        ("fj.channel.rand_k(k)", _MC_VS_EXACT),
        (
            "fj.accounting.noise_multiplier(8.0",
            _MC_VS_EXACT + "\nassert abs(spent['epsilon'] - 8.0) < 1e-2, spent\n",
        ),
        (
            'x="bits_delivered"',
            f"""
for _k, _a in algs.items():
    _r = res[_k]
    np.testing.assert_array_equal(_r.bits_sent, _r.rounds * AGENTS * _a.bits_per_message(problem.dim))
    _sd = np.sqrt(AGENTS * _r.rounds[-1] * 0.6 * 0.4 / SEEDS) * _a.bits_per_message(problem.dim)
    assert abs(_r.bits_delivered[-1] - 0.6 * _r.bits_sent[-1]) < {Z_TOL} * _sd
""",
        ),
    ],
    "03_your_own_algorithm.ipynb": [
        (
            "user_results, user_exact = {}, {}",
            f"""
assert len(user_results) == 4  # two user algorithms on two problem families
for _k, _r in user_results.items():
    _z = (_r.mse_mean[1:] - user_exact[_k][_r.rounds][1:]) / _r.mse_sem[1:]
    assert np.all(np.abs(_z) < {Z_TOL}), (_k, _z)
""",
        ),
        (
            "results[label] = fj.simulate(",
            """
# FedAvgM with momentum 0 is FedLSA, seed by seed; the custom metric is the excess risk of the iterates
_r = fj.simulate(jax.random.key(1), problem, fedavgm(eta, 0.0, H), ROUNDS, SEEDS)
np.testing.assert_allclose(_r.final_theta, results["FedLSA"].final_theta, rtol=1e-10, atol=1e-12)
_e = results["FedLSA"].final_theta - np.asarray(problem.theta_star)
_risk = 0.5 * np.einsum("si,ij,sj->s", _e, np.asarray(problem.A_bar).mean(0), _e)
np.testing.assert_allclose(results["FedLSA"].metrics["excess_risk"].mean[-1], _risk.mean(), rtol=1e-10)
_s = results["Scaffnew (p = 1/H)"]
_sd = np.sqrt(problem.num_agents ** 2 * ROUNDS * H * (1 / H) * (1 - 1 / H) / SEEDS)
assert abs(_s.communications[-1] - problem.num_agents * ROUNDS) < """
            + f"{Z_TOL}"
            + """ * _sd
""",
        ),
        (
            "label: fj.theory.exact_mse(problem, algorithms[label], ROUNDS)",
            f"""
res = {{k: results[k] for k in exact}}
{_MC_VS_EXACT}
""",
        ),
    ],
    "04_confidence_sets.ipynb": [
        (
            "predicted = norm.cdf(z - beta / sd)",
            f"""
# noise on b only: u^T theta_t is Gaussian; the exact interval covers as its exact mean predicts
_c = res.metrics["covers_exact_9"].mean[1:]
_p = predicted[res.rounds[1:]]
assert np.all(np.abs(_c - _p) <= {Z_TOL} * np.sqrt(_p * (1 - _p) / SEEDS) + 1e-12), (_c, _p)
_e = res.final_theta - np.asarray(problem.theta_star)
_d = np.einsum("si,ij,sj->s", _e, np.linalg.inv(cov[-1]), _e)
from scipy.stats import chi2 as _chi2
assert res.metrics["covers_joint_exact_9"].mean[-1] == np.mean(_d <= _chi2.ppf(LEVEL, 3))
""",
        ),
        (
            "rows.append(",
            f"""
for _name, _covered, _sem, _predicted in rows:  # the exact interval where the exact mean says
    assert abs(_covered - _predicted) <= {Z_TOL} * np.sqrt(_predicted * (1 - _predicted) / SEEDS) + 1e-12
""",
        ),
    ],
    "05_federated_sarsa.ipynb": [
        (
            'limits["scafflsa", HS[-1]] = fj.theory.mean_path_limit(',
            """
from fedsa_jax.problems.federated_sarsa import mean_field as _g
_P, _r, _Phi = (np.asarray(x) for x in (problem.transitions, problem.rewards, problem.features))
_gam, _tau = float(problem.gamma), float(problem.temperature)
_G = np.mean([_g(_P[c], _r[c], _Phi, _gam, star, _tau) for c in range(problem.num_agents)], axis=0)
assert np.linalg.norm(_G) < 1e-10, _G  # theta_lim_fed is the root of mean_c g_c
np.testing.assert_allclose(limits["scafflsa", HS[-1]], star, rtol=0, atol=1e-9)  # drift correction
np.testing.assert_allclose(limits["fedlsa", 1], star, rtol=0, atol=1e-9)  # H = 1: no local drift
_b = [np.sum((limits["fedlsa", _h] - star) ** 2) for _h in HS]
assert 1e-8 < _b[1] < _b[2], _b  # the local-training bias grows with H
_l = limits["fedlsa", HS[-1]]
_next = fj.theory.mean_path(problem, fj.fedlsa(ETA, HS[-1]), 1, _l)[1]
np.testing.assert_allclose(_next, _l, rtol=0, atol=1e-10)  # a fixed point of the noise-free round
""",
        ),
        (
            "results[H] = fj.simulate(",
            f"""
_solid = [line for line in ax.lines if line.get_linestyle() == "-"]
_dotted = [line for line in ax.lines if line.get_linestyle() == ":" and len(line.get_xdata())]
assert len(_solid) == len(_dotted) == len(HS)
for _s, _d, _h in zip(_solid, _dotted, HS):
    _r = results[_h]
    np.testing.assert_array_equal(_s.get_ydata(), _r.mse_mean)
    np.testing.assert_array_equal(_d.get_ydata(), np.sum((paths[_h] - star) ** 2, axis=1))
    np.testing.assert_array_equal(paths[_h][0], theta0)
    _gap = np.linalg.norm(_r.theta_mean[-1] - paths[_h][-1])  # the mean follows the noise-free path
    assert _gap < {Z_TOL} * np.linalg.norm(_r.theta_sem[-1]), (_h, _gap, _r.theta_sem[-1])
""",
        ),
        (
            "long_paths = {",
            """
for _line, _name in zip(ax2.lines, ("fedlsa", "scafflsa")):
    np.testing.assert_array_equal(_line.get_ydata(), np.sum((long_paths[_name] - star) ** 2, axis=1))
np.testing.assert_array_equal(ax2.lines[2].get_ydata(), [np.sum((limits["fedlsa", HS[-1]] - star) ** 2)] * 2)
""",
        ),
    ],
    "06_federated_q_learning.ipynb": [
        (
            "limits = {E: np.asarray(fj.theory.mean_path_limit(",
            """
_P, _r = np.asarray(maze.transitions), np.asarray(maze.rewards)
def _local(c, Q, E):  # E steps of T_c^eta, from the definition
    for _ in range(E):
        Q = (1 - ETA) * Q + ETA * (_r[c] + gamma * _P[c] @ Q.max(1))
    return Q
for _E, _lim in limits.items():
    _Q = _lim.reshape(_r.shape[1:])
    _image = np.mean([_local(c, _Q, _E) for c in range(maze.num_agents)], axis=0)
    assert np.abs(_image - _Q).max() < 1e-10, _E  # the fixed point of mean_c (T_c^eta)^E
np.testing.assert_allclose(limits[1], star, rtol=0, atol=1e-9)  # E = 1: Q* of the averaged MDP
_b = [np.abs(limits[_E] - star).max() for _E in ES]
assert _b[1] < _b[2] and _b[2] > 1e-4, _b  # the plateau grows with E
""",
        ),
        (
            "results, paths = {}, {}",
            """
_solid = [line for line in ax.lines if line.get_linestyle() == "-"]
_dotted = [line for line in ax.lines if line.get_linestyle() == ":"]
assert len(_solid) == len(_dotted) == len(results)
for _s, _d, (_E, _res) in zip(_solid, _dotted, results.items()):
    np.testing.assert_array_equal(_s.get_ydata(), ((1 - gamma) * _res.metrics["sup_error"].mean)[1:])
    _exact = (1 - gamma) * np.abs(paths[_E][np.asarray(_res.rounds)] - star).max(axis=1)
    np.testing.assert_array_equal(_d.get_ydata(), _exact[1:])
    assert np.all(paths[_E][0] == 0.0)
""",
        ),
        (
            "two = fj.problems.two_state_q_learning(",
            """
for _line, (_name, _res) in zip(ax2.lines, curves.items()):
    np.testing.assert_array_equal(_line.get_ydata(), 0.1 * _res.metrics["sup_error"].mean)
    assert np.all(_res.metrics["greedy_suboptimality"].mean >= -1e-12)
_eq, _im = curves["equal averaging"], curves["importance averaging"]
assert np.abs(_eq.theta_mean[-1] - _im.theta_mean[-1]).max() > 1e-6  # not the same round as FedLSA
""",
        ),
    ],
    "07_classic_control.ipynb": [
        (
            "LENGTHS = [0.25",
            """
# the reference's error is its standard errors' sum of squares, and the agents' solutions differ
assert abs(problem.reference_mse - np.sum(np.asarray(problem.theta_star_sem) ** 2)) < 1e-12
assert np.all(np.asarray(problem.theta_star_sem) > 0)
assert np.ptp(np.asarray(problem.env_params.length)) == 0.75  # each agent its own pole
""",
        ),
        (
            "results[name, H] = r = pair.results[name]",
            """
_lines = [line for line in ax.lines if len(line.get_xdata()) > 2]
assert len(_lines) == len(results)
for _line, ((_name, _H), _r) in zip(_lines, results.items()):
    np.testing.assert_array_equal(_line.get_ydata(), _r.mse_mean)
    np.testing.assert_array_equal(_line.get_xdata(), _r.rounds * _H)
    assert _r.mse_mean[0] == 0.0  # every run starts at the reference
assert ax.lines[-1].get_ydata()[0] == problem.reference_mse
""",
        ),
    ],
}


def test_every_notebook_is_covered():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(SMALL) == sorted(CHECKS)


# Run by hand (-m slow) to keep CI under 20 minutes (their stored outputs are checked below either
# way): the classic-control notebook estimates its reference and compiles gymnax's CartPole into
# three programs (about 45 s at its small sizes); the SARSA notebook (about 35 s) solves its mean-path
# limits per H, whose claims test_sarsa.py checks against the same references; the quantization
# notebook (about 30 s) compiles a program per channel, whose exact curves test_channel.py and
# test_channel_paths.py check.
SLOW = {"02_quantization_and_erasures.ipynb", "05_federated_sarsa.ipynb", "07_classic_control.ipynb"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(SMALL)]
)
def test_notebook_runs(name, tmp_path):
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    params = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "each notebook has one cell tagged 'parameters'"
    params[0].source = SMALL[name]
    for marker, source in CHECKS[name]:
        at = next(i for i, c in enumerate(book.cells) if c.cell_type == "code" and marker in c.source)
        book.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    nbclient.NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook draws figures"


def _regenerator():
    import importlib.util

    path = NOTEBOOKS.parent / "benchmarks" / "notebooks.py"
    spec = importlib.util.spec_from_file_location("notebooks_script", path)
    module = importlib.util.module_from_spec(spec)  # pyright: ignore[reportArgumentType]
    spec.loader.exec_module(module)  # pyright: ignore[reportOptionalMemberAccess]
    return module


@pytest.mark.parametrize("name", sorted(SMALL))
def test_stored_outputs_are_one_top_to_bottom_execution(name):
    """Every code cell carries the output of one execution in order (none stale from another run
    order), and the result lines are there for benchmarks/notebooks.py --check to compare."""
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    counts = [c.execution_count for c in book.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), counts
    assert len(_regenerator().key_numbers(book)) >= 10


def test_key_numbers_compare_to_the_last_printed_digit():
    script = _regenerator()
    assert script.differences(["0.1351", "0.00089", "1.642e-01"], ["0.1351", "0.00090", "1.643e-01"]) == []
    assert script.differences(["0.1351"], ["0.1341"]) == ["number 0: stored 0.1351, now 0.1341"]
    assert script.differences(["1", "2"], ["1"]) == ["2 key numbers stored, 1 printed now"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_fresh_execution_reproduces_the_stored_key_numbers(name, monkeypatch):
    """Full sizes (minutes each): a fresh execution prints the stored key numbers. The kernel
    compiles at XLA's default level, as the stored run did, not at the suite's fast one: CartPole's
    trajectories turn a rounding difference into other actions."""
    from conftest import _FAST_COMPILE

    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "").replace(_FAST_COMPILE, "").strip())
    script = _regenerator()
    stored = script.key_numbers(nbformat.read(NOTEBOOKS / name, as_version=4))
    assert script.differences(stored, script.key_numbers(script.execute(NOTEBOOKS / name))) == []
