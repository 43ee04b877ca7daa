// The CUDA compute device: cuBLASLt bf16 GEMMs with fp32 compute (algorithms autotuned per shape),
// the engine's small fused kernels (embedding gather, residual add + RMSNorm, RoPE, SwiGLU, row
// gather, argmax, K/V expansion, random weights; 16-byte accesses where rows allow), a streaming
// read for the bandwidth ceiling, and CUDA-graph capture/replay.
// Layer: engine (kernels + host launchers). Every CUDA and cuBLAS call is checked.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "compute.h"
#include "api/env_flag.h"
#include "kernels/launch.h"
#include "kernels/paged_slot.cuh"
#include "gqattn/error.h"
#include "prims/cuda_check.h"
#include "random.h"

#define GQ_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                          \
    const cublasStatus_t gq_blas_status_ = (call);                                              \
    if (gq_blas_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      throw ::gqattn::Error(::gqattn::detail::concat("cuBLAS error in ", #call, ": ",           \
                                                     cublasLtGetStatusString(gq_blas_status_))); \
  } while (0)

namespace gqattn::engine {

namespace {

constexpr int kThreads = 256;
constexpr int kArgmaxThreads = 1024;
constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
// bf16 values in one 16-byte access (fp32: two accesses).
constexpr int kVecElems = 8;
constexpr int kVecBytes = 16;
// add_rmsnorm's block: about this many 8-value chunks per thread (Llama's 4096: 256 threads x 2),
// up to kMaxRmsnormChunks (hidden <= 1024 x 4 x 8 = 32768 on the vector path; beyond, 64
// registers a thread cannot hold the row).
constexpr int kRmsnormChunksPerThread = 2;
constexpr int kMaxRmsnormChunks = 4;
// rope's flat grid: 128-thread blocks spread 128 tokens x 40 heads x 8 groups over all SMs.
constexpr int kRopeThreads = 128;
// embed's block (one per token) and gather_rows' (one per row).
constexpr int kRowCopyThreads = 256;
// cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper); given explicitly so that graph capture
// never makes cuBLASLt allocate.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
// GEMM autotuning (see GemmPlans): candidates asked of the heuristic, token counts tuned (decode
// buckets and short prefill chunks; longer ones take the heuristic's first algorithm), timed
// runs per candidate after one warm-up (the median counts), the L2 flush (a read of
// kL2FlushFactor x the L2 before each timed run, so weights stream from HBM as they do in a
// decode step), and the slack within which a candidate without split-K is preferred to a faster
// one with it.
constexpr int kGemmCandidates = 16;
constexpr int kGemmTuneMaxRows = 256;
constexpr int kGemmTuneReps = 7;
constexpr int kL2FlushFactor = 2;
constexpr float kSplitKSlack = 1.02f;
// The search of gemm_variants (GQATTN_DISABLE_ENGINE_GEMM_SEARCH=1: none): split-K counts tried on
// each heuristic candidate, the most variants a shape, and the timed rounds each before the
// fastest kGemmCandidates join the heuristic's candidates.
constexpr int32_t kGemmSearchSplits[] = {1, 2, 3, 4, 6, 8};
constexpr int kGemmSearchMax = 256;
constexpr int kGemmSearchReps = 3;
// The streaming read: far past the 60 MB L2, median of several passes.
constexpr size_t kBandwidthBytes = size_t(4) << 30;
constexpr int kBandwidthReps = 10;

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  const __nv_bfloat16 b = __float2bfloat16_rn(f);
  return *reinterpret_cast<const uint16_t*>(&b);
}

unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), int64_t(1) << 20));
}

// Block-wide sum over a block of whole warps (at most 32). Only warp 0 reads the partial sums:
// another warp reading partial[0] would race with warp 0's write of the total there.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    v = lane < warps ? partial[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  const float total = partial[0];
  __syncthreads();
  return total;
}

__global__ void fill_random_kernel(uint16_t* p, int64_t n, uint64_t seed, uint64_t tensor_id, float half_width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = float_to_bf16_bits(random_weight(seed, tensor_id, uint64_t(i), half_width));
}

__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, float value) {
  const uint16_t bits = float_to_bf16_bits(value);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = bits;
}

__global__ void fill_fp32_kernel(float* p, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = value;
}

// ---- 16-byte vectors ----------------------------------------------------------------------
// The elementwise kernels move 16 bytes per access (8 bf16 or 4 fp32) where the row length,
// pointers and row strides allow it; each has a scalar kernel for the rows that do not.

__device__ __forceinline__ void unpack_bf16x8(const uint4 v, float (&f)[kVecElems]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);              // the lower address holds the low half
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[kVecElems]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = uint32_t(float_to_bf16_bits(f[2 * i])) | (uint32_t(float_to_bf16_bits(f[2 * i + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One block per token. An id outside the vocabulary yields a zero row (the host validates ids).
__global__ void embed_kernel(const int32_t* token_ids, const uint16_t* table, int64_t table_stride, int vocab,
                             int hidden, float* residual, int64_t residual_stride) {
  const int i = blockIdx.x;
  const int tok = token_ids[i];
  const bool valid = tok >= 0 && tok < vocab;
  const uint16_t* row = table + (valid ? int64_t(tok) * table_stride : 0);
  float* out = residual + int64_t(i) * residual_stride;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) out[j] = valid ? bf16_bits_to_float(row[j]) : 0.f;
}

// embed_kernel with 16-byte accesses: hidden % 8 == 0, rows 16-byte aligned.
__global__ void embed_vec_kernel(const int32_t* token_ids, const uint16_t* table, int64_t table_stride, int vocab,
                                 int hidden, float* residual, int64_t residual_stride) {
  const int i = blockIdx.x;
  const int tok = token_ids[i];
  const bool valid = tok >= 0 && tok < vocab;
  const uint4* row = reinterpret_cast<const uint4*>(table + (valid ? int64_t(tok) * table_stride : 0));
  float4* out = reinterpret_cast<float4*>(residual + int64_t(i) * residual_stride);
  const int chunks = hidden / kVecElems;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[kVecElems] = {};
    if (valid) unpack_bf16x8(row[c], v);
    out[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
    out[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// One block per token: residual += delta; out = residual * rsqrt(mean(residual^2) + eps) * weight.
// The scalar path (any hidden size and alignment); re-reads the residual row for the output.
__global__ void add_rmsnorm_kernel(float* residual, int64_t residual_stride, const uint16_t* delta,
                                   int64_t delta_stride, const uint16_t* weight, float eps, uint16_t* out,
                                   int64_t out_stride, int hidden) {
  float* r = residual + int64_t(blockIdx.x) * residual_stride;
  const uint16_t* d = delta != nullptr ? delta + int64_t(blockIdx.x) * delta_stride : nullptr;
  float sum_sq = 0.f;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
    float v = r[j];
    if (d != nullptr) {
      v += bf16_bits_to_float(d[j]);
      r[j] = v;
    }
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / float(hidden) + eps);
  uint16_t* o = out + int64_t(blockIdx.x) * out_stride;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x)
    o[j] = float_to_bf16_bits(r[j] * inv_rms * bf16_bits_to_float(weight[j]));
}

// add_rmsnorm_kernel with 16-byte accesses (hidden % 8 == 0, rows 16-byte aligned): one block per
// token, thread t holding chunks t, t + blockDim.x, ... (at most kChunks of 8 values) in registers
// from the load to the store, so the row is read once. blockDim.x is a multiple of 32. Every load
// (residual, delta, weight) is issued before the first use, so a block keeps its whole row in
// flight (the weight, for kChunks <= 2). The per-element math is the scalar kernel's; only the
// order of the sum of squares differs.
template <int kChunks>
__global__ void __launch_bounds__(kMaxBlockThreads) add_rmsnorm_vec_kernel(
    float* residual, int64_t residual_stride, const uint16_t* delta, int64_t delta_stride, const uint16_t* weight,
    float eps, uint16_t* out, int64_t out_stride, int hidden) {
  const int chunks = hidden / kVecElems;
  float4* r = reinterpret_cast<float4*>(residual + int64_t(blockIdx.x) * residual_stride);
  const uint4* d = delta != nullptr ? reinterpret_cast<const uint4*>(delta + int64_t(blockIdx.x) * delta_stride) : nullptr;
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  // The weight chunks wait in registers through the reduction where 64 registers allow it.
  constexpr bool kPreloadWeight = kChunks <= 2;
  float4 r_raw[kChunks][2];
  uint4 d_raw[kChunks], w_raw[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      r_raw[i][0] = r[2 * c];
      r_raw[i][1] = r[2 * c + 1];
      if (d != nullptr) d_raw[i] = __ldg(d + c);
      if (kPreloadWeight) w_raw[i] = __ldg(w + c);
    }
  }
  float v[kChunks][kVecElems];
  float sum_sq = 0.f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      v[i][0] = r_raw[i][0].x, v[i][1] = r_raw[i][0].y, v[i][2] = r_raw[i][0].z, v[i][3] = r_raw[i][0].w;
      v[i][4] = r_raw[i][1].x, v[i][5] = r_raw[i][1].y, v[i][6] = r_raw[i][1].z, v[i][7] = r_raw[i][1].w;
      if (d != nullptr) {
        float dv[kVecElems];
        unpack_bf16x8(d_raw[i], dv);
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) v[i][e] += dv[e];
        r[2 * c] = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
        r[2 * c + 1] = make_float4(v[i][4], v[i][5], v[i][6], v[i][7]);
      }
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) sum_sq += v[i][e] * v[i][e];
    }
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / float(hidden) + eps);
  uint4* o = reinterpret_cast<uint4*>(out + int64_t(blockIdx.x) * out_stride);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      float wv[kVecElems], ov[kVecElems];
      unpack_bf16x8(kPreloadWeight ? w_raw[i] : __ldg(w + c), wv);
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) ov[e] = v[i][e] * inv_rms * wv[e];
      o[c] = pack_bf16x8(ov);
    }
  }
}

