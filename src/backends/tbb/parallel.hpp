// Internal: the TBB backend's parallel framework over the SIMD kernels
// (kernels/interface/isa_kernels.hpp): a task arena (or the caller's executor) per run, the GEMM
// over a fixed grid of (row block, panel group) tiles, and attention over (batch, head, query
// block) tasks with per-thread workspaces.
//
// Determinism: every partition is fixed by the problem, never by the thread count or the
// executor, and each output element is computed by exactly one task with the arithmetic of the
// single-threaded kernels (a GEMM element is one micro-kernel's whole-k sum; an attention row
// depends on the key tile only). So results are bitwise identical for every thread count and equal
// to the xsimd backend's on the same ISA; nothing is reduced across threads.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cstdint>
#include <functional>

#include "kernels/interface/isa_kernels.hpp"
#include "mha/executor.hpp"
#include "mha/run_options.hpp"

namespace mha::detail {

// The threads of TBB's default arena: every core this process may run on.
int default_threads() noexcept;

// The seam (docs/design.md §2.2): every parallel loop of this backend is for_ranges (or
// for_tasks) inside run_in. run_in(options, f) runs f() for a call: on options.executor when one
// is set, else in a task arena of options.threads slots (0: default_threads(); more than the
// cores is allowed, TBB then runs fewer workers than slots; the calling thread's arenas are kept
// for its next calls, the last 4 thread counts, and never shared with other threads).
// Propagates f's exceptions.
void run_in(const run_options& options, const std::function<void()>& f);

// The executor of the call this thread works for (set by run_in, and in an executor's workers
// for the length of a task) and the call's threads; nullptr: TBB, in the arena it is in.
struct executor_context {
  const executor* on = nullptr;
  int threads = 0;
};
const executor_context& current_executor() noexcept;
// The tasks [0, n) on context.on, each in a context of its own executor (so that a task's nested
// loops run there too); the first exception a task throws is rethrown once all have run.
void run_tasks(const executor_context& context, std::int64_t n,
               const std::function<void(std::int64_t)>& task);

// f(begin, end) over ranges that cover [0, n) once: TBB's blocked ranges (its partitioner's
// split, a workspace fetched once per range), or on an executor one task per index. The grid,
// [0, n), is the caller's, fixed by the problem: which ranges run where never changes a result.
template <class F>
void for_ranges(std::int64_t n, F&& f) {
  const executor_context& context = current_executor();
  if (context.on == nullptr) {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n),
                      [&](const tbb::blocked_range<std::int64_t>& r) { f(r.begin(), r.end()); });
  } else {
    run_tasks(context, n, [&](std::int64_t i) { f(i, i + 1); });
  }
}
// task(i) for each i in [0, n).
template <class F>
void for_tasks(std::int64_t n, F&& task) {
  for_ranges(n, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) task(i);
  });
}

// isa_kernels::gemm (pair_gemm) over all rows and panels of g, tiles of the fixed grid in
// parallel.
void parallel_gemm(const isa_kernels& kernels, const gemm_args& g);
void parallel_gemm(const isa_kernels& kernels, const pair_gemm_args& g);
// detail::gemm(kernels, g), head-major output: each head's rows in tiles of the same grid.
void parallel_gemm(const isa_kernels& kernels, const head_major_gemm& g);

// detail::attention (same arguments, same results) with each phase of its attention_schedule
// in parallel: the cache appends per (b, K/V head), the tasks per (b, h, query block or key
// chunk), each thread on its own attention_workspace (its thread_workspace, kept across calls,
// where the call packs no heads; else one per call: O(tile) scratch plus one packed head), the
// split's merges per (b, h). Throws std::bad_alloc.
void parallel_attention(const isa_kernels& kernels, const attention_args& args,
                        std::int64_t key_tile = 0);

}  // namespace mha::detail
