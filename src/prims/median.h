// The median of a set of timings: the middle value, or the mean of the middle two for an even
// count (as Python's statistics.median, which bench/peers.py uses). values must not be empty.
// Host-only.
// Layer: src/prims (the read ceiling's timing in src/kernels/median_time.h and gqattn-bench).
#pragma once

#include <algorithm>
#include <vector>

namespace gqattn::prims {

inline double median_of(std::vector<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double below = *std::max_element(values.begin(), values.begin() + mid);
  return (below + values[mid]) / 2;
}

}  // namespace gqattn::prims
