"""Random federated TD problems used in the source papers' experiments.

* :func:`garnet`: Garnet MDPs as in the SCAFFLSA experiments (Mangold et al.,
  NeurIPS 2024, Sec. 6): S=30 states, 2 actions, branching 2, d=8 features with
  U(0,1) entries and each row divided by its sum, gamma=0.95, per-state rewards
  U(0,1).
* :func:`qfedtd_mdp`: the 20-state MDP of the QFedTD experiments (Dal Fabbro,
  Mitra, Pappas, 2023, Sec. 5): one MDP shared by all agents, random row-
  stochastic P, uniform rewards, d=10 orthonormal features, gamma=0.5.

Both are deterministic functions of the JAX key.
"""

from __future__ import annotations

import numpy as np

from fedsa_jax import _validate, registry
from fedsa_jax.problems.td import SAMPLING_MODES, FederatedTD, federated_td

__all__ = ["garnet", "qfedtd_mdp"]

HETEROGENEITY_MODES = {"homogeneous": 0.0, "heterogeneous": 1.0}
GARNET_BRANCHING = 2  # garnet's default branching


def is_primitive(P: np.ndarray) -> bool:
    """Irreducible and aperiodic: ``(P > 0)^k > 0`` entrywise for ``k >= (S-1)^2 + 1`` (Wielandt)."""
    S = P.shape[0]
    M = (P > 0).astype(np.float64)
    power = 1
    while power < (S - 1) ** 2 + 1:
        M = np.minimum(M @ M, 1.0)
        power *= 2
    return bool(np.all(M > 0))


def _garnet_kernel(rng, S, A, branching):
    """``P[s, a, :]``: ``branching`` distinct successors with U(0,1) weights."""
    P = np.zeros((S, A, S))
    for s in range(S):
        for a in range(A):
            succ = rng.choice(S, size=branching, replace=False)
            w = rng.uniform(size=branching)
            P[s, a, succ] = w / w.sum()
    return P


def _sizes(num_agents, num_states) -> tuple[int, int]:
    """``(N, S)``, each in ``[1, 2^31 - 1]``, with ``N S^2`` (the flat transition tables) within int32."""
    N = _validate.integer("num_agents", num_agents, maximum=_validate.INDEX_MAX)
    S = _validate.integer("num_states", num_states, maximum=_validate.INDEX_MAX)
    name, value = ("num_states", num_states) if S * S > _validate.INDEX_MAX else ("num_agents", num_agents)
    _validate.table_size(name, value, N * S * S, "num_agents x num_states^2 (the transition tables)")
    return N, S


