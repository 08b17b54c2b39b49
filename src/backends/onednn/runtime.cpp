#include "backends/onednn/runtime.hpp"

#include <omp.h>

namespace mha::detail {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& caller_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

int team_size() { return omp_get_max_threads(); }

openmp_team::openmp_team(int threads) : previous_(omp_get_max_threads()), set_(threads > 0) {
  if (set_) omp_set_num_threads(threads);
}

openmp_team::~openmp_team() {
  if (set_) omp_set_num_threads(previous_);
}

}  // namespace mha::detail
