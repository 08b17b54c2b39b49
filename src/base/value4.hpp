// Internal: the values of a k8v4 KV cache (docs/design.md §1.7): keys as the int8 cache keeps
// them (base/int8.hpp), values as 4-bit codes. Every backend that keeps one codes with these, so
// "a value in a k8v4 cache" means one thing everywhere.
//
// A value row is taken in groups of value4_group elements (the last group head_dim % 32 when
// that is not 0). Each group is turned by the normalised Hadamard rotation (turn: it spreads a
// large element over the whole group, so that one outlier no longer sets every code's step),
// then coded as 16 levels with a scale and an offset of its own (value4_row). Attention is
// linear in the values, so a reader weights the turned rows' codes and turns each output row
// back once (the rotation is its own inverse): sum_j p_j v_j = H sum_j p_j (H v_j). On Gemma 3
// 270M over real text, turned groups of 32 measured the KL divergence of unturned groups of 16
// with half the scale bytes (reports/xeon-2core-cache-formats-2026-11-28).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "base/bf16.hpp"
#include "base/int8.hpp"

namespace mha::detail {

// Elements per group of a value row. 32: every ISA's value panels are 4 to 32 columns wide and
// start at multiples of their width, so no panel straddles two groups (each panel's weights are
// one group's).
inline constexpr std::int64_t value4_group = 32;
constexpr std::int64_t value4_groups(std::int64_t head_dim) noexcept {
  return (head_dim + value4_group - 1) / value4_group;
}
// The elements of group g of a row of head_dim.
constexpr std::int64_t value4_group_size(std::int64_t head_dim, std::int64_t g) noexcept {
  const std::int64_t rest = head_dim - g * value4_group;
  return rest < value4_group ? rest : value4_group;
}

// x[0, n) turned in place: in blocks of n's largest power-of-two divisor b (a group of 32: one
// block; 24: three of 8; 17: none, b = 1), each block times the normalised Hadamard matrix of
// order b (Sylvester's, entries +-1 / sqrt(b)), which is symmetric and orthonormal, so turning
// twice gives x back (up to a float rounding).
inline void turn(float* x, std::int64_t n) noexcept {
  const std::int64_t block = n & -n;
  if (block < 2) return;
  const float norm = 1.0f / std::sqrt(static_cast<float>(block));
  for (std::int64_t b0 = 0; b0 < n; b0 += block) {
    float* y = x + b0;
    for (std::int64_t half = 1; half < block; half *= 2) {
      for (std::int64_t i = 0; i < block; i += 2 * half) {
        for (std::int64_t k = i; k < i + half; ++k) {
          const float a = y[k], b = y[k + half];
          y[k] = a + b;
          y[k + half] = a - b;
        }
      }
    }
    for (std::int64_t k = 0; k < block; ++k) y[k] *= norm;
  }
}
// Each group of a row x[0, head_dim) turned.
inline void turn_groups(float* x, std::int64_t head_dim) noexcept {
  for (std::int64_t g = 0; g < value4_groups(head_dim); ++g)
    turn(x + g * value4_group, value4_group_size(head_dim, g));
}

// A group of n (turned) elements as n codes c in [0, 15] and one 32-bit word:
// x_d ~ scale c + offset, scale a bf16 (the word's low half), offset = scale zero / 16 with zero
// an int16 (its high half): the offset in sixteenths of a step, so that it lies less than a
// sixteenth of a step below the group's smallest element and 15 steps and a sixteenth cover the
// group (int8_row keeps the offset in whole steps, which would cost 4 bits one level of 16).
// scale zero / 16 is exact in fp32, so every reader sees the same offset.
//
// scale is the smallest bf16 at or above max(16 range / 247, 16 |min| / 32767) (range / 15.4375:
// the largest element then codes to at most 15.5, rounded to 15) and zero = floor(16 min /
// scale), |zero| <= 32768. Every element is then within scale / 2 of its value (plus a float
// rounding): at most value4_element_error of its group's range. A group of zeros is exact; one
// whose scale would be below the smallest normal float reads as zeros; one holding a NaN, an Inf
// or an element of magnitude 2^127 or more gets a NaN scale, as int8_row's (the calls into a
// cache refuse values that turn that large: check_coded_range).
struct value4_row {
  std::uint32_t word = 0;

