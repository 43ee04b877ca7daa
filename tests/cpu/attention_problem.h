// A small attention problem for the CPU tests: random dense inputs, runs through the public API
// (paged in either layout, or ragged; decode or prefill), and an independent naive reference
// computed densely (no pages) in long double. Layer: tests/cpu (host-only).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/test_util.h"
#include "gqattn/attention.h"

namespace gqattn::test {

struct Problem {
  int num_qo_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 64;
  DType dtype = DType::kFP32;
  std::vector<int32_t> qo_len;  // per request
  std::vector<int32_t> kv_len;  // per request
  bool causal = false;
  float sm_scale = 0.f;
  uint64_t seed = 1;
};

// Dense random inputs: q [total_qo, num_qo_heads, head_dim], k and v [total_kv, num_kv_heads,
// head_dim]; request b's rows start at qo_indptr[b] / kv_indptr[b].
struct Inputs {
  HostTensor q, k, v;
  std::vector<int32_t> qo_indptr, kv_indptr;
};

inline Inputs make_inputs(const Problem& p) {
  Inputs in;
  in.qo_indptr = token_indptr(p.qo_len);
  in.kv_indptr = token_indptr(p.kv_len);
  in.q = random_tensor({in.qo_indptr.back(), p.num_qo_heads, p.head_dim}, p.dtype, p.seed * 7 + 1);
  in.k = random_tensor({in.kv_indptr.back(), p.num_kv_heads, p.head_dim}, p.dtype, p.seed * 7 + 2);
  in.v = random_tensor({in.kv_indptr.back(), p.num_kv_heads, p.head_dim}, p.dtype, p.seed * 7 + 3);
  return in;
}

struct Output {
  HostTensor o;    // [total_qo, num_qo_heads, head_dim], the problem's dtype
  HostTensor lse;  // fp32 [total_qo, num_qo_heads]
};

inline Output make_output(const Problem& p, int64_t total_qo) {
  Output out;
  out.o = HostTensor({total_qo, p.num_qo_heads, p.head_dim}, p.dtype);
  out.lse = HostTensor({total_qo, p.num_qo_heads}, DType::kFP32);
  out.o.fill_bytes(0x7F);  // NaN-like garbage in every dtype: rows left unwritten show up
  out.lse.fill_bytes(0x7F);
  return out;
}

inline PlanInputs plan_inputs(const Problem& p, int page_size, const std::vector<int32_t>& kv_indptr,
                              const std::vector<int32_t>& kv_last_page_len) {
  PlanInputs pi;
  pi.device = Device::kCPU;
  pi.dtype = p.dtype;
  pi.num_qo_heads = p.num_qo_heads;
  pi.num_kv_heads = p.num_kv_heads;
  pi.head_dim = p.head_dim;
  pi.page_size = page_size;
  pi.causal = p.causal;
  pi.kv_indptr = kv_indptr;
  pi.kv_last_page_len = kv_last_page_len;
  return pi;
}

// Prefill through the public API; page_size 0 runs ragged K/V.
inline Output run_prefill(const Problem& p, const Inputs& in, int page_size,
                          KVLayout layout = KVLayout::kNHD) {
  Output out = make_output(p, in.qo_indptr.back());
  HostTensor qo_indptr = HostTensor::from_int32(in.qo_indptr);
  PrefillArgs args;
  args.q = in.q.view();
  args.qo_indptr = qo_indptr.view();
  args.causal = p.causal;
  args.o = out.o.view();
  args.lse = out.lse.view();
  args.sm_scale = p.sm_scale;
  PlanInputs pi;
  PagedKVHost paged;
  RaggedKVHost ragged;
  if (page_size > 0) {
    paged = make_paged_kv(in.k, in.v, p.kv_len, page_size, layout, p.seed * 7 + 4);
    pi = plan_inputs(p, page_size, paged.table.kv_page_indptr, paged.table.kv_last_page_len);
    args.paged = paged.view();
  } else {
    ragged = make_ragged_kv(in.k, in.v, p.kv_len);
    pi = plan_inputs(p, 0, in.kv_indptr, {});
    args.ragged = ragged.view();
  }
  pi.qo_indptr = in.qo_indptr;
  const Plan plan = prefill_plan(pi, Workspace{});
  prefill_run(plan, args);
  return out;
}

// Decode through the public API: every request must have the same qo_len (p.qo_len[0]).
inline Output run_decode(const Problem& p, const Inputs& in, int page_size,
                         KVLayout layout = KVLayout::kNHD) {
  Output out = make_output(p, in.qo_indptr.back());
  PagedKVHost paged = make_paged_kv(in.k, in.v, p.kv_len, page_size, layout, p.seed * 7 + 4);
  PlanInputs pi = plan_inputs(p, page_size, paged.table.kv_page_indptr, paged.table.kv_last_page_len);
  pi.qo_len = p.qo_len.empty() ? 1 : p.qo_len[0];
  const Plan plan = decode_plan(pi, Workspace{});
  DecodeArgs args;
  args.q = in.q.view();
  args.kv = paged.view();
  args.o = out.o.view();
  args.lse = out.lse.view();
  args.sm_scale = p.sm_scale;
  decode_run(plan, args);
  return out;
}

struct NaiveOutput {
  std::vector<double> o;    // [total_qo, num_qo_heads, head_dim] row-major
  std::vector<double> lse;  // [total_qo, num_qo_heads]
};

// softmax(scale * q k^T + mask) v straight from the definition: for each request, query token i
// (of qo_len) and query head h, score every key j of K/V head h / group_size; causal keeps
// j <= kv_len - qo_len + i. No visible key: o = 0, lse = -inf.
inline NaiveOutput naive_attention(const Problem& p, const Inputs& in, bool causal) {
  const int64_t total_qo = in.qo_indptr.back();
  const int64_t hq = p.num_qo_heads, d_max = p.head_dim;
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const long double scale = p.sm_scale == 0.f ? 1.0L / std::sqrt((long double)p.head_dim) : p.sm_scale;
  NaiveOutput out;
  out.o.assign(size_t(total_qo * hq * d_max), 0.0);
  out.lse.assign(size_t(total_qo * hq), -std::numeric_limits<double>::infinity());
  for (size_t b = 0; b < p.qo_len.size(); ++b) {
    const int64_t qo = p.qo_len[b], kv = p.kv_len[b];
    for (int64_t i = 0; i < qo; ++i) {
      const int64_t row = in.qo_indptr[b] + i;
      for (int64_t h = 0; h < hq; ++h) {
        std::vector<long double> score;
        std::vector<int64_t> key;
        for (int64_t j = 0; j < kv; ++j) {
          if (causal && j > kv - qo + i) continue;
          long double s = 0;
          for (int64_t d = 0; d < d_max; ++d)
            s += (long double)in.q.at({row, h, d}) * in.k.at({in.kv_indptr[b] + j, h / group, d});
          score.push_back(scale * s);
          key.push_back(j);
        }
        if (score.empty()) continue;
        long double m = score[0];
        for (long double s : score) m = std::max(m, s);
        long double z = 0;
        for (long double s : score) z += std::exp(s - m);
        for (int64_t d = 0; d < d_max; ++d) {
          long double acc = 0;
          for (size_t j = 0; j < score.size(); ++j)
            acc += std::exp(score[j] - m) / z * in.v.at({in.kv_indptr[b] + key[j], h / group, d});
          out.o[size_t((row * hq + h) * d_max + d)] = double(acc);
        }
        out.lse[size_t(row * hq + h)] = double(m + std::log(z));
      }
    }
  }
  return out;
}

// The naive output rounded to the problem's dtype, as the library stores it.
inline std::vector<double> round_to(const std::vector<double>& values, DType dtype) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = float(values[i]);
    if (dtype == DType::kBF16) out[i] = bf16_to_float(float_to_bf16(f));
    else if (dtype == DType::kFP16) out[i] = fp16_to_float(float_to_fp16(f));
    else out[i] = f;
  }
  return out;
}

}  // namespace gqattn::test
