// Model presets, parameter and byte counts, and the RoPE frequency table.
// Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "config.h"
#include "gqattn/error.h"

namespace gqattn::engine {
namespace {

TEST(ModelConfig, Llama2SevenBHasItsPublishedSize) {
  const ModelConfig mha = model_config("llama2-7b");
  EXPECT_EQ(mha.num_params(), 6738415616);  // Hugging Face's count for Llama-2-7b
  const ModelConfig gqa = model_config("llama2-7b", 8), mqa = model_config("llama2-7b", 1);
  EXPECT_EQ(gqa.num_kv_heads, 8);
  EXPECT_EQ(gqa.group_size(), 4);
  EXPECT_EQ(mha.kv_bytes_per_token(2), 2 * 32 * 4096 * 2);
  EXPECT_EQ(mqa.kv_bytes_per_token(2), 2 * 32 * 128 * 2);
  EXPECT_LT(mqa.num_params(), gqa.num_params());
  EXPECT_EQ(mha.streamed_weight_bytes(2), (mha.num_params() - 32000 * 4096) * 2);
}

TEST(ModelConfig, Llama3EightBHasItsPublishedSize) {
  EXPECT_EQ(model_config("llama3-8b").num_params(), 8030261248);
  EXPECT_EQ(model_config("llama3.1-8b").num_params(), 8030261248);
}

// Sizes a config.json may hold whose parameter count passes int64 (3 x 65536^2 x 715827883 layers):
// saturated, so the CPU path's size check still fails instead of seeing a wrapped negative count.
TEST(ModelConfig, ParameterCountSaturatesInsteadOfWrapping) {
  ModelConfig c = model_config("tiny");
  c.hidden_size = 65536;
  c.intermediate_size = 65536;
  c.num_layers = 715827883;
  c.num_qo_heads = 1;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.vocab_size = 1;
  EXPECT_EQ(c.num_params(), INT64_MAX / 8);
  c.num_layers = 100;  // within range: the exact count
  EXPECT_EQ(c.num_params(), 2 * 65536 + 100 * (65536 * 6 + 2 * 65536 + 3 * int64_t(65536) * 65536 + 2 * 65536) + 65536);
}

TEST(ModelConfig, RejectsUnknownModelsAndHeadCounts) {
  EXPECT_THROW(model_config("gpt2"), Error);
  EXPECT_THROW(model_config("tiny", 3), Error);
  EXPECT_THROW(model_config("llama2-7b", -2), Error);
  ModelConfig c = model_config("tiny");
  c.head_dim = 7;
  EXPECT_THROW(validate(c), Error);
  // Llama-3.1's RoPE scaling: a factor > 0 and low_freq_factor below high_freq_factor.
  ModelConfig scaled = model_config("llama3.1-8b");
  scaled.rope_scaling.factor = 0;
  EXPECT_THROW(validate(scaled), Error);
  scaled = model_config("llama3.1-8b");
  scaled.rope_scaling.high_freq_factor = scaled.rope_scaling.low_freq_factor;
  EXPECT_THROW(validate(scaled), Error);
  scaled.rope_scaling.enabled = false;  // the factors of an unscaled RoPE are not used
  EXPECT_NO_THROW(validate(scaled));
}

TEST(ModelConfig, RopeFrequencies) {
  const ModelConfig c = model_config("llama2-7b");
  const std::vector<double> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[1], std::pow(10000.0, -2.0 / 128), 1e-15);
  // Llama-3-8B: unscaled, theta 500000.
  const std::vector<double> g = rope_inv_freq(model_config("llama3-8b"));
  EXPECT_DOUBLE_EQ(g[0], 1.0);
  EXPECT_NEAR(g[63], std::pow(500000.0, -126.0 / 128), 1e-18);
  // Llama-3.1 keeps high frequencies and divides the lowest by the factor (8).
  const std::vector<double> h = rope_inv_freq(model_config("llama3.1-8b"));
  EXPECT_DOUBLE_EQ(h[0], 1.0);
  EXPECT_EQ(h[1], g[1]);
  EXPECT_NEAR(h[63], std::pow(500000.0, -126.0 / 128) / 8, 1e-18);
}

}  // namespace
}  // namespace gqattn::engine
