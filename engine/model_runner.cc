// The forward pass, its buffers, the K/V pool and CUDA-graph bucketing. Layer: engine (host-only).
#include "model_runner.h"

#include <algorithm>
#include <climits>
#include <map>

#include <unistd.h>

#include "gqattn/error.h"
#include "step_attention.h"

namespace gqattn::engine {

namespace {

// Decode batches are padded up to one of these sizes, so a few graphs serve every batch size.
constexpr int kSmallBuckets[] = {1, 2, 4, 8};
constexpr int kBucketStep = 8;

constexpr double kGiB = double(int64_t(1) << 30);

// The host's physical memory: what the CPU path's explicit sizes (--kv-pool-gib, the step buffers
// that --max-num-batched-tokens and --max-num-seqs size) are checked against, so that a size
// past it fails naming its flag, not as the allocator's bare "cannot allocate".
int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 && pages <= INT64_MAX / page ? int64_t(pages) * page : INT64_MAX;
}

}  // namespace

struct ModelRunner::Layer {
  TensorView input_norm, wqkv, wo, post_norm, wgate_up, wdown;
  LayerCache cache;
};

// Activations of up to max_tokens_ tokens and the int32 metadata regions of one step.
struct ModelRunner::Buffers {
  TensorView residual, normed, qkv, attn, delta, gate_up, mlp;  // [max_tokens, ...]
  TensorView last_hidden, logits, tokens_out;                    // [max_batch, ...]
  // int32 regions: sized by capacity, uploaded up to the step's length.
  TensorView token_ids, positions, batch_indices, sample_rows, kv_page_indptr, kv_last_page_len,
      prefill_qo_indptr, prefill_kv_page_indptr, kv_page_indices;
};

ForwardBatch make_forward_batch(const ScheduledBatch& batch, int page_size, bool one_ahead) {
  GQ_CHECK(!one_ahead || batch.prefills.empty(), "forward batch: only decodes can be formed a step ahead");
  ForwardBatch f;
  f.qo_indptr = {0};
  f.kv_page_indptr = {0};
  const auto add = [&](const Sequence* seq, int64_t start, int64_t len, bool sample) {
    for (int64_t t = start; t < start + len; ++t) {
      // A step ahead, the token is the one the step before samples (0 here: see forward()).
      f.token_ids.push_back(one_ahead ? 0 : seq->tokens[size_t(t)]);
      f.positions.push_back(int32_t(t));
    }
    f.qo_indptr.push_back(int32_t(f.token_ids.size()));
    const int64_t kv_len = start + len;
    const int64_t pages = (kv_len + page_size - 1) / page_size;
    GQ_CHECK(pages <= int64_t(seq->pages.size()), "forward batch: request ", seq->id, " holds ", seq->pages.size(),
             " pages but ", kv_len, " tokens need ", pages);
    f.kv_page_indices.insert(f.kv_page_indices.end(), seq->pages.begin(), seq->pages.begin() + pages);
    f.kv_page_indptr.push_back(int32_t(f.kv_page_indices.size()));
    f.kv_len.push_back(int32_t(kv_len));
    if (sample) f.sample_rows.push_back(int32_t(f.token_ids.size()) - 1);
  };
  for (const Sequence* seq : batch.decodes) add(seq, seq->num_computed + (one_ahead ? 1 : 0), 1, true);
  f.num_decode = int(batch.decodes.size());
  for (const PrefillChunk& c : batch.prefills) add(c.seq, c.start, c.len, c.start + c.len == c.seq->num_tokens());
  return f;
}

