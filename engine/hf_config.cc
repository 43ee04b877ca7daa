// config.json read into a ModelConfig, and that reading checked against a --model preset.
// Layer: engine (host-only).
#include "hf_config.h"

#include <algorithm>
#include <climits>
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

namespace fs = std::filesystem;

// A config.json is a few KB; larger is not one.
constexpr uintmax_t kMaxConfigBytes = uintmax_t(16) << 20;
// eps, theta and the RoPE factors are written in decimal, sometimes from a float32.
constexpr double kRelTol = 1e-6;

// transformers' LlamaConfig defaults, for an absent (or null) field.
constexpr int kDefaultHidden = 4096, kDefaultLayers = 32, kDefaultHeads = 32, kDefaultIntermediate = 11008,
              kDefaultVocab = 32000, kDefaultMaxPosition = 2048;
constexpr double kDefaultEps = 1e-6, kDefaultTheta = 10000.0;

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// "--weights: <path>: <field> is <value>, but <engine>"
[[noreturn]] void fail(const std::string& path, const std::string& field, const std::string& value,
                       const std::string& engine) {
  throw Error("--weights: " + path + ": " + field + " is " + value + ", but " + engine);
}

// The name of the directory holding config.json: "Llama-3.1-8B" for .../Llama-3.1-8B/config.json;
// in the Hugging Face cache (.../models--meta-llama--Llama-3.1-8B/snapshots/<commit>/config.json),
// the repository: "meta-llama/Llama-3.1-8B".
std::string checkpoint_name(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  const fs::path dir = (ec ? fs::path(path) : absolute).lexically_normal().parent_path();
  const std::string cached = dir.parent_path().parent_path().filename().string();
  const std::string prefix = "models--";
  if (dir.parent_path().filename() == "snapshots" && cached.size() > prefix.size() && cached.rfind(prefix, 0) == 0) {
    std::string repo = cached.substr(prefix.size());
    const size_t sep = repo.find("--");
    if (sep != std::string::npos) repo.replace(sep, 2, "/");
    return repo;
  }
  const std::string name = dir.filename().string();
  return name.empty() ? dir.string() : name;
}

// Reads config.json's fields into an HfConfig; an absent (or null) field takes LlamaConfig's
// default, and what the engine does not compute fails naming the field.
class Reader {
 public:
  Reader(const std::string& path, Json root) : path_(path), root_(std::move(root)) {
    GQ_CHECK(root_.kind == Json::Kind::kObject, "--weights: ", path_, ": not a JSON object");
  }

  HfConfig read() const {
    HfConfig out;
    ModelConfig& m = out.model;
    m.name = checkpoint_name(path_);
    const std::string model_type = string_field(root_, "model_type", "llama");
    if (model_type != "llama")
      fail(path_, "model_type", quoted(model_type), "the engine computes LlamaForCausalLM only (\"llama\")");

    m.hidden_size = int_field(root_, "hidden_size", kDefaultHidden);
    m.num_layers = int_field(root_, "num_hidden_layers", kDefaultLayers);
    m.num_qo_heads = int_field(root_, "num_attention_heads", kDefaultHeads);
    m.num_kv_heads = int_field(root_, "num_key_value_heads", m.num_qo_heads);
    m.head_dim = int_field(root_, "head_dim", m.num_qo_heads > 0 ? m.hidden_size / m.num_qo_heads : 0);
    m.intermediate_size = int_field(root_, "intermediate_size", kDefaultIntermediate);
    m.vocab_size = int_field(root_, "vocab_size", kDefaultVocab);
    m.rms_norm_eps = number_field(root_, "rms_norm_eps", kDefaultEps);
    m.max_position = int_field(root_, "max_position_embeddings", kDefaultMaxPosition);
    read_rope(out);

    const std::string act = string_field(root_, "hidden_act", "silu");
    if (act != "silu") fail(path_, "hidden_act", quoted(act), "the engine's MLP computes silu only");
    for (const char* bias : {"attention_bias", "mlp_bias"})
      if (bool_field(root_, bias, false)) fail(path_, bias, "true", "the engine's projections have no bias");
    out.tie_word_embeddings = bool_field(root_, "tie_word_embeddings", false);
    return out;
  }

