// The tiny model on the CPU path: its logits equal a straightforward float64 forward pass (MHA,
// GQA and MQA; both attention backends; chunked prefill and decode over shuffled pages; sizes
// that are not multiples of 8; K/V pools in NHD and HND), and
// continuous batching (chunked prefill, preemption, prefix caching, sampling) gives each request
// exactly the tokens it gets when run alone. Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>

#include "engine_test_util.h"
#include "gqattn/error.h"

namespace gqattn::engine {
namespace {

struct Case {
  int num_kv_heads;
  const char* attention;
  bool odd_shapes = false;  // test::odd_tiny_runner_config
  bool hnd = false;         // K/V pools in HND (RunnerConfig::kv_layout)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.attention << ", " << c.num_kv_heads << " K/V heads" << (c.odd_shapes ? ", odd shapes" : "")
      << (c.hnd ? ", HND" : "");
}

class TinyLogits : public ::testing::TestWithParam<Case> {};

TEST_P(TinyLogits, EqualAFloat64ForwardPass) {
  const Case c = GetParam();
  RunnerConfig rc = c.odd_shapes ? test::odd_tiny_runner_config(c.num_kv_heads, c.attention)
                                 : test::tiny_runner_config(c.num_kv_heads, c.attention);
  if (c.hnd) rc.kv_layout = KVLayout::kHND;
  auto runner = test::make_runner(rc);
  const test::ReferenceModel ref(rc.model, random_host_weights(rc.model, test::kSeed));
  // Two requests: a 13-token prompt prefilled in chunks of 5, then 7 decode steps.
  const auto seqs = test::make_prompts({20, 20}, rc.model.vocab_size, 17);
  const auto got = test::run_teacher_forced(*runner, seqs, 13, 5);
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto want = ref.logits(seqs[b]);
    ASSERT_EQ(got[b].size(), 3u + 7u);
    for (const auto& [pos, logits] : got[b]) {
      double max_err = 0, max_ref = 0;
      for (size_t v = 0; v < logits.size(); ++v) {
        max_err = std::max(max_err, std::abs(double(logits[v]) - want[pos][v]));
        max_ref = std::max(max_ref, std::abs(want[pos][v]));
      }
      EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_ref)) << "request " << b << " position " << pos;
      EXPECT_GT(max_ref, 0.05) << "degenerate logits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadsAndBackends, TinyLogits,
                         ::testing::Values(Case{4, "gqattn"}, Case{2, "gqattn"}, Case{1, "gqattn"}, Case{4, "expand"},
                                           Case{2, "expand"}, Case{1, "expand"}, Case{2, "gqattn", true},
                                           Case{2, "gqattn", false, true}, Case{1, "gqattn", false, true},
                                           Case{2, "expand", false, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.attention) + "_kv" + std::to_string(info.param.num_kv_heads) +
                                  (info.param.odd_shapes ? "_odd" : "") + (info.param.hnd ? "_hnd" : "");
                         });

// Each prompt run alone in a fresh engine with ample pages.
std::vector<std::vector<int32_t>> run_alone(const RunnerConfig& rc, const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<SamplingParams>& params) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine engine(test::make_runner(rc));
    const int64_t id = engine.add_request(prompts[i], params[i]);
    // Request ids feed the sampler's random stream: give each the id it has in the batched run.
    EXPECT_EQ(id, 0);
    engine.run();
    out.push_back(engine.output(id));
  }
  return out;
}

struct BatchedRun {
  std::vector<std::vector<int32_t>> outputs;
  int64_t preemptions = 0;
  bool mixed_step = false;
  int steps_queued_ahead = 0;  // steps whose successor was queued before their tokens were read
};

BatchedRun run_batched(const RunnerConfig& rc, const std::vector<std::vector<int32_t>>& prompts,
                       const std::vector<SamplingParams>& params, bool prefix_caching = false,
                       bool overlap_steps = true) {
  Engine engine(test::make_runner(rc), prefix_caching, overlap_steps);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(engine.add_request(prompts[i], params[i]));
  BatchedRun r;
  while (engine.has_unfinished()) {
    const StepStats s = engine.step();
    r.preemptions += s.num_preempted;
    r.mixed_step = r.mixed_step || (s.num_decode > 0 && s.num_prefill > 0);
    r.steps_queued_ahead += s.queued_next;
  }
  for (int64_t id : ids) r.outputs.push_back(engine.output(id));
  EXPECT_EQ(engine.blocks().num_free_pages(), engine.blocks().num_pages());
  return r;
}

