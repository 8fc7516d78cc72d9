"""The package's layers: every public module says what it exports, every module imports first in a
fresh process (no import cycle that only an import order hides), and no module imports another of
the package inside a function to dodge a cycle. The contracts between layers are checked by
``lint-imports`` (``[tool.importlinter]`` in pyproject.toml)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import fedsa_jax

PACKAGE = Path(fedsa_jax.__file__).parent
# The command line imports the package inside its functions on purpose: the CPU device count and the
# compile cache must be set before JAX starts; and `python -m fedsa_jax.cli` runs when imported.
NOT_YET = ("fedsa_jax.cli",)


def _modules() -> list[str]:
    names = ["fedsa_jax"]
    names += [m.name for m in pkgutil.walk_packages([str(PACKAGE)], prefix="fedsa_jax.")]
    return sorted(n for n in names if not n.startswith(NOT_YET))


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _source(name: str) -> Path:
    path = PACKAGE.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_public_modules_declare_all():
    public = [n for n in _modules() if _public(n)]
    assert "fedsa_jax.metrics" in public and "fedsa_jax.problems.td" in public
    assert "fedsa_jax._runtime.driver" not in public
    for name in public:
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert isinstance(exported, list | tuple), f"{name} has no __all__"
        assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
        missing = [n for n in exported if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names what it lacks: {missing}"


def test_no_function_level_import_of_the_package():
    """A package import inside a function hides a cycle; imports of the package go at the top."""
    found = []
    for name in _modules():
        tree = ast.parse(_source(name).read_text())
        top = {id(node) for node in tree.body}
        top |= {  # what type checkers see (``if TYPE_CHECKING:``) is no import at run time
            id(inner)
            for node in tree.body
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for inner in node.body
        }
        for node in ast.walk(tree):
            if id(node) in top or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            )
            if any(t == "fedsa_jax" or t.startswith("fedsa_jax.") for t in targets):
                found.append(f"{name}:{node.lineno}")
    assert not found, found


IMPORT_EACH_FIRST = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "fedsa_jax" or m.startswith("fedsa_jax.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(failed))
"""


def test_each_module_imports_first():
    """Each module as the first of the package to load (one process: numpy and JAX stay loaded, the
    package's modules are dropped before each import)."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, *_modules()],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    assert out.stdout.strip() == "", out.stdout
