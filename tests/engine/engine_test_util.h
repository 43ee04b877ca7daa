// Helpers for the engine tests: tiny-model runners and engines on a chosen compute device, a
// straightforward float64 forward pass of the Llama architecture (dense causal attention, no
// paging) to check the runner against, and a driver that feeds a runner fixed token sequences
// step by step (teacher forcing). Header-only. Layer: tests (host-only).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/host_float.h"
#include "common/expect_error.h"
#include "config.h"
#include "engine.h"
#include "gqattn/error.h"
#include "model_runner.h"
#include "weights.h"

namespace gqattn::engine::test {

constexpr uint64_t kSeed = 1234;

inline RunnerConfig tiny_runner_config(int num_kv_heads = 0, const std::string& attention = "gqattn") {
  RunnerConfig rc;
  rc.model = model_config("tiny", num_kv_heads);
  rc.weights.seed = kSeed;
  rc.attention = attention;
  rc.page_size = 4;
  rc.num_pages = 256;
  rc.max_num_seqs = 16;
  rc.max_num_batched_tokens = 256;
  rc.max_model_len = 512;
  return rc;
}

// The tiny model with hidden (250), intermediate (330) and vocabulary (509) sizes that are not
// multiples of 8: no row of the residual stream, the activations, the MLP or the logits starts
// 16-byte aligned, so the CUDA path takes its scalar kernels and runs cuBLASLt on unaligned leading
// dimensions (head_dim stays 128, a variant every GPU build compiles).
inline RunnerConfig odd_tiny_runner_config(int num_kv_heads = 0, const std::string& attention = "gqattn") {
  RunnerConfig rc = tiny_runner_config(num_kv_heads, attention);
  rc.model.name = "tiny-odd";
  rc.model.hidden_size = 250;
  rc.model.intermediate_size = 330;
  rc.model.vocab_size = 509;
  return rc;
}

// `fn` throws a gqattn::Error whose message contains `needle` (the library tests' check).
inline void expect_throws_with(const std::function<void()>& fn, const std::string& needle) {
  gqattn::test::expect_rejected(fn, {needle});
}

inline std::unique_ptr<ModelRunner> make_runner(const RunnerConfig& rc, const std::string& device = "cpu") {
  return std::make_unique<ModelRunner>(make_compute(device), rc);
}

// Prompts of the given lengths with seeded token ids.
inline std::vector<std::vector<int32_t>> make_prompts(const std::vector<int>& lengths, int vocab, uint64_t seed) {
  std::vector<std::vector<int32_t>> out;
  uint64_t x = seed;
  for (int len : lengths) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      p.push_back(int32_t((x >> 33) % uint64_t(vocab)));
    }
    out.push_back(p);
  }
  return out;
}

// ---- float64 reference ------------------------------------------------------------------------

class ReferenceModel {
 public:
  ReferenceModel(const ModelConfig& config, const HostWeights& weights) : c_(config), inv_freq_(rope_inv_freq(config)) {
    for (const WeightSpec& s : weight_specs(config)) {
      const std::vector<uint16_t>& bits = weights.at(s.name);
      std::vector<double>& w = w_[s.name];
      for (uint16_t b : bits) w.push_back(bf16_to_float(b));
    }
  }

