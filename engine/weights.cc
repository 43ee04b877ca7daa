// Weight specs, random host weights and safetensors loading and saving. Layer: engine (host-only).
#include "weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "api/host_float.h"
#include "gqattn/error.h"
#include "hf_config.h"
#include "random.h"
#include "safetensors.h"

namespace gqattn::engine {

namespace {

// A buffer some Hugging Face conversions store per layer; the RoPE table comes from the config.
constexpr const char kRopeInvFreqSuffix[] = ".rotary_emb.inv_freq";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Converts a tensor's raw bytes to bf16.
std::vector<uint16_t> to_bf16(const SafetensorsFile& file, const SafetensorsEntry& e) {
  std::vector<uint8_t> raw(static_cast<size_t>(e.end - e.begin));
  file.read(e, raw.data());
  const size_t n = size_t(e.numel());
  std::vector<uint16_t> out(n);
  if (e.dtype == "BF16") {
    std::memcpy(out.data(), raw.data(), n * 2);
  } else if (e.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(float(load_as_double(raw.data(), DType::kFP16, int64_t(i))));
  } else if (e.dtype == "F32") {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(float(load_as_double(raw.data(), DType::kFP32, int64_t(i))));
  } else {
    throw Error(file.path() + ": tensor '" + e.name + "' has dtype " + e.dtype + " (expected BF16, F16 or F32)");
  }
  return out;
}

}  // namespace

int64_t WeightSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float WeightSpec::half_width() const { return float(double(init_std) * std::sqrt(3.0)); }

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  // Output projections add into the residual stream once per layer each: scaled so the stream's
  // variance grows like one layer's, not 2 * num_layers of them (GPT-2's initialisation).
  const float out_std = float(kInitStd / std::sqrt(2.0 * c.num_layers));
  std::vector<WeightSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, kInitStd});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}, 0.f});
    specs.push_back({p + "self_attn.q_proj.weight", {q, h}, kInitStd});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, h}, kInitStd});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, h}, kInitStd});
    specs.push_back({p + "self_attn.o_proj.weight", {h, q}, out_std});
    specs.push_back({p + "post_attention_layernorm.weight", {h}, 0.f});
    specs.push_back({p + "mlp.gate_proj.weight", {f, h}, kInitStd});
    specs.push_back({p + "mlp.up_proj.weight", {f, h}, kInitStd});
    specs.push_back({p + "mlp.down_proj.weight", {h, f}, out_std});
  }
  specs.push_back({"model.norm.weight", {h}, 0.f});
  specs.push_back({"lm_head.weight", {c.vocab_size, h}, kInitStd});
  return specs;
}

const std::vector<uint16_t>& HostWeights::at(const std::string& name) const {
  const auto it = tensors.find(name);
  GQ_CHECK(it != tensors.end(), "weights: no tensor '", name, "'");
  return it->second;
}

HostWeights random_host_weights(const ModelConfig& config, uint64_t seed) {
  HostWeights w;
  const std::vector<WeightSpec> specs = weight_specs(config);
  const uint16_t one = float_to_bf16(1.f);
  for (size_t id = 0; id < specs.size(); ++id) {
    const WeightSpec& s = specs[id];
    std::vector<uint16_t>& t = w.tensors[s.name];
    t.resize(size_t(s.numel()));
    if (s.init_std == 0.f) {
      std::fill(t.begin(), t.end(), one);
    } else {
      const float hw = s.half_width();
      for (size_t i = 0; i < t.size(); ++i) t[i] = float_to_bf16(random_weight(seed, id, i, hw));
    }
  }
  return w;
}

HostWeights load_weights(const ModelConfig& config, const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    GQ_CHECK(!files.empty(), "--weights: no .safetensors file in directory '", path, "'");
  } else {
    GQ_CHECK(fs::exists(path), "--weights: '", path, "' does not exist");
    files.push_back(path);
  }
  // Without a config.json only the shapes are checked, and a missing lm_head means tied embeddings.
  const std::string config_json = hf_config_path(path);
  const bool tied = config_json.empty() || check_hf_config(config, config_json).tie_word_embeddings;
  std::vector<std::unique_ptr<SafetensorsFile>> shards;
  for (const std::string& f : files) shards.push_back(std::make_unique<SafetensorsFile>(f));
  const auto find = [&](const std::string& name) {
    std::pair<const SafetensorsFile*, const SafetensorsEntry*> found = {nullptr, nullptr};
    for (const auto& s : shards)
      if (const SafetensorsEntry* e = s->find(name)) {
        GQ_CHECK(found.second == nullptr, "--weights: tensor '", name, "' is in both ", found.first->path(), " and ",
                 s->path());
        found = {s.get(), e};
      }
    return found;
  };

  HostWeights w;
  for (const WeightSpec& spec : weight_specs(config)) {
    auto found = find(spec.name);
    if (found.second == nullptr && spec.name == "lm_head.weight") {
      GQ_CHECK(tied, "--weights: '", path, "' has no tensor 'lm_head.weight' but ", config_json,
               " has tie_word_embeddings false (absent: false)");
      found = find("model.embed_tokens.weight");
    }
    const SafetensorsFile* file = found.first;
    const SafetensorsEntry* entry = found.second;
    GQ_CHECK(entry != nullptr, "--weights: '", path, "' has no tensor '", spec.name, "' (", config.name,
             " expects ", shape_str(spec.shape), ")");
    GQ_CHECK(entry->shape == spec.shape, "--weights: ", file->path(), ": tensor '", entry->name, "' has shape ",
             shape_str(entry->shape), " but ", config.name, " (num_kv_heads ", config.num_kv_heads, ") expects ",
             shape_str(spec.shape), " for '", spec.name, "'");
    w.tensors[spec.name] = to_bf16(*file, *entry);
  }
  // A tensor the model has no place for (a layer past num_layers, a bias) means another model.
  for (const auto& s : shards)
    for (const SafetensorsEntry& e : s->entries())
      GQ_CHECK(w.tensors.count(e.name) != 0 || ends_with(e.name, kRopeInvFreqSuffix), "--weights: ", s->path(),
               ": tensor '", e.name, "' has no place in ", config.name, " (", config.num_layers, " layers)");
  return w;
}

void save_weights(const ModelConfig& config, const HostWeights& weights, const std::string& path) {
  std::vector<SafetensorsTensor> tensors;
  for (const WeightSpec& spec : weight_specs(config)) {
    const std::vector<uint16_t>& t = weights.at(spec.name);
    GQ_CHECK(int64_t(t.size()) == spec.numel(), "save_weights: '", spec.name, "' holds ", t.size(),
             " values, expected ", spec.numel());
    tensors.push_back({spec.name, "BF16", spec.shape, t.data()});
  }
  write_safetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace gqattn::engine
