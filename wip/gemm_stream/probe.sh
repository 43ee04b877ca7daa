# The W-only and X-only timing probes (GEMM_STREAM_PROBE=1 / 2) beside the product, packed variants.
set -u
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
bash wip/build.sh /tmp/gs wip/gemm_stream/gemm_stream.cu -lcublasLt || exit 1
for pr in 0 1 2; do GEMM_STREAM_LT_ALGOS=4 GEMM_STREAM_PROBE=$pr timeout 120 /tmp/gs 128 9 > $OUT/probe$pr.csv 2>&1; done
for pr in 0 1 2; do
  echo "== probe $pr (0 product, 1 W only, 2 X only): best packed variant a shape, and bn128 x1 / x4"
  awk -F, '$5=="stream" && $9==1 {k=$1; if (!(k in b) || $13+0 < b[k]+0) {b[k]=$13; v[k]=$6"x"$8}} $5=="stream" && $9==1 && $6==128 && ($8==1||$8==4) {e[$1]=e[$1]" bn128x"$8" "$13} END {for (k in b) print k, "best", b[k], v[k], e[k]}' $OUT/probe$pr.csv | sort
done
