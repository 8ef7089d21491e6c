#!/usr/bin/env bash
# GPU readiness in one prepared run (one device call: past --budget-s, 540 s, the speed options
# left are skipped): builds a full-size random Wan 2.1 VACE 1.3B-shaped checkpoint on the machine,
# runs the CUDA tests against it, times inference.py against the same clip through the service,
# then each speed option (cuDNN/flash attention, compile, step cache, FP8, 2-GPU Ulysses) beside
# plain eager diffusers in seconds per step. Without CUDA: says so, exits 0.
#
#   bash bench/gpu_check.sh [--work DIR] [--skip-tests] [--cpu] [--budget-s S]
#
# PYTHON picks the interpreter (default: .venv/bin/python when present, else python3). On a
# machine without this project's packages (the lent GPU machines), .gpu/site.tar.xz, packed here
# by bench/gpu_carry.py for that machine's Python, is unpacked once under $SITE_DIR and put first
# on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
packed_for="$(cat .gpu/python-version 2>/dev/null || true)"
running="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ -f .gpu/site.tar.xz && "$packed_for" == "$running" ]] && ! "$PYTHON" -c 'import dagster' 2>/dev/null; then
  SITE_DIR="${SITE_DIR:-${TMPDIR:-/tmp}/shotloom-site}"
  stamp="$(cksum < .gpu/site.tar.xz)"
  if [[ "$(cat "$SITE_DIR/.packed" 2>/dev/null)" != "$stamp" ]]; then
    rm -rf "$SITE_DIR" && mkdir -p "$SITE_DIR"
    tar -xJf .gpu/site.tar.xz -C "$SITE_DIR"
    echo "$stamp" > "$SITE_DIR/.packed"
  fi
  export PYTHONPATH="$SITE_DIR:$PYTHONPATH"
  # Pins the packing left to the machine that it does not meet: worth reading when a step fails.
  "$PYTHON" -m pip check 2>&1 | grep -v "^No broken" | sed 's/^/pip check: /' || true
fi
if [[ " $* " != *" --cpu "* ]] && ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA device here: nothing to check (run this on a machine with an NVIDIA GPU)"
  echo "RESULT cuda=false"
  exit 0
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
exec "$PYTHON" bench/gpu_check.py "$@"
