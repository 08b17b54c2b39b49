// The FMA peak loop for portable, 4 lanes (compile flags: bench/CMakeLists.txt).
#include "fma_peak_kernels.hpp"
#include "fma_peak_loop.hpp"

namespace mha_bench::detail {

typedef float vec4 __attribute__((vector_size(4 * sizeof(float))));

double fma_rounds_portable(std::int64_t rounds, float* sink) noexcept {
  return fma_rounds<vec4>(rounds, sink);
}

}  // namespace mha_bench::detail
