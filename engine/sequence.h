// A request as the engine tracks it: its tokens (prompt, then generated), sampling parameters,
// its pages in the KV cache and how many of its tokens have K/V there. Owned by the engine,
// moved between the scheduler's queues by pointer. Layer: engine (host-only).
#pragma once

#include <cstdint>
#include <vector>

namespace gqattn::engine {

struct SamplingParams {
  float temperature = 0.f;   // <= 0: greedy
  int top_k = 0;             // <= 0 (vLLM's -1 included) or >= the vocabulary: the whole vocabulary
  float top_p = 1.f;         // nucleus: the smallest set of tokens with this much probability
  uint64_t seed = 0;         // with the request id, fixes every random draw of the request
  int max_new_tokens = 16;   // output length (reached exactly unless EOS stops it first)
  int eos_token_id = -1;     // -1: none
  bool ignore_eos = false;

  bool greedy() const { return temperature <= 0.f || top_k == 1; }
};

enum class SequenceStatus { kWaiting, kRunning, kFinished };

struct Sequence {
  int64_t id = 0;                  // arrival order: admission is FIFO by id
  std::vector<int32_t> tokens;     // prompt then output
  int num_prompt_tokens = 0;
  SamplingParams params;
  SequenceStatus status = SequenceStatus::kWaiting;
  int64_t num_computed = 0;        // tokens [0, num_computed) have K/V in `pages`
  std::vector<int32_t> pages;      // the block table
  std::vector<uint64_t> page_hashes;  // prefix-cache hash of each leading full page registered
  int num_preemptions = 0;

  int64_t num_tokens() const { return int64_t(tokens.size()); }
  int num_output() const { return int(tokens.size()) - num_prompt_tokens; }
  int64_t num_pending() const { return num_tokens() - num_computed; }
  bool finished() const { return status == SequenceStatus::kFinished; }
};

}  // namespace gqattn::engine
