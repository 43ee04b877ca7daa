#!/usr/bin/env bash
# Per-instruction warp-state samples of one launch of a kernel (ncu --set full with the source
# view), exported as CSV for scripts/ncu_sass_diff.py: where a case spends its time, instruction by
# instruction, against another case of the same kernel binary (docs/perf-notes.md, item 48).
# Usage: scripts/ncu_sass.sh path/to/gqattn-bench "SWEEP_ROW" out.csv
#   SWEEP_ROW as in bench/sweeps/*.csv; NCU_KERNEL (default attention_sm90_kernel), NCU_SKIP (5),
#   NCU_ARENA_GIB (8: the bench's arena; profiling failed with the whole card, item 22).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { sed -n 2,7p "$0"; exit 2; }
BENCH=$1 ROW=$2 CSV=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf '%s\n' "$(head -1 bench/sweeps/prefill.csv)" "$ROW" > "$tmp/case.csv"
GQATTN_BENCH_ARENA_GIB=${NCU_ARENA_GIB:-8} timeout "${NCU_TIMEOUT:-200}" ncu --clock-control none --graph-profiling node \
  --kernel-name "regex:${NCU_KERNEL:-attention_sm90_kernel}" --launch-skip "${NCU_SKIP:-5}" --launch-count 1 \
  --set full --import-source yes -o "$tmp/rep" "$BENCH" --device cuda --sweep "$tmp/case.csv" --iters 10 \
  > "$tmp/ncu.log" 2>&1 || { tail -20 "$tmp/ncu.log"; exit 1; }
ncu -i "$tmp/rep.ncu-rep" --page source --csv --print-source sass > "$CSV" || exit 1
ncu -i "$tmp/rep.ncu-rep" --page details > "${CSV%.csv}_details.txt" 2>&1
echo "== $ROW"
grep -E "^ +(Duration|Compute \(SM\) Throughput|DRAM Throughput|Registers Per Thread|Warp Cycles Per Issued|Issue Slots Busy)" \
  "${CSV%.csv}_details.txt" | head -8
