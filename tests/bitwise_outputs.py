"""Run a fixed set of command-line configurations and record a fingerprint of every number they write,
to show that a change which should not change behaviour (a move of code between modules) changes no
result bit.

    python tests/bitwise_outputs.py write before.json     # on the code before the change
    python tests/bitwise_outputs.py compare before.json   # on the code after: exit 1 on any difference

The configurations cover every algorithm, the exact theory, a quantizer with erasures, error
feedback, a downlink, a cohort, delays, random local work, FedBuff with durations, privacy, the
bootstrap and the plug-in moments, SARSA and Q-learning (small sizes: a few minutes in all). For each
result file ``result_*.npz`` every array is hashed (SHA-256 of its dtype, shape and bytes), and the
summary (``summary.json``: the exact theory's numbers among them); the recorded configurations are
compared without their code fingerprint (``"code"``, which changes with the code by design) and
without clock readings. Figures are not compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--rounds", "4", "--seeds", "6", "--no-plot", "--no-compile-cache"]
GARNET = ["--agents", "3", "--states", "5", "--dim", "2", "--local-steps", "3", *SMALL]
CONFIGS: dict[str, list[str]] = {
    "algorithms": [*GARNET, "--algorithms", "fedlsa,scafflsa,qfedtd,scaffnew", "--exact"],
    "gaussian": ["--problem", "gaussian", "--agents", "3", "--dim", "3", "--local-steps", "3", *SMALL],
    "quantizer-erasures": [*GARNET, "--quantizer", "qsgd", "--levels", "4", "--success-prob", "0.7"],
    "error-feedback": [*GARNET, "--algorithms", "fedlsa", "--quantizer", "top-k", "--k", "1"]
    + ["--error-feedback", "ef21"],
    "downlink": [*GARNET, "--downlink-quantizer", "scaled-sign"],
    "cohort": [*GARNET, "--clients-per-round", "2"],
    "delays": [*GARNET, "--algorithms", "fedlsa", "--delays", "uniform:2"],
    "local-work": [*GARNET, "--algorithms", "fedlsa", "--local-work", "uniform:1,4"],
    "fedbuff": [*GARNET, "--algorithms", "fedbuff", "--buffer-size", "2", "--durations", "uniform:1,3"],
    "privacy": [*GARNET, "--algorithms", "fedlsa", "--clip-norm", "1.0", "--noise-multiplier", "0.5"],
    "bootstrap": [*GARNET, "--algorithms", "fedlsa", "--bootstrap", "5", "--plug-in"],
    "sarsa": ["--problem", "sarsa-garnet", "--agents", "3", "--local-steps", "3", *SMALL],
    "q-learning": ["--problem", "q-learning", "--agents", "4", "--local-steps", "3", *SMALL]
    + ["--algorithms", "fedlsa,importance-averaging"],
    # the exact theory of each mechanism that has one
    "exact-channel": [*GARNET, "--algorithms", "fedlsa", "--quantizer", "rand-k", "--k", "1"]
    + ["--success-prob", "0.7", "--error-feedback", "ef14", "--exact"],
    "exact-downlink-cohort": [
        *GARNET,
        "--downlink-quantizer",
        "rand-k",
        "--k",
        "1",
        "--clients-per-round",
        "2",
    ]
    + ["--exact"],
    "exact-markov-optim": [*GARNET, "--sampling", "markov", "--schedule", "inverse-time", "--average", "1"]
    + ["--server-optimizer", "sgd", "--server-momentum", "0.5", "--exact"],
    "exact-privacy-delays": [
        *GARNET,
        "--algorithms",
        "fedlsa",
        "--noise-multiplier",
        "0.5",
        "--clip-norm",
        "1.0",
    ]
    + ["--no-clip", "--delays", "geometric:1,3", "--exact"],
    "exact-local-work": ["--problem", "gaussian", "--agents", "3", "--dim", "3", "--local-steps", "3", *SMALL]
    + ["--algorithms", "fedlsa,scafflsa", "--local-work", "fixed:1,2,3", "--exact"],
}


def _digest(array: np.ndarray) -> str:
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def _timeless(value):
    """``value`` (JSON) without its clock readings and code fingerprints."""
    if isinstance(value, dict):
        return {
            k: _timeless(v)
            for k, v in value.items()
            if not (k == "code" or k.endswith("_s") or "second" in k or "time" in k or "date" in k)
        }
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def fingerprints(out: Path) -> dict[str, str]:
    """``{"file:array": digest}`` for every array of every result file under ``out``, and for the
    summary's numbers without its clock readings."""
    found = {}
    summary = out / "summary.json"
    if summary.exists():
        text = json.dumps(_timeless(json.loads(summary.read_text())), sort_keys=True)
        found["summary.json"] = _digest(np.array(text))
    for path in sorted(out.glob("result_*.npz")):
        with np.load(path, allow_pickle=False) as z:
            for key in z.files:
                value = z[key]
                if key == "config_json":
                    value = np.array(json.dumps(_timeless(json.loads(str(value))), sort_keys=True))
                found[f"{path.name}:{key}"] = _digest(value)
    return found


def run_all(only: list[str] | None = None) -> dict[str, dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CONFIGS.items():
            if only and name not in only:
                continue
            out = Path(tmp) / name
            cmd = [sys.executable, "-m", "fedsa_jax.cli", "run", *args, "--out", str(out)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}\n{' '.join(cmd)}\n{done.stderr[-3000:]}")
            results[name] = fingerprints(out)
            print(f"{name}: {len(results[name])} arrays", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["write", "compare"])
    parser.add_argument("file")
    parser.add_argument("--only", help="comma-separated configuration names")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    results = run_all(only)
    if args.mode == "write":
        Path(args.file).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        return 0
    before = json.loads(Path(args.file).read_text())
    differ = [
        f"{name}/{key}"
        for name in sorted(set(before) | set(results))
        if not only or name in only
        for key in sorted(set(before.get(name, {})) | set(results.get(name, {})))
        if before.get(name, {}).get(key) != results.get(name, {}).get(key)
    ]
    for item in differ:
        print(f"differs: {item}")
    print(f"{sum(map(len, results.values()))} arrays compared, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
