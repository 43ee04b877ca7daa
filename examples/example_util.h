// What the examples share: a paged K/V cache in host memory (pools and the CSR page table of a
// block table, as a PagedKV), the plain float64 attention they check gqattn against, and a main()
// that reports a gqattn::Error. Layer: examples/ (public headers only).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"

namespace example {

inline gqattn::TensorView ints(std::vector<int32_t>& v) {
  return gqattn::TensorView::contiguous(v.data(), {static_cast<int64_t>(v.size())}, gqattn::DType::kInt32);
}

// A paged cache's table and shape: the CSR form of a block table (the form the library takes)
// over num_pages pages of [page_size, kv_heads, head_dim] (NHD), wherever the pools live.
struct PagedTable {
  gqattn::PageTableCSR csr;
  int64_t shape[4];

  PagedTable(const gqattn::BlockTable& table, int page_size, int num_pages, int kv_heads, int head_dim)
      : csr(gqattn::block_table_to_csr(table, page_size)), shape{num_pages, page_size, kv_heads, head_dim} {}
  int64_t pool_elems() const { return shape[0] * shape[1] * shape[2] * shape[3]; }

  // What a plan needs to know of this cache and the heads reading it: the host copies of its page
  // table, the shapes, the dtype and the device (the CPU: the CPU backend; kCUDA for device memory).
  gqattn::PlanInputs plan_inputs(int num_qo_heads) const {
    gqattn::PlanInputs in;
    in.device = gqattn::Device::kCPU;
    in.dtype = gqattn::DType::kFP32;
    in.num_qo_heads = num_qo_heads;
    in.num_kv_heads = static_cast<int>(shape[2]);
    in.head_dim = static_cast<int>(shape[3]);
    in.page_size = static_cast<int>(shape[1]);
    in.kv_indptr = csr.kv_page_indptr;
    in.kv_last_page_len = csr.kv_last_page_len;
    return in;
  }
};

// The table with its K and V pools in host memory (fp32, zeroed). view() is the PagedKV that
// append_kv, decode and prefill read; on the GPU the same fields point at device memory.
struct HostPagedKV : PagedTable {
  std::vector<float> k, v;

  HostPagedKV(const gqattn::BlockTable& table, int page_size, int num_pages, int kv_heads, int head_dim)
      : PagedTable(table, page_size, num_pages, kv_heads, head_dim), k(pool_elems(), 0.f), v(k.size(), 0.f) {}

  gqattn::PagedKV view() {
    using gqattn::TensorView;
    gqattn::PagedKV kv;
    kv.k_pages = TensorView::contiguous(k.data(), {shape[0], shape[1], shape[2], shape[3]}, gqattn::DType::kFP32);
    kv.v_pages = TensorView::contiguous(v.data(), {shape[0], shape[1], shape[2], shape[3]}, gqattn::DType::kFP32);
    kv.layout = gqattn::KVLayout::kNHD;
    kv.kv_page_indptr = ints(csr.kv_page_indptr);
    kv.kv_page_indices = ints(csr.kv_page_indices);
    kv.kv_last_page_len = ints(csr.kv_last_page_len);
    return kv;
  }
};

// One query head's attention over keys 0 .. visible - 1 of K/V head kv_head, from dense rows of
// [tokens, kv_heads, head_dim]: o (head_dim values) and the natural-log LSE of the scaled scores.
struct Reference {
  std::vector<double> o;
  double lse = 0;
};
inline Reference reference(const float* q, const float* k, const float* v, int visible, int kv_heads, int kv_head,
                           int head_dim) {
  std::vector<double> score(visible);
  double max_score = -INFINITY, sum = 0;
  for (int j = 0; j < visible; ++j) {
    const float* kj = k + (static_cast<size_t>(j) * kv_heads + kv_head) * head_dim;
    double dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * kj[d];
    score[j] = dot / std::sqrt(static_cast<double>(head_dim));
    max_score = std::max(max_score, score[j]);
  }
  for (double& s : score) sum += (s = std::exp(s - max_score));
  Reference r;
  r.o.assign(head_dim, 0.0);
  for (int j = 0; j < visible; ++j)
    for (int d = 0; d < head_dim; ++d)
      r.o[d] += score[j] / sum * v[(static_cast<size_t>(j) * kv_heads + kv_head) * head_dim + d];
  r.lse = max_score + std::log(sum);
  return r;
}

// Keeps the largest difference seen; a NaN (an output never written) sticks and fails finish().
inline void worst(double& max_err, double e) {
  if (std::isnan(max_err)) return;
  if (!(e <= max_err)) max_err = e;
}

// Prints the largest difference from the reference; 0 where it is below `tolerance` (fp32
// rounding by default).
inline int finish(double max_err, double tolerance = 1e-5) {
  std::printf("max |gqattn - float64 reference| = %.3g\n", max_err);
  if (!(max_err < tolerance)) {
    std::printf("error: the result differs from the reference\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}

// main(): the example's body, with a gqattn::Error (a rejected argument) reported.
inline int guarded_main(int (*body)()) {
  try {
    return body();
  } catch (const gqattn::Error& e) {
    std::fprintf(stderr, "gqattn error: %s\n", e.what());
    return 1;
  }
}

}  // namespace example
