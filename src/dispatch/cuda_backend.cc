// The CUDA backend: completes plans (kernel choice, split-KV, workspace layout and upload) and
// turns validated run() arguments into kernel parameters. Layer: src/dispatch (host-only).
#include "dispatch/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "api/env_flag.h"
#include "dispatch/select_kernel.h"
#include "gqattn/error.h"
#include "kernels/launch.h"
#include "plan/planner.h"
#include "prims/cuda_check.h"

namespace gqattn::cuda_backend {
namespace {

// Workspace layout: [header | work items | merge requests | partial lse | partial o]. The offsets
// depend only on the workspace size and head_dim, never on lengths (CUDA-graph replay relies on
// this).
constexpr size_t kAlign = kWorkspaceAlign;
// A split-KV chunk never holds fewer keys than this: below it the partial write and the merge
// cost more than the parallelism gains (docs/perf-notes.md, "split-KV"; 256 until session 9,
// when the online split merge made 128-key chunks pay: items 37, 38).
constexpr int kMinChunkKeys = 128;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct Layout {
  size_t header = 0, work = 0, requests = 0, partial_lse = 0, partial_o = 0;
  int64_t partial_rows_cap = 0;
};

Layout fixed_layout() {
  Layout l;
  l.header = 0;
  l.work = align_up(sizeof(PlanHeader));
  l.requests = align_up(l.work + kMaxWorkItems * sizeof(WorkItem));
  l.partial_lse = align_up(l.requests + kMaxRequests * sizeof(MergeRequest));
  return l;
}

Layout make_layout(size_t bytes, int head_dim) {
  Layout l = fixed_layout();
  GQ_CHECK(bytes >= min_workspace_bytes(), "workspace: ", bytes, " bytes is too small; at least ",
           min_workspace_bytes(), " needed (kRecommendedWorkspaceBytes = ", kRecommendedWorkspaceBytes, ")");
  const size_t rest = bytes - l.partial_lse - kAlign;
  // Partial rows are int32 in the work list (WorkItem / MergeRequest::partial_base): a workspace
  // of more rows than that (hundreds of GB) leaves the rest unused.
  l.partial_rows_cap = std::min<int64_t>(static_cast<int64_t>(rest / (sizeof(float) * (head_dim + 1))), INT32_MAX);
  l.partial_o = align_up(l.partial_lse + l.partial_rows_cap * sizeof(float));
  return l;
}

// Makes `device` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    GQ_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) GQ_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = 0;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// major * 10 + minor, e.g. 90 for the H100/H200.
int compute_capability(int device) {
  int major = 0, minor = 0;
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

int num_sms(int device) {
  int sms = 0;
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The dynamic shared memory a CTA may opt in to: 99 KB on sm_86 / sm_89 / sm_120, 163 KB on sm_80,
// 227 KB on sm_90.
int max_smem_per_block(int device) {
  int bytes = 0;
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

struct KVSource {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;
  const int32_t* page_indices = nullptr;
  int64_t rows = 0;  // pages (paged) or tokens (ragged) in the pool
  int num_kv_heads = 0;
};

KVSource from_paged(const PagedKV& kv) {
  return {kv.k_pages.data, kv.v_pages.data, kv.page_stride(), kv.token_stride(), kv.head_stride(),
          kv.kv_page_indices.ptr<const int32_t>(), kv.k_pages.shape[0],
          static_cast<int>(kv.layout == KVLayout::kHND ? kv.k_pages.shape[1] : kv.k_pages.shape[2])};
}

KVSource from_ragged(const RaggedKV& kv) {
  // Ragged K/V is paged K/V with one key per page and the identity page table.
  return {kv.k.data, kv.v.data, kv.k.strides[0], 0, kv.k.strides[1], nullptr, kv.k.shape[0],
          static_cast<int>(kv.k.shape[1])};
}

float scale_log2(float sm_scale, int head_dim) {
  const float scale = sm_scale > 0.f ? sm_scale : 1.f / std::sqrt(static_cast<float>(head_dim));
  return scale * 1.44269504088896340736f;
}

void run_attention(const Plan& plan, const TensorView& q, const KVSource& kv, const TensorView& o,
                   const TensorView& lse, float sm_scale, void* stream) {
  GQ_CHECK(plan.device == Device::kCUDA && plan.kernel_id >= 0, "plan: not a CUDA plan");
  DeviceGuard guard(plan.device_id);
  const dispatch::KernelChoice& kernel = dispatch::kernel_by_id(plan.kernel_id);
  const int group_size = plan.num_qo_heads / plan.num_kv_heads;

  kernels::AttentionParams p;
  p.q = q.data;
  p.q_stride_n = q.strides[0];
  p.q_stride_h = q.strides[1];
  p.k = kv.k;
  p.v = kv.v;
  p.kv_page_stride = kv.page_stride;
  p.kv_token_stride = kv.token_stride;
  p.kv_head_stride = kv.head_stride;
  p.kv_rows = kv.rows;
  p.num_kv_heads = kv.num_kv_heads;
  p.page_indices = kv.page_indices;
  p.o = o.data;
  p.o_stride_n = o.strides[0];
  p.o_stride_h = o.strides[1];
  p.o_tokens = o.shape[0];
  p.lse = lse.defined() ? lse.ptr<float>() : nullptr;
  p.partial_o = plan.d_partial_o;
  p.partial_lse = plan.d_partial_lse;
  p.work = static_cast<const WorkItem*>(plan.d_work);
  p.header = static_cast<const PlanHeader*>(plan.d_header);
  p.item_counters = &static_cast<PlanHeader*>(plan.d_header)->next_item;
  p.num_qo_heads = plan.num_qo_heads;
  p.group = FastDivmod(static_cast<uint32_t>(group_size));
  p.page = FastDivmod(static_cast<uint32_t>(plan.page_size > 0 ? plan.page_size : 1));
  p.sm_scale_log2 = scale_log2(sm_scale, plan.head_dim);
  p.causal = plan.causal ? 1 : 0;
  p.split_item_keys = plan.split_item_keys ? 1 : 0;
  kernel.launch(p, plan.num_ctas, stream);

  if (plan.split) {
    kernels::SplitMergeParams m;
    m.partial_o = plan.d_partial_o;
    m.partial_lse = plan.d_partial_lse;
    m.requests = static_cast<const MergeRequest*>(plan.d_requests);
    m.header = static_cast<const PlanHeader*>(plan.d_header);
    m.o = o.data;
    m.o_stride_n = o.strides[0];
    m.o_stride_h = o.strides[1];
    m.lse = p.lse;
    m.num_qo_heads = plan.num_qo_heads;
    m.head_dim = plan.head_dim;
    m.group = p.group;
    m.total_qo = static_cast<int>(plan.total_qo);
    m.batch = plan.batch;
    m.per_request = FastDivmod(static_cast<uint32_t>(plan.batch > 0 ? std::max<int64_t>(plan.total_qo / plan.batch, 1) : 1));
    m.max_splits = plan.max_splits;
    m.programmatic = plan.merge_programmatic ? 1 : 0;
    kernels::launch_split_merge(plan.dtype, m, stream);
  }
}

}  // namespace

void check_supported(DType dtype, int head_dim) {
  // Both families must exist for the pair; select_kernel names the option when one is missing.
  dispatch::select_kernel(dtype, head_dim, 1);
  dispatch::select_kernel(dtype, head_dim, 1 << 20);
}

size_t min_workspace_bytes() { return fixed_layout().partial_lse + kAlign; }

void finish_plan(Plan& plan, const PlanInputs& inputs, const Workspace& workspace, void* stream) {
  DeviceGuard guard(plan.device_id);
  GQ_CHECK(workspace.data != nullptr, "workspace: data is null (the CUDA backend needs a device buffer)");
  GQ_CHECK(reinterpret_cast<uintptr_t>(workspace.data) % kAlign == 0, "workspace: data must be ", kAlign,
           "-byte aligned");
  const int group_size = plan.num_qo_heads / plan.num_kv_heads;
  int max_rows = 0;
  // Requests with query rows x K/V heads: the items of a kernel with a row tile >= max_rows. From the
  // batch, not the lengths, so that a CUDA graph's plans keep one kernel.
  int64_t requests_x_kv_heads = 0;
  int64_t keys = 0, requests = 0, rows = 0;  // of the requests with query rows
  std::vector<int32_t> row_tiles(plan.batch);  // each request's packed rows, then its row tiles
  for (int b = 0; b < plan.batch; ++b) {
    // int32 after validate_plan_inputs (kMaxPackedRows); the product in int64 all the same.
    row_tiles[b] = static_cast<int32_t>(int64_t(plan.qo_indptr[b + 1] - plan.qo_indptr[b]) * group_size);
    max_rows = std::max(max_rows, row_tiles[b]);
    if (row_tiles[b] > 0) {
      requests_x_kv_heads += plan.num_kv_heads;
      keys += plan.kv_len[b];
      rows += row_tiles[b];
      ++requests;
    }
  }
  // The mean length may pick the kernel only where no CUDA graph replays this plan's kernel.
  const bool graph = inputs.enable_cuda_graph || inputs.graph_per_split;
  const int64_t mean_kv_len = graph || requests == 0 ? 0 : std::max<int64_t>(1, keys / requests);
  const int64_t mean_rows = graph || requests == 0 ? 0 : rows / requests;
  const int sm = compute_capability(plan.device_id);
  const dispatch::KernelChoice kernel =
      dispatch::select_kernel(plan.dtype, plan.head_dim, max_rows, sm, requests_x_kv_heads, num_sms(plan.device_id),
                              mean_kv_len, mean_rows, max_smem_per_block(plan.device_id), plan.causal);
  for (int32_t& tiles : row_tiles) tiles = (tiles + kernel.cta_rows - 1) / kernel.cta_rows;
  const int target_ctas = num_sms(plan.device_id) * kernel.ctas_per_sm();
  const Layout layout = make_layout(workspace.bytes, plan.head_dim);

  // The merge's cost is counted in keys of this kernel: where a key takes longer, the same merge
  // is fewer keys.
  const double merge_rows = static_cast<double>(plan.total_qo) * plan.num_qo_heads / kernel.key_time;
  // The wgmma kernel splits too: few long items (MQA decode with 4 draft tokens is one 128-row item
  // a request) would otherwise leave most SMs idle (perf-notes item 56).
  // Decode items of a request are equally long, so a partial last wave costs what the model says;
  // prefill keeps a full GPU's items whole. GQATTN_DISABLE_PARTIAL_WAVE_SPLIT=1: decode too (the A/B).
  static const bool partial_wave_split_disabled = env_flag("GQATTN_DISABLE_PARTIAL_WAVE_SPLIT");
  const bool fixed_chunk = inputs.fixed_split_size > 0;
  int kv_chunk = fixed_chunk ? plan::fixed_kv_chunk(plan.kv_len, row_tiles, plan.num_kv_heads, inputs.fixed_split_size,
                                                    kernel.kv_tile, kMaxWorkItems)
                             : plan::choose_kv_chunk(plan.kv_len, row_tiles, plan.num_kv_heads, target_ctas,
                                                     kernel.kv_tile, kMinChunkKeys, inputs.max_num_splits, merge_rows,
                                                     kernel.merge_fixed_keys,
                                                     plan.is_decode && !partial_wave_split_disabled, kMaxWorkItems);
  plan::WorkList list = plan::build_work_list(plan, inputs.kv_indptr, kernel.cta_rows, kv_chunk);
  // A fixed chunk is the caller's: its partial results must fit, or the plan fails (before any
  // upload: the workspace keeps the previous plan).
  GQ_CHECK(!fixed_chunk || list.partial_rows <= layout.partial_rows_cap, "fixed_split_size (",
           inputs.fixed_split_size, "): the split's ", list.partial_rows, " partial rows exceed the workspace's ",
           layout.partial_rows_cap, " (a larger workspace or chunk)");
  // Fewer, longer chunks until the partial results fit the workspace.
  int max_kv = 0;
  for (int32_t len : plan.kv_len) max_kv = std::max(max_kv, len);
  while (list.partial_rows > layout.partial_rows_cap && kv_chunk > 0) {
    // In int64: a chunk past 2^30 keys doubles past INT32_MAX; it then holds every request whole.
    const int64_t doubled = int64_t(kv_chunk) * 2;
    kv_chunk = doubled >= max_kv ? 0 : static_cast<int>(doubled);
    list = plan::build_work_list(plan, inputs.kv_indptr, kernel.cta_rows, kv_chunk);
  }
  GQ_CHECK(list.items.size() <= kMaxWorkItems, "plan: ", list.items.size(), " work items exceed the limit of ",
           kMaxWorkItems, " (split the batch)");
  GQ_CHECK(static_cast<size_t>(plan.batch) <= kMaxRequests, "plan: batch ", plan.batch, " exceeds the limit of ",
           kMaxRequests, " requests (split the batch)");

  plan.kernel_id = kernel.id;
  // On sm_90 the merge after a decode or decode_mid kernel is a programmatic dependent launch: it
  // is scheduled during the attention kernel's tail and finds its rows' requests meanwhile (split
  // rows of 10-20 us 1.02-1.12x, perf-notes item 82; decode_mid since the lookup moved before the
  // wait, MQA 8 x 512 1.12x, item 165). After decode_many and the wgmma kernel it lost (item 82:
  // 0.90x; item 165: 0.96x), so they keep the ordinary one. GQATTN_DISABLE_PDL=1: the ordinary
  // launch everywhere. Only where the merge's code waits for the attention grid: a GPU past sm_90
  // runs the sm_80 PTX of a build without its architecture, whose merge would read the partial
  // rows unsynchronised.
  static const bool pdl_disabled = env_flag("GQATTN_DISABLE_PDL");
  plan.merge_programmatic = !pdl_disabled && kernels::merge_starts_early(kernel.family) && sm >= 90 &&
                            kernels::split_merge_waits_for_attention();
  // The wgmma kernel with items of <= 64 rows (decode rows of a request and K/V head: the group x
  // the new tokens): both consumer warpgroups work on the same rows, each on half of every K/V
  // tile's keys, so neither computes 64 empty rows and each GEMM and softmax a tile is half as long
  // (perf-notes item 92: MQA 128 x 32K had the tensor pipe 52% busy at 81% of DRAM bandwidth).
  // GQATTN_DISABLE_SPLIT_ITEM_KEYS=1: one warpgroup idles on empty rows, as before.
  static const bool split_keys_disabled = env_flag("GQATTN_DISABLE_SPLIT_ITEM_KEYS");
  plan.split_item_keys = !split_keys_disabled && max_rows <= kernel.cta_rows / 2 && kernel.split_keys;
  plan.cta_rows = kernel.cta_rows;
  plan.kv_chunk = kv_chunk;
  plan.num_work = static_cast<int>(list.items.size());
  plan.max_splits = list.max_splits;
  // In CUDA-graph mode a replay keeps the captured grid and CTAs loop over the work list (a CTA
  // past its end exits), and the merge kernel always runs (it skips unsplit requests), so a replay
  // is right for any later plan; with graph_per_split it runs only after a split, and the caller
  // keeps a graph per Plan::split. The grid is one CTA an item where the items outnumber
  // target_ctas, as outside graph mode: against target_ctas CTAs looping over the 4,096 items of
  // the engine's MHA step, decode MHA 128 x 256 / 512 keys ran 1.052x / 1.025x and the engine's
  // MHA step 0.6% shorter (perf-notes item 171).
  plan.num_ctas = inputs.enable_cuda_graph ? std::max(target_ctas, plan.num_work) : plan.num_work;
  // The wgmma kernel runs persistent: one CTA per SM, each taking the next item of the list from
  // a counter (the list holds each head's longest row tiles first), its producer loading the next
  // item while the consumers finish the current one.
  if (kernels::is_sm90_family(kernel.family)) {
    // A split list keeps each request's chunks in order for the merge.
    if (!list.split) plan::order_longest_first(list, group_size, kernel.cta_rows, plan.causal);
    // Persistent for every K/V source: the producer loads the next item's first tiles while the
    // consumers finish the current one.
    plan.num_ctas = inputs.enable_cuda_graph ? target_ctas : std::min(plan.num_work, target_ctas);
  }
  // Both kernels load item blockIdx.x before they read num_work (one round trip less at the start).
  // The grid is at most max(num_work, target_ctas): num_work was checked above and target_ctas
  // (SMs x resident CTAs: a few hundred, 528 for decode_many on an H200) is far below 2^17, so this
  // cannot fire on any GPU today; it guards that read against a change of the grid's rule
  // (tests/gpu/plan_limits_gpu_test.cc runs a grid of 2^17 CTAs, the most it allows).
  GQ_CHECK(plan.num_ctas <= static_cast<int64_t>(kMaxWorkItems), "plan: a grid of ", plan.num_ctas,
           " CTAs exceeds the work list's ", kMaxWorkItems, " items");
  plan.split = list.split || (inputs.enable_cuda_graph && !inputs.graph_per_split);
  char* base = static_cast<char*>(workspace.data);
  plan.d_header = base + layout.header;
  plan.d_work = base + layout.work;
  plan.d_requests = base + layout.requests;
  plan.d_partial_lse = reinterpret_cast<float*>(base + layout.partial_lse);
  plan.d_partial_o = reinterpret_cast<float*>(base + layout.partial_o);
  plan.workspace_bytes_used = layout.partial_o + static_cast<size_t>(list.partial_rows) * plan.head_dim * sizeof(float);

  const PlanHeader header{plan.num_work, plan.batch, static_cast<int32_t>(plan.total_qo), list.max_splits,
                          0, 0, {0, 0}};
  auto s = static_cast<cudaStream_t>(stream);
  // Pageable sources: each copy returns once the bytes are staged, so the vectors may go away.
  GQ_CUDA_CHECK(cudaMemcpyAsync(plan.d_header, &header, sizeof(header), cudaMemcpyHostToDevice, s));
  if (!list.items.empty())
    GQ_CUDA_CHECK(cudaMemcpyAsync(plan.d_work, list.items.data(), list.items.size() * sizeof(WorkItem),
                                  cudaMemcpyHostToDevice, s));
  if (!list.requests.empty())
    GQ_CUDA_CHECK(cudaMemcpyAsync(plan.d_requests, list.requests.data(),
                                  list.requests.size() * sizeof(MergeRequest), cudaMemcpyHostToDevice, s));
}

void decode_run(const Plan& plan, const DecodeArgs& args, void* stream) {
  run_attention(plan, args.q, from_paged(args.kv), args.o, args.lse, args.sm_scale, stream);
}

void prefill_run(const Plan& plan, const PrefillArgs& args, void* stream) {
  const KVSource kv = args.paged.defined() ? from_paged(args.paged) : from_ragged(args.ragged);
  run_attention(plan, args.q, kv, args.o, args.lse, args.sm_scale, stream);
}

void append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
               const TensorView& batch_indices, const TensorView& positions, void* stream) {
  DeviceGuard guard(k_new.device_id);
  kernels::launch_append_kv(kernels::append_kv_params(kv, k_new, v_new, batch_indices, positions), stream);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                  const TensorView& s_merged, void* stream) {
  DeviceGuard guard(v.device_id);
  kernels::MergeStatesParams p;
  p.v = v.data;
  p.v_dtype = v.dtype;
  p.v_stride_n = v.strides[0];
  p.v_stride_s = v.strides[1];
  p.v_stride_h = v.strides[2];
  p.s = s.ptr<const float>();
  p.s_stride_n = s.strides[0];
  p.s_stride_s = s.strides[1];
  p.s_stride_h = s.strides[2];
  p.v_out = v_merged.data;
  p.out_dtype = v_merged.dtype;
  p.out_stride_n = v_merged.strides[0];
  p.out_stride_h = v_merged.strides[1];
  if (s_merged.defined()) {
    p.s_out = s_merged.ptr<float>();
    p.s_out_stride_n = s_merged.strides[0];
    p.s_out_stride_h = s_merged.strides[1];
  }
  p.n = v.shape[0];
  p.num_states = static_cast<int>(v.shape[1]);
  p.num_heads = static_cast<int>(v.shape[2]);
  p.head_dim = static_cast<int>(v.shape[3]);
  kernels::launch_merge_states(p, stream);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

void fill_build_info(BuildInfo& info) {
  info.cuda = true;
  info.head_dims = dispatch::built_head_dims();
  info.dtypes = dispatch::built_dtypes();
#ifdef GQATTN_CUDA_ARCH_LIST
  info.cuda_archs = {GQATTN_CUDA_ARCH_LIST};
#endif
}

}  // namespace gqattn::cuda_backend
