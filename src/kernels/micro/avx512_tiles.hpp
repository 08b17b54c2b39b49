// Internal: the register tiles of the builds on AVX-512 (micro/kernels_avx512.cpp,
// kernels_avx512bf16.cpp, kernels_amx.cpp), one list for all three. Per-ISA code: see
// micro/micro_kernel.hpp.
#pragma once

#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// The fastest of the shapes measured per panel width (measurements: docs/design.md §5.1): 32-float
// panels of 8 rows x 2 zmm, 16-float panels of 12 rows x 2 ymm, 8-float panels of 16 rows x 1 ymm.
// The narrow panels use AVX2-width registers: on Zen4 a zmm FMA issues as two ymm halves, so they
// lose nothing per FLOP, and this build addresses 32 of them.
using avx512_tiles = tile_list<tile<xsimd::avx512bw, 8, 2>, tile<xsimd::fma3<xsimd::avx2>, 12, 2>,
                               tile<xsimd::fma3<xsimd::avx2>, 16, 1>>;

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
