// Which pipe does the softmax's fp32 -> bf16 packing (F2FP.BF16.F32.PACK_AB) share with
// ex2.approx (MUFU.EX2)? Cycles a warp instruction, one warp on each of the 4 SM sub-partitions
// (128 threads, one CTA an SM), 8 independent chains a thread so latency does not bound it.
// Build and run: wip/xu_probe/run.sh (on the GPU machine). docs/perf-notes.md item 294.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

constexpr int kIters = 4096;
constexpr int kChains = 8;

__device__ __forceinline__ float ex2(float x) {
  float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
__device__ __forceinline__ uint32_t pack_cvt(float a, float b) {  // F2FP.BF16.F32.PACK_AB
  uint32_t r; asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a)); return r;
}
__device__ __forceinline__ uint32_t pack_int(float a, float b) {  // round half up by integer add, PRMT
  const uint32_t ua = __float_as_uint(a) + 0x8000u, ub = __float_as_uint(b) + 0x8000u;
  uint32_t r; asm volatile("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(r) : "r"(ua), "r"(ub)); return r;
}

// mode 0: ex2 only; 1: cvt only; 2: ex2 and cvt (1:1); 3: ex2 and cvt (2:1, the softmax's mix);
// 4: int pack only; 5: ex2 and int pack (2:1)
template <int kMode>
__global__ void probe(float* out, long long* cycles, float seed) {
  float x[kChains];
  uint32_t acc = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = seed * (threadIdx.x + c) * 1e-3f;
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if (kMode == 0) x[c] = ex2(x[c]) - 1.0f;
      if (kMode == 1 || kMode == 4) {
        const uint32_t r = kMode == 1 ? pack_cvt(x[c], x[(c + 1) % kChains]) : pack_int(x[c], x[(c + 1) % kChains]);
        x[c] = __uint_as_float(r & 0x3f3f3f3fu);
      }
      if (kMode == 2) { x[c] = ex2(x[c]) - 1.0f; acc ^= pack_cvt(x[c], x[(c + 3) % kChains]); }
      if (kMode == 3 || kMode == 5) {
        x[c] = ex2(x[c]) - 1.0f;
        if (c & 1) acc ^= kMode == 3 ? pack_cvt(x[c], x[c - 1]) : pack_int(x[c], x[c - 1]);
      }
    }
  }
  const long long t1 = clock64();
  float s = __uint_as_float(acc & 0x3f3f3f3fu);
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int kMode>
int run(const char* name, int blocks, float* out, long long* cyc, int per_iter_ex2, int per_iter_pack) {
  probe<kMode><<<blocks, 128>>>(out, cyc, 0.5f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  long long h = 0;
  CK(cudaMemcpy(&h, cyc, sizeof(h), cudaMemcpyDeviceToHost));
  const double per_iter = double(h) / kIters;
  std::printf("%-26s blocks %3d: %7.1f cycles an iteration (%d ex2 + %d pack a thread): %5.2f cycles a warp instruction of the two\n",
              name, blocks, per_iter, per_iter_ex2, per_iter_pack, per_iter / (per_iter_ex2 + per_iter_pack));
  return 0;
}

int main() {
  float* out; long long* cyc;
  CK(cudaMalloc(&out, 132 * 128 * sizeof(float)));
  CK(cudaMalloc(&cyc, 132 * sizeof(long long)));
  for (int blocks : {1, 132}) {
    if (run<0>("ex2", blocks, out, cyc, 8, 0)) return 1;
    if (run<1>("cvt.rn.bf16x2", blocks, out, cyc, 0, 8)) return 1;
    if (run<2>("ex2 + cvt 1:1", blocks, out, cyc, 8, 8)) return 1;
    if (run<3>("ex2 + cvt 2:1", blocks, out, cyc, 8, 4)) return 1;
    if (run<4>("int pack", blocks, out, cyc, 0, 8)) return 1;
    if (run<5>("ex2 + int pack 2:1", blocks, out, cyc, 8, 4)) return 1;
  }
  return 0;
}