// One block per token; threads over (head, pair) of q's heads then k's. The scalar path.
__global__ void rope_kernel(uint16_t* q, int64_t q_stride, int q_heads, uint16_t* k, int64_t k_stride,
                            int k_heads, int head_dim, const int32_t* positions, const float* inv_freq) {
  const int i = blockIdx.x;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[i]);
  for (int idx = threadIdx.x; idx < (q_heads + k_heads) * half; idx += blockDim.x) {
    const int h = idx / half, j = idx % half;
    uint16_t* x = h < q_heads ? q + int64_t(i) * q_stride + int64_t(h) * head_dim
                              : k + int64_t(i) * k_stride + int64_t(h - q_heads) * head_dim;
    float s, c;
    sincosf(pos * inv_freq[j], &s, &c);
    const float x1 = bf16_bits_to_float(x[j]), x2 = bf16_bits_to_float(x[j + half]);
    x[j] = float_to_bf16_bits(x1 * c - x2 * s);
    x[j + half] = float_to_bf16_bits(x2 * c + x1 * s);
  }
}

// rope_kernel with 16-byte accesses (head_dim % 16 == 0, rows and inv_freq 16-byte aligned): one
// thread per (token, head, group of 8 rotary pairs) over a flat grid of total < 2^31 items; it
// loads x[j..j+7] and x[j+half..j+half+7] and rotates them with the scalar kernel's math. With a
// store, the heads run on past q's and k's over v's: a k thread also writes its rotated halves at
// the token's slot, a v thread copies its halves there (one kernel instead of rope + append_kv;
// `store` holds append_kv's parameters, null k_pages when there is no store).
__global__ void rope_vec_kernel(uint16_t* q, int64_t q_stride, int q_heads, uint16_t* k, int64_t k_stride,
                                int k_heads, int head_dim, const int32_t* positions, const float* inv_freq,
                                int total, const kernels::AppendKVParams store) {
  const unsigned flat = blockIdx.x * blockDim.x + threadIdx.x;  // < total + blockDim.x <= 2^31 + 1024
  if (flat >= unsigned(total)) return;
  const int idx = int(flat);
  const int half = head_dim / 2;
  const int groups = half / kVecElems;
  const int v_heads = store.k_pages != nullptr ? k_heads : 0;
  const int per_token = (q_heads + k_heads + v_heads) * groups;
  const int i = idx / per_token;
  const int rest = idx - i * per_token;
  const int h = rest / groups;
  const int j = (rest - h * groups) * kVecElems;
  // The token's slot in the pools (k and v heads of a store only).
  int64_t slot = -1;
  if (h >= q_heads && v_heads > 0) {
    slot = kernels::paged_slot(store.kv_page_indptr, store.kv_page_indices, __ldg(store.batch_indices + i),
                               __ldg(positions + i), store.page, store.page_stride, store.token_stride);
  }
  if (h >= q_heads + k_heads) {  // v: copied, not rotated
    if (slot < 0) return;
    const int hv = h - q_heads - k_heads;
    const uint16_t* src = static_cast<const uint16_t*>(store.v_new) + int64_t(i) * store.new_stride_n +
                          int64_t(hv) * store.new_stride_h;
    uint16_t* dst = static_cast<uint16_t*>(store.v_pages) + slot + int64_t(hv) * store.head_stride;
    *reinterpret_cast<uint4*>(dst + j) = *reinterpret_cast<const uint4*>(src + j);
    *reinterpret_cast<uint4*>(dst + j + half) = *reinterpret_cast<const uint4*>(src + j + half);
    return;
  }
  uint16_t* x = h < q_heads ? q + int64_t(i) * q_stride + int64_t(h) * head_dim
                            : k + int64_t(i) * k_stride + int64_t(h - q_heads) * head_dim;
  const float pos = static_cast<float>(__ldg(positions + i));
  const float4 f_lo = __ldg(reinterpret_cast<const float4*>(inv_freq + j));
  const float4 f_hi = __ldg(reinterpret_cast<const float4*>(inv_freq + j) + 1);
  const float freq[kVecElems] = {f_lo.x, f_lo.y, f_lo.z, f_lo.w, f_hi.x, f_hi.y, f_hi.z, f_hi.w};
  uint4* first = reinterpret_cast<uint4*>(x + j);
  uint4* second = reinterpret_cast<uint4*>(x + j + half);
  float x1[kVecElems], x2[kVecElems], y1[kVecElems], y2[kVecElems];
  unpack_bf16x8(*first, x1);
  unpack_bf16x8(*second, x2);
#pragma unroll
  for (int e = 0; e < kVecElems; ++e) {
    float s, c;
    sincosf(pos * freq[e], &s, &c);
    y1[e] = x1[e] * c - x2[e] * s;
    y2[e] = x2[e] * c + x1[e] * s;
  }
  const uint4 out1 = pack_bf16x8(y1), out2 = pack_bf16x8(y2);
  *first = out1;
  *second = out2;
  if (slot >= 0) {  // a k head of a store
    uint16_t* dst = static_cast<uint16_t*>(store.k_pages) + slot + int64_t(h - q_heads) * store.head_stride;
    *reinterpret_cast<uint4*>(dst + j) = out1;
    *reinterpret_cast<uint4*>(dst + j + half) = out2;
  }
}

