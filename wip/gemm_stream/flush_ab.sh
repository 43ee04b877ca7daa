#!/usr/bin/env bash
# Item 253: gemm_stream's L2 flush with ordinary loads (the engine tuner's) against evict-first
# loads (GEMM_STREAM_FLUSH=streaming, the flush of items 238-251), in ABBA order on one machine.
#   run: bash wip/gemm_stream/flush_ab.sh      (logs and CSVs under $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm-stream-out}
export GEMM_STREAM_CLUSTERS=1 GEMM_STREAM_PLANES=1 GEMM_STREAM_PACKED=0 GEMM_STREAM_SHAPES=o,qkv_mqa,qkv_gqa8,down,gate_up
mkdir -p "$OUT/normal"
OUT=$OUT/normal bash wip/gemm_stream/gemm_stream.sh > "$OUT/normal/run.log" 2>&1; echo "gemm_stream.sh rc $?"
cp "$OUT/normal/gemm_n128.csv" "$OUT/ab1_normal.csv"
i=2
for mode in streaming streaming normal; do
  if [[ $mode == streaming ]]; then GEMM_STREAM_FLUSH=streaming timeout 100 /tmp/gemm_stream 128 15 > "$OUT/ab${i}_$mode.csv" 2>&1
  else timeout 100 /tmp/gemm_stream 128 15 > "$OUT/ab${i}_$mode.csv" 2>&1; fi
  i=$((i + 1))
done
# Per shape and run: cuBLASLt's time and the best stream variant's (us, column 13).
for f in "$OUT"/ab*.csv; do
  awk -F, -v f="$(basename "$f" .csv)" '
    $5 ~ /^cublaslt/ { lt[$1] = $13 }
    $5 == "stream" && (!($1 in best) || $13 + 0 < best[$1] + 0) { best[$1] = $13 }
    END { for (s in lt) printf "%-14s %-9s cublaslt %7.2f us  stream best %7.2f us\n", f, s, lt[s], best[s] }' "$f" | sort -k2
done
