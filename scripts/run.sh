#!/usr/bin/env bash
# The README's run command: set up the pinned virtualenv, then run the main job on its embedded
# default. Until trained checkpoints ship (issue 6 adds `eagletree generate`), the main job is one
# tree decode step on fixed numbers: draft beam, tree, verification, KV move plan, compaction.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/eagletree demo "$@"
