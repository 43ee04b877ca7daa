// Run-time switches read from the environment (GQATTN_DISABLE_SM90, GQATTN_DISABLE_TMA): a switch
// is on when the variable is set to anything but "" or "0". Callers read it once per process.
// Layer: src/api (host-only helper; used by dispatch and kernel launchers).
#pragma once

#include <cstdlib>
#include <cstring>

namespace gqattn {

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
}

}  // namespace gqattn
