#!/usr/bin/env bash
# The GPU run, offline: the JAX already installed (with its CUDA plugin), the package from this tree,
# nothing installed from a package index. About 6 minutes on one GPU; figures in OUT/gpu.json.
#   bash benchmarks/gpu.sh OUT [gpu.py options]      (from anywhere; OUT default benchmarks/out/gpu)
set -euo pipefail
out="${1:-benchmarks/out/gpu}"
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python3 benchmarks/gpu.py "$out" "$@"
