// Internal: the register-tiled micro-kernel of every SIMD kernel, a template over the xsimd
// arch and the tile. Included (through micro/isa_table.hpp) only by the per-ISA translation
// units (micro/kernels_<name>.cpp, one per row of kernels/arch/<arch>/kernel_isas.def), each
// compiled with its row's flags, after defining MHA_SIMD_ISA_NAMESPACE (the row's name).
//
// ODR: as Highway does per target, everything here lives in a namespace of its own per ISA.
// A function emitted by two translation units under one name (an inline helper, or a template
// instantiated with the same arguments, e.g. an AVX2-width tile used by both the AVX-512 and the
// AVX2 builds) would be kept once by the linker for every caller, possibly running AVX-512 code
// on a CPU without it (docs/dependencies.md §1.2). A test checks the objects for such symbols.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <xsimd/xsimd.hpp>

// The architecture's vector primitives (kernels/arch/<arch>/): fused_fma, gather_floats,
// lane_sums, largest_lane, code_words, narrow_pairs, add_pair_products, pair_products_in_place.
#include "arch_simd.hpp"
#include "base/checks.hpp"
#include "kernels/interface/gemm.hpp"

#ifndef MHA_SIMD_ISA_NAMESPACE
#error "define MHA_SIMD_ISA_NAMESPACE (the ISA's name) before including micro_kernel.hpp"
#endif

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// A register tile of the micro-kernel: MR rows of C by NV batches of Arch (nr floats).
template <class Arch, int MR, int NV>
struct tile {
  using arch = Arch;
  using batch = xsimd::batch<float, Arch>;
  static constexpr int mr = MR, nv = NV, nr = NV * static_cast<int>(batch::size);
};

// One step of k of the micro-kernel in the operands' unit (gemm.hpp): the B row the step streams
// and the A element it broadcasts per row, and their product added to an accumulator.
// fma_dot: fp32, one element per step.
struct fma_dot {
  using unit = float;
  template <class Arch>
  static xsimd::batch<float, Arch> load_b(const float* p) noexcept {
    return xsimd::batch<float, Arch>::load_unaligned(p);
  }
  template <class Arch>
  static xsimd::batch<float, Arch> broadcast_a(float a) noexcept {
    return xsimd::batch<float, Arch>(a);
  }
  template <class B>
  static B dot(B acc, B a, B b) noexcept {
    return fused_fma(a, b, acc);
  }
};

// The unit a Dot reads B in: its `unit`, or its b_unit where it names one (the int8 cache's
// Dots, micro/code_dot.hpp).
template <class Dot>
struct b_unit_of {
  using type = typename Dot::unit;
};
template <class Dot>
requires requires { typename Dot::b_unit; }
struct b_unit_of<Dot> {
  using type = typename Dot::b_unit;
};
template <class Dot>
using b_unit_t = typename b_unit_of<Dot>::type;

// A batch of bf16 pairs as two float batches: bf16 is the top half of a float32, so the even
// k's value is the pair shifted up by 16 bits, the odd k's the pair with its low half cleared.
template <class Arch>
struct pair_halves {
  xsimd::batch<float, Arch> even, odd;
};
template <class Arch>
pair_halves<Arch> widen(xsimd::batch<std::uint32_t, Arch> p) noexcept {
  using words = xsimd::batch<std::uint32_t, Arch>;
  using floats = xsimd::batch<float, Arch>;
  return {xsimd::bitwise_cast<floats>(p << 16),
          xsimd::bitwise_cast<floats>(p & words(0xffff0000u))};
}

