// Internal: the rows of an int8 KV cache (docs/design.md §1.7). Every backend that keeps one
// quantises with these, so "a key in an int8 cache" means one thing everywhere.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "base/bf16.hpp"

namespace mha::detail {

// A row x of n floats as n codes c in [0, 255] and one 32-bit word: x_d ~ scale (zero + c_d),
// scale a bf16 (the word's low half), zero an int16 (its high half). Asymmetric (offset =
// scale zero near the row's smallest element), so a row whose values are not centred on zero
// still uses all 256 codes; 4 bytes a row rather than an fp32 scale and offset's 8, so a row of
// head_dim 64 takes 68 bytes, 0.53 of its bf16 size. scale (zero + c) and scale zero are exact
// in fp32 (8 significant bits times at most 16), so every reader sees the same offset.
//
// scale is the smallest bf16 at or above max(range / 254, |min| / 32767) and zero =
// floor(min / scale): the offset lies less than a step below the smallest element, so the
// largest still fits in code 255 (hence 254 steps), and |zero| <= 32768. Every element is then
// within scale / 2 of its value (plus a float rounding): at most int8_element_error of the
// row's largest magnitude. An all-zero row is exact; a row whose scale would be below the
// smallest normal float (its elements all within about 2^-111 of zero) reads as zeros; a row
// holding a NaN, an Inf or an element of magnitude 2^127 or more (whose steps could pass the
// largest float) gets a NaN scale, so what reads it reads NaN, as it would the row itself. The
// calls into a cache refuse such finite elements before appending them (check_coded_range in
// driver/kv_cache_access.hpp): a NaN out of finite inputs would be no answer.
struct int8_row {
  std::uint32_t word = 0;

  float scale() const noexcept { return from_bf16(static_cast<bf16>(word)); }
  float zero() const noexcept {
    return static_cast<float>(static_cast<std::int16_t>(static_cast<std::uint16_t>(word >> 16)));
  }
  float offset() const noexcept { return scale() * zero(); }
};

// An element's largest error over its row's largest magnitude: half a step of at most
// 2 max|x| / 254, the step rounded up to bf16 (7 stored mantissa bits).
constexpr double int8_element_error = (1.0 + 1.0 / 128.0) / 254.0;

// The scale and zero of the row of n >= 1 elements x(0), ..., x(n - 1) (x: a function of the
// index, so that a row made on the fly, a key over its channel scales, needs no buffer).
template <class Element>
int8_row row_scale(Element x, std::int64_t n) noexcept {
  float lo = x(0), hi = x(0);
  bool finite = true;
  for (std::int64_t d = 0; d < n; ++d) {
    const float e = x(d);
    // std::isfinite's answer without a branch per element (NaN and Inf compare false).
    finite &= std::fabs(e) <= std::numeric_limits<float>::max();
    lo = e < lo ? e : lo;
    hi = e > hi ? e : hi;
  }
  if (!finite || !(std::max(-lo, hi) < 0x1p127f)) return {0x7fc0u};  // a NaN scale, zero 0
  const float wanted = std::max((hi - lo) / 254.0f, std::abs(lo) / 32767.0f);
  if (!(wanted >= std::numeric_limits<float>::min())) return {0u};
  // wanted is positive and finite: adding all but one unit of its low half carries into the
  // bf16 above it unless the low half is already zero.
  const std::uint32_t scale_bits = (std::bit_cast<std::uint32_t>(wanted) + 0xffffu) >> 16;
  const auto zero =
      static_cast<std::int16_t>(std::floor(lo / from_bf16(static_cast<bf16>(scale_bits))));
  return {scale_bits | std::uint32_t{static_cast<std::uint16_t>(zero)} << 16};
}
// ... of the row x[0, n).
inline int8_row row_scale(const float* x, std::int64_t n) noexcept {
  return row_scale([x](std::int64_t d) { return x[d]; }, n);
}

// The keys' channel scales (docs/design.md §1.7): each K/V head of a sequence divides its keys
// by a scale per channel (head_dim dimension) before they are coded per token, and its queries
// are multiplied by the same scales (q . k = (q s) . (k / s)), so that a channel whose keys are
// far larger than the others' (the outlier channels of trained models' keys) no longer sets
// every token's step alone. The scales are set once, from the keys of the sequence's first call
// (its prompt; the first append at all where channel_scales_set says there are none yet): s_c =
// max_t |k_tc| / max_c max_t |k_tc|, at least key_channel_floor, 1 where no key is finite and
// non-zero. A later key can then be key_channel_floor^-1 times the size its channel's prompt keys
// were, relative to the largest channel: its step grows by that much at most (the int8 bound's
// key_magnification). On Gemma 3 270M over real text they cut the int8 cache's KL divergence
// against fp32 about sevenfold (docs/design.md §1.7).
inline constexpr float key_channel_floor = 0.125f;

// The channel scales s[0, head_dim) of the n key rows at k (row stride ld).
inline void key_channel_scales(const float* k, std::int64_t n, std::int64_t ld,
                               std::int64_t head_dim, float* s) noexcept {
  float largest = 0.0f;
  for (std::int64_t d = 0; d < head_dim; ++d) {
    float m = 0.0f;
    for (std::int64_t t = 0; t < n; ++t) {
      const float x = std::fabs(k[t * ld + d]);
      m = x <= std::numeric_limits<float>::max() && x > m ? x : m;  // NaN and Inf passed over
    }
    s[d] = m;
    largest = m > largest ? m : largest;
  }
  for (std::int64_t d = 0; d < head_dim; ++d) {
    s[d] = largest > 0.0f ? std::max(s[d] / largest, key_channel_floor) : 1.0f;
  }
}

// Whether a head's channel scales hold scales (at least key_channel_floor each), not a new
// cache's zeros: a sequence whose tokens a benchmark held without appending them
// (mha_testing::hold_zero_tokens) sets them at its first append.
inline bool channel_scales_set(const float* s) noexcept { return s[0] > 0.0f; }

// Element d of key row k over its channel scales s: k_d / s_d.
inline float scaled_key(const float* k, const float* s, std::int64_t d) noexcept {
  return k[d] / s[d];
}

// x rounded to an integer, ties to even, as std::nearbyint in the default rounding mode, where
// |x| < 2^22, and inline (nearbyint and lrint are calls into libm without -ffast-math, a visible
// part of a decode step's append): past 1.5 * 2^23 a float has no fraction bits, so the sum
// rounds x, and the difference is exact. Beyond 2^22 the result stays beyond 2^22 in magnitude,
// of x's sign (NaN stays NaN): callers clamp such values as they would nearbyint's.
inline float round_ties_even(float x) noexcept {
  constexpr float shift = 12582912.0f;  // 1.5 * 2^23
  return (x + shift) - shift;
}

// The codes of one row's elements (code(x) for each), from its int8_row.
class int8_encoder {
 public:
  explicit int8_encoder(int8_row row) noexcept
      // A NaN row's codes are 0.
      : offset_(std::isfinite(row.offset()) ? row.offset() : 0.0f),
        inverse_(row.scale() > 0.0f ? 1.0f / row.scale() : 0.0f) {}

