// Counter-based random numbers shared by the host and the GPU: a value depends only on
// (seed, stream, index), so random weights are bit-identical on the CPU and CUDA paths and a
// request's samples do not depend on how it was batched. Layer: engine (host and device, header-only).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GQ_ENGINE_HD __host__ __device__
#else
#define GQ_ENGINE_HD
#endif

namespace gqattn::engine {

// splitmix64's finaliser: a bijective 64-bit mix.
GQ_ENGINE_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 64 random bits for element `index` of stream `stream` under `seed`.
GQ_ENGINE_HD inline uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}

// Uniform in [-1, 1) on a grid of 2^-23: exact in float, so the host and the GPU agree bit for bit.
GQ_ENGINE_HD inline float uniform_pm1(uint64_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

// Uniform in [0, 1) with 53 random bits (host sampling).
inline double uniform01(uint64_t bits) { return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0); }

// A random weight: uniform with standard deviation `std` (half-width std * sqrt(3)); `half_width`
// is that product as float, computed once by the caller. One float multiply of exact operands,
// so it rounds identically everywhere.
GQ_ENGINE_HD inline float random_weight(uint64_t seed, uint64_t tensor_id, uint64_t index, float half_width) {
  return uniform_pm1(random_bits(seed, tensor_id, index)) * half_width;
}

}  // namespace gqattn::engine
