#!/usr/bin/env bash
# The planner's split-KV choice against capped ones, on one binary: the rows of a sweep file run
# with the planner's own choice (--max-splits 0) and with at most 1, 2 and 4 chunks a request,
# each cap a process of its own (the same rows in the same order), then `compare.py` of each cap
# against the planner's run (a ratio > 1: the cap was faster, so the planner split too much).
# The runs' logs name every row's plan (chunk, items). Costs about 15 s a cap for 17 rows.
# SPLIT_PROBE_CAPS (default "1 2 4"): the caps run. SPLIT_PROBE_CHUNKS (default "128 256"): fixed
# chunks of that many keys a request as well
# (--kv-chunk, PlanInputs::fixed_split_size), which can add splits the planner does not choose.
# Usage (on the GPU machine): LOG_DIR=dir scripts/split_probe.sh path/to/gqattn-bench
#   [bench/sweeps/ab/decode_cudnn_gap_hd128.csv]
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=${1:-build-gpu/gqattn-bench}
SWEEP=${2:-bench/sweeps/ab/decode_cudnn_gap_hd128.csv}
LOG_DIR=${LOG_DIR:-/tmp/split-probe}; mkdir -p "$LOG_DIR"
CHUNKS=${SPLIT_PROBE_CHUNKS-128 256}
runs=(cap0)
for n in ${SPLIT_PROBE_CAPS-1 2 4}; do runs+=("cap$n"); done
for n in $CHUNKS; do runs+=("chunk$n"); done
for run in "${runs[@]}"; do
  if [[ $run == cap* ]]; then flag=(--max-splits "${run#cap}"); else flag=(--kv-chunk "${run#chunk}"); fi
  rm -f "$LOG_DIR/$run.csv"
  "$BENCH" --device cuda --sweep "$SWEEP" --iters 20 "${flag[@]}" --csv "$LOG_DIR/$run.csv" \
    > "$LOG_DIR/$run.log" 2>&1 && continue
  # A fixed chunk may not fit a large row's plan (its partial rows past the workspace): those cases
  # fail, the rest are in the CSV and compared. No CSV: the run itself failed.
  [[ -s $LOG_DIR/$run.csv ]] || { echo "split_probe: $run failed (see $LOG_DIR/$run.log)"; exit 1; }
  echo "split_probe: $run: $(grep -c 'error:' "$LOG_DIR/$run.log") case(s) failed, left out (see $LOG_DIR/$run.log)"
done
# Rows whose capped plan is the planner's own (the same chunk and items) measure only the noise
# between two processes: session 19 read 0.98-1.07x on such rows as wins (perf-notes item 108).
same_plans() {  # same_plans RUN: the rows of RUN.log whose plan equals cap0.log's
  python3 - "$LOG_DIR/cap0.log" "$LOG_DIR/$1.log" <<'PY'
import sys
def plans(path):
    out = {}
    for line in open(path):
        if "plan:" in line:
            f = line.split()
            out[" ".join(f[:11])] = line.split("plan:", 1)[1].strip()
    return out
base, cap = plans(sys.argv[1]), plans(sys.argv[2])
same = [k for k in cap if base.get(k) == cap[k]]
print(f"   {len(same)} of {len(cap)} rows keep the planner's plan (their ratios are noise):")
for k in same: print("   ", k)
PY
}
for run in "${runs[@]:1}"; do
  if [[ $run == cap* ]]; then echo "== at most ${run#cap} chunk(s) a request, against the planner's choice"
  else echo "== chunks of ${run#chunk} keys (rounded up to the kernel's tile), against the planner's choice"; fi
  python3 bench/compare.py "$LOG_DIR/cap0.csv" "$LOG_DIR/$run.csv" | sed 's/^[^:]*: //'
  same_plans "$run"
done | tee "$LOG_DIR/split_probe.txt"
