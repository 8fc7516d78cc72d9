"""The classic-control environments of gymnax as federated problems use them: which environments,
their default feature boxes and behaviour policies, each agent's own physical parameters.

gymnax (``pip install 'fedsa-jax[envs]'``) is imported on first use, never by the package itself.
:mod:`fedsa_jax.problems.classic_control` builds federated TD(0) on them.

Reference: Lange, "gymnax: A JAX-based reinforcement learning environment library" (2022).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate

__all__ = [
    "ENVIRONMENTS",
    "FunctionPolicy",
    "LinearPolicy",
    "agent_env_params",
    "default_policy",
    "environment",
    "num_actions",
    "parse_env_params",
    "spread",
]


class Environment(NamedTuple):
    gymnax_id: str
    box: tuple[tuple[float, ...], tuple[float, ...]]  # the features' default box (low, high)
    features: str  # the default feature map (features.parse)
    actions: tuple[float, ...] | None  # torques of a discretised continuous action; None: discrete
    gains: tuple[float, ...]  # the default policy: the last action where gains . x > 0, else the first


# name: gymnax id; the default feature box (it holds the states the default policy visits: CartPole's
# velocities have no bound) and feature map; Pendulum's torques; the default policy's linear rule
# (CartPole: push towards the pole's lean, weakly enough that a short pole falls within a few hundred
# steps; MountainCar and Pendulum: energy pumping, push along the velocity; Acrobot: torque along the
# second joint's velocity, which reaches the goal in about a hundred steps)
ENVIRONMENTS = {
    "cartpole": Environment(
        "CartPole-v1",
        ((-2.4, -2.0, -0.21, -3.0), (2.4, 2.0, 0.21, 3.0)),
        "fourier:1",
        None,
        (0.0, 0.0, 1.0, 0.02),
    ),
    "mountaincar": Environment("MountainCar-v0", ((-1.2, -0.07), (0.6, 0.07)), "fourier:3", None, (0.0, 1.0)),
    "acrobot": Environment(
        "Acrobot-v1",
        (
            (-1.0, -1.0, -1.0, -1.0, -4 * math.pi, -9 * math.pi),
            (1.0, 1.0, 1.0, 1.0, 4 * math.pi, 9 * math.pi),
        ),
        "fourier:1",
        None,
        (0.0, 0.0, 0.0, 0.0, 0.0, 1.0),
    ),
    "pendulum": Environment(
        "Pendulum-v1", ((-1.0, -1.0, -8.0), (1.0, 1.0, 8.0)), "fourier:2", (-2.0, 0.0, 2.0), (0.0, 0.0, 1.0)
    ),
}
# The default policies take the first or the last action: MountainCar's and Acrobot's middle action (no
# push, no torque) only when exploring.


def _gymnax():
    try:
        import gymnax
    except ImportError as error:  # pragma: no cover - the extra is installed in CI
        raise ImportError("classic-control problems need gymnax: pip install 'fedsa-jax[envs]'") from error
    return gymnax


@functools.cache
def environment(name: str):
    """``(env, default EnvParams)`` of gymnax for one of :data:`ENVIRONMENTS` (cached: the
    environment object is the static part of the kernel's cache key)."""
    return _gymnax().make(ENVIRONMENTS[name].gymnax_id)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearPolicy:
    """``a = last action if gains^T x + bias > 0 else the first``, and with probability epsilon an
    action uniform over all ``num_actions`` instead (``u[0] < epsilon`` explores, ``u[1]`` picks)."""

    gains: jax.Array  # (k,)
    bias: jax.Array  # ()
    epsilon: jax.Array  # ()
    num_actions: int = dataclasses.field(default=2, metadata=dict(static=True))

    def __call__(self, x: jax.Array, u: jax.Array) -> jax.Array:
        greedy = jnp.where(jnp.dot(self.gains, x) + self.bias > 0, self.num_actions - 1, 0)
        explore = jnp.minimum((u[1] * self.num_actions).astype(jnp.int32), self.num_actions - 1)
        return jnp.where(u[0] < self.epsilon, explore, greedy).astype(jnp.int32)

    def describe(self) -> dict[str, Any]:
        return {
            "policy": "linear",
            "gains": np.asarray(self.gains).tolist(),
            "bias": float(self.bias),
            "epsilon": float(self.epsilon),
        }


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FunctionPolicy:
    """A user's jittable ``policy(x, u) -> action`` (static: a new function compiles a new kernel)."""

    fn: Callable = dataclasses.field(metadata=dict(static=True))

    def __call__(self, x: jax.Array, u: jax.Array) -> jax.Array:
        return jnp.asarray(self.fn(x, u), jnp.int32)

    def describe(self) -> dict[str, Any]:
        return {"policy": getattr(self.fn, "__qualname__", type(self.fn).__name__)}


def default_policy(name: str, epsilon: float = 0.1, dtype=None) -> LinearPolicy:
    """The built-in behaviour policy of environment ``name`` (:data:`ENVIRONMENTS`): CartPole's linear
    controller, energy pumping elsewhere, each exploring with probability ``epsilon``."""
    _validate.choice("env", name, tuple(ENVIRONMENTS))
    epsilon = _validate.real("epsilon", epsilon, 0.0, 1.0)
    spec = ENVIRONMENTS[name]
    dtype = _validate.float_dtype("dtype", dtype)
    return LinearPolicy(
        jnp.asarray(spec.gains, dtype),
        jnp.asarray(0.0, dtype),
        jnp.asarray(epsilon, dtype),
        num_actions(name),
    )


def num_actions(name: str) -> int:
    """The number of actions of environment ``name`` (Pendulum: its discretised torques)."""
    spec = ENVIRONMENTS[name]
    return len(spec.actions) if spec.actions is not None else int(environment(name)[0].num_actions)


# Parameters tied to others: CartPole's total mass and pole mass-length (gymnax stores them).
_DERIVED = {
    "cartpole": lambda p: p.replace(total_mass=p.masscart + p.masspole, polemass_length=p.masspole * p.length)
}


def agent_env_params(name: str, num_agents: int, **values) -> Any:
    """gymnax ``EnvParams`` of environment ``name`` stacked over ``num_agents`` agents (every leaf
    with leading axis N), the defaults except ``values``: each a number (every agent) or N numbers
    (one per agent), e.g. ``agent_env_params("cartpole", 3, length=[0.3, 0.5, 0.7])``. CartPole's
    ``total_mass`` and ``polemass_length`` follow its masses and length."""
    N = _validate.integer("num_agents", num_agents, 1)
    _validate.choice("env", name, tuple(ENVIRONMENTS))
    default = environment(name)[1]
    fields = {f.name for f in dataclasses.fields(default)}
    per_agent = []
    for key, value in values.items():
        if key not in fields:
            _validate.fail(
                key, value, f"not a parameter of {ENVIRONMENTS[name].gymnax_id}: one of {sorted(fields)}"
            )
        v = np.asarray(value, np.float64).reshape(-1)
        if v.size not in (1, N) or not np.all(np.isfinite(v)) or np.any(v <= 0):
            _validate.fail(key, value, f"expected one positive number or {N} (one per agent)")
        per_agent.append((key, np.broadcast_to(v, (N,))))
    derive = _DERIVED.get(name, lambda p: p)
    agents = [
        derive(default.replace(**{k: type(getattr(default, k))(v[c]) for k, v in per_agent}))
        for c in range(N)
    ]
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *agents)