  // Logits [tokens.size()][vocab]: position t's next-token logits given tokens[0..t].
  std::vector<std::vector<double>> logits(const std::vector<int32_t>& tokens) const {
    const int T = int(tokens.size()), H = c_.hidden_size, hd = c_.head_dim;
    const std::vector<double>& embed = w_.at("model.embed_tokens.weight");
    std::vector<std::vector<double>> x(T, std::vector<double>(H));
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < H; ++j) x[t][j] = embed[size_t(tokens[t]) * H + j];
    for (int l = 0; l < c_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const auto hn = rmsnorm(x, w_.at(p + "input_layernorm.weight"));
      auto q = matmul(hn, w_.at(p + "self_attn.q_proj.weight"), c_.q_size());
      auto k = matmul(hn, w_.at(p + "self_attn.k_proj.weight"), c_.kv_size());
      const auto v = matmul(hn, w_.at(p + "self_attn.v_proj.weight"), c_.kv_size());
      rope(q, c_.num_qo_heads);
      rope(k, c_.num_kv_heads);
      std::vector<std::vector<double>> attn(T, std::vector<double>(size_t(c_.q_size())));
      const double scale = 1.0 / std::sqrt(double(hd));
      for (int t = 0; t < T; ++t) {
        for (int h = 0; h < c_.num_qo_heads; ++h) {
          const int g = h / c_.group_size();
          std::vector<double> s(static_cast<size_t>(t + 1));
          double mx = -INFINITY;
          for (int u = 0; u <= t; ++u) {
            double dot = 0;
            for (int d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[u][g * hd + d];
            s[u] = dot * scale;
            mx = std::max(mx, s[u]);
          }
          double den = 0;
          for (double& e : s) den += e = std::exp(e - mx);
          for (int u = 0; u <= t; ++u)
            for (int d = 0; d < hd; ++d) attn[t][h * hd + d] += s[u] / den * v[u][g * hd + d];
        }
      }
      add(x, matmul(attn, w_.at(p + "self_attn.o_proj.weight"), H));
      const auto hn2 = rmsnorm(x, w_.at(p + "post_attention_layernorm.weight"));
      const auto gate = matmul(hn2, w_.at(p + "mlp.gate_proj.weight"), c_.intermediate_size);
      auto up = matmul(hn2, w_.at(p + "mlp.up_proj.weight"), c_.intermediate_size);
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < c_.intermediate_size; ++j) up[t][j] *= gate[t][j] / (1.0 + std::exp(-gate[t][j]));
      add(x, matmul(up, w_.at(p + "mlp.down_proj.weight"), H));
    }
    return matmul(rmsnorm(x, w_.at("model.norm.weight")), w_.at("lm_head.weight"), c_.vocab_size);
  }

 private:
  using Rows = std::vector<std::vector<double>>;
  Rows rmsnorm(const Rows& x, const std::vector<double>& w) const {
    Rows out = x;
    for (auto& row : out) {
      double ss = 0;
      for (double v : row) ss += v * v;
      const double inv = 1.0 / std::sqrt(ss / double(row.size()) + c_.rms_norm_eps);
      for (size_t j = 0; j < row.size(); ++j) row[j] *= inv * w[j];
    }
    return out;
  }
  // y[t][o] = sum_j x[t][j] * w[o][j], w row-major [out, in].
  static Rows matmul(const Rows& x, const std::vector<double>& w, int out) {
    const size_t in = x[0].size();
    Rows y(x.size(), std::vector<double>(size_t(out)));
    for (size_t t = 0; t < x.size(); ++t)
      for (int o = 0; o < out; ++o) {
        double acc = 0;
        for (size_t j = 0; j < in; ++j) acc += x[t][j] * w[size_t(o) * in + j];
        y[t][o] = acc;
      }
    return y;
  }
  static void add(Rows& x, const Rows& d) {
    for (size_t t = 0; t < x.size(); ++t)
      for (size_t j = 0; j < x[t].size(); ++j) x[t][j] += d[t][j];
  }
  // Hugging Face rotate-half: pairs (j, j + head_dim / 2).
  void rope(Rows& x, int heads) const {
    const int hd = c_.head_dim, half = hd / 2;
    for (size_t t = 0; t < x.size(); ++t)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < half; ++j) {
          const double a = double(t) * inv_freq_[j], c = std::cos(a), s = std::sin(a);
          double& x1 = x[t][h * hd + j];
          double& x2 = x[t][h * hd + j + half];
          const double y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
          x1 = y1;
          x2 = y2;
        }
  }

  ModelConfig c_;
  std::vector<double> inv_freq_;
  std::map<std::string, std::vector<double>> w_;
};

// ---- teacher forcing ----------------------------------------------------------------------------

// Feeds `sequences` (equal lengths) through `runner`: prefill chunks of `chunk` tokens for all
// requests together up to `prompt_len`, then one decode step per remaining token. Returns, per
// request, the logits after each step's last token, keyed by that token's position (from
// prompt_len - 1 to the end; plus each chunk end). Pages are handed out in reverse order.
inline std::vector<std::map<int, std::vector<float>>> run_teacher_forced(
    ModelRunner& runner, const std::vector<std::vector<int32_t>>& sequences, int prompt_len, int chunk) {
  const int batch = int(sequences.size()), len = int(sequences[0].size()), ps = runner.page_size();
  const int pages_per_request = (len + ps - 1) / ps;
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < pages_per_request; ++i) pages[b].push_back(runner.num_pages() - 1 - (b * pages_per_request + i));
  std::vector<std::map<int, std::vector<float>>> out(static_cast<size_t>(batch));
  int computed = 0;
  while (computed < len) {
    const int n = computed < prompt_len ? std::min(chunk, prompt_len - computed) : 1;
    ForwardBatch f;
    f.qo_indptr = {0};
    f.kv_page_indptr = {0};
    for (int b = 0; b < batch; ++b) {
      for (int t = computed; t < computed + n; ++t) {
        f.token_ids.push_back(sequences[b][t]);
        f.positions.push_back(t);
      }
      f.qo_indptr.push_back(int32_t(f.token_ids.size()));
      const int kv = computed + n, np = (kv + ps - 1) / ps;
      f.kv_page_indices.insert(f.kv_page_indices.end(), pages[b].begin(), pages[b].begin() + np);
      f.kv_page_indptr.push_back(int32_t(f.kv_page_indices.size()));
      f.kv_len.push_back(kv);
      f.sample_rows.push_back(int32_t(f.token_ids.size()) - 1);
    }
    f.num_decode = computed >= prompt_len ? batch : 0;
    runner.forward(f);
    const std::vector<float> logits = runner.logits();
    const int vocab = runner.model().vocab_size;
    for (int b = 0; b < batch; ++b)
      out[b][computed + n - 1].assign(logits.begin() + size_t(b) * vocab, logits.begin() + size_t(b + 1) * vocab);
    computed += n;
  }
  return out;
}

// The gap between the largest and the second largest logit.
inline double top2_gap(const std::vector<float>& logits) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : logits) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return double(a) - double(b);
}

}  // namespace gqattn::engine::test
