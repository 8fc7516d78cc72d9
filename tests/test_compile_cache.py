"""The command line's persistent compilation cache: on by default in the user's cache folder,
off with --no-compile-cache or FEDSA_JAX_COMPILE_CACHE=off; the library never turns it on."""

import os
import subprocess
import sys
from pathlib import Path

import jax

import fedsa_jax as fj
from fedsa_jax import compile_cache

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "run",
    "--algorithms",
    "fedlsa",
    "--agents",
    "2",
    "--states",
    "4",
    "--dim",
    "2",
    "--local-steps",
    "2",
    "--rounds",
    "2",
    "--seeds",
    "2",
    "--no-plot",
]


def run_cli(tmp_path, *extra):
    env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "fedsa_jax.cli", *TINY, "--out", str(tmp_path / "out"), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "cache" / "fedsa_jax" / "jax_compile_cache"
    return sorted(folder.iterdir()) if folder.exists() else []


def test_cli_keeps_compiled_kernels_in_the_user_cache_folder(tmp_path):
    files = run_cli(tmp_path)
    assert files, "no compiled kernel was written to the cache folder"
    assert all(f.stat().st_size > 0 for f in files)


def test_opt_out_writes_nothing(tmp_path):
    """--no-compile-cache; the environment variable reaches the same switch (test_configured_dir)."""
    assert run_cli(tmp_path, "--no-compile-cache") == []


def test_library_leaves_jax_config_alone(tiny_td):
    """Importing fedsa_jax and simulating leaves JAX's cache settings untouched."""
    before = jax.config.jax_compilation_cache_dir
    P, r, Phi = tiny_td
    fj.simulate(0, fj.problems.federated_td(P, r, Phi, 0.9), fj.fedlsa(0.1, 1), 1, 1)
    assert jax.config.jax_compilation_cache_dir == before is None


def test_configured_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    assert compile_cache.configured_dir() == tmp_path / "fedsa_jax" / "jax_compile_cache"
    assert compile_cache.configured_dir(opt_out=True) is None
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "elsewhere"))
    assert compile_cache.configured_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv(compile_cache.ENV, "OFF")
    assert compile_cache.configured_dir() is None
