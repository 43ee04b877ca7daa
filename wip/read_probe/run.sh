#!/usr/bin/env bash
# perf-notes item 254: the paged-read probe in one device call (read_probe.cu says what it runs).
#   run: bash wip/read_probe/run.sh      (CSV and log under $OUT)
#   READ_PROBE_SMALL=1: small_reads.cu instead (item 266: a plain read of 1 MB .. 1 GB in the
#   benchmark's timing), small_reads.csv
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/read-probe-out}
mkdir -p "$OUT"
name=read_probe args=("${READ_PROBE_GB:-4}" "${READ_PROBE_REPS:-9}") limit=60
[ -n "${READ_PROBE_SMALL:-}" ] && name=small_reads args=("${READ_PROBE_REPS:-30}") limit=120
bash wip/build.sh /tmp/$name wip/read_probe/$name.cu > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
timeout $limit /tmp/$name "${args[@]}" | tee "$OUT/$name.csv"
