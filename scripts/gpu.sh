#!/usr/bin/env bash
# Run the GPU share of the project on the H200 machine (the `device` tool), logs under $OUT.
# It carries the wheels that machine lacks in .whl/ (see ../shared/gpu/README.md):
#   bash ../shared/gpu/fetch-wheels.sh .whl     # once, here
#   device run: bash scripts/gpu.sh tests tests/unit/domain tests/contracts   (carry .whl)
#               bash scripts/gpu.sh bench domain_ops --sync-debug
#               bash scripts/gpu.sh cli bench --preset llama3-8b --draft eagle3 --hf
#               bash scripts/gpu.sh real-pair [python -m benchmarks.real_pair options]
#               bash scripts/gpu.sh sweep [python -m benchmarks.real_pair.sweep options]
#               bash scripts/gpu.sh ab base new -- bench attention --key-shapes
#               bash scripts/gpu.sh ab base new -- cli bench --preset llama3-8b --configs plain
#                   (arms from scripts/ab-arms.sh; carry .whl and ab)
# Phases: `tests PATH...` runs pytest on CUDA (the CPU cases run in CI already, so only the
# cases whose id names cuda run here, plus tests marked gpu); `bench NAME ARGS...` runs
# `python -m benchmarks.NAME` and saves its tables as $OUT/NAME.md; `cli COMMAND ARGS...` runs
# `eagletree COMMAND` (`cli bench ...` writes $OUT/bench.md and $OUT/bench.json unless --out
# is given); `real-pair` trains a target and its EAGLE / EAGLE-3 heads and measures them
# ($OUT/report.md); `ab ARM... -- bench|cli ...` runs one `bench` or `cli` command once per
# A/B arm and prints the arms' tables one after the other, then side by side. With CLOCKS_MS
# set, nvidia-smi samples the SM clock, power and the reasons it is held down every CLOCKS_MS ms
# into $OUT/clocks.csv, and each phase's start goes into $OUT/phases.txt, to line the samples up
# with what ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/eagletree-gpu-out}
mkdir -p "$OUT"
if [ -d .whl ] && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' \
    >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
phase=${1:-all}; shift || true
if [ -n "${CLOCKS_MS:-}" ]; then
    reasons=clocks_event_reasons.active
    nvidia-smi --query-gpu=$reasons --format=csv > /dev/null 2>&1 \
        || reasons=clocks_throttle_reasons.active
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
        --format=csv,noheader -lms "$CLOCKS_MS" >> "$OUT/clocks.csv" &
    sampler=$!
    trap 'kill $sampler 2> /dev/null' EXIT
    echo "$(date '+%Y/%m/%d %H:%M:%S.%3N') $phase $*" >> "$OUT/phases.txt"
fi
case "$phase" in
tests)
    python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" "$@" 2>&1 | tee -a "$OUT/tests.log" \
        | tail -n 40
    ;;
bench)
    name=$1; shift
    python3 -m "benchmarks.$name" --out "$OUT/$name.md" "$@" 2>&1 | tee -a "$OUT/bench.log" \
        | tail -n 60
    ;;
cli)
    command=$1; shift
    extra=()
    if [ "$command" = bench ]; then
        case " $* " in *" --out "*) ;; *) extra+=(--out "$OUT/bench") ;; esac
    fi
    python3 -m eagletree.app.cli.main "$command" "$@" "${extra[@]}" 2>&1 | tee -a "$OUT/cli.log" \
        | tail -n 60
    ;;
