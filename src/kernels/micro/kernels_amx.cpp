// The AMX kernels (compiled with their row's flags in kernels/arch/x86_64/kernel_isas.def; see
// micro/micro_kernel.hpp): the AVX512_BF16 kernels, with the bf16 GEMM and the bf16 attention's
// products (scores and P V) on AMX tiles (the tile primitives: arch/x86_64/amx_tiles.hpp). Chosen
// only where the CPU has AMX-BF16 and Linux has granted this process the tile state
// (dispatch.cpp).
#include <algorithm>
#include <cstdint>
#include <utility>

#define MHA_SIMD_ISA_NAMESPACE amx
#include "amx_tiles.hpp"   // kernels/arch/x86_64/
#include "dpbf16_dot.hpp"  // kernels/arch/x86_64/
#include "kernels/micro/avx512_tiles.hpp"
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {
namespace amx {

// The tile configuration this thread has loaded (tile_state: amx_tiles.hpp).
thread_local tile_state tiles_loaded;

// Rows of A per block, and pairs of k per slice: a slice of a panel (128 pairs x 32 columns,
// 16 KiB) stays in L1 while the block's strips pass over it, and the block's slice of A
// (256 x 128 pairs, 128 KiB) in L2 (measurements: docs/design.md §5.1).
constexpr std::int64_t tile_gemm_rows = 256;
constexpr std::int64_t tile_k_slice = 128;
static_assert(tile_k_slice % tile_pairs == 0 && tile_gemm_rows % (2 * tile_rows) == 0);
// C's rows a multiple of 2 KiB apart put a block's 64 lines into a few of L1's sets, and each k
// slice loads and stores them: from this many slices on, such a C's partial sums wait in the edge
// buffer (copied into C once per panel); over fewer the copy costs more than the misses
// (measurements: docs/design.md §5.1).
constexpr std::int64_t aliased_c_floats = 512, aliased_c_slices = 16;

// The products of bf16 pairs on tiles: dpbf16_dot (vdpbf16ps, for what tiles do not cover: a
// single row, 8-column panels, an int8 cache) with tile products of up to pair_rows rows, which
// the attention kernel takes for its scores and P V (micro/attention_tiles.hpp).
struct tile_dot : dpbf16_dot {
  static constexpr int tile_rows = amx::tile_rows;
  static constexpr int tile_cols = amx::tile_cols;
  static constexpr int tile_pairs = amx::tile_pairs;
  // Two row tiles: the scores' blocks of 32 rows take tile_block's 2 x 2 arrangement.
  static constexpr int pair_rows = 2 * tile_rows;
  // The bf16 peak of these kernels: the tile unit's (isa_kernels::bf16_rounds).
  static double peak_rounds(std::int64_t rounds, float* sink) noexcept {
    return register_tile_rounds(rounds, sink);
  }
  // C (rows, nr) = [C +] A (rows, k units) B (a panel's k rows), nr a multiple of 16 up to 32:
  // tile_product for up to 16 rows; 32 rows over whole steps of k (no tail) as tile_block<2>,
  // each A and B tile loaded serving two products. Both sum each element over k in the same
  // order, so a row's result does not depend on the rows it is computed with.
  static void product(int rows, std::int64_t k, const bf16_pair* a, std::int64_t lda,
                      const bf16_pair* b, std::int64_t nr, float* c, std::int64_t ldc,
                      bool accumulate) noexcept {
    MHA_EXPECTS(rows >= 1 && rows <= pair_rows && (nr == tile_cols || nr == 2 * tile_cols));
    MHA_EXPECTS(rows <= tile_rows || (rows == pair_rows && k % tile_pairs == 0));
    if (rows == pair_rows) {
      tiles_loaded.use(gemm_config_rows, gemm_config_tail);
      tile_block_of<2>(nr, k / tile_pairs, a, lda, b, nullptr, 0, nullptr, c, ldc, !accumulate,
                       nullptr);
    } else if (nr == tile_cols) {
      tile_product<1>(tiles_loaded, rows, k, a, lda, b, nr, c, ldc, accumulate);
    } else {
      tile_product<2>(tiles_loaded, rows, k, a, lda, b, nr, c, ldc, accumulate);
    }
  }
};

// The first `rows` rows x `pairs` pairs at a (row stride lda) into `to`, buffer_rows rows of
// `width` pairs, zero past them.
void copy_padded(const bf16_pair* a, std::int64_t lda, std::int64_t rows, std::int64_t pairs,
                 std::int64_t width, std::int64_t buffer_rows, bf16_pair* to) noexcept {
  for (std::int64_t r = 0; r < buffer_rows; ++r) {
    bf16_pair* row = to + r * width;
    const std::int64_t n = r < rows ? pairs : 0;
    for (std::int64_t j = 0; j < n; ++j) row[j] = a[r * lda + j];
    for (std::int64_t j = n; j < width; ++j) row[j] = 0;
  }
}

// isa_kernels::pair_gemm on tiles, for panels of 16 or 32 columns (8-column panels, whose tiles
// would be half-empty, take vdpbf16ps). Blocks of tile_gemm_rows rows, then panels, then
// k slices of tile_k_slice pairs, then blocks of 32 rows (a last one of 16, then one of the
// rows left): C's partial sums wait in C itself between slices (or in a buffer: the last
// panel's columns past n, the rows past a strip, a C whose rows are not on cache lines). A is read
// in place; its tail (k past the last 16 pairs, rows past the last 16) and B's are copied into
// zero-padded tiles, so that no load reads past A or B, and a padded product adds exact zeros.
void tile_pair_gemm(const pair_gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
                    std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  const pair_panels_view& b = g.b;
  if (b.nr % tile_cols != 0) {
    // tile_dot's vector products are dpbf16_dot's: the table's own instantiation serves.
    gemm<xsimd::avx512bw, avx512_tiles, tile_dot>(g, row_begin, row_end, panel_begin, panel_end);
    return;
  }
  static_assert(avx512_tiles::shapes[0].nr <= 2 * tile_cols, "a panel is at most two tiles wide");
  constexpr std::int64_t strip = tile_rows;
  const std::int64_t width = b.nr;
  tiles_loaded.use(gemm_config_rows, gemm_config_tail);
  const std::int64_t k = b.k, full_steps = k / tile_pairs, k_tail = k % tile_pairs;
  const bool c_aligned =
      reinterpret_cast<std::uintptr_t>(g.c) % 64 == 0 && g.ldc * sizeof(float) % 64 == 0;
  const bool c_aliased =
      g.ldc % aliased_c_floats == 0 && full_steps >= aliased_c_slices * (tile_k_slice / tile_pairs);
  // C of the last panel past n, or of a strip of fewer than 16 rows; A's rows of such a strip
  // (one slice and its tail); A's and B's k tails.
  alignas(64) float edge[(tile_gemm_rows + strip) * 2 * tile_cols];
  alignas(64) bf16_pair short_rows[strip * (tile_k_slice + tile_pairs)];
  alignas(64) bf16_pair a_tail[2 * strip * tile_pairs];
  alignas(64) bf16_pair b_tail[tile_pairs * 2 * tile_cols];
  for (std::int64_t r0 = row_begin; r0 < row_end; r0 += tile_gemm_rows) {
    const std::int64_t r1 = std::min(r0 + tile_gemm_rows, row_end);
    for (std::int64_t p = panel_begin; p < panel_end; ++p) {
      const std::int64_t first_col = p * width, cols = std::min(width, b.n - first_col);
      const bf16_pair* panel = b.panel(p);
      const float* bias = b.bias ? b.bias + first_col : nullptr;
      if (k_tail > 0) {
        copy_padded(panel + full_steps * tile_pairs * width, width, k_tail, width, width,
                    tile_pairs, b_tail);
      }
      // Where block rows [r, r + 16) keep their partial sums: C, or the edge buffer (C's rows
      // past n, or not on cache lines: a tile row that spans two lines loads and stores at half
      // speed, as in a caller's output of odd alignment; or aliased over many slices).
      const bool in_place = cols == width && c_aligned && !c_aliased;
      const auto sums = [&](std::int64_t r, bool whole_rows) {
        return in_place && whole_rows ? std::pair{g.c + r * g.ldc + first_col, g.ldc}
                                      : std::pair{edge + (r - r0) * width, width};
      };
      std::int64_t s0 = 0;
      do {  // once at least: a k of fewer than 16 pairs is its tail alone
        const std::int64_t steps = std::min(tile_k_slice / tile_pairs, full_steps - s0);
        const bool first = s0 == 0, last = s0 + steps == full_steps;
        const bool tail = last && k_tail > 0;
        const bf16_pair* b_slice = panel + s0 * tile_pairs * width;
        std::int64_t r = r0;
        while (r + strip <= r1) {
          const bool pair = r + 2 * strip <= r1;
          const bf16_pair* a = g.a + r * g.lda + s0 * tile_pairs;
          if (tail) {
            copy_padded(a + steps * tile_pairs, g.lda, pair ? 2 * strip : strip, k_tail, tile_pairs,
                        2 * strip, a_tail);
          }
          const auto [c, ldc] = sums(r, true);
          if (pair) {
            tile_block_of<2>(width, steps, a, g.lda, b_slice, tail ? a_tail : nullptr, tile_pairs,
                             b_tail, c, ldc, first, bias);
          } else {
            tile_block_of<1>(width, steps, a, g.lda, b_slice, tail ? a_tail : nullptr, tile_pairs,
                             b_tail, c, ldc, first, bias);
          }
          r += pair ? 2 * strip : strip;
        }
        if (r < r1) {  // fewer than 16 rows left: A copied into 16 zero-padded rows
          const std::int64_t rows = r1 - r, slice = steps * tile_pairs;
          const std::int64_t padded = slice + (tail ? tile_pairs : 0);
          copy_padded(g.a + r * g.lda + s0 * tile_pairs, g.lda, rows, slice + (tail ? k_tail : 0),
                      padded, strip, short_rows);
          const auto [c, ldc] = sums(r, false);
          tile_block_of<1>(width, steps, short_rows, padded, b_slice,
                           tail ? short_rows + slice : nullptr, padded, b_tail, c, ldc, first,
                           bias);
        }
        s0 += tile_k_slice / tile_pairs;
      } while (s0 < full_steps);
      // Sums kept in the edge buffer: their valid rows and columns into C.
      const std::int64_t whole_strips_end = r0 + (r1 - r0) / strip * strip;
      for (std::int64_t r = in_place ? whole_strips_end : r0; r < r1; ++r) {
        const float* from = edge + (r - r0) * width;
        std::copy(from, from + cols, g.c + r * g.ldc + first_col);
      }
    }
  }
  tiles_loaded.release();
}

// isa_kernels::attention_rows with tile_dot, the tiles released after.
void tile_attention_rows(const attention_args& args, const attention_layout& layout,
                         const attention_task& task, float* scratch) noexcept {
  attention_rows<xsimd::avx512bw, avx512_tiles, tile_dot>(args, layout, task, scratch);
  tiles_loaded.release();
}

}  // namespace amx

const isa_kernels* amx_kernels() noexcept {
  static const isa_kernels table = [] {
    isa_kernels t = *amx::isa_table<xsimd::avx512bw, amx::avx512_tiles, amx::tile_dot>(isa::amx);
    t.pair_gemm = &amx::tile_pair_gemm;
    t.attention_rows = &amx::tile_attention_rows;
    t.pair_tile_cols = amx::tile_cols;
    return t;
  }();
  return &table;
}

}  // namespace mha::detail
