// The random cases of the GPU tests' GpuRandomShapes (tests/common/random_cases.h) are legal: many
// drawn over every head dim and both 16-bit dtypes plan without error on the CPU (the checks the
// CUDA planner shares), decode keeps to CUDA's 1..8 new tokens, and the draws reach the corners
// they are meant to (empty requests, group sizes that are not powers of two, every page size).
// Layer: tests (cpu).
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "common/random_cases.h"
#include "gqattn/attention.h"

namespace gqattn::test {
namespace {

const std::vector<int> kHeadDims = {64, 80, 96, 112, 128, 256};
const std::vector<DType> kDtypes = {DType::kBF16, DType::kFP16};

TEST(RandomCases, DecodeCasesPlan) {
  std::mt19937_64 rng(1);
  std::set<int> groups, pages;
  int empty = 0, draft = 0;
  for (int i = 0; i < 2000; ++i) {
    const RandomCase c = random_decode_case(rng, kHeadDims, kDtypes);
    ASSERT_GE(c.qo_len, 1);
    ASSERT_LE(c.qo_len, 8);
    ASSERT_NO_THROW(decode_plan(random_case_plan_inputs(c, true), Workspace{})) << "case " << i;
    groups.insert(c.num_qo_heads / c.num_kv_heads);
    pages.insert(c.page_size);
    for (int32_t l : c.kv_len) empty += l == 0;
    draft += c.qo_len > 1;
  }
  EXPECT_GT(empty, 0);
  EXPECT_GT(draft, 0);
  EXPECT_TRUE(groups.count(3) && groups.count(5) && groups.count(12) && groups.count(32));
  EXPECT_EQ(pages.size(), 10u);
}

TEST(RandomCases, PrefillCasesPlan) {
  std::mt19937_64 rng(2);
  int ragged = 0, non_causal = 0, empty_q = 0, empty_kv = 0, short_kv = 0;
  for (int i = 0; i < 2000; ++i) {
    const RandomCase c = random_prefill_case(rng, kHeadDims, kDtypes);
    ASSERT_EQ(c.qo_lens.size(), c.kv_len.size());
    ASSERT_NO_THROW(prefill_plan(random_case_plan_inputs(c, false), Workspace{})) << "case " << i;
    ragged += c.page_size == 0;
    non_causal += !c.causal;
    for (size_t b = 0; b < c.kv_len.size(); ++b) {
      empty_q += c.qo_lens[b] == 0;
      empty_kv += c.kv_len[b] == 0 && c.qo_lens[b] > 0;
      short_kv += c.kv_len[b] > 0 && c.kv_len[b] < c.qo_lens[b];
      ASSERT_TRUE(!c.causal || c.kv_len[b] == 0 || c.kv_len[b] >= c.qo_lens[b]) << "case " << i;
    }
  }
  EXPECT_GT(ragged, 0);
  EXPECT_GT(non_causal, 0);
  EXPECT_GT(empty_q, 0);
  EXPECT_GT(empty_kv, 0);
  EXPECT_GT(short_kv, 0);  // not causal: fewer keys than query tokens
}

}  // namespace
}  // namespace gqattn::test
