#!/usr/bin/env bash
# GPU readiness in one prepared run (under 8 minutes on an H200): builds a full-size random
# Wan 2.1 VACE 1.3B-shaped checkpoint on the machine, runs the CUDA tests against it, then times
# inference.py against the same clip through the service. Without CUDA: says so, exits 0.
#
#   bash bench/gpu_check.sh [--work DIR] [--skip-tests]
#
# PYTHON picks the interpreter (default: .venv/bin/python when present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA device here: nothing to check (run this on a machine with an NVIDIA GPU)"
  echo "RESULT cuda=false"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
exec "$PYTHON" bench/gpu_check.py "$@"