  std::uint8_t operator()(float x) const noexcept {
    const float c = round_ties_even((x - offset_) * inverse_);
    return static_cast<std::uint8_t>(!(c >= 0.0f) ? 0.0f : c > 255.0f ? 255.0f : c);
  }
  // The codes of x[0, n) into codes[0, n).
  void operator()(const float* x, std::int64_t n, std::uint8_t* codes) const noexcept {
    for (std::int64_t d = 0; d < n; ++d) codes[d] = (*this)(x[d]);
  }

 private:
  float offset_, inverse_;
};

// The value a code stands for (exact: scale (zero + c)).
inline float dequantize(std::uint8_t code, int8_row row) noexcept {
  return row.scale() * (row.zero() + static_cast<float>(code));
}

// Row x[0, n) into codes[0, n); returns its scale and zero.
inline int8_row quantize_row(const float* x, std::int64_t n, std::uint8_t* codes) noexcept {
  const int8_row row = row_scale(x, n);
  const int8_encoder code(row);
  code(x, n, codes);
  return row;
}

// The queries that meet an int8 cache's keys in the SIMD kernels are 16-bit integers with a
// scale per query row (micro/code_dot.hpp), |qi| at most this limit: qi . c summed over
// head_dim (codes c <= 255, the odd head_dim's missing element 0) stays below 2^31.
constexpr std::int32_t query_code_limit(std::int64_t head_dim) noexcept {
  const std::int64_t limit = 2147483647 / (255 * (head_dim + head_dim % 2));
  return static_cast<std::int32_t>(limit < 32767 ? limit : 32767);
}

// The weights that meet an int8 cache's values in the SIMD kernels (P V) are 16-bit integers
// too: each row's weights p_j scale_j of a chunk of weight_chunk_keys keys quantised to
// [0, weight_code_limit] with one scale, the chunk's largest over the limit (micro/code_dot.hpp),
// and a chunk's integer sums converted to fp32 once.
inline constexpr std::int64_t weight_chunk_keys = 128;
inline constexpr std::int32_t weight_code_limit = 32767;
static_assert(weight_chunk_keys * weight_code_limit * 255 < (std::int64_t{1} << 31),
              "a chunk's integer sums within 32 bits");

// The largest error a value's code and its weight's quantisation make in an output element,
// over max|v|: int8_element_error for the code, and, since a chunk's weights move by at most
// half its step (its largest weight p scale / (2 limit)), with scale * 255 at most
// 2 int8_element_error max|v| and the keys' largest weights summing to at most the row's sum,
// int8_element_error * 255 * weight_chunk_keys / weight_code_limit (about as much again) for the
// weights (docs/design.md §1.7).
inline constexpr double int8_value_error =
    int8_element_error * (1.0 + 255.0 * static_cast<double>(weight_chunk_keys) / weight_code_limit);

}  // namespace mha::detail
