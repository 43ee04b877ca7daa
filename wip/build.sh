#!/usr/bin/env bash
# Builds one of the standalone experiments under wip/ (sm_90a) with the library's read kernel
# (src/kernels/read_bandwidth.cu: the L2 flush and the read ceiling), for gemm_stream.sh, probe.sh,
# ncu_gs.sh and read_probe/run.sh.
#   usage: bash wip/build.sh BIN SOURCE.cu [NVCC_FLAGS_AND_LIBS...]      (from the repository root)
set -uo pipefail
bin=${1:?usage: build.sh BIN SOURCE.cu [NVCC_FLAGS...]}
src=${2:?usage: build.sh BIN SOURCE.cu [NVCC_FLAGS...]}
shift 2
nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc "$@" -o "$bin" \
  "$src" src/kernels/read_bandwidth.cu
