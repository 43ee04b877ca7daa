#!/usr/bin/env bash
# Builds gemm_stream.cu (sm_90a) with the library's read kernel (src/kernels/read_bandwidth.cu: the
# L2 flush and the read ceiling), for gemm_stream.sh, probe.sh and ncu_gs.sh.
#   usage: bash wip/gemm_stream/build.sh BIN [NVCC_FLAGS...]      (from the repository root)
set -uo pipefail
bin=${1:?usage: build.sh BIN [NVCC_FLAGS...]}
shift
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc "$@" -o "$bin" \
  wip/gemm_stream/gemm_stream.cu src/kernels/read_bandwidth.cu -lcublasLt
