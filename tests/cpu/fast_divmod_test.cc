// FastDivmod (src/prims/fast_divmod.h), the division by a run-time constant that every kernel uses
// for pages, groups and the split merge's request guess: its host path is the device path's
// arithmetic (a 32-bit multiply-high, an add and a shift), checked here against integer division
// over its whole stated domain's edges and random numerators. Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "prims/fast_divmod.h"

namespace gqattn {
namespace {

void expect_exact(uint32_t d, uint32_t n) {
  const FastDivmod f(d);
  uint32_t q = 0, r = 0;
  f.divmod(n, q, r);
  ASSERT_EQ(q, n / d) << n << " / " << d;
  ASSERT_EQ(r, n % d) << n << " % " << d;
}

// Numerators near 0, near multiples of d and near the top of the domain (2^31 - 1).
std::vector<uint32_t> edge_numerators(uint32_t d) {
  const uint32_t top = (uint32_t(1) << 31) - 1;
  std::vector<uint32_t> n = {0, 1, 2, top, top - 1, d - 1, d};
  for (uint32_t m : {uint32_t(1), uint32_t(2), uint32_t(3), top / d - 1, top / d}) {
    const uint64_t base = uint64_t(m) * d;
    for (int64_t delta = -1; delta <= 1; ++delta) {
      const int64_t v = int64_t(base) + delta;
      if (v >= 0 && v <= int64_t(top)) n.push_back(uint32_t(v));
    }
  }
  return n;
}

TEST(FastDivmod, SmallDivisorsEdgesAndRandom) {
  std::mt19937 rng(20261204);
  std::uniform_int_distribution<uint32_t> any(0, (uint32_t(1) << 31) - 1);
  for (uint32_t d = 1; d <= 4096; ++d) {
    for (uint32_t n : edge_numerators(d)) expect_exact(d, n);
    for (int i = 0; i < 64; ++i) expect_exact(d, any(rng));
  }
}

TEST(FastDivmod, LargeAndPowerOfTwoDivisors) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any(0, (uint32_t(1) << 31) - 1);
  std::vector<uint32_t> divisors = {65535, 65536, 65537, 1000003, (uint32_t(1) << 30) + 1, (uint32_t(1) << 31) - 1};
  for (int s = 0; s <= 30; ++s) divisors.push_back(uint32_t(1) << s);
  for (int i = 0; i < 2000; ++i) divisors.push_back(any(rng) | 1u);
  for (uint32_t d : divisors) {
    for (uint32_t n : edge_numerators(d)) expect_exact(d, n);
    for (int i = 0; i < 64; ++i) expect_exact(d, any(rng));
  }
}

}  // namespace
}  // namespace gqattn
