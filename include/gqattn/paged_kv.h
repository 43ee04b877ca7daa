// The paged KV cache descriptor, ragged (contiguous varlen) K/V, and block-table <-> CSR helpers.
// Layer: include/gqattn (public, host-only).
#pragma once

#include <cstdint>
#include <vector>

#include "gqattn/tensor.h"

namespace gqattn {

// Which dimension of a page pool holds heads and which holds tokens.
//   kHND: k_pages[num_pages, num_kv_heads, page_size, head_dim]
//   kNHD: k_pages[num_pages, page_size, num_kv_heads, head_dim]
// Both are read through the view's strides, so neither needs to be contiguous beyond the last
// dimension (for example a K/V pair stored as one [num_pages, 2, ...] tensor works unchanged).
enum class KVLayout { kNHD, kHND };

const char* layout_name(KVLayout layout);

// A batch of requests whose K/V live in pages of a shared pool, described in CSR form:
//   request b owns pages kv_page_indices[kv_page_indptr[b] .. kv_page_indptr[b+1]) in order;
//   its last page holds kv_last_page_len[b] tokens (1..page_size; 0 only when it owns no page), so
//   kv_len[b] = (num_pages_b - 1) * page_size + kv_last_page_len[b], or 0 with no page.
// All index tensors are int32 and live on the same device as the pools.
struct PagedKV {
  TensorView k_pages;
  TensorView v_pages;
  KVLayout layout = KVLayout::kNHD;
  TensorView kv_page_indptr;    // int32 [batch + 1]
  TensorView kv_page_indices;   // int32 [kv_page_indptr[batch]]
  TensorView kv_last_page_len;  // int32 [batch]

  bool defined() const { return k_pages.defined(); }
  int64_t num_pages() const { return k_pages.shape[0]; }
  int64_t num_kv_heads() const { return layout == KVLayout::kHND ? k_pages.shape[1] : k_pages.shape[2]; }
  int64_t page_size() const { return layout == KVLayout::kHND ? k_pages.shape[2] : k_pages.shape[1]; }
  int64_t head_dim() const { return k_pages.shape[3]; }
  int64_t batch() const { return kv_page_indptr.shape[0] - 1; }
  // Element strides of a page pool, independent of the layout.
  int64_t page_stride() const { return k_pages.strides[0]; }
  int64_t head_stride() const { return layout == KVLayout::kHND ? k_pages.strides[1] : k_pages.strides[2]; }
  int64_t token_stride() const { return layout == KVLayout::kHND ? k_pages.strides[2] : k_pages.strides[1]; }
};

// K/V of a varlen batch stored contiguously: request b's tokens are rows
// kv_indptr[b] .. kv_indptr[b+1] of k and v ([total_kv, num_kv_heads, head_dim]).
struct RaggedKV {
  TensorView k;
  TensorView v;
  TensorView kv_indptr;  // int32 [batch + 1]

  bool defined() const { return k.defined(); }
  int64_t batch() const { return kv_indptr.shape[0] - 1; }
};

// Host-side CSR page table: the form PagedKV's index tensors take, as vectors.
struct PageTableCSR {
  std::vector<int32_t> kv_page_indptr;
  std::vector<int32_t> kv_page_indices;
  std::vector<int32_t> kv_last_page_len;
};

// Host-side padded block table: row b lists request b's pages; entries past its length are unused.
struct BlockTable {
  int batch = 0;
  int max_pages = 0;                 // columns of `pages`
  std::vector<int32_t> pages;        // [batch, max_pages], row-major
  std::vector<int32_t> kv_len;       // [batch], tokens
};

// Converts between the two forms. Throws gqattn::Error if page_size < 1, a length is negative or
// needs more pages than the row holds, the vectors' sizes disagree with batch (and max_pages), or
// a CSR table is malformed (kv_lengths' rules; fewer page ids than kv_page_indptr[batch]).
PageTableCSR block_table_to_csr(const BlockTable& table, int page_size);
BlockTable csr_to_block_table(const PageTableCSR& csr, int page_size);

// kv_len of each request of a CSR table: (pages - 1) * page_size + last_page_len, or 0. Throws
// gqattn::Error unless page_size >= 1, kv_page_indptr starts at 0 and never decreases,
// kv_last_page_len holds batch entries in [1, page_size] (0 for a request without pages) and every
// kv_len fits in int32.
std::vector<int32_t> kv_lengths(const std::vector<int32_t>& kv_page_indptr,
                                const std::vector<int32_t>& kv_last_page_len, int page_size);

}  // namespace gqattn
