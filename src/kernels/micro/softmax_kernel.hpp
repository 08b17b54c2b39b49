// Internal: the softmax pieces of the per-ISA attention kernel: a row's largest score, and its
// weights 2^(scale x - shift) with their sum (isa_kernels::row_max and exp2_sum, and the
// attention kernel's softmax step). Per-ISA code: see micro/micro_kernel.hpp for how it is
// compiled.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// {0, 1, ..., lanes - 1}: compared with a count to mask the lanes past the end of a row.
template <class Arch>
xsimd::batch<float, Arch> lane_index() noexcept {
  using batch = xsimd::batch<float, Arch>;
  alignas(64) float index[batch::size];
  for (std::size_t l = 0; l < batch::size; ++l) index[l] = static_cast<float>(l);
  return batch::load_aligned(index);
}

// isa_kernels::row_max: reads x up to n rounded up to the lanes; lanes past n count as -inf.
template <class Arch>
[[gnu::always_inline]] inline float row_max(const float* x, std::int64_t n) noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = batch::size;
  const batch minus_inf(-std::numeric_limits<float>::infinity());
  batch m = minus_inf;
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes) m = xsimd::max(m, batch::load_unaligned(x + j));
  if (j < n) {
    const auto inside = lane_index<Arch>() < batch(static_cast<float>(n - j));
    m = xsimd::max(m, xsimd::select(inside, batch::load_unaligned(x + j), minus_inf));
  }
  return largest_lane<Arch>(m);
}

// 2^x for x <= 0, the weights of the softmax in base 2: 2^k 2^f with k = round(x), f in
// [-1/2, 1/2], 2^f by Cephes exp2f's polynomial (relative error below 2e-7), times 2^k. Exactly
// 0 below -125 (where 2^k would leave the normal range) and for -inf; NaN stays NaN. Cheaper
// than xsimd::exp, which also handles overflow and multiplies by log2(e) (the queries carry that
// factor here; measurements: docs/design.md §5.1). Where the arch has vscalefps (has_scalef:
// AVX-512) it splits x and applies 2^k (arch_simd.hpp's exp2_by_scalef); elsewhere 2^k is added
// to the exponent bits.
template <class Arch>
xsimd::batch<float, Arch> exp2_nonpositive(xsimd::batch<float, Arch> x) noexcept {
  using batch = xsimd::batch<float, Arch>;
  const auto polynomial = [](batch f) {
    batch p(1.535336188319500e-4f);
    p = fused_fma(p, f, batch(1.339887440266574e-3f));
    p = fused_fma(p, f, batch(9.618437357674640e-3f));
    p = fused_fma(p, f, batch(5.550332471162809e-2f));
    p = fused_fma(p, f, batch(2.402264791363012e-1f));
    p = fused_fma(p, f, batch(6.931472028550421e-1f));
    return fused_fma(p, f, batch(1.0f));
  };
  if constexpr (has_scalef<Arch>) {
    return exp2_by_scalef<Arch>(x, polynomial);
  } else {
    using int_batch = xsimd::batch<std::int32_t, Arch>;
    const batch k = xsimd::nearbyint(x);
    const int_batch exponent = xsimd::to_int(k) << 23;
    const batch scaled =
        xsimd::bitwise_cast<batch>(xsimd::bitwise_cast<int_batch>(polynomial(x - k)) + exponent);
    return xsimd::select(x < batch(-125.0f), batch(0.0f), scaled);
  }
}

// The weights of the batch of x at j: 2^(c x[j + i] + minus_shift), exp2_for_bf16's (ForBf16)
// or exp2_nonpositive's, the lanes at or past n set to 0 (nothing read when j >= n). One fma
// forms the exponent, so c 1 is x[j + i] - shift exactly.
template <class Arch, bool ForBf16>
[[gnu::always_inline]] inline xsimd::batch<float, Arch> exp2_batch(
    const float* x, std::int64_t j, std::int64_t n, xsimd::batch<float, Arch> c,
    xsimd::batch<float, Arch> minus_shift) noexcept {
  using batch = xsimd::batch<float, Arch>;
  if (j >= n) return batch(0.0f);
  const batch e = fused_fma(batch::load_unaligned(x + j), c, minus_shift);
  batch p;
  if constexpr (ForBf16) {
    p = exp2_for_bf16<Arch>(e);
  } else {
    p = exp2_nonpositive<Arch>(e);
  }
  if (j + static_cast<std::int64_t>(batch::size) <= n) return p;
  return xsimd::select(lane_index<Arch>() < batch(static_cast<float>(n - j)), p, batch(0.0f));
}

// isa_kernels::exp2_sum: x[j] = 2^(scale x[j] - shift) for j < n (each scale x[j] - shift
// <= 0), returns their sum; the lanes past n up to the next multiple of the lanes are set to 0
// (x has room for them). scale 1 is x[j] - shift exactly (exp2_batch). ForBf16: the weights are
// exp2_for_bf16's (the AMX attention's bf16 softmax).
template <class Arch, bool ForBf16 = false>
[[gnu::always_inline]] inline float exp2_sum(float* x, std::int64_t n, float shift,
                                             float scale) noexcept {
  using batch = xsimd::batch<float, Arch>;
  const batch minus_shift(-shift), c(scale);
  batch sum(0.0f);
  for (std::int64_t j = 0; j < n; j += batch::size) {
    const batch p = exp2_batch<Arch, ForBf16>(x, j, n, c, minus_shift);
    p.store_unaligned(x + j);
    sum += p;
  }
  return xsimd::hadd(sum);
}

// exp2_sum with the weights rounded to bf16 pairs as they are made, no fp32 weights stored
// (the AMX attention's softmax: its P V reads only the pairs): dst's first `units` pairs get
// 2^(scale x[j] - shift) for j < n, and 0 past n (units >= (n + 1) / 2); returns the sum of the
// unrounded weights, the same bits as exp2_sum<Arch, true>'s. PairDot::store_pairs rounds two
// batches to pairs as PairDot::to_pairs does.
template <class Arch, class PairDot>
float exp2_sum_pairs(const float* x, std::int64_t n, float shift, float scale, bf16_pair* dst,
                     std::int64_t units) noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = batch::size;
  const batch minus_shift(-shift), c(scale);
  batch sum(0.0f);
  for (std::int64_t u = 0; u < units; u += lanes) {
    const batch lo = exp2_batch<Arch, true>(x, 2 * u, n, c, minus_shift),
                hi = exp2_batch<Arch, true>(x, 2 * u + lanes, n, c, minus_shift);
    sum += lo;  // in key order, as exp2_sum adds them (a batch past n adds exact zeros)
    sum += hi;
    PairDot::template store_pairs<Arch>(lo, hi, dst + u, units - u);
  }
  return xsimd::hadd(sum);
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
