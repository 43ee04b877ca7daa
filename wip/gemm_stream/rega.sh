#!/usr/bin/env bash
# Item 275 in one device call: the rega kernel (W straight into registers) beside the stream kernel
# and cuBLASLt on the engine's five layer GEMMs at 128 tokens, twice (the second run a separate
# process), the 77-token check and memcheck (gemm_stream.sh), then rega's W loads alone
# (GEMM_STREAM_PROBE=1: timing only, its values are meaningless and not checked).
#   run: OUT=$OUT bash wip/gemm_stream/rega.sh       (~2-3 min on an H100)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm-stream-out}
mkdir -p "$OUT"
export GEMM_STREAM_CLUSTERS=1 GEMM_STREAM_PLANES=1 GEMM_STREAM_PACKED=0 GEMM_STREAM_SHAPES=o,qkv_mqa,qkv_gqa8,down,gate_up
OUT=$OUT bash wip/gemm_stream/gemm_stream.sh > "$OUT/run.log" 2>&1
echo "gemm_stream.sh rc $?"
cat "$OUT/run.log"
timeout 150 /tmp/gemm_stream 128 15 > "$OUT/gemm_n128_b.csv" 2>&1; echo "second run rc $?"
GEMM_STREAM_KERNELS=rega GEMM_STREAM_PROBE=1 timeout 100 /tmp/gemm_stream 128 9 > "$OUT/rega_probe_w.csv" 2>&1
echo "probe rc $?"
# Per shape and run: cuBLASLt, the best stream and the best rega variant (us, column 13).
for f in "$OUT"/gemm_n128.csv "$OUT"/gemm_n128_b.csv "$OUT"/rega_probe_w.csv; do
  awk -F, -v f="$(basename "$f" .csv)" '
    $5 ~ /^cublaslt/ { lt[$1] = $13 }
    $5 == "stream" && (!($1 in bs) || $13 + 0 < bs[$1] + 0) { bs[$1] = $13 }
    $5 ~ /^rega/ && (!($1 in br) || $13 + 0 < br[$1] + 0) { br[$1] = $13; vr[$1] = $5 " x" $8 }
    END { for (s in lt) printf "%-16s %-9s cublaslt %7.2f  stream %7.2f  rega %7.2f (%s)\n", f, s, lt[s], bs[s], br[s], vr[s] }' "$f" | sort -k2
done
# The checked runs only: the probe's rows are WRONG by design.
grep -h "WRONG\|NOT-REP\|failures" "$OUT"/gemm_n*.csv | sort | uniq -c
