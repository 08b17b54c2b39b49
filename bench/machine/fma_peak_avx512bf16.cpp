// The bf16 dot-product peak loop (AVX512_BF16's vdpbf16ps, 16 lanes of 2 products; compile
// flags: bench/CMakeLists.txt).
#include <immintrin.h>

#include "fma_peak_kernels.hpp"

namespace mha_bench::detail {

double bf16_dot_rounds_avx512bf16(std::int64_t rounds, float* sink) noexcept {
  // As fma_rounds: 12 independent accumulators, operands the compiler cannot see.
  constexpr int chains = 12;
  volatile float opaque_one = 1.0f;
  const float one = opaque_one;
  __m512 acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  // Pairs of (1, 1) times pairs of (1e-3, 1e-3): each step adds 2e-3 per lane, so the
  // accumulators stay normal and finite for any realistic number of rounds.
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(one), _mm512_set1_ps(one));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(one * 1e-3f), _mm512_set1_ps(one * 1e-3f));
  for (std::int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < chains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  *sink = _mm512_reduce_add_ps(sum);
  // 16 lanes x 2 products x 2 FLOPs (multiply, add) per instruction.
  return 64.0 * chains * static_cast<double>(rounds);
}

}  // namespace mha_bench::detail
