// The portable FMA peak loop: 4 lanes of the architecture's baseline, its acc * a + b one FMA
// instruction where the baseline has FMA (-ffp-contract=fast: bench/CMakeLists.txt).
#include "fma_peak_kernels.hpp"

namespace mha_bench::detail {

typedef float vec __attribute__((vector_size(4 * sizeof(float))));

double fma_rounds_portable(std::int64_t rounds, float* sink) noexcept {
  // As many chains as the kernels' x86-64 loops take (arch_simd.hpp's peak_chains says why).
  constexpr int chains = 12;
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
    // One instruction per chain where there is FMA: the TU is compiled with -ffp-contract=fast.
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
