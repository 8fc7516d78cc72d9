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
from tqdm import tqdm  # plain text bar, as the runs'

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
    family = "classic_control_td"

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

    def env_step(self, params: Any, state: Any, action: jax.Array, keys: jax.Array):
        """gymnax's ``step`` (its auto-reset included) with the key of ``keys``: ``(x_new, state_new,
        reward, terminated, done, x_reached)``, ``x_reached`` the observation before any reset."""
        key = jax.random.wrap_key_data(keys, impl="threefry2x32")
        x_new, state_new, reward, terminated, truncated, info = self._env().step(
            key, state, self._action(action), params
        )
        return (
            x_new.astype(self.dtype),
            state_new,
            jnp.asarray(reward, self.dtype),
            jnp.asarray(terminated, bool),
            jnp.logical_or(terminated, truncated),
            info["final_observation"].astype(self.dtype),
        )

    def step(self, params: Any, sampler: Any, rand: EnvRandomness, behaviour: Any = None):
        """One environment step of one agent: the policy's action at ``x``, then :meth:`env_step`.
        ``behaviour`` is for problems whose policy follows a parameter; this one's is fixed."""
        del behaviour
        x, state = sampler
        x_new, state_new, reward, terminated, _, reached = self.env_step(
            params, state, self.policy(x, rand.u), rand.keys
        )
        return Transition(x.astype(self.dtype), reward, reached, terminated), (
            x_new.astype(x.dtype),
            state_new,
        )

    def observe(self, params: Any, sampler: Any, rand: EnvRandomness, skip: int = 1):
        """Agent's ``H`` transitions (every ``skip``-th of ``H skip`` environment steps)."""

        def one(carry, r):
            move, carry = self.step(params, carry, r)
            return carry, move

        sampler, moves = jax.lax.scan(one, sampler, rand)
        return jax.tree.map(lambda m: m[skip - 1 :: skip], moves), sampler

    def pairs(self, move: Transition, behaviour: Any = None):
        """The sparse features of a transition: ``(i, v)`` of ``phi(x)`` and ``(j, w)`` of the
        target's ``gamma (1 - terminated) phi(x')``, so that the TD direction is
        ``(v . theta[i] - r - w . theta[j])`` times ``v`` scattered into ``i``."""
        del behaviour
        i, v = self.features.sparse(move.x)
        j, w = self.features.sparse(move.next_x)
        return i, v, j, w * jnp.where(move.terminated, 0.0, self.gamma)

    def direction(self, params: Any, obs: Any, theta: jax.Array) -> jax.Array:
        """``(phi(x)^T theta - r - gamma (1 - terminated) phi(x')^T theta) phi(x)`` (:meth:`pairs`)."""
        del params
        i, v, j, w = self.pairs(obs)
        delta = jnp.dot(v, theta[i]) - obs.reward - jnp.dot(w, theta[j])
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
            "family": self.family,
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


def _new_chains(problem, key, params, chains: int, behaviour=None):
    """``chains`` fresh trajectories' first states (the policy at ``behaviour`` where it follows a
    parameter)."""
    starts = jax.random.split(key, chains)
    if behaviour is None:
        return jax.vmap(problem.init_sampler, in_axes=(0, None))(starts, params)
    return jax.vmap(problem.init_sampler, in_axes=(0, None, None))(starts, params, behaviour)


