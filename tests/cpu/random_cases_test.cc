// The random cases of the GPU tests' GpuRandomShapes (tests/common/random_cases.h) are legal: many
// drawn over every head dim and both 16-bit dtypes plan without error on the CPU (the checks the
// CUDA planner shares), decode keeps to CUDA's 1..8 new tokens, and the draws reach the corners
// they are meant to (empty requests, group sizes that are not powers of two, every page size);
// and the GPU tests' own draws (their seeds) plan for every head-dim and dtype list a build can
// report. Layer: tests (cpu).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "api/validate.h"
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

// The cases GpuRandomShapes draws, for each list build_info() can give: any non-empty set of the
// generated head dims (ascending, the kernel table's order) and of the dtypes (bf16 before fp16),
// e.g. device_plan.sh v201's 64 / 80 / 128 / 256 in bf16, wip_check.sh's bf16 builds, gpu_check.sh's
// full build. The head dim and dtype drawn change the draws after them, so each list has its own.
TEST(RandomCases, TheGpuTestsDrawsPlanForEveryBuild) {
  int lists = 0;
  for (unsigned hd_mask = 1; hd_mask < (1u << kHeadDims.size()); ++hd_mask) {
    std::vector<int> head_dims;
    for (size_t i = 0; i < kHeadDims.size(); ++i)
      if (hd_mask & (1u << i)) head_dims.push_back(kHeadDims[i]);
    for (unsigned dt_mask = 1; dt_mask < (1u << kDtypes.size()); ++dt_mask) {
      std::vector<DType> dtypes;
      for (size_t i = 0; i < kDtypes.size(); ++i)
        if (dt_mask & (1u << i)) dtypes.push_back(kDtypes[i]);
      std::string list = "head dims";
      for (int hd : head_dims) list += " " + std::to_string(hd);
      list += ", dtypes";
      for (DType dt : dtypes) list += std::string(" ") + dtype_name(dt);
      SCOPED_TRACE(list);
      std::mt19937_64 decode_rng(kRandomDecodeSeed), prefill_rng(kRandomPrefillSeed);
      for (int i = 0; i < kRandomCasesPerTest; ++i) {
        const RandomCase d = random_decode_case(decode_rng, head_dims, dtypes);
        ASSERT_TRUE(d.qo_len >= 1 && d.qo_len <= kCudaMaxDecodeQoLen) << "decode case " << i;
        ASSERT_NO_THROW(decode_plan(random_case_plan_inputs(d, true), Workspace{})) << "decode case " << i;
        const RandomCase p = random_prefill_case(prefill_rng, head_dims, dtypes);
        ASSERT_NO_THROW(prefill_plan(random_case_plan_inputs(p, false), Workspace{})) << "prefill case " << i;
      }
      ++lists;
    }
  }
  EXPECT_EQ(lists, 63 * 3);
}

}  // namespace
}  // namespace gqattn::test