std::vector<SamplingParams> greedy_params(const std::vector<int>& lengths) {
  std::vector<SamplingParams> out;
  for (int n : lengths) {
    SamplingParams p;
    p.max_new_tokens = n;
    out.push_back(p);
  }
  return out;
}

// The tiny model with 16 pages, a 16-token step budget and 6 requests at most: the six prompts of
// 9, 30, 4, 17, 1 and 12 tokens take chunked prefills and preemptions there.
RunnerConfig crowded_config() {
  RunnerConfig rc = test::tiny_runner_config();
  rc.max_num_batched_tokens = 16;
  rc.num_pages = 16;
  rc.max_num_seqs = 6;
  return rc;
}

TEST(ContinuousBatching, GreedyTokensEqualRunningEachRequestAlone) {
  RunnerConfig rc = test::tiny_runner_config();
  const auto prompts = test::make_prompts({9, 30, 4, 17, 1, 12}, rc.model.vocab_size, 3);
  const auto params = greedy_params({20, 8, 25, 12, 30, 16});
  // A small budget chunks the prefills; 16 pages of 4 tokens force preemptions.
  RunnerConfig tight = rc;
  tight.max_num_batched_tokens = 16;
  tight.num_pages = 16;
  tight.max_num_seqs = 6;
  const BatchedRun batched = run_batched(tight, prompts, params);
  EXPECT_GT(batched.preemptions, 0);
  EXPECT_TRUE(batched.mixed_step);
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(run_alone(rc, {prompts[i]}, {params[i]})[0]);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batched.outputs[i].size(), size_t(params[i].max_new_tokens));
    EXPECT_EQ(batched.outputs[i], alone[i]) << "request " << i;
  }
}

// Step n + 1 queued before step n's tokens are read (its tokens taken on the device) gives the
// tokens of the serial loop, through preemptions, requests finishing at different steps and
// pages running out; and it is never queued where it cannot be known (EOS, sampling).
TEST(ContinuousBatching, OverlappedStepsGiveTheSerialTokens) {
  const RunnerConfig rc = crowded_config();
  const auto prompts = test::make_prompts({9, 30, 4, 17, 1, 12}, rc.model.vocab_size, 3);
  const auto params = greedy_params({20, 8, 25, 12, 30, 16});
  const BatchedRun serial = run_batched(rc, prompts, params, false, false);
  const BatchedRun overlapped = run_batched(rc, prompts, params, false, true);
  EXPECT_EQ(serial.steps_queued_ahead, 0);
  EXPECT_GT(overlapped.steps_queued_ahead, 10);
  EXPECT_GT(overlapped.preemptions, 0);
  EXPECT_EQ(overlapped.outputs, serial.outputs);
  // Ample pages: every request decodes together until the shortest finishes.
  RunnerConfig roomy = test::tiny_runner_config();
  const BatchedRun a = run_batched(roomy, prompts, params, false, false);
  const BatchedRun b = run_batched(roomy, prompts, params, false, true);
  EXPECT_EQ(b.outputs, a.outputs);
  EXPECT_GT(b.steps_queued_ahead, 20);
  // A running request that may stop at EOS, or samples, makes each step wait for its tokens.
  std::vector<SamplingParams> eos = params, sampled = params;
  for (SamplingParams& p : eos) p.eos_token_id = 7;
  for (SamplingParams& p : sampled) p.temperature = 0.8f;
  EXPECT_EQ(run_batched(roomy, prompts, eos).steps_queued_ahead, 0);
  EXPECT_EQ(run_batched(roomy, prompts, sampled).steps_queued_ahead, 0);
}

