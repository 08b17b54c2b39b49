// The FMA peak loop for avx2, 8 lanes (compile flags: bench/CMakeLists.txt).
#include "fma_peak_kernels.hpp"
#include "fma_peak_loop.hpp"

namespace mha_bench::detail {

typedef float vec8 __attribute__((vector_size(8 * sizeof(float))));

double fma_rounds_avx2(std::int64_t rounds, float* sink) noexcept {
  return fma_rounds<vec8>(rounds, sink);
}

}  // namespace mha_bench::detail
