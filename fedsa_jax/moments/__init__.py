"""Building blocks of exact moment recursions: an algorithm describes its round with them, and
:func:`fedsa_jax.theory.exact_mean` and :func:`~fedsa_jax.theory.exact_mse` run the description.

With i.i.d. observations every update of a federated LSA algorithm built from the simulation blocks
(:mod:`fedsa_jax.algorithms`) is affine in a joint state given the round's noise. An algorithm
lays that state out as an :class:`Augmented` vector

    Y = (1, theta, <its own blocks: control variates, local iterates, optimizer state, averages...>)

in **error coordinates** (every iterate minus ``theta_star``, so the MSE is read with no
cancellation), and describes round t as a list of **phases**, each ``Y <- L Y + w`` with a
constant matrix L and a noise w of mean zero given Y. The mean follows ``m <- L m``; the second
moment ``S = E[Y Y^T]`` follows ``S <- L S L^T + E[w w^T]`` with ``E[w w^T]`` linear in S. The
phases mirror the simulation blocks:

==========================================  ============================================================
simulation                                  phase
==========================================  ============================================================
agents start from theta (``run_agents``)     :func:`broadcast` (``loc_c <- theta``)
one local step (``local_updates``)           :func:`local_step`: ``loc_c <- (I - eta A_bar[c]) loc_c
                                             - eta rho_c + eta xi_c + w_c``, w_c from the problem's
                                             ``noise_second_moment()`` or ``finite_support()``
``server_update`` (+ the channel)            :func:`aggregate`: ``a <- ref + sum_c E[w_c](loc_c - ref)``;
                                             erasure weights and quantizer noise enter S exactly;
                                             error feedback's memory: :func:`channel_memory`
``control_variate_update``                   ``aggregate(..., control_variates="xi", denominator=...)``
a compressed downlink (``broadcast`` of        :func:`fedsa_jax.channel.downlink.downlink_blocks`,
:mod:`fedsa_jax.channel.downlink`)           :func:`~fedsa_jax.channel.downlink.downlink` (``hat <- hat +
                                             C(theta - hat)``), :func:`shift`; agents start from hat
``fj.optim.server_step``                     :func:`server_step` (an affine optax optimizer, probed)
a coin (communicate with probability p)      :func:`coin`
``fj.averaged``                              :func:`averaging`
anything else affine                         :func:`assign`, :func:`agents_mean`, :class:`Affine`
==========================================  ============================================================

``rho_c = A_bar[c] theta_star - b_bar[c]`` (float64) is the constant of a local step in error
coordinates. :func:`chain` groups phases (one map, cached: a local step and its coin). A
:class:`Recursion` holds the state and the round (``round(t, etas) -> phases``, ``etas`` the
round's H local step sizes, a schedule's values included); a :class:`Combination` is a linear
combination of other algorithms' means (Richardson-Romberg). An algorithm passes its
description as ``fj.Algorithm(..., theory=fn)`` with ``fn(config, problem) -> Recursion``.

Example (server momentum on the agents' mean, ``v <- beta v + (mean - theta)``, ``theta <- theta + v``)::

    def fedavgm_theory(config, problem):
        y = fj.theory.Augmented(problem)
        y.add("loc", per_agent=True)             # the agents' iterates
        y.add("velocity", carried=True)          # kept across rounds (starts at 0)
        y.add("mean")                            # scratch: the aggregate
        b = float(config.momentum)
        server = fj.theory.assign(y, velocity={"velocity": b, "mean": 1.0, "theta": -1.0},
                                  theta={"velocity": b, "mean": 1.0})
        def round(t, etas):
            return [fj.theory.broadcast(y), *(fj.theory.local_step(y, eta) for eta in etas),
                    fj.theory.aggregate(y, fj.channel.channel(), into="mean"), server]
        return fj.theory.Recursion(y, round, config.step_size, config.num_local_steps)

The package, by concern: :mod:`~fedsa_jax.moments.state` (the augmented state, phases' base class,
the recursion), :mod:`~fedsa_jax.moments.phases` (the generic phases),
:mod:`~fedsa_jax.moments.aggregation` (the uplink's aggregate: channel, cohort, privacy noise, error
feedback), :mod:`~fedsa_jax.moments.noise` (the problems' noise models). A mechanism's own phase lives
in its module of :mod:`fedsa_jax.channel` (downlink, delays, local work).
"""

from fedsa_jax.moments.aggregation import aggregate, channel_memory
from fedsa_jax.moments.phases import (
    agents_mean,
    assign,
    averaging,
    broadcast,
    chain,
    coin,
    local_step,
    random_stop,
    rebase,
    scale_updates,
    server_step,
    shift,
)
from fedsa_jax.moments.state import (
    MAX_AUGMENTED_DIM,
    START,
    Affine,
    Augmented,
    Combination,
    Recursion,
    recursion_of,
)

__all__ = [
    "MAX_AUGMENTED_DIM",
    "START",
    "Affine",
    "Augmented",
    "Combination",
    "Recursion",
    "agents_mean",
    "aggregate",
    "assign",
    "averaging",
    "broadcast",
    "chain",
    "channel_memory",
    "coin",
    "local_step",
    "random_stop",
    "rebase",
    "recursion_of",
    "scale_updates",
    "server_step",
    "shift",
]
