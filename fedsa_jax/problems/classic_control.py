"""Federated TD(0) on classic control: gymnax's CartPole, MountainCar, Acrobot and Pendulum, each
agent with its own physics, linear features of the observation.

Agent c runs the environment with its own parameters (``EnvParams`` of gymnax, e.g. CartPole's pole
length: :func:`agent_env_params`), a fixed behaviour policy ``a = policy(x, u)`` (a jittable function
of the observation x and two uniforms u) and one Markov trajectory per seed, carried across rounds;
an episode that ends is reset inside the kernel (gymnax's own auto-reset). Each local step observes
``Z = (x, r, x', terminated)``, with ``x'`` the observation the step reached before any reset, and
with state features ``phi`` (:mod:`fedsa_jax.problems.features`) TD(0) updates along

    A(Z) theta - b(Z) = (phi(x)^T theta - r - gamma (1 - terminated) phi(x')^T theta) phi(x):

the target stops at a terminal state and bootstraps through a time limit's truncation.

**The reference.** Continuous states have no closed form for ``A_bar[c] = E_nu_c[phi(x) (phi(x) -
gamma (1 - terminated) phi(x'))^T]`` and ``b_bar[c] = E_nu_c[r phi(x)]`` under agent c's on-policy
stationary law nu_c. :func:`reference_systems` estimates them by a long Monte Carlo run of the same
observation stream (``chains`` independent trajectories per agent, ``burn_in`` steps dropped, then
``steps`` averaged), and solves for ``theta_star`` (the averaged system's solution) and each agent's
``local_theta_star``. Their standard errors come from the chains (independent, each chain's mean one
sample, so autocorrelation within a trajectory is counted): to first order
``theta_hat - theta_star = A_bar^{-1} mean_c (g_c - E g_c)`` with ``g_c`` the mean TD direction
``b_c - A_c theta_star`` of agent c's chains. ``reference_mse = tr Cov(theta_hat)`` is what the
estimate adds to a Monte Carlo MSE measured against it; the curves' floors must lie far above it
(:attr:`ClassicControlTD.reference` carries it, the command line prints it). Tile coding's features
are linearly dependent (each tiling's tiles sum to the same constant) and some tiles are never
visited, so ``A_bar`` is singular: TD started at ``theta0 = 0`` moves only within the span of the
visited features, where the system is invertible, and its limit is the minimum-norm solution; the
references are those (pseudo-inverse, :data:`PINV_RCOND`). A ``theta0`` with a component outside
that span keeps it, and the MSE against these references then has that floor.

Requires gymnax (``pip install 'fedsa-jax[envs]'``); the rest of the package does not import it.

References: Lange, "gymnax: A JAX-based reinforcement learning environment library" (2022); Jin,
Peng, Yang, Wang, Zhang, "Federated reinforcement learning with environment heterogeneity",
AISTATS 2022 (CartPole with a pole length per agent); Sutton & Barto, 2nd ed., Sec. 9.3 (TD(0)
with linear features).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate, registry
from fedsa_jax.problems import features as _features
from fedsa_jax.problems._base import float64
from fedsa_jax.problems.environments import (
    ENVIRONMENTS,
    FunctionPolicy,
    agent_env_params,
    default_policy,
    environment,
    parse_env_params,
)

__all__ = [
    "ClassicControlTD",
    "classic_control_td",
    "reference_systems",
]


class Transition(NamedTuple):
    x: jax.Array  # (k,) the observation
    reward: jax.Array  # ()
    next_x: jax.Array  # (k,) the observation reached, before any reset
    terminated: jax.Array  # () bool: the target stops


class EnvRandomness(NamedTuple):
    keys: jax.Array  # (N, H skip, 2) uint32: the environment step's key data
    u: jax.Array  # (N, H skip, 2): the policy's uniforms


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClassicControlTD:
    """Federated TD(0) on a gymnax environment (module docstring); build with
    :func:`classic_control_td`."""

    env_params: Any  # gymnax EnvParams, every leaf (N,)
    features: Any  # a state feature map of fedsa_jax.problems.features
    policy: Any  # LinearPolicy or FunctionPolicy
    gamma: jax.Array  # ()
    A_bar: jax.Array  # (N, d, d) the Monte Carlo reference systems
    b_bar: jax.Array  # (N, d)
    theta_star: jax.Array  # (d,)
    local_theta_star: jax.Array  # (N, d)
    theta_star_sem: jax.Array  # (d,) the reference's standard errors
    local_theta_star_sem: jax.Array  # (N, d)
    env: str = dataclasses.field(default="cartpole", metadata=dict(static=True))
    reference: tuple = dataclasses.field(default=(), metadata=dict(static=True))  # ((key, value), ...)

    sampling = "markov"  # one trajectory per agent and seed, carried across rounds

    @property
    def num_agents(self) -> int:
        return self.A_bar.shape[0]

    @property
    def dim(self) -> int:
        return self.features.dim

    @property
    def dtype(self):
        return self.A_bar.dtype

    @property
    def reference_mse(self) -> float:
        """``tr Cov(theta_hat)``: what the reference's own error adds to an MSE measured against it."""
        return float(np.sum(np.asarray(self.theta_star_sem, np.float64) ** 2))

    def agent_params(self) -> Any:
        return self.env_params

    def _env(self):
        return environment(self.env)[0]

    def _action(self, a: jax.Array):
        torques = ENVIRONMENTS[self.env].actions
        return a if torques is None else jnp.asarray(torques, self.dtype)[a]

    def init_sampler(self, key: jax.Array, params: Any) -> Any:
        """``(x_0, state_0)``: gymnax's reset with the agent's parameters."""
        return self._env().reset(key, params)

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1) -> EnvRandomness:
        """Per agent and environment step (``H skip`` of them), the step's key data and two uniforms
        for the policy."""
        k_env, k_policy = jax.random.split(key)
        shape = (num_agents, num_obs * skip)
        return EnvRandomness(
            jax.random.bits(k_env, (*shape, 2), jnp.uint32), _prng.uniform(k_policy, (*shape, 2), self.dtype)
        )

    def step(self, params: Any, sampler: Any, keys: jax.Array, u: jax.Array) -> tuple[Transition, Any]:
        """One environment step of one agent: the policy's action at ``x``, then gymnax's ``step``
        (its auto-reset included) with the key of ``keys``."""
        x, state = sampler
        action = self.policy(x, u)
        key = jax.random.wrap_key_data(keys, impl="threefry2x32")
        x_new, state_new, reward, terminated, _, info = self._env().step(
            key, state, self._action(action), params
        )
        move = Transition(
            x.astype(self.dtype),
            jnp.asarray(reward, self.dtype),
            info["final_observation"].astype(self.dtype),
            jnp.asarray(terminated, bool),
        )
        return move, (x_new.astype(x.dtype), state_new)

    def observe(self, params: Any, sampler: Any, rand: EnvRandomness, skip: int = 1):
        """Agent's ``H`` transitions (every ``skip``-th of ``H skip`` environment steps)."""

        def one(carry, r):
            move, carry = self.step(params, carry, *r)
            return carry, move

        sampler, moves = jax.lax.scan(one, sampler, rand)
        return jax.tree.map(lambda m: m[skip - 1 :: skip], moves), sampler

    def direction(self, params: Any, obs: Transition, theta: jax.Array) -> jax.Array:
        """``(phi(x)^T theta - r - gamma (1 - terminated) phi(x')^T theta) phi(x)``."""
        del params
        i, v = self.features.sparse(obs.x)
        j, w = self.features.sparse(obs.next_x)
        target = obs.reward + jnp.where(obs.terminated, 0.0, self.gamma) * jnp.dot(w, theta[j])
        delta = jnp.dot(v, theta[i]) - target
        if i.shape[0] == theta.shape[0]:  # a dense map gives every entry in order: no scatter
            return delta * v
        return jnp.zeros_like(theta).at[i].add(delta * v)

    def describe(self) -> dict[str, Any]:
        varied = {
            k: np.asarray(getattr(self.env_params, k)).tolist()
            for k in (f.name for f in dataclasses.fields(self.env_params))
            if np.ptp(np.asarray(getattr(self.env_params, k))) > 0
        }
        return {
            "family": "classic_control_td",
            "env": self.env,
            "num_agents": self.num_agents,
            "dim": self.dim,
            "gamma": float(self.gamma),
            "sampling": self.sampling,
            "agent_env_params": varied,
            "features": self.features.describe(),
            **self.policy.describe(),
            "reference": {**dict(self.reference), "reference_mse": self.reference_mse},
        }