def spread(env: str, name: str, level: float, num_agents: int) -> list[float]:
    """N values of parameter ``name`` spread evenly around ``env``'s default by the relative
    heterogeneity ``level`` in [0, 1): ``default (1 + level (2 c / (N - 1) - 1))`` for agent c (0:
    every agent the default; 0.5 with CartPole's length 0.5: 0.25 to 0.75)."""
    level = _validate.real("level", level, 0.0, 1.0, high_open=True)
    default = environment(env)[1]
    if name not in {f.name for f in dataclasses.fields(default)}:
        _validate.fail(name, level, f"not a parameter of {ENVIRONMENTS[env].gymnax_id}")
    return (float(getattr(default, name)) * (1.0 + level * np.linspace(-1.0, 1.0, num_agents))).tolist()


def parse_env_params(text: str, num_agents: int, env: str | None = None) -> dict[str, list[float]]:
    """``--env-params``: ``"length=0.3,0.5,0.7,0.9"`` (one value per agent, or one for all),
    ``"length=0.25:1.0"`` (N values evenly spread from the first to the second) or, with ``env``,
    ``"length~0.5"`` (:func:`spread` around the default by a relative heterogeneity), several joined
    by ``;``."""

    def bad():
        _validate.fail(
            "env_params",
            text,
            "expected NAME=V (every agent), NAME=V1,...,VN (one per agent), NAME=LOW:HIGH "
            "(spread over the agents) or NAME~H (spread around the default by a relative "
            "heterogeneity H in [0, 1)), several joined by ';'",
        )

    values: dict[str, list[float]] = {}
    for part in filter(None, (p.strip() for p in str(text).split(";"))):
        name, sep, spec = part.partition("=")
        try:
            if not sep and "~" in part and env is not None:
                name, _, level = part.partition("~")
                level = float(level)
                if not 0.0 <= level < 1.0:
                    raise ValueError
            elif not sep or not name.strip():
                raise ValueError
            elif ":" in spec:
                low, high = (float(v) for v in spec.split(":"))
                values[name.strip()] = np.linspace(low, high, num_agents).tolist()
            else:
                values[name.strip()] = [float(v) for v in spec.split(",")]
        except ValueError:
            bad()
        if not sep:
            values[name.strip()] = spread(env, name.strip(), level, num_agents)  # pyright: ignore
    return values
