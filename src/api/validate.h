// Validation of every public entry's arguments: each check throws gqattn::Error naming the
// argument and the offending values, and all of them run before any work, so a rejected call
// writes nothing. Layer: src/api (host-only). The CLI reuses validate_plan_inputs so that a
// configuration is judged by exactly one set of rules.
#pragma once

#include <cstdint>

#include "gqattn/attention.h"

namespace gqattn {

// Largest head_dim the CPU backend accepts (its cost is linear in head_dim; the bound only
// catches nonsense such as an uninitialised field).
constexpr int kCpuMaxHeadDim = 512;
// Most new tokens per request in one CUDA decode (packed with the group into the MMA rows).
constexpr int kCudaMaxDecodeQoLen = 8;
// Most packed query rows (qo_len x group size) of one request: the work list and the kernels index
// them in int32 (row_begin + a tile, FastDivmod by the group), so 2^30 leaves them headroom.
constexpr int64_t kMaxPackedRows = int64_t(1) << 30;
// Most keys of one request: the kernels index keys in int32 and run up to a few tiles past the
// last (tile starts, page lookups ahead), the planner doubles chunk sizes up to it.
constexpr int64_t kMaxKvLen = int64_t(1) << 30;
// Alignment of data pointers and row strides that the GPU kernels' 16-byte vector loads need.
constexpr int64_t kCudaAlignBytes = 16;

// Host facts of a batch: heads, head_dim, dtype, page_size, the CSR/indptr vectors, qo_len,
// causal alignment, checked-mode page ids; for CUDA also that this build compiled the variant.
void validate_plan_inputs(const PlanInputs& inputs, bool is_decode);

// Tensors of a run against the plan they are used with: shapes, dtypes, devices, strides,
// outputs apart from the inputs and each other (o may be q itself) and (CUDA) alignment. On the CPU the index tensors are also read and checked against the plan's
// lengths and the page pool, so the CPU backend never reads out of bounds.
void validate_decode_args(const Plan& plan, const DecodeArgs& args);
void validate_prefill_args(const Plan& plan, const PrefillArgs& args);

// append_kv's tensors; on the CPU also every token's request, position and page slot.
void validate_append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
                        const TensorView& batch_indices, const TensorView& positions);

// merge_states' tensors: v [n, num_states, num_heads, head_dim], s fp32 [n, num_states, num_heads],
// v_merged [n, num_heads, head_dim], optional s_merged fp32 [n, num_heads].
void validate_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                           const TensorView& s_merged);

}  // namespace gqattn
