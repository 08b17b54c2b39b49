// mha: choosing a backend at run time (link mha::mha). To use one backend only, link its target
// (mha::naive, mha::xsimd, ...) and call its accessor from mha/backends/<name>.hpp instead.
#pragma once

#include <string_view>
#include <vector>

#include "mha/backend.hpp"

namespace mha {

// Every backend built into this library, best first; naive is always present and always last.
// The list is fixed at build time (CMake options MHA_BACKEND_<NAME>), never by static
// self-registration.
const std::vector<const backend*>& available_backends();

// The backend called `name`, or nullptr when no such backend is built.
const backend* find_backend(std::string_view name) noexcept;

// The backend called `name`; throws mha::invalid_argument listing the available names.
const backend& require_backend(std::string_view name);

// The backend named by the environment variable MHA_BACKEND when it is set and not empty
// (an unknown name throws mha::invalid_argument listing the available ones), else the best.
const backend& default_backend();

}  // namespace mha
