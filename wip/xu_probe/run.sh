#!/usr/bin/env bash
# Builds and runs xu_probe.cu on the GPU machine (sm_90a), then dumps its SASS mix per kernel.
set -euo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o "$out/xu_probe" xu_probe.cu
"$out/xu_probe" | tee "$out/xu_probe.txt"
cuobjdump -sass "$out/xu_probe" | grep -oE '(MUFU\.EX2|F2FP\.[A-Z0-9_.]+|PRMT|IADD3|VIADD)' | sort | uniq -c >> "$out/xu_probe.txt" || true
rm -f "$out/xu_probe"
