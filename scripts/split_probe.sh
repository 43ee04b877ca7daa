#!/usr/bin/env bash
# The planner's split-KV choice against capped ones, on one binary: the rows of a sweep file run
# with the planner's own choice (--max-splits 0) and with at most 1, 2 and 4 chunks a request,
# each cap a process of its own (the same rows in the same order), then `compare.py` of each cap
# against the planner's run (a ratio > 1: the cap was faster, so the planner split too much).
# The runs' logs name every row's plan (chunk, items). Costs about 15 s a cap for 17 rows.
# Usage (on the GPU machine): LOG_DIR=dir scripts/split_probe.sh path/to/gqattn-bench
#   [bench/sweeps/ab/decode_cudnn_gap_hd128.csv]
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=${1:-build-gpu/gqattn-bench}
SWEEP=${2:-bench/sweeps/ab/decode_cudnn_gap_hd128.csv}
LOG_DIR=${LOG_DIR:-/tmp/split-probe}; mkdir -p "$LOG_DIR"
for cap in 0 1 2 4; do
  "$BENCH" --device cuda --sweep "$SWEEP" --iters 20 --max-splits "$cap" --csv "$LOG_DIR/cap$cap.csv" \
    > "$LOG_DIR/cap$cap.log" 2>&1 || { echo "split_probe: cap $cap failed (see $LOG_DIR/cap$cap.log)"; exit 1; }
done
# Rows whose capped plan is the planner's own (the same chunk and items) measure only the noise
# between two processes: session 19 read 0.98-1.07x on such rows as wins (perf-notes item 108).
same_plans() {  # same_plans CAP: the rows of capCAP.log whose plan equals cap0.log's
  python3 - "$LOG_DIR/cap0.log" "$LOG_DIR/cap$1.log" <<'PY'
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
for cap in 1 2 4; do
  echo "== at most $cap chunk(s) a request, against the planner's choice"
  python3 bench/compare.py "$LOG_DIR/cap0.csv" "$LOG_DIR/cap$cap.csv" | sed 's/^[^:]*: //'
  same_plans "$cap"
done | tee "$LOG_DIR/split_probe.txt"
