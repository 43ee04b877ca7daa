// Model shapes of a Llama-architecture decoder: presets (Llama-2-7B, Llama-3-8B, Llama-3.1-8B, tiny test
// shapes; hf_config.h reads one from a checkpoint's config.json), the num_kv_heads override, validation,
// byte counts for the memory-traffic floor and the RoPE frequency table. Layer: engine (host-only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gqattn::engine {

// Llama-3.1's RoPE rescaling of the low frequencies ("rope_type": "llama3" in its config.json).
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
};

struct ModelConfig {
  std::string name;
  int hidden_size = 0;
  int num_layers = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  int max_position = 4096;  // longest sequence the model is used for (prompt + generated)

  int q_size() const { return num_qo_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  int qkv_size() const { return q_size() + 2 * kv_size(); }
  int group_size() const { return num_qo_heads / num_kv_heads; }
  // Parameters of the whole model, embedding and lm_head included.
  int64_t num_params() const;
  // Bytes of weights a decode step streams (all but the embedding table, of which it gathers a
  // few rows), at `bytes_per_param`.
  int64_t streamed_weight_bytes(int bytes_per_param) const;
  // K + V bytes of one token over all layers.
  int64_t kv_bytes_per_token(int bytes_per_elem) const;
};

// The preset names accepted by model_config(), for help texts and messages.
const std::vector<std::string>& model_names();

// A preset by name ("llama2-7b", "llama3-8b", "llama3.1-8b", "tiny"); num_kv_heads > 0 overrides the preset's.
// Throws gqattn::Error naming `--model` or `--num-kv-heads` for an unknown name or a head count
// that does not divide num_qo_heads.
ModelConfig model_config(const std::string& name, int num_kv_heads = 0);

// Throws gqattn::Error when a field is out of range (every message names the field).
void validate(const ModelConfig& config);

// RoPE inverse frequencies [head_dim / 2]: theta^(-2i / head_dim), rescaled for Llama-3.1.
// Shared by the CPU and CUDA paths so both rotate by the same angles.
std::vector<double> rope_inv_freq(const ModelConfig& config);

}  // namespace gqattn::engine
