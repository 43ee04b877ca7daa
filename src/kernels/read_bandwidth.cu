// The streaming-read ceiling: device memory read with 16-byte loads, several in flight per
// thread, timed with events. Shared by gqattn-bench (the decode ceiling) and gqattn-serve (the
// end-to-end floor). Layer: src/kernels (kernel + host function).
#include <cuda_runtime.h>

#include <memory>

#include "kernels/launch.h"
#include "kernels/median_time.h"
#include "prims/cuda_check.h"

namespace gqattn::kernels {
namespace {

constexpr int kReadThreads = 512;
constexpr int kReadBlocksPerSm = 8;
constexpr unsigned kSinkSentinel = 0x12345678u;

// XOR of 16-byte words, four loads in flight per thread; kStreaming: __ldcs (no reuse: the
// ceiling), else plain loads whose lines stay in the L2 (a flush of what was there before).
template <bool kStreaming>
__global__ void read_kernel(const uint4* data, int64_t n, unsigned* sink) {
  constexpr int kUnroll = 4;
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = kStreaming ? __ldcs(data + i + u * stride) : data[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == kSinkSentinel) *sink = acc;  // keeps the loads alive
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

}  // namespace

void launch_read(const void* data, size_t bytes, unsigned* sink, bool streaming, void* stream) {
  int device = 0, sms = 0;
  GQ_CUDA_CHECK(cudaGetDevice(&device));
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto kernel = streaming ? read_kernel<true> : read_kernel<false>;
  kernel<<<sms * kReadBlocksPerSm, kReadThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(data), int64_t(bytes / sizeof(uint4)), sink);
  GQ_CUDA_CHECK(cudaGetLastError());
}

double measure_read_bandwidth_gbps(size_t bytes, int reps, void* stream) {
  GQ_CHECK(bytes >= 16 && reps >= 1, "measure_read_bandwidth_gbps: bytes (", bytes, ") and reps (", reps,
           ") must be positive");
  auto s = static_cast<cudaStream_t>(stream);
  void* raw = nullptr;
  GQ_CUDA_CHECK(cudaMalloc(&raw, bytes + 16));
  std::unique_ptr<void, CudaFree> buf(raw);
  unsigned* sink = reinterpret_cast<unsigned*>(static_cast<char*>(raw) + bytes);
  GQ_CUDA_CHECK(cudaMemsetAsync(raw, 0x5A, bytes, s));  // non-zero data
  const float ms = median_ms_after_warmup(
      [&] { launch_read(raw, bytes, sink, /*streaming=*/true, stream); }, reps, s);
  return double(bytes) / (double(ms) * 1e-3) / 1e9;
}

}  // namespace gqattn::kernels
