// Host conversions between bf16 / fp16 bit patterns and float (round to nearest even, NaN and
// inf preserved), and element access by DType for strided host buffers.
// Layer: src/api (host-only). Used by the CPU backend, the tests and the gqattn-bench CLI.
#pragma once

#include <cstdint>
#include <cstring>

#include "gqattn/tensor.h"

namespace gqattn {

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace detail

// bf16 is the top half of an IEEE float.
inline float bf16_to_float(uint16_t h) { return detail::bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = detail::float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7FFFu + lsb) >> 16);  // ties to even; overflow rounds to inf
}

// fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals below 2^-14.
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float mag = float(mant) * detail::bits_float(0x33800000u);
    return sign ? -mag : mag;
  }
  if (exp == 0x1Fu) return detail::bits_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = detail::float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
  if (a >= 0x47800000u) return uint16_t(sign | 0x7C00u);  // >= 2^16 (or inf): inf
  if (a >= 0x38800000u) {
    // Normal fp16 range (>= 2^-14): rebias the exponent, round 13 mantissa bits away. A carry out
    // of the mantissa bumps the exponent, and past 65504 that correctly yields inf.
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3FFu);
    const uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 ties to even zero)
  // Subnormal: value / 2^-24 = mant >> shift, with the hidden bit restored.
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - (a >> 23);  // 14 .. 24
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

// Element `idx` (in elements from `base`) of a buffer of `dtype`, widened to double.
inline double load_as_double(const void* base, DType dtype, int64_t idx) {
  switch (dtype) {
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[idx]);
    case DType::kFP16: return fp16_to_float(static_cast<const uint16_t*>(base)[idx]);
    case DType::kFP32: return static_cast<const float*>(base)[idx];
    case DType::kInt32: return static_cast<const int32_t*>(base)[idx];
  }
  return 0.0;
}

// `value` rounded to float toward zero, with the last mantissa bit set where that lost anything
// ("round to odd"). Rounded again to a format of at most 22 mantissa bits (bf16, fp16), to nearest
// even, this gives what rounding `value` once would: a plain float(value) first could round up to a
// tie of the second rounding (1 + 2^-11 + 2^-24 became fp16 1.0, not 1 + 2^-10).
inline float double_to_float_odd(double value) {
  const float f = float(value);  // to nearest even
  if (value != value || double(f) == value) return f;
  uint32_t u = detail::float_bits(f);
  if ((double(f) < 0 ? -double(f) : double(f)) > (value < 0 ? -value : value)) --u;  // toward zero
  return detail::bits_float(u | 1u);
}

// Stores `value` rounded to `dtype`, to nearest even (once: bf16 and fp16 through
// double_to_float_odd).
inline void store_from_double(void* base, DType dtype, int64_t idx, double value) {
  switch (dtype) {
    case DType::kBF16: static_cast<uint16_t*>(base)[idx] = float_to_bf16(double_to_float_odd(value)); return;
    case DType::kFP16: static_cast<uint16_t*>(base)[idx] = float_to_fp16(double_to_float_odd(value)); return;
    case DType::kFP32: static_cast<float*>(base)[idx] = float(value); return;
    case DType::kInt32: static_cast<int32_t*>(base)[idx] = int32_t(value); return;
  }
}

}  // namespace gqattn
