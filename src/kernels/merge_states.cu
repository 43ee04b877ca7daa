// The public merge_states operation: user-provided partial states (v, s) -> merged (v, s), folded
// through prims::MergeState like the split-KV merge inside the attention kernel (attention.cuh).
// Layer: src/kernels (kernel + its host launcher).
#include <cuda_runtime.h>

#include "kernels/launch.h"
#include "prims/cuda_check.h"
#include "prims/mma.cuh"
#include "prims/softmax_state.cuh"

namespace gqattn::kernels {
namespace {

constexpr int kMergeWarps = 4;  // merge_states: warps per block, each merging one (n, head) row

template <typename TIn, typename TOut>
__global__ void merge_states_kernel(const MergeStatesParams p) {
  const int row = blockIdx.x * kMergeWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.n * p.num_heads) return;
  const int n = row / p.num_heads;
  const int h = row % p.num_heads;
  const TIn* v = static_cast<const TIn*>(p.v) + n * p.v_stride_n + h * p.v_stride_h;
  const float* s = p.s + n * p.s_stride_n + h * p.s_stride_h;
  TOut* out = static_cast<TOut*>(p.v_out) + n * p.out_stride_n + h * p.out_stride_h;
  // Pass 1: the merged max and sum; pass 2: the weighted sum of the states, column by column.
  const prims::MergeState state = prims::segment_merge_lse(
      [&](int st) { return s[st * p.s_stride_s] * prims::kLog2e; }, p.num_states, 32);
  const float inv = state.inv_sum();
  for (int col = lane; col < p.head_dim; col += 32) {
    float acc = 0.f;
    for (int st = 0; st < p.num_states; ++st) {
      const float weight = prims::merge_weight(state, s[st * p.s_stride_s] * prims::kLog2e);
      if (weight != 0.f) acc += weight * prims::to_float(v[st * p.v_stride_s + col]);
    }
    out[col] = prims::from_float<TOut>(acc * inv);
  }
  if (p.s_out != nullptr && lane == 0) p.s_out[n * p.s_out_stride_n + h * p.s_out_stride_h] = state.lse2() * prims::kLn2;
}

template <typename TIn>
void launch_merge_states_from(const MergeStatesParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  switch (p.out_dtype) {
    case DType::kBF16: merge_states_kernel<TIn, __nv_bfloat16><<<grid, block, 0, stream>>>(p); break;
    case DType::kFP16: merge_states_kernel<TIn, __half><<<grid, block, 0, stream>>>(p); break;
    case DType::kFP32: merge_states_kernel<TIn, float><<<grid, block, 0, stream>>>(p); break;
    default: throw Error("merge_states: v_merged must be bf16, fp16 or fp32");
  }
}

}  // namespace

void launch_merge_states(const MergeStatesParams& p, void* stream) {
  const int64_t rows = static_cast<int64_t>(p.n) * p.num_heads;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>((rows + kMergeWarps - 1) / kMergeWarps));
  const dim3 block(32 * kMergeWarps);
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.v_dtype) {
    case DType::kBF16: launch_merge_states_from<__nv_bfloat16>(p, grid, block, s); break;
    case DType::kFP16: launch_merge_states_from<__half>(p, grid, block, s); break;
    case DType::kFP32: launch_merge_states_from<float>(p, grid, block, s); break;
    default: throw Error("merge_states: v must be bf16, fp16 or fp32");
  }
  GQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gqattn::kernels
