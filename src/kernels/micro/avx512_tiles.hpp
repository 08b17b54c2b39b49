// Internal: the register tiles of the builds on AVX-512 (micro/kernels_avx512.cpp,
// kernels_avx512bf16.cpp, kernels_amx.cpp), one list for all three. Per-ISA code: see
// micro/micro_kernel.hpp.
#pragma once

#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Tiles measured on Zen4, one core, A read in place, GFLOP/s (peak ~117):
//   32-float panels, 8 rows x 2 zmm:  114 at (M,K,N) = (1024,768,768), 114 at N = 64
//     (12 x 2 zmm: 112 / 115; 6 x 4 zmm: 113 / 105).
//   16-float panels, 12 rows x 2 ymm: 116 at N = 16 (one zmm: 12 rows 109, 16 rows 102).
//   8-float panels, 16 rows x 1 ymm:  97 at N = 8 (12 rows 95, 24 rows 87).
// The narrow panels use AVX2-width registers: on Zen4 a zmm FMA issues as two ymm halves, so
// they lose nothing per FLOP, and this build addresses 32 of them.
using avx512_tiles = tile_list<tile<xsimd::avx512bw, 8, 2>, tile<xsimd::fma3<xsimd::avx2>, 12, 2>,
                               tile<xsimd::fma3<xsimd::avx2>, 16, 1>>;

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
