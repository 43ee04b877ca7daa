// The continuous-batching scheduler: forms each step's batch from running and waiting requests,
// with chunked prefill, FIFO admission and preemption by recompute. Layer: engine (host-only).
// Modelled on nano-vllm's scheduler.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "block_manager.h"
#include "sequence.h"

namespace gqattn::engine {

struct SchedulerConfig {
  int max_num_seqs = 256;              // running requests at most
  int max_num_batched_tokens = 8192;   // tokens per step (decodes + prefill chunks)
  bool enable_prefix_caching = false;  // share cached full pages of identical prefixes
};

// Tokens [start, start + len) of `seq` computed in this step.
struct PrefillChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;
  int64_t len = 0;
};

struct ScheduledBatch {
  std::vector<Sequence*> decodes;        // one token each: the last one
  std::vector<PrefillChunk> prefills;
  std::vector<Sequence*> preempted;      // preempted while forming this batch (for stats and tests)

  bool empty() const { return decodes.empty() && prefills.empty(); }
  int64_t num_tokens() const;
  // The requests that sample a token after this step, in batch order: every decode, then every
  // chunk that reaches the end of its request's tokens.
  std::vector<Sequence*> sampling_sequences() const;
};

// Each step: decodes first (one token each, oldest request first), then the next chunks of
// running prefills, then new requests admitted in arrival order while the token budget,
// max_num_seqs and the page pool allow. When a running request needs a page and none is free, the
// newest running request is preempted: its pages are freed and it waits (at its arrival place) to
// be recomputed, its generated tokens kept.
class Scheduler {
 public:
  // Throws gqattn::Error for max_num_seqs < 1 or a token budget below max_num_seqs.
  Scheduler(const SchedulerConfig& config, BlockManager& block_manager);

  // Queues a new request (status waiting) behind every request that arrived before it.
  void add(Sequence* seq);
  ScheduledBatch schedule();
  // The batch schedule() will form after `current` (a step queued but not yet postprocessed),
  // formed now so that the engine can queue it before current's tokens are known; empty when that
  // batch depends on them or on anything else not yet known. Non-empty only when current is
  // decode-only with every running request, no request waits, every request samples greedily
  // (its token then comes from the device), none can finish at current's token (length or EOS),
  // and the pool holds the pages every request needs for one more token, which are taken now.
  // The batch equals schedule()'s: same decodes, same order, no preemption, no admission.
  ScheduledBatch schedule_ahead(const ScheduledBatch& current);
  // Records a step's outcome: advances num_computed, appends the sampled tokens (one per
  // batch.sampling_sequences() entry), finishes requests that reached their length or EOS and
  // frees their pages. Returns the requests finished in this step.
  std::vector<Sequence*> postprocess(const ScheduledBatch& batch, const std::vector<int32_t>& sampled);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  // Makes room for `seq` to hold `tokens` tokens, preempting the newest running requests as
  // needed. False when `seq` itself had to be preempted.
  bool make_room(Sequence* seq, int64_t tokens, ScheduledBatch& batch, int64_t& budget);
  void preempt(Sequence* victim, ScheduledBatch& batch, int64_t& budget);
  void enqueue_waiting(Sequence* seq);

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;    // by arrival (id)
  std::vector<Sequence*> running_;   // by admission, oldest first
  int64_t num_preemptions_ = 0;
};

}  // namespace gqattn::engine
