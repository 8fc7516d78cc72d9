"""Schedules and server optimizers are described without optax's private code.

What enters ``result.config``, the checkpoint fingerprint and the code digest (``run_code``)
is a factory's public name and hyperparameters, or, for an object passed built, a name and
a behavioural fingerprint (``fj.optim.fingerprint``): a rewrite of optax's private closures
(another wrapper layer, other inner names, another state container), as a release of optax
may bring, changes none of them; another hyperparameter changes all of them.
"""

import ast
from pathlib import Path

import jax.numpy as jnp
import optax
import pytest
from hypothesis import given, settings, strategies as st

import fedsa_jax as fj
from fedsa_jax._runtime.run import run_code


def as_optax(fn):
    """``fn`` taken for optax's own code (a stand-in for a function of another optax release)."""
    fn.__module__ = optax.trace.__module__
    return fn


def rewritten_momentum(beta):
    """``optax.trace(decay=beta)`` written otherwise: other inner names, a plain tuple for its state."""
    start = as_optax(lambda params: (jnp.zeros_like(params),))

    def step(gradient, velocity, params=None):
        moved = gradient + beta * velocity[0]
        return moved, (moved,)

    return optax.GradientTransformation(start, as_optax(step))


def rewritten_linear(start, end, steps):
    """``optax.linear_schedule(start, end, steps)`` written otherwise."""

    def at(count):
        done = jnp.clip(count, 0, steps) / steps
        return (start - end) * (1 - done) + end

    return as_optax(at)


def described(problem, **options):
    """The description and the code digest of FedLSA with these options."""
    alg = fj.fedlsa(options.pop("step_size", 0.1), 2, **options)
    return alg.describe(), run_code(problem, alg, ())


@pytest.mark.parametrize(
    "reference,rewritten",
    [
        # a wrapper layer (another class); chain(t) for t; other closures and state
        (lambda: optax.scale(-0.1), lambda: optax.with_extra_args_support(optax.scale(-0.1))),
        (lambda: optax.sgd(0.1, momentum=0.9), lambda: optax.chain(optax.sgd(0.1, momentum=0.9))),
        (
            lambda: optax.sgd(0.1, momentum=0.9),
            lambda: optax.chain(rewritten_momentum(0.9), optax.scale(-0.1)),
        ),
    ],
    ids=["with_extra_args_support", "chain", "rewritten"],
)
def test_a_rewritten_private_closure_keeps_description_and_digest(tiny_td, reference, rewritten):
    """An optax transformation and one that computes the same through other private closures have
    the same description and the same code digest; the description names no private function."""
    a, b = described(tiny_td, server_optimizer=reference()), described(tiny_td, server_optimizer=rewritten())
    assert a == b
    assert a[0]["server_optimizer"] == {
        "name": "optax.GradientTransformation",
        "fingerprint": fj.optim.fingerprint(reference()),
    }


def test_a_rewritten_schedule_keeps_description_and_digest(tiny_td):
    """optax's linear schedule, the polynomial schedule of power 1 it is made of, the same behind
    ``join_schedules`` and rewritten: one description and one code digest."""
    forms = [
        optax.linear_schedule(0.5, 0.01, 1000),
        optax.polynomial_schedule(0.5, 0.01, 1.0, 1000),
        optax.join_schedules([optax.linear_schedule(0.5, 0.01, 1000)], []),
        rewritten_linear(0.5, 0.01, 1000),
    ]
    out = [described(tiny_td, step_size=s) for s in forms]
    assert all(o == out[0] for o in out), out
    assert out[0][0]["step_size"]["schedule"]["name"] == "optax schedule"
    other = described(tiny_td, step_size=optax.linear_schedule(0.5, 0.01, 2000))
    assert other[0] != out[0][0] and other[1] != out[0][1]


@settings(max_examples=15, deadline=None)
@given(st.floats(1e-3, 1.0), st.floats(1e-3, 1.0))
def test_the_description_follows_the_learning_rate_not_the_closures(tiny_td, lr1, lr2):
    """Bare (as optax writes it or rewritten) or from the factory, a transformation with another
    learning rate is described, and digested, differently; with the same one, identically."""
    forms = (
        lambda lr: optax.sgd(lr, momentum=0.9),
        lambda lr: optax.chain(rewritten_momentum(0.9), optax.scale(-lr)),
        lambda lr: fj.optimizer(optax.adam, learning_rate=lr),
    )
    out = [[described(tiny_td, server_optimizer=make(lr)) for lr in (lr1, lr2)] for make in forms]
    assert out[0] == out[1]
    for a, b in out:
        if abs(lr1 - lr2) > 1e-8 * max(lr1, lr2):
            assert a[0] != b[0] and a[1] != b[1]
        elif lr1 == lr2:
            assert a == b


def test_factories_are_described_by_public_name_and_hyperparameters(tiny_td):
    """The factory form records the factory's public name (not optax's private module) and its
    hyperparameters; a hyperparameter that is a schedule is described by its behaviour."""
    desc, _ = described(tiny_td, server_optimizer=fj.optimizer(optax.adam, learning_rate=0.01, b1=0.8))
    assert desc["server_optimizer"] == {"name": "optax.adam", "learning_rate": 0.01, "b1": 0.8}
    sched = fj.schedule(
        optax.polynomial_schedule, init_value=0.5, end_value=0.01, power=1.0, transition_steps=100
    )
    desc, _ = described(tiny_td, step_size=sched)
    assert desc["step_size"]["schedule"] == {
        "name": "optax.polynomial_schedule",
        "init_value": 0.5,
        "end_value": 0.01,
        "power": 1.0,
        "transition_steps": 100,
    }
    lr = fj.optimizer(optax.sgd, learning_rate=optax.linear_schedule(0.1, 0.01, 100))
    again = fj.optimizer(optax.sgd, learning_rate=rewritten_linear(0.1, 0.01, 100))
    desc, code = described(tiny_td, server_optimizer=lr)
    assert desc["server_optimizer"]["learning_rate"] == {
        "name": "optax schedule",
        "fingerprint": fj.optim.fingerprint(optax.linear_schedule(0.1, 0.01, 100)),
    }
    assert described(tiny_td, server_optimizer=again) == (desc, code)


def test_optim_and_algorithms_do_not_import_each_other():
    """No import of ``fedsa_jax.algorithms`` in ``optim`` (a function-level one included) nor in the
    description helper both use."""
    root = Path(fj.__file__).parent
    for path in [*sorted((root / "optim").glob("*.py")), root / "_describe.py"]:
        name = path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("fedsa_jax.algorithms"), (name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("fedsa_jax.algorithms") for a in node.names), name