 private:
  // An object's member, nullptr when absent or null (transformers takes null for its default).
  static const Json* member(const Json& obj, const std::string& name) {
    const Json* v = obj.find(name);
    return v != nullptr && v->kind != Json::Kind::kNull ? v : nullptr;
  }
  [[noreturn]] void bad_type(const std::string& name, const char* expected) const {
    throw Error("--weights: " + path_ + ": " + name + " is not " + expected);
  }
  int int_field(const Json& obj, const std::string& name, int fallback, const std::string& prefix = "") const {
    const Json* v = member(obj, name);
    if (v == nullptr) return fallback;
    const std::optional<int64_t> n = v->integer();
    if (!n) bad_type(prefix + name, "an integer");
    if (*n < INT_MIN || *n > INT_MAX) fail(path_, prefix + name, std::to_string(*n), "the engine holds it in 32 bits");
    return int(*n);
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
  void read_rope(HfConfig& out) const {
    const Json* rope = member(root_, out.rope_key);
    if ((rope == nullptr || (rope->kind == Json::Kind::kObject && rope->members.empty())) &&
        member(root_, "rope_parameters") != nullptr) {
      out.rope_key = "rope_parameters";
      rope = member(root_, out.rope_key);
    }
    static const Json kNone;  // no members
    if (rope != nullptr && rope->kind != Json::Kind::kObject) bad_type(out.rope_key, "an object");
    const Json& r = rope != nullptr ? *rope : kNone;
    const std::string p = out.rope_key + ".";
    ModelConfig& m = out.model;

    const bool theta_in_rope = member(r, "rope_theta") != nullptr;
    if (theta_in_rope) out.rope_theta_key = p + "rope_theta";
    m.rope_theta =
        theta_in_rope ? number_field(r, "rope_theta", 0, p) : number_field(root_, "rope_theta", kDefaultTheta);
    // RoPE on the first part of each head only (transformers reads it for every RoPE type).
    const bool partial_in_rope = member(r, "partial_rotary_factor") != nullptr;
    const double partial = partial_in_rope ? number_field(r, "partial_rotary_factor", 1.0, p)
                                           : number_field(root_, "partial_rotary_factor", 1.0);
    if (partial != 1.0)
      fail(path_, partial_in_rope ? p + "partial_rotary_factor" : "partial_rotary_factor", num_str(partial),
           "the engine rotates the whole head (1)");

    const std::string type_key =
        member(r, "rope_type") != nullptr || member(r, "type") == nullptr ? "rope_type" : "type";
    const std::string type = string_field(r, type_key, "default", p);
    if (rope != nullptr) out.rope_type_key = p + type_key;
    if (type != "default" && type != "llama3")
      fail(path_, p + type_key, quoted(type),
           "the engine implements only unscaled RoPE and Llama-3.1's \"llama3\" scaling");
    if (type == "default") return;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
      if (member(r, key) == nullptr)
        throw Error("--weights: " + path_ + ": " + p + key + " is missing (\"llama3\" needs it)");
    RopeScaling& s = m.rope_scaling;
    s.enabled = true;
    s.factor = number_field(r, "factor", 0, p);
    s.low_freq_factor = number_field(r, "low_freq_factor", 0, p);
    s.high_freq_factor = number_field(r, "high_freq_factor", 0, p);
    // transformers 5 falls back to max_position_embeddings; 4.x requires the key.
    s.original_max_position = int_field(r, "original_max_position_embeddings", m.max_position, p);
  }

  std::string path_;
  Json root_;
};

// A reading of config.json compared with a --model preset, field by field.
class PresetCheck {
 public:
  PresetCheck(const ModelConfig& preset, const std::string& path) : m_(preset), path_(path) {
    std::string names;
    for (const std::string& n : model_names()) names += (names.empty() ? "" : ", ") + n;
    model_ = "--model " + m_.name;
    choose_ = "--model picks the preset: " + names;
  }