class Reference(NamedTuple):
    A_bar: np.ndarray  # (N, d, d)
    b_bar: np.ndarray  # (N, d)
    theta_star: np.ndarray  # (d,)
    local_theta_star: np.ndarray  # (N, d)
    theta_star_sem: np.ndarray  # (d,)
    local_theta_star_sem: np.ndarray  # (N, d)
    visited: np.ndarray  # (d,) bool


def _chain_sums(problem: ClassicControlTD, key, params, chains: int, burn_in: int, steps: int, theta):
    """Agent's ``chains`` trajectories, ``burn_in`` steps dropped, then over ``steps`` steps:
    ``sum phi (phi - gamma' phi')^T`` and ``sum r phi`` over every chain and step, ``sum phi^2``
    (which coordinates are visited), and per chain ``sum_t (b_t - A_t theta_k)`` at each row of
    ``theta (K, d)``. One step of every chain at a time (memory flat in ``steps``)."""
    d, features = problem.dim, problem.features
    k_init, k_burn, k_run = jax.random.split(key, 3)
    samplers = jax.vmap(problem.init_sampler, in_axes=(0, None))(jax.random.split(k_init, chains), params)
    nonzeros = features.sparse(jnp.zeros(features.num_inputs, problem.dtype))[0].shape[0]
    rows = jnp.arange(chains)[:, None]

    def advance(samplers, key):
        rand = problem.randomness(key, chains, 1)
        moves, samplers = jax.vmap(lambda s, r: problem.observe(params, s, r))(samplers, rand)
        return samplers, jax.tree.map(lambda m: m[:, 0], moves)

    def burn(samplers, t):
        return advance(samplers, jax.random.fold_in(k_burn, t))[0], None

    def accumulate(carry, t):
        samplers, A, b, energy, G = carry
        samplers, move = advance(samplers, jax.random.fold_in(k_run, t))
        i, v = jax.vmap(features.sparse)(move.x)  # (chains, n)
        j, w = jax.vmap(features.sparse)(move.next_x)
        w = w * jnp.where(move.terminated, 0.0, problem.gamma)[:, None]
        if 4 * nonzeros > d:  # dense features: one matrix product
            Phi = jnp.zeros((chains, d), problem.dtype).at[rows, i].add(v)
            A = A + Phi.T @ (Phi - jnp.zeros_like(Phi).at[rows, j].add(w))
        else:  # sparse (tile coding): n^2 entries per chain
            A = A.at[i[:, :, None], i[:, None, :]].add(v[:, :, None] * v[:, None, :])
            A = A.at[i[:, :, None], j[:, None, :]].add(-v[:, :, None] * w[:, None, :])
        b = b.at[i].add(move.reward[:, None] * v)
        energy = energy.at[i].add(v**2)
        # (K, chains): the TD error at each theta_k, then its direction into each chain's row
        delta = move.reward + jnp.sum(w * theta[:, j], -1) - jnp.sum(v * theta[:, i], -1)
        G = G.at[:, rows, i].add(delta[:, :, None] * v)
        return (samplers, A, b, energy, G), None

    samplers, _ = jax.lax.scan(burn, samplers, jnp.arange(burn_in))
    zeros = jnp.zeros((d, d), problem.dtype), jnp.zeros(d, problem.dtype), jnp.zeros(d, problem.dtype)
    G = jnp.zeros((theta.shape[0], chains, d), problem.dtype)
    (_, A, b, energy, G), _ = jax.lax.scan(accumulate, (samplers, *zeros, G), jnp.arange(steps))
    return A, b, energy, G


