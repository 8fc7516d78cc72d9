"""The fused local-step kernels (``fj.problems.fused``) against the compiled scan they replace.

* Same numbers (in one program of every row, and in programs of 16 rows, the last one padded; the
  per-row arrays laid out by coordinate or by row): one
  round of every agent's local steps (``run_agents``, as FedLSA and SCAFFLSA call
  it) from random starts and random control variates, with step sizes that change with the step (and
  per agent and seed: the bootstrap's multipliers), equals the scan's to float rounding (float64:
  1e-12 of the largest entry; float32: 1e-5) on federated TD with pair tables (generative, and Markov:
  the chains move alike) and Gaussian LSA; so does a SCAFFLSA run through ``fj.simulate``, every
  seed's squared error at every round. The kernel runs in Pallas's interpret mode on this CPU, and
  each case asserts that it ran (the comparison is not the scan against itself).
* Power: ``tests/mutations.py``, section "fused local steps" (the control dropped, the first step
  size at every step, agent 0's constants, the noise scale at the error, rows shifted by one).
* The GPU path: the simulation kernel with the fused steps lowers for CUDA on this CPU, the local
  steps as one Triton kernel (Pallas's Triton backend accepted the kernel: block shapes, gathers, the
  loop). Compiling it needs a GPU.
* ``fused_local_steps`` other than True, False or None is a one-line error naming it; a dimension
  whose live values per row exceed ``MAX_LIVE_WORDS`` keeps the scan (TD up to d = 40 in float32, 20
  in float64; Gaussian LSA up to 10 and 6), and so does a Gaussian subclass whose ``agent_params``
  give other values (the kernel reads the problem's own tables).
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_export import kernel_arguments

import fedsa_jax as fj
from fedsa_jax import cli
from fedsa_jax._runtime import kernel as sim
from fedsa_jax.algorithms._base import ErrorCoordinates, init_samplers, local_updates, run_agents
from fedsa_jax.problems import fused
from fedsa_jax.problems.gaussian import GaussianLSA
from fedsa_jax.problems.protocol import unrolled

KEY = jax.random.key(5)


@pytest.fixture(scope="module")
def problems(tiny_td_sampled, het_gaussian):
    garnet = fj.problems.garnet(jax.random.key(2), num_agents=3, num_states=6, dim=4)
    return {
        "td": tiny_td_sampled["generative"],
        "td-markov": tiny_td_sampled["markov"],
        "garnet": garnet,
        "garnet-f32": fj.problems.garnet(
            jax.random.key(2), num_agents=3, num_states=6, dim=4, dtype="float32"
        ),
        "gaussian": het_gaussian,
    }


def run(problem, algorithm, fused_steps):
    execution = fj.Execution(fused_local_steps=fused_steps, progress=False, seed_batch_size=24)
    return fj.simulate(KEY, problem, algorithm, 8, 24, record_every=1, keep_seeds=24, execution=execution)


@pytest.fixture
def kernel_calls(monkeypatch):
    """How many times the fused kernel was traced."""
    calls = []
    original = fused._call_rows

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(fused, "_call_rows", spy)
    return calls


ALGORITHMS = {
    "fedlsa": lambda: fj.fedlsa(0.2, 3),
    "scafflsa": lambda: fj.scafflsa(0.2, 3),
    "bootstrap": lambda: fj.bootstrap(fj.fedlsa(0.2, 3), 2),  # step sizes per row
}
H, SEEDS = 5, 40


def local_round(problem, fused_steps: bool, per_row_steps: bool):
    """One round of every agent's local steps for SEEDS seeds (``run_agents``, as FedLSA and SCAFFLSA
    call it), from random starts and random control variates; step sizes that change with the step,
    per agent and seed when ``per_row_steps`` (the bootstrap's multipliers). Returns the agents'
    final iterates ``(SEEDS, N, d)`` and samplers."""
    N, d, dt = problem.num_agents, problem.dim, problem.dtype
    view = ErrorCoordinates(problem)

    def one_seed(key):
        k = jax.random.split(key, 5)
        rand = problem.randomness(k[0], N, H)
        samplers = init_samplers(k[1], problem)
        start = 0.5 * jax.random.normal(k[2], (d,), dt)
        controls = 0.3 * jax.random.normal(k[3], (N, d), dt)
        etas = 0.3 * jnp.linspace(1.0, 0.4, H, dtype=dt)
        weights = jax.random.uniform(k[4], (N, H), dt, 0.5, 1.5) if per_row_steps else None
        return run_agents(rand, view, samplers, start, etas, controls=controls, weights=weights)

    with unrolled(None, fused_steps):
        return jax.jit(jax.vmap(one_seed))(jax.random.split(KEY, SEEDS))


KERNEL_CASES = [  # (problem, step sizes per row, rows per program (None: one program of every row), layout)
    ("td", False, None, "rows"),
    ("td-markov", True, None, "columns"),
    ("garnet", False, None, "rows"),
    ("garnet", True, 16, "columns"),  # 120 rows: 8 programs, the last one padded (the GPU's grid)
    ("garnet-f32", True, None, "rows"),
    ("gaussian", False, 16, "rows"),
    ("gaussian", True, None, "columns"),
]


@pytest.mark.parametrize("problem_name,per_row_steps,block,layout", KERNEL_CASES)
def test_fused_local_steps_equal_the_scan(
    problems, kernel_calls, monkeypatch, problem_name, per_row_steps, block, layout
):
    problem = problems[problem_name]
    monkeypatch.setitem(fused.BLOCK_ROWS, jax.default_backend(), block)
    monkeypatch.setitem(fused.LAYOUT, jax.default_backend(), layout)
    scan, scan_samplers = local_round(problem, False, per_row_steps)
    assert not kernel_calls
    kernel, kernel_samplers = local_round(problem, True, per_row_steps)
    assert kernel_calls, "the fused kernel did not run"
    rtol = 1e-5 if problem.dtype == np.float32 else 1e-12
    assert np.all(np.isfinite(scan)) and np.std(scan) > 0.1
    np.testing.assert_allclose(kernel, scan, rtol=0, atol=rtol * np.max(np.abs(scan)))
    np.testing.assert_array_equal(kernel_samplers, scan_samplers)  # the Markov chains moved alike


@pytest.mark.parametrize("problem_name", ["garnet", "gaussian"])
def test_one_agent_unbatched(problems, kernel_calls, problem_name):
    """Called for one agent, not vmapped, the local steps are the kernel on one row: the scan's."""
    problem = problems[problem_name]
    view, d = ErrorCoordinates(problem), problem.dim
    params = jax.tree.map(lambda x: x[1], problem.agent_params())  # agent 1
    rand = jax.tree.map(lambda x: x[1], problem.randomness(KEY, problem.num_agents, H))
    obs, _ = problem.observe(params, init_samplers(KEY, problem)[1], rand)
    error = jnp.linspace(-1.0, 1.0, d, dtype=problem.dtype)
    control = jnp.linspace(0.3, -0.2, d, dtype=problem.dtype)
    etas = 0.3 * jnp.linspace(1.0, 0.4, H, dtype=problem.dtype)
    runs = {}
    for fused_steps in (False, True):
        with unrolled(None, fused_steps):
            runs[fused_steps] = jax.jit(lambda o, e: local_updates(view, params, o, e, etas, control))(
                obs, error
            )
    assert kernel_calls, "the fused kernel did not run"
    np.testing.assert_allclose(runs[True], runs[False], rtol=0, atol=1e-12 * np.max(np.abs(runs[False])))
    assert np.max(np.abs(runs[False] - error)) > 0.1  # the steps moved the iterate


@pytest.mark.parametrize("alg_name", ["scafflsa"])
def test_a_fused_run_equals_the_scans(problems, kernel_calls, alg_name):
    """Through ``fj.simulate`` (the option reaches the compiled kernel): every seed's squared error at
    every round and the final iterates, SCAFFLSA's control variates carried across rounds."""
    problem = problems["garnet"]
    scan = run(problem, ALGORITHMS[alg_name](), False)
    assert not kernel_calls
    kernel = run(problem, ALGORITHMS[alg_name](), True)
    assert kernel_calls, "the fused kernel did not run"
    assert np.all(np.isfinite(scan.seed_mse)) and np.min(scan.seed_mse[:, 1:]) > 0
    np.testing.assert_allclose(kernel.seed_mse, scan.seed_mse, rtol=1e-12, atol=0)
    scale = np.max(np.abs(scan.final_theta))
    np.testing.assert_allclose(kernel.final_theta, scan.final_theta, rtol=0, atol=1e-12 * scale)
    assert kernel.config["execution"].get("fused_local_steps") is True


@pytest.mark.parametrize("layout", ["columns", "rows"])
@pytest.mark.parametrize(
    "problem_name,alg_name,kernels",
    # the bootstrap: the main trajectory's steps and its replicates' (step sizes per row), two kernels
    [("garnet-f32", "scafflsa", 1), ("garnet-f32", "bootstrap", 2), ("gaussian", "fedlsa", 1)],
)
def test_fused_steps_lower_to_one_triton_kernel(
    problems, monkeypatch, problem_name, alg_name, kernels, layout
):
    """The simulation kernel (``_advance``) with the fused steps, lowered for CUDA on this CPU: the
    local steps are a Triton custom call (Pallas's Triton backend generated its IR)."""
    pytest.importorskip("jax._src.pallas.triton.lowering")
    execution = fj.Execution(fused_local_steps=True)
    (inputs, seeds), kwargs = kernel_arguments(
        monkeypatch, problems[problem_name], ALGORITHMS[alg_name](), execution=execution
    )
    assert kwargs["rec"].fused is True
    monkeypatch.setattr(fused, "_interpret", lambda: False)  # what a GPU backend chooses
    monkeypatch.setitem(fused.LAYOUT, jax.default_backend(), layout)
    carry = jax.eval_shape(lambda i, s: sim._start(i, s, **kwargs), inputs, seeds)[0]
    traced = sim._advance.trace(
        inputs, seeds, carry, np.uint32(8), record_every=1, max_blocks=8, rec=kwargs["rec"]
    )
    with warnings.catch_warnings():  # JAX 0.11 deprecates Pallas's Triton backend, warning as it lowers
        warnings.filterwarnings("ignore", "The Pallas Triton backend is deprecated", DeprecationWarning)
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == kernels


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Louder(GaussianLSA):
    """Twice the noise, through ``agent_params`` alone: the fused kernel, which reads the problem's own
    tables, must decline it."""

    def agent_params(self):
        p = super().agent_params()
        return p._replace(noise_A=2 * p.noise_A, noise_b=2 * p.noise_b)


def test_a_subclass_with_its_own_agent_params_keeps_the_scan(het_gaussian, kernel_calls):
    louder = _Louder(**{f.name: getattr(het_gaussian, f.name) for f in dataclasses.fields(het_gaussian)})
    scan, _ = local_round(louder, False, False)
    fused_steps, _ = local_round(louder, True, False)
    assert not kernel_calls
    np.testing.assert_array_equal(fused_steps, scan)
    base, _ = local_round(het_gaussian, False, False)
    assert np.max(np.abs(scan - base)) > 1e-3  # power: the subclass's noise is not the base class's


def test_command_line_option(tmp_path):
    """``--fused-local-steps`` reaches the run (recorded in the result file); the default is the
    backend's (off on the CPU)."""
    for flag, want in (("--fused-local-steps", True), ("--no-fused-local-steps", False), (None, False)):
        out = tmp_path / str(flag)
        argv = ["run", "--agents", "2", "--states", "5", "--dim", "3", "--rounds", "2", "--seeds", "4"]
        argv += ["--algorithms", "scafflsa", "--no-plot", "--out", str(out)] + ([flag] if flag else [])
        assert cli.main(argv) == 0
        assert fj.load(out / "result_scafflsa.npz").config["execution"]["fused_local_steps"] is want


def test_bad_value_and_large_dimension(problems):
    with pytest.raises(ValueError, match=r"fused_local_steps.*'yes'.*True, False or None") as info:
        fj.simulate(
            KEY, problems["td"], fj.fedlsa(0.1, 2), 2, 2, execution=fj.Execution(fused_local_steps="yes")
        )
    assert "\n" not in str(info.value)
    with unrolled(None, True):
        for dim, dtype, live in ((40, "float32", 4 * 40), (20, "float64", 4 * 20), (10, "float32", 150)):
            assert fused.usable(live, dtype), (dim, dtype)
        for dtype, live in (
            ("float32", 4 * 41),
            ("float64", 4 * 21),
            ("float32", 11 * 11 + 55),
            ("float64", 84),
        ):
            assert not fused.usable(live, dtype), (dtype, live)
    with unrolled(None, False):
        assert not fused.usable(2, "float32")
