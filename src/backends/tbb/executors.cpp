// The executors mha offers besides oneTBB (mha/backends/tbb.hpp): serial, and OpenMP where the
// build has it (MHA_WITH_OPENMP: this file compiled with OpenMP, the library linked to the
// compiler's runtime).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "mha/backends/tbb.hpp"

#if MHA_WITH_OPENMP
#include <omp.h>
#endif

namespace mha {
namespace {

class serial final : public executor {
 public:
  void parallel_for(std::int64_t n, int,
                    const std::function<void(std::int64_t)>& task) const override {
    for (std::int64_t i = 0; i < n; ++i) task(i);
  }
  std::string name() const override { return "serial"; }
};

#if MHA_WITH_OPENMP
// One worksharing loop per grid, tasks handed out one at a time (they are coarse: GEMM tiles,
// query blocks), on a team of the call's threads. Inside a parallel region (a nested grid: the
// wrapper's heads each run a GEMM) the tasks run in the calling thread: the team is busy with
// the outer grid; so do a one-thread call's (no region to open).
// The team stays the call's threads when the grid has fewer tasks (a decode step's 12 heads on
// 16 threads): inside PyTorch a smaller team leaves PyTorch's surplus workers out of it, and its
// next region, the model's next op on every thread, pays to bring them back. On a 16-vCPU Xeon a
// team of min(threads, tasks) made a decode call alone 6% shorter, and inside GPT-2 its calls
// 9-23% longer and the decode 15-30% slower (report xeon-amx-16core-decode-2026-11-27).
// A team is at most the larger of the cores and the thread's setting (omp_get_max_threads:
// torch.set_num_threads's), as oneTBB's arenas are at most its cores: libgomp starts every
// thread a team asks for and keeps them, so threads = 1024 on 2 cores left 1024 threads behind.
class openmp final : public executor {
 public:
  void parallel_for(std::int64_t n, int threads,
                    const std::function<void(std::int64_t)>& task) const override {
    if (n == 1 || threads == 1 || omp_in_parallel()) {
      for (std::int64_t i = 0; i < n; ++i) task(i);
      return;
    }
    const int most = std::max(omp_get_num_procs(), omp_get_max_threads());
    const int team = threads > 0 ? std::min(threads, most) : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
    for (std::int64_t i = 0; i < n; ++i) task(i);
  }
  std::string name() const override { return "openmp"; }
};
#endif

}  // namespace

const executor& serial_executor() {
  static const serial instance;
  return instance;
}

const executor* openmp_executor() noexcept {
#if MHA_WITH_OPENMP
  static const openmp instance;
  return &instance;
#else
  return nullptr;
#endif
}

}  // namespace mha
