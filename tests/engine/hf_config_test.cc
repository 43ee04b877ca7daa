// A checkpoint's config.json against the engine's model: the tiny checkpoint loads beside a
// config.json that matches (as transformers 4.x and 5.x write it) or none; every field the engine
// computes differently fails naming it, its value and the engine's, before any tensor is read;
// Llama-2-7B's and Llama-3.1-8B's published configs match their presets. Read without a preset,
// config.json gives the model: the published ones read as their presets, absent fields as
// LlamaConfig's defaults, and what the engine does not compute fails the same way.
// Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <unistd.h>

#include "engine_test_util.h"
#include "gqattn/error.h"
#include "hf_config.h"
#include "json.h"
#include "safetensors.h"
#include "weights.h"

namespace gqattn::engine {
namespace {

using test::expect_throws_with;

namespace fs = std::filesystem;

using Fields = std::map<std::string, std::string>;  // name -> raw JSON value

// What save_pretrained writes for tests/python/test_engine_vs_transformers.py's tiny Llama
// (transformers 5: RoPE in rope_parameters), less the fields the engine ignores.
Fields tiny_fields() {
  return {{"architectures", R"(["LlamaForCausalLM"])"}, {"attention_bias", "false"}, {"head_dim", "128"},
          {"hidden_act", R"("silu")"}, {"hidden_size", "256"}, {"intermediate_size", "512"},
          {"max_position_embeddings", "2048"}, {"mlp_bias", "false"}, {"model_type", R"("llama")"},
          {"num_attention_heads", "4"}, {"num_hidden_layers", "2"}, {"num_key_value_heads", "2"},
          {"pad_token_id", "null"}, {"rms_norm_eps", "1e-05"},
          {"rope_parameters", R"({"rope_theta": 10000.0, "rope_type": "default"})"},
          {"tie_word_embeddings", "false"}, {"torch_dtype", R"("bfloat16")"}, {"vocab_size", "512"}};
}

// The llama3 rope_scaling (Llama-3.1's values unless given); original < 0 leaves that key out.
std::string llama3_rope(double factor = 8, double low = 1, double high = 4, int original = 8192) {
  std::string s = R"({"rope_type": "llama3", "factor": )" + std::to_string(factor) + R"(, "low_freq_factor": )" +
                  std::to_string(low) + R"(, "high_freq_factor": )" + std::to_string(high);
  return s + (original < 0 ? "" : R"(, "original_max_position_embeddings": )" + std::to_string(original)) + "}";
}

// Meta's published config.json files (the fields the engine reads, and a few it ignores).
Fields llama2_7b_fields() {
  return {{"hidden_act", R"("silu")"}, {"hidden_size", "4096"}, {"intermediate_size", "11008"},
          {"max_position_embeddings", "4096"}, {"model_type", R"("llama")"}, {"num_attention_heads", "32"},
          {"num_hidden_layers", "32"}, {"num_key_value_heads", "32"}, {"pretraining_tp", "1"},
          {"rms_norm_eps", "1e-05"}, {"rope_scaling", "null"}, {"tie_word_embeddings", "false"},
          {"vocab_size", "32000"}};
}
Fields llama3_8b_fields() {
  return {{"hidden_act", R"("silu")"}, {"hidden_size", "4096"}, {"intermediate_size", "14336"},
          {"max_position_embeddings", "8192"}, {"model_type", R"("llama")"}, {"num_attention_heads", "32"},
          {"num_hidden_layers", "32"}, {"num_key_value_heads", "8"}, {"rms_norm_eps", "1e-05"},
          {"rope_theta", "500000.0"}, {"tie_word_embeddings", "false"}, {"vocab_size", "128256"}};
}
Fields llama31_8b_fields() {
  return {{"attention_bias", "false"}, {"hidden_act", R"("silu")"}, {"hidden_size", "4096"},
          {"intermediate_size", "14336"}, {"max_position_embeddings", "131072"}, {"mlp_bias", "false"},
          {"model_type", R"("llama")"}, {"num_attention_heads", "32"}, {"num_hidden_layers", "32"},
          {"num_key_value_heads", "8"}, {"rms_norm_eps", "1e-05"}, {"rope_theta", "500000.0"},
          {"rope_scaling", llama3_rope()}, {"tie_word_embeddings", "false"}, {"vocab_size", "128256"}};
}

// `base` with `changes` applied: a value replaces the field's, an empty one removes the field.
Fields with(Fields base, const Fields& changes) {
  for (const auto& [k, v] : changes) {
    if (v.empty()) {
      base.erase(k);
    } else {
      base[k] = v;
    }
  }
  return base;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

void write_config(const fs::path& dir, const Fields& fields) {
  std::string text = "{";
  for (const auto& [k, v] : fields) text += (text.size() > 1 ? ",\n  \"" : "\n  \"") + k + "\": " + v;
  write_text(dir / "config.json", text + "\n}\n");
}

// A private directory holding the tiny model's random weights (without lm_head.weight if tied).
class HfConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gqattn_hf_config_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_weights(bool tied) const {
    const HostWeights w = random_host_weights(model_, test::kSeed);
    std::vector<SafetensorsTensor> tensors;
    for (const WeightSpec& spec : weight_specs(model_))
      if (!(tied && spec.name == "lm_head.weight")) tensors.push_back({spec.name, "BF16", spec.shape, w.at(spec.name).data()});
    const std::string file = (dir_ / "model.safetensors").string();
    write_safetensors(file, tensors);
    return file;
  }
  // The error load_weights gives for a config.json of tiny_fields() with `changes`.
  void expect_rejected(const Fields& changes, const std::string& needle) const {
    write_config(dir_, with(tiny_fields(), changes));
    expect_throws_with([&] { load_weights(model_, dir_.string()); }, needle);
  }

  const ModelConfig model_ = model_config("tiny");
  fs::path dir_;
};

TEST_F(HfConfigTest, MatchingConfigLoads) {
  const std::string file = write_weights(false);
  const HostWeights expected = random_host_weights(model_, test::kSeed);
  write_config(dir_, tiny_fields());
  EXPECT_EQ(hf_config_path(dir_.string()), (dir_ / "config.json").string());
  EXPECT_EQ(hf_config_path(file), (dir_ / "config.json").string());  // beside a file too
  EXPECT_EQ(load_weights(model_, dir_.string()).at("lm_head.weight"), expected.at("lm_head.weight"));
  EXPECT_EQ(load_weights(model_, file).at("model.norm.weight"), expected.at("model.norm.weight"));
  // transformers 4.x: rope_theta and rope_scaling at the top level; defaults where absent; nulls
  // as absent; a float32 eps; unknown fields ignored.
  write_config(dir_, with(tiny_fields(), {{"rope_parameters", ""}, {"rope_theta", "10000.0"}, {"rope_scaling", "null"},
                                          {"attention_bias", ""}, {"mlp_bias", ""},
                                          {"hidden_act", ""}, {"model_type", ""}, {"rms_norm_eps", "9.99999974738e-06"},
                                          {"max_position_embeddings", "4096"}, {"some_new_field", R"({"x": [true]})"}}));
  EXPECT_NO_THROW(load_weights(model_, dir_.string()));
  write_config(dir_, with(tiny_fields(), {{"num_attention_heads", "4"}, {"num_key_value_heads", "null"}}));
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, "num_key_value_heads is 4");  // null: = heads
  write_config(dir_, with(tiny_fields(), {{"rope_parameters", ""}, {"rope_scaling", R"({"rope_type": "default"})"}}));
  EXPECT_NO_THROW(load_weights(model_, dir_.string()));
  // The runner loads through the same path.
  RunnerConfig rc = test::tiny_runner_config();
  rc.weights.path = dir_.string();
  EXPECT_NO_THROW(test::make_runner(rc));
}

TEST_F(HfConfigTest, WithoutConfigOnlyShapesAreChecked) {
  write_weights(true);
  const HostWeights loaded = load_weights(model_, dir_.string());  // no lm_head: tied, as before
  EXPECT_EQ(loaded.at("lm_head.weight"), loaded.at("model.embed_tokens.weight"));
  EXPECT_EQ(hf_config_path(dir_.string()), "");
}

TEST_F(HfConfigTest, TiedEmbeddingsFollowTheConfig) {
  write_weights(true);
  write_config(dir_, with(tiny_fields(), {{"tie_word_embeddings", "true"}}));
  const HostWeights loaded = load_weights(model_, dir_.string());
  EXPECT_EQ(loaded.at("lm_head.weight"), loaded.at("model.embed_tokens.weight"));
  // Untied (or absent: LlamaConfig's default is false), transformers would make up an lm_head.
  expect_rejected({}, "has no tensor 'lm_head.weight' but " + (dir_ / "config.json").string() +
                          " has tie_word_embeddings false");
  expect_rejected({{"tie_word_embeddings", ""}}, "tie_word_embeddings false");
  expect_rejected({{"tie_word_embeddings", "1"}}, "tie_word_embeddings is not true or false");
}

TEST_F(HfConfigTest, EachMismatchNamesTheField) {
  write_weights(false);
  const std::string choose = "(--model picks the preset: llama2-7b, llama3-8b, llama3.1-8b, tiny)";
  expect_rejected({{"model_type", R"("mistral")"}}, "config.json: model_type is \"mistral\", but the engine computes LlamaForCausalLM only");
  expect_rejected({{"hidden_size", "512"}}, "config.json: hidden_size is 512, but --model tiny has 256 " + choose);
  expect_rejected({{"hidden_size", R"("256")"}}, "config.json: hidden_size is not an integer");
  expect_rejected({{"num_hidden_layers", "3"}}, "num_hidden_layers is 3, but --model tiny has 2");
  expect_rejected({{"num_attention_heads", "2"}}, "num_attention_heads is 2, but --model tiny has 4");
  expect_rejected({{"num_key_value_heads", "1"}}, "num_key_value_heads is 1, but --model tiny has num_kv_heads 2 (set --num-kv-heads 1)");
  expect_rejected({{"head_dim", "64"}}, "head_dim is 64, but --model tiny has 128");
  expect_rejected({{"head_dim", ""}}, "head_dim is 64, but --model tiny has 128");  // hidden / heads
  expect_rejected({{"intermediate_size", "1024"}}, "intermediate_size is 1024, but --model tiny has 512");
  expect_rejected({{"vocab_size", "32000"}}, "vocab_size is 32000, but --model tiny has 512");
  expect_rejected({{"vocab_size", ""}}, "vocab_size is 32000, but --model tiny has 512");  // LlamaConfig's default
  expect_rejected({{"rms_norm_eps", "1e-06"}}, "rms_norm_eps is 1e-06, but --model tiny computes with 1e-05 " + choose);
  expect_rejected({{"rms_norm_eps", ""}}, "rms_norm_eps is 1e-06");
  expect_rejected({{"rms_norm_eps", "1.00002e-05"}}, "rms_norm_eps is 1.00002e-05");
  expect_rejected({{"rope_parameters", R"({"rope_theta": 500000.0, "rope_type": "default"})"}},
                  "rope_parameters.rope_theta is 500000, but --model tiny computes with 10000");
  expect_rejected({{"rope_parameters", ""}, {"rope_theta", "500000.0"}}, "config.json: rope_theta is 500000");
  expect_rejected({{"rope_parameters", ""}, {"rope_scaling", R"({"type": "linear", "factor": 2.0})"}},
                  "rope_scaling.type is \"linear\", but the engine implements only unscaled RoPE and Llama-3.1's");
  expect_rejected({{"rope_parameters", R"({"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0})"}},
                  "rope_parameters.rope_type is \"yarn\"");
  expect_rejected({{"rope_scaling", llama3_rope()}},
                  "rope_scaling.rope_type is \"llama3\", but --model tiny computes unscaled RoPE");
  expect_rejected({{"rope_parameters", "[]"}}, "rope_parameters is not an object");
  expect_rejected({{"partial_rotary_factor", "0.5"}}, "partial_rotary_factor is 0.5, but the engine rotates the whole head");
  expect_rejected({{"rope_parameters", R"({"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.25})"}},
                  "rope_parameters.partial_rotary_factor is 0.25");
  expect_rejected({{"hidden_act", R"("gelu")"}}, "hidden_act is \"gelu\", but the engine's MLP computes silu only");
  expect_rejected({{"attention_bias", "true"}}, "attention_bias is true, but the engine's projections have no bias");
  expect_rejected({{"mlp_bias", "true"}}, "mlp_bias is true");
  expect_rejected({{"max_position_embeddings", "1024"}}, "max_position_embeddings is 1024, but --model tiny serves up to 2048 positions");
  write_config(dir_, with(tiny_fields(), {{"max_position_embeddings", ""}}));  // LlamaConfig's 2048: tiny's
  EXPECT_NO_THROW(load_weights(model_, dir_.string()));
}

// The check comes before any tensor is read: a broken shard does not hide a config mismatch.
TEST_F(HfConfigTest, ConfigIsCheckedBeforeTheWeights) {
  write_text(dir_ / "model.safetensors", "not a safetensors file");
  expect_rejected({{"rms_norm_eps", "1e-06"}}, "rms_norm_eps is 1e-06");
  write_config(dir_, tiny_fields());
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, "model.safetensors: header length");
}

