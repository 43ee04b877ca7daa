// Random attention cases for the GPU tests' sweep over shapes (GpuRandomShapes): decode and
// prefill configurations drawn from a seeded generator, legal for the CUDA planner by
// construction. tests/cpu/random_cases_test.cc plans the GPU tests' own draws (their seeds and
// count below) for every list of head dims and dtypes a build can report, with the checks the
// CPU planner shares with CUDA's plus CUDA's 1..8 new tokens a decode (the kernel choice itself
// needs a CUDA build). The hand-made matrices test named corners; these draw the combinations
// between them. Layer: tests (host-only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "gqattn/attention.h"
#include "gqattn/paged_kv.h"

namespace gqattn::test {

// GpuRandomShapes' draws: its decode case i is the i-th random_decode_case of
// std::mt19937_64(kRandomDecodeSeed) over build_info()'s head_dims and dtypes (in that order: a
// build's lists change every draw), with inputs from seed kRandomDecodeSeed + i; prefill likewise.
constexpr uint64_t kRandomDecodeSeed = 4100;
constexpr uint64_t kRandomPrefillSeed = 4200;
constexpr int kRandomCasesPerTest = 40;

struct RandomCase {
  DType dtype = DType::kBF16;
  int num_qo_heads = 1, num_kv_heads = 1, head_dim = 128;
  int page_size = 16;  // prefill: 0 = contiguous (ragged) K/V
  KVLayout layout = KVLayout::kNHD;
  bool causal = true;                  // decode: always
  int qo_len = 1;                      // decode: new tokens per request (1..8)
  std::vector<int32_t> qo_lens;        // prefill: per request
  std::vector<int32_t> kv_len;         // per request
};

namespace random_cases_detail {
template <typename T>
T pick(std::mt19937_64& rng, const std::vector<T>& from) {
  return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
}
inline int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Group sizes 1..32, not only powers of two, over 1, 2, 4 or 8 K/V heads: at most 64 query heads.
inline void pick_heads(std::mt19937_64& rng, RandomCase& c) {
  c.num_kv_heads = pick<int>(rng, {1, 2, 4, 8});
  std::vector<int> groups;
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32})
    if (g * c.num_kv_heads <= 64) groups.push_back(g);
  c.num_qo_heads = pick(rng, groups) * c.num_kv_heads;
}
// dtype, head_dim, heads, page size (from `page_sizes`) and layout, drawn in that order.
inline RandomCase pick_shape(std::mt19937_64& rng, const std::vector<int>& head_dims, const std::vector<DType>& dtypes,
                             const std::vector<int>& page_sizes) {
  RandomCase c;
  c.dtype = pick(rng, dtypes);
  c.head_dim = pick(rng, head_dims);
  pick_heads(rng, c);
  c.page_size = pick(rng, page_sizes);
  c.layout = uniform(rng, 0, 1) ? KVLayout::kHND : KVLayout::kNHD;
  return c;
}
}  // namespace random_cases_detail

// A decode case: 1..24 requests of 1..8 new tokens (one token in half the cases) and kv_len 0 or
// qo_len..2500 (a tenth of the requests empty, a tenth at exactly qo_len), pages of 1..256 keys.
inline RandomCase random_decode_case(std::mt19937_64& rng, const std::vector<int>& head_dims,
                                     const std::vector<DType>& dtypes) {
  using namespace random_cases_detail;
  RandomCase c = pick_shape(rng, head_dims, dtypes, {1, 2, 3, 5, 8, 16, 16, 32, 64, 128, 256});
  c.qo_len = uniform(rng, 0, 1) ? 1 : uniform(rng, 2, 8);
  const int batch = uniform(rng, 1, 24);
  const int max_len = pick<int>(rng, {64, 300, 1000, 2500});
  for (int b = 0; b < batch; ++b) {
    const int roll = uniform(rng, 0, 9);
    c.kv_len.push_back(roll == 0 ? 0 : roll == 1 ? c.qo_len : uniform(rng, c.qo_len, std::max(c.qo_len, max_len)));
  }
  return c;
}

// A prefill case: 1..5 requests of 0..200 query tokens over a cached prefix of 0..600 keys
// (causal: kv_len >= qo_len, or an empty KV; not causal: also an empty KV beside query rows, and
// fewer keys than query tokens, each in a tenth of the requests), contiguous K/V or pages of
// 1..256 keys.
inline RandomCase random_prefill_case(std::mt19937_64& rng, const std::vector<int>& head_dims,
                                      const std::vector<DType>& dtypes) {
  using namespace random_cases_detail;
  RandomCase c = pick_shape(rng, head_dims, dtypes, {0, 0, 1, 3, 7, 16, 32, 64, 128, 256});
  c.causal = uniform(rng, 0, 2) != 0;
  const int batch = uniform(rng, 1, 5);
  for (int b = 0; b < batch; ++b) {
    const int roll = uniform(rng, 0, 9);
    const int qo = roll == 0 ? 0 : roll == 1 ? 1 : uniform(rng, 2, 200);
    const int prefix = uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 600);
    c.qo_lens.push_back(qo);
    // Roll 2 and 3 draw 2..200 query tokens: not causal, they see no key, or 1..qo_len - 1 keys.
    c.kv_len.push_back(c.causal ? qo + prefix : roll == 2 ? 0 : roll == 3 ? uniform(rng, 1, qo - 1) : qo + prefix);
  }
  return c;
}

// The CPU plan inputs of a case: its lengths as a page table (make_random_page_table, as the GPU
// tests' check_decode / check_prefill build theirs) or a token indptr.
inline PlanInputs random_case_plan_inputs(const RandomCase& c, bool decode) {
  PlanInputs in;
  in.device = Device::kCPU;
  in.dtype = c.dtype;
  in.num_qo_heads = c.num_qo_heads;
  in.num_kv_heads = c.num_kv_heads;
  in.head_dim = c.head_dim;
  in.page_size = c.page_size;
  in.causal = decode || c.causal;
  if (decode) in.qo_len = c.qo_len;
  else in.qo_indptr = token_indptr(c.qo_lens);
  if (c.page_size > 0) {
    const PageTable table = make_random_page_table(c.kv_len, c.page_size, /*seed=*/0, /*extra_pages=*/0);
    in.kv_indptr = table.kv_page_indptr;
    in.kv_last_page_len = table.kv_last_page_len;
  } else {
    in.kv_indptr = token_indptr(c.kv_len);
  }
  return in;
}

}  // namespace gqattn::test
