"""Throughput of federated TD(0) FedLSA: fedsa_jax vs numpy vs drawing the random numbers.

Measures agent-local-steps per second (seeds x rounds x agents x H observations
processed) for FedLSA on a generative federated TD problem (Garnet MRPs,
N=10 agents, S=20 states, d=10, H=10, 100 rounds, 1000 seeds by default), side
by side in one run:

  jax      fj.simulate (one jitted kernel; compile time reported separately)
  numpy    the same algorithm in numpy, vectorised over seeds and agents:
           "plain": inverse-CDF sampling (compare the uniform with the CDF row,
           O(S) per draw) and uniforms drawn per local step, as such loops are
           usually written; "alias": O(1) alias sampling of s then s' and one
           block of uniforms per round (a tuned baseline); "pair tables": the
           kernel's own sampler (one alias draw of the pair (s, s') from one
           32-bit word, one [phi(s) | psi] row per step, error coordinates)
  unif     only drawing random numbers: two uniforms per observation with
           ``jax.random.uniform`` as one flat array (what a sampler of s then s'
           consumes), and the kernel's own block (fused threefry, one block per
           seed and round from fold_in keys: one 32-bit word per observation with
           pair tables); both sharded over the kernel's devices

Every timing is the best of ``--repeats`` runs after one warm-up call. JAX runs on one
CPU device per core (``fj.use_cpu_cores``; ``--cpu-devices 1``: JAX's single device).

    python benchmarks/throughput.py [--seeds 1000] [--json out.json] [--cpu-devices N]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from _bench import add_cpu_devices_option, best_of, use_cpu_devices, write_json

import fedsa_jax as fj
from fedsa_jax._runtime.kernel import seed_keys


def numpy_fedlsa_td(problem, step_size, H, T, n, rng, dtype):
    """FedLSA TD(0), numpy, vectorised over seeds and agents (alias sampling, block draws); ``H`` an
    integer or a sequence ``H_t`` (round t runs ``H[t]`` local steps)."""
    N, S, d = problem.num_agents, problem.num_states, problem.dim
    mu_p, mu_a = np.asarray(problem.mu_prob), np.asarray(problem.mu_alias)
    P_p, P_a = np.asarray(problem.P_prob), np.asarray(problem.P_alias)
    rew = np.asarray(problem.rewards).reshape(-1)
    Phi = np.asarray(problem.features)
    gamma = dtype(problem.gamma)
    eta = dtype(step_size)
    cS = (np.arange(N, dtype=np.int32) * S)[None, :, None]

    def alias(prob, al, offset, u):
        x = u * S
        i = np.minimum(x.astype(np.int32), S - 1)
        j = offset + i
        return np.where(x - i < prob[j], i, al[j])

    theta = np.zeros((n, d), dtype)
    for t in range(T):
        Ht = H if np.ndim(H) == 0 else int(H[t])
        u = rng.random((n, N, 2, Ht), dtype=dtype)
        s = alias(mu_p, mu_a, cS, u[:, :, 0])
        s2 = alias(P_p, P_a, (cS + s) * S, u[:, :, 1])
        r = rew[cS + s]
        th = np.broadcast_to(theta[:, None, :], (n, N, d)).copy()
        for h in range(Ht):
            phi = Phi[s[:, :, h]]
            psi = phi - gamma * Phi[s2[:, :, h]]
            dot = np.einsum("ijk,ijk->ij", psi, th)
            th -= eta * (dot - r[:, :, h])[..., None] * phi
        theta = th.mean(axis=1)
    return theta


def numpy_fedlsa_td_pairs(problem, step_size, H, T, n, rng, dtype):
    """FedLSA TD(0), numpy, vectorised over seeds and agents, with the kernel's pair sampler: one
    32-bit word per step, one alias table over (s, s') per agent, one [phi | psi] row per step."""
    N, S, d = problem.num_agents, problem.num_states, problem.dim
    K = S * S
    thr = np.asarray(problem.pair_threshold).astype(np.uint64)
    al = np.asarray(problem.pair_alias)
    rows = np.asarray(problem.pair_rows)
    const = np.asarray(problem.pair_const)  # v(s) - gamma v(s') - r_c(s): error coordinates
    eta = dtype(step_size)
    cK = (np.arange(N, dtype=np.int64) * K)[None, :, None]
    error = np.broadcast_to(-np.asarray(problem.theta_star), (n, d)).astype(dtype)  # theta0 = 0
    for _ in range(T):
        w = rng.integers(0, 2**32, (n, N, H), dtype=np.uint64) * np.uint64(K)
        i = (w >> np.uint64(32)).astype(np.int64)
        j = cK + i
        pair = np.where((w & np.uint64(0xFFFFFFFF)) < thr[j], i, al[j])
        row = rows[pair]  # (n, N, H, 2d)
        c = const[cK + pair]
        e = np.broadcast_to(error[:, None, :], (n, N, d)).copy()
        for h in range(H):
            r = row[:, :, h]
            dot = np.einsum("ijk,ijk->ij", r[..., d:], e)
            e -= eta * (dot + c[:, :, h])[..., None] * r[..., :d]
        error = e.mean(axis=1)
    return error


def numpy_fedlsa_td_plain(problem, step_size, H, T, n, rng, dtype):
    """FedLSA TD(0), numpy, vectorised over seeds and agents, inverse-CDF sampling per step."""
    N, S, d = problem.num_agents, problem.num_states, problem.dim
    cdf_mu = np.cumsum(np.asarray(problem.stationary), -1).astype(dtype)  # (N, S)
    cdf_P = np.cumsum(np.asarray(problem.transitions), -1).astype(dtype)  # (N, S, S)
    R = np.asarray(problem.rewards)
    Phi = np.asarray(problem.features)
    gamma = dtype(problem.gamma)
    eta = dtype(step_size)
    agents = np.arange(N)[None, :]
    theta = np.zeros((n, d), dtype)
    for _ in range(T):
        th = np.broadcast_to(theta[:, None, :], (n, N, d)).copy()
        for _ in range(H):
            u = rng.random((n, N, 2), dtype=dtype)
            s = np.minimum((u[..., 0, None] > cdf_mu[None]).sum(-1), S - 1)
            s2 = np.minimum((u[..., 1, None] > cdf_P[agents, s]).sum(-1), S - 1)
            phi = Phi[s]
            psi = phi - gamma * Phi[s2]
            td = R[agents, s] - np.einsum("ijk,ijk->ij", psi, th)
            th += eta * td[..., None] * phi
        theta = th.mean(axis=1)
    return theta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--states", type=int, default=20)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--step-size", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument(
        "--no-numpy", action="store_true", help="skip the numpy baselines (e.g. at 1e5 seeds on a GPU)"
    )
    add_cpu_devices_option(ap)
    args = ap.parse_args(argv)
    devices = use_cpu_devices(args.cpu_devices)  # before any JAX computation
    n, N, H, T = args.seeds, args.agents, args.local_steps, args.rounds
    problem = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=args.states, dim=args.dim)
    alg = fj.fedlsa(args.step_size, H)
    steps = n * T * N * H
    key = jax.random.key(1)

    run = lambda: fj.simulate(key, problem, alg, T, n, record_every=T)  # noqa: E731
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    t_jax = best_of(run, args.repeats)

    dtype = np.dtype(problem.dtype).type
    rng = np.random.default_rng(0)
    t_np = t_plain = t_pair = float("nan")
    if not args.no_numpy:
        np_run = lambda: numpy_fedlsa_td(problem, args.step_size, H, T, n, rng, dtype)  # noqa: E731
        np_run()
        t_np = best_of(np_run, max(1, args.repeats // 2))
        pair_run = lambda: numpy_fedlsa_td_pairs(problem, args.step_size, H, T, n, rng, dtype)  # noqa: E731
        pair_run()
        t_pair = best_of(pair_run, max(1, args.repeats // 2))
        plain_run = lambda: numpy_fedlsa_td_plain(problem, args.step_size, H, T, n, rng, dtype)  # noqa: E731
        plain_run()
        t_plain = best_of(plain_run, max(1, args.repeats // 2))

    # The draw-only rows run sharded over the same devices as the kernel (a seed axis, a flat axis).
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("seeds",))
    spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds"))
    flat_len = -(-2 * steps // jax.device_count()) * jax.device_count()
    flat = jax.jit(
        lambda k: jnp.sum(
            jax.lax.with_sharding_constraint(jax.random.uniform(k, (flat_len,), problem.dtype), spread)
        )
    )
    flat(key).block_until_ready()
    t_flat = best_of(lambda: flat(key).block_until_ready(), args.repeats)

    padded = -(-n // jax.device_count()) * jax.device_count()
    round_keys = jax.device_put(jax.random.key_data(seed_keys(key, padded)[1]), spread)

    @jax.jit
    def kernel_draw(kd):
        rk = jax.random.wrap_key_data(kd)

        def body(acc, t):
            ks = jax.vmap(jax.random.fold_in, in_axes=(0, None))(rk, t)
            u = jax.vmap(lambda kk: problem.randomness(kk, N, H))(ks)
            return acc + jnp.sum(u, axis=tuple(range(1, u.ndim))).astype(problem.dtype), None

        acc = jax.lax.with_sharding_constraint(jnp.zeros((padded,), problem.dtype), spread)
        return jax.lax.scan(body, acc, jnp.arange(T, dtype=jnp.uint32))[0]

    kernel_draw(round_keys).block_until_ready()
    t_draw = best_of(lambda: kernel_draw(round_keys).block_until_ready(), args.repeats)

    out = {
        "config": {
            "seeds": n,
            "agents": N,
            "states": args.states,
            "dim": args.dim,
            "local_steps": H,
            "rounds": T,
            "dtype": str(np.dtype(problem.dtype)),
        },
        "machine": {
            "platform": jax.default_backend(),
            "cpu_count": os.cpu_count(),
            "device_count": jax.device_count(),
            "processor": platform.processor() or platform.machine(),
            "jax": jax.__version__,
        },
        "agent_steps": steps,
        "seconds": {
            "jax": t_jax,
            "jax_first_call_incl_compile": first,
            "numpy_plain": t_plain,
            "numpy_alias": t_np,
            "numpy_pairs": t_pair,
            "jax_random_uniform": t_flat,
            "kernel_draw_only": t_draw,
        },
        "agent_steps_per_s": {
            "jax": steps / t_jax,
            "numpy_plain": steps / t_plain,
            "numpy_alias": steps / t_np,
            "numpy_pairs": steps / t_pair,
        },
        "ratios": {
            "numpy_plain_over_jax": t_plain / t_jax,
            "numpy_alias_over_jax": t_np / t_jax,
            "numpy_pairs_over_jax": t_pair / t_jax,
            "jax_over_jax_random_uniform": t_jax / t_flat,
            "jax_over_kernel_draw": t_jax / t_draw,
        },
    }
    print(
        f"federated TD(0) FedLSA: N={N} S={args.states} d={args.dim} H={H} T={T} seeds={n} "
        f"({steps:.3g} agent-steps, {out['config']['dtype']}, {jax.default_backend()}, "
        f"{os.cpu_count()} cores, {devices})"
    )
    print(
        f"  jax                          {t_jax:8.3f} s   {steps / t_jax:10.3g} steps/s   "
        f"(first call incl. compile {first:.2f} s)"
    )
    print(
        f"  numpy, plain (inverse CDF)   {t_plain:8.3f} s   {steps / t_plain:10.3g} steps/s   "
        f"numpy/jax = {t_plain / t_jax:.2f}x"
    )
    print(
        f"  numpy, alias (tuned)         {t_np:8.3f} s   {steps / t_np:10.3g} steps/s   "
        f"numpy/jax = {t_np / t_jax:.2f}x"
    )
    print(
        f"  numpy, pair tables (kernel's) {t_pair:8.3f} s   {steps / t_pair:10.3g} steps/s   "
        f"numpy/jax = {t_pair / t_jax:.2f}x"
    )
    print(f"  uniforms only, jax.random.uniform  {t_flat:8.3f} s   jax/draw = {t_jax / t_flat:.2f}x")
    print(f"  uniforms only, the kernel's draw   {t_draw:8.3f} s   jax/draw = {t_jax / t_draw:.2f}x")
    return write_json(args.json, out)


if __name__ == "__main__":
    main()
