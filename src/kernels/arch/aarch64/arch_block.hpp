// Internal: the aarch64 vector moves of the kernels' ISA-neutral framework (kernels/gemm.cpp,
// compiled with the baseline flags: NEON, in every aarch64 build). Every architecture's
// arch_block.hpp defines the same functions; the x86-64 ones say why each exists.
#pragma once

#include <arm_neon.h>

#include <cstdint>

namespace mha::detail {

// The 4 x 4 block at src (row stride ld_src) transposed to dst (row stride ld_dst): 32-bit
// transposes of row pairs (trn1/trn2), then 64-bit ones across them.
inline void transpose_4x4(const float* src, std::int64_t ld_src, float* dst,
                          std::int64_t ld_dst) noexcept {
  const float32x4x2_t r01 = vtrnq_f32(vld1q_f32(src), vld1q_f32(src + ld_src));
  const float32x4x2_t r23 = vtrnq_f32(vld1q_f32(src + 2 * ld_src), vld1q_f32(src + 3 * ld_src));
  const auto wide = [](float32x4_t x) { return vreinterpretq_f64_f32(x); };
  const auto narrow = [](float64x2_t x) { return vreinterpretq_f32_f64(x); };
  vst1q_f32(dst, narrow(vtrn1q_f64(wide(r01.val[0]), wide(r23.val[0]))));
  vst1q_f32(dst + ld_dst, narrow(vtrn1q_f64(wide(r01.val[1]), wide(r23.val[1]))));
  vst1q_f32(dst + 2 * ld_dst, narrow(vtrn2q_f64(wide(r01.val[0]), wide(r23.val[0]))));
  vst1q_f32(dst + 3 * ld_dst, narrow(vtrn2q_f64(wide(r01.val[1]), wide(r23.val[1]))));
}

// 4 floats from src to dst, in one register.
inline void copy_4(const float* src, float* dst) noexcept { vst1q_f32(dst, vld1q_f32(src)); }

}  // namespace mha::detail
