"""Exact references: exact moment recursions, FedLSA's heterogeneity bias, step-size bounds and
mixing times.

Each algorithm describes its own round with the blocks of :mod:`fedsa_jax.moments` (re-exported
here: ``fj.theory.Augmented``, ``local_step``, ``aggregate``, ...) and passes the description as
``fj.Algorithm(..., theory=fn)``; :func:`exact_mean` and :func:`exact_mse` run it
(:mod:`fedsa_jax.theory.engine`, which knows no algorithm). The built-in descriptions, below,
live in the algorithms' files.

All updates of FedLSA, SCAFFLSA and QFedTD are affine in the joint state given the
noise. Write one round on the augmented vector

    Y = (1, theta, xi_1, ..., xi_N, theta^1, ..., theta^N)

(the local iterates theta^c live in Y during a round): broadcast
``theta^c <- theta``; H local steps
``theta^c <- (I - eta A_bar[c]) theta^c + eta b_bar[c] + eta xi_c + w_c``;
aggregation ``theta <- mean_c theta^c`` and, for SCAFFLSA,
``xi_c <- xi_c + (theta - theta^c) / (eta H)``. Each is ``Y <- L Y + w`` with a
constant matrix L and a noise w of mean zero given Y, so whenever observations
are i.i.d. (Gaussian LSA, generative TD) the mean follows ``m <- L m`` and the
second moment ``S = E[Y Y^T]`` follows ``S <- L S L^T + E[w w^T]``, with
``E[w w^T]`` linear in S:

* Gaussian LSA: ``w_c = -eta (noise_A G theta^c - noise_b g)`` has covariance
  ``eta^2 (noise_A^2 tr E[theta^c theta^c^T] + noise_b^2) I``;
* generative TD: ``Z = (s, s')`` has finite support, so ``E[w_c w_c^T]`` is a finite
  sum over states of ``mu_c(s) phi(s) phi(s)^T E_{s'|s}[(r_c(s) - u^T theta^c)^2]``,
  ``u = phi(s) - gamma phi(s')``, minus the mean part; it needs only ``E[u|s]`` and
  ``E[u u^T|s]``, enumerated once;
* any problem with ``finite_support()`` (least squares, the noise-free
  ``fj.problems.expected(problem)``, user problems): ``E[w_c w_c^T]`` is the finite
  sum over agent c's support points of ``w_k E[(A_k x - b_k)(A_k x - b_k)^T]``
  (linear in ``E[x]`` and ``E[x x^T]``, see ``fj.problems.FiniteSupport``), minus
  the mean part;
* the uplink channel (FedLSA, QFedTD): random aggregation weights (erasures) and
  quantizer errors of mean zero add ``sum_{c,j} Cov(w_c, w_j) E[m_c m_j^T] +
  sum_c E[w_c^2] V(E[m_c m_c^T])`` to the theta block, V linear for ``identity``
  and ``rand_k``.

**Error coordinates.** The recursions run on ``Y`` with every iterate replaced by its
error from ``theta_star`` (``e = theta - theta_star``, ``e^c = theta^c - theta_star``,
``x_sync - theta_star``): the maps above commute with that shift except the local
step, whose constant becomes ``-eta rho_c`` with ``rho_c = A_bar[c] theta_star -
b_bar[c]`` (float64). ``E|theta_t - theta_star|^2 = tr E[e_t e_t^T]`` is then read off S
with no cancellation, exact to float64 rounding at any step size (reading it as
``E|theta|^2 - 2 theta_star^T E[theta] + |theta_star|^2`` lost a third of the value at
``eta = 1e-7``). Everything runs in float64 numpy.

**Scaffnew** (ProxSkip) carries its agents' iterates ``x_c`` and control variates
``xi_c`` across rounds, and ``x_sync`` (the last synchronised iterate) at the end of
Y: no broadcast; each local step is the local map above followed, with probability p
(a coin independent of the state), by the communication
``xi_c <- xi_c + (p / eta)(xbar - x_c)``, ``x_c <- xbar``, ``x_sync <- xbar`` with
``xbar = mean_j x_j`` (exact channel); a round of H local steps ends with
``theta <- mean_c x_c``. One local step therefore maps the mean by
``((1 - p) I + p L_comm) L_s`` and the second moment by the same mixture of
``L_s S L_s^T + E[w w^T]`` and ``L_comm (L_s S L_s^T + E[w w^T]) L_comm^T``.

**Schedules, server optimizers, averaging** (:mod:`fedsa_jax.optim`,
:func:`fedsa_jax.averaged`). A step-size schedule makes the local map time-varying: local
step ``k = t H + h`` uses ``eta_k`` (SCAFFLSA's control variates divide by
``sum_h eta_{tH+h}``, Scaffnew's by ``eta_k / p``). A server optimizer is probed in float64
as an affine map ``[u; s'] = M [g; s; theta] + c`` of the pseudo-gradient
``g = theta - a``, its flattened state s and the iterate (``optax.sgd`` with momentum is
``s' = g + beta s``, ``u = -lr s'``); Y gains the block s and a scratch block a for the
aggregate, and the channel's noise enters a. Optimizers that are not affine (Adam,
RMSProp) or whose state counts steps are refused. Averaging adds the running mean
``v <- v + (theta - v) / (t - b)`` (``t > b``) to Y, and v is reported after the burn-in.
Richardson-Romberg's mean is ``2 E[theta(eta)] - E[theta(2 eta)]`` (:func:`exact_mean`).

**Markov sampling** (``sampling="markov"``, federated TD, small chains:
:mod:`fedsa_jax.theory.markov`). Given the transition ``s -> s'`` of each agent's chain a local
step is a deterministic affine map, so Y is a Markov jump linear system (Costa, Fragoso,
Marques, "Discrete-Time Markov Jump Linear Systems", Springer 2005): :func:`exact_mean`,
:func:`exact_mse`, :func:`stationary_mean` and :func:`stationary_mse` propagate (or solve for) the
moments ``E[Y 1{s = j}]`` and ``E[Y Y^T 1{s = j}]`` conditioned on the agents' joint chain state j,
one per each of the ``S^N`` joint states (at most ``MAX_MARKOV_ENTRIES`` entries), skip included;
:func:`mean_spectral_radius`, :func:`mean_square_spectral_radius` and hence
:func:`max_stable_step_size` take the radii of those conditional recursions.

Uplink channels keep the mean dynamics linear for every algorithm: in
:func:`exact_mean` the server step uses the expected aggregation weights
``E[w_c]`` (``p / N`` for ``"divide_by_n"``, ``(1 - (1 - p)^N) / N`` for
``"divide_by_received"``) and the control variate steps of SCAFFLSA and Scaffnew
the expected products ``E[1{c in R} 1{j in R} / |R|]``.

Also: :func:`fedlsa_bias` (limit and per-round), :func:`fedlsa_round_bias`,
:func:`lsa_step_size_bound` and :func:`max_stable_step_size` (mean or mean-square stability),
:func:`stationary_mean`, :func:`stationary_mse` and :func:`mean_square_spectral_radius` (the
limits with a constant step, solved directly: :mod:`fedsa_jax.theory.stationary`),
:func:`tv_to_stationary` and :func:`mixing_time` (per-agent Markov chains).

References: Mangold et al., SCAFFLSA, NeurIPS 2024, arXiv:2402.04114, Sec. 3-4
(FedLSA bias, rho_bar_H, Markovian skipping) and Sec. 5 (SCAFFLSA); Dal Fabbro,
Mitra, Pappas, QFedTD, IEEE L-CSS 2023 (channel model); Mishchenko, Malinovsky,
Stich, Richtárik, ProxSkip, ICML 2022, arXiv:2202.09357 (Scaffnew).
"""

