"""Execute the notebooks at their own sizes: regenerate their stored outputs, or check that a fresh
execution reproduces the key numbers they show.

    python benchmarks/notebooks.py                 # execute every notebook and store its outputs
    python benchmarks/notebooks.py --check         # execute copies; compare with the stored numbers
    python benchmarks/notebooks.py --check 00_quickstart.ipynb

Key numbers are the numbers printed on the lines that report a result (MSE, bias, exact values,
z-scores, mixing times, step sizes). A fresh number matches a stored one when it is printed the
same or differs by at most one unit in its last printed digit (float rounding across machines);
anything else (0.1341 where 0.1351 is stored) is a stale output. Each notebook runs in a
temporary folder, so the files it writes do not land in the tree.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KEY_LINE = re.compile(r"MSE|bias|exact|mixing|step size|s\.e\.", re.IGNORECASE)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def key_numbers(book) -> list[str]:
    """The numbers, as printed, on the result lines of the notebook's text outputs, in order."""
    found = []
    for cell in book.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            text = out.get("text", "") if out.output_type == "stream" else ""
            for line in text.splitlines():
                if KEY_LINE.search(line):
                    found += NUMBER.findall(line)
    return found


def _last_digit_unit(token: str) -> float:
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def differences(stored: list[str], fresh: list[str]) -> list[str]:
    """Where ``fresh`` does not reproduce ``stored`` (empty: it does)."""
    if len(stored) != len(fresh):
        return [f"{len(stored)} key numbers stored, {len(fresh)} printed now"]
    bad = []
    for i, (a, b) in enumerate(zip(stored, fresh)):
        unit = max(_last_digit_unit(a), _last_digit_unit(b))
        if a != b and abs(float(a) - float(b)) > 1.0001 * unit:
            bad.append(f"number {i}: stored {a}, now {b}")
    return bad


def execute(path: Path):
    """The notebook at ``path`` executed top to bottom, in a temporary folder."""
    book = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as folder:
        client = nbclient.NotebookClient(
            book, timeout=3600, kernel_name="python3", resources={"metadata": {"path": folder}}
        )
        client.execute()
    return book


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="notebook file names (default: all)")
    ap.add_argument("--check", action="store_true", help="compare with the stored outputs; write nothing")
    args = ap.parse_args(argv)
    paths = [NOTEBOOKS / n for n in args.names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    failed = 0
    for path in paths:
        stored = key_numbers(nbformat.read(path, as_version=4))
        t0 = time.perf_counter()
        book = execute(path)
        seconds = time.perf_counter() - t0
        if args.check:
            bad = differences(stored, key_numbers(book))
            failed += bool(bad)
            state = "reproduces its stored key numbers" if not bad else "; ".join(bad[:5])
            print(f"{path.name}: {len(stored)} key numbers, {seconds:.0f} s: {state}")
        else:
            nbformat.write(book, path)
            print(f"{path.name}: executed in {seconds:.0f} s, {len(key_numbers(book))} key numbers stored")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