def reference_systems(
    problem: ClassicControlTD, key, chains: int = 256, steps: int = 2000, burn_in: int = 1000
) -> Reference:
    """The Monte Carlo reference of ``problem`` (module docstring): ``chains`` trajectories per agent
    of ``burn_in + steps`` environment steps, in float64. Deterministic in ``key``."""
    N, d = problem.num_agents, problem.dim
    keys = jax.random.split(key, N)
    sums = jax.jit(_chain_sums, static_argnums=(3, 4, 5))
    A, b, energy = np.zeros((N, d, d)), np.zeros((N, d)), np.zeros((N, d))
    zero = jnp.zeros((1, d), problem.dtype)
    for c in range(N):
        params = jax.tree.map(operator.itemgetter(c), problem.env_params)
        A_c, b_c, e_c, _ = sums(problem, keys[c], params, chains, burn_in, steps, zero)
        A[c], b[c], energy[c] = (np.asarray(x, np.float64) / (chains * steps) for x in (A_c, b_c, e_c))
    inverse = _pinv(A.mean(0))
    star = inverse @ b.mean(0)
    local_inverse = [_pinv(A[c]) for c in range(N)]
    local = np.stack([local_inverse[c] @ b[c] for c in range(N)])
    # first-order errors from the chains' TD directions at theta_star and at each agent's own solution
    cov_star, local_sem = np.zeros((d, d)), np.zeros((N, d))
    for c in range(N):
        params = jax.tree.map(operator.itemgetter(c), problem.env_params)
        thetas = jnp.asarray(np.stack([star, local[c]]), problem.dtype)
        g = np.asarray(sums(problem, keys[c], params, chains, burn_in, steps, thetas)[3], np.float64) / steps
        g_star = (g[0] - g[0].mean(0)) @ inverse.T  # (chains, d): A_bar^+ (g - mean g)
        cov_star += g_star.T @ g_star / (chains * (chains - 1)) / N**2
        g_local = (g[1] - g[1].mean(0)) @ local_inverse[c].T
        local_sem[c] = np.sqrt(np.sum(g_local**2, 0) / (chains * (chains - 1)))
    visited = energy.sum(0) > 0
    return Reference(A, b, star, local, np.sqrt(np.diag(cov_star)), local_sem, visited)


