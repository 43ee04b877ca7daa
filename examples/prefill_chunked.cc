// Chunked prefill over a paged prefix with the C++ API: request 0 already has 40 tokens in the
// cache (a shared prompt prefix, or its earlier chunks) and brings 24 new ones; request 1 is a
// fresh 10-token prompt. The new tokens' K/V go into their pages with append_kv, then one causal
// prefill reads every key from the pages: each new token sees the prefix and the new tokens up to
// itself (the mask is aligned to the end of each request's KV). 6 query heads share 2 K/V heads.
// Checked against a plain float64 computation. Layer: examples/ (public headers only).
//
// Host fp32 tensors run on the CPU backend; device pointers (bf16 / fp16) with a device
// workspace run the GPU kernels (the Hopper kernel on sm_90). K/V held contiguously instead of in
// pages go through PrefillArgs::ragged (RaggedKV) and a plan with page_size 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gqattn/attention.h"
#include "gqattn/error.h"

namespace {

constexpr int kQoHeads = 6, kKvHeads = 2, kHeadDim = 64, kPageSize = 16, kNumPages = 6;

gqattn::TensorView ints(std::vector<int32_t>& v) {
  return gqattn::TensorView::contiguous(v.data(), {static_cast<int64_t>(v.size())}, gqattn::DType::kInt32);
}

int run() {
  using namespace gqattn;
  const std::vector<int> cached = {40, 0}, fresh = {24, 10};  // tokens already in pages, new tokens
  const int batch = 2;
  // Pages for every request's whole KV after this chunk: 64 tokens (4 pages) and 10 (1 page).
  BlockTable table;
  table.batch = batch;
  table.max_pages = 4;
  table.pages = {3, 0, 5, 1,   // request 0
                 4, 0, 0, 0};  // request 1
  table.kv_len = {cached[0] + fresh[0], cached[1] + fresh[1]};
  PageTableCSR csr = block_table_to_csr(table, kPageSize);

  const int64_t pool_elems = int64_t(kNumPages) * kPageSize * kKvHeads * kHeadDim;
  std::vector<float> k_pool(pool_elems, 0.f), v_pool(pool_elems, 0.f);
  PagedKV kv;
  kv.k_pages = TensorView::contiguous(k_pool.data(), {kNumPages, kPageSize, kKvHeads, kHeadDim}, DType::kFP32);
  kv.v_pages = TensorView::contiguous(v_pool.data(), {kNumPages, kPageSize, kKvHeads, kHeadDim}, DType::kFP32);
  kv.kv_page_indptr = ints(csr.kv_page_indptr);
  kv.kv_page_indices = ints(csr.kv_page_indices);
  kv.kv_last_page_len = ints(csr.kv_last_page_len);

  // Every token's K/V (the prefix's were written by earlier steps; here all at once), by request.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<std::vector<float>> k(batch), v(batch);
  std::vector<int32_t> batch_indices, positions;
  std::vector<float> k_all, v_all;
  for (int b = 0; b < batch; ++b) {
    k[b].resize(size_t(table.kv_len[b]) * kKvHeads * kHeadDim);
    v[b].resize(k[b].size());
    for (float& x : k[b]) x = uniform(rng);
    for (float& x : v[b]) x = uniform(rng);
    k_all.insert(k_all.end(), k[b].begin(), k[b].end());
    v_all.insert(v_all.end(), v[b].begin(), v[b].end());
    for (int pos = 0; pos < table.kv_len[b]; ++pos) {
      batch_indices.push_back(b);
      positions.push_back(pos);
    }
  }
  const int64_t tokens = static_cast<int64_t>(positions.size());
  append_kv(kv, TensorView::contiguous(k_all.data(), {tokens, kKvHeads, kHeadDim}, DType::kFP32),
            TensorView::contiguous(v_all.data(), {tokens, kKvHeads, kHeadDim}, DType::kFP32), ints(batch_indices),
            ints(positions));

  // The chunk's queries: request b's new tokens are rows qo_indptr[b] .. qo_indptr[b + 1].
  std::vector<int32_t> qo_indptr = {0, fresh[0], fresh[0] + fresh[1]};
  PlanInputs in;
  in.device = Device::kCPU;
  in.dtype = DType::kFP32;
  in.num_qo_heads = kQoHeads;
  in.num_kv_heads = kKvHeads;
  in.head_dim = kHeadDim;
  in.page_size = kPageSize;
  in.causal = true;
  in.qo_indptr = qo_indptr;
  in.kv_indptr = csr.kv_page_indptr;
  in.kv_last_page_len = csr.kv_last_page_len;
  const Plan plan = prefill_plan(in, Workspace{});

  const int total_qo = qo_indptr.back();
  std::vector<float> q(size_t(total_qo) * kQoHeads * kHeadDim), o(q.size(), NAN), lse(size_t(total_qo) * kQoHeads);
  for (float& x : q) x = uniform(rng);
  PrefillArgs args;
  args.q = TensorView::contiguous(q.data(), {total_qo, kQoHeads, kHeadDim}, DType::kFP32);
  args.qo_indptr = ints(qo_indptr);
  args.paged = kv;
  args.causal = true;
  args.o = TensorView::contiguous(o.data(), {total_qo, kQoHeads, kHeadDim}, DType::kFP32);
  args.lse = TensorView::contiguous(lse.data(), {total_qo, kQoHeads}, DType::kFP32);  // optional
  prefill_run(plan, args);

  // Reference: new token i of request b (position cached[b] + i) sees keys 0 .. cached[b] + i.
  double max_err = 0;
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < fresh[b]; ++i)
      for (int h = 0; h < kQoHeads; ++h) {
        const int row = qo_indptr[b] + i, kvh = h / (kQoHeads / kKvHeads), visible = cached[b] + i + 1;
        const float* qh = &q[(size_t(row) * kQoHeads + h) * kHeadDim];
        std::vector<double> score(visible);
        double max_score = -INFINITY, sum = 0;
        for (int j = 0; j < visible; ++j) {
          double dot = 0;
          for (int d = 0; d < kHeadDim; ++d) dot += double(qh[d]) * k[b][(size_t(j) * kKvHeads + kvh) * kHeadDim + d];
          score[j] = dot / std::sqrt(double(kHeadDim));
          max_score = std::max(max_score, score[j]);
        }
        for (double& s : score) sum += (s = std::exp(s - max_score));
        max_err = std::max(max_err, std::abs(max_score + std::log(sum) - lse[size_t(row) * kQoHeads + h]));
        for (int d = 0; d < kHeadDim; ++d) {
          double ref = 0;
          for (int j = 0; j < visible; ++j) ref += score[j] / sum * v[b][(size_t(j) * kKvHeads + kvh) * kHeadDim + d];
          max_err = std::max(max_err, std::abs(ref - o[(size_t(row) * kQoHeads + h) * kHeadDim + d]));
        }
      }
  std::printf("chunked prefill: %d + %d new tokens over %d + %d cached, %d query heads over %d K/V heads\n", fresh[0],
              fresh[1], cached[0], cached[1], kQoHeads, kKvHeads);
  std::printf("max |gqattn - float64 reference| (o and lse) = %.3g\n", max_err);
  if (!(max_err < 1e-5)) {
    std::printf("error: the result differs from the reference\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const gqattn::Error& e) {
    std::fprintf(stderr, "gqattn error: %s\n", e.what());
    return 1;
  }
}
