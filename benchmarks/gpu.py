"""The GPU run: fedsa_jax's speed on the JAX already installed, from the source tree, offline.

    PYTHONPATH=. python benchmarks/gpu.py OUT                       # on a GPU machine: about 6 min
    JAX_PLATFORMS=cpu PYTHONPATH=. python benchmarks/gpu.py OUT --platform cpu --small   # a smoke run

Installs nothing: it runs the package from the tree it sits in with the JAX it finds. With
``--platform gpu`` (the default) it refuses, in one line and before measuring anything, a JAX
without a GPU backend. It writes every figure to ``OUT/gpu.json`` (rewritten atomically after each
section, so a run cut short keeps what it measured) and prints one line per figure:

  devices      JAX and jaxlib versions, the backend, each device and its memory
  td_fedlsa    federated TD(0) FedLSA (Garnet, N=10, S=20, d=10, H=10, float32) at 1e4, 1e5 and
               1e6 seeds: agent-steps/s of warm calls, the first call's time (compile), peak memory
  fused        the fused local-step kernel (fj.Execution(fused_local_steps=True), Pallas on Triton)
               beside the compiled scan, in the same run: TD FedLSA at 1e4, 1e5 and 1e6 seeds, TD
               SCAFFLSA and Gaussian FedLSA at 1e5; agent-steps/s, compile time, the traffic and
               flops a step needs at least (the model below) at that rate, and the fraction of
               --peak-tflops; at 1e6 seeds also the kernel's other layout (rows, untransposed); a
               kernel that fails to compile is recorded with its error; and the kernels of one fused
               round (the Pallas call and the layout copies XLA adds around it)
  local_step   kernels per local step of the TD and Gaussian kernels in the backend's optimised HLO
               (``benchmarks/_hlo.py``), the loop's carried shapes, host transfers (must be none)
  unroll       the local-step scan unrolled 1, 2, 5 and 10 times, TD and Gaussian FedLSA at 1e5 seeds
  paths        the four paths of ``benchmarks/kernel_paths.py`` at 1e5 seeds
  scafflsa     FedLSA, SCAFFLSA and QFedTD at the SCAFFLSA paper's Figure-1 size (Garnet, 30 states,
               2 actions, d=8, N=100, H=10, heterogeneous) at 1e4 seeds
  theory       exact_mse of SCAFFLSA at N=100 (the same Garnet, float64), 300 rounds
  bootstrap    fj.bootstrap(FedLSA, B=100) against (1 + B) times the seeds of plain FedLSA

Sections not begun after ``--budget-s`` seconds (default 360) are skipped, and say so in the file.
``--small`` shrinks every size (seeds, rounds, agents) for a smoke run on a CPU, with one figure per
loop of a section (one seed count, one unroll factor, one path...): the test suite runs it, so the
script cannot rot.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _hlo  # noqa: E402
from kernel_paths import cases, fused_settings, measure  # noqa: E402

import fedsa_jax as fj  # noqa: E402
from fedsa_jax._io import atomic_write  # noqa: E402
from fedsa_jax.problems.protocol import local_unroll  # noqa: E402

GIB = 2**30


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for gpu.json")
    ap.add_argument("--platform", choices=("gpu", "cpu"), default="gpu", help="the backend asked for")
    ap.add_argument("--small", action="store_true", help="tiny sizes: a smoke run on a CPU")
    ap.add_argument("--repeats", type=int, default=3, help="warm calls per figure (the best is kept)")
    ap.add_argument(
        "--budget-s", type=float, default=360.0, help="sections not begun by then are skipped (recorded)"
    )
    ap.add_argument(
        "--peak-tflops", type=float, default=67.0, help="the device's float32 peak (H100/H200 SXM: 67)"
    )
    return ap.parse_args(argv)


def check_platform(wanted: str) -> str:
    """The backend's name, or ``SystemExit`` with one line when it is not the one asked for."""
    try:
        backend = jax.default_backend()
    except RuntimeError as e:  # a JAX whose plugin fails to start
        raise SystemExit(f"gpu.py: platform={wanted!r} asked for, but JAX found no backend ({e})") from None
    if wanted == "gpu" and backend not in ("gpu", "cuda", "rocm"):
        raise SystemExit(
            f"gpu.py: platform='gpu' asked for, but JAX {jax.__version__} runs on {backend!r} "
            f"({', '.join(str(d) for d in jax.devices())}): install a CUDA plugin or pass --platform cpu"
        )
    return backend


def peak_bytes() -> int | None:
    """Peak device memory in use so far on device 0 (None where the backend does not tell)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else int(stats.get("peak_bytes_in_use", 0))


class Report:
    """``OUT/gpu.json``, rewritten after each section."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.path, self.data = out / "gpu.json", {}

    def __setitem__(self, section, value):
        self.data[section] = value
        text = json.dumps(self.data, indent=2, default=float)
        atomic_write(self.path, lambda f: f.write(text), mode="w")


