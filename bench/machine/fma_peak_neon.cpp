// The FMA peak loop for neon, 4 lanes with fmla and 24 chains (compile flags:
// bench/CMakeLists.txt). aarch64 only.
#include "fma_peak_kernels.hpp"
#include "fma_peak_loop.hpp"

namespace mha_bench::detail {

typedef float vec4 __attribute__((vector_size(4 * sizeof(float))));

double fma_rounds_neon(std::int64_t rounds, float* sink) noexcept {
  return fma_rounds<vec4, 24>(rounds, sink);
}

}  // namespace mha_bench::detail
