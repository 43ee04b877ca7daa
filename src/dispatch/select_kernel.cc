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

template <DType D, int HeadDim, Family F>
KernelChoice entry() {
  KernelChoice c;
  c.dtype = D;
  c.head_dim = HeadDim;
  c.family = F;
  c.cta_rows = AttnShape<F, HeadDim>::kCtaRows;
  c.kv_tile = kernels::AttnConfig<F, HeadDim>::kKVTile;
  c.key_time = F == Family::kDecode ? 1.0 : 1.36;
  c.launch = &AttentionKernel<D, HeadDim, F>::launch;
  c.ctas_per_sm = &AttentionKernel<D, HeadDim, F>::ctas_per_sm;
  return c;
}

template <DType D, int HeadDim>
void add_families(std::vector<KernelChoice>& table) {
  table.push_back(entry<D, HeadDim, Family::kDecode>());
  if constexpr (HeadDim <= kernels::kDecodeMidMaxHeadDim) table.push_back(entry<D, HeadDim, Family::kDecodeMid>());
  table.push_back(entry<D, HeadDim, Family::kDecodeWide>());
  table.push_back(entry<D, HeadDim, Family::kPrefill>());
#ifdef GQATTN_BUILT_SM90
  table.push_back(entry<D, HeadDim, Family::kPrefillSm90>());
#endif
}

std::vector<KernelChoice> make_table() {
  std::vector<KernelChoice> t;
#ifdef GQATTN_BUILT_BF16_HD64
  add_families<DType::kBF16, 64>(t);
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

}  // namespace

bool sm90_disabled() {
  static const bool disabled = env_flag("GQATTN_DISABLE_SM90");
  return disabled;
}

KernelChoice select_kernel(DType dtype, int head_dim, int max_packed_rows, int sm) {
  GQ_CHECK(dtype == DType::kBF16 || dtype == DType::kFP16, "dtype ", dtype_name(dtype),
           " is not supported by the CUDA kernels (bf16, fp16)");
  Family family = max_packed_rows <= kDecodeRows       ? Family::kDecode
                  : max_packed_rows <= kDecodeMidRows && head_dim <= kernels::kDecodeMidMaxHeadDim
                      ? Family::kDecodeMid
                  : max_packed_rows <= kDecodeWideRows ? Family::kDecodeWide
                                                       : Family::kPrefill;
  // The wgmma path exists for sm_90 exactly (sm_90a code does not run on later architectures).
  if (family == Family::kPrefill && sm == 90 && !sm90_disabled()) {
    for (const KernelChoice& c : table())
      if (c.dtype == dtype && c.head_dim == head_dim && c.family == Family::kPrefillSm90) return c;
  }
  bool head_dim_built = false, dtype_built = false;
  for (const KernelChoice& c : table()) {
    head_dim_built |= c.head_dim == head_dim;
    dtype_built |= c.dtype == dtype;
    if (c.dtype == dtype && c.head_dim == head_dim && c.family == family) return c;
  }
  GQ_CHECK(head_dim_built, "head_dim ", head_dim,
           " is not compiled for the GPU in this build (add it to -DGQATTN_HEAD_DIMS; generated "
           "variants: 64, 128, 256)");
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
