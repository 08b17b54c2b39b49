// The registry of mha::mha: the list CMake writes from the mha_add_backend calls, best first.
#include "mha/registry.hpp"

#include <cstdlib>

#include "base/text.hpp"
#include "core/backend_list.hpp"
#include "mha/backends/all.hpp"  // the backends MHA_BACKEND_LIST names
#include "mha/error.hpp"

namespace mha {
namespace {

std::string names_of(const std::vector<const backend*>& list) {
  std::string names;
  for (const backend* b : list) names += (names.empty() ? "" : ", ") + std::string(b->name());
  return names;
}

}  // namespace

const std::vector<const backend*>& available_backends() {
  // The built backends in their declared order, best first (CMakeLists.txt, mha_add_backend).
  static const std::vector<const backend*> list = {MHA_BACKEND_LIST};
  return list;
}

const backend* find_backend(std::string_view name) noexcept {
  for (const backend* b : available_backends()) {
    if (b->name() == name) return b;
  }
  return nullptr;
}

const backend& require_backend(std::string_view name) {
  if (const backend* b = find_backend(name)) return *b;
  throw invalid_argument(detail::text("mha: unknown backend '", name,
                                      "'; available: ", names_of(available_backends())));
}

const backend& default_backend() {
  const char* env = std::getenv("MHA_BACKEND");
  if (env == nullptr || *env == '\0') return *available_backends().front();
  if (const backend* b = find_backend(env)) return *b;
  throw invalid_argument(detail::text("mha: MHA_BACKEND names unknown backend '", env,
                                      "'; available: ", names_of(available_backends())));
}

}  // namespace mha
