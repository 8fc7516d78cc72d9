"""Speed of the exact theory on the papers' configurations: long exact_mse curves and stationary_mse.

* ``exact_mse`` over T rounds (default 3000) with a constant step: the automatic path (the assembled
  operator of the persistent coordinates where it is cheaper, else round by round, on the factored
  agents' blocks where they outnumber the globals) against the full recursion (every round on the
  whole augmented state), with their largest relative difference.
* ``stationary_mse``: GMRES with one round per product (and its stability certificate) against the
  former dense path (the operator assembled with one round per unknown, its eigenvalues for the
  stability check, a dense solve), with their relative difference.

Configurations: the SCAFFLSA paper's federated TD on Garnet (30 states, 2 actions, d=8,
gamma=0.95, generative sampling, eta=0.1, H=10; Mangold et al., NeurIPS 2024, Sec. 6), N=10,
homogeneous and heterogeneous, FedLSA and SCAFFLSA; the QFedTD paper's MDP (Dal Fabbro, Mitra,
Pappas, L-CSS 2023; 20 states, d=10, gamma=0.5, alpha=0.6) with N=40 agents, generative sampling
and an exact-theory channel (rand-2 of 10 coordinates, success probability 0.6).

* ``exact_mse`` at N=100 (the SCAFFLSA paper's heterogeneous Garnet): FedLSA and SCAFFLSA with the
  constant step, the decreasing step ``0.5 / (1 + k / 800)`` and Polyak-Ruppert averaging (burn-in
  T/10), the automatic path (the factored recursion; for FedLSA's constant step the assembled
  operator) against the full recursion timed over ``--full-rounds`` rounds and scaled to T;
  Scaffnew (p = 0.2) per round; ``stationary_mse`` of FedLSA and SCAFFLSA (GMRES on factored rounds).

* ``exact_mean`` (``--mean-only`` runs only these rows) at T=1000 rounds, H=100 local steps, N=10 on
  the command line's default Garnet (30 states, 2 actions, d=8, generative sampling), eta=0.05:
  FedLSA, SCAFFLSA, Scaffnew (p=0.1) and QFedTD (alpha=0.6, rand-2, success probability 0.6, one
  step a round), the round's
  mean map formed once and reused, against the same recursion applied phase by phase every round
  and, for FedLSA, against a numpy loop of the d-dimensional mean recursion itself
  (``theta <- theta - eta (A_bar[c] theta - b_bar[c])``, H steps per agent, then the average).

    python benchmarks/theory_speed.py [--rounds 3000] [--skip-dense] [--full-rounds 20] [--json out.json]
    python benchmarks/theory_speed.py --mean-only

Run it with one BLAS thread (``OPENBLAS_NUM_THREADS=1``) for stable timings on a shared machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from _bench import write_json

import fedsa_jax as fj
from fedsa_jax.theory import _agents, _operator, engine, stationary


def configurations():
    """``name -> (problem, algorithm)``."""
    out = {}
    for het in ("homogeneous", "heterogeneous"):
        P = fj.problems.garnet(jax.random.key(0), num_agents=10, heterogeneity=het)
        for make in (fj.fedlsa, fj.scafflsa):
            out[f"garnet_{het}_N10_{make.__name__}"] = (P, make(0.1, 10))
    q = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=40, sampling="generative")
    out["qfedtd_mdp_N40_randk2_p0.6"] = (q, fj.qfedtd(0.6, fj.channel.rand_k(2), success_prob=0.6))
    return out


def many_agents(T):
    """``name -> (problem, algorithm)`` at N=100 (the factored recursion)."""
    P = fj.problems.garnet(jax.random.key(0), num_agents=100, heterogeneity="heterogeneous")
    decreasing = fj.schedule(fj.optim.inverse_time, eta0=0.5, k0=800.0)
    out = {}
    for make in (fj.fedlsa, fj.scafflsa):
        name = f"garnet_heterogeneous_N100_{make.__name__}"
        out[f"{name}_constant"] = (P, make(0.1, 10))
        out[f"{name}_decreasing"] = (P, make(decreasing, 10))
        out[f"{name}_averaged"] = (P, fj.averaged(make(0.1, 10), burn_in=T // 10))
    return out


def scaffnew_many_agents():
    """Scaffnew at N=100 (p = 0.2, H = 10): every local step ends on a coin, and the agents' own
    iterates persist: the factored recursion timed over a few rounds."""
    P = fj.problems.garnet(jax.random.key(0), num_agents=100, heterogeneity="heterogeneous")
    return P, fj.scaffnew(0.1, 0.2, 10)


def full_mse(problem, alg, T):
    """The full recursion (no factored agents, no assembled operator)."""
    saved = _operator.CURVE_RATIO, _agents.FACTORED_RATIO
    _operator.CURVE_RATIO, _agents.FACTORED_RATIO = 10**9, 10**9
    try:
        return fj.theory.exact_mse(problem, alg, T)
    finally:
        _operator.CURVE_RATIO, _agents.FACTORED_RATIO = saved


def timed(fn):
    t = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t


def dense_stationary_mse(problem, alg):
    """The former path: assemble the operator, check its spectral radius, solve densely."""
    st = stationary._setup(problem, alg, "stationary_mse")
    op = stationary._operator(st, alg.name, "MAX_ASSEMBLED_UNKNOWNS")
    M, _ = op.assemble()
    radius = float(np.max(np.abs(np.linalg.eigvals(M))))
    assert radius < 1, radius
    S = op.second_moment(np.linalg.solve(np.eye(len(M)) - M, op.constant))
    scored = st.rec.state["theta"]
    return float(np.trace(S[scored, scored]))


def mean_configurations():
    """``name -> (problem, algorithm)`` of the exact_mean rows (T=1000, H=100, N=10)."""
    P = fj.problems.garnet(jax.random.key(0), num_agents=10)
    return P, {
        "fedlsa": fj.fedlsa(0.05, 100),
        "scafflsa": fj.scafflsa(0.05, 100),
        "scaffnew": fj.scaffnew(0.05, 0.1, 100),
        "qfedtd_randk2_p0.6": fj.qfedtd(0.6, fj.channel.rand_k(2), success_prob=0.6),  # one step a round
    }


def phase_by_phase_mean(problem, alg, T):
    """exact_mean with every round applied phase by phase (no round map formed)."""

    def every_phase(rec, cache_size=0):
        def advance(m, t, etas):
            for phase in engine._phases(rec, t, etas):
                m = phase.mean() @ m
            return m

        return advance

    saved = engine._mean_rounds
    engine._mean_rounds = every_phase
    try:
        return fj.theory.exact_mean(problem, alg, T)
    finally:
        engine._mean_rounds = saved


def numpy_fedlsa_mean(problem, eta, H, T):
    """The d-dimensional mean recursion of FedLSA, a numpy loop (the cost of the mean itself)."""
    A, b = (np.asarray(x, np.float64) for x in (problem.A_bar, problem.b_bar))
    theta = np.zeros(A.shape[-1])
    out = [theta]
    for _ in range(T):
        local = np.repeat(theta[None], len(A), axis=0)
        for _ in range(H):
            local = local - eta * (np.einsum("cij,cj->ci", A, local) - b)
        theta = local.mean(0)
        out.append(theta)
    return np.asarray(out)


def mean_rows(T=1000):
    problem, algorithms = mean_configurations()
    report = {}
    for name, alg in algorithms.items():
        fast, t_fast = timed(lambda: fj.theory.exact_mean(problem, alg, T))
        slow, t_slow = timed(lambda: phase_by_phase_mean(problem, alg, T))
        rel = float(np.max(np.abs(fast - slow)) / np.max(np.abs(slow)))
        row = {"s": t_fast, "phase_by_phase_s": t_slow, "rel": rel}
        text = ""
        if name == "fedlsa":
            loop, t_loop = timed(lambda: numpy_fedlsa_mean(problem, 0.05, 100, T))
            row.update(
                numpy_loop_s=t_loop, numpy_rel=float(np.max(np.abs(fast - loop)) / np.max(np.abs(loop)))
            )
            text = f"  numpy mean loop {t_loop:6.2f} s (rel diff {row['numpy_rel']:.1e})"
        report[name] = row
        print(
            f"exact_mean T={T} H=100 N=10 {name:20s} {t_fast:6.2f} s  phase by phase {t_slow:6.2f} s  "
            f"rel diff {rel:.1e}{text}",
            flush=True,
        )
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--skip-dense", action="store_true", help="skip the former dense stationary path")
    ap.add_argument("--full-rounds", type=int, default=20, help="rounds of the full recursion at N=100")
    ap.add_argument("--json", default=None)
    ap.add_argument("--mean-only", action="store_true", help="only the exact_mean rows (T=1000, H=100, N=10)")
    args = ap.parse_args(argv)
    if args.mean_only:
        return write_json(args.json, {"exact_mean": mean_rows()})
    T = args.rounds
    report = {
        "rounds": T,
        "exact_mse": {},
        "stationary_mse": {},
        "many_agents": {},
        "exact_mean": mean_rows(),
    }
    F = args.full_rounds
    for name, (problem, alg) in many_agents(T).items():
        fast, t_fast = timed(lambda: fj.theory.exact_mse(problem, alg, T))
        full, t_full = timed(lambda: full_mse(problem, alg, F))
        rel = float(np.max(np.abs(fast[: F + 1] - full)) / np.max(np.abs(full)))
        row = {"auto_s": t_fast, "full_s_per_round": t_full / F, "full_s_scaled": t_full * T / F, "rel": rel}
        report["many_agents"][name] = row
        print(
            f"exact_mse T={T} {name:46s} auto {t_fast:8.2f} s  full {t_full / F:.3f} s a round "
            f"(x{t_full * T / F / t_fast:6.1f} at T)  rel diff {rel:.1e} over {F} rounds",
            flush=True,
        )
    problem, alg = scaffnew_many_agents()
    fast, t_fast = timed(lambda: fj.theory.exact_mse(problem, alg, F))
    full, t_full = timed(lambda: full_mse(problem, alg, F))
    rel = float(np.max(np.abs(fast - full)) / np.max(np.abs(full)))
    report["many_agents"]["garnet_heterogeneous_N100_scaffnew"] = {
        "factored_s_per_round": t_fast / F,
        "full_s_per_round": t_full / F,
        "rel": rel,
    }
    print(
        f"exact_mse {F} rounds garnet_heterogeneous_N100_scaffnew: factored {t_fast / F:.3f} s a round, "
        f"full {t_full / F:.3f} s a round, rel diff {rel:.1e}",
        flush=True,
    )
    problem = fj.problems.garnet(jax.random.key(0), num_agents=100, heterogeneity="heterogeneous")
    for make in (fj.fedlsa, fj.scafflsa):
        value, t_new = timed(lambda: fj.theory.stationary_mse(problem, make(0.1, 10)))
        name = f"garnet_heterogeneous_N100_{make.__name__}"
        report["stationary_mse"][name] = {"s": t_new, "value": value}
        print(f"stationary_mse {name}: {value:.6g} in {t_new:.2f} s", flush=True)
    for name, (problem, alg) in configurations().items():
        fast, t_fast = timed(lambda: fj.theory.exact_mse(problem, alg, T))
        slow, t_slow = timed(lambda: full_mse(problem, alg, T))
        rel = float(np.max(np.abs(fast - slow) / np.abs(slow)))
        report["exact_mse"][name] = {"auto_s": t_fast, "full_s": t_slow, "max_rel_diff": rel}
        print(
            f"exact_mse T={T} {name:38s} auto {t_fast:8.2f} s  full {t_slow:8.2f} s  "
            f"x{t_slow / t_fast:6.1f}  rel diff {rel:.1e}",
            flush=True,
        )
        value, t_new = timed(lambda: fj.theory.stationary_mse(problem, alg))
        row = {"gmres_s": t_new, "value": value, "exact_mse_T": float(fast[-1])}
        if not args.skip_dense:
            dense, t_dense = timed(lambda: dense_stationary_mse(problem, alg))
            row.update(dense_s=t_dense, rel_diff=abs(value - dense) / dense)
        report["stationary_mse"][name] = row
        dense_text = ""
        if "dense_s" in row:
            dense_text = f"dense {row['dense_s']:8.2f} s  rel diff {row['rel_diff']:.1e}"
        print(f"stationary_mse {name:38s} gmres {t_new:8.2f} s  {dense_text}", flush=True)
    return write_json(args.json, report)


if __name__ == "__main__":
    main()
