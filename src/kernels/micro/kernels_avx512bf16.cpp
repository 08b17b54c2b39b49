// The AVX-512 kernels with AVX512_BF16's dot products of bf16 pairs (compiled with their row's
// flags in kernels/arch/x86_64/kernel_isas.def; see micro/micro_kernel.hpp): the fp32 kernels as in
// the AVX-512 build, bf16 GEMM and attention through vdpbf16ps (arch/x86_64/dpbf16_dot.hpp). Chosen
// only on CPUs with AVX512_BF16 (dispatch.cpp).
#define MHA_SIMD_ISA_NAMESPACE avx512bf16
#include "dpbf16_dot.hpp"  // kernels/arch/x86_64/
#include "kernels/micro/avx512_tiles.hpp"
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {

const isa_kernels* avx512bf16_kernels() noexcept {
  return avx512bf16::isa_table<xsimd::avx512bw, avx512bf16::avx512_tiles, avx512bf16::dpbf16_dot>(
      isa::avx512bf16);
}

}  // namespace mha::detail
