// Shared by the libFuzzer targets: a failed property aborts, which libFuzzer reports as a crash
// with the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mha_fuzz {

inline void require(bool property, const char* what) {
  if (!property) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

// Bitwise equality, so NaN payloads compare equal to themselves.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace mha_fuzz
