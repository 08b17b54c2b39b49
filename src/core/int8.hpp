// Internal: the rows of an int8 KV cache (docs/design.md §1.7). Every backend that keeps one
// quantises with these, so "a key in an int8 cache" means one thing everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace mha::detail {

// A row x of n floats as n codes c in [0, 255] and x_d ~ offset + scale * c_d: offset is the
// row's smallest element and scale its range / 255 (asymmetric, so a row whose values are not
// centred on zero still uses all 256 codes). The smallest element is exact, every other within
// scale / 2 (plus a float rounding); a constant row (scale 0) is exact. A row holding a NaN or
// an Inf gets scale and offset NaN, so what reads it reads NaN, as it would the row itself.
struct int8_row {
  float scale, offset;
};

// The scale and offset of the row x[0, n), n >= 1.
inline int8_row row_scale(const float* x, std::int64_t n) noexcept {
  float lo = x[0], hi = x[0];
  bool finite = true;
  for (std::int64_t d = 0; d < n; ++d) {
    finite = finite && std::isfinite(x[d]);
    lo = x[d] < lo ? x[d] : lo;
    hi = x[d] > hi ? x[d] : hi;
  }
  const float scale = (hi - lo) / 255.0f;
  // A range past the largest float is not a row's either.
  if (!finite || !std::isfinite(scale)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {nan, nan};
  }
  return {scale, lo};
}

// The codes of one row's elements (code(x) for each), from its int8_row.
class int8_encoder {
 public:
  explicit int8_encoder(int8_row row) noexcept
      // A scale too small to invert (a range below 255 * 2^-128) maps the row to its offset;
      // a NaN row's codes are 0.
      : offset_(std::isfinite(row.offset) ? row.offset : 0.0f),
        inverse_(row.scale > 0.0f && std::isfinite(1.0f / row.scale) ? 1.0f / row.scale : 0.0f) {}

  std::uint8_t operator()(float x) const noexcept {
    const float c = std::nearbyint((x - offset_) * inverse_);  // ties to even
    return static_cast<std::uint8_t>(!(c >= 0.0f) ? 0.0f : c > 255.0f ? 255.0f : c);
  }

 private:
  float offset_, inverse_;
};

// The value a code stands for.
inline float dequantize(std::uint8_t code, int8_row row) noexcept {
  return row.offset + row.scale * static_cast<float>(code);
}

// Row x[0, n) into codes[0, n); returns its scale and offset.
inline int8_row quantize_row(const float* x, std::int64_t n, std::uint8_t* codes) noexcept {
  const int8_row row = row_scale(x, n);
  const int8_encoder code(row);
  for (std::int64_t d = 0; d < n; ++d) codes[d] = code(x[d]);
  return row;
}

// The queries that meet an int8 cache's keys in the SIMD kernels are 16-bit integers with a
// scale per query row (micro/code_dot.hpp), |qi| at most this limit: qi . c summed over
// head_dim (codes c <= 255, the odd head_dim's missing element 0) stays below 2^31.
constexpr std::int32_t query_code_limit(std::int64_t head_dim) noexcept {
  const std::int64_t limit = 2147483647 / (255 * (head_dim + head_dim % 2));
  return static_cast<std::int32_t>(limit < 32767 ? limit : 32767);
}

}  // namespace mha::detail
