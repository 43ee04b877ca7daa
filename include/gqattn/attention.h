// The attention operations: append_kv, decode and prefill (plan/run), merge_states.
// Layer: include/gqattn (public, host-only). The backend follows the tensors' device: CPU tensors
// run on the float64-accumulating CPU backend, CUDA tensors on the GPU kernels.
//
// Conventions shared by every call:
//   q, o:  [tokens, num_qo_heads, head_dim], bf16 or fp16 (fp32 accepted by the CPU backend),
//          last dimension contiguous, 16-byte aligned rows on the GPU. o may be q itself (the
//          same view); otherwise no output may share memory with another argument.
//   group_size = num_qo_heads / num_kv_heads; query head h reads K/V head h / group_size.
//   lse:   optional fp32 [tokens, num_qo_heads], natural-log log-sum-exp of the scaled logits;
//          -inf for a row that sees no key (whose output is 0). Last dimension contiguous;
//          wholly contiguous on the GPU.
//   sm_scale: 0 means 1 / sqrt(head_dim); finite and >= 0.
//   Causal masks are aligned to the end of each request's KV: query token i of a request with
//   qo_len new tokens and kv_len keys sees keys 0 .. kv_len - qo_len + i.
//   stream: a cudaStream_t passed as void* (nullptr: the default stream); ignored on the CPU.
//   Threads: any function may be called from several threads at once; plans with separate
//   workspaces (and streams) are independent. A workspace holds its plan's work list, split-KV
//   partials and work counters, so its plan() and run() calls must be ordered (one stream): one
//   plan is not run on two streams at once. GQATTN_* environment variables are read once, at first
//   use. A large CPU call starts helper threads (GQATTN_CPU_THREADS, else every core) and joins them
//   before it returns; concurrent calls each start their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"

