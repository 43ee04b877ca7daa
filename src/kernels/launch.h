// Host-side declarations of the kernel launchers, for src/dispatch. No device code here: the
// dispatcher never includes kernel bodies, so editing it recompiles one small file.
// Layer: src/kernels (host-includable).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"
#include "kernels/attention_config.h"
#include "plan/work_item.h"
#include "prims/fast_divmod.h"

namespace gqattn::kernels {

// Everything the attention kernel reads, passed by value. Strides are in elements.
struct AttentionParams {
  const void* q = nullptr;
  int64_t q_stride_n = 0, q_stride_h = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_page_stride = 0, kv_token_stride = 0, kv_head_stride = 0;
  const int32_t* page_indices = nullptr;  // nullptr: ragged K/V (page = page_begin + key)
  int64_t kv_rows = 0;   // pages (paged) or tokens (ragged) of the K/V pool: TMA bounds
  int num_kv_heads = 0;
  void* o = nullptr;
  int64_t o_stride_n = 0, o_stride_h = 0;
  int64_t o_tokens = 0;  // O's tokens (its shape[0]): the bounds of the hd64 TMA store's map; 0: no map
  float* lse = nullptr;  // optional, [tokens, num_qo_heads]
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  const WorkItem* work = nullptr;
  const PlanHeader* header = nullptr;
  int32_t* item_counters = nullptr;  // &header->next_item (next_item, ctas_done): the sm_90a kernel's scheduler
  int num_qo_heads = 0;
  FastDivmod group;  // group_size
  FastDivmod page;   // page_size (1 for ragged)
  float sm_scale_log2 = 0.f;
  int causal = 0;
  // sm_90a kernel, every item <= 64 rows: the consumer warpgroups share the rows, each takes half
  // of every K/V tile's keys (Plan::split_item_keys).
  int split_item_keys = 0;
};

// Split-KV merge: partial rows -> o / lse.
struct SplitMergeParams {
  const float* partial_o = nullptr;
  const float* partial_lse = nullptr;
  const MergeRequest* requests = nullptr;
  const PlanHeader* header = nullptr;
  void* o = nullptr;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;
  int num_qo_heads = 0;
  int head_dim = 0;
  FastDivmod group;
  int total_qo = 0;
  int batch = 0;  // the host plan's requests: the first guess of a token's request (locate_split_row)
  FastDivmod per_request;  // its query tokens a request, max(total_qo / batch, 1): token / it is the guess
  int max_splits = 0;  // the plan's most chunks of one request (host side): picks the block width
  // Launched as a programmatic dependent launch (sm_90+): it may start during the attention
  // kernel's tail and waits for it in the kernel (perf-notes item 80).
  int programmatic = 0;
};

template <DType kDType, int HeadDim, Family F>
struct AttentionKernel {
  static void launch(const AttentionParams& params, int num_ctas, void* stream);
  // Resident CTAs per SM for this kernel (from the occupancy calculator).
  static int ctas_per_sm();
};

void launch_split_merge(DType dtype, const SplitMergeParams& params, void* stream);
// Whether the split merge's code on the current device was compiled for sm_90+ (its PTX virtual
// architecture): only there does it wait for the attention grid (prims::grid_dependency_wait)
// before it reads the partial rows, so only there may it be a programmatic dependent launch. Code
// JIT-compiled from the sm_80 PTX has no wait: sm_100 or sm_120 with the default
// GQATTN_CUDA_ARCHS=80;90a, sm_90 with GQATTN_CUDA_ARCHS=80. Queried once per device.
bool split_merge_waits_for_attention();

struct MergeStatesParams {
  const void* v = nullptr;
  DType v_dtype = DType::kFP32;
  int64_t v_stride_n = 0, v_stride_s = 0, v_stride_h = 0;
  const float* s = nullptr;
  int64_t s_stride_n = 0, s_stride_s = 0, s_stride_h = 0;
  void* v_out = nullptr;
  DType out_dtype = DType::kFP32;
  int64_t out_stride_n = 0, out_stride_h = 0;
  float* s_out = nullptr;
  int64_t s_out_stride_n = 0, s_out_stride_h = 0;
  int64_t n = 0;  // rows: may pass 2^31 at small head_dim
  int num_states = 0, num_heads = 0, head_dim = 0;
};
void launch_merge_states(const MergeStatesParams& params, void* stream);

struct AppendKVParams {
  void* k_pages = nullptr;
  void* v_pages = nullptr;
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;
  const int32_t* kv_page_indptr = nullptr;
  const int32_t* kv_page_indices = nullptr;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t new_stride_n = 0, new_stride_h = 0;
  const int32_t* batch_indices = nullptr;
  const int32_t* positions = nullptr;
  int num_tokens = 0, num_kv_heads = 0, head_dim = 0, elem_bytes = 2;
  FastDivmod page;
};
// The parameters of append_kv(kv, k_new, v_new, ...) (v_new with k_new's strides); the engine's
// fused RoPE + K/V store reads the same ones.
AppendKVParams append_kv_params(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
                                const TensorView& batch_indices, const TensorView& positions);
void launch_append_kv(const AppendKVParams& params, void* stream);

// Reads `bytes` (a multiple of 16) of device memory at `data` with 16-byte loads on `stream`;
// `sink` (one device word) is written only for a sentinel XOR, so the loads stay. streaming:
// cache-streaming loads (the ceiling below); else plain loads, whose lines replace what the L2
// held (the engine's GEMM tuning flushes the L2 this way).
void launch_read(const void* data, size_t bytes, unsigned* sink, bool streaming, void* stream);

// Streams `bytes` of device memory through 16-byte loads `reps` times (after >= 100 ms of warm-up) on
// `stream` and returns the median read bandwidth in GB/s: the decode ceiling. Allocates and frees
// `bytes` of device memory and synchronises; for benchmarks, never on a serving path.
double measure_read_bandwidth_gbps(size_t bytes, int reps, void* stream);

}  // namespace gqattn::kernels
