// The NEON kernels of aarch64 (Advanced SIMD with FMA, the Armv8-A baseline; compiled with their
// row's flags in kernels/arch/aarch64/kernel_isas.def; see micro/micro_kernel.hpp). bf16 is
// widened to fp32 FMAs (widen_dot), as on the x86 rows without AVX512_BF16: Armv8.6's bfdot and
// bfmmla are optional extensions these kernels do not use.
#define MHA_SIMD_ISA_NAMESPACE neon64
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {
namespace neon64 {

// 32 registers of 4 floats: 24 accumulators + a panel row + a broadcast for both panel widths.
// Chosen by register count, as the x86 tiles' shapes were first; not yet measured on an Arm
// core (docs/design.md §5.1 holds the x86 measurements).
using tiles = tile_list<tile<xsimd::neon64, 6, 4>, tile<xsimd::neon64, 12, 2>>;

}  // namespace neon64

const isa_kernels* neon64_kernels() noexcept {
  return neon64::isa_table<xsimd::neon64, neon64::tiles>(isa::neon64);
}

}  // namespace mha::detail