// widen_dot: bf16 pairs on any ISA, each widened to two float32 and multiplied with two FMAs
// (acc + a_even b_even, then + a_odd b_odd): bf16 storage and bandwidth, the fp32 FMA rate.
// (AVX512_BF16's vdpbf16ps does the pair in one instruction: micro/kernels_avx512bf16.cpp.)
struct widen_dot {
  using unit = bf16_pair;
  // n floats rounded to n bf16 (ties to even, NaN kept a NaN: to_bf16) in pairs at dst, the
  // missing odd one zero. Branch-free, so the compiler vectorises it for the ISA at hand.
  static void to_pairs(const float* x, std::int64_t n, bf16_pair* dst) noexcept {
    const auto round = [](float f) {
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
      const std::uint32_t nearest = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
      return (bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : nearest;
    };
    for (std::int64_t p = 0; p < n / 2; ++p) dst[p] = round(x[2 * p]) | round(x[2 * p + 1]) << 16;
    if (n % 2 != 0) dst[n / 2] = round(x[n - 1]);
  }
  template <class Arch>
  static pair_halves<Arch> load_b(const bf16_pair* p) noexcept {
    return widen(xsimd::batch<std::uint32_t, Arch>::load_unaligned(p));
  }
  template <class Arch>
  static pair_halves<Arch> broadcast_a(bf16_pair a) noexcept {
    return widen(xsimd::batch<std::uint32_t, Arch>(a));
  }
  template <class Arch>
  static xsimd::batch<float, Arch> dot(xsimd::batch<float, Arch> acc, const pair_halves<Arch>& a,
                                       const pair_halves<Arch>& b) noexcept {
    return fused_fma(a.odd, b.odd, fused_fma(a.even, b.even, acc));
  }
};

// The tiles one ISA offers, widest panel first (isa_kernels::tiles lists the same).
template <class... Tiles>
struct tile_list {
  static constexpr tile_shape shapes[] = {{Tiles::mr, Tiles::nr}...};
};

// Calls f(T{}) for the tile T of the list whose panel width is nr.
template <class F, class... Tiles>
void with_tile(tile_list<Tiles...>, int nr, F&& f) noexcept {
  [[maybe_unused]] const bool found = ((Tiles::nr == nr ? (f(Tiles{}), true) : false) || ...);
  MHA_EXPECTS(found);  // a panel width of one of the ISA's tiles
}

// The largest power of two below R (0 for R = 1): the row counts of the edge micro-kernels.
template <int R>
inline constexpr int smaller_rows = [] {
  int p = 1;
  while (2 * p < R) p *= 2;
  return R > 1 ? p : 0;
}();

// How a micro-kernel's accumulators start, per policy below: called once, before the k loop,
// with the R x NV accumulators to fill (NV = T::nv, or a multiple of it when the micro-kernel
// spans several panels: their columns side by side).
// start_bias: every row = init (nr floats: the bias), or 0 when init is nullptr.
template <class T>
struct start_bias {
  const float* init;

  template <int R, int NV>
  void operator()(typename T::batch (&acc)[R][NV]) const noexcept {
    using batch = typename T::batch;
    constexpr int lanes = static_cast<int>(batch::size);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const batch start = init ? batch::load_unaligned(init + v * lanes) : batch(0.0f);
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) acc[r][v] = start;
    }
  }
};

// start_scaled: row r = scale[r] * (row r of c, row stride ldc): a running sum rescaled before
// more terms are added (online softmax).
template <class T>
struct start_scaled {
  const float* c;
  std::int64_t ldc;
  const float* scale;

  template <int R, int NV>
  void operator()(typename T::batch (&acc)[R][NV]) const noexcept {
    using batch = typename T::batch;
    constexpr int lanes = static_cast<int>(batch::size);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const batch f(scale[r]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = f * batch::load_unaligned(c + r * ldc + v * lanes);
    }
  }
};

// start_sum: row r = row r of c (row stride ldc): a sum continued over another slice of k.
template <class T>
struct start_sum {
  const float* c;
  std::int64_t ldc;

  template <int R, int NV>
  void operator()(typename T::batch (&acc)[R][NV]) const noexcept {
    using batch = typename T::batch;
    constexpr int lanes = static_cast<int>(batch::size);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = batch::load_unaligned(c + r * ldc + v * lanes);
    }
  }
};

// The cache lines of Bytes bytes from `row` read ahead in software (a prefetch never faults,
// even past an operand's end): the panels a KV cache streams (panels_kernel's ReadAhead,
// nibble_panels).
template <int Bytes>
inline void read_ahead(const void* row) noexcept {
  for (int line = 0; line < Bytes; line += 64)
    __builtin_prefetch(static_cast<const char*>(row) + line);
}

