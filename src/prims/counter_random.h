// Counter-based random numbers: a value depends only on (seed, stream, index), so any element of a
// stream can be made on its own, in any order, on the host or the GPU, with the same bits.
// Layer: src/prims (host and device, header-only). Used by the engine (random weights, sampling,
// prompts: engine/random.h) and by the tests' random tensors (tests/common/test_util.h).
#pragma once

#include <cstdint>

#include "prims/host_device.h"

namespace gqattn::prims {

// splitmix64's finaliser: a bijective 64-bit mix.
GQ_HOST_DEVICE uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 64 random bits for element `index` of stream `stream` under `seed`.
GQ_HOST_DEVICE uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}

// Uniform in [0, 1) from the top 53 of 64 random bits.
inline double uniform01(uint64_t bits) { return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace gqattn::prims
