// Internal: building error messages.
#pragma once

#include <array>
#include <charconv>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace mha::detail {

// A value for a message: floating-point values in their shortest round-trip form (0.99999994f
// prints as 0.99999994, not as the stream's default 6 digits' "1"), the rest as streamed.
template <class T>
void put(std::ostringstream& out, T&& value) {
  if constexpr (std::is_floating_point_v<std::remove_cvref_t<T>>) {
    std::array<char, 64> digits;
    const auto [end, ec] = std::to_chars(digits.data(), digits.data() + digits.size(), value);
    out.write(digits.data(), ec == std::errc{} ? end - digits.data() : 0);
  } else {
    out << std::forward<T>(value);
  }
}

// Streams every argument into one string: text("d_out (", 10, ") must be ...").
template <class... Args>
std::string text(Args&&... args) {
  std::ostringstream out;
  (put(out, std::forward<Args>(args)), ...);
  return out.str();
}

}  // namespace mha::detail
