// mha::tbb: the xsimd backend's kernels run in parallel with oneTBB (link mha::tbb).
#pragma once

#include "mha/backend.hpp"
#include "mha/executor.hpp"

namespace mha {

// The TBB backend: the three formulations over the xsimd kernels of the ISA xsimd_default_isa()
// names at prepare() (the plan keeps it), in parallel:
// - projections: the packed-panel GEMM (weights packed once at prepare()) over a fixed grid of
//   48-row x 128-column tiles;
// - attention: fused online softmax (no seq_len x seq_len scores), one task per (batch, head,
//   block of 64 query rows), causal tiles above the diagonal skipped;
// - wrapper: the heads as parallel tasks, each running its own projections and attention
//   (themselves parallel); split_weight and fused_qkv: each projection (fused_qkv's one) in
//   parallel (writing each head's rows contiguously when head_dim is a multiple of the GEMM
//   panel width), then attention over every head at once;
// - decode: attention tasks per (sequence, head) and, for a few new tokens over long caches,
//   per chunk of keys (docs/design.md §1.4), merged in a fixed order.
//
// Threads: each run() executes in a tbb::task_arena of run_options::threads slots (0: every
// core, max_threads()) that belongs to the calling thread (kept for its later calls), or, when
// run_options::executor (attention_options::executor) names one, on that executor with
// run_options::threads (mha/executor.hpp: openmp_executor() below, serial_executor(), or the
// caller's own pool). Results are bitwise identical for every thread count and executor, and
// equal to the xsimd backend's on the same ISA: partitions depend on the problem only and
// nothing is reduced across threads.
//
// Memory: besides the O(batch * seq_len * d_out) scratch every backend keeps, each thread
// working on an attention call holds one packed head (2 * seq_len * head_dim floats) and one
// query block's scratch (64 x 512 scores, the block's queries and outputs: 167 KB at
// head_dim 64, whatever seq_len), allocated per call and freed before run() returns (the
// wrapper's heads are separate calls, some at once). Never seq_len^2 (bench/README.md, the
// memory probe, has measured figures). run() is const and safe to call from several threads at
// once; concurrent runs each get their own arena and compete for the same cores. Out of memory
// surfaces as std::bad_alloc.
const backend& tbb_backend();

// Every task in the calling thread, in index order.
const executor& serial_executor();

// OpenMP's worksharing on the runtime this process has loaded (GCC's libgomp; PyTorch's wheel
// ships one of the same soname, so inside PyTorch its workers run mha's tasks and no second pool
// starts), a team of run_options::threads (0: omp_get_max_threads(), the calling thread's
// setting, which torch.set_num_threads sets), at most the larger of that setting and the cores
// (omp_get_num_procs()). A nested grid runs in the calling task's thread.
// nullptr where the build has no OpenMP (MHA_WITH_OPENMP 0: CMake found none).
const executor* openmp_executor() noexcept;

}  // namespace mha
