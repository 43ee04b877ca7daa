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

#include "example_util.h"
#include "gqattn/attention.h"

namespace {

constexpr int kQoHeads = 6, kKvHeads = 2, kHeadDim = 64, kPageSize = 16, kNumPages = 6;

int run() {
  using namespace gqattn;
  using example::ints;
  const std::vector<int> cached = {40, 0}, fresh = {24, 10};  // tokens already in pages, new tokens
  const int batch = 2;
  // Pages for every request's whole KV after this chunk: 64 tokens (4 pages) and 10 (1 page).
  BlockTable table;
  table.batch = batch;
  table.max_pages = 4;
  table.pages = {3, 0, 5, 1,   // request 0
                 4, 0, 0, 0};  // request 1
  table.kv_len = {cached[0] + fresh[0], cached[1] + fresh[1]};
  example::HostPagedKV cache(table, kPageSize, kNumPages, kKvHeads, kHeadDim);  // NHD pools + CSR
  const PagedKV kv = cache.view();

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
  PlanInputs in = cache.plan_inputs(kQoHeads);
  in.causal = true;
  in.qo_indptr = qo_indptr;
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
        const size_t row = size_t(qo_indptr[b] + i) * kQoHeads + h;
        const example::Reference ref = example::reference(&q[row * kHeadDim], k[b].data(), v[b].data(),
                                                          cached[b] + i + 1, kKvHeads, h / (kQoHeads / kKvHeads), kHeadDim);
        example::worst(max_err, std::abs(ref.lse - lse[row]));
        for (int d = 0; d < kHeadDim; ++d) example::worst(max_err, std::abs(ref.o[d] - o[row * kHeadDim + d]));
      }
  std::printf("chunked prefill: %d + %d new tokens over %d + %d cached, %d query heads over %d K/V heads (o and lse)\n",
              fresh[0], fresh[1], cached[0], cached[1], kQoHeads, kKvHeads);
  return example::finish(max_err);
}

}  // namespace

int main() { return example::guarded_main(run); }
