// Internal: Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3" (SC'11). A pure function of (counter, key): any element of a
// random stream is computed directly, so every backend, thread count and tile order draws the
// same numbers.
#pragma once

#include <array>
#include <cstdint>

namespace mha::detail {

using philox_counter = std::array<std::uint32_t, 4>;
using philox_key = std::array<std::uint32_t, 2>;

// Ten rounds of the Philox4x32 bijection. Multipliers and Weyl key increments are those of the
// paper (and Random123's philox.h).
constexpr philox_counter philox4x32_10(philox_counter c, philox_key k) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += w0;
      k[1] += w1;
    }
    const std::uint64_t p0 = std::uint64_t{m0} * c[0];
    const std::uint64_t p1 = std::uint64_t{m1} * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

constexpr philox_key philox_key_from(std::uint64_t seed) noexcept {
  return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
}

}  // namespace mha::detail
