// The median time of a GPU pass after a warm-up: the read ceiling's timing
// (read_bandwidth.cu), and the same for the standalone probes under wip/ that sit beside it.
// Layer: src/kernels (host code; include from .cu or .cc files built with the CUDA runtime).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "prims/cuda_check.h"
#include "prims/median.h"

namespace gqattn::kernels {

// Runs `pass` (which enqueues its work on `stream`) in groups of eight for at least `warmup_ms`,
// so that the timed passes do not meet a GPU still raising its clocks from idle (a ceiling
// measured after one warm-up pass ranged 3944-4541 GB/s: docs/perf-notes.md, item 15). Then it
// times `reps` single passes with events and returns their median in milliseconds. Synchronises.
template <typename Pass>
float median_ms_after_warmup(Pass&& pass, int reps, cudaStream_t stream, float warmup_ms = 100.f) {
  cudaEvent_t start, stop;
  GQ_CUDA_CHECK(cudaEventCreate(&start));
  GQ_CUDA_CHECK(cudaEventCreate(&stop));
  GQ_CUDA_CHECK(cudaEventRecord(start, stream));
  for (float warm = 0; warm < warmup_ms;) {
    for (int i = 0; i < 8; ++i) pass();
    GQ_CUDA_CHECK(cudaEventRecord(stop, stream));
    GQ_CUDA_CHECK(cudaEventSynchronize(stop));
    GQ_CUDA_CHECK(cudaEventElapsedTime(&warm, start, stop));
  }
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    GQ_CUDA_CHECK(cudaEventRecord(start, stream));
    pass();
    GQ_CUDA_CHECK(cudaEventRecord(stop, stream));
    GQ_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    GQ_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return float(prims::median_of(std::vector<double>(ms.begin(), ms.end())));
}

}  // namespace gqattn::kernels