def _chain_sums(problem, key, params, samplers, burn_in, steps, theta, behaviour=None):
    """Agent's trajectories from ``samplers`` (leading axis: the chains), ``burn_in`` steps dropped,
    then over ``steps`` steps (both traced counts: no new compile for new sizes): ``sum phi (phi -
    gamma' phi')^T`` and ``sum r phi`` over every chain and step, ``sum phi^2`` (which coordinates
    are visited), per chain ``sum_t (b_t - A_t theta_k)`` at each row of ``theta (K, d)`` (None:
    not computed), and the chains' last states. The policy is the problem's, at ``behaviour`` where
    it follows a parameter (:meth:`ClassicControlTD.step`, :meth:`ClassicControlTD.pairs`). One step
    of every chain at a time (memory flat in ``steps``)."""
    d = problem.dim
    chains = jax.tree.leaves(samplers)[0].shape[0]
    k_burn, k_run = jax.random.split(key)
    rows = jnp.arange(chains)[:, None]

    def advance(samplers, key):
        rand = jax.tree.map(lambda r: r[:, 0], problem.randomness(key, chains, 1))
        step = lambda s, r: problem.step(params, s, r, behaviour)  # noqa: E731
        samplers, move = jax.vmap(lambda s, r: step(s, r)[::-1])(samplers, rand)
        return samplers, move

    def burn(t, samplers):
        return advance(samplers, jax.random.fold_in(k_burn, t))[0]

    def accumulate(t, carry):
        samplers, A, b, energy, G = carry
        samplers, move = advance(samplers, jax.random.fold_in(k_run, t))
        i, v, j, w = jax.vmap(problem.pairs, in_axes=(0, None))(move, behaviour)  # (chains, n)
        if 4 * i.shape[1] > d:  # dense features: one matrix product
            Phi = jnp.zeros((chains, d), problem.dtype).at[rows, i].add(v)
            A = A + Phi.T @ (Phi - jnp.zeros_like(Phi).at[rows, j].add(w))
        else:  # sparse (tile coding): n^2 entries per chain
            A = A.at[i[:, :, None], i[:, None, :]].add(v[:, :, None] * v[:, None, :])
            A = A.at[i[:, :, None], j[:, None, :]].add(-v[:, :, None] * w[:, None, :])
        b = b.at[i].add(move.reward[:, None] * v)
        energy = energy.at[i].add(v**2)
        if theta is not None:  # (K, chains): the TD error at each theta_k, into each chain's row
            delta = move.reward + jnp.sum(w * theta[:, j], -1) - jnp.sum(v * theta[:, i], -1)
            G = G.at[:, rows, i].add(delta[:, :, None] * v)
        return samplers, A, b, energy, G

    samplers = jax.lax.fori_loop(0, burn_in, burn, samplers)
    zeros = jnp.zeros((d, d), problem.dtype), jnp.zeros(d, problem.dtype), jnp.zeros(d, problem.dtype)
    G = None if theta is None else jnp.zeros((theta.shape[0], chains, d), problem.dtype)
    samplers, A, b, energy, G = jax.lax.fori_loop(0, steps, accumulate, (samplers, *zeros, G))
    return A, b, energy, G, samplers


# Compiled once per problem structure and sizes: a fixed-point iteration calls them with new behaviours.
_sums = jax.jit(_chain_sums)
_starts = jax.jit(_new_chains, static_argnums=3)


class Sizes(NamedTuple):
    chains: int
    steps: int
    burn_in: int


def _agent(problem, c: int):
    return jax.tree.map(operator.itemgetter(c), problem.env_params)


def _chains(problem, key, c: int, sizes: Sizes, behaviour=None, samplers=None, n: int = 0):
    """``(params, samplers, burn_in, steps)`` of agent c's sums: new chains, started from a key of
    their own (``fold_in(key, 2**31 - 1)``), or the ``n``-th of ``samplers``."""
    params = _agent(problem, c)
    if samplers is None:
        start = _starts(problem, jax.random.fold_in(key, 2**31 - 1), params, sizes.chains, behaviour)
    else:
        start = samplers[n]
    return params, start, sizes.burn_in, sizes.steps


def progress(total: int, what: str):
    """A text progress bar over the reference's ``total`` Monte Carlo passes (one agent's sums
    each); shown only in a terminal, as the runs' own bars."""
    return tqdm(total=total, desc=what, unit="pass", dynamic_ncols=True, disable=None, leave=False)


