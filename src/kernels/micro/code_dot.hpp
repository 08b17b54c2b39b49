// Internal: the products of an int8 KV cache's codes (docs/design.md §1.7), per ISA (included by
// micro/attention_block.hpp; see micro/micro_kernel.hpp for how it is compiled).
//
// Both products multiply codes as integers. Q K^T: each query row is quantised to 16-bit
// integers (one scale per row), K^T's codes are stored in pairs along head_dim (code_pair:
// dimensions 2i and 2i + 1 of one key), and one vpmaddwd per batch of keys takes a pair of
// products per key into 32-bit sums (vpdpwssd, which adds them in the same instruction, where the
// CPU has AVX512_VNNI): half the instructions of widening each code to fp32 for an FMA, and
// exact. P V: each row's weights times the values' scales are quantised to 16-bit integers per
// chunk of weight_chunk_keys keys (code_scales::value_weights), V's codes are stored in pairs
// along keys (keys 2i and 2i + 1 of one dimension), and the same step takes a pair of keys per
// dimension; each chunk's sums are converted once (code_scales::add_chunk).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "base/int8.hpp"
#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Two codes (the first in the low byte): of one key, dimensions 2i and 2i + 1 (K^T), or of one
// dimension, keys 2i and 2i + 1 (V); and two 16-bit integers of one row of the other operand
// (a query row's dimensions, or a weight row's keys; the first in the low half).
using code_pair = std::uint16_t;
using query_pair = std::int32_t;

// code_pair_dot: Q K^T and P V of an int8 cache on integers. A is a row of query_pairs (a query
// row's, or a weight row's), B a panel of code_pairs (pairs(head_dim) rows of nr keys, or pairs of
// keys rows of nr dimensions); each step adds, per column, a_2i c_2i + a_2i+1 c_2i+1 to a 32-bit
// integer sum. The micro-kernel's accumulators are float batches: here they hold the sums' bits
// (they start at 0.0f, whose bits are the integer 0, and are only added to and stored), which
// code_scales converts after the micro-kernel (key_scores, add_chunk). Exact while the sums stay
// below 2^31: head_dim * max|q| * 255 (query_code_limit), weight_chunk_keys * 32767 * 255.
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
    using floats = xsimd::batch<float, Arch>;
    return xsimd::bitwise_cast<floats>(
        add_pair_products<Arch>(xsimd::bitwise_cast<words<Arch>>(acc), a, b));
  }
};

// One query row's integer sums over a panel of code pairs (code_pair_dot's product for a row
// block of one): the panel's du pair rows in memory order, a step of `step` pair rows at a time.
// Where add_pair_products adds in place (pair_products_in_place: vpdpwssd), the step's rows go to
// as many accumulators, so that one panel at a time hides its latency; elsewhere the add is a
// chain of one cycle and each column keeps one accumulator, the step's products summed first
// (where a column has several, GCC keeps a register move beside each add, and a spill). Integer
// sums: any order gives the same bits. The micro-kernel instead takes several panels side by side
// to hide the latency, which reads as many interleaved streams of one panel's length (2 KiB at
// head_dim 64), too short for the hardware prefetcher; this reads K^T as one stream.
template <class T>
void code_pair_row(std::int64_t du, const query_pair* a, const code_pair* panel,
                   float* c) noexcept {
  using arch = typename T::arch;
  using words = code_pair_dot::words<arch>;
  constexpr int nv = T::nv, nr = T::nr, lanes = static_cast<int>(words::size);
  constexpr int step = nv >= 4 ? 2 : 8 / nv;
  constexpr int chains = pair_products_in_place<arch> ? step : 1;
  words acc[chains][nv];
  for (auto& chain : acc)
    for (words& x : chain) x = words(0);
  std::int64_t kk = 0;
  for (; kk + step <= du; kk += step) {
#pragma GCC unroll 8
    for (int h = 0; h < step; ++h) {
      const words q = code_pair_dot::broadcast_a<arch>(a[kk + h]);
#pragma GCC unroll 8
      for (int v = 0; v < nv; ++v) {
        acc[h % chains][v] = add_pair_products<arch>(
            acc[h % chains][v], q, code_pair_dot::load_b<arch>(panel + (kk + h) * nr + v * lanes));
      }
    }
  }
  for (; kk < du; ++kk) {
    const words q = code_pair_dot::broadcast_a<arch>(a[kk]);
    for (int v = 0; v < nv; ++v)
      acc[0][v] = add_pair_products<arch>(acc[0][v], q,
                                          code_pair_dot::load_b<arch>(panel + kk * nr + v * lanes));
  }
  for (int v = 0; v < nv; ++v) {
    words sum = acc[0][v];
    for (int h = 1; h < chains; ++h) sum += acc[h][v];
    sum.store_unaligned(reinterpret_cast<std::int32_t*>(c + v * lanes));
  }
}