// The scalar path: any f and alignment.
__global__ void swiglu_kernel(const uint16_t* gate_up, int64_t in_stride, uint16_t* out, int64_t out_stride,
                              int n, int f) {
  const int64_t total = int64_t(n) * f;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / f, j = idx % f;
    const float g = bf16_bits_to_float(gate_up[i * in_stride + j]);
    const float u = bf16_bits_to_float(gate_up[i * in_stride + f + j]);
    out[i * out_stride + j] = float_to_bf16_bits(g / (1.f + __expf(-g)) * u);
  }
}

// swiglu_kernel with 16-byte accesses (f % 8 == 0, rows 16-byte aligned): one thread per (row,
// 8 outputs) over a flat grid of total = n * f / 8 < 2^31 items, 32-bit index math.
__global__ void swiglu_vec_kernel(const uint16_t* gate_up, int64_t in_stride, uint16_t* out, int64_t out_stride,
                                  int f, int total) {
  const unsigned flat = blockIdx.x * blockDim.x + threadIdx.x;  // < total + blockDim.x <= 2^31 + 1024
  if (flat >= unsigned(total)) return;
  const int idx = int(flat);
  const int chunks = f / kVecElems;
  const int i = idx / chunks;
  const int j = (idx - i * chunks) * kVecElems;
  const uint16_t* row = gate_up + int64_t(i) * in_stride + j;
  float g[kVecElems], u[kVecElems], y[kVecElems];
  unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(row)), g);
  unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(row + f)), u);
#pragma unroll
  for (int e = 0; e < kVecElems; ++e) y[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
  *reinterpret_cast<uint4*>(out + int64_t(i) * out_stride + j) = pack_bf16x8(y);
}

// One block per output row; elements of T (uint16_t or float). The scalar path.
template <typename T>
__global__ void gather_rows_kernel(const T* x, int64_t x_stride, const int32_t* rows, T* out, int64_t out_stride,
                                   int cols) {
  const T* src = x + int64_t(rows[blockIdx.x]) * x_stride;
  T* dst = out + int64_t(blockIdx.x) * out_stride;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) dst[j] = src[j];
}

// gather_rows_kernel in 16-byte pieces: rows of `chunks` x 16 bytes, strides in 16-byte units.
__global__ void gather_rows_vec_kernel(const uint4* x, int64_t x_stride, const int32_t* rows, uint4* out,
                                       int64_t out_stride, int chunks) {
  const uint4* src = x + int64_t(rows[blockIdx.x]) * x_stride;
  uint4* dst = out + int64_t(blockIdx.x) * out_stride;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = src[c];
}

// One block per row: the largest value, the smallest index among equal ones; NaN counts as -inf
// (engine::argmax's rule).
__global__ void argmax_kernel(const float* logits, int64_t stride, int vocab, int32_t* tokens) {
  __shared__ float best_v[kArgmaxThreads];
  __shared__ int best_i[kArgmaxThreads];
  const float* row = logits + int64_t(blockIdx.x) * stride;
  float v = -INFINITY;
  int idx = vocab;  // no candidate yet
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float x = isnan(row[j]) ? -INFINITY : row[j];
    if (idx == vocab || x > v) {
      v = x;
      idx = j;
    }
  }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int oi = best_i[threadIdx.x + s];
      const int mi = best_i[threadIdx.x];
      const bool take = mi == vocab || (oi != vocab && (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi)));
      if (take) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) tokens[blockIdx.x] = best_i[0] == vocab ? 0 : best_i[0];
}

// Copies the step's pages into per-query-head pages; the page count is read on the device, so a
// captured graph serves any later step of the same batch size.
struct ExpandParams {
  const char* k_src;
  const char* v_src;
  int64_t page_stride, token_stride, head_stride;  // source strides in elements
  const int32_t* kv_page_indptr;
  const int32_t* kv_page_indices;
  int batch;
  char* k_dst;
  char* v_dst;
  int page_size, qo_heads, group_size;
  int row_bytes;  // head_dim * element size, a multiple of 16
  int elem_bytes;
  int64_t capacity_pages;
};

__global__ void expand_kv_pages_kernel(const ExpandParams p) {
  const int64_t listed = p.kv_page_indptr[p.batch];
  const int64_t pages = listed < p.capacity_pages ? listed : p.capacity_pages;
  const int chunks = p.row_bytes / 16;
  const int64_t per_page = int64_t(p.page_size) * p.qo_heads * chunks;
  const int64_t total = pages * per_page;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / per_page;
    const int64_t rest = idx % per_page;
    const int t = int(rest / (int64_t(p.qo_heads) * chunks));
    const int h = int((rest / chunks) % p.qo_heads);
    const int c = int(rest % chunks);
    const int64_t src_page = p.kv_page_indices[i];
    const int64_t src_elem = src_page * p.page_stride + t * p.token_stride + int64_t(h / p.group_size) * p.head_stride;
    const int64_t src = src_elem * p.elem_bytes + c * 16;
    const int64_t dst = ((i * p.page_size + t) * p.qo_heads + h) * int64_t(p.row_bytes) + c * 16;
    *reinterpret_cast<uint4*>(p.k_dst + dst) = *reinterpret_cast<const uint4*>(p.k_src + src);
    *reinterpret_cast<uint4*>(p.v_dst + dst) = *reinterpret_cast<const uint4*>(p.v_src + src);
  }
}

void check_bf16(const TensorView& t, const char* what) {
  GQ_CHECK(t.dtype == DType::kBF16 && t.device == Device::kCUDA, "cuda compute: ", what,
           " must be a bf16 CUDA tensor, got ", t.describe());
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kFP16: return CUDA_R_16F;
    case DType::kFP32: return CUDA_R_32F;
    default: throw Error(detail::concat("cuda compute: no cuBLAS type for ", dtype_name(d)));
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0; }
// Every row of a view with this base and row stride (elements of elem_bytes) starts 16-byte aligned.
bool rows_aligned16(const void* p, int64_t stride, size_t elem_bytes) {
  return aligned16(p) && (stride * int64_t(elem_bytes)) % kVecBytes == 0;
}

// Threads of a one-block-per-row launch over `chunks` 16-byte pieces: a warp multiple in
// [32, limit], about `per_thread` pieces each.
int row_threads(int64_t chunks, int per_thread, int limit) {
  const int64_t wanted = ceil_div(std::max<int64_t>(chunks, 1), per_thread);
  return int(std::min<int64_t>(round_up(int(std::min<int64_t>(wanted, limit)), kWarpSize), limit));
}

// The largest power of two (<= 256) dividing a pointer: what cuBLASLt may assume of a matrix.
uint32_t pointer_alignment(const void* p) {
  constexpr uintptr_t kMaxAlignment = 256;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return uint32_t(a == 0 ? kMaxAlignment : std::min(kMaxAlignment, a & (~a + 1)));
}

