"""Machine probe for the roofline in benchmarks/README.md: what XLA reaches on this machine for
streaming reads (DRAM and cache-resident), random gathers from a small table, the fused threefry
hash, and multiply-adds, each in its best layout (long flat arrays, float32, all cores).

    python benchmarks/probe.py      # about 20 s
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from _bench import best_of

from fedsa_jax import _prng


def rate(fn, *args, repeats=5):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    return best_of(lambda: jax.block_until_ready(fn(*args)), repeats)


def main():
    print(f"jax {jax.__version__}, {jax.default_backend()}, {os.cpu_count()} cores")
    big = jnp.ones((2**27,), jnp.float32)  # 512 MB: DRAM
    t = rate(jnp.sum, big)
    print(f"stream read, 512 MB array        {big.nbytes / t / 1e9:8.1f} GB/s")
    small = jnp.ones((256, 2**14), jnp.float32)  # 16 MB in all, summed row by row: 64 kB rows, cache-resident
    t = rate(lambda x: jax.lax.fori_loop(0, 50, lambda i, a: a + jnp.sum(x[i % 256]), 0.0), small)
    print(f"stream read, 64 kB rows (cache)  {50 * 2**14 * 4 / t / 1e9:8.1f} GB/s")
    table = jnp.arange(400 * 20, dtype=jnp.float32).reshape(
        400, 20
    )  # the pair-table size of the TD benchmark
    idx = jnp.asarray(np.random.default_rng(0).integers(0, 400, 2**22), jnp.int32)
    t = rate(lambda tb, i: jnp.sum(tb[i]), table, idx)
    print(
        f"gather of 20-float rows, 32 kB table  {idx.size / t / 1e6:8.1f} M rows/s "
        f"({idx.size * 80 / t / 1e9:.1f} GB/s)"
    )
    key = jax.random.key(0)
    t = rate(lambda k: jnp.sum(_prng.bits(k, (2**24,))), key)
    print(f"threefry-2x32 hash (fused)       {2**24 / t / 1e6:8.1f} M words/s")
    x = jnp.ones((2**22,), jnp.float32)

    def poly(v):  # 64 dependent multiply-adds per element in one fused loop: compute-bound
        for _ in range(64):
            v = v * 0.999 + 0.001
        return jnp.sum(v)

    t = rate(poly, x)
    print(f"multiply-add (64 per element)    {2 * 64 * x.size / t / 1e9:8.1f} GFLOP/s")


if __name__ == "__main__":
    main()
