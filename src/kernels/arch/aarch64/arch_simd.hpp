// Internal: the aarch64 vector primitives of the per-ISA kernels, for NEON's batches of 4 floats
// (the one row of kernel_isas.def, neon64). Included by micro/micro_kernel.hpp (see there for
// how it is compiled, and the ODR rule: everything per ISA namespace). Every architecture's
// arch_simd.hpp defines the same functions; the x86-64 ones say what each computes.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <xsimd/xsimd.hpp>

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Independent FMA chains that keep the vector units busy (micro/peak_loops.hpp): Arm's Neoverse
// V1 and V2 start 4 NEON FMAs per cycle with a latency of 4, so 16 in flight saturate them; 24
// leave margin and, with the two operands, fit NEON's 32 registers.
inline constexpr int peak_chains = 24;

static_assert(std::is_same_v<xsimd::default_arch, xsimd::neon64>,
              "the aarch64 primitives are for NEON's 4-float batches (xsimd::neon64)");

// a * b + c rounded once: xsimd's fma is fmla (Armv8-A has FMA in Advanced SIMD).
template <class Arch>
xsimd::batch<float, Arch> fused_fma(xsimd::batch<float, Arch> a, xsimd::batch<float, Arch> b,
                                    xsimd::batch<float, Arch> c) noexcept {
  return vfmaq_f32(c, a, b);
}

// The floats at row[index[i]]: NEON has no gather, so a lane load each (xsimd 8.1's generic
// gather goes through a mask per lane).
template <class Arch>
xsimd::batch<float, Arch> gather_floats(const float* row,
                                        xsimd::batch<std::int32_t, Arch> index) noexcept {
  const int32x4_t i = index;
  float32x4_t x = vdupq_n_f32(0.0f);
  x = vld1q_lane_f32(row + vgetq_lane_s32(i, 0), x, 0);
  x = vld1q_lane_f32(row + vgetq_lane_s32(i, 1), x, 1);
  x = vld1q_lane_f32(row + vgetq_lane_s32(i, 2), x, 2);
  x = vld1q_lane_f32(row + vgetq_lane_s32(i, 3), x, 3);
  return x;
}

// Lane i of the result: the sum of the lanes of acc[i], for 4 batches (faddp pairs).
template <class Arch>
xsimd::batch<float, Arch> lane_sums(const xsimd::batch<float, Arch>* acc) noexcept {
  const float32x4_t ab = vpaddq_f32(acc[0], acc[1]), cd = vpaddq_f32(acc[2], acc[3]);
  return vpaddq_f32(ab, cd);
}

// The largest lane of m (fmaxv; a NaN lane gives NaN).
template <class Arch>
float largest_lane(xsimd::batch<float, Arch> m) noexcept {
  return vmaxvq_f32(m);
}

// 4 code pairs (two bytes each: of a key in K^T, of a dimension in V) as 8 16-bit integers
// (zero-extended bytes).
template <class Arch>
xsimd::batch<std::int32_t, Arch> code_words(const std::uint16_t* p) noexcept {
  return vreinterpretq_s32_u16(vmovl_u8(vld1_u8(reinterpret_cast<const std::uint8_t*>(p))));
}

// The 8 32-bit integers of a then b, each in [-32768, 32767], as 16-bit integers in order (xtn,
// xtn2): 32-bit lane i holds integers 2i (low half) and 2i + 1.
template <class Arch>
xsimd::batch<std::int32_t, Arch> narrow_pairs(xsimd::batch<std::int32_t, Arch> a,
                                              xsimd::batch<std::int32_t, Arch> b) noexcept {
  return xsimd::batch<std::int32_t, Arch>(vreinterpretq_s32_s16(vmovn_high_s32(vmovn_s32(a), b)));
}

// acc (32-bit integer sums) plus, per 32-bit lane, the sum of the products of its two 16-bit
// halves in a and b: the widening products of the low and high halves (smull, smull2), their
// neighbours added pairwise (addp), as x86's vpmaddwd adds them.
template <class Arch>
xsimd::batch<std::int32_t, Arch> add_pair_products(xsimd::batch<std::int32_t, Arch> acc,
                                                   xsimd::batch<std::int32_t, Arch> a,
                                                   xsimd::batch<std::int32_t, Arch> b) noexcept {
  const int16x8_t a16 = vreinterpretq_s16_s32(a), b16 = vreinterpretq_s16_s32(b);
  const int32x4_t products =
      vpaddq_s32(vmull_s16(vget_low_s16(a16), vget_low_s16(b16)), vmull_high_s16(a16, b16));
  return xsimd::batch<std::int32_t, Arch>(vaddq_s32(acc, products));
}

// add_pair_products is products then an add (vaddq_s32), never in place (see x86_64's).
template <class Arch>
inline constexpr bool pair_products_in_place = false;

// No vscalefps here: exp2_nonpositive takes the integer route (exp2_by_scalef is x86's).
template <class Arch>
inline constexpr bool has_scalef = false;

template <class Arch, class Polynomial>
xsimd::batch<float, Arch> exp2_by_scalef(xsimd::batch<float, Arch> x, Polynomial) noexcept {
  static_assert(has_scalef<Arch>, "AVX-512 builds only");
  return x;
}

// The bf16 softmax's 2^x is AVX-512's (the AMX rows'): no aarch64 row instantiates it.
template <class Arch>
xsimd::batch<float, Arch> exp2_for_bf16(xsimd::batch<float, Arch> x) noexcept {
  static_assert(xsimd::batch<float, Arch>::size == 16, "AVX-512 builds only");
  return x;
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
