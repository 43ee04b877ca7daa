// A checkpoint's Hugging Face config.json checked against the engine's ModelConfig: what the tensor
// shapes cannot show (eps, RoPE, activation, biases, tied embeddings, head split) must be what the
// engine computes, or loading fails naming the field. Layer: engine (host-only).
#pragma once

#include <string>

#include "config.h"

namespace gqattn::engine {

// The config.json that comes with a --weights path: inside it when it is a directory, beside it
// when it is a file. Empty when there is none.
std::string hf_config_path(const std::string& weights_path);

// What config.json says about the tensors that the engine acts on.
struct HfConfig {
  bool tie_word_embeddings = false;  // lm_head is the embedding (no lm_head.weight needed)
};

// Reads the config.json at `path` and checks it against `config`: model_type "llama"; hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size and
// vocab_size equal; rms_norm_eps and rope_theta within a relative 1e-6; RoPE scaling (rope_scaling,
// or transformers 5's rope_parameters) none or Llama-3.1's "llama3" as `config` has it, over the
// whole head (partial_rotary_factor 1); hidden_act "silu"; no attention or MLP bias;
// max_position_embeddings at least config.max_position. An absent (or null) field takes
// transformers' LlamaConfig default; unknown fields are ignored.
// Throws gqattn::Error naming the file, the field, its value, the engine's and the flag to change,
// or the file and the byte for malformed JSON.
HfConfig check_hf_config(const ModelConfig& config, const std::string& path);

}  // namespace gqattn::engine
