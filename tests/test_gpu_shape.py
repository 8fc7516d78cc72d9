"""GPU-shaped kernels, checked on the CPU, and the offline GPU script.

* A local step of the TD and Gaussian kernels compiles to a few fused kernels (on a GPU each is one
  launch per local step), with no host transfer anywhere in the round's program, and the loop
  carries the local iterates of every seed and agent at once: seeds x agents is the width of each
  step (``benchmarks/_hlo.py`` reads XLA's optimised HLO).
* ``fj.Execution(local_unroll=k)`` reaches the local-step scans (the loop then runs ceil(H / k)
  iterations) and changes no result of FedLSA or SCAFFLSA (bitwise), Scaffnew's only to rounding.
* ``benchmarks/gpu.py`` runs end to end on this CPU at small sizes, and refuses in one line a
  platform without a GPU backend when asked for the GPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import fedsa_jax as fj

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import _hlo  # noqa: E402

SEEDS, N, D, H = 48, 5, 6, 7  # distinct sizes: each axis of a shape can be told apart


@pytest.fixture(scope="module")
def kernels():
    td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=12, dim=D)
    g = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=N, dim=D)
    return {"td": (td, fj.fedlsa(0.1, H)), "gaussian": (g, fj.fedlsa(0.05, H))}


@pytest.mark.parametrize("name, width", [("td", f"[{SEEDS},{N},{D}]"), ("gaussian", f"[{N},{D},{SEEDS}]")])
def test_a_local_step_is_a_few_fused_kernels_over_seeds_and_agents(kernels, name, width):
    problem, alg = kernels[name]
    step = _hlo.local_step(_hlo.round_program(problem, alg, SEEDS), H)
    assert step["host_transfers"] == []
    # on the CPU: 6-7 (the gathers of the observation, the direction, the update, the loop counter);
    # the H200 compiles them to 3-4 (benchmarks/README.md, GPU)
    assert 1 <= len(step["kernels"]) <= 8, step["kernels"]
    assert any(c.endswith(width) for c in step["carry"]), step["carry"]  # every seed's agents' iterates
    assert all(op in ("fusion", "copy", "custom-call") for op, _ in step["kernels"]), step["kernels"]


def test_local_unroll_reaches_the_scan(kernels):
    problem, alg = kernels["td"]
    text = _hlo.round_program(problem, alg, SEEDS, unroll=3)  # 7 steps: 2 iterations of 3, then 1
    assert _hlo.local_step(text, 2)["host_transfers"] == []
    with pytest.raises(ValueError, match="known trip count 7"):
        _hlo.local_step(text, H)


@pytest.mark.parametrize(
    "make, exact",
    [
        (lambda: fj.fedlsa(0.1, H), True),
        (lambda: fj.scafflsa(0.1, H), True),
        (lambda: fj.scaffnew(0.1, 0.3, H), False),
    ],
)
@pytest.mark.parametrize("family", ["td", "gaussian"])
def test_local_unroll_changes_no_result(kernels, make, exact, family):
    problem = kernels[family][0]
    runs = [
        fj.simulate(1, problem, make(), 6, 16, record_every=3, execution=fj.Execution(local_unroll=u))
        for u in (None, 1, 3)
    ]
    for r in runs[1:]:
        if exact:
            np.testing.assert_array_equal(r.seed_mse, runs[0].seed_mse)
            np.testing.assert_array_equal(r.final_theta, runs[0].final_theta)
        else:  # XLA fuses the unrolled body differently: float32 rounding
            np.testing.assert_allclose(r.final_theta, runs[0].final_theta, rtol=1e-4, atol=1e-5)


def test_local_unroll_is_checked():
    problem = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=2, dim=2)
    with pytest.raises(ValueError, match=r"^local_unroll=0 is invalid: expected an integer >= 1"):
        fj.simulate(0, problem, fj.fedlsa(0.1, 2), 2, 2, execution=fj.Execution(local_unroll=0))


def _script(tmp_path, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(BENCH.parent))
    return subprocess.run(
        ["bash", str(BENCH / "gpu.sh"), str(tmp_path), *args], env=env, capture_output=True, text=True
    )


def test_gpu_script_refuses_a_platform_without_gpu(tmp_path):
    proc = _script(tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and "platform='gpu' asked for, but JAX" in last[0] and "'cpu'" in last[0], last
    assert not (tmp_path / "gpu.json").exists()  # nothing measured


def test_gpu_script_runs_end_to_end_on_cpu(tmp_path):
    proc = _script(tmp_path, "--platform", "cpu", "--small", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    expected = {
        "devices",
        "td_fedlsa",
        "fused",
        "local_step",
        "unroll",
        "paths",
        "scafflsa",
        "theory",
        "bootstrap",
    }
    assert expected <= set(report), sorted(report)
    assert report["devices"]["backend"] == "cpu"
    for row in report["td_fedlsa"] + list(report["paths"].values()):
        assert row["agent_steps_per_s"] > 0 and row["first_call_s"] >= row["warm_s"] > 0
    assert all(s["host_transfers"] == [] for s in report["local_step"].values())
    assert report["theory"]["final_mse"] > 0
    *rows, kernels = report["fused"]
    assert [(r["path"], "error" in r) for r in rows] == [
        ("scan", False),
        ("fused", False),
        ("fused, rows layout", False),
    ]
    assert all(r["agent_steps_per_s"] > 0 and r["model_bandwidth_GBps"] > 0 for r in rows)
    assert kernels["round_kernels"], kernels  # the fused round's kernels, read from its HLO
    assert report["bootstrap"]["bootstrap_over_plain"] > 0
