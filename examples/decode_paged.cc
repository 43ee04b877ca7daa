// The C++ API end to end, as a serving engine uses it in one decode step: a paged KV cache shared
// by grouped-query attention (8 query heads over 2 K/V heads), the step's context written into its
// pages with append_kv, a decode plan made once on the host, and its run (once per layer in a
// model). The result is checked against a plain float64 computation, and a bad argument is shown
// failing with its message. Layer: examples/ (public headers only).
//
// Here the tensors are host memory in fp32, so the CPU backend runs them. The same calls run the
// GPU kernels when the views point at device memory (Device::kCUDA, bf16 or fp16, index tensors
// as int32 on the device) with a workspace of kRecommendedWorkspaceBytes from cudaMalloc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "example_util.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"

namespace {

constexpr int kQoHeads = 8, kKvHeads = 2, kHeadDim = 64, kPageSize = 16, kNumPages = 8;

int run() {
  using namespace gqattn;
  using example::ints;
  // Two requests with 37 and 5 tokens of context (the newest token's K/V included), their pages
  // listed in a block table as vLLM keeps them; the library takes the CSR form.
  BlockTable table;
  table.batch = 2;
  table.max_pages = 3;
  table.pages = {4, 1, 6,   // request 0: pages 4, 1, 6 (16 + 16 + 5 tokens)
                 2, 0, 0};  // request 1: page 2 (5 tokens); the rest of the row is unused
  table.kv_len = {37, 5};
  // The pools (NHD [pages, page_size, kv_heads, head_dim]) and the table's CSR form, as a PagedKV:
  // example_util.h.
  example::HostPagedKV cache(table, kPageSize, kNumPages, kKvHeads, kHeadDim);
  const PagedKV kv = cache.view();

  // Every context token's K/V, written into its page slot (a prefill and the earlier decode steps
  // would have done this token by token).
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  const int tokens = table.kv_len[0] + table.kv_len[1];
  std::vector<float> k_new(size_t(tokens) * kKvHeads * kHeadDim), v_new(k_new.size());
  for (float& x : k_new) x = uniform(rng);
  for (float& x : v_new) x = uniform(rng);
  std::vector<int32_t> batch_indices, positions;
  for (int b = 0; b < table.batch; ++b)
    for (int pos = 0; pos < table.kv_len[b]; ++pos) {
      batch_indices.push_back(b);
      positions.push_back(pos);
    }
  append_kv(kv, TensorView::contiguous(k_new.data(), {tokens, kKvHeads, kHeadDim}, DType::kFP32),
            TensorView::contiguous(v_new.data(), {tokens, kKvHeads, kHeadDim}, DType::kFP32), ints(batch_indices),
            ints(positions));

  // One query token a request: plan once for the step (host lengths only), then run.
  // plan_inputs: device, dtype, heads, head_dim, page size and the CSR table's host vectors.
  PlanInputs in = cache.plan_inputs(kQoHeads);
  in.qo_len = 1;
  const Plan plan = decode_plan(in, Workspace{});

  std::vector<float> q(size_t(table.batch) * kQoHeads * kHeadDim), o(q.size(), NAN);
  for (float& x : q) x = uniform(rng);
  DecodeArgs args;
  args.q = TensorView::contiguous(q.data(), {table.batch, kQoHeads, kHeadDim}, DType::kFP32);
  args.kv = kv;
  args.o = TensorView::contiguous(o.data(), {table.batch, kQoHeads, kHeadDim}, DType::kFP32);
  decode_run(plan, args);  // per layer: the same plan, that layer's q, pools and o

  // The plain computation: query head h attends K/V head h / (kQoHeads / kKvHeads) over all of its
  // request's tokens (the new token is the last of them), from the dense K/V, not the pages.
  double max_err = 0;
  for (int b = 0, first = 0; b < table.batch; first += table.kv_len[b], ++b)
    for (int h = 0; h < kQoHeads; ++h) {
      const size_t row = (size_t(b) * kQoHeads + h) * kHeadDim, dense = size_t(first) * kKvHeads * kHeadDim;
      const example::Reference ref = example::reference(&q[row], &k_new[dense], &v_new[dense], table.kv_len[b],
                                                        kKvHeads, h / (kQoHeads / kKvHeads), kHeadDim);
      for (int d = 0; d < kHeadDim; ++d) example::worst(max_err, std::abs(ref.o[d] - o[row + d]));
    }
  std::printf("decode: %d requests, %d query heads over %d K/V heads, head_dim %d, page size %d\n", table.batch,
              kQoHeads, kKvHeads, kHeadDim, kPageSize);

  // A bad argument throws gqattn::Error naming it, before anything is written.
  PlanInputs bad = in;
  bad.num_kv_heads = 3;  // 8 query heads cannot be grouped over 3
  try {
    decode_plan(bad, Workspace{});
    std::printf("error: a plan with 8 query heads over 3 K/V heads was accepted\n");
    return 1;
  } catch (const Error& e) {
    std::printf("rejected as expected: %s\n", e.what());
  }
  return example::finish(max_err);
}

}  // namespace

int main() { return example::guarded_main(run); }
