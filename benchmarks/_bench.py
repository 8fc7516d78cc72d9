"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import time


def best_of(fn, repeats: int = 3) -> float:
    """Smallest wall time of ``repeats`` calls of ``fn()``, in seconds."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def write_json(path, report):
    """Write ``report`` to ``path`` (if given) and return it."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
    return report
