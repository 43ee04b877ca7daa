// A checkpoint's Hugging Face config.json: read into the engine's ModelConfig (the model served when
// --model is not given), or checked against a --model preset, where what the tensor shapes cannot
// show (eps, RoPE, activation, biases, tied embeddings, head split) must be what the engine
// computes, or loading fails naming the field. Layer: engine (host-only).
#pragma once

#include <string>

#include "config.h"

namespace gqattn::engine {

// The config.json that comes with a --weights path: inside it when it is a directory, beside it
// when it is a file. Empty when there is none.
std::string hf_config_path(const std::string& weights_path);

// What a config.json says: the model, whether lm_head is the embedding, and the keys its RoPE
// fields were read from (so that messages name the checkpoint's own).
struct HfConfig {
  // name: the checkpoint directory's (the one holding config.json); max_position:
  // max_position_embeddings.
  ModelConfig model;
  bool tie_word_embeddings = false;           // lm_head is the embedding (no lm_head.weight needed)
  std::string rope_theta_key = "rope_theta";  // or "rope_parameters.rope_theta" (transformers 5)
  // The object holding the RoPE type and Llama-3.1's factors: "rope_scaling" (transformers 4.x)
  // or "rope_parameters" (5.x).
  std::string rope_key = "rope_scaling";
  std::string rope_type_key;  // "rope_scaling.rope_type" (or ".type"); empty when rope_key is absent
};

// Reads the config.json at `path`: model_type "llama"; hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim (default hidden_size / num_attention_heads),
// intermediate_size, vocab_size, rms_norm_eps, rope_theta, max_position_embeddings; RoPE scaling
// (rope_scaling, or transformers 5's rope_parameters, which may hold rope_theta too) none or
// Llama-3.1's "llama3" with its factors and original_max_position_embeddings (absent: transformers
// 5 takes max_position_embeddings), over the whole head (partial_rotary_factor 1); hidden_act
// "silu"; no attention or MLP bias; tie_word_embeddings. An absent (or null) field takes
// transformers' LlamaConfig default; unknown fields are ignored. The model is validated.
// Throws gqattn::Error naming the file, the field and its value for what the engine does not
// compute, or the file and the byte for malformed JSON.
HfConfig read_hf_config(const std::string& path);

// read_hf_config(path), then its model compared with `config` field by field: the dimensions and
// num_key_value_heads equal; rms_norm_eps, rope_theta and the llama3 factors within a relative
// 1e-6; the same RoPE scaling; max_position_embeddings at least config.max_position.
// Throws gqattn::Error naming the file, the field, its value, the engine's and the flag to change.
HfConfig check_hf_config(const ModelConfig& config, const std::string& path);

}  // namespace gqattn::engine
