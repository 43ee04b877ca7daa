// Block-table <-> CSR page-table conversions and kv_len from a CSR table.
// Layer: src/api (host-only), behind include/gqattn/paged_kv.h.
#include "gqattn/paged_kv.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gqattn/error.h"

namespace gqattn {

namespace {

int64_t pages_for(int64_t kv_len, int page_size) { return (kv_len + page_size - 1) / page_size; }

}  // namespace

std::vector<int32_t> kv_lengths(const std::vector<int32_t>& kv_page_indptr,
                                const std::vector<int32_t>& kv_last_page_len, int page_size) {
  GQ_CHECK(page_size >= 1, "page_size (", page_size, ") must be >= 1");
  GQ_CHECK(!kv_page_indptr.empty(), "kv_page_indptr: must hold batch + 1 entries, got none");
  const size_t batch = kv_page_indptr.size() - 1;
  GQ_CHECK(kv_last_page_len.size() == batch, "kv_last_page_len: expected ", batch,
           " entries (batch), got ", kv_last_page_len.size());
  GQ_CHECK(kv_page_indptr[0] == 0, "kv_page_indptr[0] must be 0, got ", kv_page_indptr[0]);
  std::vector<int32_t> kv_len(batch);
  for (size_t b = 0; b < batch; ++b) {
    const int64_t pages = int64_t(kv_page_indptr[b + 1]) - kv_page_indptr[b];
    GQ_CHECK(pages >= 0, "kv_page_indptr must be non-decreasing: kv_page_indptr[", b + 1, "] (",
             kv_page_indptr[b + 1], ") < kv_page_indptr[", b, "] (", kv_page_indptr[b], ")");
    const int32_t last = kv_last_page_len[b];
    if (pages == 0) {
      GQ_CHECK(last == 0, "kv_last_page_len[", b, "] (", last,
               ") must be 0: request ", b, " owns no page");
      kv_len[b] = 0;
      continue;
    }
    GQ_CHECK(last >= 1 && last <= page_size, "kv_last_page_len[", b, "] (", last,
             ") must be in [1, page_size (", page_size, ")]: request ", b, " owns ", pages,
             " pages");
    const int64_t len = (pages - 1) * page_size + last;
    GQ_CHECK(len <= INT32_MAX, "kv_len of request ", b, " (", len, ") does not fit in int32");
    kv_len[b] = int32_t(len);
  }
  return kv_len;
}

PageTableCSR block_table_to_csr(const BlockTable& table, int page_size) {
  GQ_CHECK(page_size >= 1, "page_size (", page_size, ") must be >= 1");
  GQ_CHECK(table.batch >= 0, "block table: batch (", table.batch, ") must be >= 0");
  GQ_CHECK(table.max_pages >= 0, "block table: max_pages (", table.max_pages, ") must be >= 0");
  GQ_CHECK(table.pages.size() == size_t(table.batch) * size_t(table.max_pages),
           "block table: pages holds ", table.pages.size(), " entries, expected batch (",
           table.batch, ") x max_pages (", table.max_pages, ")");
  GQ_CHECK(table.kv_len.size() == size_t(table.batch), "block table: kv_len holds ",
           table.kv_len.size(), " entries, expected batch (", table.batch, ")");
  PageTableCSR csr;
  csr.kv_page_indptr.reserve(table.batch + 1);
  csr.kv_page_indptr.push_back(0);
  for (int b = 0; b < table.batch; ++b) {
    const int32_t len = table.kv_len[b];
    GQ_CHECK(len >= 0, "block table: kv_len[", b, "] (", len, ") is negative");
    const int64_t pages = pages_for(len, page_size);
    GQ_CHECK(pages <= table.max_pages, "block table: kv_len[", b, "] (", len, ") needs ", pages,
             " pages of ", page_size, " tokens but a row holds max_pages (", table.max_pages, ")");
    for (int64_t p = 0; p < pages; ++p)
      csr.kv_page_indices.push_back(table.pages[size_t(b) * table.max_pages + p]);
    csr.kv_page_indptr.push_back(int32_t(csr.kv_page_indices.size()));
    csr.kv_last_page_len.push_back(pages == 0 ? 0 : int32_t(len - (pages - 1) * page_size));
  }
  return csr;
}

BlockTable csr_to_block_table(const PageTableCSR& csr, int page_size) {
  const std::vector<int32_t> kv_len = kv_lengths(csr.kv_page_indptr, csr.kv_last_page_len, page_size);
  const int batch = int(kv_len.size());
  GQ_CHECK(csr.kv_page_indices.size() >= size_t(csr.kv_page_indptr.back()),
           "kv_page_indices: holds ", csr.kv_page_indices.size(),
           " entries but kv_page_indptr[batch] is ", csr.kv_page_indptr.back());
  BlockTable table;
  table.batch = batch;
  for (int b = 0; b < batch; ++b)
    table.max_pages = std::max(table.max_pages, csr.kv_page_indptr[b + 1] - csr.kv_page_indptr[b]);
  table.pages.assign(size_t(batch) * table.max_pages, 0);
  table.kv_len = kv_len;
  for (int b = 0; b < batch; ++b)
    for (int32_t i = csr.kv_page_indptr[b]; i < csr.kv_page_indptr[b + 1]; ++i)
      table.pages[size_t(b) * table.max_pages + (i - csr.kv_page_indptr[b])] = csr.kv_page_indices[i];
  return table;
}

}  // namespace gqattn