def garnet(
    key,
    num_agents: int = 10,
    heterogeneity="heterogeneous",
    num_states: int = 30,
    num_actions: int = 2,
    branching: int = GARNET_BRANCHING,
    dim: int = 8,
    gamma: float = 0.95,
    perturbation: float = 0.02,
    sampling: str = "generative",
    dtype=None,
    max_tries: int = 1000,
) -> FederatedTD:
    """Federated Garnet policy-evaluation problem.

    Two base Garnet kernels ``P_0, P_1`` (each (s, a) reaches ``branching`` states
    with U(0,1) weights), a random policy ``pi(a|s)`` (normalised U(0,1) weights,
    shared), base rewards ``r ~ U(0,1)^S`` and features ``Phi`` with U(0,1)
    entries, each row divided by its sum. With heterogeneity level ``h``:

        P_c(s'|s,a) ∝ (1-h) P_0 + h P_{c mod 2} + U(0, perturbation) on its nonzero entries,
        r_c = (1 - 2h [c odd]) r + U(0, perturbation).

    ``h = 0`` ("homogeneous") is one base kernel with small per-agent
    perturbations; ``h = 1`` ("heterogeneous") gives even agents ``P_0, +r`` and
    odd agents ``P_1, -r``, as in the SCAFFLSA experiments. Base kernels are
    redrawn until the chain under ``pi`` is irreducible and aperiodic.

    Args:
      key: JAX PRNG key.
      heterogeneity: ``"homogeneous"``, ``"heterogeneous"`` or a level in ``[0, 1]``.
      sampling: ``"generative"`` or ``"markov"``.

    Every integer argument is in ``[1, 2^31 - 1]``, with ``branching, dim <= num_states`` and
    ``num_agents num_states^2 <= 2^31 - 1`` (the flat transition tables are indexed with int32).
    """
    N, S = _sizes(num_agents, num_states)
    if isinstance(heterogeneity, str):
        _validate.choice("heterogeneity", heterogeneity, tuple(HETEROGENEITY_MODES))
        h = HETEROGENEITY_MODES[heterogeneity]
    else:
        h = _validate.real("heterogeneity", heterogeneity, 0.0, 1.0)
    A = _validate.integer("num_actions", num_actions, maximum=_validate.INDEX_MAX)
    _validate.table_size(
        "num_actions", num_actions, S * S * A, "num_states^2 x num_actions (the Garnet kernels)"
    )
    B = _validate.integer("branching", branching, maximum=_validate.INDEX_MAX)
    if B > S:  # named after branching if it was changed, else after num_states (the one given, most likely)
        name, value = ("num_states", num_states) if B == GARNET_BRANCHING else ("branching", branching)
        _validate.fail(
            name,
            value,
            f"expected branching <= num_states, got branching={B} > num_states={S} "
            "(each state-action pair moves to branching distinct states)",
        )
    d = _validate.integer("dim", dim, maximum=_validate.INDEX_MAX)
    if d > S:
        _validate.fail("dim", dim, f"expected dim <= num_states={S} (features must have full column rank)")
    _validate.real("gamma", gamma, 0.0, 1.0, high_open=True)
    eps = _validate.real("perturbation", perturbation, 0.0)
    _validate.choice("sampling", sampling, SAMPLING_MODES)
    max_tries = _validate.integer("max_tries", max_tries, maximum=_validate.INDEX_MAX)
    rng = _validate.rng_from_key(key)

    policy = rng.uniform(size=(S, A))
    policy /= policy.sum(1, keepdims=True)
    bases = []
    for _ in range(2):
        for _ in range(max_tries):
            K = _garnet_kernel(rng, S, A, B)
            if is_primitive(np.einsum("sa,sat->st", policy, K)):
                bases.append(K)
                break
        else:
            _validate.fail(
                "branching", branching, f"no irreducible aperiodic Garnet chain in {max_tries} draws"
            )
    r = rng.uniform(size=S)
    Phi = rng.uniform(size=(S, d))
    Phi /= Phi.sum(1, keepdims=True)

    P = np.empty((N, S, S))
    R = np.empty((N, S))
    for c in range(N):
        K = (1 - h) * bases[0] + h * bases[c % 2]
        K = K + (K > 0) * rng.uniform(0.0, eps, size=K.shape)
        K /= K.sum(-1, keepdims=True)
        P[c] = np.einsum("sa,sat->st", policy, K)
        R[c] = (1.0 - 2.0 * h * (c % 2)) * r + rng.uniform(0.0, eps, size=S)
    return federated_td(P, R, Phi, gamma, sampling=sampling, dtype=dtype)


def qfedtd_mdp(
    key,
    num_agents: int = 1,
    num_states: int = 20,
    dim: int = 10,
    gamma: float = 0.5,
    sampling: str = "markov",
    dtype=None,
) -> FederatedTD:
    """The QFedTD experiments' MDP: shared by all agents, dense random row-stochastic
    ``P``, rewards ``U(0,1)``, features with orthonormal columns (QR of a Gaussian). Integer
    arguments as for :func:`garnet`: in ``[1, 2^31 - 1]``, ``num_agents num_states^2 <= 2^31 - 1``."""
    N, S = _sizes(num_agents, num_states)
    d = _validate.integer("dim", dim, maximum=_validate.INDEX_MAX)
    if d > S:
        _validate.fail("dim", dim, f"expected dim <= num_states={S} (orthonormal columns)")
    _validate.real("gamma", gamma, 0.0, 1.0, high_open=True)
    _validate.choice("sampling", sampling, SAMPLING_MODES)
    rng = _validate.rng_from_key(key)
    P = rng.uniform(size=(S, S))
    P /= P.sum(1, keepdims=True)
    r = rng.uniform(size=S)
    Phi, _ = np.linalg.qr(rng.standard_normal((S, d)))
    return federated_td(np.broadcast_to(P, (N, S, S)), r, Phi, gamma, sampling=sampling, dtype=dtype)


def _garnet_from_options(key, args):
    het = args.heterogeneity
    return garnet(
        key,
        num_agents=args.agents,
        heterogeneity=het,
        num_states=args.states or 30,
        dim=args.dim or 8,
        sampling=args.sampling or "generative",
        dtype=args.dtype,
    )


def _qfedtd_mdp_from_options(key, args):
    return qfedtd_mdp(
        key,
        num_agents=args.agents,
        num_states=args.states or 20,
        dim=args.dim or 10,
        sampling=args.sampling or "markov",
        dtype=args.dtype,
    )


registry.register_problem(
    "garnet",
    _garnet_from_options,
    options=(registry.HETEROGENEITY, registry.STATES, registry.SAMPLING),
    note="Garnet MRPs (SCAFFLSA experiments)",
    order=0,
)
registry.register_problem(
    "qfedtd-mdp",
    _qfedtd_mdp_from_options,
    options=(registry.STATES, registry.SAMPLING),
    note="the QFedTD experiments' 20-state MDP",
    order=2,
)