ModelRunner::ModelRunner(std::unique_ptr<Compute> compute, const RunnerConfig& config)
    : config_(config), compute_(std::move(compute)) {
  const ModelConfig& m = config_.model;
  validate(m);
  GQ_CHECK(config_.page_size >= 1, "--page-size: must be >= 1, got ", config_.page_size);
  GQ_CHECK(config_.max_num_seqs >= 1, "--max-num-seqs: must be >= 1, got ", config_.max_num_seqs);
  GQ_CHECK(config_.max_num_batched_tokens >= config_.max_num_seqs, "--max-num-batched-tokens (",
           config_.max_num_batched_tokens, ") must be >= max_num_seqs (", config_.max_num_seqs, ")");
  GQ_CHECK(config_.kv_pool_gib >= 0, "--kv-pool-gib: must be > 0, got ", config_.kv_pool_gib);
  GQ_CHECK(config_.max_model_len <= m.max_position, "max_model_len (", config_.max_model_len,
           " tokens per request, prompt + generated) exceeds max_position (", m.max_position, ") of ", m.name);
  max_model_len_ = config_.max_model_len > 0 ? int(config_.max_model_len) : m.max_position;

  const bool graphs = config_.cuda_graph && compute_->supports_graphs();
  if (graphs) {
    for (int b : kSmallBuckets) buckets_.push_back(b);
    while (buckets_.back() < config_.max_num_seqs) buckets_.push_back(buckets_.back() + kBucketStep);
  }
  max_batch_ = graphs ? std::max(buckets_.back(), config_.max_num_seqs) : config_.max_num_seqs;
  max_tokens_ = std::max(config_.max_num_batched_tokens, max_batch_);
  max_step_pages_ = int64_t(max_batch_) * ((int64_t(max_model_len_) + config_.page_size - 1) / config_.page_size);
  GQ_CHECK(max_step_pages_ <= INT32_MAX, "max_num_seqs x max_model_len: too many pages per step");

  allocate_weights();
  materialize_weights();
  allocate_buffers();
  AttentionContext ctx;
  ctx.compute = compute_.get();
  ctx.num_qo_heads = m.num_qo_heads;
  ctx.num_kv_heads = m.num_kv_heads;
  ctx.head_dim = m.head_dim;
  ctx.page_size = config_.page_size;
  ctx.max_step_pages = max_step_pages_;
  attention_ = make_attention_backend(config_.attention, ctx);
  allocate_pool();
  probe_step_plans();
  compute_->synchronize();
}

