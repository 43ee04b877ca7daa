// Continuous batching: decodes, prefill chunks, FIFO admission and preemption by recompute.
// Layer: engine (host-only).
#include "scheduler.h"

#include <algorithm>

#include "gqattn/error.h"

namespace gqattn::engine {

int64_t ScheduledBatch::num_tokens() const {
  int64_t n = int64_t(decodes.size());
  for (const PrefillChunk& c : prefills) n += c.len;
  return n;
}

std::vector<Sequence*> ScheduledBatch::sampling_sequences() const {
  std::vector<Sequence*> out(decodes.begin(), decodes.end());
  for (const PrefillChunk& c : prefills)
    if (c.start + c.len == c.seq->num_tokens()) out.push_back(c.seq);
  return out;
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& block_manager)
    : config_(config), blocks_(block_manager) {
  GQ_CHECK(config.max_num_seqs >= 1, "--max-num-seqs: must be >= 1, got ", config.max_num_seqs);
  GQ_CHECK(config.max_num_batched_tokens >= config.max_num_seqs, "--max-num-batched-tokens (",
           config.max_num_batched_tokens, ") must be >= max_num_seqs (", config.max_num_seqs,
           ") so that every running request can decode in one step");
}

void Scheduler::enqueue_waiting(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  const auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                                    [](const Sequence* a, const Sequence* b) { return a->id < b->id; });
  waiting_.insert(pos, seq);
}

void Scheduler::add(Sequence* seq) {
  GQ_CHECK(seq->num_tokens() >= 1, "request ", seq->id, ": empty prompt");
  seq->num_computed = 0;
  enqueue_waiting(seq);
}

void Scheduler::preempt(Sequence* victim, ScheduledBatch& batch, int64_t& budget) {
  GQ_CHECK(!running_.empty() && running_.back() == victim, "scheduler: preempting a request that is not the newest");
  running_.pop_back();
  const auto d = std::find(batch.decodes.begin(), batch.decodes.end(), victim);
  if (d != batch.decodes.end()) {
    batch.decodes.erase(d);
    budget += 1;
  }
  const auto p = std::find_if(batch.prefills.begin(), batch.prefills.end(),
                              [victim](const PrefillChunk& c) { return c.seq == victim; });
  if (p != batch.prefills.end()) {
    budget += p->len;
    batch.prefills.erase(p);
  }
  blocks_.free(*victim);
  victim->num_computed = 0;
  ++victim->num_preemptions;
  ++num_preemptions_;
  batch.preempted.push_back(victim);
  enqueue_waiting(victim);
}

bool Scheduler::make_room(Sequence* seq, int64_t tokens, ScheduledBatch& batch, int64_t& budget) {
  while (!blocks_.can_grow(*seq, tokens)) {
    Sequence* victim = running_.back();
    preempt(victim, batch, budget);
    if (victim == seq) return false;
  }
  blocks_.grow(*seq, tokens);
  return true;
}

ScheduledBatch Scheduler::schedule() {
  ScheduledBatch batch;
  int64_t budget = config_.max_num_batched_tokens;

  // Decodes, oldest first. The loop bound is re-read: preemption shrinks running_ from the back.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->num_pending() != 1) continue;
    if (!make_room(seq, seq->num_computed + 1, batch, budget)) break;
    batch.decodes.push_back(seq);
    budget -= 1;
  }
  // The next chunk of each running prefill.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->num_pending() <= 1) continue;
    const int64_t len = std::min(seq->num_pending(), budget);
    if (!make_room(seq, seq->num_computed + len, batch, budget)) break;
    batch.prefills.push_back({seq, seq->num_computed, len});
    budget -= len;
  }
  // Admission in arrival order; a request that does not fit stops it (no overtaking), and none is
  // admitted in a step that had to preempt.
  while (batch.preempted.empty() && !waiting_.empty() && budget > 0 &&
         int(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    if (config_.enable_prefix_caching) blocks_.match_prefix(*seq);
    const int64_t len = std::min(seq->num_pending(), budget);
    if (!blocks_.can_grow(*seq, seq->num_computed + len)) {
      blocks_.free(*seq);
      seq->num_computed = 0;
      break;
    }
    blocks_.grow(*seq, seq->num_computed + len);
    waiting_.pop_front();
    seq->status = SequenceStatus::kRunning;
    running_.push_back(seq);
    batch.prefills.push_back({seq, seq->num_computed, len});
    budget -= len;
  }
  return batch;
}

ScheduledBatch Scheduler::schedule_ahead(const ScheduledBatch& current) {
  ScheduledBatch next;
  if (current.decodes.empty() || !current.prefills.empty() || !current.preempted.empty() || !waiting_.empty() ||
      current.decodes != running_)
    return next;
  int needed = 0;
  for (const Sequence* seq : current.decodes) {
    const SamplingParams& p = seq->params;
    const bool may_stop = !p.ignore_eos && p.eos_token_id >= 0;
    // After current's token the request holds num_output() + 1 outputs; it finishes at max_new_tokens.
    if (!p.greedy() || may_stop || seq->num_output() + 1 >= p.max_new_tokens || seq->num_pending() != 1) return next;
    needed += blocks_.missing_pages(*seq, seq->num_computed + 2);
  }
  if (!blocks_.can_allocate(needed)) return next;
  for (Sequence* seq : current.decodes) blocks_.grow(*seq, seq->num_computed + 2);
  next.decodes = current.decodes;
  return next;
}

std::vector<Sequence*> Scheduler::postprocess(const ScheduledBatch& batch, const std::vector<int32_t>& sampled) {
  const std::vector<Sequence*> samplers = batch.sampling_sequences();
  GQ_CHECK(samplers.size() == sampled.size(), "scheduler: ", sampled.size(), " sampled tokens for ",
           samplers.size(), " sampling requests");
  for (Sequence* seq : batch.decodes) seq->num_computed += 1;
  for (const PrefillChunk& c : batch.prefills) c.seq->num_computed = c.start + c.len;
  std::vector<Sequence*> finished;
  for (size_t i = 0; i < samplers.size(); ++i) {
    Sequence* seq = samplers[i];
    seq->tokens.push_back(sampled[i]);
    const bool eos = !seq->params.ignore_eos && seq->params.eos_token_id >= 0 &&
                     sampled[i] == seq->params.eos_token_id;
    if (eos || seq->num_output() >= seq->params.max_new_tokens) finished.push_back(seq);
  }
  if (config_.enable_prefix_caching) {
    for (Sequence* seq : running_) blocks_.register_full_pages(*seq);
  }
  for (Sequence* seq : finished) {
    seq->status = SequenceStatus::kFinished;
    blocks_.free(*seq);
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  }
  return finished;
}

}  // namespace gqattn::engine
