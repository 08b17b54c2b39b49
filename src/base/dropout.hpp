// Internal: the training-mode dropout mask of docs/design.md §1.1, shared by every backend.
#pragma once

#include <cstdint>

namespace mha::detail {

// What one run() needs to know about dropout. Inactive (p == 0) in inference mode.
struct dropout_spec {
  float p = 0.0f;
  std::uint64_t seed = 0;

  constexpr bool active() const noexcept { return p > 0.0f; }
  // The factor a kept weight is multiplied by, 1 / (1 - p).
  float keep_scale() const noexcept { return 1.0f / (1.0f - p); }
};

// Whether attention weight A[b][h][i][j] is kept: a pure function of (seed, b, h, i, j).
// Philox4x32-10 with key = seed and counter = (j / 4, i, h, b) yields four 32-bit words; word
// j % 4 is the draw for j, kept when draw >= p * 2^32 (probability 1 - p, to 2^-32).
// Requires 0 < p < 1 and b, h, i, j in [0, 2^32).
bool dropout_keep(const dropout_spec& d, std::int64_t b, std::int64_t h, std::int64_t i,
                  std::int64_t j) noexcept;

// out[j - j0] = dropout_keep(d, b, h, i, j) ? d.keep_scale() : 0 for j in [j0, j1).
// The form kernels use: multiply a row of attention weights by it.
void dropout_multipliers(const dropout_spec& d, std::int64_t b, std::int64_t h, std::int64_t i,
                         std::int64_t j0, std::int64_t j1, float* out) noexcept;

}  // namespace mha::detail