void ModelRunner::probe_step_plans() {
  // The largest steps this configuration lets the scheduler make, planned once here: where one
  // passes a limit of the attention plans (the GPU's work items a plan, requests a plan, packed
  // rows), the engine fails at start-up naming the setting, not in the middle of a run. A request
  // of a step writes its new tokens to a page of its own (prefix caching shares full pages only,
  // and never the page of a prompt's last token), so a step holds at most num_pages requests and
  // num_pages x page_size new tokens: a pool smaller than --max-num-seqs caps the steps.
  const int page_size = config_.page_size;
  const int32_t pages = int32_t((int64_t(max_model_len_) + page_size - 1) / page_size);
  const int32_t last_len = int32_t(max_model_len_ - int64_t(pages - 1) * page_size);
  // `decodes` requests of one new token and `prefill_lens` chunks, every request at max_model_len
  // keys (a chunk ends its request's keys, as the last chunk of a prompt does).
  const auto probe = [&](int decodes, const std::vector<int>& prefill_lens, bool graph, const char* step) {
    AttentionMetadata m;
    m.num_decode = decodes;
    m.num_prefill = int(prefill_lens.size());
    m.cuda_graph = graph;
    m.kv_page_indptr.push_back(0);
    m.prefill_qo_indptr.push_back(0);
    m.prefill_kv_page_indptr.push_back(0);
    for (int r = 0; r < m.batch(); ++r) {
      m.kv_page_indptr.push_back(m.kv_page_indptr.back() + pages);
      m.kv_last_page_len.push_back(last_len);
      if (r < decodes) continue;
      m.prefill_qo_indptr.push_back(m.prefill_qo_indptr.back() + prefill_lens[size_t(r - decodes)]);
      m.prefill_kv_page_indptr.push_back(m.prefill_kv_page_indptr.back() + pages);
    }
    m.num_tokens = decodes + m.prefill_qo_indptr.back();
    try {
      attention_->plan(m);
    } catch (const Error& e) {
      throw Error(detail::concat("the ", config_.attention, " attention backend cannot plan this configuration's largest ", step,
              " (--max-num-seqs ", config_.max_num_seqs, ", --max-num-batched-tokens ", config_.max_num_batched_tokens,
              ", max_model_len ", max_model_len_, ", ", num_pages_, " pages of ", page_size, " tokens): ", e.what()));
    }
  };
  const int requests = std::min(config_.max_num_seqs, num_pages_);
  // Decode steps are padded up to a graph bucket (padding requests own no page).
  const bool graphs = !buckets_.empty();
  probe(graphs ? graph_bucket(requests) : requests, {}, graphs, "decode step");
  // Prefill: the most requests in chunks of one length (short chunks: an item each a K/V head at
  // least); the most requests with the tokens in as few chunks as they fill (one-token chunks and
  // long ones: the most row tiles, up to twice the first's where the long chunks take the prefill
  // kernel's 128-row tiles); the longest chunk.
  // The scheduler's token budget (max_tokens_ may be a larger graph bucket: decode-only steps).
  const int64_t tokens = std::min<int64_t>(config_.max_num_batched_tokens, int64_t(num_pages_) * page_size);
  const int prefills = int(std::min<int64_t>(requests, tokens));
  const int chunk = int(std::min<int64_t>(max_model_len_, tokens / prefills));
  probe(0, std::vector<int>(size_t(prefills), chunk), false, "prefill step");
  std::vector<int> mixed(static_cast<size_t>(prefills));
  int64_t budget = tokens;
  for (int r = 0; r < prefills; ++r) {  // leaves a token for each chunk after this one
    mixed[size_t(r)] = int(std::min<int64_t>(max_model_len_, budget - (prefills - 1 - r)));
    budget -= mixed[size_t(r)];
  }
  probe(0, mixed, false, "prefill step");
  probe(0, {int(std::min<int64_t>(max_model_len_, tokens))}, false, "prefill chunk");
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::allocate_weights() {
  const ModelConfig& m = config_.model;
  Compute& c = *compute_;
  const auto tensor = [&](std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    memory_.push_back(c.alloc(size_t(n) * 2));
    return view_of(memory_.back().data(), shape, DType::kBF16, c);
  };
  const int64_t h = m.hidden_size, f = m.intermediate_size;
  embed_ = tensor({m.vocab_size, h});
  for (int l = 0; l < m.num_layers; ++l) {
    auto layer = std::make_unique<Layer>();
    layer->input_norm = tensor({h});
    layer->wqkv = tensor({m.qkv_size(), h});
    layer->wo = tensor({h, m.q_size()});
    layer->post_norm = tensor({h});
    layer->wgate_up = tensor({2 * f, h});
    layer->wdown = tensor({h, f});
    layers_.push_back(std::move(layer));
  }
  final_norm_ = tensor({h});
  lm_head_ = tensor({m.vocab_size, h});
  weight_bytes_ = m.streamed_weight_bytes(2);
}

void ModelRunner::materialize_weights() {
  const ModelConfig& m = config_.model;
  // Where each Hugging Face tensor lives: q/k/v are row blocks of the fused QKV weight, gate/up
  // of the fused gate-up weight.
  std::map<std::string, TensorView> target;
  target["model.embed_tokens.weight"] = embed_;
  for (int l = 0; l < m.num_layers; ++l) {
    const Layer& L = *layers_[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t q = m.q_size(), kv = m.kv_size(), f = m.intermediate_size;
    target[p + "input_layernorm.weight"] = L.input_norm;
    target[p + "self_attn.q_proj.weight"] = slice_rows(L.wqkv, 0, q);
    target[p + "self_attn.k_proj.weight"] = slice_rows(L.wqkv, q, q + kv);
    target[p + "self_attn.v_proj.weight"] = slice_rows(L.wqkv, q + kv, q + 2 * kv);
    target[p + "self_attn.o_proj.weight"] = L.wo;
    target[p + "post_attention_layernorm.weight"] = L.post_norm;
    target[p + "mlp.gate_proj.weight"] = slice_rows(L.wgate_up, 0, f);
    target[p + "mlp.up_proj.weight"] = slice_rows(L.wgate_up, f, 2 * f);
    target[p + "mlp.down_proj.weight"] = L.wdown;
  }
  target["model.norm.weight"] = final_norm_;
  target["lm_head.weight"] = lm_head_;

  const std::vector<WeightSpec> specs = weight_specs(m);
  HostWeights host;
  if (!config_.weights.random()) host = load_weights(m, config_.weights.path);
  for (size_t id = 0; id < specs.size(); ++id) {
    const WeightSpec& s = specs[id];
    const TensorView& t = target.at(s.name);
    GQ_CHECK(t.numel() == s.numel(), "model runner: '", s.name, "' placement holds ", t.numel(), " values, expected ",
             s.numel());
    if (!config_.weights.random()) {
      compute_->upload(t.data, host.at(s.name).data(), size_t(s.numel()) * 2);
    } else if (s.init_std == 0.f) {
      compute_->fill(t, 1.f);
    } else {
      compute_->fill_random(t, config_.weights.seed, id, s.half_width());
    }
  }
  compute_->synchronize();  // the host copies may go now
}

void ModelRunner::allocate_buffers() {
  const ModelConfig& m = config_.model;
  Compute& c = *compute_;
  const DType act = c.act_dtype();
  const int64_t t = max_tokens_, s = max_batch_, h = m.hidden_size, f = m.intermediate_size;
  auto buf = std::make_unique<Buffers>();
  // Every step buffer once: [rows, cols], or [rows] where cols is 0.
  struct Spec {
    TensorView* view;
    int64_t rows, cols;
    DType dtype;
  };
  constexpr DType kI32 = DType::kInt32;
  const Spec specs[] = {
      {&buf->residual, t, h, DType::kFP32}, {&buf->normed, t, h, act},
      {&buf->qkv, t, m.qkv_size(), act},    {&buf->attn, t, m.q_size(), act},
      {&buf->delta, t, h, act},             {&buf->gate_up, t, 2 * f, act},
      {&buf->mlp, t, f, act},               {&buf->last_hidden, s, h, act},
      {&buf->logits, s, m.vocab_size, DType::kFP32},
      {&buf->tokens_out, s, 0, kI32},       {&buf->token_ids, t, 0, kI32},
      {&buf->positions, t, 0, kI32},        {&buf->batch_indices, t, 0, kI32},
      {&buf->sample_rows, s, 0, kI32},      {&buf->kv_page_indptr, s + 1, 0, kI32},
      {&buf->kv_last_page_len, s, 0, kI32}, {&buf->prefill_qo_indptr, s + 1, 0, kI32},
      {&buf->prefill_kv_page_indptr, s + 1, 0, kI32},
      {&buf->kv_page_indices, max_step_pages_, 0, kI32},
  };
  if (c.device() == Device::kCPU) {
    double bytes = 0;
    for (const Spec& b : specs) bytes += double(b.rows) * double(std::max<int64_t>(b.cols, 1)) * double(dtype_size(b.dtype));
    const int64_t host = host_memory_bytes();
    GQ_CHECK(bytes <= double(host), "--max-num-batched-tokens (", config_.max_num_batched_tokens,
             ") / --max-num-seqs (", config_.max_num_seqs, "): the step's buffers need ", bytes / kGiB,
             " GiB, more than the host's ", double(host) / kGiB, " GiB of memory");
  }
  const auto tensor = [&](std::initializer_list<int64_t> shape, DType dtype) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    memory_.push_back(c.alloc(size_t(n) * dtype_size(dtype)));
    return view_of(memory_.back().data(), shape, dtype, c);
  };
  for (const Spec& b : specs) *b.view = b.cols > 0 ? tensor({b.rows, b.cols}, b.dtype) : tensor({b.rows}, b.dtype);

  const std::vector<double> inv_freq = rope_inv_freq(m);
  std::vector<float> inv_freq_f(inv_freq.begin(), inv_freq.end());
  inv_freq_ = tensor({int64_t(inv_freq_f.size())}, DType::kFP32);
  c.upload(inv_freq_.data, inv_freq_f.data(), inv_freq_f.size() * sizeof(float));
  c.synchronize();
  buf_ = std::move(buf);
}

void ModelRunner::allocate_pool() {
  const ModelConfig& m = config_.model;
  Compute& c = *compute_;
  const DType act = c.act_dtype();
  const int64_t page_elems = int64_t(config_.page_size) * m.num_kv_heads * m.head_dim;
  page_bytes_ = 2 * int64_t(m.num_layers) * page_elems * int64_t(dtype_size(act));
  int64_t pages = 0;
  const bool cuda = c.device() == Device::kCUDA;
  const int64_t free = cuda ? int64_t(c.free_bytes()) : host_memory_bytes();
  const int64_t usable = cuda ? free - kCudaMemoryMarginBytes : free;
  if (config_.num_pages > 0) {
    // Page ids are int32 (the attention API's page tables); the sizes below are capped there.
    GQ_CHECK(config_.num_pages <= INT32_MAX, "num_pages: ", config_.num_pages,
             " pages are more than int32 page ids can name (", INT32_MAX, ")");
    pages = config_.num_pages;
  } else if (config_.kv_pool_gib > 0) {
    // Checked as a double first: converting a value past INT64_MAX to int64_t is undefined.
    GQ_CHECK(config_.kv_pool_gib * kGiB < 0x1p62, "--kv-pool-gib: ", config_.kv_pool_gib,
             " GiB is more than any pool can hold");
    const int64_t bytes = int64_t(config_.kv_pool_gib * kGiB);
    GQ_CHECK(bytes <= usable, "--kv-pool-gib: ", config_.kv_pool_gib,
             !cuda ? detail::concat(" GiB is more than the host's ", double(usable) / kGiB, " GiB of memory")
                   : detail::concat(" GiB does not fit: ", double(free) / kGiB,
                                    " GiB of device memory are free after the weights (", double(weight_bytes_) / kGiB,
                                    " GiB) and buffers, of which ", double(kCudaMemoryMarginBytes) / kGiB,
                                    " GiB stay free for the runtime; at most ", std::max(0.0, double(usable) / kGiB),
                                    " GiB"));
    pages = bytes / page_bytes_;
  } else {
    // Room for every request at its longest at once, within what the device leaves.
    const int64_t wanted =
        int64_t(config_.max_num_seqs) * ((int64_t(max_model_len_) + config_.page_size - 1) / config_.page_size);
    pages = std::min(wanted, (cuda ? usable : kDefaultCpuPoolBytes) / page_bytes_);
  }
  pages = std::min<int64_t>(pages, INT32_MAX);
  // Without a pool size the page size is what was asked for (generate has no --kv-pool-gib).
  GQ_CHECK(pages >= 1, config_.kv_pool_gib > 0 ? "--kv-pool-gib" : "--page-size",
           ": the K/V pool holds no page (one page of ", config_.page_size, " tokens is ", page_bytes_,
           " bytes over ", m.num_layers, " layers",
           cuda ? detail::concat("; ", double(free) / kGiB, " GiB free") : "", ")");
  GQ_CHECK(pages * page_bytes_ <= usable, "--kv-pool-gib: ", pages, " pages (", double(pages * page_bytes_) / kGiB,
           " GiB) do not fit in ", double(std::max<int64_t>(usable, 0)) / kGiB,
           cuda ? " GiB of free device memory" : " GiB of host memory");
  num_pages_ = int(pages);
  memory_.push_back(c.alloc(size_t(pages * page_bytes_)));
  char* base = static_cast<char*>(memory_.back().data());
  const int64_t pool_bytes = pages * page_elems * int64_t(dtype_size(act));
  // [pages, page_size, heads, head_dim] (NHD) or [pages, heads, page_size, head_dim] (HND).
  const bool hnd = config_.kv_layout == KVLayout::kHND;
  const int64_t dim1 = hnd ? m.num_kv_heads : config_.page_size, dim2 = hnd ? config_.page_size : m.num_kv_heads;
  for (int l = 0; l < m.num_layers; ++l) {
    Layer& L = *layers_[size_t(l)];
    const auto pool = [&](int64_t index) {
      return view_of(base + index * pool_bytes, {pages, dim1, dim2, m.head_dim}, act, c);
    };
    L.cache.k_pages = pool(2 * l);
    L.cache.v_pages = pool(2 * l + 1);
    L.cache.layout = config_.kv_layout;
  }
}

int ModelRunner::graph_bucket(int batch) const {
  for (int b : buckets_)
    if (b >= batch) return b;
  return -1;
}

AttentionMetadata ModelRunner::upload_metadata(const ForwardBatch& b, bool cuda_graph) {
  const int batch = b.batch(), n = b.num_tokens(), nd = b.num_decode;
  const int64_t pages = int64_t(b.kv_page_indices.size());
  GQ_CHECK(batch >= 1 && n >= 1, "forward: empty batch");
  GQ_CHECK(n <= max_tokens_, "forward: ", n, " tokens exceed the step capacity (", max_tokens_, ")");
  GQ_CHECK(batch <= max_batch_, "forward: ", batch, " requests exceed max_num_seqs (", max_batch_, ")");
  GQ_CHECK(pages <= max_step_pages_, "forward: ", pages, " pages exceed the step capacity (", max_step_pages_, ")");
  GQ_CHECK(int64_t(b.sample_rows.size()) <= max_batch_, "forward: too many sample rows");
  GQ_CHECK(int(b.positions.size()) == n && int(b.kv_len.size()) == batch && int(b.kv_page_indptr.size()) == batch + 1 &&
               b.qo_indptr.back() == n && b.kv_page_indptr.back() == pages && nd >= 0 && nd <= batch,
           "forward: inconsistent batch");
  for (int32_t row : b.sample_rows) GQ_CHECK(row >= 0 && row < n, "forward: sample row ", row, " outside [0, ", n, ")");

  AttentionMetadata m;
  m.num_decode = nd;
  m.num_prefill = batch - nd;
  m.num_tokens = n;
  m.cuda_graph = cuda_graph;
  m.kv_page_indptr = b.kv_page_indptr;
  m.kv_page_indices = b.kv_page_indices;
  std::vector<int32_t> batch_indices(static_cast<size_t>(n));
  for (int r = 0; r < batch; ++r) {
    const int32_t qo_len = b.qo_indptr[r + 1] - b.qo_indptr[r];
    GQ_CHECK(r >= nd || qo_len == 1, "forward: decode request ", r, " has ", qo_len, " tokens");
    const int32_t page_count = b.kv_page_indptr[r + 1] - b.kv_page_indptr[r];
    const int32_t kv_len = b.kv_len[r];
    GQ_CHECK(page_count == (kv_len + config_.page_size - 1) / config_.page_size && qo_len <= std::max(kv_len, 1),
             "forward: request ", r, " lists ", page_count, " pages for ", kv_len, " keys and ", qo_len, " new tokens");
    m.kv_last_page_len.push_back(page_count == 0 ? 0 : kv_len - (page_count - 1) * config_.page_size);
    std::fill(batch_indices.begin() + b.qo_indptr[r], batch_indices.begin() + b.qo_indptr[r + 1], r);
  }
  for (int r = nd; r <= batch; ++r) {
    m.prefill_qo_indptr.push_back(b.qo_indptr[r] - b.qo_indptr[nd]);
    m.prefill_kv_page_indptr.push_back(b.kv_page_indptr[r] - b.kv_page_indptr[nd]);
  }

  Compute& c = *compute_;
  Buffers& B = *buf_;
  const auto put = [&c](const TensorView& dst, const std::vector<int32_t>& src) {
    c.upload(dst.data, src.data(), src.size() * sizeof(int32_t));
    return slice_rows(dst, 0, int64_t(src.size()));
  };
  put(B.token_ids, b.token_ids);
  m.positions_d = put(B.positions, b.positions);
  m.batch_indices_d = put(B.batch_indices, batch_indices);
  put(B.sample_rows, b.sample_rows);
  m.kv_page_indptr_d = put(B.kv_page_indptr, m.kv_page_indptr);
  m.kv_last_page_len_d = put(B.kv_last_page_len, m.kv_last_page_len);
  m.prefill_qo_indptr_d = put(B.prefill_qo_indptr, m.prefill_qo_indptr);
  m.prefill_kv_page_indptr_d = put(B.prefill_kv_page_indptr, m.prefill_kv_page_indptr);
  put(B.kv_page_indices, m.kv_page_indices);
  // The whole region: plans are checked against it, and a graph replays with other page counts.
  m.kv_page_indices_d = B.kv_page_indices;
  return m;
}

void ModelRunner::run_model(const AttentionMetadata& meta, int num_samples) {
  const ModelConfig& m = config_.model;
  Compute& c = *compute_;
  const Buffers& B = *buf_;
  const int n = meta.num_tokens;
  const float eps = float(m.rms_norm_eps);
  const TensorView residual = slice_rows(B.residual, 0, n), normed = slice_rows(B.normed, 0, n),
                   qkv = slice_rows(B.qkv, 0, n), attn = slice_rows(B.attn, 0, n), delta = slice_rows(B.delta, 0, n),
                   gate_up = slice_rows(B.gate_up, 0, n), mlp = slice_rows(B.mlp, 0, n);
  const TensorView q = head_view(qkv, 0, m.num_qo_heads, m.head_dim);
  const TensorView k = head_view(qkv, m.q_size(), m.num_kv_heads, m.head_dim);
  const TensorView v = head_view(qkv, m.q_size() + m.kv_size(), m.num_kv_heads, m.head_dim);
  const TensorView o = head_view(attn, 0, m.num_qo_heads, m.head_dim);

  c.embed(slice_rows(B.token_ids, 0, n), embed_, residual);
  TensorView pending;  // the last block's output, not yet added to the residual stream
  for (const auto& layer : layers_) {
    const Layer& L = *layer;
    c.add_rmsnorm(residual, pending, L.input_norm, eps, normed);
    c.gemm(normed, L.wqkv, qkv);
    c.rope_store_kv(q, k, meta.positions_d, inv_freq_, Compute::KVStore{step_kv(L.cache, meta), v, meta.batch_indices_d});
    attention_->forward(L.cache, q, o, meta);
    c.gemm(attn, L.wo, delta);
    c.add_rmsnorm(residual, delta, L.post_norm, eps, normed);
    c.gemm(normed, L.wgate_up, gate_up);
    c.swiglu(gate_up, mlp);
    c.gemm(mlp, L.wdown, delta);
    pending = delta;
  }
  c.add_rmsnorm(residual, pending, final_norm_, eps, normed);
  const TensorView last = slice_rows(B.last_hidden, 0, num_samples);
  const TensorView logits = slice_rows(B.logits, 0, num_samples);
  c.gather_rows(normed, slice_rows(B.sample_rows, 0, num_samples), last);
  c.gemm(last, lm_head_, logits);
  c.argmax(logits, slice_rows(B.tokens_out, 0, num_samples));
}

void ModelRunner::forward(const ForwardBatch& batch, bool tokens_from_last) {
  GQ_CHECK(!tokens_from_last || (batch.num_decode == batch.batch() && batch.num_decode == last_num_samples_),
           "forward: tokens from the last step need a decode-only batch of its ", last_num_samples_,
           " sampled requests, got ", batch.num_decode, " decodes of ", batch.batch(), " requests");
  // After the metadata's upload (which wrote placeholders there): the decodes' token ids.
  const auto take_last_tokens = [&] {
    if (tokens_from_last)
      compute_->copy(buf_->token_ids.data, buf_->tokens_out.data, size_t(batch.num_decode) * sizeof(int32_t));
  };
  const int bucket = batch.num_decode == batch.batch() ? graph_bucket(batch.batch()) : -1;
  if (bucket < 0) {
    const AttentionMetadata meta = upload_metadata(batch, false);
    take_last_tokens();
    attention_->plan(meta);
    run_model(meta, int(batch.sample_rows.size()));
  } else {
    // Pad to the bucket with requests that own no page: their K/V writes are skipped and their
    // attention sees no key.
    ForwardBatch padded = batch;
    for (int r = batch.batch(); r < bucket; ++r) {
      padded.token_ids.push_back(0);
      padded.positions.push_back(0);
      padded.qo_indptr.push_back(padded.qo_indptr.back() + 1);
      padded.kv_len.push_back(0);
      padded.kv_page_indptr.push_back(padded.kv_page_indptr.back());
      padded.sample_rows.push_back(padded.num_tokens() - 1);
    }
    padded.num_decode = bucket;
    const AttentionMetadata meta = upload_metadata(padded, true);
    take_last_tokens();
    attention_->plan(meta);
    const int key = bucket * AttentionBackend::kGraphVariants + attention_->graph_variant();
    compute_->run_graph(key, [&] { run_model(meta, bucket); });
  }
  last_num_samples_ = int(batch.sample_rows.size());
}

void ModelRunner::warm_up() {
  // The GEMM tuner's wider search for the shapes tuned here (not for those first met in a run).
  struct Search {
    Compute& c;
    explicit Search(Compute& compute) : c(compute) { c.set_gemm_search(true); }
    ~Search() { c.set_gemm_search(false); }
  } search(*compute_);
  {  // A prefill of one request over the first pages: the prefill kernels' and cuBLASLt's first use.
    const int n = std::min({config_.max_num_batched_tokens, max_model_len_, num_pages_ * config_.page_size});
    const int pages = (n + config_.page_size - 1) / config_.page_size;
    ForwardBatch f;
    f.qo_indptr = {0, n};
    f.kv_len = {n};
    f.kv_page_indptr = {0, pages};
    for (int i = 0; i < pages; ++i) f.kv_page_indices.push_back(i);
    for (int i = 0; i < n; ++i) {
      f.token_ids.push_back(0);
      f.positions.push_back(i);
    }
    f.sample_rows = {n - 1};
    forward(f);
  }
  // Only the decode batches the scheduler can form: a request decodes into a page of its own, so
  // at most num_pages requests (as probe_step_plans checks). A larger bucket would never replay,
  // and its plan may pass limits the probe did not check (the warm-up would throw).
  const int requests = std::min(config_.max_num_seqs, num_pages_);
  std::vector<int> sizes;
  for (int b : buckets_)
    if (b <= graph_bucket(requests)) sizes.push_back(b);
  if (buckets_.empty()) sizes.push_back(requests);
  for (int b : sizes) {
    // kv_len 1, not 0: the plan (and so the graph's grid) has a work item a request and K/V head
    // as real steps do (perf-notes item 171's grid).
    ForwardBatch f;
    f.num_decode = b;
    f.qo_indptr.push_back(0);
    f.kv_page_indptr.push_back(0);
    for (int r = 0; r < b; ++r) {
      f.token_ids.push_back(0);
      f.positions.push_back(0);
      f.qo_indptr.push_back(r + 1);
      f.kv_len.push_back(1);
      f.kv_page_indptr.push_back(r + 1);
      f.kv_page_indices.push_back(0);
      f.sample_rows.push_back(r);
    }
    forward(f);  // a graph bucket's first step runs eagerly and is captured
    if (!buckets_.empty()) forward(f);  // and its first replay uploads the graph
  }
  compute_->synchronize();
}

std::vector<float> ModelRunner::logits() {
  std::vector<float> out(size_t(last_num_samples_) * config_.model.vocab_size);
  compute_->download(out.data(), buf_->logits.data, out.size() * sizeof(float));
  return out;
}

int ModelRunner::start_greedy_tokens() {
  const int ticket = next_ticket_;
  next_ticket_ = (next_ticket_ + 1) % Compute::kDownloadSlots;
  ticket_samples_[ticket] = last_num_samples_;
  compute_->download_start(ticket, buf_->tokens_out.data, size_t(last_num_samples_) * sizeof(int32_t));
  return ticket;
}

std::vector<int32_t> ModelRunner::greedy_tokens(int ticket) {
  GQ_CHECK(ticket >= 0 && ticket < Compute::kDownloadSlots, "greedy_tokens: no ticket ", ticket);
  std::vector<int32_t> out(static_cast<size_t>(ticket_samples_[ticket]));
  compute_->download_finish(ticket, out.data(), out.size() * sizeof(int32_t));
  return out;
}

}  // namespace gqattn::engine
