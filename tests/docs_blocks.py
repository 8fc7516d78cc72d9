"""Run the ```python blocks of Markdown pages, as tests/test_docs.py does (not a test module).

    python tests/docs_blocks.py README.md docs/guide/channel.md     # each page's outcome and time

Rules (tests/README.md, "The documentation's code blocks"):

- the blocks of one page run in order, each in a fresh namespace, in a temporary working folder;
- a block right after the comment ``<!-- test: continue -->`` runs in the namespace of the block
  before it (it continues that example);
- a block right after ``<!-- test: skip REASON -->`` is not run (code that needs a cluster);
- sizes shrink without touching the text: ``fj.simulate``, ``fj.compare`` and ``fj.sweep`` run at
  most ``FEDSA_DOCS_MAX_SEEDS`` seeds (default 16) whatever the block asks for; the results are
  the first seeds of the run the page shows;
- warnings are errors; JAX compiles at a low XLA optimisation level (compiling, not running,
  is what the blocks spend their time on), set before JAX starts, hence a process of its own.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import tempfile
import time
import traceback
import types
import warnings
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*test:\s*(?P<word>continue|skip)\b[^>]*-->\s*$")
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def python_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line, directive, code)`` for each ```python block; directive is "", "continue" or "skip"
    (a comment on the last non-blank line before the fence)."""
    blocks = []
    for match in _FENCE.finditer(text):
        if match.group("info").strip().split(" ")[0] not in ("python", "py"):
            continue
        before = text[: match.start()].rstrip().splitlines()
        found = _DIRECTIVE.search(before[-1]) if before else None
        indent = len(match.group("indent"))
        code = "\n".join(line[indent:] for line in match.group("body").splitlines())
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, found.group("word") if found else "", code))
    return blocks


def _capped(function, max_seeds: int):
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        seeds = bound.arguments.get("num_seeds")
        if isinstance(seeds, int) and seeds > max_seeds:
            bound.arguments["num_seeds"] = max_seeds
        return function(*bound.args, **bound.kwargs)

    return wrapper


def _shrink(fj, max_seeds: int) -> None:
    for name in ("simulate", "compare", "sweep"):
        original = getattr(fj, name)
        wrapped = _capped(original, max_seeds)
        wrapped.__dict__.update(original.__dict__)
        setattr(fj, name, wrapped)
    sweep = sys.modules["fedsa_jax._runtime.sweep"]
    # fj.sweep.MAX_GRID is read from the function object the package exports
    sweep.sweep = fj.sweep


def run_page(path: Path, root: Path) -> str | None:
    """None if every block of the page runs, else the failing block's line and traceback."""
    import matplotlib.pyplot as plt

    namespace: dict = {}
    name = path.relative_to(root).as_posix()
    with tempfile.TemporaryDirectory() as folder:
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            for line, directive, code in python_blocks(path.read_text()):
                if directive == "skip":
                    continue
                if directive != "continue":
                    # a module of its own, as a script has: dataclasses and pickling look it up
                    module = types.ModuleType(f"docs_block_{line}")
                    sys.modules[module.__name__] = module
                    namespace = module.__dict__
                try:
                    exec(compile(code, f"{name}:{line}", "exec"), namespace)
                except Exception:
                    return f"{name}, block at line {line}:\n{traceback.format_exc(limit=-3)}"
        finally:
            os.chdir(cwd)
            plt.close("all")
    return None


def main(argv: list[str]) -> int:
    os.environ.setdefault("XLA_FLAGS", FAST_COMPILE)
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["FEDSA_JAX_COMPILE_CACHE"] = "off"
    warnings.simplefilter("error")
    import fedsa_jax as fj

    _shrink(fj, int(os.environ.get("FEDSA_DOCS_MAX_SEEDS", "16")))
    root = Path(__file__).resolve().parent.parent
    report = {}
    for page in argv:
        path = (root / page).resolve()
        start, cpu = time.perf_counter(), time.process_time()
        report[path.relative_to(root).as_posix()] = run_page(path, root)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"{page}: {wall:.1f} s ({cpu:.1f} s of CPU)", file=sys.stderr)
    print(json.dumps(report))
    return 0 if all(v is None for v in report.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
