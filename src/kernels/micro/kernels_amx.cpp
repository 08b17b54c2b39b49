// The AMX kernels (compiled with their row's flags in kernels/kernel_isas.def; see
// micro/micro_kernel.hpp): the AVX512_BF16 kernels, with the bf16 GEMM and the bf16 attention's
// products (scores and P V) on AMX tiles. Chosen
// only where the CPU has AMX-BF16 and Linux has granted this process the tile state
// (dispatch.cpp).
#include <immintrin.h>

#define MHA_SIMD_ISA_NAMESPACE amx
#include "kernels/micro/avx512_tiles.hpp"
#include "kernels/micro/dpbf16_dot.hpp"
#include "kernels/micro/isa_table.hpp"

namespace mha::detail {
namespace amx {

// AMX has 8 tile registers of up to 16 rows of 64 bytes, shaped by a 64-byte configuration
// (palette 1) that each thread loads before using them. TDPBF16PS adds to C (M rows x 16
// floats) the product of A (M rows x 16 bf16 pairs) and B (16 pair rows x 16 columns, each
// element a bf16 pair): per element and pair, both products exact in fp32, summed with the
// accumulator in fp32, rounded to nearest even; denormal inputs and results flush to zero, as
// vdpbf16ps does. B's tile is 16 consecutive pair rows of a packed pair panel (gemm.hpp: row kk
// of the panel is pair kk of 16 or 32 columns), so the panels need no layout of their own.
struct alignas(64) tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};  // bytes per row of each register
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(tile_config) == 64, "LDTILECFG reads 64 bytes");

constexpr int tile_rows = 16;   // rows of C and A per tile
constexpr int tile_pairs = 16;  // pairs of k per A tile (64 bytes)
constexpr int tile_cols = 16;   // columns of C and B per tile

// tile_product's registers: C of a panel's two 16-column halves, the A tile and the halves' B tiles
// over 16 pairs of k, and the same over the last k % 16 pairs (shaped apart, so one configuration
// covers a whole k). GCC's tile intrinsics paste the register's number into the instruction's
// text, so tile_product names them by literal number: tmm0 c_lo, tmm1 c_hi, tmm2 a_main, tmm3 b_lo,
// tmm4 b_hi, tmm5 a_tail, tmm6 b_lo_tail, tmm7 b_hi_tail.
enum tile_register : int { c_lo, c_hi, a_main, b_lo, b_hi, a_tail, b_lo_tail, b_hi_tail };

// The configuration of tile_product: C blocks of `rows` rows and a tail of k_tail pairs (0: none).
tile_config strip_config(int rows, int k_tail) noexcept {
  tile_config c;
  constexpr auto row_bytes = static_cast<std::uint16_t>(tile_cols * sizeof(float));
  for (int t : {c_lo, c_hi, a_main}) c.rows[t] = static_cast<std::uint8_t>(rows);
  for (int t : {c_lo, c_hi, a_main, b_lo, b_hi}) c.colsb[t] = row_bytes;
  c.rows[b_lo] = c.rows[b_hi] = tile_pairs;
  // Without a tail its registers stay unconfigured: rows and bytes both 0 (LDTILECFG faults on
  // a register with one of them 0 and not the other).
  if (k_tail > 0) {
    c.rows[a_tail] = static_cast<std::uint8_t>(rows);
    c.colsb[a_tail] = static_cast<std::uint16_t>(k_tail * sizeof(bf16_pair));
    c.rows[b_lo_tail] = c.rows[b_hi_tail] = static_cast<std::uint8_t>(k_tail);
    c.colsb[b_lo_tail] = c.colsb[b_hi_tail] = row_bytes;
  }
  return c;
}

// The tile configuration this thread has loaded, reloaded only when a product needs another
// shape (LDTILECFG costs tens of cycles and zeroes every register), released at the end of each
// kernel entry (tile_state::release), so no thread keeps the tile state between calls.
class tile_state {
 public:
  // tile_product's configuration for `rows` rows and a tail of k_tail pairs.
  void use(int rows, int k_tail) noexcept {
    if (rows == rows_ && k_tail == k_tail_) return;
    const tile_config config = strip_config(rows, k_tail);
    _tile_loadconfig(&config);
    rows_ = rows;
    k_tail_ = k_tail;
  }
  void release() noexcept {
    if (rows_ == 0) return;
    _tile_release();
    rows_ = 0;
  }

 private:
  int rows_ = 0, k_tail_ = 0;  // rows_ 0: nothing loaded
};
thread_local tile_state tiles_loaded;

