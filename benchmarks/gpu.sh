#!/usr/bin/env bash
# GPU benchmark: install jax[cuda12] and fedsa_jax, then measure agent-local-steps per second
# at 1e5 seeds (federated TD(0) FedLSA, N=10, S=20, d=10, H=10) and the scaling axes.
# Usage (from the repository root, on a machine with an NVIDIA GPU):
#   OUT=gpu_results bash benchmarks/gpu.sh
set -euo pipefail
OUT="${OUT:-benchmarks/out/gpu}"
mkdir -p "$OUT"
python3 -m venv /tmp/fedsa_gpu_venv
# shellcheck disable=SC1091
source /tmp/fedsa_gpu_venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet '.[cuda]'
python - <<'PY' | tee "$OUT/devices.txt"
import jax; print(jax.__version__, jax.devices())
PY
python benchmarks/throughput.py --seeds 100000 --rounds 100 --no-numpy --json "$OUT/throughput_1e5_seeds.json" | tee "$OUT/throughput.txt"
python benchmarks/scaling.py --json "$OUT/scaling.json" | tee "$OUT/scaling.txt"
