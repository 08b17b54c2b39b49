// Internal: the loops that measure the peak rates figures on an ISA are read against, one set
// per row of kernels/arch/<arch>/kernel_isas.def (isa_kernels::fma_rounds and bf16_rounds, timed
// by bench/machine/fma_peak.cpp). Included (through micro/isa_table.hpp) only by the per-ISA
// translation units after defining MHA_SIMD_ISA_NAMESPACE; see micro/micro_kernel.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/interface/isa_kernels.hpp"
#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// peak_chains (arch_simd.hpp) independent accumulators, acc[c] = first + 0.001 c, each replaced
// by step(acc[c]) `rounds` times; their sum at *sink (so no chain can be removed).
template <class Batch, class Step>
void run_chains(std::int64_t rounds, float first, Step step, float* sink) noexcept {
  Batch acc[peak_chains];
  for (int c = 0; c < peak_chains; ++c) acc[c] = Batch(first + 0.001f * static_cast<float>(c));
  for (std::int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 24
    for (int c = 0; c < peak_chains; ++c) acc[c] = step(acc[c]);
  }
  Batch sum = acc[0];
  for (int c = 1; c < peak_chains; ++c) sum += acc[c];
  *sink = xsimd::hadd(sum);
}

// isa_kernels::fma_rounds: run_chains of acc * a + b on full-width batches of Arch, by
// fused_fma: one FMA instruction a chain where the arch has FMA, a multiply and an add where it
// has none (SSE2).
template <class Arch>
double fma_rounds(std::int64_t rounds, float* sink) noexcept {
  using batch = xsimd::batch<float, Arch>;
  // Values the compiler cannot see, so it cannot fold a chain (it folded one that started at
  // the fixed point 1 of acc * a + b).
  volatile float opaque_one = 1.0f;
  const float one = opaque_one;
  // acc converges to 1: no overflow, no denormals, whatever the number of rounds.
  const batch a(one * 0.999999f), b(one * 1e-6f);
  run_chains<batch>(
      rounds, one, [&](batch acc) { return fused_fma(acc, a, b); }, sink);
  return 2.0 * static_cast<double>(batch::size) * peak_chains * static_cast<double>(rounds);
}

// isa_kernels::bf16_rounds of a PairDot that multiplies pairs natively (AVX512_BF16's
// dpbf16_dot): run_chains of PairDot::dot of a pair batch by another (2 products and 2 additions
// per lane).
template <class Arch, class PairDot>
double pair_dot_rounds(std::int64_t rounds, float* sink) noexcept {
  using batch = xsimd::batch<float, Arch>;
  using pairs = xsimd::batch<std::uint32_t, Arch>;
  // Pairs of bf16 (1, 1) times pairs of (2^-10, 2^-10): each step adds 2^-9 per lane, so the
  // accumulators stay normal and finite for any realistic number of rounds.
  volatile std::uint32_t opaque_ones = 0x3f803f80u;
  const pairs a(opaque_ones), b(opaque_ones - 0x05000500u);
  run_chains<batch>(
      rounds, 0.0f, [&](batch acc) { return PairDot::dot(acc, a, b); }, sink);
  return 4.0 * static_cast<double>(batch::size) * peak_chains * static_cast<double>(rounds);
}

// The bf16 peak loop of a table with PairDot: none where pairs are widened to fp32 FMAs
// (widen_dot: its figures are read against fma_rounds), the PairDot's own where it has one (the
// AMX tiles' register-resident products), else pair_dot_rounds.
template <class Arch, class PairDot>
constexpr peak_loop bf16_peak_loop() noexcept {
  if constexpr (std::is_same_v<PairDot, widen_dot>) {
    return nullptr;
  } else if constexpr (requires { PairDot::peak_rounds(std::int64_t{1}, nullptr); }) {
    return &PairDot::peak_rounds;
  } else {
    return &pair_dot_rounds<Arch, PairDot>;
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
