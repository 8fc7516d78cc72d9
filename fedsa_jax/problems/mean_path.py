"""The noise-free (mean-path) version of any problem.

``expected(problem)`` keeps ``A_bar``, ``b_bar``, ``theta_star``,
``local_theta_star`` and the dtype of ``problem`` and replaces its oracle by the
means: ``A_c(Z) = A_bar[c]``, ``b_c(Z) = b_bar[c]`` for every Z. Every algorithm
then follows its mean recursion (for FedLSA, ``theta_{t+1} - theta_star =
Gamma_bar (theta_t - theta_star) + rho_bar``, SCAFFLSA paper, Sec. 4), so all seeds
of a simulation coincide (standard error 0, up to a randomised channel) and
:func:`fedsa_jax.theory.exact_mse` equals ``|exact_mean - theta_star|^2``: its
noise is the one-point :class:`~fedsa_jax.problems.FiniteSupport` ``(A_bar, b_bar)``.

Use it to separate the deterministic part of an error curve (heterogeneity bias,
contraction) from the stochastic part.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.problems.protocol import FiniteSupport, check_linear, missing_members

__all__ = ["ExpectedProblem", "expected"]


class MeanSystem(NamedTuple):
    A_bar: jax.Array  # (d, d) one agent's
    b_bar: jax.Array  # (d,)
    residual_star: jax.Array  # (d,) A_bar theta_star - b_bar (from float64)


class NoRandomness:
    """The observation stream of a noise-free problem (mixed into :class:`ExpectedProblem` and the
    control problems' mean fields): no sampler state and an empty block of random numbers."""

    def init_sampler(self, key: jax.Array, params: Any) -> jax.Array:
        del key, params
        return jnp.zeros((), jnp.int32)

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> jax.Array:
        """No randomness: an empty ``(num_agents, num_obs, 0)`` block (the local scan
        still needs the leading axis ``num_obs``)."""
        del key, skip
        return jnp.zeros((num_agents, num_obs, 0), self.dtype)  # pyright: ignore[reportAttributeAccessIssue]

    def observe(self, params: Any, sampler: jax.Array, rand: jax.Array, skip: int = 1):
        del params, skip
        return rand, sampler


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExpectedProblem(NoRandomness):
    """Noise-free problem (module docstring); build it with :func:`expected`."""

    A_bar: jax.Array  # (N, d, d)
    b_bar: jax.Array  # (N, d)
    theta_star: jax.Array  # (d,)
    local_theta_star: jax.Array  # (N, d)
    residual_star: jax.Array  # (N, d) A_bar[c] theta_star - b_bar[c], computed in float64
    # JSON text of the original problem's describe(): a static field must be hashable.
    of: str = dataclasses.field(default="{}", metadata=dict(static=True))

    @property
    def num_agents(self) -> int:
        return self.A_bar.shape[0]

    @property
    def dim(self) -> int:
        return self.A_bar.shape[-1]

    @property
    def dtype(self):
        return self.A_bar.dtype

    def agent_params(self) -> MeanSystem:
        return MeanSystem(self.A_bar, self.b_bar, self.residual_star)

    def direction(self, params: MeanSystem, obs: jax.Array, theta: jax.Array) -> jax.Array:
        """``A_bar[c] theta - b_bar[c]``."""
        del obs
        return params.A_bar @ theta - params.b_bar

    def error_direction(self, params: MeanSystem, obs: jax.Array, error: jax.Array) -> jax.Array:
        """``A_bar[c] error + (A_bar[c] theta_star - b_bar[c])``: the direction at ``theta_star + error``."""
        del obs
        return params.A_bar @ error + params.residual_star

    def finite_support(self) -> FiniteSupport:
        """One point per agent, ``(A_bar[c], b_bar[c])`` with weight 1: zero noise."""
        A = np.asarray(self.A_bar, np.float64)
        return FiniteSupport(
            np.ones((self.num_agents, 1)), b=np.asarray(self.b_bar, np.float64)[:, None], A=A[:, None]
        )

    def describe(self) -> dict[str, Any]:
        return {"family": "expected", "of": json.loads(self.of)}


def _plain(x: Any) -> Any:
    """JSON fallback for numpy values in a description."""
    if hasattr(x, "tolist"):
        return x.tolist()
    _validate.fail("problem", type(x).__name__, "describe() must return JSON-serialisable values")


def expected(problem) -> Any:
    """The noise-free version of ``problem``: ``A_c(Z) = A_bar[c]``, ``b_c(Z) = b_bar[c]``.

    Args:
      problem: any problem (:class:`~fedsa_jax.problems.Problem`).

    A problem with a ``mean_field()`` member (one whose observations follow the iterate, e.g.
    :class:`~fedsa_jax.problems.FederatedSARSA`) returns it instead: the problem whose direction is the
    mean direction under the law the iterate induces (not affine in theta; the linear theory refuses
    it, :func:`fedsa_jax.theory.mean_path` runs it).

    Returns:
      :class:`ExpectedProblem` with the same ``A_bar``, ``b_bar``, ``theta_star``,
      ``local_theta_star`` and dtype; ``describe()`` is
      ``{"family": "expected", "of": problem.describe()}``.

    Example:
      >>> import jax, numpy as np, fedsa_jax as fj
      >>> p = fj.problems.expected(fj.problems.random_gaussian_lsa(jax.random.key(0), 3, 2))
      >>> alg = fj.fedlsa(0.1, 5)
      >>> mse = fj.theory.exact_mse(p, alg, 10)
      >>> mean = fj.theory.exact_mean(p, alg, 10)
      >>> bool(np.allclose(mse, np.sum((mean - np.asarray(p.theta_star)) ** 2, axis=1)))
      True
    """
    missing = missing_members(problem)
    if missing:
        _validate.fail("problem", type(problem).__name__, f"not a problem: it lacks {', '.join(missing)}")
    own = getattr(problem, "mean_field", None)
    if callable(own):  # a problem the linear theory does not cover (SARSA): its own noise-free version
        return own()
    check_linear(problem, "its noise-free version without mean_field()")
    dt = problem.dtype
    f = lambda x: jnp.asarray(x, dtype=dt)  # noqa: E731
    A, b, ts = (np.asarray(x, np.float64) for x in (problem.A_bar, problem.b_bar, problem.theta_star))
    return ExpectedProblem(
        A_bar=f(A),
        b_bar=f(b),
        theta_star=f(ts),
        local_theta_star=f(problem.local_theta_star),
        residual_star=f(np.einsum("cij,j->ci", A, ts) - b),
        of=json.dumps(problem.describe(), default=_plain),
    )
