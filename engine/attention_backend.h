// The attention backend interface of the model runner, with a registry by name; built in:
// "gqattn" (native grouped-query kernels) and "expand" (K/V copied out to every query head, then
// an MHA computation: what engines did before native GQA kernels). Layer: engine (host-only).
// Modelled on mini-sglang's attention/base.py; per-step metadata is passed explicitly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compute.h"
#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"

namespace gqattn::engine {

// One step's batch as attention sees it. Requests [0, num_decode) decode one token each (tokens
// [0, num_decode)); requests [num_decode, batch) are prefill chunks (the remaining tokens, in
// order). Host vectors feed plan(); the *_d views hold the same arrays on the compute device.
struct AttentionMetadata {
  int num_decode = 0;
  int num_prefill = 0;
  int num_tokens = 0;
  // Paged K/V of every request after this step's tokens are written (CSR over the whole batch).
  std::vector<int32_t> kv_page_indptr;     // [batch + 1]
  std::vector<int32_t> kv_page_indices;    // [kv_page_indptr[batch]]
  std::vector<int32_t> kv_last_page_len;   // [batch]
  // The prefill requests' part, rebased to start at 0.
  std::vector<int32_t> prefill_qo_indptr;        // [num_prefill + 1]
  std::vector<int32_t> prefill_kv_page_indptr;   // [num_prefill + 1]
  // True when the step runs inside a CUDA graph: plans must be made for replay.
  bool cuda_graph = false;

  TensorView kv_page_indptr_d, kv_page_indices_d, kv_last_page_len_d;
  TensorView prefill_qo_indptr_d, prefill_kv_page_indptr_d;
  TensorView batch_indices_d;  // int32 [num_tokens]: each token's request
  TensorView positions_d;      // int32 [num_tokens]: each token's position in its request

  int batch() const { return num_decode + num_prefill; }
  // Pages listed for the decode requests (where the prefill requests' pages start).
  int decode_pages() const { return kv_page_indptr[size_t(num_decode)]; }
};

// One layer's K/V pools, each [num_pages, page_size, num_kv_heads, head_dim] (NHD, the default,
// vLLM's and FlashInfer's) or [num_pages, num_kv_heads, page_size, head_dim] (HND: a page's keys of
// one head contiguous; RunnerConfig::kv_layout).
struct LayerCache {
  TensorView k_pages;
  TensorView v_pages;
  KVLayout layout = KVLayout::kNHD;
};

// What a backend is built for.
struct AttentionContext {
  Compute* compute = nullptr;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int64_t max_step_pages = 0;  // most pages the requests of one step list together
};

// A backend plans once per step (host work, from the step's metadata) and runs once per layer:
// it computes the attention output over the layer's pages, which already hold the step's new K/V
// (the model runner writes them with RoPE: Compute::rope_store_kv).
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string name() const = 0;
  // Once per step, before the layers: plans from the host vectors (async uploads on the stream).
  virtual void plan(const AttentionMetadata& meta) = 0;
  // Once per layer: o[num_tokens, num_qo_heads, head_dim] = attention of q (same layout, strided
  // rows allowed) over each request's K/V in `cache`, causal. Allocates nothing, never synchronises.
  virtual void forward(const LayerCache& cache, const TensorView& q, const TensorView& o,
                       const AttentionMetadata& meta) = 0;
  // After plan() of a graph step: which of the backend's graph shapes the step needs (steps whose
  // plans launch different kernels replay different CUDA graphs), from 0 to kGraphVariants - 1.
  static constexpr int kGraphVariants = 2;
  virtual int graph_variant() const { return 0; }
};

using AttentionBackendFactory = std::function<std::unique_ptr<AttentionBackend>(const AttentionContext&)>;

// Adds (or replaces) a backend under `name`.
void register_attention_backend(const std::string& name, AttentionBackendFactory factory);
// Throws gqattn::Error naming --attention and the registered names for an unknown one.
std::unique_ptr<AttentionBackend> make_attention_backend(const std::string& name, const AttentionContext& context);
std::vector<std::string> attention_backend_names();

// The built-in backends (registered on first use of the registry).
std::unique_ptr<AttentionBackend> make_gqattn_backend(const AttentionContext& context);
std::unique_ptr<AttentionBackend> make_expand_backend(const AttentionContext& context);

}  // namespace gqattn::engine
