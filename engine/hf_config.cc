// config.json against the engine's ModelConfig. Layer: engine (host-only).
#include "hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "gqattn/error.h"
#include "json.h"

namespace gqattn::engine {

namespace {

// A config.json is a few KB; larger is not one.
constexpr uintmax_t kMaxConfigBytes = uintmax_t(16) << 20;
// eps, theta and the RoPE factors are written in decimal, sometimes from a float32.
constexpr double kRelTol = 1e-6;

// transformers' LlamaConfig defaults, for an absent (or null) field.
constexpr int64_t kDefaultHidden = 4096, kDefaultLayers = 32, kDefaultHeads = 32, kDefaultIntermediate = 11008,
                  kDefaultVocab = 32000, kDefaultMaxPosition = 2048;
constexpr double kDefaultEps = 1e-6, kDefaultTheta = 10000.0;

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

class Checker {
 public:
  Checker(const ModelConfig& m, const std::string& path, Json root) : m_(m), path_(path), root_(std::move(root)) {
    GQ_CHECK(root_.kind == Json::Kind::kObject, "--weights: ", path_, ": not a JSON object");
    std::string names;
    for (const std::string& n : model_names()) names += (names.empty() ? "" : ", ") + n;
    model_ = "--model " + m_.name;
    choose_ = "--model picks the preset: " + names;
  }

  HfConfig check() {
    const std::string model_type = string_field(root_, "model_type", "llama");
    if (model_type != "llama")
      fail("model_type", quoted(model_type), "the engine computes LlamaForCausalLM only (\"llama\")");

    const int64_t hidden = int_field(root_, "hidden_size", kDefaultHidden);
    const int64_t heads = int_field(root_, "num_attention_heads", kDefaultHeads);
    expect_int("hidden_size", hidden, m_.hidden_size);
    expect_int("num_hidden_layers", int_field(root_, "num_hidden_layers", kDefaultLayers), m_.num_layers);
    expect_int("num_attention_heads", heads, m_.num_qo_heads);
    expect_int("head_dim", int_field(root_, "head_dim", heads > 0 ? hidden / heads : 0), m_.head_dim);
    expect_int("intermediate_size", int_field(root_, "intermediate_size", kDefaultIntermediate), m_.intermediate_size);
    expect_int("vocab_size", int_field(root_, "vocab_size", kDefaultVocab), m_.vocab_size);
    // After the preset's dimensions, so that --num-kv-heads is suggested only for the right preset.
    const int64_t kv_heads = int_field(root_, "num_key_value_heads", heads);
    if (kv_heads != m_.num_kv_heads)
      fail("num_key_value_heads", std::to_string(kv_heads),
           model_ + " has num_kv_heads " + std::to_string(m_.num_kv_heads) + " (set --num-kv-heads " +
               std::to_string(kv_heads) + ")");
    expect_close("rms_norm_eps", number_field(root_, "rms_norm_eps", kDefaultEps), m_.rms_norm_eps);
    check_rope();

    const std::string act = string_field(root_, "hidden_act", "silu");
    if (act != "silu") fail("hidden_act", quoted(act), "the engine's MLP computes silu only");
    for (const char* bias : {"attention_bias", "mlp_bias"})
      if (bool_field(root_, bias, false)) fail(bias, "true", "the engine's projections have no bias");

    const int64_t max_position = int_field(root_, "max_position_embeddings", kDefaultMaxPosition);
    if (max_position < m_.max_position)
      fail("max_position_embeddings", std::to_string(max_position),
           model_ + " serves up to " + std::to_string(m_.max_position) + " positions (" + choose_ + ")");

    HfConfig out;
    out.tie_word_embeddings = bool_field(root_, "tie_word_embeddings", false);
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& value, const std::string& engine) const {
    throw Error("--weights: " + path_ + ": " + field + " is " + value + ", but " + engine);
  }
  void expect_int(const std::string& field, int64_t value, int64_t engine) const {
    if (value != engine)
      fail(field, std::to_string(value), model_ + " has " + std::to_string(engine) + " (" + choose_ + ")");
  }
  void expect_close(const std::string& field, double value, double engine) const {
    if (std::fabs(value - engine) > kRelTol * std::max(std::fabs(value), std::fabs(engine)))
      fail(field, num_str(value), model_ + " computes with " + num_str(engine) + " (" + choose_ + ")");
  }

