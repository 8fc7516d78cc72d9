"""The problem protocol: what every algorithm, the driver and the exact theory read.

A federated LSA problem has N agents; agent c has a mean system
``A_bar[c] (d, d)``, ``b_bar[c] (d,)`` and an oracle of unbiased noisy draws
``A_c(Z), b_c(Z)`` (``E[A_c(Z)] = A_bar[c]``, ``E[b_c(Z)] = b_bar[c]``). The
algorithms only ever use the *direction* ``A_c(Z) theta - b_c(Z)`` at one
``theta``, so a problem never has to form ``A_c(Z)``.

Any object with the members of :class:`Problem` works with every algorithm,
:func:`fedsa_jax.simulate` and :func:`fedsa_jax.theory.exact_mean`; with the
optional ``finite_support()`` (:class:`FiniteSupport`) or ``noise_second_moment()``
(the law of its noise) also with :func:`fedsa_jax.theory.exact_mse`.
:func:`missing_members` names what an object
lacks. The built-in families
(:func:`~fedsa_jax.problems.gaussian_lsa`, :func:`~fedsa_jax.problems.federated_td`,
:func:`~fedsa_jax.problems.least_squares`, :func:`~fedsa_jax.problems.expected`)
are written this way; ``problems/regression.py`` (least squares) is the short example to copy.

Pytree: a problem is a frozen dataclass registered with
``jax.tree_util.register_dataclass``. Its arrays are leaves: they enter the
compiled kernel as arguments, so new values (another data set of the same
shapes) never recompile. Structural options (a sampling mode, a number of
states used as a Python ``int``) are static fields,
``dataclasses.field(metadata=dict(static=True))``: they are part of the treedef,
must be hashable, are compared by the jit cache (a new value compiles a new
kernel) and may be used in Python control flow. Anything the kernel reads must
be one or the other; derived quantities (``num_agents``, ``dim``, ``dtype``) are
properties of the leaves' shapes.

Example (a scalar problem, ``A_c(Z) = a_c``, ``b_c(Z) = b_c + z``, z standard
normal)::

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Scalar:
        A_bar: jax.Array             # (N, 1, 1)
        b_bar: jax.Array             # (N, 1)
        theta_star: jax.Array        # (1,)
        local_theta_star: jax.Array  # (N, 1)
        num_agents = property(lambda self: self.A_bar.shape[0])
        dim = property(lambda self: 1)
        dtype = property(lambda self: self.A_bar.dtype)
        def agent_params(self): return (self.A_bar, self.b_bar)
        def init_sampler(self, key, params): return jnp.zeros((), jnp.int32)
        def randomness(self, key, num_agents, num_obs, skip=1):
            return jax.random.normal(key, (num_agents, num_obs), self.dtype)
        def observe(self, params, sampler, rand, skip=1): return rand, sampler
        def direction(self, params, z, theta): return params[0] @ theta - params[1] - z
        def describe(self): return {"family": "scalar", "num_agents": self.num_agents}
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

from fedsa_jax import _validate

__all__ = [
    "FiniteSupport",
    "Problem",
    "check_linear",
    "direction_second_moment",
    "follows_iterate",
    "missing_members",
]


@runtime_checkable
class Problem(Protocol):
    """A federated LSA problem, as read by the algorithms, the driver and the theory.

    **What runs inside the kernel** (pure JAX; jit- and vmap-friendly, no Python
    control flow on leaf values). ``init_sampler``, ``observe`` and ``direction``
    are written for **one agent**: the algorithms ``vmap`` over agents the leading
    axis N of ``agent_params()``, of the samplers and of the round's
    ``randomness(...)`` block, with the problem itself *unbatched* (closed over),
    so tables stored on the problem are read with plain gathers. The driver then
    vmaps over seeds (``randomness`` and the carried samplers; the problem
    again unbatched) and scans rounds.

    **What runs on the host**: the arrays ``A_bar``, ``b_bar``, ``theta_star``,
    ``local_theta_star`` and ``describe()`` are read with numpy by the driver
    (``theta_star`` also inside the kernel, for the squared error) and by
    :mod:`fedsa_jax.theory`.

    Optional members, used when present:

    * ``error_direction(params, obs, error) -> (d,)``: the direction at
      ``theta_star + error``, i.e. ``A_c(Z) error + (A_c(Z) theta_star - b_c(Z))``,
      with the residual at the optimum computed from float64 values, so that it is
      accurate *relative to* ``error``. The built-in algorithms iterate on
      ``error = theta - theta_star`` (see :mod:`fedsa_jax.algorithms`): in float32,
      updates ``eta (A theta - b)`` far below the resolution of ``theta`` itself are
      then kept. Without it they use ``direction(params, obs, theta_star + error)``.
    * ``error_local_steps(params, obs, error, step_sizes, control) -> (d,)`` or ``None``:
      one agent's H local steps ``e <- e - eta_h (direction at theta_star + e - control)``
      (``obs`` with leading axis H, ``step_sizes (H,)``, ``control (d,)``, zero for FedLSA),
      when the problem can lay them out better than a vmapped scan of
      ``error_direction`` (FedLSA and SCAFFLSA call it; ``None`` declines). The
      Gaussian family does (a custom batching rule, seeds minor; see
      ``problems/gaussian.py``), and it and federated TD run a fused kernel there when the run asks
      for one (:mod:`fedsa_jax.problems.fused`); the results must equal the scan's to rounding.
    * ``finite_support() -> FiniteSupport``: for observations with finitely many
      values per agent; makes :func:`fedsa_jax.theory.exact_mse` exact for the
      problem (see :class:`FiniteSupport`).
    * ``noise_second_moment() -> cov`` or ``None``: the second moment of the
      observation noise, for a problem whose law is not a finite support (Gaussian
      LSA, generative TD), as a function ``cov(m, X) -> (N, d, d)``: for each agent
      c, ``E[w w^T]`` of the noise ``w = (A_c(Z) x - b_c(Z)) - (A_bar[c] x - b_bar[c])``
      of the direction at an iterate x independent of Z with ``E[x] = m[c]``,
      ``E[x x^T] = X[c]`` (``m (N, d)``, ``X (N, d, d)``, float64 numpy). It must be
      linear in ``(m, X)`` (it is whenever A_c(Z) and b_c(Z) have second moments:
      ``E[w w^T] = E[(A(Z) x - b(Z))(...)^T] - (A_bar x - b_bar)(...)^T`` averaged over x),
      which makes :func:`fedsa_jax.theory.exact_mse` exact for the problem under
      i.i.d. sampling; ``None`` declines (e.g. a subclass whose noise differs).
      :func:`direction_second_moment` computes the mean part (or a finite sum).
    * ``sampling: str``: ``"generative"`` (the default when absent: observations
      independent across local steps and rounds) or anything else (e.g.
      ``"markov"``), for which the exact recursions refuse the problem unless it has
      ``markov_observations()``.
    * ``markov_observations() -> MarkovObservations`` (``fedsa_jax.problems.td``): under
      ``sampling="markov"``, each agent's chain (initial law, kernel) and its observation
      ``(A_c(s, s'), b_c(s, s'))`` as a function of the transition; with it
      :func:`fedsa_jax.theory.exact_mean` and :func:`~fedsa_jax.theory.exact_mse` condition
      their moments on the agents' joint chain state (small chains; federated TD has it).
    * ``observe_step(params, sampler, rand, theta) -> (obs, new_sampler)``: for a problem whose
      observation law depends on the iterate (control: SARSA's behaviour policy is a softmax of the
      current Q-estimate). The algorithms then draw one observation per local step, with the agent's
      *current local iterate* ``theta`` (its iterate at that step, not the server's), and update
      from it before drawing the next (:func:`fedsa_jax.algorithms.observed_updates`). ``rand`` is the
      step's slice of the agent's ``randomness`` block (whose axis 1 is the local step) and ``obs``
      one observation (no leading axis); ``observe`` is not called. ``init_sampler`` then takes the
      initial iterate as a third argument, ``init_sampler(key, params, theta0)``. Such a problem
      has no exact linear recursion: :func:`follows_iterate` tells, and the exact theory refuses it
      (:func:`check_linear`).
    * ``linear: bool`` (default True): False declares a direction that is not affine in ``theta``
      for a fixed observation (Q-learning's max); the exact linear recursions refuse it too.
    * ``mean_field() -> Problem``: the noise-free version of a problem the exact linear theory
      refuses: a problem whose direction at ``theta`` is the expected direction under the law
      ``theta`` induces (:func:`fedsa_jax.problems.expected` returns it; the algorithms' own
      kernels then run the deterministic mean path, :func:`fedsa_jax.theory.mean_path`).
    """

    A_bar: jax.Array
    """``(N, d, d)`` agents' mean matrices ``E[A_c(Z)]``."""
    b_bar: jax.Array
    """``(N, d)`` agents' mean vectors ``E[b_c(Z)]``."""
    theta_star: jax.Array
    """``(d,)`` solution of ``mean_c(A_bar[c]) theta = mean_c(b_bar[c])`` (see :func:`fixed_points`)."""
    local_theta_star: jax.Array
    """``(N, d)`` solutions of ``A_bar[c] theta = b_bar[c]`` (NaN rows where singular)."""

    @property
    def num_agents(self) -> int:
        """N, a Python int (from a leaf's shape)."""
        ...

    @property
    def dim(self) -> int:
        """d, a Python int."""
        ...

    @property
    def dtype(self) -> Any:
        """Floating dtype of the iterates (``float32``, or ``float64`` under x64)."""
        ...

    def agent_params(self) -> Any:
        """Pytree of per-agent values, every leaf with leading axis N; the algorithms
        vmap over it and hand agent c's slice to ``init_sampler``, ``observe`` and
        ``direction`` as ``params``. Keep it small (an agent index, offsets): big
        shared tables stay on the problem and are gathered from unbatched."""
        ...

    def init_sampler(self, key: jax.Array, params: Any) -> Any:
        """One agent's initial observation-stream state (a pytree, e.g. the current
        state of a Markov chain; ``jnp.zeros((), jnp.int32)`` for i.i.d. draws).
        Called once per agent and seed; carried across rounds by the algorithm."""
        ...

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> Any:
        """All agents' random numbers for one round, drawn in **one block** from
        ``key`` (no per-agent or per-step key splitting): a pytree whose leaves
        have leading axes ``(num_agents, ...)``; ``num_obs`` (= H) observations are
        kept per agent, each after ``skip`` draws of a Markov stream (i.i.d. problems
        may ignore ``skip``). ``num_agents``, ``num_obs``, ``skip`` are Python ints.
        The driver draws round t+1's block during round t. Every row must have the same law
        (what makes an agent's draws its own is ``observe`` with its ``params``): FedBuff
        (:func:`fedsa_jax.fedbuff`) draws one row per contribution and hands it to whichever agent
        sends it."""
        ...

    def observe(self, params: Any, sampler: Any, rand: Any, skip: int = 1) -> tuple[Any, Any]:
        """``(obs, new_sampler)`` for one agent and one round: ``rand`` is that agent's
        slice of the block; ``obs`` is a pytree whose leaves have leading axis
        ``num_obs`` (the local scan iterates over it)."""
        ...

    def direction(self, params: Any, obs: Any, theta: jax.Array) -> jax.Array:
        """``A_c(Z) theta - b_c(Z)`` of shape ``(d,)`` for one agent and one
        observation (``obs`` without its leading axis)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable description (``"family"`` and the structure); stored in
        result files and the checkpoint fingerprint."""
        ...


# Local steps unrolled per scan iteration, in the algorithms' local-step scan and in a problem's fused
# ``error_local_steps``, per backend. CPU: with the fused PRNG, unroll 2..10 measured the same on a
# 2-core CPU; unroll 1 ran on one core only. GPU: chosen from the unroll sweep of benchmarks/gpu.py
# (benchmarks/README.md, GPU section). Any other backend takes the CPU's.
LOCAL_UNROLL = {"cpu": 8, "gpu": 8}
# The scans whose observations follow the iterate (SARSA's steps: each draws its action from the
# current local iterate), per backend: on the 2-core CPU, with seed slices, no unrolling measured
# 1.19x (one-hot, H = 100), 1.35x (dense features) and 1.20x on one core against 8
# (benchmarks/README.md, Federated SARSA). Other backends take LOCAL_UNROLL's.
FOLLOWS_ITERATE_UNROLL = {"cpu": 1}
# Whether a problem's local steps run as one fused kernel (fedsa_jax.problems.fused: an agent's H steps
# with its iterate on chip), per backend, where the problem has one: on only where measured faster than
# the scan. CPU: the kernel runs in Pallas's interpret mode, at par with the scan, not faster (2-core
# CPU, 2 devices: TD 1.03x, SCAFFLSA 1.01x, Gaussian LSA 0.93x; 1 device: 0.97x, 0.62x, 0.95x;
# benchmarks/README.md, Fused local steps); GPU: not yet measured on a GPU, so off.
FUSED_LOCAL_STEPS: dict[str, bool] = {}
_unroll: contextvars.ContextVar[int | None] = contextvars.ContextVar("local_unroll", default=None)
_fused: contextvars.ContextVar[bool | None] = contextvars.ContextVar("fused_local_steps", default=None)


def local_unroll(num_steps: int, defaults: dict[str, int] = LOCAL_UNROLL) -> int:
    """Local steps unrolled per iteration of a scan over ``num_steps`` local steps: the run's
    ``Execution(local_unroll=...)`` (set while its kernels trace, :func:`unrolled`), else the
    backend's entry in ``defaults`` (the scan's own measured defaults, e.g.
    ``FOLLOWS_ITERATE_UNROLL``), else ``LOCAL_UNROLL``'s; at most ``num_steps``. Use it in a problem's
    ``error_local_steps`` or an algorithm's own local-step scan, as the built-in ones do. Unrolling
    changes the compiled program, not the operations it runs (XLA may fuse them differently, which
    can change the last bits)."""
    chosen = _unroll.get()
    if chosen is None:
        backend = jax.default_backend()
        chosen = defaults.get(backend, LOCAL_UNROLL.get(backend, LOCAL_UNROLL["cpu"]))
    return max(1, min(chosen, num_steps))


def fused_local_steps(chosen: bool | None = None) -> bool:
    """Whether a problem with a fused local-step kernel (:mod:`fedsa_jax.problems.fused`) uses it:
    ``chosen``, else the run's ``Execution(fused_local_steps=...)`` (set while its kernels trace,
    :func:`unrolled`), else the backend's entry in ``FUSED_LOCAL_STEPS`` (off where absent)."""
    chosen = _fused.get() if chosen is None else chosen
    return FUSED_LOCAL_STEPS.get(jax.default_backend(), False) if chosen is None else chosen


def merged_vmaps(fn, rows=None):
    """``fn`` whose vmaps, however nested, run as one vmap over the product of their axes.

    An algorithm vmaps a problem's per-agent code over the agents and the kernel vmaps that over
    the seeds, so an agent's arrays carry two batch axes. XLA:CPU reads a row of an array with two
    batch axes about 2x slower than with one (measured on SARSA's tabular local steps, where those
    reads are most of the work). Wrap a problem's fast local steps (``error_observed_steps``) in
    this: under ``vmap(vmap(f))`` it reshapes its batched arguments to one axis of size
    ``seeds x agents`` (broadcasting one batched only over the other axis), runs one ``vmap`` and
    reshapes the outputs back. The values are those of ``fn`` vmapped (to float rounding, where
    XLA vectorises the longer axis differently); not differentiable
    (``jax.custom_batching.custom_vmap``). Arguments are pytrees of arrays (pass the problem as
    one: closures over traced values are not allowed).

    ``rows``: the merged axis is handed to this function instead of a ``vmap`` of ``fn``:
    ``rows(batched, *args)`` with ``batched`` a pytree of bools like ``args`` (which arguments have
    the leading axis of all the vmaps merged; ``None`` when ``fn`` is not vmapped), returning the
    outputs with that axis (e.g. a kernel that runs blocks of rows, :mod:`fedsa_jax.problems.fused`)."""

    def flat_fn(tree, *leaves):
        return fn(*jax.tree.unflatten(tree, leaves))

    def flat_rows(tree, mask, *leaves):
        assert rows is not None
        return rows(
            None if mask is None else jax.tree.unflatten(tree, mask), *jax.tree.unflatten(tree, leaves)
        )

    def call(*args):
        leaves, tree = jax.tree.flatten(args)
        batched = None if rows is None else functools.partial(flat_rows, tree)
        return _merged_level(functools.partial(flat_fn, tree), None, 1, batched)(*leaves)

    return call


def _merged_level(fn, mask: tuple | None, size: int, rows=None):
    """``fn`` over flat leaves, vmapped over one leading axis of ``size`` for the leaves in ``mask``
    (``None``: not vmapped; ``rows(mask, *leaves)`` instead of the vmap where given), as a
    ``custom_vmap`` whose own vmap merges the new axis into that one."""
    if mask is None:
        inner = fn
    elif rows is None:
        inner = jax.vmap(fn, in_axes=tuple(0 if m else None for m in mask))
    else:
        inner = functools.partial(rows, mask)
    merged_fn = jax.custom_batching.custom_vmap(inner)

    @merged_fn.def_vmap
    def rule(axis_size, in_batched, *leaves):
        old = mask or (False,) * len(leaves)
        merged = []
        for x, new, was in zip(leaves, in_batched, old):
            if new and mask is not None and not was:  # (M, ...) -> (M, K, ...)
                x = jax.numpy.broadcast_to(x[:, None], (axis_size, size) + x.shape[1:])
            elif was and not new:  # (K, ...) -> (M, K, ...)
                x = jax.numpy.broadcast_to(x, (axis_size,) + x.shape)
            if mask is not None and (new or was):
                x = x.reshape((axis_size * size,) + x.shape[2:])
            merged.append(x)
        new_mask = tuple(bool(a) or b for a, b in zip(in_batched, old))
        out = _merged_level(fn, new_mask, axis_size * size, rows)(*merged)
        if mask is not None:
            out = jax.tree.map(lambda o: o.reshape((axis_size, size) + o.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return merged_fn


@contextlib.contextmanager
def unrolled(unroll: int | None, fused: bool | None = None):
    """Within the block, :func:`local_unroll` returns ``unroll`` and :func:`fused_local_steps`
    ``fused`` (``None``: the backend's defaults)."""
    tokens = _unroll.set(unroll), _fused.set(fused)
    try:
        yield
    finally:
        _unroll.reset(tokens[0])
        _fused.reset(tokens[1])


_ABSENT = object()
REQUIRED_MEMBERS = (
    "num_agents",
    "dim",
    "dtype",
    "agent_params",
    "init_sampler",
    "randomness",
    "observe",
    "direction",
    "A_bar",
    "b_bar",
    "theta_star",
    "local_theta_star",
    "describe",
)
_METHODS = ("agent_params", "init_sampler", "randomness", "observe", "direction", "describe")


def missing_members(problem: Any) -> list[str]:
    """Names of the :class:`Problem` members ``problem`` lacks (methods that are
    not callable count as missing), in protocol order; ``[]`` for a complete one.

    Examples:
      >>> import numpy as np, fedsa_jax as fj
      >>> fj.problems.missing_members(fj.problems.gaussian_lsa(np.eye(2)[None], np.ones((1, 2))))
      []
      >>> fj.problems.missing_members(object())[:3]
      ['num_agents', 'dim', 'dtype']
    """
    missing = []
    for name in REQUIRED_MEMBERS:
        value = getattr(problem, name, _ABSENT)
        if value is _ABSENT or (name in _METHODS and not callable(value)):
            missing.append(name)
    return missing


def follows_iterate(problem: Any) -> bool:
    """Whether ``problem`` draws its observations with the current iterate (``observe_step``)."""
    return callable(getattr(problem, "observe_step", None))


def nonlinear_reason(problem: Any) -> str | None:
    """Why ``problem`` is not linear stochastic approximation (its observation law follows the iterate,
    or its direction is not affine in ``theta``), or None when it is."""
    if follows_iterate(problem):
        return "its observations follow the iterate (their law depends on theta)"
    if not getattr(problem, "linear", True):
        return "its direction is not affine in theta"
    return None


def check_linear(problem: Any, what: str) -> None:
    """Refuse, in one line with the reason, ``what`` (an exact linear recursion) for a problem whose
    observation law follows the iterate or whose direction is not affine in ``theta``."""
    reason = nonlinear_reason(problem)
    if reason is None:
        return
    _validate.fail(
        "problem",
        problem.describe().get("family", type(problem).__name__),
        f"{what} covers linear stochastic approximation only, and {reason}; use "
        "fj.theory.mean_path (the deterministic limit) or simulate",
    )


def direction_second_moment(weights, A, b):
    """``(m, X) -> sum_k w_k (A_k X A_k^T - A_k m b_k^T - b_k m^T A_k^T + b_k b_k^T)`` per agent,
    i.e. ``E[(A(Z) x - b(Z))(...)^T]`` for explicit ``A (N, K, d, d)``, ``b (N, K, d)``,
    weights ``w (N, K)`` (float64 numpy). With one point of weight 1 (``A_bar[:, None]``,
    ``b_bar[:, None]``) it is the mean part of a noise second moment, computed by the same
    operations, so a noise-free problem's covariance is exactly 0."""
    At = np.swapaxes(A, -1, -2)
    bb = np.einsum("ck,cki,ckj->cij", weights, b, b)
    wb = weights[:, :, None, None] * b[..., None]  # (N, K, d, 1)

    def second(m, X):
        Am = A @ m[:, None, :, None]  # (N, K, d, 1)
        cross = np.sum(Am * np.swapaxes(wb, -1, -2), axis=1)  # sum_k w A_k m b_k^T
        quadratic = np.sum(weights[:, :, None, None] * (A @ X[:, None] @ At), axis=1)
        return quadratic - cross - np.swapaxes(cross, 1, 2) + bb

    return second


class FiniteSupport(NamedTuple):
    """The law of a problem's observations when each agent's Z takes finitely many
    values: the optional ``problem.finite_support()`` returns it (numpy arrays,
    host side) and :func:`fedsa_jax.theory.exact_mse` then computes the local
    noise covariance exactly.

    Agent c's observation is support point k with probability ``weights[c, k]``
    (pad agents with fewer points with weight 0). ``A_c(z_k)`` is given either
    explicitly (``A``) or as a rank-one product ``left[c, k] right[c, k]^T``
    (``A=None``), and ``b_c(z_k) = b[c, k]``. The theory uses

        E[(A(Z) x - b(Z))(A(Z) x - b(Z))^T]
            = sum_k w_k (A_k X A_k^T - A_k m b_k^T - b_k m^T A_k^T + b_k b_k^T),

    averaged over an iterate x with ``E[x] = m``, ``E[x x^T] = X`` (linear in
    ``(m, X)``); in rank-one form ``A_k X A_k^T = (r_k^T X r_k) l_k l_k^T`` and
    ``A_k m = (r_k^T m) l_k``, at O(K d^2) per agent and no ``(d, d)`` per point.
    The weights must sum to 1 per agent and reproduce ``A_bar`` and ``b_bar``.

    Examples: least squares (``w = 1/n_c`` per row, ``left = right = x_i``,
    ``b = y_i x_i``); a noise-free problem (one point, ``A = A_bar``, ``b = b_bar``).
    """

    weights: np.ndarray  # (N, K)
    b: np.ndarray  # (N, K, d)
    A: np.ndarray | None = None  # (N, K, d, d), or None with left and right
    left: np.ndarray | None = None  # (N, K, d)
    right: np.ndarray | None = None  # (N, K, d)
