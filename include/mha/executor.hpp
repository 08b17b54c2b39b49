// mha: who runs a call's parallel work (docs/design.md §2.2). The tbb backend cuts every call
// into a fixed grid of tasks (GEMM tiles, attention tasks, a decode step's sequences and key
// chunks) and hands each grid to an executor: by default oneTBB (a task arena of
// run_options::threads slots), or the one run_options::executor names: OpenMP (the runtime this
// process has: inside PyTorch, PyTorch's own workers), serial (mha/backends/tbb.hpp has both),
// or the caller's own pool. The grid never depends on the executor or the thread count, so the
// results are the same bits whichever runs it. Single-threaded backends (naive, xsimd) and
// oneDNN (its own OpenMP team) take no executor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mha {

// The caller's side of the seam. Implement parallel_for over your pool to run mha's tasks on
// your threads (oneDNN's threadpool_iface in spirit).
class executor {
 public:
  virtual ~executor() = default;

  // Runs task(i) exactly once for every i in [0, n) and returns when all have returned: on at
  // most `threads` threads at once, the calling thread's share included (threads >= 1: the
  // call's run_options::threads, or 0 for as many as the executor has). Tasks may run in any
  // order and at once on different threads. A task may itself call parallel_for on this
  // executor (the wrapper's heads each run a parallel GEMM): run such a nested call on the
  // same threads, or in the calling task's thread. mha's tasks do not throw but for
  // std::bad_alloc; an executor passes a task's exception on to its caller (after the other
  // tasks have run or been dropped), or terminates.
  virtual void parallel_for(std::int64_t n, int threads,
                            const std::function<void(std::int64_t)>& task) const = 0;
  // A short name for descriptions and reprs ("openmp", "serial", "my-pool").
  virtual std::string name() const = 0;
};

}  // namespace mha
