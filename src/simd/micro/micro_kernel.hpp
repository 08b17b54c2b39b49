// Internal: the register-tiled micro-kernel of every SIMD kernel, a template over the xsimd
// arch and the tile. Included (through micro/kernel_table.hpp) only by the per-ISA translation
// units (micro/kernels_avx512.cpp, ...), each compiled with its own -march, after defining
// MHA_SIMD_ISA_NAMESPACE (avx512, avx2, sse2).
//
// ODR: as Highway does per target, everything here lives in a namespace of its own per ISA.
// A function emitted by two translation units under one name (an inline helper, or a template
// instantiated with the same arguments, e.g. an AVX2-width tile used by both the AVX-512 and the
// AVX2 builds) would be kept once by the linker for every caller, possibly running AVX-512 code
// on a CPU without it (docs/dependencies.md §1.2). A test checks the objects for such symbols.
#pragma once

#include <cassert>
#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "simd/gemm.hpp"

#ifndef MHA_SIMD_ISA_NAMESPACE
#error "define MHA_SIMD_ISA_NAMESPACE (the ISA's name) before including micro_kernel.hpp"
#endif

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// A register tile of the micro-kernel: MR rows of C by NV batches of Arch (nr floats).
template <class Arch, int MR, int NV>
struct tile {
  using batch = xsimd::batch<float, Arch>;
  static constexpr int mr = MR, nv = NV, nr = NV * static_cast<int>(batch::size);
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
  assert(found && "with_tile: no tile of this ISA has panel width nr");
}

// The largest power of two below R (0 for R = 1): the row counts of the edge micro-kernels.
template <int R>
inline constexpr int smaller_rows = [] {
  int p = 1;
  while (2 * p < R) p *= 2;
  return R > 1 ? p : 0;
}();

// How a micro-kernel's accumulators start, per policy below: called once, before the k loop,
// with the R x NV accumulators to fill.
// start_bias: every row = init (nr floats: the bias), or 0 when init is nullptr.
template <class T>
struct start_bias {
  const float* init;

  template <int R>
  void operator()(typename T::batch (&acc)[R][T::nv]) const noexcept {
    using batch = typename T::batch;
    constexpr int lanes = static_cast<int>(batch::size);
#pragma GCC unroll 8
    for (int v = 0; v < T::nv; ++v) {
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

  template <int R>
  void operator()(typename T::batch (&acc)[R][T::nv]) const noexcept {
    using batch = typename T::batch;
    constexpr int lanes = static_cast<int>(batch::size);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const batch f(scale[r]);
#pragma GCC unroll 8
      for (int v = 0; v < T::nv; ++v)
        acc[r][v] = f * batch::load_unaligned(c + r * ldc + v * lanes);
    }
  }
};

// start_sum: row r = row r of c (row stride ldc): a sum continued over another slice of k.
template <class T>
struct start_sum {
  const float* c;
  std::int64_t ldc;

  template <int R>
  void operator()(typename T::batch (&acc)[R][T::nv]) const noexcept {
    using batch = typename T::batch;
    constexpr int lanes = static_cast<int>(batch::size);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < T::nv; ++v) acc[r][v] = batch::load_unaligned(c + r * ldc + v * lanes);
    }
  }
};

// The micro-kernel: the (R, T::nr) tile c = start + sum over kk < kc of a(:, kk) b(kk, :).
// a: R rows with stride lda (A read in place, one element broadcast per row and step);
// b: a packed panel, (kc, nr) row-major; start: one of the start_* policies; c: row stride ldc.
// All R * NV accumulators stay in registers for the whole kc loop.
template <class T, int R, class Start>
void micro_kernel(std::int64_t kc, const float* a, std::int64_t lda, const float* b, float* c,
                  std::int64_t ldc, const Start& start) noexcept {
  using batch = typename T::batch;
  constexpr int lanes = static_cast<int>(batch::size), nv = T::nv, nr = T::nr;
  batch acc[R][nv];
  start(acc);
  for (std::int64_t kk = 0; kk < kc; ++kk) {
    batch bk[nv];
#pragma GCC unroll 8
    for (int v = 0; v < nv; ++v) bk[v] = batch::load_unaligned(b + kk * nr + v * lanes);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const batch ar(a[r * lda + kk]);
#pragma GCC unroll 8
      for (int v = 0; v < nv; ++v) acc[r][v] = xsimd::fma(ar, bk[v], acc[r][v]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < nv; ++v) acc[r][v].store_unaligned(c + r * ldc + v * lanes);
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
