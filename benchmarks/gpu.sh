#!/usr/bin/env bash
# Every GPU figure in one run (<= 9 minutes on one H200), from the source tree:
#   benchmarks/gpu.sh [REPORT.md]      # default gpu-report.md
# CUDA tests (run's on CUDA too), bench --overhead, bench --backend cuda, bench --waits --backend cuda, bench --values,
# examples/mnist.py by depth. Without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" benchmarks/gpu.py "$@"
