// The engine on the GPU against its CPU path: the tiny model's logits over 64 teacher-forced
// decode steps (MHA, GQA, MQA; both attention backends; with and without CUDA graphs; sizes that
// are not multiples of 8; K/V pools in NHD and HND), greedy tokens wherever the top-2 logit gap is larger than the bf16
// path's error, random weights made on the device bit-identical to the host's, and 128-request
// runs (ample and tight page pools) that finish with every token. Layer: tests (label gpu;
// skipped with a message without a GPU).
//
// Tie-free token checks: where the CPU's top-2 gap exceeds twice the largest |GPU - CPU| logit
// difference, the GPU's argmax cannot differ, so tokens are compared exactly there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <string>

#include <unistd.h>

#include "engine_test_util.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "sampler.h"

namespace gqattn::engine {
namespace {

#define GQ_REQUIRE_GPU()                                                                            \
  do {                                                                                              \
    if (::gqattn::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";     \
  } while (0)

// |GPU - CPU| of a logit: bf16 activations against float32 ones (the tiny model's logits reach
// about 1.4; its top-2 gaps have a median near 0.05).
constexpr double kLogitTol = 0.03;
constexpr int kPromptLen = 20;
constexpr int kSteps = 64;

struct GpuCase {
  int num_kv_heads;
  const char* attention;
  bool cuda_graph;
  bool odd_shapes = false;  // test::odd_tiny_runner_config: the scalar kernels, unaligned GEMMs
  bool hnd = false;         // K/V pools in HND (RunnerConfig::kv_layout)
};

void PrintTo(const GpuCase& c, std::ostream* os) {
  *os << c.attention << ", " << c.num_kv_heads << " K/V heads, " << (c.cuda_graph ? "CUDA graphs" : "eager")
      << (c.odd_shapes ? ", odd shapes" : "") << (c.hnd ? ", HND" : "");
}

std::string case_name(const ::testing::TestParamInfo<GpuCase>& info) {
  return std::string(info.param.attention) + "_kv" + std::to_string(info.param.num_kv_heads) +
         (info.param.cuda_graph ? "_graph" : "_eager") + (info.param.odd_shapes ? "_odd" : "") +
         (info.param.hnd ? "_hnd" : "");
}

class GpuTinyModel : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuTinyModel, LogitsAndClearTokensMatchTheCpuPathFor64Steps) {
  GQ_REQUIRE_GPU();
  const GpuCase c = GetParam();
  RunnerConfig rc = c.odd_shapes ? test::odd_tiny_runner_config(c.num_kv_heads, c.attention)
                                 : test::tiny_runner_config(c.num_kv_heads, c.attention);
  rc.cuda_graph = c.cuda_graph;
  if (c.hnd) rc.kv_layout = KVLayout::kHND;
  // The CPU path's greedy continuation of three prompts, then both paths fed those tokens.
  const auto prompts = test::make_prompts({kPromptLen, kPromptLen, kPromptLen}, rc.model.vocab_size, 21);
  SamplingParams greedy;
  greedy.max_new_tokens = kSteps;
  Engine cpu_engine(test::make_runner(rc, "cpu"));
  const auto generated = cpu_engine.generate(prompts, greedy);
  std::vector<std::vector<int32_t>> seqs;
  for (size_t b = 0; b < prompts.size(); ++b) {
    seqs.push_back(prompts[b]);
    seqs.back().insert(seqs.back().end(), generated[b].begin(), generated[b].end() - 1);
  }
  auto cpu = test::make_runner(rc, "cpu");
  auto gpu = test::make_runner(rc, "cuda");
  const auto want = test::run_teacher_forced(*cpu, seqs, kPromptLen, 8);
  const auto got = test::run_teacher_forced(*gpu, seqs, kPromptLen, 8);
  int compared = 0, clear = 0;
  double worst = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (int pos = kPromptLen - 1; pos < int(seqs[b].size()); ++pos) {
      const std::vector<float>& w = want[b].at(pos);
      const std::vector<float>& g = got[b].at(pos);
      double err = 0;
      for (size_t v = 0; v < w.size(); ++v) err = std::max(err, std::abs(double(g[v]) - double(w[v])));
      worst = std::max(worst, err);
      EXPECT_LE(err, kLogitTol) << "request " << b << " position " << pos;
      ++compared;
      if (test::top2_gap(w) > 2 * err) {
        ++clear;
        EXPECT_EQ(argmax(g.data(), int(g.size())), argmax(w.data(), int(w.size())))
            << "request " << b << " position " << pos << " (top-2 gap " << test::top2_gap(w) << ")";
      }
    }
  }
  EXPECT_EQ(compared, 3 * kSteps);
  if (c.cuda_graph) {
    EXPECT_GT(gpu->compute().num_graphs(), 0) << "decode steps did not run from a CUDA graph";
  } else {
    EXPECT_EQ(gpu->compute().num_graphs(), 0);
  }
  EXPECT_GT(clear, compared / 4) << "too few tie-free tokens to compare";
  std::printf("max |gpu - cpu| logit %.2e over %d steps, %d tokens with a clear top-2 gap\n", worst, compared, clear);
}

INSTANTIATE_TEST_SUITE_P(HeadsBackendsGraphs, GpuTinyModel,
                         ::testing::Values(GpuCase{4, "gqattn", true}, GpuCase{2, "gqattn", true},
                                           GpuCase{1, "gqattn", true}, GpuCase{2, "gqattn", false},
                                           GpuCase{4, "expand", true}, GpuCase{2, "expand", true},
                                           GpuCase{1, "expand", false}, GpuCase{2, "gqattn", true, true},
                                           GpuCase{2, "expand", false, true}, GpuCase{2, "gqattn", true, false, true},
                                           GpuCase{1, "gqattn", false, false, true},
                                           GpuCase{2, "expand", true, false, true}),
                         case_name);

// The CPU logits after `tokens` (its last position), from a fresh CPU runner.
std::vector<float> cpu_last_logits(const RunnerConfig& rc, const std::vector<int32_t>& tokens) {
  auto cpu = test::make_runner(rc, "cpu");
  const int n = int(tokens.size());
  return test::run_teacher_forced(*cpu, {tokens}, n, n)[0].at(n - 1);
}

// Where the two engines first part, the GPU's token must be one the CPU path nearly ties with its
// own: its CPU logit within 2 x kLogitTol of the maximum (else the logits differ by more than
// kLogitTol, which the test above excludes).
TEST(GpuEngine, GreedyTokensEqualTheCpuEnginesUntilANearTie) {
  GQ_REQUIRE_GPU();
  RunnerConfig rc = test::tiny_runner_config();
  const auto prompts = test::make_prompts({5, 20, 13, 31}, rc.model.vocab_size, 4);
  SamplingParams greedy;
  greedy.max_new_tokens = kSteps;
  Engine cpu_engine(test::make_runner(rc, "cpu"));
  Engine gpu_engine(test::make_runner(rc, "cuda"));
  const auto want = cpu_engine.generate(prompts, greedy);
  const auto got = gpu_engine.generate(prompts, greedy);
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(got[b].size(), size_t(kSteps));
    size_t k = 0;
    while (k < want[b].size() && got[b][k] == want[b][k]) ++k;
    if (k == want[b].size()) continue;
    std::vector<int32_t> context = prompts[b];
    context.insert(context.end(), want[b].begin(), want[b].begin() + long(k));
    const std::vector<float> cpu = cpu_last_logits(rc, context);
    const double shortfall = double(cpu[size_t(want[b][k])]) - double(cpu[size_t(got[b][k])]);
    EXPECT_LE(shortfall, 2 * kLogitTol) << "request " << b << " differs at output " << k << ": the GPU's token "
                                        << got[b][k] << " is " << shortfall << " below the CPU's best";
    std::printf("request %zu: %zu of %d greedy tokens equal before a near-tie (%.3g)\n", b, k, kSteps, shortfall);
  }
}

TEST(GpuEngine, DeviceRandomWeightsEqualTheHostOnes) {
  GQ_REQUIRE_GPU();
  const RunnerConfig rc = test::tiny_runner_config();
  // In a directory of its own: a config.json beside the file would be checked too.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gqattn_engine_gpu_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();
  save_weights(rc.model, random_host_weights(rc.model, test::kSeed), path);
  RunnerConfig from_file = rc;
  from_file.weights.path = path;
  auto a = test::make_runner(rc, "cuda");
  auto b = test::make_runner(from_file, "cuda");
  const auto seq = test::make_prompts({24}, rc.model.vocab_size, 2);
  EXPECT_EQ(test::run_teacher_forced(*a, seq, 16, 16), test::run_teacher_forced(*b, seq, 16, 16));
  std::filesystem::remove_all(dir);
}

// 128 requests x (32 + 992) tokens, as in the end-to-end table, with the tiny model.
void run_128(int64_t num_pages, bool expect_preemption) {
  RunnerConfig rc = test::tiny_runner_config();
  rc.page_size = 16;
  rc.max_num_seqs = 128;
  rc.max_num_batched_tokens = 8192;
  rc.max_model_len = 32 + 992;
  rc.num_pages = num_pages;
  Engine engine(test::make_runner(rc, "cuda"));
  SamplingParams p;
  p.max_new_tokens = 992;
  p.ignore_eos = true;
  const auto prompts = test::make_prompts(std::vector<int>(128, 32), rc.model.vocab_size, 6);
  std::vector<int64_t> ids;
  for (const auto& prompt : prompts) ids.push_back(engine.add_request(prompt, p));
  int64_t preemptions = 0;
  int steps = 0, queued_ahead = 0;
  while (engine.has_unfinished()) {
    const StepStats s = engine.step();
    preemptions += s.num_preempted;
    queued_ahead += s.queued_next;
    ++steps;
  }
  for (int64_t id : ids) {
    const std::vector<int32_t> out = engine.output(id);
    ASSERT_EQ(out.size(), 992u) << "request " << id;
    for (int32_t t : out) ASSERT_TRUE(t >= 0 && t < rc.model.vocab_size);
  }
  EXPECT_EQ(engine.blocks().num_free_pages(), engine.blocks().num_pages());
  EXPECT_GT(engine.runner().compute().num_graphs(), 0);
  if (expect_preemption) {
    EXPECT_GT(preemptions, 0);
  }
  // Without preemption every decode step but the first and the last queues its successor.
  if (!expect_preemption) {
    EXPECT_GE(queued_ahead, 992 - 3);
  }
  std::printf("%d steps (%d queued a step ahead), %lld preemptions\n", steps, queued_ahead,
              static_cast<long long>(preemptions));
}

// The GPU engine with step n + 1 queued before step n's tokens are read (tokens taken on the
// device, CUDA graphs) gives bit for bit the tokens of its serial loop, through preemptions and
// requests that finish at different steps.
TEST(GpuEngine, OverlappedStepsGiveTheSerialTokens) {
  GQ_REQUIRE_GPU();
  RunnerConfig rc = test::tiny_runner_config();
  rc.num_pages = 40;  // 160 tokens for 6 requests of up to 90: preemptions
  rc.max_num_batched_tokens = 32;
  const auto prompts = test::make_prompts({9, 30, 4, 17, 1, 12}, rc.model.vocab_size, 3);
  std::vector<int> lengths = {40, 18, 55, 32, 60, 36};
  const auto run = [&](bool overlap, int& queued, int64_t& preempted) {
    Engine engine(test::make_runner(rc, "cuda"), false, overlap);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p;
      p.max_new_tokens = lengths[i];
      ids.push_back(engine.add_request(prompts[i], p));
    }
    while (engine.has_unfinished()) {
      const StepStats s = engine.step();
      queued += s.queued_next;
      preempted += s.num_preempted;
    }
    std::vector<std::vector<int32_t>> out;
    for (int64_t id : ids) out.push_back(engine.output(id));
    EXPECT_EQ(engine.blocks().num_free_pages(), engine.blocks().num_pages());
    return out;
  };
  int queued_serial = 0, queued = 0;
  int64_t preempted_serial = 0, preempted = 0;
  const auto serial = run(false, queued_serial, preempted_serial);
  const auto overlapped = run(true, queued, preempted);
  EXPECT_EQ(queued_serial, 0);
  EXPECT_GT(queued, 20);
  EXPECT_GT(preempted, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(overlapped[i].size(), size_t(lengths[i]));
    EXPECT_EQ(overlapped[i], serial[i]) << "request " << i;
  }
  std::printf("%d steps queued a step ahead, %lld preemptions\n", queued, static_cast<long long>(preempted));
}

