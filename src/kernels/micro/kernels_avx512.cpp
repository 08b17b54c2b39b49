// The AVX-512 kernels (x86-64-v4; compiled with their row's flags in
// kernels/arch/x86_64/kernel_isas.def; see micro/micro_kernel.hpp).
#define MHA_SIMD_ISA_NAMESPACE avx512
#include "kernels/micro/avx512_tiles.hpp"
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {

const isa_kernels* avx512_kernels() noexcept {
  return avx512::isa_table<xsimd::avx512bw, avx512::avx512_tiles>(isa::avx512);
}

}  // namespace mha::detail
