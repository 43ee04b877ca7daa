// A strict, bounded JSON parser for the small documents the engine reads: safetensors headers and
// a checkpoint's config.json. Depth and value count are bounded, so a hostile file fails with a
// message instead of exhausting the stack or memory. Layer: engine (host-only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gqattn::engine {

struct Json {
  enum class Kind { kNull, kBool, kString, kNumber, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  std::string str;
  double number = 0;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in file order; names are unique

  // An object's member by name; nullptr when absent (or when this is not an object).
  const Json* find(const std::string& name) const;
  // The number when it is an integer of magnitude below 2^53 (exact in a double), else nullopt.
  std::optional<int64_t> integer() const;
};

// Parses one JSON document (a value, then only white space). Throws gqattn::Error
// "<context> at byte N: <problem>" for malformed text, nesting deeper than 64, more than 2^20
// values or a duplicate member name.
Json parse_json(const std::string& text, const std::string& context);

}  // namespace gqattn::engine