  // An object's member, nullptr when absent or null (transformers takes null for its default).
  static const Json* member(const Json& obj, const std::string& name) {
    const Json* v = obj.find(name);
    return v != nullptr && v->kind != Json::Kind::kNull ? v : nullptr;
  }
  [[noreturn]] void bad_type(const std::string& name, const char* expected) const {
    throw Error("--weights: " + path_ + ": " + name + " is not " + expected);
  }
  int64_t int_field(const Json& obj, const std::string& name, int64_t fallback, const std::string& prefix = "") const {
    const Json* v = member(obj, name);
    if (v == nullptr) return fallback;
    const std::optional<int64_t> n = v->integer();
    if (!n) bad_type(prefix + name, "an integer");
    return *n;
  }
  double number_field(const Json& obj, const std::string& name, double fallback, const std::string& prefix = "") const {
    const Json* v = member(obj, name);
    if (v == nullptr) return fallback;
    if (v->kind != Json::Kind::kNumber) bad_type(prefix + name, "a number");
    return v->number;
  }
  std::string string_field(const Json& obj, const std::string& name, const std::string& fallback,
                           const std::string& prefix = "") const {
    const Json* v = member(obj, name);
    if (v == nullptr) return fallback;
    if (v->kind != Json::Kind::kString) bad_type(prefix + name, "a string");
    return v->str;
  }
  bool bool_field(const Json& obj, const std::string& name, bool fallback) const {
    const Json* v = member(obj, name);
    if (v == nullptr) return fallback;
    if (v->kind != Json::Kind::kBool) bad_type(name, "true or false");
    return v->boolean;
  }

  // transformers reads RoPE from rope_scaling (until 4.x) or else rope_parameters (5.x, which
  // holds rope_theta too), rope_theta from there or else the top level.
  void check_rope() const {
    std::string field = "rope_scaling";
    const Json* rope = member(root_, field);
    if ((rope == nullptr || (rope->kind == Json::Kind::kObject && rope->members.empty())) &&
        member(root_, "rope_parameters") != nullptr) {
      field = "rope_parameters";
      rope = member(root_, field);
    }
    static const Json kNone;  // no members
    if (rope != nullptr && rope->kind != Json::Kind::kObject) bad_type(field, "an object");
    const Json& r = rope != nullptr ? *rope : kNone;
    const std::string p = field + ".";

    const bool theta_in_rope = member(r, "rope_theta") != nullptr;
    const double theta =
        theta_in_rope ? number_field(r, "rope_theta", 0, p) : number_field(root_, "rope_theta", kDefaultTheta);
    expect_close(theta_in_rope ? p + "rope_theta" : "rope_theta", theta, m_.rope_theta);
    // RoPE on the first part of each head only (transformers reads it for every RoPE type).
    const bool partial_in_rope = member(r, "partial_rotary_factor") != nullptr;
    const double partial = partial_in_rope ? number_field(r, "partial_rotary_factor", 1.0, p)
                                           : number_field(root_, "partial_rotary_factor", 1.0);
    if (partial != 1.0)
      fail(partial_in_rope ? p + "partial_rotary_factor" : "partial_rotary_factor", num_str(partial),
           "the engine rotates the whole head (1)");

    const std::string type_key =
        member(r, "rope_type") != nullptr || member(r, "type") == nullptr ? "rope_type" : "type";
    const std::string type = string_field(r, type_key, "default", p);
    const RopeScaling& s = m_.rope_scaling;
    if (type != "default" && type != "llama3")
      fail(p + type_key, quoted(type), "the engine implements only unscaled RoPE and Llama-3.1's \"llama3\" scaling");
    if (type == "default" && s.enabled)
      fail(rope != nullptr ? p + type_key : field, rope != nullptr ? quoted(type) : "absent (unscaled RoPE)",
           model_ + " computes Llama-3.1's \"llama3\" RoPE scaling (" + choose_ + ")");
    if (type == "default") return;
    if (!s.enabled) fail(p + type_key, quoted(type), model_ + " computes unscaled RoPE (" + choose_ + ")");
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
      if (member(r, key) == nullptr)
        throw Error("--weights: " + path_ + ": " + p + key + " is missing (\"llama3\" needs it)");
    expect_close(p + "factor", number_field(r, "factor", 0, p), s.factor);
    expect_close(p + "low_freq_factor", number_field(r, "low_freq_factor", 0, p), s.low_freq_factor);
    expect_close(p + "high_freq_factor", number_field(r, "high_freq_factor", 0, p), s.high_freq_factor);
    // transformers 5 falls back to max_position_embeddings; 4.x requires the key.
    const int64_t original = int_field(r, "original_max_position_embeddings",
                                       int_field(root_, "max_position_embeddings", kDefaultMaxPosition), p);
    expect_int(p + "original_max_position_embeddings", original, s.original_max_position);
  }

  const ModelConfig& m_;
  std::string path_;
  Json root_;
  std::string model_;   // "--model tiny"
  std::string choose_;  // the remedy for a preset's number
};

}  // namespace

std::string hf_config_path(const std::string& weights_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path weights(weights_path);
  fs::path dir = fs::is_directory(weights, ec) ? weights : weights.parent_path();
  if (dir.empty()) dir = ".";
  const fs::path config = dir / "config.json";
  return fs::exists(config, ec) ? config.string() : std::string();
}

HfConfig check_hf_config(const ModelConfig& config, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  GQ_CHECK(!ec && size <= kMaxConfigBytes, "--weights: ", path, ": ",
           ec ? "cannot read (" + ec.message() + ")" : "larger than " + std::to_string(kMaxConfigBytes) + " bytes");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  GQ_CHECK(in.good(), "--weights: ", path, ": cannot read");
  return Checker(config, path, parse_json(text.str(), "--weights: " + path + ": bad JSON")).check();
}

}  // namespace gqattn::engine
