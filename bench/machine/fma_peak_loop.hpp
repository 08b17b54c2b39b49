// Internal to mha_fma_peak: the FMA throughput loop, included only by the per-ISA translation
// units (fma_peak_<isa>.cpp). Each instantiates it for its own vector width only, so no
// instantiation compiled for one ISA can be picked by the linker for another.
#pragma once

#include <cstdint>

namespace mha_bench::detail {

// vec: a GCC vector of floats (float __attribute__((vector_size(bytes)))) of the TU's width.
// chains: independent chains. Zen4 and recent Intel cores start 2 FMAs per cycle with a latency
// of 4 cycles, so 8 chains in flight saturate them; 12 leave margin and, with a and b, fit the 16
// registers of AVX2. (Arm's Neoverse V1 and V2 start 4 NEON FMAs per cycle with a latency of 4:
// 16 in flight; their loop takes 24, which with a and b fit NEON's 32 registers.)
template <class vec, int chains = 12>
double fma_rounds(std::int64_t rounds, float* sink) noexcept {
  constexpr int lanes = sizeof(vec) / sizeof(float);
  // Values the compiler cannot see, so it cannot fold a chain (it did fold one that started
  // at the fixed point 1 of acc * a + b).
  volatile float opaque_one = 1.0f;
  const float one = opaque_one;
  vec acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = vec{} + (one + 0.001f * static_cast<float>(c));
  // acc converges to 1: no overflow, no denormals, whatever the number of rounds.
  const vec a = vec{} + one * 0.999999f, b = vec{} + one * 1e-6f;
  for (std::int64_t r = 0; r < rounds; ++r) {
    // One instruction per chain: the TU is compiled with -ffp-contract=fast.
#pragma GCC unroll 24
    for (int c = 0; c < chains; ++c) acc[c] = acc[c] * a + b;
  }
  vec sum = acc[0];
  for (int c = 1; c < chains; ++c) sum += acc[c];
  float total = 0.0f;
  for (int l = 0; l < lanes; ++l) total += sum[l];
  *sink = total;
  return 2.0 * lanes * chains * static_cast<double>(rounds);
}

}  // namespace mha_bench::detail
