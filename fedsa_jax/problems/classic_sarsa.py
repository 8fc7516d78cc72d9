"""Federated SARSA on classic control: gymnax's environments, each agent with its own physics, the
behaviour policy a softmax of the current linear Q-estimate.

Agent c runs its environment (its own ``EnvParams``, :func:`~fedsa_jax.problems.environments.
agent_env_params`) with one Markov trajectory of observation-action pairs per seed, carried across
rounds; an episode that ends is reset inside the kernel. The Q-estimate is linear in state-action
features ``phi(x, a) = e_a (x) phi(x)`` (:func:`~fedsa_jax.problems.features.state_action` over a
state map), and the behaviour policy is ``pi_theta(a | x) ∝ exp(phi(x, a)^T theta / tau)``. A local
step at ``(x, a)`` with the agent's *current local iterate* ``theta^c`` steps the environment to
``x'``, draws ``a' ~ pi_{theta^c}(. | x')`` and moves along

    (phi(x, a)^T theta - r - gamma (1 - terminated) phi(x', a')^T theta) phi(x, a),

then continues from ``(x', a')`` (after a reset, from the reset observation and an action drawn
there). The observation law follows the iterate, as for :mod:`fedsa_jax.problems.federated_sarsa`:
the problem draws with ``observe_step`` and the exact linear recursions refuse it.

**The deterministic limit.** FedSARSA's noise-free path with ``H = 1`` settles on
``theta_lim_fed``, the root of ``mean_c g_c(theta)`` with ``g_c(theta) = b_c(theta) - A_c(theta)
theta`` the expected SARSA direction of agent c under the stationary law of its chain driven by
``pi_theta``. Continuous states have no closed form for ``g_c``; :func:`sarsa_reference` finds the
root as the fixed point of ``T(theta) = (mean_c A_c(theta))^+ mean_c b_c(theta)`` (a root of the
mean field is exactly a fixed point of T), with ``A_c``, ``b_c`` estimated by the Monte Carlo of
:func:`~fedsa_jax.problems.classic_control.mean_systems` under the policy frozen at ``theta`` (the
target's next features averaged over ``pi_theta(. | x')``: same mean, less variance). Fresh draws
at every iteration: one action that flips sends a CartPole trajectory elsewhere, so common random
numbers would not make the estimated T smooth. The chains go on from one iteration to the next
(the burn-in in full at the first, a quarter of it for each new policy). :data:`REPLICAS`
independent replicas, each on its share of the chains and draws of its own, apply T for the first
half of the iterations, then solve the pooled systems of all their later iterations. Their mean is
the estimate and their spread its standard error, which counts the noise fed back through the
policy. (Replicas that shared a first half run on every chain reported 1.5 times too small a
variance: the shared start's error is in every replica.)

*What is known.* The estimate's error bar is the replicas' spread, checked against the spread of
independent references (``tests/test_classic_sarsa.py``), and FedSARSA with one local step and
small decreasing steps keeps its mean on it. *What is not.* T is a contraction only for a large
enough temperature (Perkins & Precup 2003; Melo, Meyn, Ribeiro 2008): for a smaller one the limit
may not exist or not be unique, and nothing here proves that it does. Errors the replicas share are
not in the error bar: the bias of a ratio of noisy sums, and of the policy's curvature, both of the
order of one replica's variance (measured on CartPole at the default sizes, 16 chains of 1000 steps
per replica and 8 iterations: an independent reference of 4x the work lay at twice the squared
distance the error bars expect), and a ``burn_in`` too short for the chains to forget their start.

``local_theta_star[c]`` is agent c's own limit (the same iteration on its system alone, from
``theta_star``); ``A_bar``, ``b_bar`` are the frozen systems at ``theta_star``'s policy, so
``mean_c A_bar[c]`` solves to ``theta_star`` only up to the estimate's error.

Requires gymnax (``pip install 'fedsa-jax[envs]'``).

References: Mangold, Berthier, Moulines, "Convergence guarantees for federated SARSA with local
training and heterogeneous agents", arXiv:2512.17688 (2025); Perkins & Precup, "A convergent form of
approximate policy iteration", NeurIPS 2003; Melo, Meyn, Ribeiro, "An analysis of reinforcement
learning with function approximation", ICML 2008; Sutton & Barto, 2nd ed., Sec. 10.1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate, registry
from fedsa_jax.problems import classic_control as _td, features as _features
from fedsa_jax.problems._base import float64
from fedsa_jax.problems.environments import ENVIRONMENTS, agent_env_params, num_actions
from fedsa_jax.problems.federated_sarsa import refuse_observe, softmax_draw

__all__ = [
    "ClassicControlSARSA",
    "SoftmaxPolicy",
    "classic_control_sarsa",
    "sarsa_reference",
]

# the reference's default sizes: chains, steps and burn-in of each fixed-point iteration, iterations
CHAINS, STEPS, BURN_IN, ITERATIONS = 128, 1000, 1000, 8
REBURN = 4  # after the first iteration the chains go on, with a quarter of the burn-in for the new policy
REPLICAS = 8  # independent fixed-point iterations: their spread is the reference's standard error


class SARSATransition(NamedTuple):
    x: jax.Array  # (k,)
    action: jax.Array  # () int32
    reward: jax.Array  # ()
    next_x: jax.Array  # (k,) the observation reached, before any reset
    next_action: jax.Array  # () int32, drawn at next_x with the current iterate
    terminated: jax.Array  # () bool


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SoftmaxPolicy:
    """``pi_theta(a | x) ∝ exp(q_a / tau)`` of the Q-values ``q`` (temperature tau)."""

    temperature: jax.Array

    def __call__(self, q: jax.Array, u: jax.Array) -> jax.Array:
        """The action of the uniform ``u`` (:func:`~fedsa_jax.problems.federated_sarsa.softmax_draw`)."""
        return softmax_draw(q, self.temperature, u)

    def probabilities(self, q: jax.Array) -> jax.Array:
        return jax.nn.softmax(q / self.temperature, axis=-1)

    def describe(self) -> dict[str, Any]:
        return {"policy": "softmax", "temperature": float(self.temperature)}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClassicControlSARSA(_td.ClassicControlTD):
    """Federated SARSA on a gymnax environment (module docstring); build with
    :func:`classic_control_sarsa`. ``features`` is a :class:`~fedsa_jax.problems.features.StateAction`
    map and ``policy`` a :class:`SoftmaxPolicy`; the rest is :class:`ClassicControlTD`'s."""

    family = "classic_control_sarsa"

    def q_values(self, x: jax.Array, theta: jax.Array) -> jax.Array:
        """``(phi(x, a)^T theta)_a``, ``(A,)``."""
        i, v = self.features.state.sparse(x)
        return theta.reshape(self.features.num_actions, -1)[:, i] @ v

    def init_sampler(self, key: jax.Array, params: Any, theta0: Any = None) -> Any:
        """``(x_0, state_0, a_0)``: gymnax's reset, then ``a_0 ~ pi_{theta0}(. | x_0)``."""
        k_reset, k_action = jax.random.split(key)
        x, state = self._env().reset(k_reset, params)
        u = jax.random.uniform(k_action, (), self.dtype)
        return x, state, self.policy(self.q_values(x.astype(self.dtype), theta0), u)

    def step(self, params: Any, sampler: Any, rand: _td.EnvRandomness, behaviour: Any = None):
        """One SARSA transition with the policy of ``behaviour`` (the current iterate): step from
        ``(x, a)``, then ``a' ~ pi(. | x')`` with ``u[0]``; after a reset the trajectory goes on from
        the reset observation and an action drawn there with the same uniform."""
        x, state, a = sampler
        x_new, state_new, reward, terminated, done, reached = self.env_step(params, state, a, rand.keys)
        next_action = self.policy(self.q_values(reached, behaviour), rand.u[0])
        restart = self.policy(self.q_values(x_new, behaviour), rand.u[0])
        move = SARSATransition(x.astype(self.dtype), a, reward, reached, next_action, terminated)
        return move, (x_new.astype(x.dtype), state_new, jnp.where(done, restart, next_action))

    def randomness(self, key: jax.Array, num_agents: int, num_obs: int, skip: int = 1):
        """As TD's, one environment step per local step: SARSA updates on every transition."""
        if skip != 1:
            _validate.fail(
                "skip", skip, "SARSA updates on every transition of its trajectory: skip must be 1"
            )
        return super().randomness(key, num_agents, num_obs)

    def observe(self, params: Any, sampler: Any, rand: Any, skip: int = 1):
        """Refused: the observations follow the iterate (``observe_step``)."""
        del params, sampler, rand, skip
        refuse_observe(f"sarsa-{self.env}")

    def observe_step(self, params: Any, sampler: Any, rand: _td.EnvRandomness, theta: jax.Array):
        """One transition with the agent's current iterate ``theta`` (:meth:`step`)."""
        return self.step(params, sampler, rand, theta)

    def pairs(self, move: SARSATransition, behaviour: Any = None):
        """``(i, v)`` of ``phi(x, a)`` and ``(j, w)`` of the target's ``gamma (1 - terminated)
        phi(x', a')``; with ``behaviour``, the target's features averaged over
        ``pi_behaviour(. | x')`` instead of the drawn ``a'`` (the reference's lower-variance sum)."""
        i, v = self.features.sparse(move.x, move.action)
        if behaviour is None:
            j, w = self.features.sparse(move.next_x, move.next_action)
        else:
            k, u = self.features.state.sparse(move.next_x)
            pi = self.policy.probabilities(self.q_values(move.next_x, behaviour))
            blocks = jnp.arange(self.features.num_actions, dtype=k.dtype)[:, None] * self.features.state.dim
            j, w = (k[None, :] + blocks).ravel(), (pi[:, None] * u[None, :]).ravel()
        return i, v, j, w * jnp.where(move.terminated, 0.0, self.gamma)


