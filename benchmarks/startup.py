"""Start-up: what the command line's help and the package's import cost, in CPU seconds, beside the
cost of importing JAX alone (each command in a fresh Python, the median of ``--repeats`` runs; CPU
time, user + system, of the child process, so a loaded machine's waiting does not count).

    python benchmarks/startup.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

from _bench import write_json

COMMANDS = {
    "fedsa-jax --help": "from fedsa_jax.cli import main; main(['--help'])",
    "fedsa-jax run --help": "from fedsa_jax.cli import main; main(['run', '--help'])",
    "import fedsa_jax": "import fedsa_jax",
    "import jax (the floor of any run)": "import jax, jax.numpy",
    "import fedsa_jax; fj.simulate (the whole library)": "import fedsa_jax as fj; fj.simulate; fj.theory",
    "fedsa-jax run --help, the real parser (before)": (
        "from fedsa_jax.cli.parser import build_parser; build_parser().parse_args(['run', '--help'])"
    ),
}


def cpu_seconds(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode not in (0,) and "SystemExit" not in done.stderr:
        raise RuntimeError(done.stderr[-500:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    report = {}
    for name, code in COMMANDS.items():
        runs = [cpu_seconds(code) for _ in range(args.repeats)]
        report[name] = {"cpu_s_median": statistics.median(runs), "cpu_s_runs": runs}
        print(f"{name:55s} {statistics.median(runs):6.2f} s CPU (median of {args.repeats})")
    return write_json(args.json, report)


if __name__ == "__main__":
    main()
