// The CUDA backend's plan-time checks (cuda_backend::finish_plan and make_layout, and select_kernel's
// variants not built): each rejected plan's gqattn::Error names the argument or the limit, a plan
// made before it in the same workspace still runs bitwise as before (a rejected plan writes nothing),
// and exactly at each limit the plan is accepted and runs right. Layer: tests (label gpu; skipped
// with a message without a GPU, but for the not-built variants, which validation rejects first).
//
// Device memory: at most about 9 GB (the prefill at 2^17 work items, q and o at head_dim 128; 17 GB
// where 256 is the only head_dim built); host memory a few GB; about 10 s on an H200, mostly
// building random K/V and the CPU oracle on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "dispatch/cuda_backend.h"
#include "dispatch/select_kernel.h"
#include "gpu/gpu_util.h"
#include "plan/planner.h"
#include "plan/work_item.h"

namespace gqattn::test {
namespace {

// cuda_backend.h's limits and workspace alignment, signed for the tests' arithmetic.
constexpr int64_t kMaxWorkItems = int64_t(cuda_backend::kMaxWorkItems);
constexpr int64_t kMaxRequests = int64_t(cuda_backend::kMaxRequests);
constexpr size_t kAlign = cuda_backend::kWorkspaceAlign;

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A dtype and head_dim this build compiled: bf16 / 128 where built.
struct Variant {
  DType dtype;
  int head_dim;
};
Variant built_variant() {
  const BuildInfo info = build_info();
  const bool bf16 = std::find(info.dtypes.begin(), info.dtypes.end(), DType::kBF16) != info.dtypes.end();
  return {bf16 ? DType::kBF16 : info.dtypes.front(), contains(info.head_dims, 128) ? 128 : info.head_dims.front()};
}
// The smallest head_dim built (the prefill at 2^17 items: the least memory for q and o).
Variant smallest_variant() {
  const BuildInfo info = build_info();
  return {built_variant().dtype, *std::min_element(info.head_dims.begin(), info.head_dims.end())};
}

// A CUDA decode of `batch` requests without keys (page_size 16): no item splits, each request and
// K/V head is one item (group x 1 token <= 16 rows).
PlanInputs empty_decode(Variant v, int batch, int qo_heads, int kv_heads) {
  PlanInputs in;
  in.device = Device::kCUDA;
  in.dtype = v.dtype;
  in.num_qo_heads = qo_heads;
  in.num_kv_heads = kv_heads;
  in.head_dim = v.head_dim;
  in.page_size = 16;
  in.kv_indptr.assign(size_t(batch) + 1, 0);
  in.kv_last_page_len.assign(size_t(batch), 0);
  return in;
}

// A CUDA prefill of one request of `rows` query tokens, one head, over no keys (ragged, not causal):
// ceil(rows / cta_rows) items.
PlanInputs one_prefill_request(Variant v, int64_t rows) {
  PlanInputs in;
  in.device = Device::kCUDA;
  in.dtype = v.dtype;
  in.num_qo_heads = 1;
  in.num_kv_heads = 1;
  in.head_dim = v.head_dim;
  in.page_size = 0;
  in.qo_indptr = {0, static_cast<int32_t>(rows)};
  in.kv_indptr = {0, 0};
  return in;
}

struct DecodeOut {
  HostTensor o, lse;
};

// A paged decode (NHD) with random inputs, its float64 CPU oracle, and its device copies.
class DecodeProblem {
 public:
  DecodeProblem(Variant v, int qo_heads, int kv_heads, int page_size, int qo_len, std::vector<int32_t> kv_len,
                uint64_t seed)
      : v_(v), qo_heads_(qo_heads), kv_heads_(kv_heads), page_size_(page_size), qo_len_(qo_len) {
    const int64_t rows = int64_t(kv_len.size()) * qo_len;
    int64_t total_kv = 0;
    for (int32_t l : kv_len) total_kv += l;
    const HostTensor k = random_tensor({total_kv, kv_heads, v.head_dim}, v.dtype, seed);
    const HostTensor vv = random_tensor({total_kv, kv_heads, v.head_dim}, v.dtype, seed + 1);
    kv_ = make_paged_kv(k, vv, kv_len, page_size, KVLayout::kNHD, seed + 2);
    q_ = random_tensor({rows, qo_heads, v.head_dim}, v.dtype, seed + 3);
    o_ref_ = HostTensor({rows, qo_heads, v.head_dim}, v.dtype);
    lse_ref_ = HostTensor({rows, qo_heads}, DType::kFP32);
    PlanInputs in = inputs();
    in.device = Device::kCPU;
    decode_run(decode_plan(in, Workspace{}), DecodeArgs{q_.view(), kv_.view(), o_ref_.view(), lse_ref_.view()});
    d_q_ = std::make_unique<DeviceTensor>(q_);
    d_kv_ = std::make_unique<DevicePagedKV>(kv_);
    d_o_ = std::make_unique<DeviceTensor>(o_ref_);
    d_lse_ = std::make_unique<DeviceTensor>(lse_ref_);
  }

