"""Fused local steps: each agent's H local steps in one Pallas kernel, its iterate kept on chip.

The algorithms' local steps are a ``lax.scan`` over H. Compiled by XLA, every step of that scan reads
and writes every seed's and agent's iterate (and reads its observation) from memory: on a GPU, the
iterate's traffic bounds the step. Here one kernel runs a block of *rows* (one row: one agent of one
seed, for one round) through all H steps, with the row's iterate in registers: it reads the row's
start, control and H observations once and writes its end once.

Kernels (one per problem family, each the same update as the family's ``error_direction`` scanned by
:func:`fedsa_jax.algorithms.local_updates`, in error coordinates ``e = theta - theta_star``):

* :func:`td_local_steps`, federated TD(0) with pair tables (:mod:`fedsa_jax.problems.td`):
  ``e <- e - eta_h ((psi(Z_h)^T e + k_c(Z_h)) phi(s_h) - control)`` with the row
  ``[phi(s) | psi = phi(s) - gamma phi(s')]`` and the constant ``k_c = v(s) - gamma v(s') - r_c(s)``
  read from the tables by the pair index ``s S + s'`` of each step;
* :func:`gaussian_local_steps`, Gaussian LSA (:mod:`fedsa_jax.problems.gaussian`):
  ``e <- e - eta_h (A_bar[c] e + residual_c + sqrt(noise_A^2 |theta_star + e|^2 + noise_b^2) z_h
  - control)``, the agent's ``A_bar[c]`` read once per row.

Same numbers: the kernels take the observations the problem's ``observe`` made from the round's
block of random numbers (the pair indices, the normals), so they consume the same random numbers as
the scan, and their iterates equal the scan's to float rounding (the sums run in another order:
measured below 1e-12 relative in float64 over whole runs, ``tests/test_fused.py``).

Layout: the vmaps over agents and seeds (and a sweep's configurations) are merged into one axis of
rows (:func:`fedsa_jax.problems.protocol.merged_vmaps`); the kernel reads every per-row array by
coordinate, laid out per backend (``LAYOUT``: transposed, ``(K, rows)``, for contiguous loads, or as
the scan holds it, ``(rows, K)``), and keeps the iterate as ``d`` vectors of the block's rows (no
power-of-two padding of ``d``). A kernel runs while the values a row
keeps live through its steps fit in a GPU thread's registers (:func:`usable`: TD keeps ``4d``, the
iterate, the control and the step's two rows; Gaussian LSA ``d^2 + 5d``, with ``A_bar[c]``): TD up to
``d = 40`` in float32 (20 in float64), Gaussian LSA up to ``d = 10`` (6); larger ones keep the scan
on every backend. The tables are read
whole by every program (gathers from a cache-resident table).

Backends: on a GPU the kernel is compiled by Pallas's Triton backend (which JAX 0.11 deprecates in
favour of Mosaic GPU: it warns as the kernel compiles; a Mosaic GPU port is left to do); elsewhere it
runs in Pallas's interpret mode (the same kernel as XLA operations, a loop over the blocks), which the
test suite runs on a CPU so that the kernel cannot rot without a GPU. Whether a run uses it is
``fj.Execution(fused_local_steps=...)`` (default per backend,
:data:`fedsa_jax.problems.protocol.FUSED_LOCAL_STEPS`).

Reference: Pallas, JAX's kernel language, https://docs.jax.dev/en/latest/pallas/ (the Triton
backend: ``jax.experimental.pallas.triton``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt  # the GPU's backend

from fedsa_jax.problems.protocol import fused_local_steps, merged_vmaps

__all__ = ["gaussian_local_steps", "td_local_steps", "usable"]

# Rows per program, per backend: on a GPU one row per thread of 4 warps. Elsewhere (interpret mode) one
# program takes every row: a grid of blocks becomes a loop of slices that XLA can neither vectorise
# across nor split over devices (on the 2-core CPU, TD at 10,000 rows: 4.6x slower in blocks of 8192,
# 4x in 4096, 16x in 256; benchmarks/kernel_paths.py --fused --block-rows).
BLOCK_ROWS = {"gpu": 128}
# How the kernel reads the per-row arrays, per backend: "columns", transposed to (K, rows), so that a
# block's load of one coordinate is contiguous (a GPU's coalesced loads; XLA transposes the inputs and
# the output around the kernel, a pass over them each), or "rows", (rows, K) as the scan holds them (no
# transposition; a load strides by K, from lines that stay cached through a row's H steps). CPU:
# "columns", 1.39-1.59x "rows" for TD and 1.08-1.10x for Gaussian LSA on the 2-core CPU (two runs of
# benchmarks/kernel_paths.py --fused --layouts); GPU: "columns" until benchmarks/gpu.py has measured both.
LAYOUT = {"gpu": "columns", "cpu": "columns"}
# 32-bit registers a row (one GPU thread) may keep live through its steps: a GPU thread has at most 255,
# and the kernel needs some for its indices and temporaries; beyond it the values would spill to memory.
MAX_LIVE_WORDS = 160


def usable(live_values: int, dtype) -> bool:
    """Whether a fused kernel runs now: chosen (:func:`~fedsa_jax.problems.protocol.fused_local_steps`);
    ``live_values`` floats of ``dtype`` per row (what the kernel keeps through its steps) within
    ``MAX_LIVE_WORDS`` 32-bit words; and on a GPU one device in all, ``jax.device_count() == 1`` (the
    seeds sharded over several GPUs would reach a Triton kernel that XLA's partitioner cannot split:
    it would gather every row onto each device; there the scan runs). In interpret mode the kernel is
    XLA operations, sharded like the scan."""
    words = live_values * max(1, jnp.dtype(dtype).itemsize // 4)
    return fused_local_steps() and words <= MAX_LIVE_WORDS and (_interpret() or jax.device_count() == 1)


def _interpret() -> bool:
    return jax.default_backend() != "gpu"


def _compiler_params():
    return None if _interpret() else plt.CompilerParams(num_warps=4, num_stages=1)


def _row_arrays(batched, args, per_row):
    """The per-row arguments ``args[i]`` (``i`` in ``per_row``) with the merged axis of rows leading
    (broadcast where an argument is shared by the rows), and the number of rows."""
    flags = [jax.tree.leaves(b) for b in batched]
    size = next(a.shape[0] for a, f in zip(args, flags) if f and f[0])
    out = []
    for i, (a, f) in enumerate(zip(args, flags)):
        if i in per_row and not (f and f[0]):
            a = jnp.broadcast_to(a, (size,) + a.shape)
        out.append(a)
    return out, size


class _Coordinates:
    """A block of per-row arrays seen by coordinate: ``view[k]`` is coordinate k of every row of the
    block (a vector), whatever the layout (``"columns"``: the ref is ``(K, rows)``; ``"rows"``:
    ``(rows, K)``); ``view[k] = x`` stores one."""

    def __init__(self, ref, by_rows: bool):
        self.ref, self.by_rows = ref, by_rows

    def __getitem__(self, k):
        return self.ref[:, k] if self.by_rows else self.ref[k, :]

    def __setitem__(self, k, value):
        if self.by_rows:
            self.ref[:, k] = value
        else:
            self.ref[k, :] = value


def _call_rows(kernel, columns, shared, dim: int, dtype, num_rows: int):
    """Run ``kernel(*column_views, *shared_refs, out_view)`` over blocks of rows.

    ``columns``: per-row arrays, each ``(num_rows, K)``, laid out as ``LAYOUT`` says and seen by the
    kernel by coordinate (:class:`_Coordinates`); ``shared``: arrays every program reads whole.
    Returns ``(num_rows, dim)``."""
    if _interpret():  # one program of every row unless set (any block shape will do: no padding)
        block = min(BLOCK_ROWS.get(jax.default_backend()) or num_rows, num_rows)
    else:  # Triton: a power of two
        block = min(BLOCK_ROWS["gpu"], pl.next_power_of_2(num_rows))
    by_rows = LAYOUT.get(jax.default_backend(), LAYOUT["cpu"]) == "rows"
    padded = pl.cdiv(num_rows, block) * block
    flat = [c.reshape(num_rows, -1) for c in columns]
    if by_rows:
        cols = [jnp.pad(c, ((0, padded - num_rows), (0, 0))) for c in flat]
        spec = lambda k: pl.BlockSpec((block, k), lambda i: (i, 0))  # noqa: E731
        out_shape, sizes = (padded, dim), [c.shape[1] for c in cols]
    else:
        cols = [jnp.pad(c.T, ((0, 0), (0, padded - num_rows))) for c in flat]
        spec = lambda k: pl.BlockSpec((k, block), lambda i: (0, i))  # noqa: E731
        out_shape, sizes = (dim, padded), [c.shape[0] for c in cols]
    whole = lambda a: pl.BlockSpec(a.shape, lambda i: (0,) * a.ndim)  # noqa: E731

    def viewed(*refs):
        n = len(cols)
        views = [_Coordinates(r, by_rows) for r in refs[:n]]
        kernel(*views, *refs[n:-1], _Coordinates(refs[-1], by_rows))

    out = pl.pallas_call(
        viewed,
        out_shape=jax.ShapeDtypeStruct(out_shape, dtype),
        grid=(padded // block,),
        in_specs=[spec(k) for k in sizes] + [whole(a) for a in shared],
        out_specs=spec(dim),
        interpret=_interpret(),
        compiler_params=_compiler_params(),
        name="fused_local_steps",
    )(*cols, *shared)
    return out[:num_rows] if by_rows else out[:, :num_rows].T


# The kernels' per-row arguments (agent index, observations, error, control); the step sizes (argument 3)
# are per row only where batched.
_PER_ROW = (0, 1, 2, 4)


def _one_row(rows_fn):
    """``rows_fn`` for an unbatched call (one agent, not vmapped): the kernel on one row."""

    def call(*args):
        batched = tuple(i in _PER_ROW for i in range(len(args)))
        lifted = [a[None] if i in _PER_ROW else a for i, a in enumerate(args)]
        return rows_fn(batched, *lifted)[0]

    return call


def _loop(num_steps: int, step, carry):
    return jax.lax.fori_loop(0, num_steps, step, carry)


# ------------------------------------------------------------------------------------------------
# Federated TD(0) with pair tables


def _td_kernel(d, H, S2, eta_per_row, c_ref, pair_ref, e_ref, ctrl_ref, *refs):
    if eta_per_row:
        eta_ref, rows_ref, const_ref, out_ref = refs
    else:
        rows_ref, const_ref, eta_ref, out_ref = refs
    offset = c_ref[0] * S2
    ctrl = [ctrl_ref[j] for j in range(d)]

    def step(h, e):
        pair = pair_ref[h]
        base = pair * (2 * d)
        phi = [rows_ref[base + j] for j in range(d)]
        psi = [rows_ref[base + d + j] for j in range(d)]
        g = functools.reduce(lambda acc, j: acc + psi[j] * e[j], range(1, d), psi[0] * e[0])
        g = g + const_ref[offset + pair]
        eta = eta_ref[h]  # the step's size: a scalar, or a vector of the rows' own
        return tuple(e[j] - eta * (g * phi[j] - ctrl[j]) for j in range(d))

    e = _loop(H, step, tuple(e_ref[j] for j in range(d)))
    for j in range(d):
        out_ref[j] = e[j]


def _td_rows(batched, c, pair, error, etas, control, rows, const):
    (c, pair, error, etas, control), num_rows = _row_arrays(
        batched[:5], (c, pair, error, etas, control), _PER_ROW
    )
    d, H = error.shape[-1], pair.shape[-1]
    S2 = rows.shape[0] // (2 * d)
    eta_per_row = etas.ndim == 2
    columns = [c, pair, error, control] + ([etas] if eta_per_row else [])
    shared = [rows, const] + ([] if eta_per_row else [etas])
    kernel = functools.partial(_td_kernel, d, H, S2, eta_per_row)
    return _call_rows(kernel, columns, shared, d, error.dtype, num_rows)


_td_merged = merged_vmaps(_one_row(_td_rows), rows=_td_rows)


def td_local_steps(problem, c, pair, error, step_sizes, control):
    """One agent's H local steps of federated TD(0) with pair tables (module docstring), as the fused
    kernel once vmapped: ``pair (H,)`` the steps' pair indices, ``error``, ``control (d,)``,
    ``step_sizes (H,)``. ``problem`` is a :class:`~fedsa_jax.problems.td.FederatedTD` with
    ``pair_tables``."""
    return _td_merged(c, pair, error, step_sizes, control, problem.pair_rows.reshape(-1), problem.pair_const)


# ------------------------------------------------------------------------------------------------
# Gaussian LSA


def _gaussian_kernel(d, H, eta_per_row, c_ref, z_ref, e_ref, ctrl_ref, *refs):
    if eta_per_row:
        eta_ref, A_ref, res_ref, sA_ref, sb_ref, star_ref, out_ref = refs
    else:
        A_ref, res_ref, sA_ref, sb_ref, star_ref, eta_ref, out_ref = refs
    c = c_ref[0]
    A = [[A_ref[c * (d * d) + i * d + j] for j in range(d)] for i in range(d)]
    res = [res_ref[c * d + i] for i in range(d)]
    sA2, sb2 = sA_ref[c] ** 2, sb_ref[c] ** 2
    star = [star_ref[i] for i in range(d)]
    ctrl = [ctrl_ref[i] for i in range(d)]

    def dot(u, v):
        return functools.reduce(lambda acc, j: acc + u[j] * v[j], range(1, d), u[0] * v[0])

    def step(h, e):
        theta = [star[i] + e[i] for i in range(d)]
        scale = jnp.sqrt(sA2 * dot(theta, theta) + sb2)
        eta = eta_ref[h]
        g = [dot(A[i], e) + res[i] + scale * z_ref[h * d + i] for i in range(d)]
        return tuple(e[i] - eta * (g[i] - ctrl[i]) for i in range(d))

    e = _loop(H, step, tuple(e_ref[i] for i in range(d)))
    for i in range(d):
        out_ref[i] = e[i]


def _gaussian_rows(batched, c, z, error, etas, control, A, res, sA, sb, star):
    (c, z, error, etas, control), num_rows = _row_arrays(batched[:5], (c, z, error, etas, control), _PER_ROW)
    d, H = error.shape[-1], z.shape[-2]
    eta_per_row = etas.ndim == 2
    columns = [c, z.reshape(num_rows, H * d), error, control] + ([etas] if eta_per_row else [])
    shared = [A, res, sA, sb, star] + ([] if eta_per_row else [etas])
    kernel = functools.partial(_gaussian_kernel, d, H, eta_per_row)
    return _call_rows(kernel, columns, shared, d, error.dtype, num_rows)


_gaussian_merged = merged_vmaps(_one_row(_gaussian_rows), rows=_gaussian_rows)


def gaussian_local_steps(problem, c, z, error, step_sizes, control):
    """One agent's H local steps of Gaussian LSA (module docstring), as the fused kernel once vmapped:
    ``c`` the agent's index, ``z (H, d)`` its normals."""
    return _gaussian_merged(
        c,
        z,
        error,
        step_sizes,
        control,
        problem.A_bar.reshape(-1),
        problem.residual_star.reshape(-1),
        problem.noise_A,
        problem.noise_b,
        problem.theta_star,
    )