// P V of a k8v4 cache's 4-bit values (attention_layout::values4): the R x (P T::nr) integer sums
// c (bits in floats, row stride ldc, as code_pair_dot's) of each row's weight pairs times the codes
// of P panels of V, over `words` word rows (8 keys each) from the panels' starts at b (panel_stride
// words apart). Panel q reads its rows' weights at a[q] (row stride lda): each panel's group's.
// A word row's four pairs of keys are (word >> 4i) & 0x000f000f: two codes in 16-bit halves, as
// code_pair_dot's pairs, multiplied by the same step (add_pair_products): one load and two
// integer operations a pair (one for the first) where int8's pairs take a widening load. Every
// weight pair of the word rows read must be there (zeros past the keys a row has).
template <class T, int R, int P>
void nibble_panels(std::int64_t words, const query_pair* const (&a)[P], std::int64_t lda,
                   const std::uint32_t* b, std::int64_t panel_stride, float* c,
                   std::int64_t ldc) noexcept {
  using arch = typename T::arch;
  using ints = xsimd::batch<std::int32_t, arch>;
  constexpr int nv = T::nv, nr = T::nr, lanes = static_cast<int>(ints::size);
  // A block of fewer than 8 accumulators (a decode row's 2 panels of 2 registers) gives each of a
  // word's four pairs accumulators of its own (where add_pair_products adds in place, vpdpwssd,
  // one chain of 4 dependent adds a word row held a row's step to the latency), and takes pairs
  // 1 and 3 unshifted: word & 0x00f000f0 is pair 1 times 16, whose products are summed apart and
  // divided by 16 at the end (exact: integers, each sum a multiple of 16), so that a word takes
  // one shift (by 8, for pairs 2 and 3) where it took three, on the port that also multiplies
  // (int4 decode step, 12 heads over 128k keys, one thread, AVX512_VNNI: 14.1 to 12.4 ms with
  // the chains, then ... with the shifts spared). A sum times 16 stays below 2^31 while
  // `words` word rows of weights up to 32767 (key4_query_limit) do: the value side's chunks of 4
  // word rows, and a head of up to 1,092 dimensions.
  constexpr bool split = R * P * nv < 8;
  // The codes are read ahead in software: a decode step's 4-bit codes are consumed twice as fast
  // per byte as int8's, and the hardware prefetcher alone left a step over 128k keys at 77% of the
  // streaming read (int4, one thread: 11.5 ms; 9.7 ms, 91%, read 32 word rows ahead: 4 KiB of a
  // panel of 32 keys or columns). A prefetch past the panel's end is harmless (it never faults).
  constexpr std::int64_t ahead_rows = 32;
  constexpr int chains = split ? 4 : 1;
  const ints low(0x000f000f), high(0x00f000f0);
  ints acc[chains][R][P * nv];
  for (auto& chain : acc)
    for (auto& row : chain)
      for (ints& x : row) x = ints(0);
  for (std::int64_t w = 0; w < words; ++w) {
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) {
      // Each panel's word rows ahead_rows ahead.
      read_ahead<nr * 4>(b + p * panel_stride + (w + ahead_rows) * nr);
#pragma GCC unroll 8
      for (int v = 0; v < nv; ++v) {
        const ints x = ints::load_unaligned(
            reinterpret_cast<const std::int32_t*>(b + p * panel_stride + w * nr + v * lanes));
        const ints y = x >> 8;  // pairs 2 and 3 down (for split: the only shift)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          // An arithmetic shift: the bits it brings in lie outside the mask.
          const ints codes = split ? (i < 2 ? x : y) & (i % 2 == 0 ? low : high)
                                   : (i == 0 ? x : x >> (4 * i)) & low;
#pragma GCC unroll 32
          for (int r = 0; r < R; ++r) {
            ints& sum = acc[i % chains][r][p * nv + v];
            sum = add_pair_products<arch>(sum, ints(a[p][r * lda + 4 * w + i]), codes);
          }
        }
      }
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < P * nv; ++v) {
      ints sum = acc[0][r][v];
      if constexpr (split) sum += acc[2][r][v] + (acc[1][r][v] >> 4) + (acc[3][r][v] >> 4);
      sum.store_unaligned(reinterpret_cast<std::int32_t*>(c + r * ldc + v * lanes));
    }
  }
}

// Row q (head_dim floats) as query_pairs q ~ scale * qi, |qi| <= query_code_limit (base/int8.hpp),
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
