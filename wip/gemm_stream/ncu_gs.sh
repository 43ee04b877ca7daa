set -u
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
bash wip/build.sh /tmp/gs wip/gemm_stream/gemm_stream.cu -lcublasLt -lineinfo || exit 1
for cfg in "o:128:4:1" "o:128:1:1" "lm_head:256:1:1" "o:64:2:1"; do
  IFS=: read -r sh bn sp pk <<< "$cfg"
  GEMM_STREAM_SHAPES=$sh GEMM_STREAM_ONLY="$bn:$sp:$pk" GEMM_STREAM_LT_ALGOS=1 timeout 100 ncu --kernel-name regex:gemm_stream_kernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats /tmp/gs 128 3 > $OUT/ncu_${sh}_${bn}_${sp}.txt 2>&1
  echo "== $cfg"; grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|L1/TEX Cache Throughput|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible" $OUT/ncu_${sh}_${bn}_${sp}.txt | head -14
done
