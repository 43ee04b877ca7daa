// Token sampling from one row of logits: greedy, temperature, top-k and top-p, with every random
// draw fixed by (params.seed, request id, output index), so a request samples the same tokens
// however it is batched or preempted. Layer: engine (host-only; the CUDA path runs the greedy rule
// as an argmax kernel, with the same tie-break).
#pragma once

#include <cstdint>
#include <vector>

#include "sequence.h"

namespace gqattn::engine {

// Throws gqattn::Error when top_p is outside (0, 1] or the temperature is not finite, greedy or
// not. Engine::add_request calls it, so that a request the sampler would reject is never queued.
void validate(const SamplingParams& params);

// Greedy: the index of the largest logit, the smallest such index on ties. A NaN logit counts as
// -inf here and in sampling.
int32_t argmax(const float* logits, int vocab_size);

// The tokens that can be drawn under `params` and their probabilities (summing to 1), in
// decreasing probability (ties: smaller token first). Greedy gives one token with probability 1.
struct Candidates {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
};
Candidates sampling_candidates(const float* logits, int vocab_size, const SamplingParams& params);

// Draws a token for output position `output_index` of request `request_id`.
int32_t sample(const float* logits, int vocab_size, const SamplingParams& params, int64_t request_id,
               int64_t output_index);

}  // namespace gqattn::engine
