// The safetensors reader/writer and weight loading: a tiny checkpoint written by the test, read
// back bit for bit, and served with the same logits as the random weights it holds; corrupt files
// and mismatched shapes rejected with messages naming the problem. Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "engine_test_util.h"
#include "gqattn/error.h"
#include "safetensors.h"
#include "weights.h"

namespace gqattn::engine {
namespace {

using test::expect_throws_with;

std::string temp_path(const std::string& name) {
  const std::string file = "gqattn_engine_test_" + std::to_string(::getpid()) + "_" + name;
  return (std::filesystem::temp_directory_path() / file).string();
}

// A file of an 8-byte header length, `header` as given and `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const std::string path = temp_path("rt.safetensors");
  const std::vector<float> a = {1.5f, -2.f, 3.25f, 0.f, 7.f, -0.5f};
  const std::vector<uint16_t> b = {0x3F80, 0xC000, 0x7F80};
  write_safetensors(path, {{"a", "F32", {2, 3}, a.data()}, {"layer.b", "BF16", {3}, b.data()}}, {{"format", "pt"}});
  const SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), 2u);
  const SafetensorsEntry* ea = f.find("a");
  ASSERT_NE(ea, nullptr);
  EXPECT_EQ(ea->dtype, "F32");
  EXPECT_EQ(ea->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> a2(6);
  f.read(*ea, a2.data());
  EXPECT_EQ(std::memcmp(a.data(), a2.data(), sizeof(float) * 6), 0);
  std::vector<uint16_t> b2(3);
  f.read(*f.find("layer.b"), b2.data());
  EXPECT_EQ(b, b2);
  EXPECT_EQ(f.find("missing"), nullptr);
  std::remove(path.c_str());
}

