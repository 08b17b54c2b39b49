// Internal: the x86-64 vector moves of the kernels' ISA-neutral framework (kernels/gemm.cpp,
// compiled with the baseline flags: SSE, in every x86-64 build). Every architecture's
// arch_block.hpp defines the same functions.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mha::detail {

// The 4 x 4 block at src (row stride ld_src) transposed to dst (row stride ld_dst): element by
// element, K^T's packing took a visible share of the attention core (measurements:
// docs/design.md §5.1).
inline void transpose_4x4(const float* src, std::int64_t ld_src, float* dst,
                          std::int64_t ld_dst) noexcept {
  __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ld_src),
         r2 = _mm_loadu_ps(src + 2 * ld_src), r3 = _mm_loadu_ps(src + 3 * ld_src);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(dst, r0);
  _mm_storeu_ps(dst + ld_dst, r1);
  _mm_storeu_ps(dst + 2 * ld_dst, r2);
  _mm_storeu_ps(dst + 3 * ld_dst, r3);
}

// 4 floats from src to dst, in one register (a call of memmove per panel row cost 1-2% of the
// attention core at head_dim 8).
inline void copy_4(const float* src, float* dst) noexcept { _mm_storeu_ps(dst, _mm_loadu_ps(src)); }

}  // namespace mha::detail
