// FastDivmod: division by a run-time constant as a multiply-high and a shift.
// Layer: src/prims. Host code builds it (plain data); device code divides with it.
#pragma once

#include <cstdint>

#include "prims/host_device.h"

namespace gqattn {

// Exact for 0 <= n < 2^31 and 1 <= divisor < 2^31.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t mul = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    uint32_t s = 0;
    while ((uint64_t(1) << s) < d) ++s;
    shift = s;
    mul = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }

  GQ_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t(n) * mul) >> 32);
#endif
    return (hi + n) >> shift;
  }
  GQ_HOST_DEVICE void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace gqattn
