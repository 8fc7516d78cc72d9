"""What one local step compiles to: the kernels of the local-step loop in XLA's optimised HLO.

On a GPU every instruction of a loop body that is not a tuple shuffle launches a kernel (a fusion
is one kernel), and every loop iteration pays those launches; a host transfer inside the program
(infeed, outfeed, send/recv, a host callback) would stop the device. :func:`round_program` compiles
one round of an algorithm for a batch of seeds, vmapped as the Monte Carlo kernel runs it, with the
local-step scan not unrolled (one local step per loop iteration); :func:`local_step` reads that
loop's body. Used by ``tests/test_gpu_shape.py`` (on the CPU) and ``benchmarks/gpu.py`` (on the GPU,
where the count is the number of kernel launches per local step).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

from fedsa_jax.problems.protocol import unrolled

# instructions that move no data (tuple plumbing, constants, views): no kernel of their own
NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}
HOST_OPS = {"infeed", "outfeed", "send", "recv", "send-done", "recv-done"}
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")


def round_program(problem, algorithm, num_seeds: int, unroll: int = 1, fused: bool | None = None) -> str:
    """The optimised HLO text of one round of ``algorithm`` for ``num_seeds`` seeds (vmapped over
    seeds, agents inside the round), compiled for the default backend with local-step scans
    unrolled ``unroll`` times, and the fused local-step kernels as ``fused``
    (``fj.Execution(fused_local_steps=...)``)."""
    keys = jax.random.split(jax.random.key(0), num_seeds)
    theta0 = jnp.zeros(problem.dim, problem.dtype)
    states = jax.vmap(lambda k: algorithm.init(k, problem, theta0))(keys)
    rand = jax.vmap(lambda k: algorithm.randomness(k, problem))(keys)

    def one_round(rand, states, problem):
        with unrolled(unroll, fused):
            return jax.vmap(algorithm.step_from, in_axes=(0, 0, None))(rand, states, problem)

    return jax.jit(one_round).lower(rand, states, problem).compile().as_text()


def _instructions(lines):
    """``(opcode, shape text, line)`` of each instruction line of a computation."""
    for line in lines:
        s = line.strip()
        if not (s.startswith("%") or s.startswith("ROOT ")) or " = " not in s:
            continue
        rhs = s.split(" = ", 1)[1]
        if rhs.startswith("("):  # a tuple shape: skip its balanced parentheses
            depth, end = 0, 0
            while True:
                depth += (rhs[end] == "(") - (rhs[end] == ")")
                end += 1
                if depth == 0:
                    break
            shape, rest = rhs[:end], rhs[end:].lstrip()
        else:
            shape, _, rest = rhs.partition(" ")
        yield rest.split("(", 1)[0], shape, s


def computations(text: str) -> dict[str, list[str]]:
    """The module's computations: name -> instruction lines."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            out[name].append(line)
    return out


def local_step(text: str, num_steps: int) -> dict:
    """The local-step loop of a compiled round (the ``while`` whose known trip count is
    ``num_steps``; the first if several): its body's kernels (opcode and output shape of each
    instruction that is not tuple plumbing), the shapes its loop carries, and the host transfers of
    the whole module (must be none)."""
    comps = computations(text)
    body = None
    for lines in comps.values():
        for op, _, line in _instructions(lines):
            if op == "while" and f'"known_trip_count":{{"n":"{num_steps}"}}' in line:
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)  # type: ignore[union-attr]
                carry = re.findall(r"\w+\[[\d,]*\]", line.split(" = ", 1)[1].split(" while(")[0])
                break
        if body is not None:
            break
    if body is None:
        raise ValueError(f"no while loop with known trip count {num_steps} in the program")
    kernels = [(op, shape) for op, shape, _ in _instructions(comps[body]) if op not in NO_KERNEL]
    host = [
        op
        for lines in comps.values()
        for op, _, line in _instructions(lines)
        if op in HOST_OPS or (op == "custom-call" and re.search(r"callback|host", line, re.I))
    ]
    return {"kernels": kernels, "carry": carry, "host_transfers": host}


def round_kernels(text: str) -> list[tuple[str, str]]:
    """The kernels of a compiled round's top level (opcode and output shape of each instruction of
    the entry computation that is not tuple plumbing): with the fused local steps, the Pallas kernel
    (a custom call) and what XLA runs around it (the layout copies of its inputs and output)."""
    comps = computations(text)
    entry = next(
        (name for name, _ in comps.items() if re.search(rf"^ENTRY %?{re.escape(name)} ", text, re.M)),
        None,
    )
    if entry is None:
        raise ValueError("no entry computation in the program")
    return [(op, shape) for op, shape, _ in _instructions(comps[entry]) if op not in NO_KERNEL]
