"""Federated LSA with Gaussian multiplicative and additive noise.

Agent ``c`` observes, at every local step, a fresh independent draw

    A_c(Z) = A_bar[c] + noise_A[c] * G,    b_c(Z) = b_bar[c] + noise_b[c] * g,

with ``G (d, d)`` and ``g (d,)`` i.i.d. standard normal.

Sampling note: the algorithms only ever use the direction
``A_c(Z) theta - b_c(Z)`` at the one ``theta`` of the step at which Z is drawn,
and given ``theta`` its noise ``noise_A G theta - noise_b g`` is
``N(0, (noise_A^2 |theta|^2 + noise_b^2) I)`` (``G theta ~ N(0, |theta|^2 I)``,
independent of ``g``). We therefore draw it as
``sqrt(noise_A^2 |theta|^2 + noise_b^2) z`` with one ``z ~ N(0, I_d)`` per step:
the law of every trajectory is exactly the model's, at d normals per step
instead of d^2 + d. ``A_c(Z)`` is never formed; a step costs the mean part
``A_bar[c] theta`` (d^2 multiply-adds) and O(d).

The normals are ``jax.random.normal``'s values, drawn with the fused threefry
(:func:`fedsa_jax._prng.normal`) as one flat ``(N, H d)`` block per round.

Layout of the local steps (:meth:`GaussianLSA.error_local_steps`). Vmapped the usual way, one
step's work sits in arrays ``(seeds, agents, d)`` whose short minor axis ``d`` leaves XLA:CPU two
transposes around the batched ``A_bar[c] @ e`` and an unvectorised ``|theta|^2`` per step. The H
local steps therefore run in a custom batching rule with the agents leading and the seeds last,
``(agents, d, seeds)``: the product is one ``(d, d) x (d, seeds)`` GEMM per agent and every other
operation vectorises along the seeds; the transposes happen once per round. Measured
(``benchmarks/kernel_paths.py``): see ``benchmarks/README.md``.

References: Mangold et al., "SCAFFLSA: Taming Heterogeneity in Federated Linear
Stochastic Approximation and TD Learning", NeurIPS 2024, arXiv:2402.04114 (A1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate, registry
from fedsa_jax.problems import fused
from fedsa_jax.problems._base import fixed_points
from fedsa_jax.problems.protocol import local_unroll

__all__ = ["GaussianLSA", "gaussian_lsa", "random_gaussian_lsa"]


class GaussianParams(NamedTuple):
    A_bar: jax.Array  # (d, d)
    b_bar: jax.Array  # (d,)
    noise_A: jax.Array  # ()
    noise_b: jax.Array  # ()
    residual_star: jax.Array  # (d,) A_bar theta_star - b_bar (from float64)
    agent: jax.Array | None = None  # () int32, the agent's index c (the fused kernel reads its tables by it)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GaussianLSA:
    """Gaussian federated LSA problem (see module docstring). Build it with
    :func:`gaussian_lsa` or :func:`random_gaussian_lsa`."""

    A_bar: jax.Array  # (N, d, d)
    b_bar: jax.Array  # (N, d)
    noise_A: jax.Array  # (N,)
    noise_b: jax.Array  # (N,)
    theta_star: jax.Array  # (d,)
    local_theta_star: jax.Array  # (N, d)
    residual_star: jax.Array  # (N, d) A_bar[c] theta_star - b_bar[c], computed in float64

    @property
    def num_agents(self) -> int:
        return self.A_bar.shape[0]

    @property
    def dim(self) -> int:
        return self.A_bar.shape[-1]

    @property
    def dtype(self):
        return self.A_bar.dtype

    def agent_params(self) -> GaussianParams:
        return GaussianParams(
            self.A_bar,
            self.b_bar,
            self.noise_A,
            self.noise_b,
            self.residual_star,
            jnp.arange(self.num_agents, dtype=jnp.int32),
        )

    def init_sampler(self, key: jax.Array, params: GaussianParams) -> jax.Array:
        del key, params
        return jnp.zeros((), jnp.int32)  # i.i.d. observations carry no state

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> jax.Array:
        """All agents' normals for one round, one flat block ``(num_agents, num_obs * d)``
        (flat so that ``erf_inv`` vectorises; :meth:`observe` reshapes it)."""
        # i.i.d. observations: discarding skip-1 of every skip leaves the law unchanged.
        del skip
        return _prng.normal(key, (num_agents, num_obs * self.dim), self.dtype)

    def observe(self, params: GaussianParams, sampler: jax.Array, z: jax.Array, skip: int = 1):
        """One agent's observations: ``z (num_obs, d)``, one standard normal vector per step."""
        del params, skip
        return z.reshape(-1, self.dim), sampler

    @staticmethod
    def _noise(params: GaussianParams, z: jax.Array, theta: jax.Array) -> jax.Array:
        """``noise_A G theta - noise_b g`` given ``theta``: ``sqrt(noise_A^2 |theta|^2 + noise_b^2) z``."""
        var = params.noise_A**2 * jnp.sum(theta * theta) + params.noise_b**2
        return jnp.sqrt(var) * z

    def direction(self, params: GaussianParams, obs: jax.Array, theta: jax.Array) -> jax.Array:
        """``A_c(Z) theta - b_c(Z) = A_bar theta - b_bar + noise`` (see :meth:`_noise`)."""
        return params.A_bar @ theta - params.b_bar + self._noise(params, obs, theta)

    def error_direction(self, params: GaussianParams, obs: jax.Array, error: jax.Array) -> jax.Array:
        """The direction at ``theta_star + error``, accurate in ``error``:
        ``A_bar error + (A_bar theta_star - b_bar) + noise``."""
        return params.A_bar @ error + params.residual_star + self._noise(params, obs, self.theta_star + error)

    def error_local_steps(
        self,
        params: GaussianParams,
        z: jax.Array,
        error: jax.Array,
        step_sizes: jax.Array,
        control: jax.Array,
    ):
        """H local steps of one agent in error coordinates, ``e <- e - eta_h (A_bar e + residual_star
        + noise_h - control)`` (the scan of :meth:`error_direction` in
        :func:`fedsa_jax.algorithms.local_updates`), laid out for vmapping (module docstring).
        ``z (H, d)``, ``step_sizes (H,)``, ``control (d,)``. ``None`` for a subclass that
        changes the directions (the algorithms then scan :meth:`error_direction`)."""
        cls = type(self)
        if cls.error_direction is not GaussianLSA.error_direction or cls._noise is not GaussianLSA._noise:
            return None
        # the fused kernel (fj.Execution(fused_local_steps=True)) reads the problem's own tables by the
        # agent's index: not for a subclass whose agent_params give other values
        d, own = self.dim, cls.agent_params is GaussianLSA.agent_params and params.agent is not None
        if own and fused.usable(d * d + 5 * d, self.dtype):  # kept: A_bar[c], residual, e, control, theta*
            return fused.gaussian_local_steps(self, params.agent, z, error, step_sizes, control)
        args = (
            params.A_bar,
            params.residual_star,
            params.noise_A,
            params.noise_b,
            self.theta_star,
            z,
            error,
            step_sizes,
            control,
        )
        return _batched_steps(0, 0)(*args)

    def noise_second_moment(self):
        """``cov(m, X) = (noise_A[c]^2 tr(X[c]) + noise_b[c]^2) I`` (N, d, d): the noise
        ``noise_A G x - noise_b g`` has that covariance given x (the protocol's
        ``noise_second_moment``; float64 numpy). ``None`` for a subclass with its own noise."""
        if type(self)._noise is not GaussianLSA._noise:
            return None
        N, d = self.num_agents, self.dim
        sA = np.broadcast_to(np.asarray(self.noise_A, np.float64), (N,))
        sb = np.broadcast_to(np.asarray(self.noise_b, np.float64), (N,))

        def cov(m, X):
            scale = sA**2 * np.trace(X, axis1=1, axis2=2) + sb**2
            return scale[:, None, None] * np.eye(d)

        return cov

    def describe(self) -> dict[str, Any]:
        return {"family": "gaussian_lsa", "num_agents": self.num_agents, "dim": self.dim}


