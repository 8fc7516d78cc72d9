"""Modules that can be called: ``fj.simulate(...)`` runs :func:`fedsa_jax.simulate.simulate`
while ``import fedsa_jax.simulate`` still gives the module (the function does not shadow it)."""

from __future__ import annotations

import sys
import types
from typing import Callable


def make_callable(module_name: str, fn: Callable) -> None:
    """Calling the module ``module_name`` calls ``fn``."""

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return fn(*args, **kwargs)

    CallableModule.__call__.__doc__ = fn.__doc__
    sys.modules[module_name].__class__ = CallableModule