TEST(ContinuousBatching, PrefixCachingSharesPagesWithoutChangingTokens) {
  RunnerConfig rc = test::tiny_runner_config();
  auto prompts = test::make_prompts({24, 24, 24}, rc.model.vocab_size, 5);
  // Requests 1 and 2 share request 0's first 16 and 20 tokens.
  std::copy(prompts[0].begin(), prompts[0].begin() + 16, prompts[1].begin());
  std::copy(prompts[0].begin(), prompts[0].begin() + 20, prompts[2].begin());
  const auto params = greedy_params({6, 6, 6});
  rc.max_num_batched_tokens = 24;  // one prompt per step: later ones find the earlier pages
  const BatchedRun plain = run_batched(rc, prompts, params, false);
  Engine engine(test::make_runner(rc), true);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(engine.add_request(prompts[i], params[i]));
  engine.step();  // request 0's prompt
  engine.step();  // request 1 admitted on top of request 0's cached pages
  int shared = 0;
  for (int32_t p : engine.sequence(ids[1]).pages) shared += engine.blocks().ref_count(p) > 1;
  EXPECT_EQ(shared, 4);  // 16 tokens / page_size 4
  engine.run();
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(engine.output(ids[i]), plain.outputs[i]) << "request " << i;
}

TEST(ContinuousBatching, SeededSamplingIsIndependentOfBatching) {
  RunnerConfig rc = test::tiny_runner_config();
  const auto prompts = test::make_prompts({7}, rc.model.vocab_size, 8);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.seed = 77;
  p.max_new_tokens = 12;
  const auto alone = run_alone(rc, prompts, {p});
  // The same request as request 0 of a batch with others.
  auto more = test::make_prompts({7, 11, 5}, rc.model.vocab_size, 8);
  std::vector<SamplingParams> ps = {p, p, p};
  const BatchedRun batched = run_batched(rc, more, ps);
  EXPECT_EQ(batched.outputs[0], alone[0]);
}

// The warm-up (one decode step of every batch bucket on page 0, before any request; the engine
// runs it on the GPU) changes no request's tokens: the same greedy and seeded outputs after it,
// with chunked prefills and preemptions that reuse page 0.
TEST(Engine, WarmUpChangesNoTokens) {
  const RunnerConfig rc = crowded_config();
  const auto prompts = test::make_prompts({9, 30, 4, 17, 1, 12}, rc.model.vocab_size, 3);
  std::vector<SamplingParams> params = greedy_params({20, 8, 25, 12, 30, 16});
  params[2].temperature = 0.8f;
  params[2].seed = 11;
  const BatchedRun cold = run_batched(rc, prompts, params);
  Engine engine(test::make_runner(rc));
  engine.runner().warm_up();
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(engine.add_request(prompts[i], params[i]));
  engine.run();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(engine.output(ids[i]), cold.outputs[i]) << "request " << i;
  EXPECT_GT(cold.preemptions, 0);
}

TEST(Engine, RejectsImpossibleRequests) {
  RunnerConfig rc = test::tiny_runner_config();
  rc.num_pages = 4;  // 16 tokens
  rc.max_model_len = 64;
  Engine engine(test::make_runner(rc));
  SamplingParams p;
  p.max_new_tokens = 10;
  EXPECT_THROW(engine.add_request({}, p), Error);
  EXPECT_THROW(engine.add_request({1, rc.model.vocab_size}, p), Error);
  EXPECT_THROW(engine.add_request(std::vector<int32_t>(60, 1), p), Error);  // past max_model_len
  EXPECT_THROW(engine.add_request(std::vector<int32_t>(10, 1), p), Error);  // 19 tokens > 16 in the pool
  p.max_new_tokens = 0;
  EXPECT_THROW(engine.add_request({1}, p), Error);
  p.max_new_tokens = 7;
  // Sampling parameters the sampler rejects: queued, the request would fail every later step.
  SamplingParams bad = p;
  bad.temperature = 1.f;
  bad.top_p = 0.f;
  EXPECT_THROW(engine.add_request({1}, bad), Error);
  EXPECT_FALSE(engine.has_unfinished());
  engine.add_request(std::vector<int32_t>(10, 1), p);  // 16 tokens stored: fits exactly
  engine.run();
  EXPECT_FALSE(engine.has_unfinished());
}