  PlanInputs inputs() const {
    PlanInputs in;
    in.device = Device::kCUDA;
    in.dtype = v_.dtype;
    in.num_qo_heads = qo_heads_;
    in.num_kv_heads = kv_heads_;
    in.head_dim = v_.head_dim;
    in.page_size = page_size_;
    in.qo_len = qo_len_;
    in.kv_indptr = kv_.table.kv_page_indptr;
    in.kv_last_page_len = kv_.table.kv_last_page_len;
    return in;
  }

  // Runs a CUDA plan of inputs() into poisoned o and lse.
  DecodeOut run(const Plan& plan) const {
    d_o_->poison();
    d_lse_->poison();
    decode_run(plan, DecodeArgs{d_q_->view(), d_kv_->view(), d_o_->view(), d_lse_->view()});
    sync_and_check();
    return DecodeOut{d_o_->to_host(o_ref_), d_lse_->to_host(lse_ref_)};
  }

  void expect_oracle(const DecodeOut& got, const std::string& what) const {
    const Diff d = compare(got.o, o_ref_);
    EXPECT_EQ(d.nan_count, 0) << what << ": NaN or unwritten elements";
    EXPECT_LE(d.max_abs, max_abs_tol(v_.dtype)) << what;
    EXPECT_LE(d.rel_l2, rel_l2_tol(v_.dtype)) << what;
    const Diff l = compare(got.lse, lse_ref_);
    EXPECT_EQ(l.nan_count, 0) << what << ": NaN in lse";
    EXPECT_LE(l.max_abs, kLseTol) << what << " (lse)";
  }

 private:
  Variant v_;
  int qo_heads_, kv_heads_, page_size_, qo_len_;
  PagedKVHost kv_;
  HostTensor q_, o_ref_, lse_ref_;
  std::unique_ptr<DeviceTensor> d_q_, d_o_, d_lse_;
  std::unique_ptr<DevicePagedKV> d_kv_;
};

void expect_same_bits(const DecodeOut& got, const DecodeOut& ref, const std::string& what) {
  EXPECT_TRUE(got.o.storage() == ref.o.storage()) << what << ": o differs";
  EXPECT_TRUE(got.lse.storage() == ref.lse.storage()) << what << ": lse differs";
}

// A small decode that splits (GQA 32 / 8 heads x 2 tokens, 3 requests: 24 items, too few for the
// SMs, so the long requests are chunked and merged), planned in a workspace before a rejected
// plan and run there; afterwards (expect_intact) the same plan runs bitwise as before (the rejected
// plan overwrote nothing of its header, work list, merge requests or partial rows), and a new plan
// in that workspace and one in a fresh workspace run bitwise alike too. Device memory: a few MB.
class Witness {
 public:
  explicit Witness(const Workspace& ws)
      : problem_(built_variant(), 32, 8, 16, 2, {5000, 17, 3333}, 77), ws_(ws), plan_(decode_plan(problem_.inputs(), ws)) {
    EXPECT_GT(plan_.max_splits, 1) << "the witness should split, to use the partial rows and the merge requests";
    ref_ = problem_.run(plan_);
    problem_.expect_oracle(ref_, "the witness before the rejected plan");
  }

