// Internal: the products of an int8 KV cache's codes (docs/design.md §1.7), per ISA (included by
// micro/attention_block.hpp; see micro/micro_kernel.hpp for how it is compiled).
//
// Q K^T multiplies codes as integers: each query row is quantised to 16-bit integers (one scale
// per row), K^T's codes are stored in pairs along head_dim (code_pair: dimensions 2i and 2i + 1
// of one key), and one vpmaddwd per batch of keys takes a pair of products per key into 32-bit
// sums (vpdpwssd, which adds them in the same instruction, where the CPU has AVX512_VNNI): half
// the instructions of widening each code to fp32 for an FMA, and exact. P V keeps fp32 weights
// (code_dot: the codes widened to fp32 as they are loaded), which a 16-bit quantisation could not
// keep within the scheme's error over thousands of keys.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/int8.hpp"
#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// code_dot: fma_dot with B a panel of 8-bit codes, each widened to fp32 as it is loaded: the
// products are fp32 FMAs of exact integers; the codes' scales and offsets are applied around the
// micro-kernel (micro/attention_codes.hpp). P V of an int8 cache.
struct code_dot : fma_dot {
  using b_unit = std::uint8_t;  // A stays fp32 (fma_dot::unit)
  template <class Arch>
  static xsimd::batch<float, Arch> load_b(const std::uint8_t* p) noexcept {
    return widen_codes<Arch>(p);
  }
};

// Two codes of one key (dimensions 2i and 2i + 1; the first in the low byte), and two 16-bit
// integers of one query row (the same dimensions; the first in the low half).
using code_pair = std::uint16_t;
using query_pair = std::int32_t;

// code_pair_dot: Q K^T of an int8 cache on integers. A is a query row as query_pairs, B a panel
// of code_pairs (pairs(head_dim) rows of nr keys); each step adds, per key, q_2i c_2i + q_2i+1
// c_2i+1 to a 32-bit integer sum. The micro-kernel's accumulators are float batches: here they
// hold the sums' bits (they start at 0.0f, whose bits are the integer 0, and are only added to
// and stored), which code_scales::key_scores converts after the micro-kernel. Exact while
// head_dim * max|q| * 255 < 2^31 (query_code_limit).
struct code_pair_dot {
  using unit = query_pair;
  using b_unit = code_pair;
  template <class Arch>
  using words = xsimd::batch<std::int32_t, Arch>;

  // lanes keys' code pairs as 2 * lanes 16-bit integers (zero-extended bytes).
  template <class Arch>
  static words<Arch> load_b(const code_pair* p) noexcept {
    return code_words<Arch>(p);
  }
  template <class Arch>
  static words<Arch> broadcast_a(query_pair a) noexcept {
    return words<Arch>(a);
  }
  template <class Arch>
  static xsimd::batch<float, Arch> dot(xsimd::batch<float, Arch> acc, words<Arch> a,
                                       words<Arch> b) noexcept {
    return add_pair_products<Arch>(acc, a, b);
  }
};

// One query row's integer sums over a panel of code pairs (code_pair_dot's product for a row
// block of one): the panel's du pair rows in memory order, split over `chains` accumulators by
// pair row (integer sums: any order gives the same bits) so that one panel at a time hides the
// dot's latency. The micro-kernel instead takes several panels side by side for that, which
// reads as many interleaved streams of one panel's length (2 KiB at head_dim 64), too short for
// the hardware prefetcher; this reads K^T as one stream.
template <class T>
void code_pair_row(std::int64_t du, const query_pair* a, const code_pair* panel,
                   float* c) noexcept {
  using arch = typename T::arch;
  using batch = typename T::batch;
  using words = code_pair_dot::words<arch>;
  constexpr int nv = T::nv, nr = T::nr, lanes = static_cast<int>(batch::size);
  constexpr int chains = nv >= 4 ? 2 : 8 / nv;
  batch acc[chains][nv];
  for (auto& chain : acc)
    for (batch& x : chain) x = batch(0.0f);
  std::int64_t kk = 0;
  for (; kk + chains <= du; kk += chains) {
#pragma GCC unroll 8
    for (int h = 0; h < chains; ++h) {
      const words q = code_pair_dot::broadcast_a<arch>(a[kk + h]);
#pragma GCC unroll 8
      for (int v = 0; v < nv; ++v) {
        acc[h][v] = code_pair_dot::dot(
            acc[h][v], q, code_pair_dot::load_b<arch>(panel + (kk + h) * nr + v * lanes));
      }
    }
  }
  for (; kk < du; ++kk) {
    const words q = code_pair_dot::broadcast_a<arch>(a[kk]);
    for (int v = 0; v < nv; ++v)
      acc[0][v] = code_pair_dot::dot(acc[0][v], q,
                                     code_pair_dot::load_b<arch>(panel + kk * nr + v * lanes));
  }
  for (int v = 0; v < nv; ++v) {
    words sum = xsimd::bitwise_cast<words>(acc[0][v]);
    for (int h = 1; h < chains; ++h) sum += xsimd::bitwise_cast<words>(acc[h][v]);
    xsimd::bitwise_cast<batch>(sum).store_unaligned(c + v * lanes);
  }
}

// Row q (head_dim floats) as query_pairs q ~ scale * qi, |qi| <= query_code_limit (core/int8.hpp),
// each within scale / 2 of q / scale, the missing odd one 0; returns the scale (0 for a row of
// zeros; NaN when q holds a NaN or an Inf, so that every score of the row is NaN, as the float
// product would make it).
inline float quantize_query(const float* q, std::int64_t head_dim, query_pair* pairs_out) noexcept {
  float largest = 0.0f;
  for (std::int64_t d = 0; d < head_dim; ++d) {
    const float magnitude = std::fabs(q[d]);
    largest = magnitude > largest ? magnitude : largest;  // std::fmax's: a NaN is passed over
  }
  bool finite = std::isfinite(largest);
  for (std::int64_t d = 0; d < head_dim; ++d) finite = finite && !std::isnan(q[d]);
  const std::int32_t limit = query_code_limit(head_dim);
  const float scale = largest / static_cast<float>(limit);
  const float inverse = finite && largest > 0.0f ? static_cast<float>(limit) / largest : 0.0f;
  const auto code = [&](std::int64_t d) -> std::uint32_t {
    if (d >= head_dim) return 0;
    // |c| <= limit up to a rounding: clamped; NaN (a NaN or an Inf times 0) to -limit.
    const float r = round_ties_even(q[d] * inverse);
    const float c = r > static_cast<float>(limit)        ? static_cast<float>(limit)
                    : !(r >= -static_cast<float>(limit)) ? -static_cast<float>(limit)
                                                         : r;
    return static_cast<std::uint16_t>(static_cast<std::int16_t>(c));
  };
  for (std::int64_t p = 0; 2 * p < head_dim; ++p) {
    pairs_out[p] = static_cast<query_pair>(code(2 * p) | code(2 * p + 1) << 16);
  }
  return finite ? scale : std::numeric_limits<float>::quiet_NaN();
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
