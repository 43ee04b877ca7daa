// The engine: requests in (token ids + sampling parameters), tokens out. Each step the scheduler
// forms a batch, the model runner runs it, the sampler picks the next tokens, and the scheduler
// records them. Layer: engine (host-only). Modelled on nano-vllm's llm_engine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "block_manager.h"
#include "model_runner.h"
#include "scheduler.h"
#include "sequence.h"

namespace gqattn::engine {

// What one step did.
struct StepStats {
  int num_decode = 0;             // requests that decoded one token
  int num_prefill = 0;            // prefill chunks
  int64_t num_prefill_tokens = 0;
  int num_sampled = 0;            // tokens generated
  int num_preempted = 0;
  int num_finished = 0;
  int64_t kv_tokens = 0;          // keys attention read, summed over the step's requests (per layer)
  double seconds = 0;             // wall time of the step (it ends with the sampled tokens on the host)
  double launch_seconds = 0;      // of which: scheduling, the batch's uploads and plans, the launches
                                  // (this step's unless the last call queued it; the next step's when
                                  // queued_next)
  double wait_seconds = 0;        // of which: waiting for the sampled tokens (the rest: host work after)
  bool queued_next = false;       // the next step was queued before this one's tokens were read
  bool decode_only() const { return num_prefill == 0 && num_decode > 0; }
};

struct EngineConfig {
  RunnerConfig runner;
  std::string device = "auto";    // auto | cpu | cuda
  bool enable_prefix_caching = false;
  // Queue step n + 1 before reading step n's tokens when the scheduler can form it already
  // (Scheduler::schedule_ahead), so the host's work for a step overlaps the GPU's.
  bool overlap_steps = true;
};

// The compute device a --device value names (auto: CUDA when a GPU is usable, else the CPU).
std::unique_ptr<Compute> make_compute(const std::string& device);

class Engine {
 public:
  explicit Engine(const EngineConfig& config);
  Engine(std::unique_ptr<ModelRunner> runner, bool enable_prefix_caching = false, bool overlap_steps = true);

  // Queues a request; returns its id (ids grow with arrival). Throws gqattn::Error for an empty
  // prompt, a token outside the vocabulary, max_new_tokens < 1, sampling parameters the sampler
  // rejects (validate), or a request longer than max_model_len or than the whole K/V pool.
  int64_t add_request(const std::vector<int32_t>& prompt, const SamplingParams& params);
  // Runs one step to its sampled tokens. With step overlap the step after it may already be
  // queued when this returns (the next call then starts there).
  StepStats step();
  bool has_unfinished() const { return scheduler_->has_unfinished(); }
  // Runs every queued request to completion.
  void run();
  // Adds the prompts, runs them all, returns each one's generated tokens in order.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const SamplingParams& params);

  const Sequence& sequence(int64_t id) const;
  std::vector<int32_t> output(int64_t id) const;
  ModelRunner& runner() { return *runner_; }
  const BlockManager& blocks() const { return *blocks_; }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  // A step whose forward pass is queued.
  struct Queued {
    ScheduledBatch batch;
    int64_t kv_tokens = 0;
    bool greedy = false;
    int ticket = -1;  // its tokens' download (greedy)
  };
  Queued queue_step(const ScheduledBatch& batch, bool one_ahead);

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::unique_ptr<Sequence>> sequences_;
  int64_t next_id_ = 0;
  bool overlap_steps_ = true;
  std::unique_ptr<Queued> next_;  // queued ahead by the last step()
};

}  // namespace gqattn::engine
