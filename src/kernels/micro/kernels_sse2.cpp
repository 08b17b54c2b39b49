// The SSE2 kernels, the x86-64 baseline (compiled with their row's flags in
// kernels/arch/x86_64/kernel_isas.def; see micro/micro_kernel.hpp).
// SSE2 has no FMA: xsimd::fma is a multiply and an add.
#define MHA_SIMD_ISA_NAMESPACE sse2
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {
namespace sse2 {

// 16 xmm registers: 12 accumulators + a panel row + a broadcast, as in the AVX2 tiles.
using tiles = tile_list<tile<xsimd::sse2, 6, 2>, tile<xsimd::sse2, 12, 1>>;

}  // namespace sse2

const isa_kernels* sse2_kernels() noexcept {
  return sse2::isa_table<xsimd::sse2, sse2::tiles>(isa::sse2);
}

}  // namespace mha::detail