# Singular values below this fraction of the largest are the features' exact linear dependences (tile
# coding: every tiling's tiles sum to the same constant; unvisited tiles), where TD never moves theta.
PINV_RCOND = 1e-12


def _with_dtype(tree, dtype):
    """``tree`` with every floating leaf cast to ``dtype``."""
    floating = lambda x: jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)  # noqa: E731
    return jax.tree.map(lambda x: jnp.asarray(x, dtype) if floating(x) else x, tree)


def _pinv(A: np.ndarray) -> np.ndarray:
    """The pseudo-inverse: TD from theta0 = 0 stays in the span of the visited features, where A is
    invertible, so its limit is the minimum-norm solution of A theta = b."""
    return np.linalg.pinv(A, rcond=PINV_RCOND)


def classic_control_td(
    env: str = "cartpole",
    num_agents: int = 4,
    env_params: dict | None = None,
    features=None,
    policy=None,
    gamma: float = 0.9,
    key=0,
    chains: int = 256,
    steps: int = 2000,
    burn_in: int = 1000,
    dtype=None,
) -> ClassicControlTD:
    """Federated TD(0) on a gymnax classic-control environment with a Monte Carlo reference
    (module docstring).

    Args:
      env: ``"cartpole"``, ``"mountaincar"``, ``"acrobot"`` or ``"pendulum"`` (three torques).
      num_agents: N.
      env_params: per-agent environment parameters, ``{name: value or N values}``
        (:func:`agent_env_params`), e.g. ``{"length": [0.3, 0.5, 0.7, 0.9]}``; default: all default.
      features: a state feature map (:mod:`fedsa_jax.problems.features`), or its text
        (:func:`~fedsa_jax.problems.features.parse`: ``"tiles:8x8x8x8:4"``, ``"fourier:3"``,
        ``"rbf:5"``) over the environment's box; default: the environment's entry of
        :data:`ENVIRONMENTS` (CartPole: ``"fourier:1"``; tile coding's
        reference needs many more samples: its rare tiles make the system ill-conditioned).
      policy: a :class:`LinearPolicy` or a jittable ``policy(x, u) -> action`` (``u``: two
        uniforms); default :func:`default_policy`.
      gamma: the discount, in ``[0, 1)``.
      key: the reference's seed (an int or a JAX key).
      chains, steps, burn_in: the reference's Monte Carlo sizes per agent.
      dtype: float32 or float64 (default: JAX's default float).
    """
    _validate.choice("env", env, tuple(ENVIRONMENTS))
    N = _validate.integer("num_agents", num_agents, 1)
    gamma = _validate.real("gamma", gamma, 0.0, 1.0, high_open=True)
    chains = _validate.integer("chains", chains, 2)
    steps = _validate.integer("steps", steps, 1)
    burn_in = _validate.integer("burn_in", burn_in, 0)
    dtype = _validate.float_dtype("dtype", dtype)
    params = agent_env_params(env, N, **(env_params or {}))
    low, high = ENVIRONMENTS[env].box
    if features is None or isinstance(features, str):
        features = _features.parse(
            ENVIRONMENTS[env].features if features is None else features, low, high, dtype
        )
    if getattr(features, "num_inputs", len(low)) != len(low):
        _validate.fail(
            "features", features.describe(), f"expected a map of {len(low)} inputs (the observation of {env})"
        )
    if policy is None:
        policy = default_policy(env, dtype=dtype)
    elif not dataclasses.is_dataclass(policy):
        if not callable(policy):
            _validate.fail("policy", policy, "expected a LinearPolicy or a function policy(x, u) -> action")
        policy = FunctionPolicy(policy)
    key = jax.random.key(key) if isinstance(key, int) else key
    d = features.dim
    zeros = jnp.zeros((N, d, d), dtype)
    draft = ClassicControlTD(
        params, features, policy, jnp.asarray(gamma, dtype), zeros, zeros[:, 0], zeros[0, 0], zeros[:, 0],
        zeros[0, 0], zeros[:, 0], env,
    )  # fmt: skip
    with float64():  # the reference's sums over millions of steps, in float64 whatever the run's dtype
        ref = reference_systems(_with_dtype(draft, np.float64), key, chains, steps, burn_in)
    as_dtype = functools.partial(jnp.asarray, dtype=dtype)
    return dataclasses.replace(
        draft,
        A_bar=as_dtype(ref.A_bar),
        b_bar=as_dtype(ref.b_bar),
        theta_star=as_dtype(ref.theta_star),
        local_theta_star=as_dtype(ref.local_theta_star),
        theta_star_sem=as_dtype(ref.theta_star_sem),
        local_theta_star_sem=as_dtype(ref.local_theta_star_sem),
        reference=(
            ("method", "monte carlo"),
            ("chains", chains),
            ("steps", steps),
            ("burn_in", burn_in),
            ("visited", int(ref.visited.sum())),
        ),  # fmt: skip
    )


