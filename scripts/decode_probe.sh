#!/usr/bin/env bash
# The single-case decode checks of docs/perf-notes.md, run with one gqattn-bench binary:
#   MQA decode with 4 draft tokens at batch 1 x 32K (item 10: one CTA before the fix), then the
#   open question of item 12 (split configs ~10% slower inside the sweep than alone): three cases
#   alone, as a three-row sweep, and after the hd128 decode sweep's first 40 rows; each row prints
#   its plan. Writes probe_{single,sweep,after}.txt under $LOG_DIR and prints them.
# Usage: LOG_DIR=dir scripts/decode_probe.sh path/to/gqattn-bench
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=${1:-build-gpu/gqattn-bench}
LOG_DIR=${LOG_DIR:-/tmp}; mkdir -p "$LOG_DIR"
# The cases, once: MQA with 4 draft tokens first (alone only), then the three of item 12.
header=$(head -1 bench/sweeps/decode.csv)
cases=("decode,bf16,32,1,128,16,1,4,32768,1" "decode,bf16,32,8,128,16,1,1,32768,1"
       "decode,bf16,32,8,128,16,32,1,8192,1" "decode,bf16,32,4,128,16,32,1,32768,1")
probe=$LOG_DIR/probe.csv
printf '%s\n' "$header" "${cases[@]:1}" > "$probe"
for c in "${cases[@]}"; do  # each alone, in its own process (with the read ceiling it measured)
  printf '%s\n' "$header" "$c" > "$LOG_DIR/probe_one.csv"
  "$BENCH" --device cuda --sweep "$LOG_DIR/probe_one.csv" --iters 20 2>&1 | grep -E "^decode|^ceiling +read"
done > "$LOG_DIR/probe_single.txt"
"$BENCH" --device cuda --sweep "$probe" --iters 20 2>&1 | grep "^decode" > "$LOG_DIR/probe_sweep.txt"
{ head -41 bench/sweeps/decode.csv; tail -n +2 "$probe"; } > "$LOG_DIR/probe_after.csv"
"$BENCH" --device cuda --sweep "$LOG_DIR/probe_after.csv" --iters 20 2>&1 | grep "^decode" |
  tail -3 > "$LOG_DIR/probe_after.txt"
cat "$LOG_DIR"/probe_{single,sweep,after}.txt
