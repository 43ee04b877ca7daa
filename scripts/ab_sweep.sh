#!/usr/bin/env bash
# A/B of run-time switches on one binary, in one run: the sweep once per environment setting, in
# order, then the first setting again (drift check). Usage (on the GPU machine):
#   [AB_ARGS="--max-splits 1"] scripts/ab_sweep.sh BUILD_DIR SWEEP_CSV OUT_DIR "NAME:VAR=1,VAR2=x" "NAME2:" ...
# Writes OUT_DIR/<name>.csv per setting (gqattn-bench CSV); compare with bench/compare.py. AB_ARGS:
# more gqattn-bench flags for every setting of this run.
set -uo pipefail
build=$1 sweep=$2 out=$3; shift 3
mkdir -p "$out"
run() {
  local name=${1%%:*} vars=${1#*:}
  echo "--- $name ($vars) $(date +%H:%M:%S)"
  env $(echo "$vars" | tr ',' ' ') "$build/gqattn-bench" --device cuda --sweep "$sweep" --iters "${AB_ITERS:-20}" \
    --csv "$out/$name.csv" ${AB_ARGS:-} > "$out/$name.log" 2>&1 || tail -5 "$out/$name.log"
}
for setting in "$@"; do run "$setting"; done
first=$1; run "${first%%:*}_again:${first#*:}"
