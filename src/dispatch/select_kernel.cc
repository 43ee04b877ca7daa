// select_kernel(): the kernel table of this build and the choice among its rows.
// Layer: src/dispatch (host-only; declares the generated instantiations, never includes bodies).
#include "dispatch/select_kernel.h"

#include <algorithm>

#include "api/env_flag.h"
#include "gqattn/error.h"

namespace gqattn::dispatch {
namespace {

using kernels::AttentionKernel;
using kernels::AttnShape;
using kernels::Family;

// The wgmma kernel's split fixed cost in its keys (KernelChoice::merge_fixed_keys says why).
constexpr double kWgmmaMergeFixedKeys = 320;

template <DType D, int HeadDim, Family F>
KernelChoice entry() {
  KernelChoice c;
  c.dtype = D;
  c.head_dim = HeadDim;
  c.family = F;
  c.cta_rows = AttnShape<F, HeadDim>::kCtaRows;
  c.kv_tile = kernels::AttnConfig<F, HeadDim>::kKVTile;
  if constexpr (kernels::is_sm90_family(F)) {
    c.split_keys = kernels::AttnConfig<F, HeadDim>::kSplitKeys;
    c.merge_fixed_keys = kWgmmaMergeFixedKeys;
  }
  c.key_time = F == Family::kDecode || F == Family::kDecodeMany || F == Family::kDecodeLong ? 1.0 : 1.36;
  c.smem_bytes = AttnShape<F, HeadDim>::kSmemBytes;
  c.launch = &AttentionKernel<D, HeadDim, F>::launch;
  c.ctas_per_sm = &AttentionKernel<D, HeadDim, F>::ctas_per_sm;
  return c;
}

template <DType D, int HeadDim>
void add_families(std::vector<KernelChoice>& table) {
  table.push_back(entry<D, HeadDim, Family::kDecode>());
  if constexpr (HeadDim <= kernels::kDecodeMidMaxHeadDim) table.push_back(entry<D, HeadDim, Family::kDecodeMid>());
  if constexpr (HeadDim == kernels::kDecodeManyHeadDim) table.push_back(entry<D, HeadDim, Family::kDecodeMany>());
  if constexpr (HeadDim == kernels::kDecodeLongHeadDim) table.push_back(entry<D, HeadDim, Family::kDecodeLong>());
  table.push_back(entry<D, HeadDim, Family::kDecodeWide>());
  table.push_back(entry<D, HeadDim, Family::kPrefill>());
#ifdef GQATTN_BUILT_SM90
  if constexpr (kernels::sm90_head_dim(HeadDim)) table.push_back(entry<D, HeadDim, Family::kPrefillSm90>());
  if constexpr (HeadDim == kernels::kPrefillSm90WideHeadDim) table.push_back(entry<D, HeadDim, Family::kPrefillSm90Wide>());
#endif
}

std::vector<KernelChoice> make_table() {
  std::vector<KernelChoice> t;
#ifdef GQATTN_BUILT_BF16_HD64
  add_families<DType::kBF16, 64>(t);
#endif
#ifdef GQATTN_BUILT_BF16_HD80
  add_families<DType::kBF16, 80>(t);
#endif
#ifdef GQATTN_BUILT_BF16_HD96
  add_families<DType::kBF16, 96>(t);
#endif
#ifdef GQATTN_BUILT_BF16_HD112
  add_families<DType::kBF16, 112>(t);
#endif
#ifdef GQATTN_BUILT_BF16_HD128
  add_families<DType::kBF16, 128>(t);
#endif
#ifdef GQATTN_BUILT_BF16_HD256
  add_families<DType::kBF16, 256>(t);
#endif
#ifdef GQATTN_BUILT_FP16_HD64
  add_families<DType::kFP16, 64>(t);
#endif
#ifdef GQATTN_BUILT_FP16_HD80
  add_families<DType::kFP16, 80>(t);
#endif
#ifdef GQATTN_BUILT_FP16_HD96
  add_families<DType::kFP16, 96>(t);
#endif
#ifdef GQATTN_BUILT_FP16_HD112
  add_families<DType::kFP16, 112>(t);
#endif
#ifdef GQATTN_BUILT_FP16_HD128
  add_families<DType::kFP16, 128>(t);
#endif
#ifdef GQATTN_BUILT_FP16_HD256
  add_families<DType::kFP16, 256>(t);
#endif
  for (size_t i = 0; i < t.size(); ++i) t[i].id = static_cast<int>(i);
  return t;
}

const std::vector<KernelChoice>& table() {
  static const std::vector<KernelChoice> t = make_table();
  return t;
}

// Packed rows per CTA of the three decode families (16, 32 and 64).
constexpr int kDecodeRows = AttnShape<Family::kDecode, 128>::kCtaRows;
constexpr int kDecodeMidRows = AttnShape<Family::kDecodeMid, 128>::kCtaRows;
constexpr int kDecodeWideRows = AttnShape<Family::kDecodeWide, 128>::kCtaRows;
// The share of the SMs the wgmma kernel's decode items must fill (H200: 27 of 132) to take 17..64 rows:
// with both consumer warpgroups on an item's keys (Plan::split_item_keys) and split-KV, a batch of
// 32 MQA requests too (perf-notes items 94, 97: MQA 32 x 2K-32K 1.12-1.15x).
constexpr double kWgmmaDecodeFill = 0.2;
// 17..32 rows take 16-row items where requests x K/V heads x kRowTiles16Share <= SMs (H200: <= 2).
constexpr int64_t kRowTiles16Share = 64;
// <= 16 rows take decode_many where requests x K/V heads >= kDecodeManyPerSm x SMs (H200: >= 396).
constexpr int64_t kDecodeManyPerSm = 3;
// ... and at most this many keys a request on average, where the lengths are known (not in CUDA-graph
// mode): H200 (perf-notes item 88) 1.02-1.14x at 512-2K keys, 0.987x at 8K-32K.
constexpr int64_t kDecodeManyMaxMeanKeys = 4096;
// <= 16 rows at hd64 take decode_long where kDecodeLongMinItems <= requests x K/V heads <
// kDecodeManyPerSm x SMs and the plan knows that a request has >= kDecodeLongMinMeanKeys keys on
// average (perf-notes items 96, 99).
constexpr int64_t kDecodeLongMinItems = 128;
constexpr int64_t kDecodeLongMinMeanKeys = 2048;
// prefill_sm90_wide where the plan knows that a request has >= kWideMinMeanRows packed rows a
// K/V head on average (kWideMinMeanRowsCausal in a causal plan) and its 192-row items number at
// least the SMs (perf-notes item 126). Non-causal from 2048 since item 286 (item 288, H100: MHA
// hd64 8 x 2K 1.15x, 4 x 3000 1.21x, GQA-2 8 x 1K 1.08x); causal plans keep 4096: there the
// 192-row items compute up to 1.18x the visible pairs at 2048 rows, against 1.07x in 128-row items
// (item 283).
constexpr int64_t kWideMinMeanRows = 2048;
constexpr int64_t kWideMinMeanRowsCausal = 4096;

}  // namespace

bool sm90_disabled() {
  static const bool disabled = env_flag("GQATTN_DISABLE_SM90");
  return disabled;
}

bool decode_many_disabled() {
  static const bool disabled = env_flag("GQATTN_DISABLE_DECODE_MANY");
  return disabled;
}

bool sm90_wide_disabled() {
  static const bool disabled = env_flag("GQATTN_DISABLE_SM90_WIDE");
  return disabled;
}

bool decode_long_disabled() {
  static const bool disabled = env_flag("GQATTN_DISABLE_DECODE_LONG");
  return disabled;
}

KernelChoice select_kernel(DType dtype, int head_dim, int max_packed_rows, int sm, int64_t requests_x_kv_heads,
                           int num_sms, int64_t mean_kv_len, int64_t mean_rows, int max_smem, bool causal) {
  GQ_CHECK(dtype == DType::kBF16 || dtype == DType::kFP16, "dtype ", dtype_name(dtype),
           " is not supported by the CUDA kernels (bf16, fp16)");
  Family family = max_packed_rows <= kDecodeRows       ? Family::kDecode
                  : max_packed_rows <= kDecodeMidRows && head_dim <= kernels::kDecodeMidMaxHeadDim
                      ? Family::kDecodeMid
                  : max_packed_rows <= kDecodeWideRows ? Family::kDecodeWide
                                                       : Family::kPrefill;
  // Decode rows of the wider families on the wgmma kernel where its 128-row items (one a request and
  // K/V head at <= 64 rows) fill at least kWgmmaDecodeFill of the SMs. Measured at hd128 only
  // (session 13's table: MQA with 4 draft tokens on the wgmma kernel against MQA on decode_mid, the
  // same K/V: 128 x 2K 45.5 against 60.6 us, 128 x 32K 554 against 564; at 32 requests the wgmma
  // kernel splits and loses, 30.6 against 24.7 us at 2K).
  const bool wgmma_decode = (family == Family::kDecodeMid || family == Family::kDecodeWide) && head_dim == 128 &&
                            num_sms > 0 && requests_x_kv_heads >= kWgmmaDecodeFill * num_sms;
  // The wgmma path exists for sm_90 exactly (sm_90a code does not run on later architectures).
  if ((family == Family::kPrefill || wgmma_decode) && sm == 90 && !sm90_disabled()) {
    // hd64 with long query rows: three consumer warpgroups, 192-row items. H200 (perf-notes item
    // 126): 1 x 16K 1.01-1.09x, GQA-8 / MQA 8 x 2K 1.02-1.04x; where all hd64 prefill took it, MHA
    // 16 x 1K (1024 rows a K/V head) 0.79-0.92x and chunked prefill (88 items) 0.81x. Only where
    // the plan knows the rows.
    const int64_t wide_rows = AttnShape<Family::kPrefillSm90Wide, kernels::kPrefillSm90WideHeadDim>::kCtaRows;
    const bool wide = family == Family::kPrefill && head_dim == kernels::kPrefillSm90WideHeadDim &&
                      mean_rows >= (causal ? kWideMinMeanRowsCausal : kWideMinMeanRows) && num_sms > 0 &&
                      requests_x_kv_heads * ((mean_rows + wide_rows - 1) / wide_rows) >= num_sms &&
                      !sm90_wide_disabled();
    const Family sm90_family = wide ? Family::kPrefillSm90Wide : Family::kPrefillSm90;
    for (const KernelChoice& c : table())
      if (c.dtype == dtype && c.head_dim == head_dim && c.family == sm90_family &&
          (max_smem <= 0 || c.smem_bytes <= max_smem))
        return c;
  }
  // 17..32 rows at hd128 as two 16-row items a request and K/V head (both read its K/V, the second
  // mostly from the L2) where so few requests x K/V heads run that decode_mid splits each
  // request's keys into up to 256 chunks: half the splits, half the merge. From the batch, not
  // the lengths (one kernel for a CUDA graph's plans). MQA on the H200 (perf-notes item 72),
  // 16-row items against decode_mid at 512..32K keys: batch 1 1.15-1.28x, batch 2 1.00-1.14x,
  // batch 4 0.87-1.16x, batch 8 0.77-1.13x (the long requests lose: twice the K/V traffic).
  const bool row_tiles16 = family == Family::kDecodeMid && head_dim == 128 && num_sms > 0 &&
                           requests_x_kv_heads > 0 && requests_x_kv_heads * kRowTiles16Share <= num_sms;
  if (row_tiles16) family = Family::kDecode;
  // <= 16 rows at hd128 with enough requests x K/V heads that the unsplit items fill four CTAs an
  // SM nearly everywhere: decode_many's 32-key tiles, four CTAs an SM. H200 (perf-notes item 85:
  // 512-4096 items) 1.00-1.12x at 512-2K keys, 0.986x at 8K-32K; with fewer items its doubled
  // CTA target makes the planner split (GQA-8 32 x 2K 0.94x), and latency-bound split items take
  // two round trips where 64-key tiles take one (GQA-8 1 x 512 0.79x). From the batch, and from
  // the mean length only where the plan knows it: a CUDA graph's plans take decode_many at any
  // length (0.987x at 8K-32K keys), its replays keep one kernel.
  const bool many = family == Family::kDecode && head_dim == kernels::kDecodeManyHeadDim && sm == 90 &&
                    num_sms > 0 && requests_x_kv_heads >= kDecodeManyPerSm * num_sms &&
                    mean_kv_len <= kDecodeManyMaxMeanKeys && !decode_many_disabled();
  if (many) family = Family::kDecodeMany;
  // <= 16 rows at hd64 where a few hundred requests x K/V heads (about one to three per SM) stream
  // >= 2048 keys each on average: decode_long's 128-key tiles, two CTAs an SM. H200 (perf-notes
  // item 99, 128-key tiles for every hd64 row): GQA-8 32 x 2K / 8K / 32K 1.105 / 1.052 / 1.041x,
  // MHA 8 x 2K 1.067x; outside this rule they lost: many short items 0.81-0.94x (four CTAs an SM
  // of 64-key tiles overlap their starts), few or short requests 0.92-0.99x (a split's chunks
  // are whole 128-key tiles). Only where the plan knows the lengths (not in CUDA-graph mode).
  const bool long_tiles = family == Family::kDecode && head_dim == kernels::kDecodeLongHeadDim && sm == 90 &&
                          num_sms > 0 && requests_x_kv_heads >= kDecodeLongMinItems &&
                          requests_x_kv_heads < kDecodeManyPerSm * num_sms && mean_kv_len >= kDecodeLongMinMeanKeys &&
                          !decode_long_disabled();
  if (long_tiles) family = Family::kDecodeLong;
  bool head_dim_built = false, dtype_built = false;
  for (const KernelChoice& c : table()) {
    head_dim_built |= c.head_dim == head_dim;
    dtype_built |= c.dtype == dtype;
    if (c.dtype != dtype || c.head_dim != head_dim || c.family != family) continue;
    if (max_smem <= 0 || c.smem_bytes <= max_smem) return c;
    // Too big for this device: another family of this dtype and head_dim (fit_shared_memory).
    std::vector<FamilyFit> rows;
    std::vector<const KernelChoice*> row_choice;
    int wanted = -1;
    for (const KernelChoice& r : table()) {
      if (r.dtype != dtype || r.head_dim != head_dim) continue;
      if (&r == &c) wanted = static_cast<int>(rows.size());
      rows.push_back(FamilyFit{r.family, r.cta_rows, r.smem_bytes});
      row_choice.push_back(&r);
    }
    const int fit = fit_shared_memory(rows, wanted, max_packed_rows, max_smem);
    GQ_CHECK(fit >= 0, "head_dim ", head_dim, ": no attention kernel of this build fits the device's ", max_smem,
             " bytes of shared memory a block (the one chosen takes ", c.smem_bytes, ")");
    return *row_choice[fit];
  }
  GQ_CHECK(head_dim_built, "head_dim ", head_dim,
           " is not compiled for the GPU in this build (add it to -DGQATTN_HEAD_DIMS; generated "
           "variants: 64, 80, 96, 112, 128, 256)");
  GQ_CHECK(dtype_built, "dtype ", dtype_name(dtype), " is not compiled for the GPU in this build (add it to -DGQATTN_DTYPES)");
  throw Error(detail::concat("dtype ", dtype_name(dtype), " with head_dim ", head_dim,
                             " is not compiled for the GPU in this build (-DGQATTN_DTYPES / -DGQATTN_HEAD_DIMS)"));
}

const KernelChoice& kernel_by_id(int id) {
  GQ_CHECK(id >= 0 && id < static_cast<int>(table().size()), "plan: kernel id ", id,
           " is not in this build's kernel table (was the plan made for the CUDA backend?)");
  return table()[id];
}

std::vector<int> built_head_dims() {
  std::vector<int> out;
  for (const KernelChoice& c : table())
    if (std::find(out.begin(), out.end(), c.head_dim) == out.end()) out.push_back(c.head_dim);
  return out;
}

std::vector<DType> built_dtypes() {
  std::vector<DType> out;
  for (const KernelChoice& c : table())
    if (std::find(out.begin(), out.end(), c.dtype) == out.end()) out.push_back(c.dtype);
  return out;
}

}  // namespace gqattn::dispatch
