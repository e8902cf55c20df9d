#!/usr/bin/env bash
# The README's run command: set up the pinned virtualenv, then run the main job on its embedded
# default: `eagletree generate` with EAGLE tree speculation on a tiny random Llama target and its
# EAGLE draft head, created on first use in the user cache directory (a message says so; its
# output is random tokens).
# Without CUDA it runs on the CPU in float32 with the torch backends. Extra arguments go to
# `eagletree generate` (e.g. --prompt-ids "1 2 3" --max-new-tokens 32 --settings FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/eagletree generate "$@"
