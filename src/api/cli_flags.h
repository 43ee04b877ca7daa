// Command-line flag values for gqattn-bench and gqattn-serve: each parser names the flag in its
// UsageError (the tools print it with a hint and exit 2). Layer: src/api (host-only, header-only;
// used by the tools, not part of the library's API).
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "gqattn/paged_kv.h"

namespace gqattn::cli {

// A bad command line.
struct UsageError {
  std::string message;
};

inline int64_t parse_int64(const std::string& flag, const std::string& value, int64_t lo, int64_t hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) throw UsageError{flag + ": expected an integer, got '" + value + "'"};
  if (v < lo || v > hi)
    throw UsageError{flag + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + value};
  return v;
}

// An int32 of at least `lo`.
inline int parse_int(const std::string& flag, const std::string& value, int lo = INT32_MIN) {
  return static_cast<int>(parse_int64(flag, value, lo, INT32_MAX));
}

// A finite number of at least `lo`.
inline double parse_double(const std::string& flag, const std::string& value, double lo) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !std::isfinite(v))
    throw UsageError{flag + ": expected a number, got '" + value + "'"};
  if (v < lo) throw UsageError{flag + ": must be >= " + std::to_string(lo) + ", got " + value};
  return v;
}

inline bool parse_bool01(const std::string& flag, const std::string& value) {
  if (value == "0" || value == "1") return value == "1";
  throw UsageError{flag + ": expected 0 or 1, got '" + value + "'"};
}

inline std::string parse_choice(const std::string& flag, const std::string& value,
                                const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
  std::string all;
  for (const auto& c : choices) all += (all.empty() ? "" : "|") + c;
  throw UsageError{flag + ": expected " + all + ", got '" + value + "'"};
}

// A K/V page layout: nhd or hnd.
inline KVLayout parse_kv_layout(const std::string& flag, const std::string& value) {
  return parse_choice(flag, value, {"nhd", "hnd"}) == "hnd" ? KVLayout::kHND : KVLayout::kNHD;
}

}  // namespace gqattn::cli
