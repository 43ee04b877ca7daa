// The sampler: greedy ties, top-k and top-p support, temperature, seeded determinism, non-finite
// logits and parameter validation. Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "gqattn/error.h"
#include "random.h"
#include "sampler.h"

namespace gqattn::engine {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

TEST(Sampler, GreedyPicksTheSmallestIndexOfTheMaximum) {
  const std::vector<float> l = {0.5f, 2.f, -1.f, 2.f, 1.f};
  EXPECT_EQ(argmax(l.data(), 5), 1);
  SamplingParams p;
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(sample(l.data(), 5, p, 7, 0), 1);
  p.temperature = 1.f;
  p.top_k = 1;
  EXPECT_EQ(sample(l.data(), 5, p, 7, 0), 1);
}

TEST(Sampler, TopKRestrictsTheSupport) {
  const std::vector<float> l = logits_of({0.05, 0.3, 0.1, 0.25, 0.2, 0.1});
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 3;
  const Candidates c = sampling_candidates(l.data(), 6, p);
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{1, 3, 4}));
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(sample(l.data(), 6, p, 1, i));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3, 4}));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<float> l = logits_of({0.05, 0.4, 0.1, 0.3, 0.15});
  SamplingParams p;
  p.temperature = 1.f;
  p.top_p = 0.75f;  // 0.4 + 0.3 = 0.7 < 0.75, + 0.15 reaches it
  const Candidates c = sampling_candidates(l.data(), 5, p);
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_NEAR(c.probs[0], 0.4 / 0.85, 1e-6);
  p.top_p = 0.1f;  // at least one token
  EXPECT_EQ(sampling_candidates(l.data(), 5, p).tokens, (std::vector<int32_t>{1}));
}

// The draws come from a stream of their own: with the bare request id as the stream, request r's
// draws were the bits of random weight tensor r under the same seed (--seed drives both).
TEST(Sampler, DrawsAreNotTheWeightsBits) {
  constexpr int kVocab = 1 << 12;
  const std::vector<float> flat(kVocab, 0.f);  // uniform: the token is floor(u * vocab)
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 5;
  int same = 0;
  for (int64_t request = 0; request < 4; ++request) {
    for (int64_t i = 0; i < 200; ++i) {
      const double weight_u = uniform01(random_bits(p.seed, uint64_t(request), uint64_t(i)));
      same += sample(flat.data(), kVocab, p, request, i) == int32_t(weight_u * kVocab);
    }
  }
  EXPECT_LE(same, 3) << "draws equal to the weight stream's";
}

// As vLLM and Hugging Face users expect: top_k <= 0 (vLLM's -1 included) or >= the vocabulary is off.
TEST(Sampler, TopKOutsideOneToVocabIsOff) {
  const std::vector<float> l = logits_of({0.05, 0.3, 0.1, 0.25, 0.2, 0.1});
  SamplingParams p;
  p.temperature = 1.f;
  const Candidates all = sampling_candidates(l.data(), 6, p);
  EXPECT_EQ(all.tokens.size(), 6u);
  for (int k : {-1, -100, 6, 1000}) {
    p.top_k = k;
    const Candidates c = sampling_candidates(l.data(), 6, p);
    EXPECT_EQ(c.tokens, all.tokens) << "top_k " << k;
    EXPECT_EQ(c.probs, all.probs) << "top_k " << k;
  }
}

// A NaN logit counts as -inf, wherever it is; tokens at -inf (masked) are never candidates and
// never drawn; +inf logits share the probability. Probabilities stay finite.
TEST(Sampler, NonFiniteLogits) {
  const float nan = std::nanf(""), inf = INFINITY;
  for (const std::vector<float>& l : {std::vector<float>{nan, 1.f, 2.f}, std::vector<float>{1.f, nan, 2.f},
                                      std::vector<float>{2.f, 1.f, nan}})
    EXPECT_EQ(l[size_t(argmax(l.data(), 3))], 2.f);
  const std::vector<float> all_nan = {nan, nan, nan};
  EXPECT_EQ(argmax(all_nan.data(), 3), 0);

  SamplingParams p;
  p.temperature = 1.f;
  const auto expect_candidates = [&](const std::vector<float>& l, const std::vector<int32_t>& tokens) {
    const Candidates c = sampling_candidates(l.data(), int(l.size()), p);
    EXPECT_EQ(c.tokens, tokens);
    double sum = 0;
    for (double q : c.probs) {
      EXPECT_TRUE(std::isfinite(q) && q > 0) << q;
      sum += q;
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
    for (int i = 0; i < 200; ++i) {
      const int32_t t = sample(l.data(), int(l.size()), p, 1, i);
      EXPECT_NE(std::find(tokens.begin(), tokens.end(), t), tokens.end()) << "drew " << t;
    }
  };
  expect_candidates({nan, 1.f, 1.f, nan}, {1, 2});
  expect_candidates({1.f, inf, 2.f, inf}, {1, 3});
  // Six equal logits: their probabilities sum to 1 - 1e-16, short of top_p = 1 by rounding.
  expect_candidates({0.f, -inf, 0.f, 0.f, 0.f, 0.f, -inf, 0.f}, {0, 2, 3, 4, 5, 7});
}

TEST(Sampler, RejectsInvalidParameters) {
  SamplingParams p;
  validate(p);
  p.temperature = -1.f;  // greedy
  p.top_k = -1;
  validate(p);
  for (float top_p : {0.f, -0.5f, 1.5f, std::nanf("")}) {
    p.top_p = top_p;
    EXPECT_THROW(validate(p), Error) << "top_p " << top_p;
  }
  p.top_p = 1.f;
  for (float t : {std::nanf(""), INFINITY}) {
    p.temperature = t;
    EXPECT_THROW(validate(p), Error) << "temperature " << t;
  }
}

TEST(Sampler, FrequenciesFollowTheTemperedDistribution) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  const std::vector<float> l = logits_of(probs);
  SamplingParams p;
  p.temperature = 2.f;  // probabilities ~ sqrt(probs)
  double z = 0;
  for (double q : probs) z += std::sqrt(q);
  std::map<int32_t, int> count;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) ++count[sample(l.data(), 4, p, 3, i)];
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(double(count[t]) / kDraws, std::sqrt(probs[t]) / z, 0.015) << "token " << t;
}

TEST(Sampler, DrawsAreFixedBySeedRequestAndPosition) {
  std::vector<float> l(64);
  for (int i = 0; i < 64; ++i) l[i] = float(std::sin(i * 0.7));
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 5;
  std::vector<int32_t> a, b, c;
  for (int i = 0; i < 50; ++i) {
    a.push_back(sample(l.data(), 64, p, 3, i));
    b.push_back(sample(l.data(), 64, p, 3, i));
  }
  EXPECT_EQ(a, b);
  p.seed = 6;
  for (int i = 0; i < 50; ++i) c.push_back(sample(l.data(), 64, p, 3, i));
  EXPECT_NE(a, c);
}

}  // namespace
}  // namespace gqattn::engine