# error_local_steps' arguments, unbatched: A_bar (d, d), residual_star (d,), noise_A (), noise_b (),
# theta_star (d,), z (H, d), error (d,), step_sizes (H,), control (d,); error is the carry.
_ERROR = 6


def _batched_steps(front: int, back: int):
    """The local steps for arguments with ``front`` leading and ``back`` trailing batch axes
    (``(*front, *core, *back)``): each vmap level adds one, leading where ``A_bar`` is batched
    (agents), trailing otherwise (seeds, sweep configurations)."""

    @jax.custom_batching.custom_vmap
    def steps(*args):
        return _steps_laid_out(front, back, args)

    @steps.def_vmap
    def rule(axis_size, in_batched, *args):
        lead = bool(in_batched[0])  # A_bar batched at this level: a leading axis
        moved = []
        for i, (x, batched) in enumerate(zip(args, in_batched)):
            if i == _ERROR and not batched:  # the carry has every batch axis
                x = jnp.broadcast_to(x, (axis_size,) + x.shape)
            elif not batched:
                x = x[None]
            moved.append(x if lead else jnp.moveaxis(x, 0, -1))
        out = _batched_steps(front + lead, back + (not lead))(*moved)
        return (out if lead else jnp.moveaxis(out, -1, 0)), True

    return steps