from fedsa_jax import moments as _moments
from fedsa_jax.channel.downlink import downlink, downlink_blocks
from fedsa_jax.moments import (
    MAX_AUGMENTED_DIM,
    START,
    Affine,
    Augmented,
    Combination,
    Recursion,
    agents_mean,
    aggregate,
    assign,
    averaging,
    broadcast,
    chain,
    channel_memory,
    coin,
    local_step,
    random_stop,
    rebase,
    recursion_of,
    scale_updates,
    server_step,
    shift,
)
from fedsa_jax.theory.engine import (
    _second_moments,
    exact_covariance,
    exact_mean,
    exact_mse,
    lsa_step_size_bound,
    mean_spectral_radius,
)
from fedsa_jax.theory.markov import MAX_MARKOV_ENTRIES
from fedsa_jax.theory.mean_path import mean_path, mean_path_limit
from fedsa_jax.theory.references import (
    fedlsa_bias,
    fedlsa_round_bias,
    max_stable_step_size,
    mixing_time,
    privacy_noise_floor,
    tv_to_stationary,
)
from fedsa_jax.theory.stationary import (
    MAX_STATIONARY_UNKNOWNS,
    mean_square_spectral_radius,
    stationary_mean,
    stationary_mse,
)

__all__ = [
    "exact_covariance",
    "exact_mean",
    "exact_mse",
    "fedlsa_bias",
    "fedlsa_round_bias",
    "lsa_step_size_bound",
    "max_stable_step_size",
    "mean_path",
    "mean_path_limit",
    "mean_spectral_radius",
    "mean_square_spectral_radius",
    "mixing_time",
    "privacy_noise_floor",
    "stationary_mean",
    "stationary_mse",
    "tv_to_stationary",
]
__all__ += [*_moments.__all__, "downlink", "downlink_blocks"]
