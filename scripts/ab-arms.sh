#!/usr/bin/env bash
# Export branches (or any revisions) as A/B arms for one device call: ab/<name>/ holds the
# revision's eagletree/, tests/ and pyproject.toml — not benchmarks/, so that every arm is
# measured by this checkout's benchmark code. ab/ is ignored by git, so the device call must
# carry it (with .whl):
#   bash scripts/ab-arms.sh base=HEAD~1 new=HEAD
#   device run: bash scripts/gpu.sh ab base new -- bench attention --key-shapes
#               bash scripts/gpu.sh ab base new -- cli bench --preset llama3-8b --configs plain
# An argument NAME=REV names the arm; otherwise the arm is the revision with / turned into -.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 [NAME=]REV ..." >&2; exit 2; }
rm -rf ab
mkdir -p ab
for spec in "$@"; do
    name=${spec%%=*}; rev=${spec#*=}
    [ "$name" = "$spec" ] && name=${rev//\//-}
    git rev-parse --verify --quiet "$rev^{commit}" > /dev/null \
        || { echo "$rev: no such revision" >&2; exit 2; }
    mkdir -p "ab/$name"
    git archive "$rev" eagletree tests pyproject.toml | tar -x -C "ab/$name"
    echo "ab/$name  $(git log -1 --format='%h %s' "$rev" | cut -c1-90)"
done
du -sh ab | cut -f1 | sed 's/^/ab: /'
