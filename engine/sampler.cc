// Greedy, temperature, top-k and top-p sampling on the host. Layer: engine (host-only).
#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gqattn/error.h"
#include "random.h"

namespace gqattn::engine {

namespace {

// A NaN logit counts as -inf: it never outranks a number, wherever it is in the row.
double logit_value(float logit) { return std::isnan(logit) ? -INFINITY : double(logit); }

}  // namespace

void validate(const SamplingParams& params) {
  GQ_CHECK(std::isfinite(params.temperature), "sampler: temperature (", params.temperature, ") must be finite");
  GQ_CHECK(params.top_p > 0.f && params.top_p <= 1.f, "sampler: top_p (", params.top_p, ") must be in (0, 1]");
}

int32_t argmax(const float* logits, int vocab_size) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab_size; ++i)
    if (logit_value(logits[i]) > logit_value(logits[best])) best = i;
  return best;
}

Candidates sampling_candidates(const float* logits, int vocab_size, const SamplingParams& params) {
  GQ_CHECK(vocab_size >= 1, "sampler: vocab_size (", vocab_size, ") must be >= 1");
  validate(params);
  Candidates c;
  if (params.greedy()) {
    c.tokens = {argmax(logits, vocab_size)};
    c.probs = {1.0};
    return c;
  }
  const int k = params.top_k > 0 ? std::min(params.top_k, vocab_size) : vocab_size;
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [logits](int32_t a, int32_t b) {
    const double la = logit_value(logits[a]), lb = logit_value(logits[b]);
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  order.resize(size_t(k));

  // Softmax over the top k at the temperature (the rest have probability 0 after top-k anyway).
  // Logits equal to the largest weigh 1, also when it is infinite (inf - inf would be NaN).
  const double inv_t = 1.0 / double(params.temperature);
  const double max_logit = logit_value(logits[order[0]]);
  std::vector<double> probs(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const double l = logit_value(logits[order[i]]);
    sum += probs[i] = l == max_logit ? 1.0 : std::exp((l - max_logit) * inv_t);
  }
  for (double& p : probs) p /= sum;
  // Top-p: the shortest prefix whose probability reaches top_p (at least one token), never a token
  // of probability 0 (when rounding leaves the mass short of top_p = 1).
  size_t keep = 0;
  double mass = 0;
  while (keep < probs.size() && probs[keep] > 0 && (keep == 0 || mass < double(params.top_p))) mass += probs[keep++];
  c.tokens.assign(order.begin(), order.begin() + long(keep));
  c.probs.assign(probs.begin(), probs.begin() + long(keep));
  for (double& p : c.probs) p /= mass;
  return c;
}

int32_t sample(const float* logits, int vocab_size, const SamplingParams& params, int64_t request_id,
               int64_t output_index) {
  const Candidates c = sampling_candidates(logits, vocab_size, params);
  if (c.tokens.size() == 1) return c.tokens[0];
  const double u = uniform01(random_bits(params.seed, kSampleStream + uint64_t(request_id), uint64_t(output_index)));
  double cumulative = 0;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    cumulative += c.probs[i];
    if (u < cumulative) return c.tokens[i];
  }
  return c.tokens.back();
}

}  // namespace gqattn::engine
