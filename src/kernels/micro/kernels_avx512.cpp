// The AVX-512 kernels (compiled with -march=x86-64-v4; see micro/micro_kernel.hpp).
#define MHA_SIMD_ISA_NAMESPACE avx512
#include "kernels/micro/avx512_tiles.hpp"
#include "kernels/micro/kernel_table.hpp"

namespace mha::detail {

template <>
const isa_kernels* kernel_table::operator()(xsimd::avx512bw) const noexcept {
  return avx512::kernels_of<xsimd::avx512bw, avx512::avx512_tiles>(isa::avx512);
}

}  // namespace mha::detail
