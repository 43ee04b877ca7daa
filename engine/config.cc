// Model presets, validation, byte counts and the RoPE frequency table.
// Layer: engine (host-only).
#include "config.h"

#include <climits>
#include <cmath>

#include "gqattn/error.h"

namespace gqattn::engine {

namespace {

constexpr double kPi = 3.14159265358979323846;
// q_size() at most this, so that qkv_size() (at most 3 x q_size()) fits an int.
constexpr int64_t kMaxQSize = INT_MAX / 3;

ModelConfig llama2_7b() {
  ModelConfig c;
  c.name = "llama2-7b";
  c.hidden_size = 4096;
  c.num_layers = 32;
  c.num_qo_heads = 32;
  c.num_kv_heads = 32;
  c.head_dim = 128;
  c.intermediate_size = 11008;
  c.vocab_size = 32000;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.max_position = 4096;
  return c;
}

// Meta-Llama-3-8B: unscaled RoPE at theta 500000.
ModelConfig llama3_8b() {
  ModelConfig c;
  c.name = "llama3-8b";
  c.hidden_size = 4096;
  c.num_layers = 32;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.max_position = 8192;
  return c;
}

// Llama-3.1-8B: Llama-3-8B's shapes with the "llama3" rescaling of RoPE's low frequencies (factor 8
// over an original 8192 positions). The engine serves it up to the same 8192 positions.
ModelConfig llama31_8b() {
  ModelConfig c = llama3_8b();
  c.name = "llama3.1-8b";
  c.rope_scaling.enabled = true;
  return c;
}

// Small enough for CI on the CPU, shaped like the real thing: head_dim 128 (a variant every GPU
// build compiles), a group of 2 query heads per K/V head, two layers.
ModelConfig tiny() {
  ModelConfig c;
  c.name = "tiny";
  c.hidden_size = 256;
  c.num_layers = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.intermediate_size = 512;
  c.vocab_size = 512;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.max_position = 2048;
  return c;
}

}  // namespace

// Counted in double (exact below 2^53 parameters) and saturated: a config.json may hold sizes whose
// product passes int64, which must still fail the size checks, not wrap past them.
int64_t ModelConfig::num_params() const {
  const double h = hidden_size;
  const double per_layer = h * qkv_size() + double(q_size()) * h + 3 * h * intermediate_size + 2 * h;
  const double total = 2 * double(vocab_size) * h + double(num_layers) * per_layer + h;
  constexpr int64_t kMaxParams = INT64_MAX / 8;  // bytes at up to 8 a parameter still fit in int64
  return total >= double(kMaxParams) ? kMaxParams : int64_t(total);
}

int64_t ModelConfig::streamed_weight_bytes(int bytes_per_param) const {
  return (num_params() - int64_t(vocab_size) * hidden_size) * bytes_per_param;
}

int64_t ModelConfig::kv_bytes_per_token(int bytes_per_elem) const {
  return 2 * int64_t(num_layers) * kv_size() * bytes_per_elem;
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"llama2-7b", "llama3-8b", "llama3.1-8b", "tiny"};
  return names;
}

ModelConfig model_config(const std::string& name, int num_kv_heads) {
  ModelConfig c;
  if (name == "llama2-7b") {
    c = llama2_7b();
  } else if (name == "llama3-8b") {
    c = llama3_8b();
  } else if (name == "llama3.1-8b") {
    c = llama31_8b();
  } else if (name == "tiny") {
    c = tiny();
  } else {
    throw Error("--model: unknown model '" + name + "' (expected llama2-7b, llama3-8b, llama3.1-8b or tiny)");
  }
  if (num_kv_heads != 0) {
    GQ_CHECK(num_kv_heads > 0 && c.num_qo_heads % num_kv_heads == 0, "--num-kv-heads: ", num_kv_heads,
             " does not divide num_qo_heads (", c.num_qo_heads, ") of ", name);
    c.num_kv_heads = num_kv_heads;
  }
  validate(c);
  return c;
}

void validate(const ModelConfig& c) {
  GQ_CHECK(c.hidden_size > 0, "hidden_size (", c.hidden_size, ") must be > 0");
  GQ_CHECK(c.num_layers > 0, "num_layers (", c.num_layers, ") must be > 0");
  GQ_CHECK(c.num_qo_heads > 0, "num_qo_heads (", c.num_qo_heads, ") must be > 0");
  GQ_CHECK(c.num_kv_heads > 0 && c.num_qo_heads % c.num_kv_heads == 0, "num_kv_heads (",
           c.num_kv_heads, ") must divide num_qo_heads (", c.num_qo_heads, ")");
  GQ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim (", c.head_dim, ") must be even and > 0");
  GQ_CHECK(int64_t(c.num_qo_heads) * c.head_dim <= kMaxQSize, "num_qo_heads x head_dim (", c.num_qo_heads, " x ",
           c.head_dim, ") must be at most ", kMaxQSize);
  GQ_CHECK(c.intermediate_size > 0, "intermediate_size (", c.intermediate_size, ") must be > 0");
  GQ_CHECK(c.vocab_size > 0, "vocab_size (", c.vocab_size, ") must be > 0");
  GQ_CHECK(c.rope_theta > 0, "rope_theta (", c.rope_theta, ") must be > 0");
  GQ_CHECK(c.rms_norm_eps > 0, "rms_norm_eps (", c.rms_norm_eps, ") must be > 0");
  GQ_CHECK(c.max_position > 0, "max_position (", c.max_position, ") must be > 0");
  if (!c.rope_scaling.enabled) return;
  const RopeScaling& s = c.rope_scaling;
  GQ_CHECK(s.factor > 0, "rope_scaling factor (", s.factor, ") must be > 0");
  GQ_CHECK(s.low_freq_factor > 0 && s.low_freq_factor < s.high_freq_factor, "rope_scaling low_freq_factor (",
           s.low_freq_factor, ") must be > 0 and below high_freq_factor (", s.high_freq_factor, ")");
  GQ_CHECK(s.original_max_position > 0, "rope_scaling original_max_position (", s.original_max_position,
           ") must be > 0");
}

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(c.rope_theta, -2.0 * i / c.head_dim);
  if (!c.rope_scaling.enabled) return inv_freq;
  // Hugging Face's _compute_llama3_parameters: long wavelengths are divided by `factor`, short
  // ones kept, and the band between them interpolated.
  const RopeScaling& s = c.rope_scaling;
  const double low_freq_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_position / s.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2 * kPi / f;
    if (wavelen > low_freq_wavelen) {
      f /= s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      f = (1 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv_freq;
}

}  // namespace gqattn::engine