  void check(const HfConfig& hf) const {
    const ModelConfig& c = hf.model;
    expect_int("hidden_size", c.hidden_size, m_.hidden_size);
    expect_int("num_hidden_layers", c.num_layers, m_.num_layers);
    expect_int("num_attention_heads", c.num_qo_heads, m_.num_qo_heads);
    expect_int("head_dim", c.head_dim, m_.head_dim);
    expect_int("intermediate_size", c.intermediate_size, m_.intermediate_size);
    expect_int("vocab_size", c.vocab_size, m_.vocab_size);
    // After the preset's dimensions, so that --num-kv-heads is suggested only for the right preset.
    if (c.num_kv_heads != m_.num_kv_heads)
      mismatch("num_key_value_heads", std::to_string(c.num_kv_heads),
               model_ + " has num_kv_heads " + std::to_string(m_.num_kv_heads) + " (set --num-kv-heads " +
                   std::to_string(c.num_kv_heads) + ")");
    expect_close("rms_norm_eps", c.rms_norm_eps, m_.rms_norm_eps);
    expect_close(hf.rope_theta_key, c.rope_theta, m_.rope_theta);

    const RopeScaling& s = c.rope_scaling;
    const RopeScaling& e = m_.rope_scaling;
    if (s.enabled != e.enabled) {
      const bool absent = hf.rope_type_key.empty();
      mismatch(absent ? hf.rope_key : hf.rope_type_key,
               absent ? "absent (unscaled RoPE)" : quoted(s.enabled ? "llama3" : "default"),
               model_ + (e.enabled ? " computes Llama-3.1's \"llama3\" RoPE scaling" : " computes unscaled RoPE") +
                   " (" + choose_ + ")");
    }
    if (s.enabled) {
      const std::string p = hf.rope_key + ".";
      expect_close(p + "factor", s.factor, e.factor);
      expect_close(p + "low_freq_factor", s.low_freq_factor, e.low_freq_factor);
      expect_close(p + "high_freq_factor", s.high_freq_factor, e.high_freq_factor);
      expect_int(p + "original_max_position_embeddings", s.original_max_position, e.original_max_position);
    }

    if (c.max_position < m_.max_position)
      mismatch("max_position_embeddings", std::to_string(c.max_position),
               model_ + " serves up to " + std::to_string(m_.max_position) + " positions (" + choose_ + ")");
  }

 private:
  // Every mismatch also says how to serve the checkpoint's own model.
  [[noreturn]] void mismatch(const std::string& field, const std::string& value, const std::string& engine) const {
    fail(path_, field, value, engine + "; or leave out --model and --num-kv-heads to serve config.json's model");
  }
  void expect_int(const std::string& field, int value, int engine) const {
    if (value != engine)
      mismatch(field, std::to_string(value), model_ + " has " + std::to_string(engine) + " (" + choose_ + ")");
  }
  void expect_close(const std::string& field, double value, double engine) const {
    if (std::fabs(value - engine) > kRelTol * std::max(std::fabs(value), std::fabs(engine)))
      mismatch(field, num_str(value), model_ + " computes with " + num_str(engine) + " (" + choose_ + ")");
  }

  const ModelConfig& m_;
  std::string path_;
  std::string model_;   // "--model tiny"
  std::string choose_;  // the remedy for a preset's number
};

Json read_json(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  GQ_CHECK(!ec && size <= kMaxConfigBytes, "--weights: ", path, ": ",
           ec ? "cannot read (" + ec.message() + ")" : "larger than " + std::to_string(kMaxConfigBytes) + " bytes");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  GQ_CHECK(in.good(), "--weights: ", path, ": cannot read");
  return parse_json(text.str(), "--weights: " + path + ": bad JSON");
}

}  // namespace

std::string hf_config_path(const std::string& weights_path) {
  std::error_code ec;
  const fs::path weights(weights_path);
  fs::path dir = fs::is_directory(weights, ec) ? weights : weights.parent_path();
  if (dir.empty()) dir = ".";
  const fs::path config = dir / "config.json";
  return fs::exists(config, ec) ? config.string() : std::string();
}

HfConfig read_hf_config(const std::string& path) {
  HfConfig hf = Reader(path, read_json(path)).read();
  try {
    validate(hf.model);
  } catch (const Error& e) {
    throw Error("--weights: " + path + ": " + e.what());
  }
  return hf;
}

HfConfig check_hf_config(const ModelConfig& config, const std::string& path) {
  HfConfig hf = read_hf_config(path);
  PresetCheck(config, path).check(hf);
  return hf;
}

}  // namespace gqattn::engine