def devices_section(backend):
    import jaxlib

    devs = []
    for d in jax.devices():
        stats = d.memory_stats() or {}
        devs.append({"device": str(d), "kind": d.device_kind, "bytes_limit": stats.get("bytes_limit")})
    info = {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": backend,
        "devices": devs,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "default_local_unroll": local_unroll(10**6),
    }
    print(f"JAX {jax.__version__}, backend {backend}: " + ", ".join(f"{d['kind']}" for d in devs))
    return info


def throughput(problem, alg, rounds, seeds, per_round, repeats, unroll=None, fused=None):
    """One figure: agent-steps/s of warm calls, the first call, the peak memory so far."""
    execution = fj.Execution(
        seed_batch_size=seeds,
        memory_budget=64 * GIB,
        chunk_rounds=rounds,
        progress=False,
        local_unroll=unroll,
        fused_local_steps=fused,
    )
    first, best = measure(problem, alg, rounds, seeds, repeats=repeats, execution=execution)
    steps = seeds * rounds * per_round
    return {
        "seeds": seeds,
        "rounds": rounds,
        "agent_steps": steps,
        "warm_s": best,
        "first_call_s": first,
        "compile_s": max(0.0, first - best),
        "agent_steps_per_s": steps / best,
        "peak_bytes": peak_bytes(),
    }


def line(name, row):
    mem = "" if row.get("peak_bytes") is None else f", peak {row['peak_bytes'] / GIB:.2f} GiB"
    print(
        f"{name:34s} {row['agent_steps_per_s']:.3g} agent-steps/s ({row['seeds']} seeds, "
        f"{row['warm_s']:.3g} s warm, first call {row['first_call_s']:.3g} s{mem})"
    )


def fused_section(args, td, g, sizes, wide, N, H, rounds):
    """The scan and the fused kernel side by side. The least a local step needs (float32, per
    agent-step): TD reads its observation's pair index once (4 bytes; the scan's carry of the
    next round's random words writes and reads 8 more) and 3d flops pairs (the dot, the update);
    Gaussian reads d normals (4d bytes) and d^2 + 4d multiply-adds; each row's start, control and
    end (3d words) are spread over its H steps."""
    d = 10
    model = {
        "TD": (4 + 3 * d * 4 / H, 2 * 3 * d),
        "Gaussian": (4 * d + 3 * d * 4 / H, 2 * (d * d + 4 * d)),
    }
    plan = [("TD FedLSA", td, fj.fedlsa(0.1, H), n) for n in sizes]
    plan += (
        []
        if args.small
        else [  # the smoke run: one pair
            ("TD SCAFFLSA", td, fj.scafflsa(0.1, H), wide),
            ("Gaussian FedLSA", g, fj.fedlsa(0.05, H), wide),
        ]
    )
    out = []
    # the kernel's other layout of the per-row arrays (fused.LAYOUT: by row, no transposition), at
    # the largest size
    paths = {"scan": (False, None), "fused": (True, None), "fused, rows layout": (True, "rows")}
    for name, p, a, n in plan:
        bytes_per_step, flops_per_step = model[name.split()[0]]
        chosen = paths if (name, n) == ("TD FedLSA", sizes[-1]) else {k: paths[k] for k in ("scan", "fused")}
        for path, (flag, layout) in chosen.items():
            try:
                with fused_settings(layout=layout):
                    row = throughput(p, a, rounds, n, N * H, args.repeats, fused=flag)
            except Exception as e:  # a kernel the GPU's compiler refuses: recorded, the run goes on
                out.append(
                    {"name": name, "path": path, "seeds": n, "error": f"{type(e).__name__}: {e}"[:2000]}
                )
                print(f"{name}, {path}, {n} seeds: {out[-1]['error'][:300]}")
                continue
            rate = row["agent_steps_per_s"]
            row.update(
                name=name,
                path=path,
                model_bytes_per_step=bytes_per_step,
                model_bandwidth_GBps=rate * bytes_per_step / 1e9,
                model_tflops=rate * flops_per_step / 1e12,
                fraction_of_peak=rate * flops_per_step / 1e12 / args.peak_tflops,
            )
            out.append(row)
            line(f"{name}, {path}", row)
    try:  # what a fused round runs: the kernel and the layout copies XLA adds around it
        text = _hlo.round_program(td, fj.fedlsa(0.1, H), wide, unroll=8, fused=True)
        kernels = _hlo.round_kernels(text)
        ops = sorted(collections.Counter(op for op, _ in kernels).items())
        print(f"TD FedLSA, fused round at {wide} seeds: {len(kernels)} kernels ({dict(ops)})")
        out.append({"name": "TD FedLSA", "path": "fused", "seeds": wide, "round_kernels": kernels})
    except Exception as e:  # recorded, the run goes on
        out.append(
            {
                "name": "TD FedLSA",
                "path": "fused",
                "round_kernels_error": f"{type(e).__name__}: {e}"[:2000],
            }
        )
    return out


