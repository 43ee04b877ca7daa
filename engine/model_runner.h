// The model runner: a Llama-architecture decoder's forward pass over the paged KV cache, written
// once against the Compute interface (CPU or CUDA); it owns the weights, the activation buffers
// and the K/V pool. Layer: engine (host-only). Modelled on nano-vllm's model_runner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention_backend.h"
#include "compute.h"
#include "config.h"
#include "scheduler.h"
#include "weights.h"

namespace gqattn::engine {

// Without a pool size the CPU path keeps this much K/V.
constexpr int64_t kDefaultCpuPoolBytes = int64_t(256) << 20;
// CUDA: device memory left free beside the auto-sized pool (graphs, cuBLAS, the driver).
constexpr int64_t kCudaMemoryMarginBytes = int64_t(3) << 30;

struct RunnerConfig {
  ModelConfig model;
  WeightSource weights;
  std::string attention = "gqattn";
  int page_size = 16;
  KVLayout kv_layout = KVLayout::kNHD;  // the K/V pools' layout (LayerCache)
  int64_t num_pages = 0;          // > 0: exactly this many pages (at most INT32_MAX: int32 page ids)
  double kv_pool_gib = 0;         // > 0: a pool of this size. With num_pages also 0: room for
                                  // max_num_seqs requests of max_model_len tokens, capped by free
                                  // memory (CUDA) or kDefaultCpuPoolBytes (CPU)
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int64_t max_model_len = 0;      // prompt + generated tokens of a request, at most model.max_position
                                  // (0: model.max_position)
  bool cuda_graph = true;
};

// One step's input on the host. Requests [0, num_decode) decode one token; the others are prefill
// chunks; each request's tokens are consecutive, in request order.
struct ForwardBatch {
  int num_decode = 0;
  std::vector<int32_t> token_ids;        // [num_tokens]
  std::vector<int32_t> positions;        // [num_tokens]
  std::vector<int32_t> qo_indptr;        // [batch + 1]
  std::vector<int32_t> kv_len;           // [batch], this step's tokens included
  std::vector<int32_t> kv_page_indptr;   // [batch + 1]
  std::vector<int32_t> kv_page_indices;  // the requests' pages, in order
  std::vector<int32_t> sample_rows;      // the token rows whose logits are computed

  int batch() const { return int(qo_indptr.size()) - 1; }
  int num_tokens() const { return int(token_ids.size()); }
};

// The forward batch of a scheduled step (the last token of each sampling request is sampled).
// one_ahead: the decode-only batch of the step after the one running now, formed before that
// step's tokens are recorded (positions one further; token ids left 0 for forward() to take on
// the device).
ForwardBatch make_forward_batch(const ScheduledBatch& batch, int page_size, bool one_ahead = false);

// Per step: embedding; per layer RMSNorm -> fused QKV GEMM -> RoPE -> attention backend
// (append_kv + attention) -> O GEMM -> residual -> RMSNorm -> fused gate/up GEMM -> SwiGLU -> down
// GEMM -> residual; final norm; lm_head for the last token of each request that samples. On
// CUDA, decode-only steps run as CUDA graphs, one per batch-size bucket, with attention planned
// (on the host) before each replay.
class ModelRunner {
 public:
  // Allocates and fills the weights, the buffers, the attention backend and the K/V pool.
  // Throws gqattn::Error naming the flag (--kv-pool-gib, --attention, ...) when impossible.
  ModelRunner(std::unique_ptr<Compute> compute, const RunnerConfig& config);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  const ModelConfig& model() const { return config_.model; }
  const RunnerConfig& config() const { return config_; }
  Compute& compute() { return *compute_; }
  int num_pages() const { return num_pages_; }
  int page_size() const { return config_.page_size; }
  int max_model_len() const { return max_model_len_; }
  int64_t kv_pool_bytes() const { return int64_t(num_pages_) * page_bytes_; }
  int64_t weight_bytes() const { return weight_bytes_; }

  // Queues one step: writes its tokens' K/V into their pages and computes the logits (and their
  // argmax) of batch.sample_rows. Throws gqattn::Error when the batch exceeds the capacities.
  // tokens_from_last: a decode-only batch whose requests are, in order, the sample rows of the
  // forward before it; each takes as its token that forward's argmax, copied on the device
  // (batch.token_ids is not read), so step n + 1 can be queued before step n's tokens are known.
  void forward(const ForwardBatch& batch, bool tokens_from_last = false);
  // A prefill of one request of max_num_batched_tokens tokens (at most the pool's), then one
  // decode step of every CUDA-graph batch bucket up to the most requests a step holds
  // (max_num_seqs, at most one a page; without graphs, of that many requests), each request one
  // token at position 0 over one key in page 0: the GEMMs' tuning, the kernels loaded
  // on first use and the graphs' capture happen here, not in the first requests' steps (as
  // serving engines warm up at start: vLLM captures its graphs before serving). Writes only pages
  // no request owns yet, whose owners write every slot before reading it. Call before the first
  // request's forward.
  void warm_up();
  // [sample rows, vocab] of the last forward (copied to the host).
  std::vector<float> logits();
  // Starts copying the argmax of each sample row of the last forward to the host, without
  // waiting for it; greedy_tokens(ticket) waits for that copy only (a forward queued after it may
  // still run). At most Compute::kDownloadSlots tickets are outstanding.
  int start_greedy_tokens();
  std::vector<int32_t> greedy_tokens(int ticket);
  // The argmax of each sample row of the last forward (start and wait).
  std::vector<int32_t> greedy_tokens() { return greedy_tokens(start_greedy_tokens()); }

 private:
  struct Layer;
  struct Buffers;
  void allocate_weights();
  void materialize_weights();
  void allocate_buffers();
  void allocate_pool();
  void probe_step_plans();
  AttentionMetadata upload_metadata(const ForwardBatch& batch, bool cuda_graph);
  void run_model(const AttentionMetadata& meta, int num_samples);
  int graph_bucket(int batch) const;

  RunnerConfig config_;
  std::unique_ptr<Compute> compute_;
  int max_model_len_ = 0;
  int max_tokens_ = 0;      // tokens per step the buffers hold
  int max_batch_ = 0;       // requests per step (graph buckets included)
  int64_t max_step_pages_ = 0;
  std::vector<int> buckets_;
  int num_pages_ = 0;
  int64_t page_bytes_ = 0;  // K + V of one page over all layers
  int64_t weight_bytes_ = 0;
  int last_num_samples_ = 0;
  int next_ticket_ = 0;
  int ticket_samples_[Compute::kDownloadSlots] = {};  // rows each download slot holds

  std::vector<DeviceBuffer> memory_;  // everything the views below point into
  TensorView embed_, final_norm_, lm_head_, inv_freq_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<AttentionBackend> attention_;
};

}  // namespace gqattn::engine
