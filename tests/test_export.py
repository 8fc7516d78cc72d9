"""The simulation kernels export for GPU and TPU (``jax.export`` with ``platforms=("cuda", "tpu")``,
run on a CPU): nothing CPU-only reaches them, no host callback and no CPU custom call.

The kernels are those :func:`fedsa_jax.simulate` runs (``_start`` and ``_advance`` in
``fedsa_jax/_kernel.py``), traced with the arguments a real call builds; they are lowered,
never compiled, so each case takes a fraction of a second.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedsa_jax as fj
from fedsa_jax._runtime import kernel as sim

PLATFORMS = ("cuda", "tpu")


class _Captured(Exception):
    pass


def kernel_arguments(monkeypatch, problem, alg, **options):
    """The arguments of the first ``_start`` call of ``fj.simulate`` (stopped there); ``options``:
    more keywords of ``fj.simulate``."""
    seen = {}

    def spy(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        raise _Captured

    with monkeypatch.context() as m:
        m.setattr(sim, "_start", spy)
        with pytest.raises(_Captured):
            fj.simulate(0, problem, alg, 3, 2, record_every=1, **options)
    return seen["args"], seen["kwargs"]


def spec(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def export_both(start, advance, args, kwargs):
    inputs, seeds = spec(args)
    exported = jax.export.export(start, platforms=PLATFORMS)(*spec(args), **kwargs)
    carry = jax.eval_shape(start, *args, **kwargs)[0]
    end = jax.ShapeDtypeStruct((), jnp.uint32)
    exported_adv = jax.export.export(advance, platforms=PLATFORMS)(
        inputs, seeds, carry, end, record_every=1, max_blocks=2, rec=kwargs["rec"]
    )
    return exported, exported_adv


@pytest.fixture(scope="module")
def problems(tiny_td, het_gaussian):
    P, r, Phi = tiny_td
    return {
        "td": fj.problems.federated_td(P, r, Phi, 0.9),
        "td-markov": fj.problems.federated_td(P, r, Phi, 0.9, sampling="markov"),
        "gaussian": het_gaussian,
    }


ALGORITHMS = {
    "fedlsa": lambda: fj.fedlsa(0.1, 2),
    "scafflsa": lambda: fj.scafflsa(0.1, 2),
    "qfedtd-lossy": lambda: fj.qfedtd(0.5, fj.channel.stochastic_uniform(4), success_prob=0.6),
    "fedlsa-qsgd-lossy": lambda: fj.fedlsa(0.1, 2, quantizer=fj.channel.qsgd(3), success_prob=0.7),
    "scaffnew": lambda: fj.scaffnew(0.1, 0.5, 2),
    # schedules, server optimizers (optax) and the wrappers
    "richardson-averaged-scafflsa-schedule-adam": lambda: fj.richardson(
        fj.averaged(
            fj.scafflsa(
                fj.schedule(fj.optim.inverse_time, eta0=0.1, k0=10.0), 2, server_optimizer=optax.adam(1e-2)
            ),
            burn_in=1,
        )
    ),
}
CASES = (
    [("td", a) for a in ALGORITHMS if a != "qfedtd-lossy"]
    + [("td-markov", "qfedtd-lossy")]
    + [("gaussian", a) for a in ALGORITHMS if a != "fedlsa-qsgd-lossy"]
)


@pytest.mark.parametrize("problem_name,alg_name", CASES)
def test_kernels_export_for_gpu_and_tpu(monkeypatch, problems, problem_name, alg_name):
    start, advance = sim._start, sim._advance
    args, kwargs = kernel_arguments(monkeypatch, problems[problem_name], ALGORITHMS[alg_name]())
    for exported in export_both(start, advance, args, kwargs):
        assert exported.platforms == PLATFORMS
        assert "callback" not in exported.mlir_module()


def test_a_host_callback_fails_the_export():
    """What the test above would catch: a callback to the host in a kernel."""

    @jax.jit
    def kernel(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises((ValueError, NotImplementedError), match="custom call|callback"):
        jax.export.export(kernel, platforms=PLATFORMS)(jax.ShapeDtypeStruct((3,), jnp.float64))
