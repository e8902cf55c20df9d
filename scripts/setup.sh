#!/usr/bin/env bash
# Create (or reuse) the project virtualenv in .venv and install eagletree with pinned versions.
# Usage: bash scripts/setup.sh            (idempotent; prints one line per phase)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $PY"
    "$PY" -m venv .venv
fi
echo "setup: installing pinned dependencies (first run takes about 2 minutes)"
# pip's mirror warnings ("Location ... is ignored") are noise on this machine; keep real errors.
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev,hf,serve]" \
    2> >(grep -v 'is ignored' >&2)
echo "setup: done ($(.venv/bin/python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'))"
