// The model's weights by their Hugging Face Llama names (model.embed_tokens.weight,
// model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight), all bf16: random by default
// (seeded, uniform with std 0.02, output projections scaled down by sqrt(2 * num_layers), norms
// ones; identical bits on the CPU and the GPU) or loaded from safetensors (a file or a directory
// of shards). Layer: engine (host-only).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config.h"

namespace gqattn::engine {

constexpr float kInitStd = 0.02f;

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;  // [out, in] for projections, [hidden] for norms
  float init_std = 0.f;        // 0: a norm, initialised to ones
  int64_t numel() const;
  // Half-width of the uniform distribution with std init_std (random.h's random_weight).
  float half_width() const;
};

// Every weight of the model in a fixed order; a weight's index is its random stream id.
std::vector<WeightSpec> weight_specs(const ModelConfig& config);

// bf16 bit patterns by name.
struct HostWeights {
  std::map<std::string, std::vector<uint16_t>> tensors;
  const std::vector<uint16_t>& at(const std::string& name) const;
};

// Where the model runner's weights come from: random with `seed` (path empty) or a checkpoint.
struct WeightSource {
  uint64_t seed = 0;
  std::string path;
  bool random() const { return path.empty(); }
};

// The random weights on the host (what the CUDA path generates on the device).
HostWeights random_host_weights(const ModelConfig& config, uint64_t seed);
// Loads every weight of `config` from a .safetensors file or a directory of them; BF16, F16 and
// F32 are converted to bf16. A config.json in the directory (or beside the file) is checked
// first (hf_config.h); then a missing lm_head.weight needs its tie_word_embeddings true, and
// without one it means tied embeddings. An lm_head.weight present is used even when tied (as
// transformers 5 does where it differs from the embedding). Throws gqattn::Error naming the
// file, the tensor and the expected shape on a mismatch, and for a tensor in two files or one
// `config` has no place for (RoPE's inv_freq buffers aside).
HostWeights load_weights(const ModelConfig& config, const std::string& path);
// Writes `weights` as one safetensors file in the Hugging Face layout.
void save_weights(const ModelConfig& config, const HostWeights& weights, const std::string& path);

}  // namespace gqattn::engine