TEST(Engine, ConfigurationErrorsNameTheFlag) {
  const auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([] { model_config("llama9"); }).find("--model"), std::string::npos);
  EXPECT_NE(message([] { model_config("llama2-7b", 5); }).find("--num-kv-heads"), std::string::npos);
  RunnerConfig rc = test::tiny_runner_config();
  rc.attention = "flash";
  EXPECT_NE(message([&] { test::make_runner(rc); }).find("--attention"), std::string::npos);
  rc = test::tiny_runner_config();
  rc.max_model_len = int64_t(rc.model.max_position) + 1;  // longer than the model is used for
  EXPECT_NE(message([&] { test::make_runner(rc); }).find("max_position"), std::string::npos);
  rc = test::tiny_runner_config();
  rc.num_pages = 0;
  rc.kv_pool_gib = 1e-9;
  EXPECT_NE(message([&] { test::make_runner(rc); }).find("--kv-pool-gib"), std::string::npos);
  rc = test::tiny_runner_config();
  rc.num_pages = int64_t(INT32_MAX) + 1;  // exactly this many: past what int32 page ids name
  EXPECT_NE(message([&] { test::make_runner(rc); }).find("num_pages"), std::string::npos);
}

// The steps the runner plans at start-up (probe_step_plans), seen through a backend that records
// each plan: the most requests a step can hold (--max-num-seqs, or the pool's pages where fewer:
// each request of a step writes to a page of its own), the most tokens, the longest chunk, and a
// step of one-token chunks beside long ones.
struct ProbedStep {
  int decodes, prefills, tokens, longest;
};
std::vector<ProbedStep>& probed_steps() {
  static std::vector<ProbedStep> steps;
  return steps;
}

class RecordingBackend final : public AttentionBackend {
 public:
  explicit RecordingBackend(const AttentionContext& c) : inner_(make_gqattn_backend(c)) {}
  std::string name() const override { return "recording"; }
  void plan(const AttentionMetadata& meta) override {
    int longest = 0;
    for (int r = 0; r < meta.num_prefill; ++r)
      longest = std::max(longest, meta.prefill_qo_indptr[size_t(r) + 1] - meta.prefill_qo_indptr[size_t(r)]);
    probed_steps().push_back({meta.num_decode, meta.num_prefill, meta.num_tokens, longest});
    inner_->plan(meta);
  }
  void forward(const LayerCache& cache, const TensorView& q, const TensorView& o,
               const AttentionMetadata& meta) override {
    inner_->forward(cache, q, o, meta);
  }

 private:
  std::unique_ptr<AttentionBackend> inner_;
};

TEST(Engine, StartUpPlansTheLargestStepsThePoolAdmits) {
  register_attention_backend("recording", [](const AttentionContext& c) { return std::make_unique<RecordingBackend>(c); });
  const auto probe = [](int64_t num_pages, int max_num_seqs, int max_tokens, int64_t max_model_len) {
    RunnerConfig rc = test::tiny_runner_config(2, "recording");
    rc.num_pages = num_pages;
    rc.max_num_seqs = max_num_seqs;
    rc.max_num_batched_tokens = max_tokens;
    rc.max_model_len = max_model_len;
    probed_steps().clear();
    test::make_runner(rc);
    return probed_steps();
  };
  const auto expect_steps = [](const std::vector<ProbedStep>& got, const std::vector<ProbedStep>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].decodes, want[i].decodes) << i;
      EXPECT_EQ(got[i].prefills, want[i].prefills) << i;
      EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
      EXPECT_EQ(got[i].longest, want[i].longest) << i;
    }
  };
  // The pool holds every request: 16 decodes; 16 chunks of 16 tokens; one chunk of 241 tokens and
  // 15 of one; one chunk of 256.
  expect_steps(probe(256, 16, 256, 512), {{16, 0, 16, 0}, {0, 16, 256, 16}, {0, 16, 256, 241}, {0, 1, 256, 256}});
  // 40,000 requests over 256 pages of 4 tokens: 256 requests and 1,024 new tokens a step at most.
  expect_steps(probe(256, 40000, 40000, 8), {{256, 0, 256, 0}, {0, 256, 1024, 4}, {0, 256, 1024, 8}, {0, 1, 8, 8}});
}

}  // namespace
}  // namespace gqattn::engine
