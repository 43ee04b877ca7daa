// Greedy, temperature, top-k and top-p sampling on the host. Layer: engine (host-only).
#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gqattn/error.h"
#include "random.h"

namespace gqattn::engine {

int32_t argmax(const float* logits, int vocab_size) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab_size; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

Candidates sampling_candidates(const float* logits, int vocab_size, const SamplingParams& params) {
  GQ_CHECK(vocab_size >= 1, "sampler: vocab_size (", vocab_size, ") must be >= 1");
  Candidates c;
  if (params.greedy()) {
    c.tokens = {argmax(logits, vocab_size)};
    c.probs = {1.0};
    return c;
  }
  GQ_CHECK(params.top_p > 0.f && params.top_p <= 1.f, "sampler: top_p (", params.top_p, ") must be in (0, 1]");
  const int k = params.top_k > 0 ? std::min(params.top_k, vocab_size) : vocab_size;
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  order.resize(size_t(k));

  // Softmax over the top k at the temperature (the rest have probability 0 after top-k anyway).
  const double inv_t = 1.0 / double(params.temperature);
  const double max_logit = double(logits[order[0]]);
  std::vector<double> probs(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += probs[i] = std::exp((double(logits[order[i]]) - max_logit) * inv_t);
  for (double& p : probs) p /= sum;
  // Top-p: the shortest prefix whose probability reaches top_p (at least one token).
  size_t keep = 0;
  double mass = 0;
  while (keep < probs.size() && (keep == 0 || mass < double(params.top_p))) mass += probs[keep++];
  c.tokens.assign(order.begin(), order.begin() + long(keep));
  c.probs.assign(probs.begin(), probs.begin() + long(keep));
  for (double& p : c.probs) p /= mass;
  return c;
}

int32_t sample(const float* logits, int vocab_size, const SamplingParams& params, int64_t request_id,
               int64_t output_index) {
  const Candidates c = sampling_candidates(logits, vocab_size, params);
  if (c.tokens.size() == 1) return c.tokens[0];
  const double u = uniform01(random_bits(params.seed, uint64_t(request_id), uint64_t(output_index)));
  double cumulative = 0;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    cumulative += c.probs[i];
    if (u < cumulative) return c.tokens[i];
  }
  return c.tokens.back();
}

}  // namespace gqattn::engine