// The micro-kernel over P adjacent panels: the (R, P * T::nr) tile c = start + sum over kk < kc
// of a(:, kk) b(kk, :), kc and every offset in units of Dot (floats, or bf16 pairs; B in
// b_unit_t<Dot>).
// a: R rows with stride lda (A read in place, one unit broadcast per row and step);
// b: P packed panels, each (kc, nr) row-major, panel_stride units apart, their columns side by
// side in c; start: one of the start_* policies; c: row stride ldc.
// All R * P * NV accumulators stay in registers for the whole kc loop. Each element's sum runs
// over kk in order whatever P is, so P panels at once give bitwise what P calls of one give:
// P > 1 only adds independent FMA chains where R * NV are too few to hide the FMA's latency
// (panels_for).
// ReadAhead (the attention over a KV cache) with ahead > 0: each panel's row kk + ahead is read
// ahead in software as row kk is taken (panels streamed from memory by a row block whose
// products between loads leave the hardware prefetcher too few misses in flight; a prefetch past
// a panel's end never faults). Without ReadAhead (the GEMM) the loop has no test for it: a
// runtime one there cost the GEMM 0.7% (geomean of bench_gemm's fp32 shapes).
template <class T, int R, int P, class Dot = fma_dot, bool ReadAhead = false, class Start>
void panels_kernel(std::int64_t kc, const typename Dot::unit* a, std::int64_t lda,
                   const b_unit_t<Dot>* b, std::int64_t panel_stride, float* c, std::int64_t ldc,
                   const Start& start, std::int64_t ahead = 0) noexcept {
  using arch = typename T::arch;
  using batch = typename T::batch;
  constexpr int lanes = static_cast<int>(batch::size), nv = T::nv, nr = T::nr;
  static_assert(R >= 1 && R <= T::mr && P >= 1, "a micro-kernel of at most the tile's rows");
  using b_operand = decltype(Dot::template load_b<arch>(b));
  batch acc[R][P * nv];
  start(acc);
  for (std::int64_t kk = 0; kk < kc; ++kk) {
    if constexpr (ReadAhead) {
      if (ahead > 0) {
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p)
          read_ahead<nr * sizeof(b_unit_t<Dot>)>(b + p * panel_stride + (kk + ahead) * nr);
      }
    }
    if constexpr (P == 1) {
      // The B row first, then one broadcast per row: R * nv + nv + 1 registers.
      b_operand bk[nv];
#pragma GCC unroll 8
      for (int v = 0; v < nv; ++v) bk[v] = Dot::template load_b<arch>(b + kk * nr + v * lanes);
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) {
        const auto ar = Dot::template broadcast_a<arch>(a[r * lda + kk]);
#pragma GCC unroll 8
        for (int v = 0; v < nv; ++v) acc[r][v] = Dot::dot(acc[r][v], ar, bk[v]);
      }
    } else {
      // Few rows, many batches: the rows' broadcasts first, each B batch used as it is loaded,
      // so the 8 accumulators, R broadcasts and one B batch fit AVX2's 16 registers (loading
      // all P * nv batches first spilled an accumulator: a store and reload in its chain).
      using a_operand = decltype(Dot::template broadcast_a<arch>(a[0]));
      a_operand ar[R];
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) ar[r] = Dot::template broadcast_a<arch>(a[r * lda + kk]);
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) {
#pragma GCC unroll 8
        for (int v = 0; v < nv; ++v) {
          const b_operand bk =
              Dot::template load_b<arch>(b + p * panel_stride + kk * nr + v * lanes);
#pragma GCC unroll 32
          for (int r = 0; r < R; ++r) acc[r][p * nv + v] = Dot::dot(acc[r][p * nv + v], ar[r], bk);
        }
      }
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < P * nv; ++v) acc[r][v].store_unaligned(c + r * ldc + v * lanes);
  }
}

// The micro-kernel of one panel: the (R, T::nr) tile (panels_kernel with P = 1).
template <class T, int R, class Dot = fma_dot, class Start>
void micro_kernel(std::int64_t kc, const typename Dot::unit* a, std::int64_t lda,
                  const b_unit_t<Dot>* b, float* c, std::int64_t ldc, const Start& start) noexcept {
  panels_kernel<T, R, 1, Dot>(kc, a, lda, b, 0, c, ldc, start);
}

// Panels a micro-kernel of R rows takes at once: enough for 8 independent accumulators (two
// FMA pipes of latency 4, as on Zen3/4 and Golden Cove), 1 where R * nv already are. A decode
// step's single query row (R = 1) with 2-batch panels takes 4: its score and P V kernels were
// bound by one chain's latency, not by the FMA pipes.
template <class T, int R>
inline constexpr int panels_for = R* T::nv >= 8 ? 1 : 8 / (R * T::nv);

// f(r, R) for the row blocks of rows [r, rows): blocks of R rows (a micro-kernel's), then the
// remainder in blocks of the smaller power-of-two row counts (the edge micro-kernels, as the
// GEMM's panel_rows), so no padding row is computed: a decode step's one query row costs one
// row. R is passed as std::integral_constant.
template <int R, class F>
void for_row_blocks(std::int64_t r, std::int64_t rows, F&& f) noexcept {
  for (; r + R <= rows; r += R) f(r, std::integral_constant<int, R>{});
  if constexpr (smaller_rows < R >> 0) {
    if (r < rows) for_row_blocks<smaller_rows<R>>(r, rows, f);
  }
}

// f(std::integral_constant<int, P>{}, p) for the panel groups of panels [p, panels): groups of
// G panels (panels_for's count), then of G / 2, ..., 1 for the panels left, each group as wide as
// what is left allows (a decode row over head_dim 64 in panels of 32 takes its two panels
// together, not one at a time with half the FMA chains). G is a power of two.
template <int G, class F>
void for_panel_groups(std::int64_t p, std::int64_t panels, F&& f) noexcept {
  for (; p + G <= panels; p += G) f(std::integral_constant<int, G>{}, p);
  if constexpr (G > 1) for_panel_groups<G / 2>(p, panels, f);
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