  void expect_intact() const {
    expect_same_bits(problem_.run(plan_), ref_, "the witness's plan run again after the rejected plan");
    expect_same_bits(problem_.run(decode_plan(problem_.inputs(), ws_)), ref_,
                     "a new plan in the rejected plan's workspace");
    DeviceWorkspace fresh;
    expect_same_bits(problem_.run(decode_plan(problem_.inputs(), fresh.get())), ref_, "a plan in a fresh workspace");
  }

  // The witness planned in `ws` (another workspace or part of one) runs bitwise as in its own.
  void expect_same_in(const Workspace& ws, const std::string& what) const {
    expect_same_bits(problem_.run(decode_plan(problem_.inputs(), ws)), ref_, what);
  }

  const DecodeProblem& problem() const { return problem_; }

 private:
  DecodeProblem problem_;
  Workspace ws_;
  Plan plan_;
  DecodeOut ref_;
};

// ---- workspace -------------------------------------------------------------------------------

// A null workspace: the API's check (make_plan) rejects it, with a workspace of 0 bytes, before the
// backend; finish_plan's own null check is reached only by a caller past src/api (this test).
TEST(GpuPlanLimits, WorkspaceDataNull) {
  GQ_REQUIRE_GPU();
  const Variant v = built_variant();
  DeviceWorkspace ws;
  const Witness witness(ws.get());
  const PlanInputs in = empty_decode(v, 4, 8, 2);
  PlanInputs prefill = in;
  prefill.qo_indptr = {0, 1, 2, 3, 4};
  const std::string bytes = std::to_string(kRecommendedWorkspaceBytes) + " bytes";
  expect_rejected([&] { decode_plan(in, Workspace{nullptr, kRecommendedWorkspaceBytes}); },
                  {"workspace: a CUDA plan needs a device workspace (data ", bytes});
  expect_rejected([&] { prefill_plan(prefill, Workspace{nullptr, kRecommendedWorkspaceBytes}); },
                  {"workspace: a CUDA plan needs a device workspace (data ", bytes});
  expect_rejected([&] { decode_plan(in, Workspace{ws.mem.get(), 0}); },
                  {"workspace: a CUDA plan needs a device workspace", ", 0 bytes)"});
  Plan plan = plan::describe(in, /*is_decode=*/true);
  expect_rejected([&] { cuda_backend::finish_plan(plan, in, Workspace{nullptr, kRecommendedWorkspaceBytes}, nullptr); },
                  {"workspace: data is null"});
  witness.expect_intact();
}

// A workspace 16 (and 128) bytes past a 256-byte boundary is rejected; one at the next boundary
// (256 bytes in) is taken and runs like a fresh one.
TEST(GpuPlanLimits, WorkspaceMisaligned) {
  GQ_REQUIRE_GPU();
  DeviceWorkspace ws;
  const Witness witness(ws.get());
  char* base = static_cast<char*>(ws.mem.get());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(base) % kAlign, 0u) << "cudaMalloc returned an unaligned workspace";
  const PlanInputs in = witness.problem().inputs();
  for (size_t offset : {size_t(16), size_t(128)}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    expect_rejected([&] { decode_plan(in, Workspace{base + offset, kRecommendedWorkspaceBytes - offset}); },
                    {"workspace: data must be 256-byte aligned"});
  }
  witness.expect_intact();
  witness.expect_same_in(Workspace{base + kAlign, kRecommendedWorkspaceBytes - kAlign},
                         "the witness in a workspace 256 bytes into the allocation");
}

// One byte short of the fixed part (7,340,544 bytes) is rejected, naming both sizes. Exactly the
// fixed part is taken: no partial row fits, so the witness, which splits in a larger workspace,
// runs unsplit (the planner doubles the chunk until it is the whole request) and still right; its
// workspace is an allocation of exactly that size (a write past its end leaves the allocation, which
// compute-sanitizer shows).
TEST(GpuPlanLimits, WorkspaceOneByteShort) {
  GQ_REQUIRE_GPU();
  // Header, 2^17 work items, 2^16 merge requests (each region 256-byte aligned) and one aligned slot
  // for the partial rows: 256 + 6,291,456 + 1,048,576 + 256 bytes today.
  const size_t min_bytes = cuda_backend::min_workspace_bytes();
  DeviceWorkspace ws;
  const Witness witness(ws.get());
  const PlanInputs in = witness.problem().inputs();
  expect_rejected([&] { decode_plan(in, Workspace{ws.mem.get(), min_bytes - 1}); },
                  {"workspace: " + std::to_string(min_bytes - 1) + " bytes is too small",
                   "at least " + std::to_string(min_bytes) + " needed",
                   "kRecommendedWorkspaceBytes = " + std::to_string(kRecommendedWorkspaceBytes)});
  witness.expect_intact();

  DevicePtr exact = device_alloc(min_bytes);
  const Plan plan = decode_plan(in, Workspace{exact.get(), min_bytes});
  EXPECT_FALSE(plan.split);
  EXPECT_EQ(plan.kv_chunk, 0);
  EXPECT_EQ(plan.max_splits, 1);
  EXPECT_LE(plan.workspace_bytes_used, min_bytes);
  witness.problem().expect_oracle(witness.problem().run(plan), "the witness in the smallest workspace");
}

// ---- work items ------------------------------------------------------------------------------

// 4,097 decode requests x 32 K/V heads (MHA, one 1-row item each; no keys, so no split) are 131,104
// items, past 2^17, with 4,097 requests within 2^16: the item check fires. Then one prefill request
// whose row tiles alone pass 2^17: its kernel's rows a tile (cta_rows: 64 portable, 128 or 192 on the
// wgmma kernel) read from a plan of 2^17 x 64 rows, which no kernel tiles into more than 2^17
// items, and which picks the same kernel (one request, >= 4096 rows). Host only: ~10 MB of work list.
TEST(GpuPlanLimits, MoreWorkItemsThanTheLimit) {
  GQ_REQUIRE_GPU();
  const Variant v = built_variant();
  DeviceWorkspace ws;
  const Witness witness(ws.get());
  expect_rejected([&] { decode_plan(empty_decode(v, 4097, 32, 32), ws.get()); },
                  {"plan: 131104 work items exceed the limit of 131072"});
  witness.expect_intact();

  // The probe in a workspace of its own: one in ws would replace the witness's plan.
  DeviceWorkspace probe_ws;
  const Plan probe = prefill_plan(one_prefill_request(v, kMaxWorkItems * 64), probe_ws.get());
  ASSERT_GE(probe.cta_rows, 64);
  const int64_t at_limit = kMaxWorkItems * probe.cta_rows;
  expect_rejected([&] { prefill_plan(one_prefill_request(v, at_limit + 1), ws.get()); },
                  {"plan: 131073 work items exceed the limit of 131072"});
  witness.expect_intact();
}

// PlanInputs::fixed_split_size past the limits, each rejected naming fixed_split_size, the witness
// intact: 128-key chunks of one request of 524,800 keys x 32 K/V heads (MHA, one 1-row item a
// chunk) are 131,200 items, past 2^17, counted before any list is built (their partial rows would
// fit); and 2,000 chunks of one K/V head x 32 query heads x 4 tokens are 256,000 partial rows, past
// the recommended workspace's ~245K at head_dim 128 (fewer at 256), in at most 4,000 items. Host
// only: the plans read no K/V.
TEST(GpuPlanLimits, FixedSplitSizeOverTheLimits) {
  GQ_REQUIRE_GPU();
  const Variant v = built_variant();
  DeviceWorkspace ws;
  const Witness witness(ws.get());
  PlanInputs in = empty_decode(v, 1, 32, 32);
  in.kv_indptr = {0, 524800 / 16};
  in.kv_last_page_len = {16};
  in.fixed_split_size = 128;
  expect_rejected([&] { decode_plan(in, ws.get()); },
                  {"fixed_split_size (128)", "chunks of 128 keys make 131200 work items, over the limit of 131072"});
  witness.expect_intact();

  in = empty_decode(v, 1, 32, 1);
  in.qo_len = 4;
  in.kv_indptr = {0, 256000 / 16};
  in.kv_last_page_len = {16};
  in.fixed_split_size = 128;
  expect_rejected([&] { decode_plan(in, ws.get()); },
                  {"fixed_split_size (128)", "the split's 256000 partial rows exceed the workspace's"});
  witness.expect_intact();
}

// Exactly 2^17 items: 4,096 decode requests x 32 K/V heads with 0..12 keys each (page_size 4), the
// work list filling its region of the workspace to the last byte; against the oracle, as planned and
// in CUDA-graph mode (the merge over every row, skipping each unsplit request). The grid is then
// 2^17 CTAs, the most finish_plan's grid check allows: on an mma.sync kernel max(num_work,
// target_ctas), on the wgmma kernel at most target_ctas, and target_ctas (SMs x resident CTAs, a few
// hundred) is far below 2^17, so that check cannot fire on any GPU. Device memory ~0.75 GB (the K/V
// pools: 1.5 x 7.6K pages of 4 keys x 32 heads x 128 x 2 B, 370 MB each); host ~1.5 GB; ~2 s,
// mostly random K/V.
TEST(GpuPlanLimits, DecodeWorkItemsAtTheLimit) {
  GQ_REQUIRE_GPU();
  const Variant v = built_variant();
  std::vector<int32_t> kv_len(4096);
  for (size_t b = 0; b < kv_len.size(); ++b) kv_len[b] = int32_t((b * 7 + 3) % 13);
  const DecodeProblem problem(v, 32, 32, 4, 1, kv_len, 300);
  DeviceWorkspace ws;
  PlanInputs in = problem.inputs();
  for (bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "CUDA-graph mode" : "as planned");
    in.enable_cuda_graph = graph;
    const Plan plan = decode_plan(in, ws.get());
    EXPECT_EQ(plan.num_work, kMaxWorkItems);
    EXPECT_EQ(plan.split, graph);
    // One 1-row item a request and K/V head: a decode family (mma.sync), whose grid is the list.
    EXPECT_FALSE(kernels::is_sm90_family(dispatch::kernel_by_id(plan.kernel_id).family));
    EXPECT_EQ(plan.num_ctas, kMaxWorkItems);
    problem.expect_oracle(problem.run(plan), "2^17 items");
  }
}

