"""optax inside the kernel: step-size schedules and server optimizers.

**Step-size schedules.** ``step_size`` of :func:`~fedsa_jax.fedlsa`,
:func:`~fedsa_jax.scafflsa`, :func:`~fedsa_jax.qfedtd` and :func:`~fedsa_jax.scaffnew`
is a float or a schedule: any optax schedule (a function of an integer count), or
``fj.schedule(factory, **hyperparameters)``. The count is the **global local-step
index** ``k = t H + h`` (0-based: round t, local step h < H), as optax counts
updates; ``fj.schedule(fn, per_round=True)`` counts rounds instead (every local step of
round t uses ``eta_t``, e.g. ``fj.schedule(fj.optim.inverse_power, eta0=1.0, t0=100.0,
power=0.6, per_round=True)``, ``eta_t = eta0 (t + t0)^-power``). Otherwise every local step of
round t uses its own ``eta_k``.

**Local steps that change with the round.** ``num_local_steps`` is an integer H or a
table ``H_t`` over the run's rounds (:func:`local_steps`, :func:`growing_local_steps`;
a list of integers is taken as one): round t runs ``H_t`` local steps, the local-step index
of its step h is ``k = K_t + h`` with ``K_t = sum_{s<t} H_s``. In the kernel every round has
``H_max = max_t H_t`` steps, those past ``H_t`` with step size 0 and no observation drawn from
a Markov chain (their random numbers are drawn and left unused): one compiled program for
the whole run, whose useful fraction is ``mean_t H_t / H_max``. A table is static: another
table compiles again. SCAFFLSA's control-variate update divides by the sum of the
round's steps, ``sum_{h<H} eta_{tH+h}`` (``eta H`` for a constant step); Scaffnew's
by ``eta_k / p`` at the local step k that communicates. The exact theory
(:mod:`fedsa_jax.theory`) follows the same definitions.

A float keeps the constant-step kernel. A schedule given as a plain function is a
static part of the configuration (each new function object compiles once);
``fj.schedule(factory, **hyperparameters)`` builds it inside the kernel from its
**float hyperparameters, which are traced**: a sweep over ``eta0`` of
``fj.schedule(fj.optim.inverse_time, eta0=..., k0=100.0)`` compiles once.
Integer, boolean and string hyperparameters are static.

**Server optimizers.** ``server_optimizer=`` an ``optax.GradientTransformation``
(or ``fj.optimizer(factory, **hyperparameters)``, whose float hyperparameters are
traced) turns the server step into an optimizer step on the pseudo-gradient

    g_t = theta_t - aggregate_t,        (updates, s_{t+1}) = update(g_t, s_t, theta_t),
    theta_{t+1} = theta_t + updates     (optax.apply_updates),

where ``aggregate_t`` is the channel's aggregate of the agents' messages (the new
iterate without an optimizer). ``None`` is the plain update, bitwise;
``optax.sgd(1.0)`` equals it up to rounding; ``optax.sgd(lr, momentum=beta)`` is
FedAvgM (Hsu, Qi, Brown, 2019) and ``optax.adam(lr)`` FedAdam (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021). The optimizer state ``s_t`` lives in
the algorithm's state (``state.opt_state``, per seed). The optimizer runs in error
coordinates (``theta - theta_star``: the differences are the same) and gets
``params = theta_t``.

**Descriptions.** ``describe()`` (``result.config``, checkpoint fingerprints, the code
digest) reads public things only: the factory's public name and hyperparameters
(``{"name": "optax.sgd", "learning_rate": 0.5}``), or for an object passed built, a
name and its behavioural :func:`fingerprint`; never optax's private closures, so a
release of optax that computes the same describes the same.

References: Polyak and Juditsky, "Acceleration of stochastic approximation by
averaging", SIAM J. Control Optim. 1992 (decreasing steps, averaging); Reddi et al.,
ICLR 2021, arXiv:2003.00295 (server optimizers).

The package: :mod:`~fedsa_jax.optim.schedules` (schedules, server optimizers, the round's step
sizes), :mod:`~fedsa_jax.optim.rounds` (local steps that change with the round),
:mod:`~fedsa_jax.optim.fingerprints` (descriptions and fingerprints).
"""

# ``name as name``: the package's own blocks, read as optim.<name> by the algorithms and the driver
from fedsa_jax.optim.fingerprints import fingerprint
from fedsa_jax.optim.rounds import (
    LocalSteps,
    active_steps as active_steps,
    check_horizon as check_horizon,
    growing_local_steps,
    local_steps,
    local_steps_arg as local_steps_arg,
    max_local_steps as max_local_steps,
    round_local_steps as round_local_steps,
    rounds_within as rounds_within,
    total_local_steps as total_local_steps,
)
from fedsa_jax.optim.schedules import (
    Schedule,
    ServerOptimizer,
    check_run as check_run,
    init_server,
    inverse_power,
    inverse_time,
    is_constant as is_constant,
    optimizer,
    round_step_sum as round_step_sum,
    schedule,
    schedule_values as schedule_values,
    server_optimizer_arg,
    server_step,
    step_size_arg,
    step_sizes,
)

__all__ = [
    "LocalSteps",
    "Schedule",
    "ServerOptimizer",
    "fingerprint",
    "growing_local_steps",
    "init_server",
    "inverse_power",
    "inverse_time",
    "local_steps",
    "optimizer",
    "schedule",
    "server_optimizer_arg",
    "server_step",
    "step_size_arg",
    "step_sizes",
]
