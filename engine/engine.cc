// The engine loop: schedule, forward, sample, record. Layer: engine (host-only).
#include "engine.h"

#include <chrono>

#include "api/env_flag.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "sampler.h"

namespace gqattn::engine {

std::unique_ptr<Compute> make_compute(const std::string& device) {
  if (device == "cpu") return make_cpu_compute();
  if (device == "cuda") return make_cuda_compute(0);
  GQ_CHECK(device == "auto", "--device: expected auto, cpu or cuda, got '", device, "'");
  return cuda_device_count() > 0 ? make_cuda_compute(0) : make_cpu_compute();
}

Engine::Engine(const EngineConfig& config)
    : Engine(std::make_unique<ModelRunner>(make_compute(config.device), config.runner), config.enable_prefix_caching,
             config.overlap_steps) {}

Engine::Engine(std::unique_ptr<ModelRunner> runner, bool enable_prefix_caching, bool overlap_steps)
    : runner_(std::move(runner)), overlap_steps_(overlap_steps) {
  blocks_ = std::make_unique<BlockManager>(runner_->num_pages(), runner_->page_size());
  SchedulerConfig sc;
  sc.max_num_seqs = runner_->config().max_num_seqs;
  sc.max_num_batched_tokens = runner_->config().max_num_batched_tokens;
  sc.enable_prefix_caching = enable_prefix_caching;
  scheduler_ = std::make_unique<Scheduler>(sc, *blocks_);
  // On the GPU, before any request (GQATTN_DISABLE_ENGINE_WARMUP=1: in the first steps instead).
  if (runner_->compute().supports_graphs() && !env_flag("GQATTN_DISABLE_ENGINE_WARMUP")) runner_->warm_up();
}

int64_t Engine::add_request(const std::vector<int32_t>& prompt, const SamplingParams& params) {
  const ModelConfig& m = runner_->model();
  GQ_CHECK(!prompt.empty(), "request: empty prompt");
  for (size_t i = 0; i < prompt.size(); ++i)
    GQ_CHECK(prompt[i] >= 0 && prompt[i] < m.vocab_size, "request: prompt token ", i, " (", prompt[i],
             ") is outside the vocabulary [0, ", m.vocab_size, ")");
  GQ_CHECK(params.max_new_tokens >= 1, "request: max_new_tokens (", params.max_new_tokens, ") must be >= 1");
  validate(params);
  const int64_t total = int64_t(prompt.size()) + params.max_new_tokens;
  GQ_CHECK(total <= runner_->max_model_len(), "request: ", prompt.size(), " prompt + ", params.max_new_tokens,
           " new tokens exceed max_model_len (", runner_->max_model_len(), ")");
  // The last generated token is never fed back, so its K/V are never stored.
  const int pages = blocks_->pages_for(total - 1);
  GQ_CHECK(pages <= blocks_->num_pages(), "--kv-pool-gib: the K/V pool (", blocks_->num_pages(), " pages of ",
           blocks_->page_size(), " tokens) cannot hold one request of ", total, " tokens (", pages, " pages)");
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->tokens = prompt;
  seq->num_prompt_tokens = int(prompt.size());
  seq->params = params;
  scheduler_->add(seq.get());
  const int64_t id = seq->id;
  sequences_[id] = std::move(seq);
  return id;
}

Engine::Queued Engine::queue_step(const ScheduledBatch& batch, bool one_ahead) {
  Queued q;
  q.batch = batch;
  const ForwardBatch forward = make_forward_batch(batch, runner_->page_size(), one_ahead);
  for (int32_t len : forward.kv_len) q.kv_tokens += len;
  runner_->forward(forward, one_ahead);
  q.greedy = true;
  for (const Sequence* s : batch.sampling_sequences()) q.greedy = q.greedy && s->params.greedy();
  // Started before anything else is queued: the next forward overwrites the tokens.
  if (q.greedy) q.ticket = runner_->start_greedy_tokens();
  return q;
}

StepStats Engine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepStats stats;
  Queued current;
  if (next_) {
    current = std::move(*next_);
    next_.reset();
  } else {
    const ScheduledBatch batch = scheduler_->schedule();
    stats.num_preempted = int(batch.preempted.size());
    if (batch.empty()) {
      GQ_CHECK(!scheduler_->has_unfinished(), "engine: requests are waiting but none can be scheduled");
      return stats;
    }
    current = queue_step(batch, false);
  }
  // The next step, queued behind this one while the GPU runs it, when it is already known.
  if (overlap_steps_) {
    const ScheduledBatch ahead = scheduler_->schedule_ahead(current.batch);
    if (!ahead.empty()) {
      next_ = std::make_unique<Queued>(queue_step(ahead, true));
      stats.queued_next = true;
    }
  }
  const auto t_launched = std::chrono::steady_clock::now();

  const ScheduledBatch& batch = current.batch;
  const std::vector<Sequence*> samplers = batch.sampling_sequences();
  std::vector<int32_t> tokens;
  if (current.greedy) {
    tokens = runner_->greedy_tokens(current.ticket);
  } else {
    const std::vector<float> logits = runner_->logits();
    const int vocab = runner_->model().vocab_size;
    for (size_t i = 0; i < samplers.size(); ++i)
      tokens.push_back(sample(logits.data() + i * size_t(vocab), vocab, samplers[i]->params, samplers[i]->id,
                              samplers[i]->num_output()));
  }
  const auto t_tokens = std::chrono::steady_clock::now();
  const std::vector<Sequence*> finished = scheduler_->postprocess(batch, tokens);

  stats.num_decode = int(batch.decodes.size());
  stats.num_prefill = int(batch.prefills.size());
  for (const PrefillChunk& c : batch.prefills) stats.num_prefill_tokens += c.len;
  stats.num_sampled = int(tokens.size());
  stats.num_finished = int(finished.size());
  stats.kv_tokens = current.kv_tokens;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.launch_seconds = std::chrono::duration<double>(t_launched - t0).count();
  stats.wait_seconds = std::chrono::duration<double>(t_tokens - t_launched).count();
  return stats;
}

void Engine::run() {
  while (has_unfinished()) step();
}

std::vector<std::vector<int32_t>> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                   const SamplingParams& params) {
  std::vector<int64_t> ids;
  for (const auto& p : prompts) ids.push_back(add_request(p, params));
  run();
  std::vector<std::vector<int32_t>> out;
  for (int64_t id : ids) out.push_back(output(id));
  return out;
}

const Sequence& Engine::sequence(int64_t id) const {
  const auto it = sequences_.find(id);
  GQ_CHECK(it != sequences_.end(), "engine: no request ", id);
  return *it->second;
}

std::vector<int32_t> Engine::output(int64_t id) const {
  const Sequence& s = sequence(id);
  return std::vector<int32_t>(s.tokens.begin() + s.num_prompt_tokens, s.tokens.end());
}

}  // namespace gqattn::engine
