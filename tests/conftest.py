"""Test configuration: float64 everywhere, warnings are errors (pyproject), small sizes."""

import os

# Compile at a low XLA optimisation level: the suite's runs are small, so compiling dominates its
# time (about a third less CPU time this way); results are the same to float rounding, and the
# benchmarks measure speed at XLA's default level. A device count or other flags given stay.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

import jax  # noqa: E402
import matplotlib  # noqa: E402

# The command line keeps compiled kernels on disk unless told otherwise; tests that call it in this
# process must neither write to the user's cache folder nor turn JAX's disk cache on for the suite
# (tests/test_compile_cache.py checks the cache itself, in subprocesses).
os.environ["FEDSA_JAX_COMPILE_CACHE"] = "off"

jax.config.update("jax_enable_x64", True)
# Start JAX's backends now, on its default devices: every test in this process then runs on the same
# devices whatever ran first, and the command line called in this process keeps them (it would otherwise
# give JAX one CPU device per core; tests/test_cpu.py checks that in subprocesses).
jax.devices()
matplotlib.use("Agg")  # figures are checked, never shown

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import fedsa_jax as fj  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Drop each test module's compiled kernels when it ends: one process compiles a few hundred
    kernels in the whole suite, and keeping them all only grows memory."""
    yield
    jax.clear_caches()
    import gc

    gc.collect()


# Monte Carlo tolerance: |estimate - exact| <= Z_TOL standard errors. With a few
# dozen (correlated) comparisons per test the chance of a false failure is < 1e-4.
Z_TOL = 4.5


@pytest.fixture(scope="session")
def tiny_td():
    """A 3-agent, 4-state heterogeneous TD problem with d=2 (generative)."""
    rng = np.random.default_rng(0)
    P = rng.uniform(size=(3, 4, 4)) + 0.1
    P /= P.sum(-1, keepdims=True)
    r = rng.uniform(-1, 1, size=(3, 4))
    Phi = rng.uniform(size=(4, 2))
    return P, r, Phi


@pytest.fixture(scope="session")
def tiny_td_sampled(tiny_td):
    """``tiny_td`` as federated TD problems (gamma 0.9), ``{"generative": ..., "markov": ...}``."""
    P, r, Phi = tiny_td
    return {s: fj.problems.federated_td(P, r, Phi, 0.9, sampling=s) for s in ("generative", "markov")}


@pytest.fixture(scope="session")
def het_gaussian():
    return fj.problems.random_gaussian_lsa(
        jax.random.key(3), num_agents=3, dim=3, heterogeneity=1.0, noise_A=0.2, noise_b=0.5
    )
