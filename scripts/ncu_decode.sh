#!/usr/bin/env bash
# ncu on single decode cases: one launch of the attention kernel per case (the sixth, NCU_SKIP, after the bench's
# warm-up), with the sections that say why a streaming kernel is below the read ceiling (DRAM
# throughput, occupancy, warp stalls, shared-memory conflicts). Clocks are left alone. The bench's
# arena is capped (NCU_ARENA_GIB, default 8): profiling failed with the arena of the whole card,
# probably as replay saves the memory a kernel can reach (session 6); a case needs its K/V bytes.
# Usage: LOG_DIR=dir scripts/ncu_decode.sh path/to/gqattn-bench "SWEEP_ROW" ["SWEEP_ROW" ...]
#   SWEEP_ROW as in bench/sweeps/decode.csv, e.g. "decode,bf16,32,1,128,16,128,1,32768,1"
#   (prefill rows too, with NCU_KERNEL=attention_sm90_kernel for the Hopper prefill kernel)
# Writes LOG_DIR/ncu_<n>.txt (full details) and prints a few lines per case. NCU_SASS=1: the full
# set with the source view instead, and LOG_DIR/ncu_<n>_sass.csv, each SASS instruction's
# warp-state samples, for scripts/ncu_sass_diff.py (docs/perf-notes.md, item 48).
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=$1; shift
LOG_DIR=${LOG_DIR:-/tmp}; mkdir -p "$LOG_DIR"
header=$(head -1 bench/sweeps/decode.csv)
STALLS=smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio
n=0
for row in "$@"; do
  n=$((n + 1))
  printf '%s\n' "$header" "$row" > "$LOG_DIR/ncu_case_$n.csv"
  if [ "${NCU_SASS:-0}" = 1 ]; then
    what=(--set full --import-source yes -f -o "$LOG_DIR/ncu_rep_$n")
  else
    what=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --print-details all)
  fi
  GQATTN_BENCH_ARENA_GIB=${NCU_ARENA_GIB:-8} timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none --graph-profiling node \
    --kernel-name "regex:${NCU_KERNEL:-attention_kernel}" --launch-skip "${NCU_SKIP:-5}" --launch-count 1 \
    "${what[@]}" --metrics "$STALLS" \
    "$BENCH" --device cuda --sweep "$LOG_DIR/ncu_case_$n.csv" --iters 10 > "$LOG_DIR/ncu_$n.txt" 2>&1
  if [ "${NCU_SASS:-0}" = 1 ]; then
    ncu -i "$LOG_DIR/ncu_rep_$n.ncu-rep" --page details --print-details all > "$LOG_DIR/ncu_$n.txt" 2>&1
    ncu -i "$LOG_DIR/ncu_rep_$n.ncu-rep" --page source --csv --print-source sass > "$LOG_DIR/ncu_${n}_sass.csv" 2>&1
    rm -f "$LOG_DIR/ncu_rep_$n.ncu-rep"
  fi
  echo "== $row"
  grep -E "attention_kernel|^ +(Duration|DRAM Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit (Registers|Shared Mem)|Grid Size|Eligible Warps Per Scheduler|No Eligible|Warp Cycles Per Issued Instruction|Stall [A-Za-z ]+) " \
    "$LOG_DIR/ncu_$n.txt" | head -30
  grep -E "issue_stalled|[Bb]ank" "$LOG_DIR/ncu_$n.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -16
done