def _reference_sizes(text: str) -> tuple[int, int, int]:
    """``--reference CHAINS:STEPS:BURN_IN`` (an argparse type: a bad text names the option)."""
    try:
        chains, steps, burn_in = (int(v) for v in str(text).split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CHAINS:STEPS:BURN_IN, three integers, got {text!r}"
        ) from None
    if chains < 2 or steps < 1 or burn_in < 0:
        raise argparse.ArgumentTypeError(f"expected CHAINS >= 2, STEPS >= 1, BURN_IN >= 0, got {text!r}")
    return chains, steps, burn_in


ENV_PARAMS = registry.Option(
    ("--env-params",),
    "env_params",
    "each agent's environment parameters (gymnax EnvParams): NAME=V, NAME=V1,...,VN or NAME=LOW:HIGH "
    "(N values spread evenly), joined by ';' (e.g. CartPole's pole lengths: length=0.25:1.0; "
    "default: every agent the environment's defaults)",
    str,
    "",
    metavar="SPEC",
    group="problem",
    params=("env_params",),
)
FEATURES = registry.Option(
    ("--features",),
    "features",
    f"linear features of the observation: {_features.FORMS} (default: the environment's, CartPole fourier:1)",
    str,
    None,
    group="problem",
    params=("features",),
)
REFERENCE = registry.Option(
    ("--reference",),
    "reference",
    "the Monte Carlo reference theta*: CHAINS:STEPS:BURN_IN per agent (default 256:2000:1000)",
    _reference_sizes,
    None,
    group="problem",
    grid=False,
)
EPSILON = registry.Option(
    ("--policy-epsilon",),
    "policy_epsilon",
    "the default policy's exploration: a uniform action with this probability (default 0.1)",
    registry.real,
    0.1,
    group="problem",
    params=("epsilon",),
)


def _from_options(name: str):
    def build(key, args):
        """``--problem NAME``: :func:`classic_control_td` from the options; ``--problem-seed`` seeds
        the reference."""
        del key
        chains, steps, burn_in = args.reference or (256, 2000, 1000)
        return classic_control_td(
            name,
            num_agents=args.agents,
            env_params=parse_env_params(args.env_params, args.agents),
            features=args.features,
            policy=default_policy(name, args.policy_epsilon, args.dtype),
            gamma=0.9 if args.gamma is None else args.gamma,
            key=args.problem_seed,
            chains=chains,
            steps=steps,
            burn_in=burn_in,
            dtype=args.dtype,
        )

    return build


for _order, _name in enumerate(ENVIRONMENTS):
    registry.register_problem(
        _name,
        _from_options(_name),
        options=(ENV_PARAMS, FEATURES, REFERENCE, EPSILON, registry.GAMMA),
        note=f"federated TD(0) on gymnax's {ENVIRONMENTS[_name].gymnax_id} (needs the envs extra)",
        order=10 + _order,
    )
