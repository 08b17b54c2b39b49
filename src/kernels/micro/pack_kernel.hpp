// Internal: isa_kernels::pack_pairs, pack_pair_block (kernels/interface/gemm.hpp) with its interior
// vectorised: whole pairs of k over registers of columns that stay in one panel, rows of B read
// in place (V, stride_n 1) or gathered a column per lane (K^T, nn.Linear's W). The same words for
// every input: the edges (the half pair at an odd end of [k0, k1), columns short of a register)
// go through pack_pair_block itself. Per-ISA code: see micro/micro_kernel.hpp for how it is
// compiled.
#pragma once

#include <cstdint>

#include "kernels/interface/gemm.hpp"
#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Each float rounded as to_bf16 (base/bf16.hpp), its bf16 in the upper half of the word and
// zeros below.
template <class Arch>
xsimd::batch<std::uint32_t, Arch> rounded_high(xsimd::batch<float, Arch> x) noexcept {
  using words = xsimd::batch<std::uint32_t, Arch>;
  const words bits = xsimd::bitwise_cast<words>(x);
  const words nearest = bits + words(0x7fffu) + ((bits >> 16) & words(1u));
  // NaN: the magnitude past Inf's, kept quiet as to_bf16 keeps it.
  const auto nan = (bits & words(0x7fffffffu)) > words(0x7f800000u);
  const words quiet = bits | words(0x00400000u);
  return xsimd::select(nan, quiet, nearest) & words(0xffff0000u);
}

template <class Arch>
void pack_pairs(const float* src, std::int64_t stride_k, std::int64_t stride_n, std::int64_t k,
                std::int64_t k0, std::int64_t k1, std::int64_t n0, std::int64_t n1, int nr,
                bf16_pair* dst) noexcept {
  using floats = xsimd::batch<float, Arch>;
  using words = xsimd::batch<std::uint32_t, Arch>;
  using ints = xsimd::batch<std::int32_t, Arch>;
  constexpr std::int64_t lanes = floats::size;
  const std::int64_t panel = pairs(k) * nr;
  const std::int64_t whole_begin = k0 + k0 % 2, whole_end = k1 - (k1 - whole_begin) % 2;
  if (k0 % 2 != 0 && k0 < k1)
    pack_pair_block(src, stride_k, stride_n, k, k0, k0 + 1, n0, n1, nr, dst);
  if (whole_end < k1) {
    pack_pair_block(src + (whole_end - k0) * stride_k, stride_k, stride_n, k, whole_end, k1, n0, n1,
                    nr, dst);
  }
  if (whole_begin >= whole_end) return;
  // Element (kk, nn) of the whole pairs at at(kk)[(nn - n0) * stride_n].
  const auto at = [&](std::int64_t kk) { return src + (kk - k0) * stride_k; };
  MHA_EXPECTS(stride_n == 1 || stride_n <= INT32_MAX / lanes);  // the gather's 32-bit offsets
  alignas(64) std::int32_t offsets[lanes];
  for (std::int64_t i = 0; i < lanes; ++i) offsets[i] = static_cast<std::int32_t>(i * stride_n);
  const ints index = ints::load_aligned(offsets);
  const auto column_of = [&](const float* row) {
    return stride_n == 1 ? floats::load_unaligned(row) : gather_floats<Arch>(row, index);
  };
  for (std::int64_t nn = n0; nn < n1;) {
    const std::int64_t p = nn / nr, end = n1 < (p + 1) * nr ? n1 : (p + 1) * nr;
    for (; nn + lanes <= end; nn += lanes) {
      bf16_pair* out = dst + p * panel + (nn - p * nr);  // pair row kk / 2 at out + kk / 2 * nr
      for (std::int64_t kk = whole_begin; kk < whole_end; kk += 2) {
        const float* even = at(kk) + (nn - n0) * stride_n;
        const words pair = (rounded_high<Arch>(column_of(even)) >> 16) |
                           rounded_high<Arch>(column_of(even + stride_k));
        pair.store_unaligned(out + kk / 2 * nr);
      }
    }
    if (nn < end) {  // the panel's last columns, fewer than a register
      pack_pair_block(at(whole_begin) + (nn - n0) * stride_n, stride_k, stride_n, k, whole_begin,
                      whole_end, nn, end, nr, dst);
      nn = end;
    }
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