// One GEMM shape's cuBLASLt descriptors (initialised in place: no allocation, no destroy) and its
// algorithm. `settled`: tuned, or never to be tuned (more than kGemmTuneMaxRows tokens); an
// unsettled plan with an algorithm holds the heuristic's first, taken during a graph capture, and
// is tuned by the next eager call.
struct GemmPlan {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t a, b, c;  // w as [k, m] column-major, x as [k, n], y as [m, n]
  cublasLtMatmulAlgo_t algo;
  bool has_algo = false;
  bool settled = false;
};

// device, m (out features), n (tokens), k, lda, ldb, ldc, output type, alignments of w, x, y.
using GemmKey = std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int, uint32_t, uint32_t, uint32_t>;

// Process-wide, so that every runner of a process runs a shape with the same algorithm (bit-equal
// results: two runners built from the same weights must agree) and tunes it once.
struct GemmPlans {
  std::mutex mutex;
  std::map<GemmKey, GemmPlan> plans;
};
GemmPlans& gemm_plans() {
  static GemmPlans plans;
  return plans;
}

class CudaCompute final : public Compute {
 public:
  explicit CudaCompute(int device_id) : device_id_(device_id) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) cudaGetLastError();
    GQ_CHECK(status == cudaSuccess && count > device_id && device_id >= 0, "--device cuda: no usable CUDA device ",
             device_id, " (", status == cudaSuccess ? detail::concat(count, " present") : cudaGetErrorString(status), ")");
    GQ_CUDA_CHECK(cudaSetDevice(device_id_));
    GQ_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_id_));
    GQ_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes_, cudaDevAttrL2CacheSize, device_id_));
    GQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GQ_CUBLAS_CHECK(cublasLtCreate(&lt_));
    cublas_workspace_ = alloc(kCublasWorkspaceBytes);
    for (cudaEvent_t& e : tune_events_) GQ_CUDA_CHECK(cudaEventCreate(&e));
    gemm_log_ = env_flag("GQATTN_ENGINE_GEMM_LOG");
    gemm_search_allowed_ = !env_flag("GQATTN_DISABLE_ENGINE_GEMM_SEARCH");
    rope_store_disabled_ = env_flag("GQATTN_DISABLE_ENGINE_ROPE_STORE");
  }
  ~CudaCompute() override {
    cudaStreamSynchronize(stream_);
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : tune_events_)
      if (e != nullptr) cudaEventDestroy(e);
    for (PinnedSlot& p : pinned_) {
      if (p.done != nullptr) cudaEventDestroy(p.done);
      if (p.data != nullptr) cudaFreeHost(p.data);
    }
    l2_flush_.reset();
    l2_sink_.reset();
    cublas_workspace_.reset();
    cublasLtDestroy(lt_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCUDA; }
  int device_id() const override { return device_id_; }
  DType act_dtype() const override { return DType::kBF16; }
  void* stream() const override { return stream_; }
  bool supports_graphs() const override { return true; }

  DeviceBuffer alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw Error(detail::concat("cuda compute: cannot allocate ", bytes, " bytes (", double(bytes) / (1 << 30),
                                 " GiB; ", double(free_bytes()) / (1 << 30), " GiB free): ", cudaGetErrorString(status)));
    }
    return DeviceBuffer(p, bytes, [](void* q) { cudaFree(q); });
  }
  size_t free_bytes() const override {
    size_t free = 0, total = 0;
    GQ_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) GQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) GQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) GQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void download_start(int slot, const void* src, size_t bytes) override {
    GQ_CHECK(slot >= 0 && slot < kDownloadSlots, "download_start: slot ", slot, " outside [0, ", kDownloadSlots, ")");
    PinnedSlot& p = pinned_[slot];
    if (p.bytes < bytes) {
      // Grown only when a step samples more rows than any before it; the old copy may be in flight.
      if (p.data != nullptr) {
        GQ_CUDA_CHECK(cudaEventSynchronize(p.done));
        GQ_CUDA_CHECK(cudaFreeHost(p.data));
        p.data = nullptr;
      }
      GQ_CUDA_CHECK(cudaMallocHost(&p.data, bytes));
      p.bytes = bytes;
    }
    if (p.done == nullptr) GQ_CUDA_CHECK(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming));
    if (bytes > 0) GQ_CUDA_CHECK(cudaMemcpyAsync(p.data, src, bytes, cudaMemcpyDeviceToHost, stream_));
    GQ_CUDA_CHECK(cudaEventRecord(p.done, stream_));
    p.pending = bytes;
  }
  void download_finish(int slot, void* dst, size_t bytes) override {
    GQ_CHECK(slot >= 0 && slot < kDownloadSlots && bytes <= pinned_[slot].pending, "download_finish: slot ", slot,
             " holds no ", bytes, " bytes");
    PinnedSlot& p = pinned_[slot];
    GQ_CUDA_CHECK(cudaEventSynchronize(p.done));
    if (bytes > 0) std::memcpy(dst, p.data, bytes);
  }
  void synchronize() override { GQ_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  double measure_read_bandwidth_gbps() override {
    return kernels::measure_read_bandwidth_gbps(kBandwidthBytes, kBandwidthReps, stream_);
  }

  void fill_random(const TensorView& t, uint64_t seed, uint64_t tensor_id, float half_width) override {
    check_bf16(t, "fill_random");
    GQ_CHECK(t.is_contiguous(), "fill_random: needs a contiguous tensor");
    fill_random_kernel<<<grid_for(t.numel()), kThreads, 0, stream_>>>(t.ptr<uint16_t>(), t.numel(), seed, tensor_id,
                                                                       half_width);
    GQ_CUDA_CHECK(cudaGetLastError());
  }
  void fill(const TensorView& t, float value) override {
    GQ_CHECK(t.is_contiguous(), "fill: needs a contiguous tensor");
    if (t.dtype == DType::kBF16) {
      fill_bf16_kernel<<<grid_for(t.numel()), kThreads, 0, stream_>>>(t.ptr<uint16_t>(), t.numel(), value);
    } else {
      GQ_CHECK(t.dtype == DType::kFP32, "fill: bf16 or fp32, got ", t.describe());
      fill_fp32_kernel<<<grid_for(t.numel()), kThreads, 0, stream_>>>(t.ptr<float>(), t.numel(), value);
    }
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  void embed(const TensorView& token_ids, const TensorView& table, const TensorView& residual) override {
    check_bf16(table, "embedding table");
    GQ_CHECK(residual.dtype == DType::kFP32, "embed: residual must be fp32, got ", residual.describe());
    const int n = int(token_ids.shape[0]), hidden = int(table.shape[1]);
    if (n == 0) return;
    const bool vec = hidden % kVecElems == 0 && rows_aligned16(table.data, table.strides[0], sizeof(uint16_t)) &&
                     rows_aligned16(residual.data, residual.strides[0], sizeof(float));
    if (vec) {
      embed_vec_kernel<<<n, row_threads(hidden / kVecElems, 1, kRowCopyThreads), 0, stream_>>>(
          token_ids.ptr<int32_t>(), table.ptr<uint16_t>(), table.strides[0], int(table.shape[0]), hidden,
          residual.ptr<float>(), residual.strides[0]);
    } else {
      embed_kernel<<<n, kThreads, 0, stream_>>>(token_ids.ptr<int32_t>(), table.ptr<uint16_t>(), table.strides[0],
                                                int(table.shape[0]), hidden, residual.ptr<float>(),
                                                residual.strides[0]);
    }
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  void add_rmsnorm(const TensorView& residual, const TensorView& delta, const TensorView& weight, float eps,
                   const TensorView& out) override {
    GQ_CHECK(residual.dtype == DType::kFP32, "add_rmsnorm: residual must be fp32, got ", residual.describe());
    check_bf16(out, "add_rmsnorm out");
    if (delta.defined()) check_bf16(delta, "add_rmsnorm delta");
    check_bf16(weight, "add_rmsnorm weight");
    const int n = int(residual.shape[0]), hidden = int(residual.shape[1]);
    if (n == 0) return;
    float* r = residual.ptr<float>();
    const uint16_t* d = delta.defined() ? delta.ptr<uint16_t>() : nullptr;
    const int64_t d_stride = delta.defined() ? delta.strides[0] : 0;
    const uint16_t* w = weight.ptr<uint16_t>();
    uint16_t* o = out.ptr<uint16_t>();
    const bool vec = hidden % kVecElems == 0 && rows_aligned16(r, residual.strides[0], sizeof(float)) &&
                     (d == nullptr || rows_aligned16(d, d_stride, sizeof(uint16_t))) && aligned16(w) &&
                     rows_aligned16(o, out.strides[0], sizeof(uint16_t));
    const int chunks = hidden / kVecElems;
    const int threads = row_threads(chunks, kRmsnormChunksPerThread, kMaxBlockThreads);
    const int per_thread = int(ceil_div(chunks, threads));
    if (vec && per_thread <= kMaxRmsnormChunks) {
      const auto launch = [&](auto kernel) {
        kernel<<<n, threads, 0, stream_>>>(r, residual.strides[0], d, d_stride, w, eps, o, out.strides[0], hidden);
      };
      if (per_thread <= 1) {
        launch(add_rmsnorm_vec_kernel<1>);
      } else if (per_thread <= 2) {
        launch(add_rmsnorm_vec_kernel<2>);
      } else {
        launch(add_rmsnorm_vec_kernel<kMaxRmsnormChunks>);
      }
    } else {
      add_rmsnorm_kernel<<<n, kThreads, 0, stream_>>>(r, residual.strides[0], d, d_stride, w, eps, o, out.strides[0],
                                                      hidden);
    }
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  // cuBLASLt with the algorithm of the shape's GemmPlan: on a shape's first eager call with at most
  // kGemmTuneMaxRows tokens the heuristic's candidates are timed on these buffers (a host sync;
  // y is overwritten by each candidate, then computed by the fastest); longer shapes, and shapes
  // first met during a graph capture, take the heuristic's first candidate.
  void gemm(const TensorView& x, const TensorView& w, const TensorView& y) override {
    check_bf16(x, "gemm x");
    check_bf16(w, "gemm w");
    GQ_CHECK(x.shape[1] == w.shape[1] && y.shape[1] == w.shape[0] && y.shape[0] == x.shape[0],
             "gemm: x ", x.describe(), " . w ", w.describe(), "^T -> y ", y.describe());
    const int n = int(x.shape[0]), m = int(w.shape[0]), k = int(w.shape[1]);
    if (n == 0) return;
    // Row-major y[n, m] = x[n, k] w[m, k]^T is column-major y^T[m, n] = w^T^T . x^T.
    const cudaDataType_t out_type = cuda_type(y.dtype);
    const GemmKey key{device_id_,        m, n, k, w.strides[0], x.strides[0], y.strides[0], int(out_type),
                      pointer_alignment(w.data), pointer_alignment(x.data), pointer_alignment(y.data)};
    GemmPlans& plans = gemm_plans();
    const std::lock_guard<std::mutex> lock(plans.mutex);
    const auto [it, inserted] = plans.plans.try_emplace(key);
    GemmPlan& plan = it->second;
    try {
      if (inserted) init_gemm_plan(plan, m, n, k, w.strides[0], x.strides[0], y.strides[0], out_type);
      if (!plan.settled) choose_gemm_algo(plan, key, w.data, x.data, y.data);
    } catch (...) {
      if (inserted) plans.plans.erase(it);
      throw;
    }
    GQ_CUBLAS_CHECK(run_gemm(plan, plan.algo, w.data, x.data, y.data));
  }

  void rope(const TensorView& q, const TensorView& k, const TensorView& positions, const TensorView& inv_freq) override {
    launch_rope(q, k, positions, inv_freq, nullptr);
  }
  void rope_store_kv(const TensorView& q, const TensorView& k, const TensorView& positions, const TensorView& inv_freq,
                     const KVStore& store) override {
    const PagedKV& kv = store.kv;
    const TensorView& v = store.v;
    // The fused kernel takes what the engine passes: bf16, heads packed, 16-byte rows, and pools
    // whose strides keep 16-byte alignment; anything else (or the A/B switch) makes the two calls.
    const bool fusable =
        !rope_store_disabled_ && kv.k_pages.dtype == DType::kBF16 && kv.v_pages.dtype == DType::kBF16 &&
        v.dtype == DType::kBF16 && v.ndim == 3 && k.ndim == 3 && v.shape[0] == k.shape[0] &&
        v.shape[1] == k.shape[1] && v.shape[2] == k.shape[2] && v.strides[0] == k.strides[0] && v.strides[1] == v.shape[2] &&
        kv.num_kv_heads() == k.shape[1] && kv.head_dim() == k.shape[2] && std::equal(kv.k_pages.strides, kv.k_pages.strides + 4, kv.v_pages.strides) &&
        kv.k_pages.strides[3] == 1 &&
        rows_aligned16(v.data, v.strides[0], sizeof(uint16_t)) && aligned16(kv.k_pages.data) &&
        aligned16(kv.v_pages.data) && (kv.token_stride() * 2) % kVecBytes == 0 && (kv.head_stride() * 2) % kVecBytes == 0 &&
        (kv.page_stride() * 2) % kVecBytes == 0;
    if (!fusable || !launch_rope(q, k, positions, inv_freq, &store)) Compute::rope_store_kv(q, k, positions, inv_freq, store);
  }

 private:
  // rope on the vector path (with the K/V store when given), else the scalar path; with a store,
  // returns false (nothing launched) where the vector path does not apply.
  bool launch_rope(const TensorView& q, const TensorView& k, const TensorView& positions, const TensorView& inv_freq,
                   const KVStore* store) {
    check_bf16(q, "rope q");
    check_bf16(k, "rope k");
    GQ_CHECK(q.strides[1] == q.shape[2] && k.strides[1] == k.shape[2], "rope: heads must be packed rows");
    GQ_CHECK(k.shape[0] == q.shape[0] && k.shape[2] == q.shape[2] && inv_freq.dtype == DType::kFP32 &&
                 inv_freq.shape[0] == q.shape[2] / 2,
             "rope: q ", q.describe(), ", k ", k.describe(), ", inv_freq ", inv_freq.describe());
    const int n = int(q.shape[0]), q_heads = int(q.shape[1]), k_heads = int(k.shape[1]), head_dim = int(q.shape[2]);
    const int v_heads = store != nullptr ? k_heads : 0;
    const int64_t total = int64_t(n) * (q_heads + k_heads + v_heads) * (head_dim / (2 * kVecElems));
    const bool vec = head_dim % (2 * kVecElems) == 0 && rows_aligned16(q.data, q.strides[0], sizeof(uint16_t)) &&
                     rows_aligned16(k.data, k.strides[0], sizeof(uint16_t)) && aligned16(inv_freq.data) &&
                     total <= INT32_MAX;
    if (store != nullptr && !vec) return false;
    if (n == 0) return true;
    if (vec) {
      kernels::AppendKVParams s;  // k_pages null: rope only
      if (store != nullptr) s = kernels::append_kv_params(store->kv, k, store->v, store->batch_indices, positions);
      rope_vec_kernel<<<unsigned(ceil_div(total, kRopeThreads)), kRopeThreads, 0, stream_>>>(
          q.ptr<uint16_t>(), q.strides[0], q_heads, k.ptr<uint16_t>(), k.strides[0], k_heads, head_dim,
          positions.ptr<int32_t>(), inv_freq.ptr<float>(), int(total), s);
    } else {
      rope_kernel<<<n, kThreads, 0, stream_>>>(q.ptr<uint16_t>(), q.strides[0], q_heads, k.ptr<uint16_t>(),
                                               k.strides[0], k_heads, head_dim, positions.ptr<int32_t>(),
                                               inv_freq.ptr<float>());
    }
    GQ_CUDA_CHECK(cudaGetLastError());
    return true;
  }

 public:

  void swiglu(const TensorView& gate_up, const TensorView& out) override {
    check_bf16(gate_up, "swiglu input");
    check_bf16(out, "swiglu output");
    GQ_CHECK(gate_up.shape[0] == out.shape[0] && gate_up.shape[1] == 2 * out.shape[1], "swiglu: gate_up ",
             gate_up.describe(), " -> out ", out.describe());
    const int n = int(out.shape[0]), f = int(out.shape[1]);
    if (n == 0) return;
    const int64_t total = int64_t(n) * (f / kVecElems);
    const bool vec = f % kVecElems == 0 && rows_aligned16(gate_up.data, gate_up.strides[0], sizeof(uint16_t)) &&
                     rows_aligned16(out.data, out.strides[0], sizeof(uint16_t)) && total <= INT32_MAX;
    if (vec) {
      swiglu_vec_kernel<<<unsigned(ceil_div(total, kThreads)), kThreads, 0, stream_>>>(
          gate_up.ptr<uint16_t>(), gate_up.strides[0], out.ptr<uint16_t>(), out.strides[0], f, int(total));
    } else {
      swiglu_kernel<<<grid_for(int64_t(n) * f), kThreads, 0, stream_>>>(gate_up.ptr<uint16_t>(), gate_up.strides[0],
                                                                         out.ptr<uint16_t>(), out.strides[0], n, f);
    }
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  void gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) override {
    GQ_CHECK(x.dtype == out.dtype && x.shape[1] == out.shape[1] && rows.shape[0] <= out.shape[0], "gather_rows: x ",
             x.describe(), " -> out ", out.describe());
    const int m = int(rows.shape[0]), cols = int(x.shape[1]);
    if (m == 0) return;
    const size_t elem = dtype_size(x.dtype);
    const int64_t row_bytes = int64_t(cols) * int64_t(elem);
    if (row_bytes % kVecBytes == 0 && rows_aligned16(x.data, x.strides[0], elem) &&
        rows_aligned16(out.data, out.strides[0], elem)) {
      const int64_t chunks = row_bytes / kVecBytes;
      gather_rows_vec_kernel<<<m, row_threads(chunks, 1, kRowCopyThreads), 0, stream_>>>(
          static_cast<const uint4*>(x.data), x.strides[0] * int64_t(elem) / kVecBytes, rows.ptr<int32_t>(),
          static_cast<uint4*>(out.data), out.strides[0] * int64_t(elem) / kVecBytes, int(chunks));
    } else if (x.dtype == DType::kFP32) {
      gather_rows_kernel<float><<<m, kThreads, 0, stream_>>>(x.ptr<float>(), x.strides[0], rows.ptr<int32_t>(),
                                                             out.ptr<float>(), out.strides[0], cols);
    } else {
      gather_rows_kernel<uint16_t><<<m, kThreads, 0, stream_>>>(x.ptr<uint16_t>(), x.strides[0], rows.ptr<int32_t>(),
                                                                out.ptr<uint16_t>(), out.strides[0], cols);
    }
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  void argmax(const TensorView& logits, const TensorView& tokens) override {
    GQ_CHECK(logits.dtype == DType::kFP32, "argmax: logits must be fp32, got ", logits.describe());
    const int m = int(logits.shape[0]);
    if (m == 0) return;
    argmax_kernel<<<m, kArgmaxThreads, 0, stream_>>>(logits.ptr<float>(), logits.strides[0], int(logits.shape[1]),
                                                     tokens.ptr<int32_t>());
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  void expand_kv_pages(const PagedKV& kv, int batch, const TensorView& dst_k, const TensorView& dst_v) override {
    check_bf16(dst_k, "expand dst_k");
    check_bf16(dst_v, "expand dst_v");
    ExpandParams p;
    p.k_src = static_cast<const char*>(kv.k_pages.data);
    p.v_src = static_cast<const char*>(kv.v_pages.data);
    p.page_stride = kv.page_stride();
    p.token_stride = kv.token_stride();
    p.head_stride = kv.head_stride();
    p.kv_page_indptr = kv.kv_page_indptr.ptr<const int32_t>();
    p.kv_page_indices = kv.kv_page_indices.ptr<const int32_t>();
    p.batch = batch;
    p.k_dst = static_cast<char*>(dst_k.data);
    p.v_dst = static_cast<char*>(dst_v.data);
    p.page_size = int(dst_k.shape[1]);
    p.qo_heads = int(dst_k.shape[2]);
    p.group_size = int(dst_k.shape[2] / kv.num_kv_heads());
    p.elem_bytes = int(dtype_size(dst_k.dtype));
    p.row_bytes = int(dst_k.shape[3]) * p.elem_bytes;
    p.capacity_pages = dst_k.shape[0];
    GQ_CHECK(p.row_bytes % 16 == 0, "expand_kv_pages: head_dim rows must be a multiple of 16 bytes");
    expand_kv_pages_kernel<<<unsigned(num_sms_) * 8, kThreads, 0, stream_>>>(p);
    GQ_CUDA_CHECK(cudaGetLastError());
  }

  void run_graph(int key, const std::function<void()>& body) override {
    const auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      GQ_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
      return;
    }
    // The first step of a key runs eagerly (cuBLAS and lazily loaded kernels initialise outside
    // any capture, as PyTorch's warm-up does), then is captured, not executed, for the next ones.
    body();
    if (graphs_failed_) return;
    try {
      graphs_.emplace(key, capture(body));
    } catch (const Error& e) {
      // The step itself already ran; later steps run eagerly, and say so once. The failed call's
      // error (cudaStreamEndCapture's when the body broke the capture without throwing, or
      // cudaGraphInstantiate's) is cleared, or the next launch's check would report it.
      cudaGetLastError();
      graphs_failed_ = true;
      std::fprintf(stderr, "gqattn engine: CUDA graph capture failed, decode steps run eagerly: %s\n", e.what());
    }
  }
  int num_graphs() const override { return int(graphs_.size()); }
  void set_gemm_search(bool on) override { gemm_search_ = on && gemm_search_allowed_; }
  void set_profiling(bool on) override { GQ_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }

 private:
  // Reads the whole flush buffer, leaving the L2 full of its clean lines (GEMM tuning).
  void flush_l2() {
    if (!l2_flush_.data()) return;
    kernels::launch_read(l2_flush_.data(), l2_flush_.bytes(), static_cast<unsigned*>(l2_sink_.data()),
                         /*streaming=*/false, stream_);
  }

  void init_gemm_plan(GemmPlan& p, int m, int n, int k, int64_t ldw, int64_t ldx, int64_t ldy, cudaDataType_t out_type) {
    GQ_CUBLAS_CHECK(cublasLtMatmulDescInit(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_w = CUBLAS_OP_T, trans_x = CUBLAS_OP_N;
    GQ_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w, sizeof(trans_w)));
    GQ_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_x, sizeof(trans_x)));
    GQ_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p.a, CUDA_R_16BF, uint64_t(k), uint64_t(m), ldw));
    GQ_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p.b, CUDA_R_16BF, uint64_t(k), uint64_t(n), ldx));
    GQ_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p.c, out_type, uint64_t(m), uint64_t(n), ldy));
  }

  cublasStatus_t run_gemm(GemmPlan& p, const cublasLtMatmulAlgo_t& algo, const void* w, const void* x, void* y) {
    const float alpha = 1.f, beta = 0.f;
    return cublasLtMatmul(lt_, &p.desc, &alpha, w, &p.a, x, &p.b, &beta, y, &p.c, y, &p.c, &algo,
                          cublas_workspace_.data(), kCublasWorkspaceBytes, stream_);
  }

  // Gives an unsettled plan its algorithm: the heuristic's first, or (eager, <= kGemmTuneMaxRows
  // tokens) the fastest candidate.
  void choose_gemm_algo(GemmPlan& p, const GemmKey& key, const void* w, const void* x, void* y) {
    const int n = std::get<2>(key);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    GQ_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    const bool tune = n <= kGemmTuneMaxRows && capture == cudaStreamCaptureStatusNone;
    if (p.has_algo && !tune) return;
    cublasLtMatmulPreferenceOpaque_t pref;
    GQ_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&pref));
    const uint64_t workspace = kCublasWorkspaceBytes;
    GQ_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                         sizeof(workspace)));
    const uint32_t align_w = std::get<8>(key), align_x = std::get<9>(key), align_y = std::get<10>(key);
    GQ_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
    GQ_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x)));
    GQ_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y)));
    GQ_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y)));
    cublasLtMatmulHeuristicResult_t results[kGemmCandidates] = {};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt_, &p.desc, &p.a, &p.b, &p.c, &p.c, &pref,
                                                                 kGemmCandidates, results, &returned);
    std::vector<cublasLtMatmulAlgo_t> candidates;
    if (status == CUBLAS_STATUS_SUCCESS) {
      for (int i = 0; i < returned; ++i)
        if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kCublasWorkspaceBytes)
          candidates.push_back(results[i].algo);
    }
    GQ_CHECK(!candidates.empty(), "gemm: cuBLASLt has no algorithm for y[", n, ", ", std::get<1>(key), "] = x[", n,
             ", ", std::get<3>(key), "] . w^T (", cublasLtGetStatusString(status), ")");
    p.algo = tune ? fastest_gemm_algo(p, key, candidates, w, x, y) : candidates.front();
    p.has_algo = true;
    p.settled = tune || n > kGemmTuneMaxRows;
  }

  // Median time (ms) of each candidate over `reps` rounds (one warm-up run first), each run after
  // an L2 flush; INFINITY for a candidate that fails to run. Rounds go over all the candidates, so
  // drift in clocks or temperature spreads over all of them; kGemmCandidates a batch (the events).
  // Synchronises the stream.
  std::vector<float> time_gemm_algos(GemmPlan& p, const std::vector<cublasLtMatmulAlgo_t>& candidates, int reps,
                                     const void* w, const void* x, void* y) {
    if (!l2_flush_.data() && !l2_flush_failed_ && l2_bytes_ > 0) {
      try {
        l2_flush_ = alloc(size_t(kL2FlushFactor) * size_t(l2_bytes_));
        GQ_CUDA_CHECK(cudaMemsetAsync(l2_flush_.data(), 0x5A, l2_flush_.bytes(), stream_));
        l2_sink_ = alloc(sizeof(unsigned));
      } catch (const Error&) {
        l2_flush_.reset();
        l2_flush_failed_ = true;  // tune with warm caches rather than fail
      }
    }
    const size_t count = candidates.size();
    std::vector<bool> ok(count, true);
    for (size_t i = 0; i < count; ++i) ok[i] = run_gemm(p, candidates[i], w, x, y) == CUBLAS_STATUS_SUCCESS;
    // Each run after a read of the flush buffer (clean lines: no write-back inside the timed run).
    std::vector<std::vector<float>> times(count);
    for (int r = 0; r < reps; ++r) {
      for (size_t begin = 0; begin < count; begin += kGemmCandidates) {
        const size_t end = std::min(count, begin + kGemmCandidates);
        for (size_t i = begin; i < end; ++i) {
          if (!ok[i]) continue;
          flush_l2();
          GQ_CUDA_CHECK(cudaEventRecord(tune_events_[2 * (i - begin)], stream_));
          ok[i] = run_gemm(p, candidates[i], w, x, y) == CUBLAS_STATUS_SUCCESS;
          GQ_CUDA_CHECK(cudaEventRecord(tune_events_[2 * (i - begin) + 1], stream_));
        }
        GQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (size_t i = begin; i < end; ++i) {
          if (!ok[i]) continue;
          float t = 0;
          GQ_CUDA_CHECK(cudaEventElapsedTime(&t, tune_events_[2 * (i - begin)], tune_events_[2 * (i - begin) + 1]));
          times[i].push_back(t);
        }
      }
    }
    std::vector<float> ms(count, INFINITY);
    for (size_t i = 0; i < count; ++i) {
      if (!ok[i] || times[i].empty()) continue;
      std::nth_element(times[i].begin(), times[i].begin() + times[i].size() / 2, times[i].end());
      ms[i] = times[i][times[i].size() / 2];
    }
    return ms;
  }

  // Configurations of the heuristic's algorithms that it did not offer (perf-notes item 221),
  // each accepted by cublasLtMatmulAlgoCheck within the workspace, none equal to a candidate: for
  // each candidate in turn, every split-K count of kGemmSearchSplits (reduced in fp32, where the
  // algorithm supports it) with CTA swizzling off and on, then every tile the algorithm lists
  // (unsplit); at most kGemmSearchMax of them (the cap can end the list within the first few
  // candidates).
  std::vector<cublasLtMatmulAlgo_t> gemm_variants(GemmPlan& p, const std::vector<cublasLtMatmulAlgo_t>& candidates) {
    std::vector<cublasLtMatmulAlgo_t> out;
    auto known = [&](const cublasLtMatmulAlgo_t& a) {
      auto same = [&](const cublasLtMatmulAlgo_t& b) { return std::memcmp(&a, &b, sizeof(a)) == 0; };
      return std::any_of(candidates.begin(), candidates.end(), same) || std::any_of(out.begin(), out.end(), same);
    };
    auto add = [&](const cublasLtMatmulAlgo_t& a) {
      if (out.size() >= size_t(kGemmSearchMax) || known(a)) return;
      cublasLtMatmulHeuristicResult_t r = {};
      if (cublasLtMatmulAlgoCheck(lt_, &p.desc, &p.a, &p.b, &p.c, &p.c, &a, &r) == CUBLAS_STATUS_SUCCESS &&
          r.workspaceSize <= kCublasWorkspaceBytes)
        out.push_back(a);
    };
    auto set = [](cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr, auto value) {
      return cublasLtMatmulAlgoConfigSetAttribute(&a, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
    };
    for (const cublasLtMatmulAlgo_t& base : candidates) {
      int32_t splitk_support = 0;
      uint32_t schemes = 0, swizzle_support = 0;
      size_t written = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_support,
                                        sizeof(splitk_support), &written);
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes),
                                        &written);
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swizzle_support,
                                        sizeof(swizzle_support), &written);
      for (int32_t splits : kGemmSearchSplits) {
        if (splits > 1 && !splitk_support) continue;
        // Split-K partial sums are reduced in fp32 (COMPUTE_TYPE) only: INPLACE and OUTPUT_TYPE would
        // add them in the output's bf16.
        for (uint32_t scheme :
             {uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE), uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)}) {
          if ((splits == 1) != (scheme == CUBLASLT_REDUCTION_SCHEME_NONE)) continue;
          if (splits > 1 && !(schemes & scheme)) continue;
          for (uint32_t swizzle = 0; swizzle <= (swizzle_support ? 1u : 0u); ++swizzle) {
            cublasLtMatmulAlgo_t a = base;
            if (set(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splits) && set(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme) &&
                (!swizzle_support || set(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle)))
              add(a);
          }
        }
      }
      size_t tile_bytes = 0;
      if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &tile_bytes) !=
              CUBLAS_STATUS_SUCCESS ||
          tile_bytes == 0)
        continue;
      std::vector<uint32_t> tiles(tile_bytes / sizeof(uint32_t));
      if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), tile_bytes, &written) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      for (uint32_t tile : tiles) {
        cublasLtMatmulAlgo_t a = base;
        if (set(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) && set(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t(1)) &&
            set(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE)))
          add(a);
      }
    }
    return out;
  }

  // The candidate of the lowest median time (kGemmTuneReps rounds); a candidate without split-K (no
  // reduction kernel) wins when it is within kSplitKSlack of it. While the search is on
  // (set_gemm_search), the kGemmCandidates fastest of gemm_variants (kGemmSearchReps rounds each)
  // are timed beside the heuristic's candidates. Candidates that fail to run are skipped.
  // Synchronises the stream.
  // GQATTN_ENGINE_GEMM_LOG=1 prints each tuned shape's outcome to stderr.
  cublasLtMatmulAlgo_t fastest_gemm_algo(GemmPlan& p, const GemmKey& key,
                                         const std::vector<cublasLtMatmulAlgo_t>& heuristic, const void* w,
                                         const void* x, void* y) {
    std::vector<cublasLtMatmulAlgo_t> candidates(
        heuristic.begin(), heuristic.begin() + std::min(heuristic.size(), size_t(kGemmCandidates)));
    const size_t from_heuristic = candidates.size();
    size_t searched = 0;
    if (gemm_search_) {
      const std::vector<cublasLtMatmulAlgo_t> variants = gemm_variants(p, candidates);
      searched = variants.size();
      const std::vector<float> quick = time_gemm_algos(p, variants, kGemmSearchReps, w, x, y);
      std::vector<size_t> order(variants.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return quick[a] < quick[b]; });
      for (size_t i = 0; i < order.size() && i < size_t(kGemmCandidates) && std::isfinite(quick[order[i]]); ++i)
        candidates.push_back(variants[order[i]]);
    }
    const std::vector<float> ms = time_gemm_algos(p, candidates, kGemmTuneReps, w, x, y);
    const size_t fastest = size_t(std::min_element(ms.begin(), ms.end()) - ms.begin());
    GQ_CHECK(std::isfinite(ms[fastest]), "gemm: none of cuBLASLt's ", candidates.size(), " candidate algorithms ran");
    size_t best = fastest;
    if (split_k(candidates[fastest]) > 1) {
      for (size_t i = 0; i < candidates.size(); ++i)
        if (split_k(candidates[i]) <= 1 && ms[i] <= ms[fastest] * kSplitKSlack && (best == fastest || ms[i] < ms[best]))
          best = i;
    }
    if (gemm_log_) {
      int32_t algo_id = -1;
      uint32_t tile = 0, scheme = 0, swizzle = 0;
      size_t written = 0;
      const cublasLtMatmulAlgo_t& b = candidates[best];
      cublasLtMatmulAlgoConfigGetAttribute(&b, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof(algo_id), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&b, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&b, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme),
                                           &written);
      cublasLtMatmulAlgoConfigGetAttribute(&b, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &written);
      const float best_heuristic = *std::min_element(ms.begin(), ms.begin() + from_heuristic);
      const double bytes = 2.0 * std::get<1>(key) * std::get<3>(key);
      std::fprintf(stderr,
                   "gemm tune m %d n %d k %d: %zu candidates, heuristic's first %.1f us, best of them %.1f us; "
                   "%zu variants searched; chosen #%zu%s %.1f us (%.0f GB/s of weights; algo %d tile %u split-k %d "
                   "reduction %u swizzle %u)\n",
                   std::get<1>(key), std::get<2>(key), std::get<3>(key), from_heuristic, ms[0] * 1e3,
                   best_heuristic * 1e3, searched, best, best >= from_heuristic ? " (a variant)" : "", ms[best] * 1e3,
                   bytes / (ms[best] * 1e6), algo_id, tile, split_k(b), scheme, swizzle);
    }
    return candidates[best];
  }

  static int32_t split_k(const cublasLtMatmulAlgo_t& algo) {
    int32_t splits = 1;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits),
                                             &written) != CUBLAS_STATUS_SUCCESS)
      return 1;
    return splits;
  }

  cudaGraphExec_t capture(const std::function<void()>& body) {
    GQ_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      body();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    GQ_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    GQ_CUDA_CHECK(status);
    return exec;
  }

  int device_id_ = 0;
  int num_sms_ = 0;
  int l2_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer cublas_workspace_;
  // GEMM tuning: start / stop events of each timed run, and the buffer written to flush the L2.
  cudaEvent_t tune_events_[2 * kGemmCandidates] = {};
  DeviceBuffer l2_flush_, l2_sink_;
  bool l2_flush_failed_ = false;
  bool gemm_log_ = false;  // GQATTN_ENGINE_GEMM_LOG: print each tuned GEMM shape's outcome
  // The search of gemm_variants: on between set_gemm_search(true) and (false), unless
  // GQATTN_DISABLE_ENGINE_GEMM_SEARCH is set (then only the heuristic's candidates are timed).
  bool gemm_search_allowed_ = true;
  bool gemm_search_ = false;
  bool rope_store_disabled_ = false;  // GQATTN_DISABLE_ENGINE_ROPE_STORE: rope, then append_kv
  std::map<int, cudaGraphExec_t> graphs_;
  bool graphs_failed_ = false;
  // download_start's pinned host buffers, each with the event its copy records.
  struct PinnedSlot {
    void* data = nullptr;
    size_t bytes = 0;
    size_t pending = 0;  // bytes of the last copy started
    cudaEvent_t done = nullptr;
  };
  PinnedSlot pinned_[kDownloadSlots];
};

}  // namespace

std::unique_ptr<Compute> make_cuda_compute(int device_id) { return std::make_unique<CudaCompute>(device_id); }

}  // namespace gqattn::engine
