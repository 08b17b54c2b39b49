// Internal: the per-ISA GEMM (isa_kernels::gemm): the micro-kernel over the blocking of
// gemm.hpp. Per-ISA code: see micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <cstdint>

#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// The micro-kernel over k slice [k0, k0 + kc) of a tile whose first `cols` columns are C's: the
// first slice (k0 == 0) starts from the bias, later ones continue the sum in c. A tile with
// fewer columns than nr (the last panel of an n that is not a multiple of nr) goes through a
// tile on the stack, in one slice (kc == k).
template <class T, int R, class Dot, class U = typename Dot::unit>
void micro_kernel_cols(std::int64_t k0, std::int64_t kc, const U* a, std::int64_t lda, const U* b,
                       const float* init, float* c, std::int64_t ldc, int cols) noexcept {
  if (cols == T::nr) {
    if (k0 == 0) {
      micro_kernel<T, R, Dot>(kc, a, lda, b, c, ldc, start_bias<T>{init});
    } else {
      micro_kernel<T, R, Dot>(kc, a + k0, lda, b + k0 * T::nr, c, ldc, start_sum<T>{c, ldc});
    }
    return;
  }
  alignas(64) float part[R * T::nr];
  micro_kernel<T, R, Dot>(kc, a, lda, b, part, T::nr, start_bias<T>{init});
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < cols; ++j) c[r * ldc + j] = part[r * T::nr + j];
  }
}

// `rows` rows of one column panel over k slice [k0, k0 + kc): blocks of R rows, then the
// remainder in blocks of the smaller power-of-two row counts (edge micro-kernels instead of
// padding A).
template <class T, int R, class Dot, class U = typename Dot::unit>
void panel_rows(std::int64_t rows, std::int64_t k0, std::int64_t kc, const U* a, std::int64_t lda,
                const U* b, const float* init, float* c, std::int64_t ldc, int cols) noexcept {
  for (; rows >= R; rows -= R, a += R * lda, c += R * ldc)
    micro_kernel_cols<T, R, Dot>(k0, kc, a, lda, b, init, c, ldc, cols);
  if constexpr (smaller_rows < R >> 0) {
    if (rows > 0) panel_rows<T, smaller_rows<R>, Dot>(rows, k0, kc, a, lda, b, init, c, ldc, cols);
  }
}

// Rows of A per block: a multiple of mr whose kc-float rows fill about gemm_a_block_bytes.
inline std::int64_t gemm_row_block(std::int64_t kc, int mr) noexcept {
  const std::int64_t rows = gemm_a_block_bytes / (kc * static_cast<std::int64_t>(sizeof(float)));
  return rows / mr > 1 ? rows / mr * mr : mr;
}

// Panels per group: their kc-row slices of B fill about gemm_b_block_bytes (at least one).
inline std::int64_t gemm_panel_group(std::int64_t kc, int nr) noexcept {
  const std::int64_t panels =
      gemm_b_block_bytes / (kc * nr * static_cast<std::int64_t>(sizeof(float)));
  return panels > 1 ? panels : 1;
}

// isa_kernels::gemm for one tile shape: panel groups, row blocks, k slices, panels, micro-tiles
// (outer to inner). A is read in place (packing it measured slower: docs/design.md §5.1); a
// full-width tile adds slice after slice into C, a partial one (the last panel) runs whole k at
// once. Every size below counts units of Dot (gemm.hpp): a slice of gemm_k_slice units is 256
// floats or 256 bf16 pairs, the same bytes of a panel row either way.
template <class T, class Dot>
void gemm_panels(const gemm_args_of<typename Dot::unit>& g, std::int64_t row_begin,
                 std::int64_t row_end, std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  const panels_of<typename Dot::unit>& b = g.b;
  const std::int64_t slice = b.k < gemm_k_slice ? b.k : gemm_k_slice;
  const std::int64_t block = gemm_row_block(slice, T::mr);
  const std::int64_t group = gemm_panel_group(slice, T::nr);
  for (std::int64_t p0 = panel_begin; p0 < panel_end; p0 += group) {
    const std::int64_t p1 = p0 + group < panel_end ? p0 + group : panel_end;
    for (std::int64_t r0 = row_begin; r0 < row_end; r0 += block) {
      const std::int64_t rows = (r0 + block < row_end ? r0 + block : row_end) - r0;
      for (std::int64_t k0 = 0; k0 < b.k; k0 += slice) {
        const std::int64_t kc = k0 + slice < b.k ? slice : b.k - k0;
        std::int64_t p = p0;
        if (rows == 1) {
          // One row (a decode step's token): panels_for<T, 1> full panels at once, so that
          // enough FMA chains run side by side (bitwise the same sums).
          constexpr int group_of = panels_for<T, 1>;
          for (; p + group_of <= p1 && (p + group_of) * T::nr <= b.n; p += group_of) {
            const std::int64_t first_col = p * T::nr;
            const auto* a = g.a + r0 * g.lda;
            float* c = g.c + r0 * g.ldc + first_col;
            if (k0 == 0) {
              panels_kernel<T, 1, group_of, Dot>(
                  kc, a, g.lda, b.panel(p), b.k * T::nr, c, g.ldc,
                  start_bias<T>{b.bias ? b.bias + first_col : nullptr});
            } else {
              panels_kernel<T, 1, group_of, Dot>(kc, a + k0, g.lda, b.panel(p) + k0 * T::nr,
                                                 b.k * T::nr, c, g.ldc, start_sum<T>{c, g.ldc});
            }
          }
        }
        for (; p < p1; ++p) {
          const std::int64_t first_col = p * T::nr;
          const int cols = static_cast<int>(b.n - first_col < T::nr ? b.n - first_col : T::nr);
          if (cols < T::nr && k0 > 0) continue;  // a partial tile runs whole k in the first slice
          panel_rows<T, T::mr, Dot>(rows, k0, cols < T::nr ? b.k : kc, g.a + r0 * g.lda, g.lda,
                                    b.panel(p), b.bias ? b.bias + first_col : nullptr,
                                    g.c + r0 * g.ldc + first_col, g.ldc, cols);
        }
      }
    }
  }
}

template <class Arch, class Tiles, class Dot = fma_dot>
void gemm(const gemm_args_of<typename Dot::unit>& g, std::int64_t row_begin, std::int64_t row_end,
          std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  MHA_EXPECTS(0 <= row_begin && row_begin <= row_end && row_end <= g.m);
  MHA_EXPECTS(0 <= panel_begin && panel_begin <= panel_end && panel_end <= g.b.panels());
  with_tile(Tiles{}, g.b.nr, [&](auto t) {
    gemm_panels<decltype(t), Dot>(g, row_begin, row_end, panel_begin, panel_end);
  });
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