TEST(GpuEngine, HundredTwentyEightRequestsFinishWithEveryToken) {
  GQ_REQUIRE_GPU();
  run_128(128 * 64, false);
}

TEST(GpuEngine, HundredTwentyEightRequestsSurvivePreemption) {
  GQ_REQUIRE_GPU();
  run_128(128 * 64 / 2, true);
}

// A configuration whose largest decode step passes a limit of the GPU plans (40,000 running
// requests x 4 K/V heads: 160,000 work items, more than a plan's 2^17) fails when the runner is
// built, naming the setting, where it would have failed at the first such step of a run. The
// same --max-num-seqs over a pool of 256 pages builds (a step holds at most a request a page), and
// its engine warms up (decode steps of at most 256 requests), and so do half as many requests over
// a pool that holds them all.
TEST(GpuEngine, AConfigurationPastThePlansLimitsFailsAtStartUp) {
  GQ_REQUIRE_GPU();
  RunnerConfig rc = test::tiny_runner_config(4);
  rc.cuda_graph = false;
  rc.max_model_len = 8;
  rc.max_num_seqs = 40000;
  rc.max_num_batched_tokens = 40000;
  rc.num_pages = 40000;  // 64 KB a page (K and V of 2 layers): 2.6 GB
  try {
    test::make_runner(rc, "cuda");
    ADD_FAILURE() << "a runner was built for 40,000 running requests of 4 K/V heads";
  } catch (const gqattn::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("largest decode step"), std::string::npos) << what;
    EXPECT_NE(what.find("--max-num-seqs 40000"), std::string::npos) << what;
    EXPECT_NE(what.find("work items exceed"), std::string::npos) << what;
  }
  rc.num_pages = 256;
  EXPECT_NO_THROW(test::make_runner(rc, "cuda"));
  EXPECT_NO_THROW({ Engine engine(test::make_runner(rc, "cuda")); });
  rc.max_num_seqs = rc.max_num_batched_tokens = 20000;
  rc.num_pages = 20000;
  EXPECT_NO_THROW(test::make_runner(rc, "cuda"));
}

}  // namespace
}  // namespace gqattn::engine