ab)
    # The same command once per arm of ab/ (scripts/ab-arms.sh), each run from the arm's own
    # directory: `python -m` and `python -c` put the working directory first on sys.path, so the
    # arm's eagletree/ is imported (a PYTHONPATH alone would import this checkout's), while
    # benchmarks/, which the arms do not carry, is this checkout's: the same measuring code for
    # every arm. After `--`: `bench NAME ARGS...` (python -m benchmarks.NAME) or `cli COMMAND
    # ARGS...` (eagletree COMMAND through the arm's own entry point, from its pyproject.toml);
    # bare flags mean `cli bench FLAGS`. Each arm's tables print after its run, then all arms'
    # side by side (benchmarks/ab_table.py). Results as $OUT/ab.tgz (one file: the device
    # returns at most eight), written again after every arm, so that a call cut short by its
    # time limit still returns the arms it finished.
    arms=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do arms+=("$1"); shift; done
    shift || true
    [ ${#arms[@]} -ge 1 ] && [ $# -ge 1 ] \
        || { echo "ab: name the arms, then -- and a bench or cli command" >&2; exit 2; }
    case "$1" in
    bench | cli) kind=$1; shift ;;
    -*) kind=cli; set -- bench "$@" ;;
    *) echo "ab: after --, bench NAME ... or cli COMMAND ..." >&2; exit 2 ;;
    esac
    [ $# -ge 1 ] || { echo "ab: $kind needs a name" >&2; exit 2; }
    target=$1; shift
    checkout=$PWD
    results=$(mktemp -d)/ab
    mkdir -p "$results"
    for arm in "${arms[@]}"; do
        [ -d "ab/$arm/eagletree" ] || { echo "ab/$arm: no such arm" >&2; exit 2; }
        echo "== arm $arm ($(date +%T))"
        out=()
        if [ "$kind" = bench ]; then
            run=(python3 -m "benchmarks.$target")
            out=(--out "$results/$arm.md")
        else
            entry=$(sed -n 's/^eagletree = "\(.*\):main"$/\1/p' "ab/$arm/pyproject.toml")
            run=(python3 -c 'import importlib, sys; sys.exit(importlib.import_module(sys.argv.pop(1)).main())'
                "${entry:-eagletree.app.cli.main}" "$target")
            [ "$target" = bench ] && out=(--out "$results/$arm")
        fi
        (cd "ab/$arm" && export PYTHONPATH=/tmp/site:$checkout \
            && python3 -c 'import eagletree; print("arm code:", eagletree.__file__)' \
            && "${run[@]}" "$@" "${out[@]}") > "$results/$arm.log" 2>&1
        grep -m1 '^arm code' "$results/$arm.log"
        if [ -f "$results/$arm.md" ]; then cat "$results/$arm.md"; else tail -n 30 "$results/$arm.log"; fi
        tar czf "$OUT/ab.tgz" -C "$(dirname "$results")" ab
    done
    merged=()
    for arm in "${arms[@]}"; do [ -f "$results/$arm.md" ] && merged+=("$arm=$results/$arm.md"); done
    if [ ${#merged[@]} -ge 2 ]; then
        echo "== side by side"
        python3 -m benchmarks.ab_table "${merged[@]}" --out "$results/side-by-side.md"
        tar czf "$OUT/ab.tgz" -C "$(dirname "$results")" ab
    fi
    ;;
real-pair)
    # the whole real-pair pipeline (python -m benchmarks.real_pair) in one call; checkpoints stay on
    # the machine, the reports (rewritten after every phase) come back, also from a run that
    # REAL_PAIR_TIMEOUT seconds cut short
    timeout "${REAL_PAIR_TIMEOUT:-570}" python3 -m benchmarks.real_pair --out /tmp/real-pair \
        --report-dir "$OUT" "$@" 2>&1 | tee -a "$OUT/real-pair.log" | grep -v '^step ' | tail -n 80
    for head in eagle eagle3; do
        [ -f "/tmp/real-pair/$head/training.json" ] && cp "/tmp/real-pair/$head/training.json" \
            "$OUT/training-$head.json"
    done
    ;;
sweep)
    # train-draft variants on the real pair (python -m benchmarks.real_pair.sweep): reuses the
    # target under /tmp/real-pair when a real-pair call left it there, else trains it first;
    # sweep.md / sweep.json (rewritten after each variant) come back, also from a cut-short run
    timeout "${SWEEP_TIMEOUT:-570}" python3 -m benchmarks.real_pair.sweep --out /tmp/real-pair \
        --report-dir "$OUT" "$@" 2>&1 | tee -a "$OUT/sweep.log" | grep -v '^step ' | tail -n 60
    ;;
*)
    echo "unknown phase $phase" >&2; exit 2
    ;;
esac
