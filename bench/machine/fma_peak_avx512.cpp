// The FMA peak loop for avx512, 16 lanes (compile flags: bench/CMakeLists.txt).
#include "fma_peak_kernels.hpp"
#include "fma_peak_loop.hpp"

namespace mha_bench::detail {

typedef float vec16 __attribute__((vector_size(16 * sizeof(float))));

double fma_rounds_avx512(std::int64_t rounds, float* sink) noexcept {
  return fma_rounds<vec16>(rounds, sink);
}

}  // namespace mha_bench::detail
