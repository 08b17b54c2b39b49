// Internal: one ISA's isa_kernels table, from the micro-kernels of micro/. Included only by the
// per-ISA translation units (micro/kernels_avx512.cpp, ...) after defining
// MHA_SIMD_ISA_NAMESPACE; see micro/micro_kernel.hpp.
#pragma once

#include "kernels/interface/dispatch.hpp"
#include "kernels/micro/attention_kernel.hpp"
#include "kernels/micro/gemm_kernel.hpp"
#include "kernels/micro/pack_kernel.hpp"
#include "kernels/micro/peak_loops.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// The table of one ISA: Arch is its widest arch, Tiles its micro-kernels (which may use
// narrower batches: the AVX-512 build runs 8-float panels with AVX2-width registers), PairDot
// its product of bf16 pairs (widened to fp32 FMAs, or AVX512_BF16's dot product).
// isa_kernels::to_pairs: each row through PairDot's conversion.
template <class PairDot>
void to_pairs(const float* a, std::int64_t rows, std::int64_t k, std::int64_t lda,
              bf16_pair* dst) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) PairDot::to_pairs(a + r * lda, k, dst + r * pairs(k));
}

template <class Arch, class Tiles, class PairDot = widen_dot>
const isa_kernels* isa_table(mha::isa which) noexcept {
  static const isa_kernels table{which,
                                 Arch::name(),
                                 static_cast<int>(xsimd::batch<float, Arch>::size),
                                 Tiles::shapes,
                                 static_cast<int>(sizeof(Tiles::shapes) / sizeof(tile_shape)),
                                 &gemm<Arch, Tiles>,
                                 &to_pairs<PairDot>,
                                 &pack_pairs<Arch>,
                                 &gemm<Arch, Tiles, PairDot>,
                                 &attention_rows<Arch, Tiles, PairDot>,
                                 &row_max<Arch>,
                                 &exp2_sum<Arch>,
                                 &fma_rounds<Arch>,
                                 bf16_peak_loop<Arch, PairDot>()};
  return &table;
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
