// Internal: the TBB backend's parallel framework over the SIMD kernels (kernels/isa_kernels.hpp): a
// task arena per run, the GEMM over a fixed grid of (row block, panel group) tiles, and attention
// over (batch, head, query block) tasks with per-thread workspaces.
//
// Determinism: every partition is fixed by the problem, never by the thread count, and each
// output element is computed by exactly one task with the arithmetic of the single-threaded
// kernels (a GEMM element is one micro-kernel's whole-k sum; an attention row depends on the
// key tile only). So results are bitwise identical for every thread count and equal to the
// xsimd backend's on the same ISA; nothing is reduced across threads.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/isa_kernels.hpp"

namespace mha::detail {

// The threads of TBB's default arena: every core this process may run on.
int default_threads() noexcept;

// f() in a task arena of `threads` slots (0: default_threads(); more than the cores is allowed,
// TBB then runs fewer workers than slots). Every parallel call below made inside f() runs in
// that arena. The calling thread's arenas are kept for its next calls (the last 4 thread
// counts) and never shared with other threads. Propagates f's exceptions.
void in_arena(int threads, const std::function<void()>& f);

// isa_kernels::gemm (pair_gemm) over all rows and panels of g, tiles of the fixed grid in
// parallel.
void parallel_gemm(const isa_kernels& kernels, const gemm_args& g);
void parallel_gemm(const isa_kernels& kernels, const pair_gemm_args& g);
// detail::gemm(kernels, g), head-major output: each head's rows in tiles of the same grid.
void parallel_gemm(const isa_kernels& kernels, const head_major_gemm& g);

// detail::attention (same arguments, same results) with each phase of its attention_schedule
// in parallel: the cache appends per (b, K/V head), the tasks per (b, h, query block or key
// chunk), each thread with its own attention_workspace (O(tile) scratch plus, without a cache,
// one packed head), the split's merges per (b, h). Throws std::bad_alloc.
void parallel_attention(const isa_kernels& kernels, const attention_args& args,
                        std::int64_t key_tile = 0);

}  // namespace mha::detail