namespace gqattn {

// ---------------------------------------------------------------------------------------------
// append_kv: writes new tokens' K/V into their page slots.
//   k_new, v_new:   [num_tokens, num_kv_heads, head_dim], same dtype as the pools, same strides.
//   batch_indices:  int32 [num_tokens], the request each token belongs to.
//   positions:      int32 [num_tokens], the token's position in its request's KV (0-based); the
//                   slot is page kv_page_indices[kv_page_indptr[b] + pos / page_size], row
//                   pos % page_size. The pages must already be in the table.
//   num_tokens fits in int32.
// On the CPU every index is checked and an out-of-range one throws before anything is written. On
// the GPU the kernel skips tokens whose position is negative or lies beyond the request's pages
// (it cannot throw without a host sync) and takes batch indices and page ids as given; validate on
// the host with the CPU backend's checks when in doubt.
// Does not allocate or synchronise.
void append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
               const TensorView& batch_indices, const TensorView& positions, void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Plan / run. plan() runs on the host once per batch (per step): it checks the lengths, picks the
// kernel and the split-KV chunking, and (for CUDA) uploads the work list into the caller's
// workspace with an async copy on `stream`. run() is then called once per layer: on the GPU it
// allocates nothing and never synchronises, so it can be captured in a CUDA graph.
// Limits of one request, on either backend: at most 2^30 keys (kv_len) and 2^30 packed query rows
// (qo_len x group_size); plan() rejects more.

// A device (or, for the CPU backend, unused) scratch buffer that the plan lays out from its
// start. Plans that are used in the same step (a decode plan and a prefill plan, say) need
// separate workspaces; a new plan in the same workspace replaces the old one.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};
// A workspace of this size serves head_dim up to 256 (in a smaller one, down to about 7 MiB, the
// split-KV partial results take fewer, longer key chunks). Whatever its size, a CUDA plan holds at
// most 2^17 work items (requests x K/V heads x row tiles x key chunks: 16K decode requests of up
// to 8 K/V heads, 4K of 32) and 2^16 requests; plan() rejects a larger batch.
constexpr size_t kRecommendedWorkspaceBytes = size_t(128) << 20;

// Host-side facts about a batch, from which a plan is made. All vectors live on the host.
struct PlanInputs {
  Device device = Device::kCUDA;
  int device_id = 0;
  DType dtype = DType::kBF16;  // of q / k / v
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Paged K/V: the page size. Ragged K/V: 0.
  int page_size = 0;
  bool causal = false;
  // Prefill: [batch + 1] row offsets of each request's query tokens. Decode: leave empty and set
  // qo_len (every request has qo_len new tokens).
  std::vector<int32_t> qo_indptr;
  int qo_len = 1;
  // Paged: the CSR page indptr [batch + 1] and last_page_len [batch].
  // Ragged: kv_indptr [batch + 1] token offsets and an empty kv_last_page_len.
  std::vector<int32_t> kv_indptr;
  std::vector<int32_t> kv_last_page_len;
  // Checked mode (paged only), when kv_page_indices is not empty or num_pages >= 0: every page id is
  // checked against [0, num_pages), and there must be kv_indptr[batch] of them. The plan keeps
  // num_pages, and run() then rejects pools of fewer pages (it does not read the GPU's page ids).
  std::vector<int32_t> kv_page_indices;
  int64_t num_pages = -1;
  // CUDA-graph mode: the kernel and the workspace layout depend only on the device, the heads,
  // head_dim, the workspace size and the query rows (decode: batch and qo_len; prefill: qo_indptr),
  // never on the K/V lengths, and the captured grid's CTAs loop over whatever work list the
  // workspace holds, so a graph captured with one plan's run() replays correctly after plan() is
  // called again (same workspace, same query rows) with other K/V lengths. Other query rows need a
  // new capture: they may pick another kernel (another row tile) and merge other rows. Such a
  // graph always launches the split-KV merge, which skips the requests that were not split.
  bool enable_cuda_graph = false;
  // CUDA-graph mode, one graph per split decision: run() launches the merge only when this plan
  // split (Plan::split), so a graph replays correctly only after plans with the same Plan::split;
  // the caller keeps one graph for each value. Saves the merge's launch over every query row in
  // steps that split nothing (4.7 us for 128 requests x 32 heads on an H200, measured when that
  // merge took a block a row).
  bool graph_per_split = false;
  // Upper bound on split-KV chunks per request (1 disables split-KV). 0: the planner decides.
  int max_num_splits = 0;
  // Split-KV in chunks of this many keys (rounded up to the chosen kernel's key tile) instead of
  // the planner's choice: a request with more keys than the chunk runs as ceil(kv_len / chunk)
  // chunks, a shorter one whole (FlashInfer's fixed_split_size, counted in keys). A request's
  // chunks then follow from its own length and the kernel, not from the rest of the batch, and
  // A/B runs can force splits the planner's model would not pick. 0: the planner decides. Not
  // together with max_num_splits. The CPU backend computes every row whole and ignores it.
  int fixed_split_size = 0;
};

// What plan() decided. Treat it as opaque; its fields are visible for tests and benchmarks.
struct Plan {
  Device device = Device::kCPU;
  int device_id = 0;
  DType dtype = DType::kBF16;
  int batch = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;  // 0: ragged
  int64_t num_pages = -1;  // checked mode's PlanInputs::num_pages (run() needs pools this large); else -1
  bool causal = false;
  bool is_decode = false;
  int64_t total_qo = 0;
  std::vector<int32_t> qo_indptr;  // host copy
  std::vector<int32_t> kv_len;     // host copy
  // Kernel choice and launch geometry (CUDA).
  int kernel_id = -1;     // row of the kernel table that select_kernel() chose
  int cta_rows = 0;       // packed query rows per work item
  int kv_chunk = 0;       // tokens per split-KV chunk (0: no split)
  int num_work = 0;       // attention work items
  int num_ctas = 0;       // attention grid size
  int max_splits = 1;     // most chunks any request was split into
  bool split = false;     // true when some request's partial results need merging
  bool merge_programmatic = false;  // the merge starts during the attention kernel's tail (sm_90)
  // sm_90a kernel with items of <= 64 rows: its two consumer warpgroups take the halves of every
  // K/V tile's keys and merge their states at the end, instead of one holding 64 empty rows.
  bool split_item_keys = false;
  // Device pointers into the workspace.
  void* d_header = nullptr;       // PlanHeader: num_work, batch, total_qo, max_splits
  void* d_work = nullptr;         // work items
  void* d_requests = nullptr;     // per-request merge info
  float* d_partial_o = nullptr;   // fp32 partial outputs
  float* d_partial_lse = nullptr; // fp32 partial LSE (base 2)
  size_t workspace_bytes_used = 0;
};

// Decode: every request has qo_len (= PlanInputs::qo_len, 1..8 on the GPU) new tokens at the end
// of its KV, causal among themselves (speculative decoding); K/V paged.
//   q, o: [batch * qo_len, num_qo_heads, head_dim]; request b's tokens are rows b*qo_len ...
struct DecodeArgs {
  TensorView q;
  PagedKV kv;
  TensorView o;
  TensorView lse;  // optional
  float sm_scale = 0.f;
};

// Prefill: a varlen batch; K/V either paged or ragged (exactly one of the two given).
//   q, o: [qo_indptr[batch], num_qo_heads, head_dim]; qo_indptr is int32 [batch + 1] on the
//   tensors' device (run() reads the plan's host copy; the two must agree).
struct PrefillArgs {
  TensorView q;
  TensorView qo_indptr;
  PagedKV paged;
  RaggedKV ragged;
  bool causal = false;
  TensorView o;
  TensorView lse;  // optional
  float sm_scale = 0.f;
};

Plan decode_plan(const PlanInputs& inputs, const Workspace& workspace, void* stream = nullptr);
void decode_run(const Plan& plan, const DecodeArgs& args, void* stream = nullptr);

Plan prefill_plan(const PlanInputs& inputs, const Workspace& workspace, void* stream = nullptr);
void prefill_run(const Plan& plan, const PrefillArgs& args, void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// merge_states: combines partial attention results over disjoint key sets.
//   v:   [n, num_states, num_heads, head_dim] (bf16, fp16 or fp32), s: fp32 [n, num_states, num_heads]
//        (natural-log LSE of each partial, -inf for an empty one).
//   v_merged: [n, num_heads, head_dim] (any of the three dtypes), s_merged: optional fp32 [n, num_heads].
//   num_states, num_heads and head_dim each fit in int32.
// Merging zero non-empty states gives 0 and -inf. Does not allocate or synchronise.
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                  const TensorView& s_merged, void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Capabilities, as select_kernel() answers them for this build.
struct BuildInfo {
  bool cuda = false;                 // built with CUDA kernels
  std::vector<int> head_dims;        // head dims compiled for the GPU
  std::vector<DType> dtypes;         // dtypes compiled for the GPU
  std::vector<int> cuda_archs;       // e.g. {80, 90}
};
BuildInfo build_info();
// Number of usable CUDA devices (0 when built without CUDA or none present).
int cuda_device_count();

}  // namespace gqattn
