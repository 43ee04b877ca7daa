// The attention backend registry. Layer: engine (host-only).
#include "attention_backend.h"

#include <map>

#include "gqattn/error.h"

namespace gqattn::engine {

namespace {

std::map<std::string, AttentionBackendFactory>& registry() {
  static std::map<std::string, AttentionBackendFactory> backends = {
      {"gqattn", make_gqattn_backend},
      {"expand", make_expand_backend},
  };
  return backends;
}

}  // namespace

void register_attention_backend(const std::string& name, AttentionBackendFactory factory) {
  registry()[name] = std::move(factory);
}

std::unique_ptr<AttentionBackend> make_attention_backend(const std::string& name, const AttentionContext& context) {
  const auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& [n, f] : registry()) known += (known.empty() ? "" : "|") + n;
    throw Error("--attention: unknown backend '" + name + "' (expected " + known + ")");
  }
  return it->second(context);
}

std::vector<std::string> attention_backend_names() {
  std::vector<std::string> names;
  for (const auto& [n, f] : registry()) names.push_back(n);
  return names;
}

}  // namespace gqattn::engine