TEST_F(HfConfigTest, MalformedJsonNamesTheFile) {
  write_weights(false);
  const std::string path = (dir_ / "config.json").string();
  write_text(path, R"({"hidden_size": 256,})");
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, "--weights: " + path + ": bad JSON at byte 20: expected a member name");
  write_text(path, "");
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, path + ": bad JSON at byte 0: unexpected end");
  write_text(path, R"({"hidden_size": 256} x)");
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, path + ": bad JSON at byte 21: trailing characters");
  write_text(path, R"({"a": 1, "a": 2})");
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, "duplicate member name 'a'");
  write_text(path, "[256]");
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, path + ": not a JSON object");
  fs::remove(path);
  fs::create_directory(path);  // a directory named config.json
  expect_throws_with([&] { load_weights(model_, dir_.string()); }, path + ": cannot read");
}

// The published configs match their presets: Llama-3-8B's RoPE unscaled, Llama-3.1-8B's rescaled.
TEST_F(HfConfigTest, PublishedConfigsMatchTheirPresets) {
  const std::string path = (dir_ / "config.json").string();
  write_config(dir_, llama2_7b_fields());
  EXPECT_NO_THROW(check_hf_config(model_config("llama2-7b"), path));
  expect_throws_with([&] { check_hf_config(model_config("llama2-7b", 8), path); },
                     "num_key_value_heads is 32, but --model llama2-7b has num_kv_heads 8 (set --num-kv-heads 32)");
  expect_throws_with([&] { check_hf_config(model_config("llama3-8b"), path); },
                     "intermediate_size is 11008, but --model llama3-8b has 14336");
  EXPECT_FALSE(check_hf_config(model_config("llama2-7b"), path).tie_word_embeddings);

  // Meta-Llama-3-8B: no scaling; llama3.1-8b would rotate by other angles.
  write_config(dir_, llama3_8b_fields());
  EXPECT_NO_THROW(check_hf_config(model_config("llama3-8b"), path));
  expect_throws_with([&] { check_hf_config(model_config("llama3.1-8b"), path); },
                     "rope_scaling is absent (unscaled RoPE), but --model llama3.1-8b computes Llama-3.1's \"llama3\" RoPE scaling");
  write_config(dir_, with(llama3_8b_fields(), {{"rope_scaling", "null"}}));
  EXPECT_NO_THROW(check_hf_config(model_config("llama3-8b"), path));

  const ModelConfig l31 = model_config("llama3.1-8b");
  write_config(dir_, llama31_8b_fields());
  EXPECT_NO_THROW(check_hf_config(l31, path));
  expect_throws_with([&] { check_hf_config(model_config("llama3-8b"), path); },
                     "rope_scaling.rope_type is \"llama3\", but --model llama3-8b computes unscaled RoPE");
  // transformers 5 writes the same RoPE as rope_parameters.
  write_config(dir_, with(llama31_8b_fields(), {{"rope_theta", ""}, {"rope_scaling", ""},
                                                {"rope_parameters", R"({"factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                                   "rope_theta": 500000.0, "rope_type": "llama3"})"}}));
  EXPECT_NO_THROW(check_hf_config(l31, path));
  const auto rejects = [&](const Fields& changes, const std::string& needle) {
    write_config(dir_, with(llama31_8b_fields(), changes));
    expect_throws_with([&] { check_hf_config(l31, path); }, needle);
  };
  rejects({{"rope_scaling", R"({"rope_type": "default"})"}}, "rope_scaling.rope_type is \"default\", but --model llama3.1-8b");
  rejects({{"rope_scaling", llama3_rope(4)}}, "rope_scaling.factor is 4, but --model llama3.1-8b computes with 8");
  rejects({{"rope_scaling", llama3_rope(8, 2)}}, "rope_scaling.low_freq_factor is 2");
  rejects({{"rope_scaling", llama3_rope(8, 1, 2)}}, "rope_scaling.high_freq_factor is 2");
  rejects({{"rope_scaling", llama3_rope(8, 1, 4, 4096)}},
          "rope_scaling.original_max_position_embeddings is 4096, but --model llama3.1-8b has 8192");
  // Absent, the original length is max_position_embeddings (transformers 5).
  rejects({{"rope_scaling", llama3_rope(8, 1, 4, -1)}}, "rope_scaling.original_max_position_embeddings is 131072");
  rejects({{"rope_scaling", R"({"factor": 8.0, "high_freq_factor": 4.0, "rope_type": "llama3"})"}},
          "rope_scaling.low_freq_factor is missing");
  rejects({{"rope_theta", "10000.0"}}, "rope_theta is 10000, but --model llama3.1-8b computes with 500000");
}

// Every field of `read` but the name and max_position is the preset's.
void expect_preset_model(const ModelConfig& read, const ModelConfig& preset) {
  EXPECT_EQ(read.hidden_size, preset.hidden_size);
  EXPECT_EQ(read.num_layers, preset.num_layers);
  EXPECT_EQ(read.num_qo_heads, preset.num_qo_heads);
  EXPECT_EQ(read.num_kv_heads, preset.num_kv_heads);
  EXPECT_EQ(read.head_dim, preset.head_dim);
  EXPECT_EQ(read.intermediate_size, preset.intermediate_size);
  EXPECT_EQ(read.vocab_size, preset.vocab_size);
  EXPECT_EQ(read.rope_theta, preset.rope_theta);
  EXPECT_EQ(read.rms_norm_eps, preset.rms_norm_eps);
  EXPECT_EQ(read.rope_scaling.enabled, preset.rope_scaling.enabled);
  EXPECT_EQ(read.rope_scaling.factor, preset.rope_scaling.factor);
  EXPECT_EQ(read.rope_scaling.low_freq_factor, preset.rope_scaling.low_freq_factor);
  EXPECT_EQ(read.rope_scaling.high_freq_factor, preset.rope_scaling.high_freq_factor);
  EXPECT_EQ(read.rope_scaling.original_max_position, preset.rope_scaling.original_max_position);
  EXPECT_EQ(rope_inv_freq(read), rope_inv_freq(preset));
}

// The published configs read as their presets; max_position is max_position_embeddings, the name
// the checkpoint directory's; read, then checked against itself, a config passes.
TEST_F(HfConfigTest, PublishedConfigsReadAsTheirPresets) {
  const std::string path = (dir_ / "config.json").string();
  const struct {
    Fields fields;
    const char* preset;
    int max_position;
  } published[] = {{llama2_7b_fields(), "llama2-7b", 4096},
                   {llama3_8b_fields(), "llama3-8b", 8192},
                   {llama31_8b_fields(), "llama3.1-8b", 131072}};
  for (const auto& p : published) {
    SCOPED_TRACE(p.preset);
    write_config(dir_, p.fields);
    const HfConfig hf = read_hf_config(path);
    expect_preset_model(hf.model, model_config(p.preset));
    EXPECT_EQ(hf.model.name, dir_.filename().string());
    EXPECT_EQ(hf.model.max_position, p.max_position);
    EXPECT_FALSE(hf.tie_word_embeddings);
    EXPECT_NO_THROW(check_hf_config(hf.model, path));
  }
  // transformers 5's rope_parameters: the same model, the keys it came from remembered.
  write_config(dir_, with(llama31_8b_fields(), {{"rope_theta", ""}, {"rope_scaling", ""},
                                                {"rope_parameters", R"({"factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                                   "rope_theta": 500000.0, "rope_type": "llama3"})"}}));
  const HfConfig hf = read_hf_config(path);
  expect_preset_model(hf.model, model_config("llama3.1-8b"));
  EXPECT_EQ(hf.rope_theta_key, "rope_parameters.rope_theta");
  EXPECT_EQ(hf.rope_key, "rope_parameters");
  EXPECT_EQ(hf.rope_type_key, "rope_parameters.rope_type");
  EXPECT_NO_THROW(check_hf_config(hf.model, path));
  // The name of the directory holding config.json, whichever way the path is spelled.
  EXPECT_EQ(read_hf_config((dir_ / "." / "config.json").string()).model.name, dir_.filename().string());
  // In the Hugging Face cache the name is the repository's, not the snapshot's commit.
  const fs::path snapshot = dir_ / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0e9e39f249a16976918f6564b8830bc894c89659";
  fs::create_directories(snapshot);
  write_config(snapshot, tiny_fields());
  EXPECT_EQ(read_hf_config((snapshot / "config.json").string()).model.name, "meta-llama/Llama-3.1-8B");
}

TEST_F(HfConfigTest, AbsentFieldsReadAsLlamaConfigDefaults) {
  const std::string path = (dir_ / "config.json").string();
  write_config(dir_, {});
  const HfConfig hf = read_hf_config(path);
  ModelConfig defaults = model_config("llama2-7b");  // LlamaConfig's shapes, but eps 1e-6
  defaults.rms_norm_eps = 1e-6;
  expect_preset_model(hf.model, defaults);
  EXPECT_EQ(hf.model.max_position, 2048);
  EXPECT_FALSE(hf.tie_word_embeddings);
  EXPECT_EQ(hf.rope_theta_key, "rope_theta");
  EXPECT_EQ(hf.rope_type_key, "");  // no RoPE object
  // num_key_value_heads: num_attention_heads; head_dim: hidden_size / num_attention_heads; the
  // llama3 original length: max_position_embeddings (transformers 5).
  write_config(dir_, with(tiny_fields(), {{"num_key_value_heads", "null"}, {"head_dim", ""}, {"tie_word_embeddings", "true"},
                                          {"rope_parameters", llama3_rope(8, 1, 4, -1)}}));
  const ModelConfig m = read_hf_config(path).model;
  EXPECT_EQ(m.num_kv_heads, 4);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_TRUE(m.rope_scaling.enabled);
  EXPECT_EQ(m.rope_scaling.original_max_position, 2048);
  EXPECT_TRUE(read_hf_config(path).tie_word_embeddings);
}

// Without a preset to compare with, what the engine does not compute still fails naming the field,
// and so does a model validate() rejects.
TEST_F(HfConfigTest, ReadingRejectsWhatTheEngineDoesNotCompute) {
  const std::string path = (dir_ / "config.json").string();
  const auto rejects = [&](const Fields& changes, const std::string& needle) {
    write_config(dir_, with(tiny_fields(), changes));
    expect_throws_with([&] { read_hf_config(path); }, "--weights: " + path + ": " + needle);
  };
  rejects({{"model_type", R"("mistral")"}}, "model_type is \"mistral\", but the engine computes LlamaForCausalLM only");
  rejects({{"hidden_act", R"("gelu")"}}, "hidden_act is \"gelu\", but the engine's MLP computes silu only");
  rejects({{"attention_bias", "true"}}, "attention_bias is true, but the engine's projections have no bias");
  rejects({{"mlp_bias", "true"}}, "mlp_bias is true");
  rejects({{"partial_rotary_factor", "0.5"}}, "partial_rotary_factor is 0.5, but the engine rotates the whole head");
  rejects({{"rope_parameters", R"({"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0})"}},
          "rope_parameters.rope_type is \"yarn\", but the engine implements only unscaled RoPE and Llama-3.1's");
  rejects({{"rope_parameters", ""}, {"rope_scaling", R"({"type": "linear", "factor": 2.0})"}}, "rope_scaling.type is \"linear\"");
  rejects({{"rope_parameters", R"({"factor": 8.0, "low_freq_factor": 1.0, "rope_type": "llama3"})"}},
          "rope_parameters.high_freq_factor is missing (\"llama3\" needs it)");
  rejects({{"rope_parameters", "[]"}}, "rope_parameters is not an object");
  rejects({{"vocab_size", "512.5"}}, "vocab_size is not an integer");
  rejects({{"hidden_size", "4294967552"}}, "hidden_size is 4294967552, but the engine holds it in 32 bits");
  rejects({{"num_key_value_heads", "3"}}, "num_kv_heads (3) must divide num_qo_heads (4)");
  rejects({{"head_dim", "0"}}, "head_dim (0) must be even and > 0");
  rejects({{"head_dim", "1073741824"}}, "num_qo_heads x head_dim (4 x 1073741824) must be at most 715827882");
  rejects({{"rope_parameters", llama3_rope(8, 4, 1)}}, "rope_scaling low_freq_factor (4) must be > 0 and below high_freq_factor (1)");
}

// A model read from config.json loads that checkpoint (checking config.json against itself) and serves.
TEST_F(HfConfigTest, ModelFromConfigLoadsAndServes) {
  write_weights(false);
  write_config(dir_, with(tiny_fields(), {{"rope_parameters", llama3_rope()}, {"rope_theta", "500000.0"},
                                          {"max_position_embeddings", "131072"}}));
  const ModelConfig m = read_hf_config((dir_ / "config.json").string()).model;
  EXPECT_TRUE(m.rope_scaling.enabled);
  const HostWeights expected = random_host_weights(model_, test::kSeed);
  EXPECT_EQ(load_weights(m, dir_.string()).at("lm_head.weight"), expected.at("lm_head.weight"));
  RunnerConfig rc = test::tiny_runner_config();
  rc.model = m;
  rc.weights.path = dir_.string();
  EXPECT_NO_THROW(test::make_runner(rc));
}

TEST(Json, ParsesTheFormsAConfigUses) {
  const Json j = parse_json(R"({"a": true, "b": false, "c": null, "d": -3, "e": 1.5, "f": 9007199254740992})", "t");
  ASSERT_NE(j.find("a"), nullptr);
  EXPECT_TRUE(j.find("a")->boolean);
  EXPECT_EQ(j.find("b")->kind, Json::Kind::kBool);
  EXPECT_FALSE(j.find("b")->boolean);
  EXPECT_EQ(j.find("c")->kind, Json::Kind::kNull);
  EXPECT_EQ(j.find("d")->integer(), -3);
  EXPECT_EQ(j.find("e")->integer(), std::nullopt);
  EXPECT_EQ(j.find("f")->integer(), std::nullopt);  // 2^53: not exact past it
  EXPECT_EQ(j.find("g"), nullptr);
  expect_throws_with([] { parse_json("tru", "ctx"); }, "ctx at byte 0: unexpected character 't'");
}

}  // namespace
}  // namespace gqattn::engine
