// Counter-based random numbers shared by the host and the GPU: a value depends only on
// (seed, stream, index), so random weights are bit-identical on the CPU and CUDA paths and a
// request's samples do not depend on how it was batched. Layer: engine (host and device, header-only).
#pragma once

#include <cstdint>

#include "prims/counter_random.h"
#include "prims/host_device.h"

namespace gqattn::engine {

// mix64, random_bits (64 bits for element `index` of stream `stream` under `seed`) and uniform01
// ([0, 1) from 53 bits): src/prims/counter_random.h.
using prims::mix64;
using prims::random_bits;
using prims::uniform01;

// The streams under one seed, each independent of the others: the random weights take their tensor
// ids (small integers), the bench's random prompts kPromptStream + request index, and sampling
// kSampleStream + request id (it took the bare request id, so request r's draws were the bits of
// weight tensor r).
constexpr uint64_t kPromptStream = 0x70726f6d7074ull;  // "prompt"
constexpr uint64_t kSampleStream = 0x73616d706c65ull;  // "sample"

// Uniform in [-1, 1) on a grid of 2^-23: exact in float, so the host and the GPU agree bit for bit.
GQ_HOST_DEVICE float uniform_pm1(uint64_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

// A random weight: uniform with standard deviation `std` (half-width std * sqrt(3)); `half_width`
// is that product as float, computed once by the caller. One float multiply of exact operands,
// so it rounds identically everywhere.
GQ_HOST_DEVICE float random_weight(uint64_t seed, uint64_t tensor_id, uint64_t index, float half_width) {
  return uniform_pm1(random_bits(seed, tensor_id, index)) * half_width;
}

}  // namespace gqattn::engine