def mean_systems(problem, key, sizes: Sizes, behaviour=None, agents=None, samplers=None, bar=None):
    """``(A (K, d, d), b (K, d), energy (K, d))``: the Monte Carlo means over ``sizes`` of agents
    ``agents`` (default all; agent c draws from ``split(key, N)[c]``), float64 numpy, and the
    chains' last states (a list over ``agents``: ``samplers`` continues them instead of new
    chains)."""
    keys = jax.random.split(key, problem.num_agents)
    agents = range(problem.num_agents) if agents is None else agents
    out, last = [], []
    for n, c in enumerate(agents):
        chains = _chains(problem, keys[c], c, sizes, behaviour, samplers, n)
        A, b, e, _, end = _sums(problem, keys[c], *chains, None, behaviour)
        if bar is not None:
            bar.update(1)
        out.append([np.asarray(x, np.float64) / (sizes.chains * sizes.steps) for x in (A, b, e)])
        last.append(end)
    return (*(np.stack(x) for x in zip(*out, strict=True)), last)


def solution_errors(problem, key, sizes: Sizes, thetas, inverses, bar=None):
    """First-order standard errors of ``theta_k = A_k^+ b_k`` (``thetas`` ``(N + 1, d)``: the
    averaged system's solution, then each agent's; ``inverses`` their pseudo-inverses), from the
    chains' TD directions at them (independent chains, each chain's mean one sample):
    ``theta_hat - theta = A^+ mean_c (g_c - E g_c)``. Returns ``(sem (d,), local_sem (N, d))``."""
    N, d, chains = problem.num_agents, problem.dim, sizes.chains
    keys = jax.random.split(key, N)
    cov_star, local_sem = np.zeros((d, d)), np.zeros((N, d))
    for c in range(N):
        at = jnp.asarray(np.stack([thetas[0], thetas[1 + c]]), problem.dtype)
        G = _sums(problem, keys[c], *_chains(problem, keys[c], c, sizes), at)[3]
        if bar is not None:
            bar.update(1)
        g = np.asarray(G, np.float64) / sizes.steps
        g_star = (g[0] - g[0].mean(0)) @ inverses[0].T  # (chains, d): A_bar^+ (g - mean g)
        cov_star += g_star.T @ g_star / (chains * (chains - 1)) / N**2
        g_local = (g[1] - g[1].mean(0)) @ inverses[1 + c].T
        local_sem[c] = np.sqrt(np.sum(g_local**2, 0) / (chains * (chains - 1)))
    return np.sqrt(np.diag(cov_star)), local_sem


def reference_systems(
    problem: ClassicControlTD, key, chains: int = 256, steps: int = 2000, burn_in: int = 1000
) -> Reference:
    """The Monte Carlo reference of ``problem`` (module docstring): ``chains`` trajectories per agent
    of ``burn_in + steps`` environment steps, in float64. Deterministic in ``key``."""
    sizes = Sizes(chains, steps, burn_in)
    with progress(2 * problem.num_agents, "reference theta*") as bar:
        A, b, energy, _ = mean_systems(problem, key, sizes, bar=bar)
        inverses = [_pinv(A.mean(0)), *(_pinv(A_c) for A_c in A)]
        star = inverses[0] @ b.mean(0)
        local = np.stack([inv @ b_c for inv, b_c in zip(inverses[1:], b, strict=True)])
        sem, local_sem = solution_errors(problem, key, sizes, [star, *local], inverses, bar)
    return Reference(A, b, star, local, sem, local_sem, energy.sum(0) > 0)


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
    features = state_features(env, features, dtype)
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
    sizes = (("chains", chains), ("steps", steps), ("burn_in", burn_in))
    return with_reference(draft, ref, dtype, ("method", "monte carlo"), *sizes)


def state_features(env: str, features, dtype):
    """A state feature map of ``env``'s observation: ``features`` itself, its text
    (:func:`~fedsa_jax.problems.features.parse` over the environment's box), or (None) the
    environment's default; checked to take the observation's size."""
    low, high = ENVIRONMENTS[env].box
    if features is None or isinstance(features, str):
        features = _features.parse(
            ENVIRONMENTS[env].features if features is None else features, low, high, dtype
        )
    if getattr(features, "num_inputs", len(low)) != len(low):
        _validate.fail(
            "features", features.describe(), f"expected a map of {len(low)} inputs (the observation of {env})"
        )
    return features


