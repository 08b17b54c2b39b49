// The AVX2 + FMA kernels (x86-64-v3; compiled with their row's flags in kernels/kernel_isas.def;
// see micro/micro_kernel.hpp).
#define MHA_SIMD_ISA_NAMESPACE avx2
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {
namespace avx2 {

// Tiles measured on Zen4 built for x86-64-v3 (16 ymm registers), one core, GFLOP/s:
//   16-float panels, 6 rows x 2 ymm: 111 at (M,K,N) = (1024,768,768) (4 x 3: 111).
//   8-float panels, 8 rows x 1 ymm:  95 at N = 8 (12 rows 90, 14 rows 84).
using tiles = tile_list<tile<xsimd::fma3<xsimd::avx2>, 6, 2>, tile<xsimd::fma3<xsimd::avx2>, 8, 1>>;

}  // namespace avx2

const isa_kernels* avx2_kernels() noexcept {
  return avx2::kernels_of<xsimd::fma3<xsimd::avx2>, avx2::tiles>(isa::avx2);
}

}  // namespace mha::detail