def _steps_laid_out(front: int, back: int, args):
    """The scan, on arguments ``(*front, *core, *back)`` (size 1 where unbatched), in the layout
    ``(F, d, B)``: ``F`` the leading batch axes (agents) flattened, ``B`` the trailing ones (seeds)."""
    e = args[_ERROR]
    fshape, bshape = e.shape[:front], e.shape[e.ndim - back :]
    F, B = math.prod(fshape), math.prod(bshape)

    def canon(x):  # (*front, *core, *back) -> (F or 1, *core, B or 1)
        f, b = x.shape[:front], x.shape[x.ndim - back :]
        core = x.shape[front : x.ndim - back]
        f = fshape if f != fshape and any(n != 1 for n in f) else f
        b = bshape if b != bshape and any(n != 1 for n in b) else b
        x = jnp.broadcast_to(x, f + core + b)
        return x.reshape((math.prod(f),) + core + (math.prod(b),))

    A, res, sA, sb, ts, z, e, eta, ctrl = map(canon, args)
    A = A[..., 0]  # (F|1, d, d): A_bar is batched along leading axes only
    z = jnp.moveaxis(z, 1, 0)  # (H, F|1, d, B|1)
    eta = jnp.moveaxis(eta, 1, 0)[:, :, None]  # (H, F|1, 1, B|1)
    sA, sb = sA[:, None], sb[:, None]  # (F|1, 1, B|1)

    def step(x, inputs):
        z_h, eta_h = inputs
        theta = ts + x
        var = sA**2 * jnp.sum(theta * theta, axis=1, keepdims=True) + sb**2
        g = jnp.einsum("fij,fjb->fib", A, x) + res + jnp.sqrt(var) * z_h
        return x - eta_h * (g - ctrl), None

    unroll = local_unroll(z.shape[0])
    out, _ = jax.lax.scan(step, jnp.broadcast_to(e, (F,) + e.shape[1:-1] + (B,)), (z, eta), unroll=unroll)
    return out.reshape(fshape + out.shape[1:2] + bshape)


def _per_agent(name: str, value: Any, num_agents: int) -> np.ndarray:
    arr = _validate.array(name, value, (0, 1))
    if arr.ndim == 1 and arr.shape[0] != num_agents:
        _validate.fail(name, value, f"expected a scalar or shape ({num_agents},) (one per agent)")
    if np.any(arr < 0):
        _validate.fail(name, value, "noise levels must be >= 0")
    return np.broadcast_to(arr, (num_agents,)).copy()


def gaussian_lsa(A_bar, b_bar, noise_A=0.0, noise_b=0.0, dtype=None) -> GaussianLSA:
    """Gaussian federated LSA problem from explicit arrays.

    Args:
      A_bar: ``(N, d, d)`` mean matrices, one per agent.
      b_bar: ``(N, d)`` mean vectors.
      noise_A: std of each entry of ``A_c(Z) - A_bar[c]`` (scalar or ``(N,)``).
      noise_b: std of each entry of ``b_c(Z) - b_bar[c]`` (scalar or ``(N,)``).
      dtype: ``float32`` or ``float64`` (needs x64); default follows ``A_bar``.

    Example:
      >>> import numpy as np, fedsa_jax as fj
      >>> p = fj.problems.gaussian_lsa(np.stack([np.eye(2)] * 3), np.ones((3, 2)), 0.1, 0.1)
      >>> p.theta_star.shape
      (2,)
    """
    dt = _validate.float_dtype("dtype", dtype, default_from=getattr(A_bar, "dtype", None), source="A_bar")
    A = _validate.array("A_bar", A_bar, 3)
    b = _validate.array("b_bar", b_bar, 2)
    N, d, d2 = A.shape
    if N < 1 or d < 1 or d != d2:
        _validate.fail("A_bar", A_bar, "expected shape (num_agents >= 1, d, d)")
    if b.shape != (N, d):
        _validate.fail("b_bar", b_bar, f"expected shape ({N}, {d}) to match A_bar {A.shape}")
    sA = _per_agent("noise_A", noise_A, N)
    sb = _per_agent("noise_b", noise_b, N)
    theta_star, local = fixed_points(A, b)
    residual = np.einsum("cij,j->ci", A, theta_star) - b
    for name, value, values, what in (
        ("A_bar", A_bar, A, "entries"),
        ("b_bar", b_bar, b, "entries"),
        ("noise_A", noise_A, sA, "entries"),
        ("noise_b", noise_b, sb, "entries"),
        ("b_bar", b_bar, theta_star, "the fixed point theta_star's entries"),
        ("b_bar", b_bar, local, "the agents' fixed points' entries"),
        ("b_bar", b_bar, residual, "the residuals A_bar[c] theta_star - b_bar[c]"),
    ):
        _validate.fits(name, value, values, dt, what)
    cast = lambda x: jnp.asarray(x, dtype=dt)  # noqa: E731
    return GaussianLSA(cast(A), cast(b), cast(sA), cast(sb), cast(theta_star), cast(local), cast(residual))


