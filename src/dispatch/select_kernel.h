// select_kernel(): the one function that says whether a configuration runs on the GPU and which
// compiled attention variant runs it. Layer: src/dispatch (host-only).
#pragma once

#include <cstdint>
#include <vector>

#include "gqattn/tensor.h"
#include "kernels/launch.h"
#include "plan/planner.h"

namespace gqattn::dispatch {

struct KernelChoice {
  int id = -1;  // row of the kernel table
  DType dtype = DType::kBF16;
  int head_dim = 0;
  kernels::Family family = kernels::Family::kDecode;
  int cta_rows = 0;  // packed query rows per work item
  int kv_tile = 0;   // keys per pipeline tile
  bool split_keys = false;  // the wgmma kernel's items of <= 64 rows may split keys (AttnConfig::kSplitKeys)
  // Time per key relative to the decode family's, the split heuristic's unit (H200, unsplit MQA
  // and GQA-8 at 128 x 512: decode_wide 23.6 us, decode 17.3 us); the wider families use 1.36.
  double key_time = 1.0;
  // The split's fixed cost in keys of this kernel (plan::choose_kv_chunk's merge_fixed_keys):
  // plan::kMergeFixedKeys for the mma.sync kernels; 320 for the wgmma kernel, whose 128-key tiles
  // make the same few us of a second launch more keys (H200, perf-notes items 156 and 158: MQA 32
  // x 512 unsplit 13.8 us, 4 chunks of 128 keys 14.8, 2 of 256 15.6, which the planner had priced
  // 392 / 456 keys against 576).
  double merge_fixed_keys = plan::kMergeFixedKeys;
  int smem_bytes = 0;  // dynamic shared memory a CTA (AttnShape::kSmemBytes)
  void (*launch)(const kernels::AttentionParams&, int, void*) = nullptr;
  int (*ctas_per_sm)() = nullptr;
};

// What fit_shared_memory() needs of a kernel-table row.
struct FamilyFit {
  kernels::Family family;
  int cta_rows;
  int smem_bytes;
};

// The row of `rows` (one dtype and head_dim's rows in table order) that runs where the chosen one,
// rows[wanted], needs more dynamic shared memory a CTA than the device allows (`max_smem`,
// cudaDevAttrMaxSharedMemoryPerBlockOptin; 0: no limit): 99 KB on sm_86, sm_89 and sm_120, where
// the decode family at head_dim 128 takes 100 KB and decode_mid / decode_wide more (163 KB on
// sm_80, 227 KB on sm_90: every row fits). Of the portable rows that fit, the one with the fewest
// rows a CTA that still holds `max_packed_rows`, else the one with the most (the first listed on a
// tie); -1 where none fits. Any family computes the same attention (the planner tiles a request's
// rows by its cta_rows); which is fastest on those devices was never measured.
inline int fit_shared_memory(const std::vector<FamilyFit>& rows, int wanted, int max_packed_rows, int max_smem) {
  if (max_smem <= 0 || rows[wanted].smem_bytes <= max_smem) return wanted;
  int holding = -1, widest = -1;  // the fewest rows that hold max_packed_rows; the most rows
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const FamilyFit& r = rows[i];
    if (r.smem_bytes > max_smem || kernels::is_sm90_family(r.family)) continue;
    if (r.cta_rows >= max_packed_rows && (holding < 0 || r.cta_rows < rows[holding].cta_rows)) holding = i;
    if (widest < 0 || r.cta_rows > rows[widest].cta_rows) widest = i;
  }
  return holding >= 0 ? holding : widest;
}

// Picks the variant for `max_packed_rows` = the largest group_size x qo_len of the batch: the
// decode family up to 16 rows, decode_mid up to 32 (head_dim <= 128), decode_wide up to 64, prefill above
// (attention_config.h); on a device of compute capability `sm` = 90 the prefill rows go to the
// wgmma kernel when it was built (GQATTN_CUDA_ARCHS with 90a) and GQATTN_DISABLE_SM90 is not set.
// Every kernel may split keys (items of key chunks, merged afterwards), as plan::choose_kv_chunk
// decides. Throws gqattn::Error naming GQATTN_HEAD_DIMS / GQATTN_DTYPES when the variant was not built.
// `requests_x_kv_heads` (requests with query rows times K/V heads) and `num_sms`, when given, let
// 17..64 rows at head_dim 128 on sm_90 take the wgmma kernel where its items (one row tile of a
// request and K/V head) number at least a fifth of the SMs (kWgmmaDecodeFill; 7/8 until item 97):
// there it streams as fast as decode_mid / decode_wide at long contexts and 1.3x faster at 2K
// (perf-notes item 61); and let
// 17..32 rows at head_dim 128 take the decode family's 16-row items (two a request and K/V head)
// where requests_x_kv_heads x 64 <= num_sms (perf-notes item 75: MQA at batch 1-2); and let
// <= 16 rows at head_dim 128 on sm_90 take decode_many (32-key tiles, four CTAs an SM) where
// requests_x_kv_heads >= 3 x num_sms and `mean_kv_len` (keys a request with query rows, on
// average; 0 where not known, as in CUDA-graph mode) <= 4096 (perf-notes items 85, 86, 88); and
// let <= 16 rows at head_dim 64 on sm_90 take decode_long (128-key tiles, two CTAs an SM) where
// 128 <= requests_x_kv_heads < 3 x num_sms and mean_kv_len >= 2048 (perf-notes items 96, 99); and
// let prefill rows at head_dim 64 on sm_90 take prefill_sm90_wide (three consumer warpgroups,
// 192-row items) where `mean_rows` (packed rows a request with query rows has at each K/V head, on
// average; 0 where not known, as in CUDA-graph mode) >= 2048 (4096 where `causal`) and its items
// number >= num_sms (perf-notes item 126). `max_smem` (the device's dynamic shared memory a CTA
// may take; 0: not known) replaces a family that would not fit by one that does
// (fit_shared_memory), or throws where none does.
KernelChoice select_kernel(DType dtype, int head_dim, int max_packed_rows, int sm = 0, int64_t requests_x_kv_heads = 0,
                           int num_sms = 0, int64_t mean_kv_len = 0, int64_t mean_rows = 0, int max_smem = 0,
                           bool causal = false);
// Whether GQATTN_DISABLE_SM90 (read once per process) keeps Hopper on the portable prefill kernel.
bool sm90_disabled();
// Whether GQATTN_DISABLE_DECODE_MANY (read once per process) keeps <= 16 rows on the decode family.
bool decode_many_disabled();
// Whether GQATTN_DISABLE_SM90_WIDE (read once per process) keeps hd64 prefill on prefill_sm90.
bool sm90_wide_disabled();
// Whether GQATTN_DISABLE_DECODE_LONG (read once per process) keeps <= 16 rows at hd64 on the decode family.
bool decode_long_disabled();
// The kernel table row chosen earlier by select_kernel (for run()).
const KernelChoice& kernel_by_id(int id);

// The head dims and dtypes compiled into this build.
std::vector<int> built_head_dims();
std::vector<DType> built_dtypes();

}  // namespace gqattn::dispatch
