// How long does a plain read of S bytes take in the benchmark's own timing? (perf-notes item 266.)
// Issue 3 asks every decode row to take no longer than max(K/V bytes / 4.2 TB/s, 12 us). This
// probe times the benchmarks' streaming-read kernel (src/kernels/read_bandwidth.cu: 16-byte
// evict-first loads, 8 CTAs of 512 threads an SM) on S bytes, the way gqattn-bench times a decode
// case: buffer sets rotated past the L2 (at most 8, >= 240 MB in all), each timed launch after a
// 200 us spin kernel, CUDA events around the launch, median of the reps. A read needs no page
// table, no Q, no softmax and no merge, so its time is a lower bound for any decode kernel of
// S bytes of K/V timed this way.
//   build: bash wip/build.sh /tmp/small_reads wip/read_probe/small_reads.cu
//   run:   /tmp/small_reads [REPS=30]     (CSV on stdout)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/launch.h"
#include "prims/cuda_check.h"

namespace {

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  constexpr size_t kMB = size_t(1) << 20;
  constexpr size_t kRotate = 240 * kMB;  // as gqattn-bench: 4x the H200's L2
  constexpr int kMaxSets = 8;
  cudaDeviceProp prop{};
  GQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int khz = 0;
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const long long spin = 200LL * khz / 1000;  // 200 us of the SM clock
  cudaStream_t stream;
  GQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  GQ_CUDA_CHECK(cudaEventCreate(&start));
  GQ_CUDA_CHECK(cudaEventCreate(&stop));
  unsigned* sink = nullptr;
  GQ_CUDA_CHECK(cudaMalloc(&sink, 16));
  std::printf("# device %s, %d SMs; median of %d reps, each after a 200 us spin; sets rotated past %zu MB\n",
              prop.name, prop.multiProcessorCount, reps, kRotate / kMB);
  std::printf("megabytes,sets,median_us,GBps,floor_rule_us\n");
  for (size_t mb : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024}) {
    const size_t bytes = mb * kMB;
    const int sets = int(std::min<size_t>(kMaxSets, std::max<size_t>(1, (kRotate + bytes - 1) / bytes)));
    char* base = nullptr;
    GQ_CUDA_CHECK(cudaMalloc(&base, bytes * sets));
    GQ_CUDA_CHECK(cudaMemsetAsync(base, 0x5A, bytes * sets, stream));  // non-zero data
    for (int i = 0; i < 2 * sets; ++i) gqattn::kernels::launch_read(base + (i % sets) * bytes, bytes, sink, true, stream);
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) {
      spin_kernel<<<1, 1, 0, stream>>>(spin);
      GQ_CUDA_CHECK(cudaGetLastError());
      GQ_CUDA_CHECK(cudaEventRecord(start, stream));
      gqattn::kernels::launch_read(base + (i % sets) * bytes, bytes, sink, true, stream);
      GQ_CUDA_CHECK(cudaEventRecord(stop, stream));
      GQ_CUDA_CHECK(cudaEventSynchronize(stop));
      GQ_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
    }
    std::sort(ms.begin(), ms.end());
    const double us = 1e3 * (reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]));
    const double floor_us = std::max(double(bytes) / 4.2e12 * 1e6, 12.0);
    std::printf("%zu,%d,%.2f,%.0f,%.2f\n", mb, sets, us, double(bytes) / (us * 1e-6) / 1e9, floor_us);
    GQ_CUDA_CHECK(cudaFree(base));
  }
  GQ_CUDA_CHECK(cudaFree(sink));
  GQ_CUDA_CHECK(cudaEventDestroy(start));
  GQ_CUDA_CHECK(cudaEventDestroy(stop));
  GQ_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
