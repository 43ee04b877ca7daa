// The online-softmax state shared by the attention kernel, the split-KV merge and merge_states.
// Layer: src/prims (device only). Logits are in base 2 (the scale and log2(e) folded in); an empty
// state has m = -inf and d = 0, and no operation on it produces NaN.
#pragma once

#include <cmath>

namespace gqattn::prims {

constexpr float kNegInf = -INFINITY;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kLog2e = 1.44269504088896340736f;

// exp2(m_old - m_new) for the rescale of an accumulator, 0 when the old state was empty.
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return m_old == kNegInf ? 0.f : exp2f(m_old - m_new);
}
// The max to subtract: 0 for a row that has seen no key yet (so exp2(-inf - 0) = 0, not NaN).
__device__ __forceinline__ float safe_max(float m) { return m == kNegInf ? 0.f : m; }

// 1 / d for a row's sum of exponentials d, 0 for an empty row (d = 0). Wherever a row saw a key,
// d >= 1 (its largest term is exp2(0)), so the hardware's approximate reciprocal (rcp.approx.ftz,
// within 1 ulp) serves, without the IEEE division's slow path and its branches.
__device__ __forceinline__ float inv_row_sum(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return d > 0.f ? r : 0.f;
}
// The base-2 LSE m + log2(d) of a row (-inf when empty), for the same d >= 1: lg2.approx
// (absolute error about 2^-22) in place of log2f's polynomial of some 15 dependent instructions.
__device__ __forceinline__ float row_lse2(float m, float d) {
  float l;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l) : "f"(d));
  return d > 0.f ? m + l : kNegInf;
}

// Merges normalised partial results (o_i, lse_i) one at a time. lse values are base 2.
struct MergeState {
  float m = kNegInf;  // running max of lse
  float d = 0.f;      // sum of exp2(lse_i - m)

  // Returns (scale for the accumulated sum, weight of the new partial).
  __device__ __forceinline__ void add(float lse, float& old_scale, float& weight) {
    const float m_new = fmaxf(m, lse);
    if (m_new == kNegInf) {  // both empty
      old_scale = 1.f;
      weight = 0.f;
      return;
    }
    old_scale = rescale_factor(m, m_new);
    weight = lse == kNegInf ? 0.f : exp2f(lse - m_new);
    d = d * old_scale + weight;
    m = m_new;
  }
  // Folds another state in (used to combine per-lane states across a warp).
  __device__ __forceinline__ void combine(const MergeState& other) {
    const float m_new = fmaxf(m, other.m);
    if (m_new == kNegInf) return;
    d = d * rescale_factor(m, m_new) + other.d * rescale_factor(other.m, m_new);
    m = m_new;
  }
  // 1 / d, or 0 when every partial was empty (the output is then 0).
  __device__ __forceinline__ float inv_sum() const { return inv_row_sum(d); }
  // Base-2 LSE of the merged state (-inf when empty).
  __device__ __forceinline__ float lse2() const { return row_lse2(m, d); }
};

// The merged state of n partial LSEs (base 2 after multiplying by lse_scale) at lse[i * stride],
// computed by a whole warp: lanes take every 32nd partial, then combine through shuffles.
__device__ __forceinline__ MergeState warp_merge_lse(const float* lse, int64_t stride, int n, float lse_scale) {
  const int lane = threadIdx.x & 31;
  MergeState st;
  for (int i = lane; i < n; i += 32) {
    float old_scale, weight;
    st.add(lse[i * stride] * lse_scale, old_scale, weight);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    MergeState other;
    other.m = __shfl_xor_sync(0xffffffffu, st.m, offset);
    other.d = __shfl_xor_sync(0xffffffffu, st.d, offset);
    st.combine(other);
  }
  return st;
}

// Weight of one partial in a merged state: exp2(lse2 - m), 0 for an empty partial.
__device__ __forceinline__ float merge_weight(const MergeState& st, float lse2) {
  return lse2 == kNegInf ? 0.f : exp2f(lse2 - safe_max(st.m));
}

}  // namespace gqattn::prims
