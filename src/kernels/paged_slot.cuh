// Where a new token's K/V row lands in a paged pool: the page-table lookup shared by append_kv
// and the engine's fused RoPE + K/V store. Layer: src/kernels (device only).
#pragma once

#include <cstdint>

#include "prims/fast_divmod.h"

namespace gqattn::kernels {

// The element offset of (position pos of request b, K/V head 0) in a pool whose pages are listed
// in CSR form (kv_page_indptr / kv_page_indices), or -1 when pos is negative or beyond the
// request's pages (padding rows: skipped). Add head * head_stride for another head.
__device__ __forceinline__ int64_t paged_slot(const int32_t* kv_page_indptr, const int32_t* kv_page_indices, int b,
                                              int pos, const FastDivmod& page, int64_t page_stride,
                                              int64_t token_stride) {
  if (pos < 0) return -1;
  const int first_page = kv_page_indptr[b];
  const int num_pages = kv_page_indptr[b + 1] - first_page;
  uint32_t p, slot;
  page.divmod(static_cast<uint32_t>(pos), p, slot);
  if (static_cast<int>(p) >= num_pages) return -1;
  return static_cast<int64_t>(kv_page_indices[first_page + p]) * page_stride + slot * token_stride;
}

}  // namespace gqattn::kernels