def _iterate(problem, key, sizes: _td.Sizes, theta, iterations: int, agents, chains, pool: bool, bar):
    """``iterations`` steps of the fixed-point iteration on the systems of ``agents`` from ``theta``,
    fresh draws at each (``fold_in(key, k)``), the chains going on from ``chains`` (None: new ones,
    burnt in for ``sizes.burn_in`` steps; else ``burn_in / REBURN`` steps for the new policy):
    ``theta <- T_k(theta)`` (Picard), or with ``pool`` the solve of the sum of every system so far.
    Returns ``(theta, chains)``."""
    A_sum = b_sum = 0.0
    for k in range(iterations):
        at = sizes if chains is None else sizes._replace(burn_in=sizes.burn_in // REBURN)
        A, b, _, chains = _td.mean_systems(
            problem, jax.random.fold_in(key, k), at, jnp.asarray(theta), agents, chains, bar
        )
        A_sum, b_sum = (A_sum + A.mean(0), b_sum + b.mean(0)) if pool else (A.mean(0), b.mean(0))
        theta = _td._pinv(A_sum) @ b_sum
    return theta, chains


def _fixed_point(problem, key, sizes: _td.Sizes, start, iterations: int, agents, bar):
    """The fixed point of T over the systems of ``agents`` (module docstring) from ``start``, by
    :data:`REPLICAS` independent replicas, each on its share of the chains and draws of its own:
    half the ``iterations`` apply T, the rest pool the systems of those iterations. Returns the
    replicas' mean and its standard error (their spread)."""
    picard = max(1, iterations // 2)
    share = sizes._replace(chains=sizes.chains // REPLICAS)
    runs = []
    for r in range(REPLICAS):
        k_picard, k_pooled = jax.random.split(jax.random.fold_in(key, r))
        theta, chains = _iterate(problem, k_picard, share, start, picard, agents, None, False, bar)
        runs.append(
            _iterate(problem, k_pooled, share, theta, iterations - picard, agents, chains, True, bar)[0]
        )
    runs = np.stack(runs)
    return runs.mean(0), runs.std(0, ddof=1) / np.sqrt(REPLICAS)


def sarsa_reference(
    problem: ClassicControlSARSA,
    key,
    chains: int = CHAINS,
    steps: int = STEPS,
    burn_in: int = BURN_IN,
    iterations: int = ITERATIONS,
) -> _td.Reference:
    """The Monte Carlo estimate of the deterministic limit (module docstring), float64: ``chains``
    trajectories per agent at each of the ``iterations`` (:func:`_fixed_point`); the standard errors
    are the replicas' spread. ``A_bar``, ``b_bar``: every agent's frozen system at ``theta_star``'s
    policy, from ``chains`` more trajectories each."""
    N = problem.num_agents
    sizes = _td.Sizes(chains, steps, burn_in)
    keys = jax.random.split(key, N + 2)
    picard = max(1, iterations // 2)
    passes = 2 * N * (picard + REPLICAS * (iterations - picard)) + N
    with _td.progress(passes, "reference theta_lim_fed") as bar:
        star, sem = _fixed_point(problem, keys[0], sizes, np.zeros(problem.dim), iterations, None, bar)
        local = [_fixed_point(problem, keys[2 + c], sizes, star, iterations, [c], bar) for c in range(N)]
        A, b, energy, _ = _td.mean_systems(problem, keys[1], sizes, jnp.asarray(star), bar=bar)
    return _td.Reference(
        A, b, star, np.stack([m for m, _ in local]), sem, np.stack([s for _, s in local]), energy.sum(0) > 0
    )


def classic_control_sarsa(
    env: str = "cartpole",
    num_agents: int = 4,
    env_params: dict | None = None,
    features=None,
    temperature: float = 2.0,
    gamma: float = 0.9,
    key=0,
    chains: int = CHAINS,
    steps: int = STEPS,
    burn_in: int = BURN_IN,
    iterations: int = ITERATIONS,
    dtype=None,
) -> ClassicControlSARSA:
    """Federated SARSA on a gymnax classic-control environment with a Monte Carlo estimate of its
    deterministic limit (module docstring).

    Args:
      env, num_agents, env_params, gamma, key, chains, steps, burn_in, dtype: as
        :func:`~fedsa_jax.problems.classic_control.classic_control_td` (the sizes are per iteration
        of the reference's fixed point).
      features: a state feature map or its text; the Q-estimate uses
        :func:`~fedsa_jax.problems.features.state_action` of it. Default: the environment's.
      temperature: tau > 0 of the softmax policy (small: nearly greedy, and the limit may not
        exist).
      iterations: the most fixed-point iterations of the reference.
    """
    _validate.choice("env", env, tuple(ENVIRONMENTS))
    N = _validate.integer("num_agents", num_agents, 1)
    gamma = _validate.real("gamma", gamma, 0.0, 1.0, high_open=True)
    tau = _validate.real("temperature", temperature, 0.0, low_open=True)
    chains = _validate.integer("chains", chains, 2 * REPLICAS)
    steps = _validate.integer("steps", steps, 1)
    burn_in = _validate.integer("burn_in", burn_in, 0)
    iterations = _validate.integer("iterations", iterations, 2)
    dtype = _validate.float_dtype("dtype", dtype)
    params = agent_env_params(env, N, **(env_params or {}))
    state = _td.state_features(env, features, dtype)
    features = _features.state_action(state, num_actions(env))
    key = jax.random.key(key) if isinstance(key, int) else key
    d = features.dim
    zeros = jnp.zeros((N, d, d), dtype)
    draft = ClassicControlSARSA(
        params, features, SoftmaxPolicy(jnp.asarray(tau, dtype)), jnp.asarray(gamma, dtype), zeros,
        zeros[:, 0], zeros[0, 0], zeros[:, 0], zeros[0, 0], zeros[:, 0], env,
    )  # fmt: skip
    with float64():
        ref = sarsa_reference(_td._with_dtype(draft, np.float64), key, chains, steps, burn_in, iterations)
    return _td.with_reference(
        draft, ref, dtype, ("method", "monte carlo fixed point"), ("chains", chains), ("steps", steps),
        ("burn_in", burn_in), ("iterations", iterations), ("replicas", REPLICAS),
    )  # fmt: skip


def _from_options(name: str):
    def build(key, args):
        """``--problem sarsa-NAME``: :func:`classic_control_sarsa` from the options;
        ``--problem-seed`` seeds the reference."""
        del key
        options = _td.shared_options(args, name, (CHAINS, STEPS, BURN_IN))
        iterations = (args.reference or ())[3:] or (ITERATIONS,)
        return classic_control_sarsa(name, temperature=args.temperature, iterations=iterations[0], **options)

    return build


for _order, _name in enumerate(ENVIRONMENTS):
    registry.register_problem(
        f"sarsa-{_name}",
        _from_options(_name),
        options=(_td.ENV_PARAMS, _td.FEATURES, _td.REFERENCE, registry.TEMPERATURE, registry.GAMMA),
        note=f"federated SARSA (control) on gymnax's {ENVIRONMENTS[_name].gymnax_id} (needs the envs extra)",
        order=20 + _order,
    )