  float scale() const noexcept { return from_bf16(static_cast<bf16>(word)); }
  float zero() const noexcept {
    return static_cast<float>(static_cast<std::int16_t>(static_cast<std::uint16_t>(word >> 16)));
  }
  float offset() const noexcept { return scale() * zero() * 0.0625f; }
};

// An element's largest error over its group's range (max - min of the turned elements): half a
// step of range / 15.4375, the step rounded up to bf16.
constexpr double value4_element_error = (1.0 + 1.0 / 128.0) * 8.0 / 247.0;

inline value4_row value4_scale(const float* x, std::int64_t n) noexcept {
  float lo = x[0], hi = x[0];
  bool finite = true;
  for (std::int64_t d = 0; d < n; ++d) {
    finite &= std::fabs(x[d]) <= std::numeric_limits<float>::max();
    lo = x[d] < lo ? x[d] : lo;
    hi = x[d] > hi ? x[d] : hi;
  }
  if (!finite || !(std::max(-lo, hi) < 0x1p127f)) return {0x7fc0u};
  const float wanted = std::max((hi - lo) * (16.0f / 247.0f), std::abs(lo) * (16.0f / 32767.0f));
  if (!(wanted >= std::numeric_limits<float>::min())) return {0u};
  const std::uint32_t scale_bits = (std::bit_cast<std::uint32_t>(wanted) + 0xffffu) >> 16;
  const auto zero =
      static_cast<std::int16_t>(std::floor(16.0f * lo / from_bf16(static_cast<bf16>(scale_bits))));
  return {scale_bits | std::uint32_t{static_cast<std::uint16_t>(zero)} << 16};
}

// The codes of x[0, n) into codes[0, n) (one code a byte), from their group's value4_row.
inline void value4_codes(const float* x, std::int64_t n, value4_row row,
                         std::uint8_t* codes) noexcept {
  const float offset = std::isfinite(row.offset()) ? row.offset() : 0.0f;  // a NaN row: codes 0
  const float inverse = row.scale() > 0.0f ? 1.0f / row.scale() : 0.0f;
  for (std::int64_t d = 0; d < n; ++d) {
    const float c = round_ties_even((x[d] - offset) * inverse);
    codes[d] = static_cast<std::uint8_t>(!(c >= 0.0f) ? 0.0f : c > 15.0f ? 15.0f : c);
  }
}

// The value a code stands for: scale c + offset (each term exact in fp32, their sum rounded).
inline float dequantize(std::uint8_t code, value4_row row) noexcept {
  return row.scale() * static_cast<float>(code) + row.offset();
}

// A group of n <= value4_group elements v[0, n) as a k8v4 cache holds it: turned, then coded (one
// code a byte into codes[0, n)); returns its word.
inline value4_row quantize_group(const float* v, std::int64_t n, std::uint8_t* codes) noexcept {
  float turned[value4_group];
  std::copy(v, v + n, turned);
  turn(turned, n);
  const value4_row row = value4_scale(turned, n);
  value4_codes(turned, n, row, codes);
  return row;
}
// A value row v[0, head_dim): each group's codes into codes[0, head_dim), its word into rows[g].
inline void quantize_value4(const float* v, std::int64_t head_dim, std::uint8_t* codes,
                            value4_row* rows) noexcept {
  for (std::int64_t g = 0; g < value4_groups(head_dim); ++g) {
    const std::int64_t at = g * value4_group;
    rows[g] = quantize_group(v + at, value4_group_size(head_dim, g), codes + at);
  }
}

// The largest error the SIMD kernels' 16-bit weights add to an output element of a k8v4 cache's
// call, over the largest magnitude of the turned values it reads: a chunk's weights p_j scale_j
// each move by at most half its step (its largest over weight_code_limit), times codes of at
// most 15, over weight_chunk_keys keys, with scale * 15.4375 at most the group's range (2 max|u|,
// rounded up to bf16); and turned back, an element of the output group gains at most sqrt(32)
// times the largest error of its turned elements (|H e|_inf <= |e|_2 <= sqrt(n) |e|_inf).
inline constexpr double value4_weight_error =
    5.656854249492381 * 15.0 * static_cast<double>(weight_chunk_keys) / (2.0 * weight_code_limit) *
    2.0 * (1.0 + 1.0 / 128.0) / 15.4375;

}  // namespace mha::detail
