#!/usr/bin/env bash
# perf-notes item 254: the paged-read probe in one device call (read_probe.cu says what it runs).
#   run: bash wip/read_probe/run.sh      (CSV and log under $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/read-probe-out}
mkdir -p "$OUT"
bash wip/build.sh /tmp/read_probe wip/read_probe/read_probe.cu > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
timeout 60 /tmp/read_probe "${READ_PROBE_GB:-4}" "${READ_PROBE_REPS:-9}" | tee "$OUT/read_probe.csv"