TEST(Safetensors, RejectsCorruptFiles) {
  const std::string path = temp_path("bad.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = 1000;  // longer than the file
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << "{}";
  }
  expect_throws_with([&] { SafetensorsFile f(path); }, "header length");
  write_raw(path, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'x': holds 8 bytes");
  write_raw(path, R"({"x":{"dtype":"F4","shape":[8],"data_offsets":[0,8]}})", 8);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'x': unknown dtype 'F4'");
  std::remove(path.c_str());
}

// Hostile headers: each a gqattn::Error naming the file, never a crash or a silently odd parse.
TEST(Safetensors, RejectsMalformedJson) {
  const std::string path = temp_path("json.safetensors");
  const auto rejects = [&](const std::string& header, const std::string& needle) {
    write_raw(path, header, 8);
    expect_throws_with([&] { SafetensorsFile f(path); }, needle);
  };
  rejects(std::string(1 << 20, '['), "nested deeper than");  // no stack overflow
  std::string many = "{\"x\":[";  // 1.5M values: bounded, not ~150 MB of parsed nodes
  for (int i = 0; i < 3 << 19; ++i) many += "0,";
  rejects(many + "0]}", "more than 1048576 values");
  rejects(R"({"\uzzzz":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", "bad \\u escape");
  rejects(R"({"\u00zz":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", "bad \\u escape");
  rejects(R"({"\ud83d":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", "unpaired surrogate");
  rejects(R"({"x":{"dtype":"U8","shape":[8],"data_offsets":[0,8-100]}})", "bad number");
  // A duplicate name is ambiguous (other readers keep the last); a duplicate key of an entry too.
  rejects(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"x":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
          "duplicate member name 'x'");
  rejects(R"({"x":{"dtype":"U8","shape":[2],"shape":[4],"data_offsets":[0,8]}})", "duplicate member name 'shape'");
  std::remove(path.c_str());
}

TEST(Safetensors, DecodesEscapedNames) {
  const std::string path = temp_path("names.safetensors");
  write_raw(path, R"({"caf\u00e9.\ud83d\ude00":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8);
  const SafetensorsFile f(path);
  EXPECT_NE(f.find("caf\xC3\xA9.\xF0\x9F\x98\x80"), nullptr);  // UTF-8, as the name is written unescaped
  std::remove(path.c_str());
}

// Sizes are computed without overflow: a shape whose element count wraps cannot pass for a small
// tensor.
TEST(Safetensors, RejectsShapesTooLargeForTheFile) {
  const std::string path = temp_path("shape.safetensors");
  write_raw(path, R"({"x":{"dtype":"BF16","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'x' shape: expected a non-negative integer");
  write_raw(path, R"({"x":{"dtype":"U8","shape":[1e30],"data_offsets":[0,0]}})", 0);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'x' shape: expected a non-negative integer");
  write_raw(path, R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'x': holds 0 bytes but U8 with its shape needs 2^64 or more");
  write_raw(path, R"({"x":{"dtype":"F32","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(SafetensorsFile(path).find("x")->numel(), 0);
  std::remove(path.c_str());
}

// As the format requires: the tensors tile the data section, so no two share bytes.
TEST(Safetensors, RejectsOverlapsAndGapsInTheData) {
  const std::string path = temp_path("layout.safetensors");
  write_raw(path, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 8);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'b': data_offsets [2, 6) overlap tensor 'a'");
  write_raw(path, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})", 8);
  expect_throws_with([&] { SafetensorsFile f(path); }, "tensor 'b': data_offsets [6, 8) leave a gap after byte 4");
  write_raw(path, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 8);
  expect_throws_with([&] { SafetensorsFile f(path); }, "4 bytes after the last tensor");
  // Empty tensors may sit anywhere between others.
  write_raw(path, R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 8);
  EXPECT_EQ(SafetensorsFile(path).entries().size(), 3u);
  std::remove(path.c_str());
}

TEST(Safetensors, TinyCheckpointLoadsBitForBitAndServesTheSameLogits) {
  const RunnerConfig random_cfg = test::tiny_runner_config();
  const HostWeights weights = random_host_weights(random_cfg.model, test::kSeed);
  // In a directory of its own: a config.json beside the file would be checked too.
  const std::filesystem::path dir = temp_path("tiny");
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tiny.safetensors").string();
  save_weights(random_cfg.model, weights, path);

  const HostWeights loaded = load_weights(random_cfg.model, path);
  ASSERT_EQ(loaded.tensors.size(), weights.tensors.size());
  for (const auto& [name, bits] : weights.tensors) EXPECT_EQ(loaded.at(name), bits) << name;

  RunnerConfig file_cfg = random_cfg;
  file_cfg.weights.path = path;
  auto from_random = test::make_runner(random_cfg);
  auto from_file = test::make_runner(file_cfg);
  const std::vector<std::vector<int32_t>> seq = test::make_prompts({12}, random_cfg.model.vocab_size, 9);
  const auto a = test::run_teacher_forced(*from_random, seq, 8, 8);
  const auto b = test::run_teacher_forced(*from_file, seq, 8, 8);
  EXPECT_EQ(a, b);

  // Shapes are checked against the configuration (here: 1 K/V head instead of 2).
  expect_throws_with([&] { load_weights(model_config("tiny", 1), path); }, "self_attn.k_proj.weight' has shape [256, 256]");
  std::remove(path.c_str());
  expect_throws_with([&] { load_weights(random_cfg.model, path); }, "does not exist");
  std::filesystem::remove_all(dir);
}

// A directory of shards, with tied embeddings (no lm_head.weight); a tensor in two shards or one
// the configuration has no place for (here a third layer) is rejected, not silently dropped.
TEST(Safetensors, ShardedTiedCheckpointLoadsAndStrayTensorsAreRejected) {
  namespace fs = std::filesystem;
  const ModelConfig model = model_config("tiny");
  const HostWeights weights = random_host_weights(model, test::kSeed);
  const fs::path dir = temp_path("shards");
  fs::create_directories(dir);
  std::vector<SafetensorsTensor> shard[2];
  for (const WeightSpec& spec : weight_specs(model))
    if (spec.name != "lm_head.weight")
      shard[spec.name.find("layers.1.") == std::string::npos].push_back(
          {spec.name, "BF16", spec.shape, weights.at(spec.name).data()});
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), shard[0]);
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), shard[1]);
  const HostWeights loaded = load_weights(model, dir.string());
  for (const auto& [name, bits] : weights.tensors)
    EXPECT_EQ(loaded.at(name), weights.at(name == "lm_head.weight" ? "model.embed_tokens.weight" : name)) << name;

  const std::string extra = (dir / "model-00003-of-00003.safetensors").string();
  const std::vector<uint16_t>& norm = weights.at("model.norm.weight");
  write_safetensors(extra, {{"model.norm.weight", "BF16", {model.hidden_size}, norm.data()}});
  expect_throws_with([&] { load_weights(model, dir.string()); }, "tensor 'model.norm.weight' is in both ");
  write_safetensors(extra, {{"model.layers.2.input_layernorm.weight", "BF16", {model.hidden_size}, norm.data()},
                            {"model.layers.0.self_attn.rotary_emb.inv_freq", "BF16", {2}, norm.data()}});
  expect_throws_with([&] { load_weights(model, dir.string()); },
                     "model-00003-of-00003.safetensors: tensor 'model.layers.2.input_layernorm.weight' has no place in tiny");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gqattn::engine
