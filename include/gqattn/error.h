// gqattn::Error and the GQ_CHECK macro: how every public entry reports bad input.
// Layer: include/gqattn (public, host-only).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gqattn {

// Thrown by every public function on invalid input or a failed CUDA call. The message names the
// argument and the offending values. A call that throws has written nothing to its outputs.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace gqattn

// GQ_CHECK(cond, "q: expected 3 dims, got ", q.ndim): throws gqattn::Error with the parts joined.
#define GQ_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) throw ::gqattn::Error(::gqattn::detail::concat(__VA_ARGS__)); \
  } while (0)
