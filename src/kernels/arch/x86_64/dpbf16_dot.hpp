// Internal: the product of bf16 pairs by AVX512_BF16's vdpbf16ps, for the translation units
// built with it (micro/kernels_avx512bf16.cpp, micro/kernels_amx.cpp), which include it after
// defining MHA_SIMD_ISA_NAMESPACE. xsimd 8.1 has no bf16 type, so the intrinsics are wrapped here,
// with the architecture's other primitives (arch_simd.hpp). Per-ISA code: see
// micro/micro_kernel.hpp.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "kernels/interface/gemm.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// A step of two k of bf16 pairs in one instruction: acc + a_odd b_odd + a_even b_even per lane
// (vdpbf16ps: the two products are exact in fp32, their sum rounded, then added to acc and
// rounded; denormal inputs and results flush to zero), 64 FLOPs per zmm instruction.
struct dpbf16_dot {
  using unit = bf16_pair;
  // n floats to n bf16 in pairs (vcvtne2ps2bf16: ties to even, 32 floats per instruction;
  // denormal inputs flush to zero, as the products do), the missing odd one zero.
  static void to_pairs(const float* x, std::int64_t n, bf16_pair* dst) noexcept {
    std::int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512bh both =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
      _mm512_storeu_si512(dst + i / 2, (__m512i)both);
    }
    if (i < n) {
      // The tail through a zero-padded register: the pair past an odd n gets a zero half.
      const __mmask16 lo = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
      const __mmask16 hi = static_cast<__mmask16>(n - i <= 16   ? 0
                                                  : n - i >= 32 ? 0xffff
                                                                : (1u << (n - i - 16)) - 1);
      const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + i + 16),
                                                _mm512_maskz_loadu_ps(lo, x + i));
      const __mmask16 words = static_cast<__mmask16>((1u << ((n - i + 1) / 2)) - 1);
      _mm512_mask_storeu_epi32(dst + i / 2, words, (__m512i)both);
    }
  }
  // The pairs of 2 x 16 floats (lo then hi) as to_pairs rounds them, its first `count` of 16
  // stored at dst (softmax_kernel.hpp's exp2_sum_pairs).
  template <class Arch>
  static void store_pairs(xsimd::batch<float, Arch> lo, xsimd::batch<float, Arch> hi,
                          bf16_pair* dst, std::int64_t count) noexcept {
    static_assert(xsimd::batch<float, Arch>::size == 16);
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (count >= 16) {
      _mm512_storeu_si512(dst, both);
    } else {
      _mm512_mask_storeu_epi32(dst, static_cast<__mmask16>((1u << count) - 1), both);
    }
  }
  template <class Arch>
  static xsimd::batch<std::uint32_t, Arch> load_b(const bf16_pair* p) noexcept {
    return xsimd::batch<std::uint32_t, Arch>::load_unaligned(p);
  }
  template <class Arch>
  static xsimd::batch<std::uint32_t, Arch> broadcast_a(bf16_pair a) noexcept {
    return xsimd::batch<std::uint32_t, Arch>(a);
  }
  template <class Arch>
  static xsimd::batch<float, Arch> dot(xsimd::batch<float, Arch> acc,
                                       xsimd::batch<std::uint32_t, Arch> a,
                                       xsimd::batch<std::uint32_t, Arch> b) noexcept {
    if constexpr (xsimd::batch<float, Arch>::size == 16) {
      return _mm512_dpbf16_ps(acc, (__m512bh) static_cast<__m512i>(a),
                              (__m512bh) static_cast<__m512i>(b));
    } else {
      return _mm256_dpbf16_ps(acc, (__m256bh) static_cast<__m256i>(a),
                              (__m256bh) static_cast<__m256i>(b));
    }
  }
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
