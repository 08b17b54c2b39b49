// Internal: the x86-64 vector primitives of the per-ISA kernels, for batches of the widths the
// rows of kernel_isas.def build (16 floats with AVX-512, 8 with AVX2, 4 with SSE2): each picks
// its instructions by the batch's width, and the wider forms exist only in the translation units
// compiled with them. Included by micro/micro_kernel.hpp (see there for how it is compiled, and
// the ODR rule: everything per ISA namespace). Every architecture's arch_simd.hpp defines the
// same functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <xsimd/xsimd.hpp>

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Independent FMA chains that keep the vector units busy (micro/peak_loops.hpp): Zen4 and recent
// Intel cores start 2 FMAs per cycle with a latency of 4, so 8 in flight saturate them; 12 leave
// margin and, with the two operands, fit AVX2's 16 registers.
inline constexpr int peak_chains = 12;

// a * b + c rounded once, on every arch with FMA. xsimd 8.1 has no AVX-512 kernel for fma: its
// generic a * b + c became vfmadd only where GCC contracted it (Release did; the sanitizer
// builds, whose spills split the product from the sum, did not, and rounded twice), so AVX-512
// batches take the intrinsic. Other archs take xsimd's: native on fma3<avx2>, two roundings on
// SSE2, which has no FMA.
template <class Arch>
xsimd::batch<float, Arch> fused_fma(xsimd::batch<float, Arch> a, xsimd::batch<float, Arch> b,
                                    xsimd::batch<float, Arch> c) noexcept {
#ifdef __AVX512F__
  if constexpr (xsimd::batch<float, Arch>::size == 16) return _mm512_fmadd_ps(a, b, c);
#endif
  return xsimd::fma(a, b, c);
}

// The floats at row[index[i]] (a gather). xsimd 8.1's batch::gather never reaches its AVX2 and
// AVX-512 float kernels (it names them with a template argument they do not take) and falls to
// its generic gather, a broadcast and a masked blend per lane through an out-of-line mask
// constructor: packing K^T for bf16 spent 20% of the attention there (T 1024, AMX). So the
// gather instructions are called here; SSE2, which has none, keeps xsimd's.
template <class Arch>
xsimd::batch<float, Arch> gather_floats(const float* row,
                                        xsimd::batch<std::int32_t, Arch> index) noexcept {
#ifdef __AVX512F__
  if constexpr (xsimd::batch<float, Arch>::size == 16) return _mm512_i32gather_ps(index, row, 4);
#endif
#ifdef __AVX2__
  if constexpr (xsimd::batch<float, Arch>::size == 8) return _mm256_i32gather_ps(row, index, 4);
#endif
  return xsimd::batch<float, Arch>::gather(row, index);
}

// Lane i of the result: the sum of the lanes of acc[i], for batch::size batches. xsimd 8.1's
// AVX-512 haddp returns those sums permuted (lanes 2-3 swapped with 4-5, 10-11 with 12-13), so
// a 16-lane batch adds its halves and takes AVX2's haddp of each eight; narrower batches take
// xsimd's.
template <class Arch>
xsimd::batch<float, Arch> lane_sums(const xsimd::batch<float, Arch>* acc) noexcept {
#ifdef __AVX512F__
  if constexpr (xsimd::batch<float, Arch>::size == 16) {
    using half = xsimd::batch<float, xsimd::fma3<xsimd::avx2>>;
    half lo[8], hi[8];
    for (int i = 0; i < 8; ++i) {
      lo[i] = _mm256_add_ps(_mm512_castps512_ps256(acc[i]), _mm512_extractf32x8_ps(acc[i], 1));
      hi[i] =
          _mm256_add_ps(_mm512_castps512_ps256(acc[8 + i]), _mm512_extractf32x8_ps(acc[8 + i], 1));
    }
    return _mm512_insertf32x8(_mm512_castps256_ps512(xsimd::haddp(lo)), xsimd::haddp(hi), 1);
  }
#endif
  return xsimd::haddp(acc);
}

// The largest lane of m, by halving: log2(lanes) shuffles and maxima (xsimd 8.1 has no
// horizontal max; the lanes through memory were a chain of lanes - 1 scalar maxima, 40% of the
// softmax's own time at head_dim 8).
template <class Arch>
float largest_lane(xsimd::batch<float, Arch> m) noexcept {
  // (Batches of 16 and 8 floats exist only in the translation units built with AVX-512 and
  // AVX2, which alone declare those intrinsics.)
  __m128 q;
  if constexpr (xsimd::batch<float, Arch>::size == 16) {
#ifdef __AVX512F__
    const __m256 h =
        _mm256_max_ps(_mm512_castps512_ps256(m),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1)));
    q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
#endif
  } else if constexpr (xsimd::batch<float, Arch>::size == 8) {
#ifdef __AVX2__
    q = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
#endif
  } else {
    q = m;
  }
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}

