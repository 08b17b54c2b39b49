// The AVX2 + FMA kernels (x86-64-v3; compiled with their row's flags in
// kernels/arch/x86_64/kernel_isas.def; see micro/micro_kernel.hpp).
#define MHA_SIMD_ISA_NAMESPACE avx2
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {
namespace avx2 {

// The fastest of the shapes measured per panel width with 16 ymm registers (measurements:
// docs/design.md §5.1): 16-float panels of 6 rows x 2 ymm, 8-float panels of 8 rows x 1 ymm.
using tiles = tile_list<tile<xsimd::fma3<xsimd::avx2>, 6, 2>, tile<xsimd::fma3<xsimd::avx2>, 8, 1>>;

}  // namespace avx2

const isa_kernels* avx2_kernels() noexcept {
  return avx2::isa_table<xsimd::fma3<xsimd::avx2>, avx2::tiles>(isa::avx2);
}

}  // namespace mha::detail