def random_gaussian_lsa(
    key,
    num_agents: int = 10,
    dim: int = 5,
    heterogeneity: float = 1.0,
    noise_A: float = 0.1,
    noise_b: float = 0.5,
    eig_range: tuple[float, float] = (0.5, 1.5),
    dtype=None,
) -> GaussianLSA:
    """Random heterogeneous Gaussian LSA problem.

    ``A_bar[c] = A_0 + h E_c`` and ``b_bar[c] = b_0 + h e_c``, where ``A_0`` is
    symmetric with eigenvalues spread over ``eig_range``, ``E_c`` is a random
    symmetric matrix of spectral norm ``eig_range[0] / 2`` (so every ``A_bar[c]``
    stays positive definite for ``h <= 1``), ``b_0, e_c ~ N(0, I)``.

    Args:
      key: JAX PRNG key (the problem is a deterministic function of it).
      heterogeneity: ``h`` in ``[0, 1]``; 0 makes all agents identical.

    ``num_agents`` and ``dim`` are integers in ``[1, 2^31 - 1]`` with ``num_agents dim^2 <= 2^31 - 1``.
    """
    N = _validate.integer("num_agents", num_agents, maximum=_validate.INDEX_MAX)
    d = _validate.integer("dim", dim, maximum=_validate.INDEX_MAX)
    name, value = ("dim", dim) if d * d > _validate.INDEX_MAX else ("num_agents", num_agents)
    _validate.table_size(name, value, N * d * d, "num_agents x dim^2 (the matrices A_bar)")
    h = _validate.real("heterogeneity", heterogeneity, 0.0, 1.0)
    lo, hi = (_validate.real("eig_range", e, 0.0, np.inf, low_open=True) for e in eig_range)
    if hi < lo:
        _validate.fail("eig_range", eig_range, "expected (low, high) with 0 < low <= high")
    rng = _validate.rng_from_key(key)
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    A0 = Q @ np.diag(np.linspace(lo, hi, d)) @ Q.T
    E = rng.standard_normal((N, d, d))
    E = E + np.swapaxes(E, 1, 2)
    E *= (lo / 2) / np.linalg.norm(E, ord=2, axis=(1, 2))[:, None, None]
    A = A0[None] + h * E
    b = rng.standard_normal(d)[None] + h * rng.standard_normal((N, d))
    return gaussian_lsa(A, b, noise_A, noise_b, dtype=dtype)


NOISE_A = registry.Option(
    ("--noise-A",),
    "noise_A",
    "gaussian: std of A(Z) entries",
    registry.real,
    0.1,
    group="problem",
    params=("noise_A",),
)
NOISE_B = registry.Option(
    ("--noise-b",),
    "noise_b",
    "gaussian: std of b(Z) entries",
    registry.real,
    0.5,
    group="problem",
    params=("noise_b",),
)


def _from_options(key, args):
    level = {"homogeneous": 0.0, "heterogeneous": 1.0}.get(args.heterogeneity, args.heterogeneity)
    return random_gaussian_lsa(
        key,
        num_agents=args.agents,
        dim=args.dim or 5,
        heterogeneity=level,  # pyright: ignore[reportArgumentType]
        noise_A=args.noise_A,
        noise_b=args.noise_b,
        dtype=args.dtype,
    )


registry.register_problem(
    "gaussian",
    _from_options,
    options=(registry.HETEROGENEITY, NOISE_A, NOISE_B),
    note="random Gaussian LSA",
    order=1,
)