// One prefill request of exactly 2^17 row tiles (no keys): accepted, and run (every row sees no key:
// o 0, lse -inf), on the wgmma kernel on sm_90 (persistent CTAs taking the 2^17 items from the
// counter). Device memory: q and o of 2^17 x cta_rows rows x head_dim x 2 B each at the smallest
// head_dim built: 2 x 3.2 GB at hd64 (192-row tiles on sm_90), 2 x 4.3 GB at hd128, 2 x 8.6 GB at
// hd256, plus up to 100 MB of lse; o is checked on the host 256 MB at a time. ~3 s.
TEST(GpuPlanLimits, PrefillWorkItemsAtTheLimit) {
  GQ_REQUIRE_GPU();
  const Variant v = smallest_variant();
  DeviceWorkspace ws;
  const Plan probe = prefill_plan(one_prefill_request(v, kMaxWorkItems * 64), ws.get());
  const int64_t rows = kMaxWorkItems * probe.cta_rows;
  PlanInputs in = one_prefill_request(v, rows);
  const Plan plan = prefill_plan(in, ws.get());
  EXPECT_EQ(plan.cta_rows, probe.cta_rows);
  EXPECT_EQ(plan.num_work, kMaxWorkItems);
  EXPECT_LE(plan.num_ctas, kMaxWorkItems);
  // In CUDA-graph mode the kernel is chosen without the mean lengths, so its row tile may differ
  // (at hd64 on sm_90: 128 rows, not 192): its own 2^17 tiles.
  PlanInputs graph_probe = one_prefill_request(v, kMaxWorkItems * 64);
  graph_probe.enable_cuda_graph = true;
  const int cta_rows_graph = prefill_plan(graph_probe, ws.get()).cta_rows;
  PlanInputs graph_in = one_prefill_request(v, kMaxWorkItems * cta_rows_graph);
  graph_in.enable_cuda_graph = true;
  const Plan graph = prefill_plan(graph_in, ws.get());
  EXPECT_EQ(graph.num_work, kMaxWorkItems);
  EXPECT_LE(graph.num_ctas, kMaxWorkItems);

  // Planned again: the graph-mode plan replaced the first one in ws.
  const Plan run_plan = prefill_plan(one_prefill_request(v, rows), ws.get());
  const size_t row_bytes = size_t(v.head_dim) * dtype_size(v.dtype);
  const size_t qo_bytes = size_t(rows) * row_bytes;
  DevicePtr q = device_alloc(qo_bytes), o = device_alloc(qo_bytes), lse = device_alloc(size_t(rows) * 4);
  GQ_CUDA_CHECK(cudaMemset(q.get(), 0, qo_bytes));
  GQ_CUDA_CHECK(cudaMemset(o.get(), 0xFF, qo_bytes));
  GQ_CUDA_CHECK(cudaMemset(lse.get(), 0xFF, size_t(rows) * 4));
  DeviceTensor qo_indptr(HostTensor::from_int32({0, static_cast<int32_t>(rows)}));
  DeviceTensor k(HostTensor({0, 1, v.head_dim}, v.dtype)), vt(HostTensor({0, 1, v.head_dim}, v.dtype));
  DeviceTensor kv_indptr(HostTensor::from_int32({0, 0}));
  PrefillArgs args;
  args.q = TensorView::contiguous(q.get(), {rows, 1, v.head_dim}, v.dtype, Device::kCUDA, 0);
  args.o = TensorView::contiguous(o.get(), {rows, 1, v.head_dim}, v.dtype, Device::kCUDA, 0);
  args.lse = TensorView::contiguous(lse.get(), {rows, 1}, DType::kFP32, Device::kCUDA, 0);
  args.qo_indptr = qo_indptr.view();
  args.ragged.k = k.view();
  args.ragged.v = vt.view();
  args.ragged.kv_indptr = kv_indptr.view();
  prefill_run(run_plan, args);
  sync_and_check();

  std::vector<float> lse_host(size_t(rows), 0.f);
  GQ_CUDA_CHECK(cudaMemcpy(lse_host.data(), lse.get(), size_t(rows) * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::all_of(lse_host.begin(), lse_host.end(), [](float x) { return std::isinf(x) && x < 0; }))
      << "lse of rows without keys is -inf";
  const size_t chunk = size_t(256) << 20;
  std::vector<uint8_t> host(std::min(chunk, qo_bytes));
  bool zero = true;
  for (size_t at = 0; at < qo_bytes && zero; at += chunk) {
    const size_t n = std::min(chunk, qo_bytes - at);
    GQ_CUDA_CHECK(cudaMemcpy(host.data(), static_cast<uint8_t*>(o.get()) + at, n, cudaMemcpyDeviceToHost));
    zero = std::all_of(host.begin(), host.begin() + n, [](uint8_t b) { return b == 0; });
    EXPECT_TRUE(zero) << "o of rows without keys is 0 (unwritten or wrong bytes from byte " << at << ")";
  }
}

// ---- requests --------------------------------------------------------------------------------

// 70,000 decode requests (one query head, no keys: 70,000 items, within 2^17) pass the item check
// and fail the request check; so does a prefill of 70,000 requests of which only one has query rows
// (one item): requests count whether or not they have work. Host only, a few MB.
TEST(GpuPlanLimits, MoreRequestsThanTheLimit) {
  GQ_REQUIRE_GPU();
  const Variant v = built_variant();
  DeviceWorkspace ws;
  const Witness witness(ws.get());
  expect_rejected([&] { decode_plan(empty_decode(v, 70000, 1, 1), ws.get()); },
                  {"plan: batch 70000 exceeds the limit of 65536 requests"});
  witness.expect_intact();
  PlanInputs prefill = empty_decode(v, 70000, 1, 1);
  prefill.qo_indptr.assign(70001, 1);
  prefill.qo_indptr[0] = 0;
  expect_rejected([&] { prefill_plan(prefill, ws.get()); }, {"plan: batch 70000 exceeds the limit of 65536 requests"});
  witness.expect_intact();
}

// Exactly 2^16 decode requests (GQA 2 / 1 heads, 0..12 keys each, page_size 4): accepted, their
// merge requests filling their region to the last byte, and right against the oracle, as planned and
// in CUDA-graph mode (the merge reading all 2^16 requests). Device memory ~0.4 GB (the K/V pools:
// 1.5 x 121K pages of 4 keys x 128 x 2 B, 186 MB each); host ~0.7 GB; ~1 s.
TEST(GpuPlanLimits, RequestsAtTheLimit) {
  GQ_REQUIRE_GPU();
  const Variant v = built_variant();
  std::vector<int32_t> kv_len(static_cast<size_t>(kMaxRequests));
  for (size_t b = 0; b < kv_len.size(); ++b) kv_len[b] = int32_t((b * 5 + 1) % 13);
  const DecodeProblem problem(v, 2, 1, 4, 1, kv_len, 400);
  DeviceWorkspace ws;
  PlanInputs in = problem.inputs();
  const Plan plan = decode_plan(in, ws.get());
  EXPECT_EQ(plan.batch, kMaxRequests);
  EXPECT_EQ(plan.num_work, kMaxRequests);
  problem.expect_oracle(problem.run(plan), "2^16 requests");
  in.enable_cuda_graph = true;
  const Plan graph = decode_plan(in, ws.get());
  EXPECT_TRUE(graph.split);
  problem.expect_oracle(problem.run(graph), "2^16 requests, CUDA-graph mode");
}

// ---- variants not built (validation, before the workspace or the device is used) -------------

TEST(GpuPlanLimits, HeadDimNotBuilt) {
  const BuildInfo info = build_info();
  if (!info.cuda) GTEST_SKIP() << "no CUDA backend in this build";
  std::optional<DeviceWorkspace> ws;
  if (cuda_device_count() > 0) ws.emplace();
  const Workspace w = ws ? ws->get() : Workspace{};
  for (int head_dim : {64, 72, 80, 96, 112, 128, 256}) {  // 72: no generated variant
    if (contains(info.head_dims, head_dim)) continue;
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const PlanInputs in = empty_decode(Variant{info.dtypes.front(), head_dim}, 2, 8, 2);
    PlanInputs prefill = in;
    prefill.qo_indptr = {0, 3, 5};
    const std::string needle = "head_dim " + std::to_string(head_dim) + " is not compiled for the GPU";
    expect_rejected([&] { decode_plan(in, w); }, {needle, "-DGQATTN_HEAD_DIMS"});
    expect_rejected([&] { prefill_plan(prefill, w); }, {needle, "-DGQATTN_HEAD_DIMS"});
  }
}

TEST(GpuPlanLimits, DtypeNotBuilt) {
  const BuildInfo info = build_info();
  if (!info.cuda) GTEST_SKIP() << "no CUDA backend in this build";
  std::optional<DType> missing;
  for (DType d : {DType::kBF16, DType::kFP16})
    if (std::find(info.dtypes.begin(), info.dtypes.end(), d) == info.dtypes.end()) missing = d;
  if (!missing) GTEST_SKIP() << "bf16 and fp16 are both built";
  std::optional<DeviceWorkspace> ws;
  if (cuda_device_count() > 0) ws.emplace();
  const Workspace w = ws ? ws->get() : Workspace{};
  const PlanInputs in = empty_decode(Variant{*missing, info.head_dims.front()}, 2, 8, 2);
  PlanInputs prefill = in;
  prefill.qo_indptr = {0, 3, 5};
  const std::string needle = std::string("dtype ") + dtype_name(*missing) + " is not compiled for the GPU";
  expect_rejected([&] { decode_plan(in, w); }, {needle, "-DGQATTN_DTYPES"});
  expect_rejected([&] { prefill_plan(prefill, w); }, {needle, "-DGQATTN_DTYPES"});
}

}  // namespace
}  // namespace gqattn::test