// C (rows x 16 Halves floats, row stride ldc) = [C +] A B: A's rows at a (k pairs each, stride
// lda pairs), B Halves 16-column tiles side by side in a pair panel of nr columns at b (its pair
// rows kk at b + kk nr). Each element's sum runs over k in the same order whatever `rows` is,
// so a row's result does not depend on the rows it is computed with. rows <= 16.
template <int Halves>
void tile_product(int rows, std::int64_t k, const bf16_pair* a, std::int64_t lda,
                  const bf16_pair* b, std::int64_t nr, float* c, std::int64_t ldc,
                  bool accumulate) noexcept {
  tiles_loaded.use(rows, static_cast<int>(k % tile_pairs));
  const std::int64_t full = k / tile_pairs * tile_pairs;
  const auto a_stride = static_cast<long>(lda * sizeof(bf16_pair));
  const auto b_stride = static_cast<long>(nr * sizeof(bf16_pair));
  const auto c_stride = static_cast<long>(ldc * sizeof(float));
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    if constexpr (Halves == 2) _tile_loadd(1, c + tile_cols, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (Halves == 2) _tile_zero(1);
  }
  for (std::int64_t kk = 0; kk < full; kk += tile_pairs) {
    _tile_loadd(2, a + kk, a_stride);
    _tile_loadd(3, b + kk * nr, b_stride);
    _tile_dpbf16ps(0, 2, 3);
    if constexpr (Halves == 2) {
      _tile_loadd(4, b + kk * nr + tile_cols, b_stride);
      _tile_dpbf16ps(1, 2, 4);
    }
  }
  if (full < k) {
    _tile_loadd(5, a + full, a_stride);
    _tile_loadd(6, b + full * nr, b_stride);
    _tile_dpbf16ps(0, 5, 6);
    if constexpr (Halves == 2) {
      _tile_loadd(7, b + full * nr + tile_cols, b_stride);
      _tile_dpbf16ps(1, 5, 7);
    }
  }
  _tile_stored(0, c, c_stride);
  if constexpr (Halves == 2) _tile_stored(1, c + tile_cols, c_stride);
}

// The products of bf16 pairs on tiles: dpbf16_dot (vdpbf16ps, for what tiles do not cover: a
// single row, 8-column panels, the causal diagonal's keys row by row) with tile products of up
// to tile_rows rows, which the attention kernel takes for its scores and P V
// (micro/attention_kernel.hpp).
struct tile_dot : dpbf16_dot {
  static constexpr int tile_rows = amx::tile_rows;
  static constexpr int tile_cols = amx::tile_cols;
  // tile_product over a panel of nr columns, nr a multiple of 16 up to 32.
  static void product(int rows, std::int64_t k, const bf16_pair* a, std::int64_t lda,
                      const bf16_pair* b, std::int64_t nr, float* c, std::int64_t ldc,
                      bool accumulate) noexcept {
    MHA_EXPECTS(rows >= 1 && rows <= tile_rows && (nr == tile_cols || nr == 2 * tile_cols));
    if (nr == tile_cols) {
      tile_product<1>(rows, k, a, lda, b, nr, c, ldc, accumulate);
    } else {
      tile_product<2>(rows, k, a, lda, b, nr, c, ldc, accumulate);
    }
  }
};

// isa_kernels::pair_gemm on tiles, for panels of 16 or 32 columns (8-column panels, whose
// halves would be half-empty tiles, take vdpbf16ps). Row blocks whose A fills about
// gemm_a_block_bytes (L2), then panels, then blocks of 16 rows over the whole k: a C block lives
// in two tile registers from its first pair of k to its last, then gains the bias on its way out.
// (Two row tiles by two column tiles, each tile loaded serving two products, measured no faster
// (measurements: docs/design.md §5.1).)
void tile_pair_gemm(const pair_gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
                    std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  const pair_panels_view& b = g.b;
  if (b.nr % tile_cols != 0) {
    // tile_dot's vector products are dpbf16_dot's: the table's own instantiation serves.
    gemm<xsimd::avx512bw, avx512_tiles, tile_dot>(g, row_begin, row_end, panel_begin, panel_end);
    return;
  }
  static_assert(avx512_tiles::shapes[0].nr <= 2 * tile_cols, "a panel is at most two tiles wide");
  const std::int64_t k = b.k;
  const std::int64_t a_rows =
      gemm_a_block_bytes / (k * static_cast<std::int64_t>(sizeof(bf16_pair)));
  const std::int64_t block = a_rows > tile_rows ? a_rows / tile_rows * tile_rows : tile_rows;
  constexpr std::int64_t out_cols = 2 * tile_cols;
  alignas(64) float out[tile_rows * out_cols];
  for (std::int64_t r0 = row_begin; r0 < row_end; r0 += block) {
    const std::int64_t r1 = r0 + block < row_end ? r0 + block : row_end;
    for (std::int64_t p = panel_begin; p < panel_end; ++p) {
      const std::int64_t first_col = p * b.nr;
      const std::int64_t cols = b.n - first_col < b.nr ? b.n - first_col : b.nr;
      for (std::int64_t r = r0; r < r1; r += tile_rows) {
        const int rows = static_cast<int>(r1 - r < tile_rows ? r1 - r : tile_rows);
        tile_dot::product(rows, k, g.a + r * g.lda, g.lda, b.panel(p), b.nr, out, out_cols, false);
        for (std::int64_t h = 0; h * tile_cols < cols; ++h) {
          const std::int64_t left = cols - h * tile_cols;
          const auto mask = static_cast<__mmask16>(left >= tile_cols ? 0xffff : (1u << left) - 1);
          const __m512 bias =
              b.bias ? _mm512_loadu_ps(b.bias + first_col + h * tile_cols) : _mm512_setzero_ps();
          for (int rr = 0; rr < rows; ++rr) {
            const __m512 sum =
                _mm512_add_ps(_mm512_load_ps(out + rr * out_cols + h * tile_cols), bias);
            _mm512_mask_storeu_ps(g.c + (r + rr) * g.ldc + first_col + h * tile_cols, mask, sum);
          }
        }
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
    isa_kernels t = *amx::kernels_of<xsimd::avx512bw, amx::avx512_tiles, amx::tile_dot>(isa::amx);
    t.pair_gemm = &amx::tile_pair_gemm;
    t.attention_rows = &amx::tile_attention_rows;
    return t;
  }();
  return &table;
}

}  // namespace mha::detail
