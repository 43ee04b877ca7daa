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
for cap in 1 2 4; do
  echo "== at most $cap chunk(s) a request, against the planner's choice"
  python3 bench/compare.py "$LOG_DIR/cap0.csv" "$LOG_DIR/cap$cap.csv" | sed 's/^[^:]*: //'
done | tee "$LOG_DIR/split_probe.txt"
