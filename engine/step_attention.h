// One step's attention through gqattn's plan/run API, shared by the built-in backends: a decode
// plan for the decode requests and a prefill plan (causal, paged) for the prefill chunks, each in
// its own workspace, made once per step and run once per layer; and the step's page table over a
// layer's pools. Layer: engine (host-only).
#pragma once

#include "attention_backend.h"
#include "compute.h"
#include "gqattn/attention.h"

namespace gqattn::engine {

class StepAttention {
 public:
  // num_kv_heads: the K/V heads of the pools run() reads (num_qo_heads for expanded K/V).
  StepAttention(Compute& compute, int num_qo_heads, int num_kv_heads, int head_dim, int page_size);

  void plan(const AttentionMetadata& meta);
  // After a graph-mode plan: 1 when the decode plan split (its graph launches the split merge),
  // else 0 (PlanInputs::graph_per_split).
  int graph_variant() const;
  // o = attention of q over pools k_pages / v_pages (NHD: [pages, page_size, num_kv_heads,
  // head_dim]; HND: [pages, num_kv_heads, page_size, head_dim]) whose pages for the step's requests
  // are listed, in CSR order, in page_indices (int32).
  void run(const TensorView& q, const TensorView& o, const TensorView& k_pages, const TensorView& v_pages,
           KVLayout layout, const TensorView& page_indices, const AttentionMetadata& meta);

 private:
  Compute& compute_;
  int num_qo_heads_, num_kv_heads_, head_dim_, page_size_;
  DeviceBuffer decode_workspace_, prefill_workspace_;
  Plan decode_plan_, prefill_plan_;
};

// The step's whole batch over a layer's pools (the page table the step's K/V are written through).
PagedKV step_kv(const LayerCache& cache, const AttentionMetadata& meta);

}  // namespace gqattn::engine
