// gqattn plan/run for one step's decode requests and prefill chunks. Layer: engine (host-only).
#include "step_attention.h"

#include "gqattn/error.h"

namespace gqattn::engine {

namespace {

Workspace workspace_of(const DeviceBuffer& buffer) { return Workspace{buffer.data(), buffer.bytes()}; }

}  // namespace

StepAttention::StepAttention(Compute& compute, int num_qo_heads, int num_kv_heads, int head_dim, int page_size)
    : compute_(compute), num_qo_heads_(num_qo_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim),
      page_size_(page_size) {
  // The CPU backend needs no workspace.
  if (compute.device() == Device::kCUDA) {
    decode_workspace_ = compute.alloc(kRecommendedWorkspaceBytes);
    prefill_workspace_ = compute.alloc(kRecommendedWorkspaceBytes);
  }
}

void StepAttention::plan(const AttentionMetadata& meta) {
  PlanInputs in;
  in.device = compute_.device();
  in.device_id = compute_.device_id();
  in.dtype = compute_.act_dtype();
  in.num_qo_heads = num_qo_heads_;
  in.num_kv_heads = num_kv_heads_;
  in.head_dim = head_dim_;
  in.page_size = page_size_;
  in.causal = true;
  const int nd = meta.num_decode;
  if (nd > 0) {
    PlanInputs d = in;
    d.qo_len = 1;
    d.kv_indptr.assign(meta.kv_page_indptr.begin(), meta.kv_page_indptr.begin() + nd + 1);
    d.kv_last_page_len.assign(meta.kv_last_page_len.begin(), meta.kv_last_page_len.begin() + nd);
    d.enable_cuda_graph = meta.cuda_graph;
    // A step that splits nothing replays a graph without the split merge (graph_variant()).
    d.graph_per_split = meta.cuda_graph;
    decode_plan_ = decode_plan(d, workspace_of(decode_workspace_), compute_.stream());
  }
  if (meta.num_prefill > 0) {
    PlanInputs p = in;
    p.qo_indptr = meta.prefill_qo_indptr;
    p.kv_indptr = meta.prefill_kv_page_indptr;
    p.kv_last_page_len.assign(meta.kv_last_page_len.begin() + nd, meta.kv_last_page_len.end());
    prefill_plan_ = prefill_plan(p, workspace_of(prefill_workspace_), compute_.stream());
  }
}

int StepAttention::graph_variant() const { return decode_plan_.split ? 1 : 0; }

void StepAttention::run(const TensorView& q, const TensorView& o, const TensorView& k_pages,
                        const TensorView& v_pages, KVLayout layout, const TensorView& page_indices,
                        const AttentionMetadata& meta) {
  const int nd = meta.num_decode, batch = meta.batch();
  if (nd > 0) {
    DecodeArgs a;
    a.q = slice_rows(q, 0, nd);
    a.o = slice_rows(o, 0, nd);
    a.kv.k_pages = k_pages;
    a.kv.v_pages = v_pages;
    a.kv.layout = layout;
    a.kv.kv_page_indptr = slice_rows(meta.kv_page_indptr_d, 0, nd + 1);
    a.kv.kv_page_indices = page_indices;
    a.kv.kv_last_page_len = slice_rows(meta.kv_last_page_len_d, 0, nd);
    decode_run(decode_plan_, a, compute_.stream());
  }
  if (meta.num_prefill > 0) {
    PrefillArgs a;
    a.q = slice_rows(q, nd, meta.num_tokens);
    a.o = slice_rows(o, nd, meta.num_tokens);
    a.qo_indptr = meta.prefill_qo_indptr_d;
    a.causal = true;
    a.paged.k_pages = k_pages;
    a.paged.v_pages = v_pages;
    a.paged.layout = layout;
    a.paged.kv_page_indptr = meta.prefill_kv_page_indptr_d;
    a.paged.kv_page_indices = slice_rows(page_indices, meta.decode_pages(), page_indices.shape[0]);
    a.paged.kv_last_page_len = slice_rows(meta.kv_last_page_len_d, nd, batch);
    prefill_run(prefill_plan_, a, compute_.stream());
  }
}

PagedKV step_kv(const LayerCache& cache, const AttentionMetadata& meta) {
  PagedKV kv;
  kv.k_pages = cache.k_pages;
  kv.v_pages = cache.v_pages;
  kv.layout = cache.layout;
  kv.kv_page_indptr = meta.kv_page_indptr_d;
  kv.kv_page_indices = meta.kv_page_indices_d;
  kv.kv_last_page_len = meta.kv_last_page_len_d;
  return kv;
}

}  // namespace gqattn::engine