// lanes code pairs (two bytes each: of a key in K^T, of a dimension in V) as 2 * lanes 16-bit
// integers (zero-extended bytes): code_pair_dot's B (micro/code_dot.hpp).
template <class Arch>
xsimd::batch<std::int32_t, Arch> code_words(const std::uint16_t* p) noexcept {
  using words = xsimd::batch<std::int32_t, Arch>;
  if constexpr (words::size == 16) {
#ifdef __AVX512BW__
    return words(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#endif
  } else if constexpr (words::size == 8) {
#ifdef __AVX2__
    return words(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
  } else {
    static_assert(words::size == 4, "code_words: a batch of 4, 8 or 16 lanes");
    return words(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                                   _mm_setzero_si128()));
  }
}

// The 2 * lanes 32-bit integers of a then b, each in [-32768, 32767], as 16-bit integers in
// order: 32-bit lane i holds integers 2i (low half) and 2i + 1, as a row of query_pairs
// (micro/code_dot.hpp). vpackssdw packs within 128-bit lanes, so the wider batches put the
// quarters (AVX2) or eighths (AVX-512) back in order.
template <class Arch>
xsimd::batch<std::int32_t, Arch> narrow_pairs(xsimd::batch<std::int32_t, Arch> a,
                                              xsimd::batch<std::int32_t, Arch> b) noexcept {
  using words = xsimd::batch<std::int32_t, Arch>;
  if constexpr (words::size == 16) {
#ifdef __AVX512BW__
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    return words(_mm512_permutexvar_epi64(order, _mm512_packs_epi32(a, b)));
#endif
  } else if constexpr (words::size == 8) {
#ifdef __AVX2__
    return words(_mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
#endif
  } else {
    static_assert(words::size == 4, "narrow_pairs: a batch of 4, 8 or 16 lanes");
    return words(_mm_packs_epi32(a, b));
  }
}

// acc (32-bit integer sums) plus, per 32-bit lane, the sum of the products of its two 16-bit
// halves in a and b: vpmaddwd (vpdpwssd where the build has AVX512_VNNI), code_pair_dot's step
// (micro/code_dot.hpp).
template <class Arch>
xsimd::batch<std::int32_t, Arch> add_pair_products(xsimd::batch<std::int32_t, Arch> acc,
                                                   xsimd::batch<std::int32_t, Arch> a,
                                                   xsimd::batch<std::int32_t, Arch> b) noexcept {
  using words = xsimd::batch<std::int32_t, Arch>;
  if constexpr (words::size == 16) {
#ifdef __AVX512F__
#ifdef __AVX512VNNI__
    return words(_mm512_dpwssd_epi32(acc, a, b));
#else
    return words(_mm512_add_epi32(acc, _mm512_madd_epi16(a, b)));
#endif
#endif
  } else if constexpr (words::size == 8) {
#ifdef __AVX2__
    return words(_mm256_add_epi32(acc, _mm256_madd_epi16(a, b)));
#endif
  } else {
    return words(_mm_add_epi32(acc, _mm_madd_epi16(a, b)));
  }
}

// Whether add_pair_products is one instruction that adds into acc (vpdpwssd: acc is a chain of
// its latency, so code_pair_row keeps several accumulators) or a product then an add (the add a
// chain of one cycle: one accumulator, the products of a step summed first).
template <class Arch>
inline constexpr bool pair_products_in_place =
#ifdef __AVX512VNNI__
    xsimd::batch<std::int32_t, Arch>::size == 16;
#else
    false;
#endif

// Whether batches of Arch have vscalefps (AVX-512's 16 lanes), which exp2_by_scalef uses.
template <class Arch>
inline constexpr bool has_scalef = xsimd::batch<float, Arch>::size == 16;

// 2^x for x <= 0 as polynomial(f) 2^k, x = k + f, k the nearest integer (f in [-1/2, 1/2]),
// where has_scalef: f by vreduceps beside k, the product and the cutoff in one zero-masked
// vscalefps (11 vector operations with exp2_nonpositive's polynomial where the integer route of
// narrower batches takes 14, the same bits). Exactly 0 below -125 and for -inf; NaN stays NaN.
template <class Arch, class Polynomial>
xsimd::batch<float, Arch> exp2_by_scalef(xsimd::batch<float, Arch> x,
                                         Polynomial polynomial) noexcept {
  static_assert(has_scalef<Arch>, "AVX-512 builds only");
#ifdef __AVX512F__
  using batch = xsimd::batch<float, Arch>;
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 k = _mm512_roundscale_ps(x, nearest), f = _mm512_reduce_ps(x, nearest);
  // Lanes not below -125 (NaN included: unordered compares true) keep p 2^k; the rest are 0.
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  return batch(_mm512_maskz_scalef_ps(kept, polynomial(batch(f)), k));
#else
  (void)polynomial;
  return x;  // never instantiated there (the static_assert): this only lets those builds parse
#endif
}

// 2^x for x <= 0 to the accuracy of a weight rounded to bf16 next (AVX-512 only): relative error
// below 7.5e-5 (2^-13.7, 1/22 of the rounding's own u = 2^-9), from a degree-3 polynomial on
// f = x - floor(x) in [0, 1) (a least-maximum-relative-error fit), the power floor(x) applied by
// vscalefps itself, which reads floor(x) from x: 7 vector operations where exp2_nonpositive
// takes 11. The same cutoff (exactly 0 below -125 and for -inf; NaN stays NaN).
template <class Arch>
xsimd::batch<float, Arch> exp2_for_bf16(xsimd::batch<float, Arch> x) noexcept {
  static_assert(xsimd::batch<float, Arch>::size == 16, "AVX-512 builds only");
#ifdef __AVX512F__
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(7.80240310e-2f), f, _mm512_set1_ps(2.26067073e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.95833992e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.99925126e-1f));
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(kept, p, x);
#else
  return x;  // never instantiated there (the static_assert): this only lets those builds parse
#endif
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
