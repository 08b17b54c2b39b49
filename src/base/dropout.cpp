#include "base/dropout.hpp"

#include "base/philox.hpp"

namespace mha::detail {
namespace {

// Draws below this are dropped. p < 1, so the product is at most 2^32 - 256 and fits.
std::uint64_t drop_threshold(float p) noexcept {
  return static_cast<std::uint64_t>(static_cast<double>(p) * 4294967296.0);
}

philox_counter draws(const dropout_spec& d, std::int64_t b, std::int64_t h, std::int64_t i,
                     std::int64_t j) noexcept {
  const philox_counter counter = {static_cast<std::uint32_t>(j >> 2), static_cast<std::uint32_t>(i),
                                  static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(b)};
  return philox4x32_10(counter, philox_key_from(d.seed));
}

}  // namespace

bool dropout_keep(const dropout_spec& d, std::int64_t b, std::int64_t h, std::int64_t i,
                  std::int64_t j) noexcept {
  return draws(d, b, h, i, j)[static_cast<std::size_t>(j & 3)] >= drop_threshold(d.p);
}

void dropout_multipliers(const dropout_spec& d, std::int64_t b, std::int64_t h, std::int64_t i,
                         std::int64_t j0, std::int64_t j1, float* out) noexcept {
  const std::uint64_t threshold = drop_threshold(d.p);
  const float scale = d.keep_scale();
  philox_counter words{};
  for (std::int64_t j = j0; j < j1; ++j) {
    // One Philox call serves four consecutive j.
    if (j == j0 || (j & 3) == 0) words = draws(d, b, h, i, j);
    out[j - j0] = words[static_cast<std::size_t>(j & 3)] >= threshold ? scale : 0.0f;
  }
}

}  // namespace mha::detail