def sections(args):
    """``(name, fn)`` of each section in the order run (the most wanted first); ``fn()`` returns
    the section's figures."""
    small, R = args.small, args.repeats
    sizes = [100] if small else [10_000, 100_000, 1_000_000]
    wide = sizes[-1] if small else 100_000
    N, H, rounds = (3, 10, 5) if small else (10, 10, 100)
    td = fj.problems.garnet(jax.random.key(0), num_agents=N, num_states=20, dim=10)
    g = fj.problems.random_gaussian_lsa(jax.random.key(0), num_agents=N, dim=10)
    pair = (("TD FedLSA", td, fj.fedlsa(0.1, H)), ("Gaussian FedLSA", g, fj.fedlsa(0.05, H)))
    agents = 4 if small else 100  # the SCAFFLSA paper's Figure-1 Garnet at N = 100
    fig1 = fj.problems.garnet(jax.random.key(0), num_agents=agents, heterogeneity="heterogeneous")

    def td_fedlsa():
        rows = []
        for n in sizes:
            rows.append(throughput(td, fj.fedlsa(0.1, H), rounds, n, N * H, R))
            line(f"TD FedLSA, {n} seeds", rows[-1])
        return rows

    def local_step():
        steps = {}
        for name, p, a in pair:
            found = steps[name] = _hlo.local_step(_hlo.round_program(p, a, wide), H)
            print(
                f"{name}: {len(found['kernels'])} kernels per local step "
                f"({', '.join(op for op, _ in found['kernels'])}), carry {found['carry']}, "
                f"host transfers {found['host_transfers'] or 'none'}"
            )
        return steps

    def unroll():
        out = {}
        for name, p, a in pair[:1] if small else pair:
            out[name] = {}
            for u in (5,) if small else (1, 2, 5, 10):
                out[name][u] = throughput(p, a, rounds, wide, N * H, R, unroll=u)
                line(f"{name}, unroll {u}", out[name][u])
        return out

    def paths():
        out = {}
        chosen = list(cases(0.05 if small else 1.0).items())
        for name, (p, a, r, per_round) in chosen[-1:] if small else chosen:
            out[name] = throughput(p, a, r, wide, per_round, R)
            line(name, out[name])
        return out

    def scafflsa():
        n = 100 if small else 10_000
        q = fj.problems.qfedtd_mdp(jax.random.key(0), num_agents=agents)
        out = {}
        runs = (
            ("SCAFFLSA, Figure-1 Garnet", fig1, fj.scafflsa(0.1, 10), agents * 10),
            ("FedLSA, Figure-1 Garnet", fig1, fj.fedlsa(0.1, 10), agents * 10),
            ("QFedTD 4-bit p=0.6", q, fj.qfedtd(0.6, fj.channel.stochastic_uniform(4), 0.6), agents),
        )
        for name, p, a, per_round in runs[:1] if small else runs:
            out[name] = dict(throughput(p, a, rounds, n, per_round, R), agents=agents)
            line(f"{name}, N={agents}", out[name])
        return out

    def theory():
        T = 10 if small else 300
        t0 = time.perf_counter()
        mse = fj.theory.exact_mse(fig1, fj.scafflsa(0.1, 10), T)
        seconds = time.perf_counter() - t0
        print(f"exact_mse SCAFFLSA, N={agents}, {T} rounds, float64: {seconds:.3g} s")
        return {"algorithm": "scafflsa", "agents": agents, "rounds": T, "seconds": seconds,
                "final_mse": float(mse[-1])}  # fmt: skip

    def bootstrap():
        B, n = (10, 20) if small else (100, 1000)
        boot = throughput(td, fj.bootstrap(fj.fedlsa(0.1, H), B), rounds, n, (1 + B) * N * H, R)
        line(f"bootstrap FedLSA, B={B}", boot)
        plain = throughput(td, fj.fedlsa(0.1, H), rounds, n * (1 + B), N * H, R)
        line("plain FedLSA, (1 + B) x the seeds", plain)
        ratio = plain["agent_steps_per_s"] / boot["agent_steps_per_s"]
        print(f"bootstrap / plain cost per trajectory-step: {ratio:.3g}")
        return {"replicates": B, "bootstrap": boot, "plain": plain, "bootstrap_over_plain": ratio}

    return [
        ("td_fedlsa", td_fedlsa),
        ("fused", lambda: fused_section(args, td, g, sizes, wide, N, H, rounds)),
        ("local_step", local_step),
        ("unroll", unroll),
        ("paths", paths),
        ("scafflsa", scafflsa),
        ("theory", theory),
        ("bootstrap", bootstrap),
    ]


def main(argv=None):
    args = parse(argv)
    backend = check_platform(args.platform)
    report = Report(args.out)
    t_start = time.perf_counter()
    report["devices"] = devices_section(backend)
    for name, section in sections(args):
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            report[name] = f"skipped: {elapsed:.0f} s elapsed, over --budget-s {args.budget_s:g}"
            print(f"{name}: {report.data[name]}")
            continue
        report[name] = section()
    report["total_s"] = time.perf_counter() - t_start
    print(f"total {report.data['total_s']:.0f} s; figures in {report.path}")


if __name__ == "__main__":
    main()
