// Host bf16 / fp16 conversions: exhaustive round trips, round-to-nearest-even against an
// independent nearest-neighbour search, NaN / inf / subnormals, and load/store by DType.
// Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "api/host_float.h"

namespace gqattn {
namespace {

bool is_nan16(uint16_t h, bool bf16) {
  return bf16 ? ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu)) : ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu));
}

// Every finite or infinite 16-bit pattern survives to float and back unchanged.
TEST(HostFloat, ExhaustiveRoundTrip) {
  for (uint32_t i = 0; i <= 0xFFFFu; ++i) {
    const uint16_t h = uint16_t(i);
    if (!is_nan16(h, true)) ASSERT_EQ(float_to_bf16(bf16_to_float(h)), h) << std::hex << i;
    else ASSERT_TRUE(std::isnan(bf16_to_float(h)));
    if (!is_nan16(h, false)) ASSERT_EQ(float_to_fp16(fp16_to_float(h)), h) << std::hex << i;
    else ASSERT_TRUE(std::isnan(fp16_to_float(h)));
  }
}

// The representable value nearest to x among all 16-bit patterns (ties to the even pattern),
// found by bisection over the ordered positive patterns: independent of the bit tricks.
uint16_t nearest(float x, bool bf16) {
  auto value = [&](uint16_t h) { return double(bf16 ? bf16_to_float(h) : fp16_to_float(h)); };
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(double(x));
  const uint16_t max_finite = bf16 ? 0x7F7F : 0x7BFF;
  const double max_v = value(max_finite);
  const double next_ulp = bf16 ? std::ldexp(1.0, 127 - 7) : std::ldexp(1.0, 15 - 10);
  if (a >= max_v + next_ulp / 2) return uint16_t(sign | (bf16 ? 0x7F80 : 0x7C00));  // rounds to inf
  uint16_t lo = 0, hi = max_finite;  // invariant: value(lo) <= a
  while (hi - lo > 1) {
    const uint16_t mid = uint16_t((lo + hi) / 2);
    if (value(mid) <= a) lo = mid; else hi = mid;
  }
  if (value(hi) <= a) lo = hi;
  if (lo == max_finite) return uint16_t(sign | lo);
  const uint16_t up = uint16_t(lo + 1);
  const double dl = a - value(lo), du = value(up) - a;
  const uint16_t pick = dl < du ? lo : du < dl ? up : ((lo & 1) ? up : lo);
  return uint16_t(sign | pick);
}

TEST(HostFloat, RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-30.f, 18.f);
  for (int i = 0; i < 200000; ++i) {
    float x = std::ldexp(1.f + float(rng() % (1u << 23)) / float(1u << 23), int(exponent(rng)));
    if (rng() & 1) x = -x;
    ASSERT_EQ(float_to_bf16(x), nearest(x, true)) << x;
    ASSERT_EQ(float_to_fp16(x), nearest(x, false)) << x;
  }
  // Exact ties: halfway between 1 and the next value rounds to the even one (1).
  EXPECT_EQ(float_to_bf16(1.f + 1.f / 256), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.f + 3.f / 256), 0x3F82);
  EXPECT_EQ(float_to_fp16(1.f + 1.f / 2048), 0x3C00);
  EXPECT_EQ(float_to_fp16(1.f + 3.f / 2048), 0x3C02);
}

TEST(HostFloat, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7F80);
  EXPECT_EQ(float_to_bf16(-inf), 0xFF80);
  EXPECT_EQ(float_to_fp16(inf), 0x7C00);
  EXPECT_EQ(float_to_fp16(-inf), 0xFC00);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-std::nanf("")))));
  EXPECT_EQ(float_to_fp16(65504.f), 0x7BFF);   // largest fp16
  EXPECT_EQ(float_to_fp16(65519.f), 0x7BFF);   // below the halfway point
  EXPECT_EQ(float_to_fp16(65520.f), 0x7C00);   // halfway to 65536 rounds to even: inf
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7F80);   // above the largest bf16 (3.39e38): inf
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -25)), 0x0000);  // half of it ties to even zero
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(-0.f), 0x8000);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.f, -24));
  EXPECT_EQ(fp16_to_float(0x03FF), std::ldexp(1023.f, -24));
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.f, -14));
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.f, -133));
}

TEST(HostFloat, LoadStoreByDtype) {
  uint16_t h[2] = {0, 0};
  float f[2] = {0, 0};
  int32_t i[2] = {0, 0};
  store_from_double(h, DType::kBF16, 1, 1.5);
  EXPECT_EQ(h[1], 0x3FC0);
  EXPECT_EQ(load_as_double(h, DType::kBF16, 1), 1.5);
  store_from_double(h, DType::kFP16, 0, -2.0);
  EXPECT_EQ(h[0], 0xC000);
  EXPECT_EQ(load_as_double(h, DType::kFP16, 0), -2.0);
  store_from_double(f, DType::kFP32, 1, 0.1);
  EXPECT_EQ(f[1], 0.1f);
  EXPECT_EQ(load_as_double(f, DType::kFP32, 1), double(0.1f));
  store_from_double(i, DType::kInt32, 0, 42);
  EXPECT_EQ(load_as_double(i, DType::kInt32, 0), 42.0);
  store_from_double(f, DType::kFP32, 0, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(f[0], -std::numeric_limits<float>::infinity());
}

// Rounded once from double: a value just above a tie of the target format must not round to the
// tie in float first (1 + 2^-11 + 2^-24 is fp16 1 + 2^-10, not 1.0).
TEST(HostFloat, StoreFromDoubleRoundsOnce) {
  uint16_t h = 0;
  store_from_double(&h, DType::kFP16, 0, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -24));
  EXPECT_EQ(h, 0x3C01);
  store_from_double(&h, DType::kFP16, 0, -(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)));
  EXPECT_EQ(h, 0xBC01);
  store_from_double(&h, DType::kFP16, 0, 1.0 + std::ldexp(1.0, -11));  // the tie itself: to even
  EXPECT_EQ(h, 0x3C00);
  store_from_double(&h, DType::kBF16, 0, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  EXPECT_EQ(h, 0x3F81);
  store_from_double(&h, DType::kBF16, 0, 1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -30));
  EXPECT_EQ(h, 0x3F80);
  store_from_double(&h, DType::kBF16, 0, std::ldexp(1.0, -134) + std::ldexp(1.0, -160));  // subnormal
  EXPECT_EQ(h, 0x0001);
  store_from_double(&h, DType::kBF16, 0, 1e300);  // past float: inf
  EXPECT_EQ(h, 0x7F80);
  store_from_double(&h, DType::kFP16, 0, 65519.99);  // below fp16's rounding boundary to inf
  EXPECT_EQ(h, 0x7BFF);
  store_from_double(&h, DType::kFP16, 0, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(h & 0x7C00, 0x7C00);
  EXPECT_NE(h & 0x03FF, 0);
  // Exact values stay exact.
  for (const double v : {0.0, -0.0, 1.0, -2.5, 65504.0, std::ldexp(1.0, -24)}) {
    store_from_double(&h, DType::kFP16, 0, v);
    EXPECT_EQ(load_as_double(&h, DType::kFP16, 0), v);
  }
}

}  // namespace
}  // namespace gqattn
