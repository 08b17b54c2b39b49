// mha::onednn: oneDNN's matmul, softmax and reorder primitives (link mha::onednn).
#pragma once

#include <optional>
#include <string_view>

#include "mha/backend.hpp"
#include "mha/isa.hpp"

namespace mha {

// The oneDNN backend (oneDNN 2.x; fp32, and bf16 where its kernels multiply bf16 natively:
// supports() declines it below avx512_core_bf16). Every step is a oneDNN primitive: the projections
// are matmuls with fused bias on weights repacked at prepare() into the layout oneDNN prefers;
// attention runs on head-major (seq_len, head_dim) blocks, a group of heads at a time: Q K^T as
// a batched matmul with the 1/sqrt(head_dim) scale and the causal mask fused, softmax in place,
// A V as a batched matmul; the head split (split_weight, fused_qkv) is a reorder, the merge a
// row copy. The three formulations run through the same driver as the other backends.
//
// Decode (plan::make_cache): the cache is plain rows (per sequence and head, capacity keys then
// capacity values) that the attention matmuls read in place through strided descriptors, per
// sequence, padded to a bucket of keys shared by the call's sequences (the keys rounded up to
// 1/8 of their power of two, at least 64): primitives are rebuilt about 8 times per doubling of
// the context, not every step; padding rows are zeroed and masked.
//
// Plans: prepare() packs the weights (each projection's output width is padded to a multiple of
// 64 floats in oneDNN's blocked layout). run() builds a primitive the first time it needs its
// shape (JIT compilation, milliseconds) and keeps the most recently used ones (16 projections,
// 8 head splits, 8 attention shapes, each of those with a (seq_len, seq_len) causal mask).
// Scratch (about 4 * batch * seq_len * d_out floats for Q, K, V and the merged heads, plus a
// projection's staging buffer, one group's scores (<= 256 KiB, or seq_len^2 floats when a
// single head needs more) and oneDNN's scratchpad) is kept by the plan for later calls, one
// set per concurrent caller. run() is const and safe to call from several threads at once.
//
// Threads: oneDNN runs on OpenMP. run_options::threads > 0 sets the calling thread's OpenMP team
// size (omp_set_num_threads) for the duration of run() and restores it afterwards; 0 leaves
// OpenMP's setting alone (all cores unless OMP_NUM_THREADS says otherwise); max_threads() is
// omp_get_max_threads() of the calling thread.
//
// Thread counts and rounding: the result depends on the thread count only through oneDNN's own
// partitioning. Its AVX-512 kernels (brgemm, ISA avx512_core and up) never split a reduction
// across threads, so there results are bitwise identical for every count; its AVX2 and older
// kernels (gemm:jit sgemm) split long reductions by team size, so results of different counts
// differ in the last bits: by at most onednn_thread_tolerance * max|y|
// (tests/kernels/test_onednn.cpp holds both, and runs under ONEDNN_MAX_CPU_ISA=AVX2 on any CPU).
// Decode calls read strided slices of the cache, which oneDNN runs on gemm:jit on every ISA: they
// too are within onednn_thread_tolerance, not bitwise. Making these bitwise would mean giving up
// oneDNN's threading; the naive, xsimd and tbb backends are bitwise identical for every thread
// count on every ISA.
//
// Errors: a failure inside oneDNN is rethrown as mha::error naming the backend and the step
// that failed ("onednn: oneDNN failed in a (1024 rows) projection: ... (dnnl_status_t 5)").
const backend& onednn_backend();

// How far apart (relative to max|y|) two thread counts' results of one plan may be when
// onednn_thread_count_bitwise() is false: 32 float ulps of the largest output.
inline constexpr double onednn_thread_tolerance = 32.0 / (1 << 23);

// Whether oneDNN dispatches kernels that make full forward passes bitwise identical for every
// thread count on this machine now (its effective ISA, after any ONEDNN_MAX_CPU_ISA cap, is
// avx512_core or up). Decode calls never are (above).
bool onednn_thread_count_bitwise();

// The ONEDNN_MAX_CPU_ISA value that caps oneDNN at the instruction set `which` (oneDNN's
// spelling: "AVX2" for isa::avx2), so that a comparison runs mha's kernels and oneDNN's on the
// same one; the SSE4.1 cap for the x86-64 baseline, whose FMA-less class oneDNN's lowest kernels
// share; nullopt for an isa oneDNN has no cap of (scalar, aarch64's).
std::optional<std::string_view> onednn_isa_cap(isa which);

}  // namespace mha
