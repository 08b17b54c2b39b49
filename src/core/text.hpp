// Internal: building error messages.
#pragma once

#include <sstream>
#include <string>
#include <utility>

namespace mha::detail {

// Streams every argument into one string: text("d_out (", 10, ") must be ...").
template <class... Args>
std::string text(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace mha::detail