def with_reference(draft, ref: Reference, dtype, *entries: tuple[str, Any]):
    """``draft`` with the reference's arrays (in ``dtype``) and its description: ``entries`` and the
    number of visited coordinates."""
    as_dtype = functools.partial(jnp.asarray, dtype=dtype)
    return dataclasses.replace(
        draft,
        A_bar=as_dtype(ref.A_bar),
        b_bar=as_dtype(ref.b_bar),
        theta_star=as_dtype(ref.theta_star),
        local_theta_star=as_dtype(ref.local_theta_star),
        theta_star_sem=as_dtype(ref.theta_star_sem),
        local_theta_star_sem=as_dtype(ref.local_theta_star_sem),
        reference=(*entries, ("visited", int(ref.visited.sum()))),
    )


def _reference_sizes(text: str) -> tuple[int, ...]:
    """``--reference CHAINS:STEPS:BURN_IN[:ITERATIONS]`` (an argparse type: a bad text names the
    option); ITERATIONS is for the SARSA problems' fixed point."""
    try:
        sizes = tuple(int(v) for v in str(text).split(":"))
        if len(sizes) not in (3, 4):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CHAINS:STEPS:BURN_IN or CHAINS:STEPS:BURN_IN:ITERATIONS, integers, got {text!r}"
        ) from None
    if sizes[0] < 2 or sizes[1] < 1 or sizes[2] < 0 or sizes[3:4] and sizes[3] < 2:
        raise argparse.ArgumentTypeError(
            f"expected CHAINS >= 2, STEPS >= 1, BURN_IN >= 0, ITERATIONS >= 2, got {text!r}"
        )
    return sizes


ENV_PARAMS = registry.Option(
    ("--env-params",),
    "env_params",
    "each agent's environment parameters (gymnax EnvParams): NAME=V, NAME=V1,...,VN, NAME=LOW:HIGH "
    "(N values spread evenly) or NAME~H (spread around the default by a relative heterogeneity H in "
    "[0, 1)), joined by ';' (e.g. CartPole's pole lengths: length=0.25:1.0 or length~0.5; "
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
    "the Monte Carlo reference theta*: CHAINS:STEPS:BURN_IN per agent (default 256:2000:1000); SARSA: "
    "CHAINS:STEPS:BURN_IN[:ITERATIONS] per fixed-point iteration (default 128:1000:1000:8)",
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


def shared_options(args, env: str, reference: tuple[int, int, int]) -> dict[str, Any]:
    """The classic-control problems' keyword arguments from the command line's options, the
    reference's sizes ``CHAINS:STEPS:BURN_IN`` defaulting to ``reference``; ``--problem-seed``
    seeds the reference."""
    chains, steps, burn_in = (args.reference or reference)[:3]
    return dict(
        num_agents=args.agents,
        env_params=parse_env_params(args.env_params, args.agents, env),
        features=args.features,
        gamma=0.9 if args.gamma is None else args.gamma,
        key=args.problem_seed,
        chains=chains,
        steps=steps,
        burn_in=burn_in,
        dtype=args.dtype,
    )


def _from_options(name: str):
    def build(key, args):
        """``--problem NAME``: :func:`classic_control_td` from the options; ``--problem-seed`` seeds
        the reference."""
        del key
        policy = default_policy(name, args.policy_epsilon, args.dtype)
        return classic_control_td(name, policy=policy, **shared_options(args, name, (256, 2000, 1000)))

    return build


for _order, _name in enumerate(ENVIRONMENTS):
    registry.register_problem(
        _name,
        _from_options(_name),
        options=(ENV_PARAMS, FEATURES, REFERENCE, EPSILON, registry.GAMMA),
        note=f"federated TD(0) on gymnax's {ENVIRONMENTS[_name].gymnax_id} (needs the envs extra)",
        order=10 + _order,
    )
