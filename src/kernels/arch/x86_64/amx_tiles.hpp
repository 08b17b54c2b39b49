// Internal: the AMX tile primitives of the AMX kernels (micro/kernels_amx.cpp, its only includer,
// after defining MHA_SIMD_ISA_NAMESPACE): the tile configuration and its per-thread state, and the
// tile products, C kept in tiles over one k. GCC 12 offers AMX only as intrinsics, wrapped here
// with the architecture's other primitives (arch_simd.hpp). Per-ISA code: see
// micro/micro_kernel.hpp.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/interface/gemm.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

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
inline tile_config strip_config(int rows, int k_tail) noexcept {
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

// C (rows x 16 Halves floats, row stride ldc) = [C +] A B: A's rows at a (k pairs each, stride
// lda pairs), B Halves 16-column tiles side by side in a pair panel of nr columns at b (its pair
// rows kk at b + kk nr), after loading its configuration into `state`. Each element's sum runs
// over k in the same order whatever `rows` is, so a row's result does not depend on the rows it
// is computed with. rows <= 16.
template <int Halves>
void tile_product(tile_state& state, int rows, std::int64_t k, const bf16_pair* a, std::int64_t lda,
                  const bf16_pair* b, std::int64_t nr, float* c, std::int64_t ldc,
                  bool accumulate) noexcept {
  state.use(rows, static_cast<int>(k % tile_pairs));
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

// The tile unit's own rate, the peak that tile kernels are read against (tile_dot::peak_rounds,
// isa_kernels::bf16_rounds): `rounds` rounds of 4 TDPBF16PS on tiles that stay in their
// registers (C in tmm0-3, A in tmm4-5, B in tmm6-7, every one 16 rows of 64 bytes: no loads in
// the loop), C's first element at *sink; returns the FLOPs done. The configuration is released
// after, as every kernel entry releases it.
inline double register_tile_rounds(std::int64_t rounds, float* sink) noexcept {
  tile_config config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = static_cast<std::uint8_t>(tile_rows);
    config.colsb[t] = static_cast<std::uint16_t>(tile_cols * sizeof(float));
  }
  // A: bf16 1.0 in every half; B: bf16 2^-10: each product adds 2^-10, so the sums stay normal
  // and finite for any realistic number of rounds.
  alignas(64) static std::uint32_t a[tile_rows * tile_pairs], b[tile_pairs * tile_cols];
  alignas(64) float c[tile_rows * tile_cols];
  for (int i = 0; i < tile_rows * tile_pairs; ++i) {
    a[i] = 0x3f803f80u;
    b[i] = 0x3a803a80u;
  }
  constexpr long stride = 64;
  _tile_loadconfig(&config);
  _tile_loadd(4, a, stride);
  _tile_loadd(5, a, stride);
  _tile_loadd(6, b, stride);
  _tile_loadd(7, b, stride);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t r = 0; r < rounds; ++r) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, stride);
  _tile_release();
  *sink = c[0];
  // Per product 16 x 16 outputs of 16 pairs each: 2 multiplications and 2 additions a pair.
  return 4.0 * tile_rows * tile_cols * tile_pairs * 4 * static_cast<double>(rounds);
}

// The tile GEMM's arrangement: every register 16 rows of 64 bytes; C of a block of up to 32 rows
// x 32 columns in up to four (tmm0 rows 0-15 x columns 0-15, tmm1 rows 0-15 x 16-31, tmm2 and
// tmm3 rows 16-31), the A tiles of its two row strips in tmm4 and tmm5, B's two column halves
// in tmm6 and tmm7: each tile loaded serves two products (4 loads per 4 products; the strip
// kernel above loads 3 per 2). strip_config(tile_rows, tile_pairs) shapes all eight registers so.
constexpr int gemm_config_rows = tile_rows, gemm_config_tail = tile_pairs;

// One block of C (16 * RowTiles rows x 16 * Halves columns, row stride ldc floats) over a k
// slice: C = start + the sum over `steps` 16-pair steps of A (row stride lda pairs) times B (a
// pair panel of 16 * Halves columns from the slice's first pair row), then one more step from
// the zero-padded tails a_tail (row stride tail_lda pairs) and b_tail (16 pair rows of the
// panel's width) when a_tail is given. C starts as the bias in every row (first, bias given),
// zero (first), or as it is.
template <int RowTiles, int Halves>
void tile_block(std::int64_t steps, const bf16_pair* a, std::int64_t lda, const bf16_pair* b,
                const bf16_pair* a_tail, std::int64_t tail_lda, const bf16_pair* b_tail, float* c,
                std::int64_t ldc, bool first, const float* bias) noexcept {
  static_assert((RowTiles == 1 || RowTiles == 2) && (Halves == 1 || Halves == 2));
  constexpr int nr = Halves * tile_cols;
  constexpr long b_stride = nr * sizeof(bf16_pair);
  const auto a_stride = static_cast<long>(lda * sizeof(bf16_pair));
  const auto c_stride = static_cast<long>(ldc * sizeof(float));
  float* c1 = c + tile_rows * ldc;  // the second strip's rows
  if (!first) {
    _tile_loadd(0, c, c_stride);
    if constexpr (Halves == 2) _tile_loadd(1, c + tile_cols, c_stride);
    if constexpr (RowTiles == 2) _tile_loadd(2, c1, c_stride);
    if constexpr (RowTiles == 2 && Halves == 2) _tile_loadd(3, c1 + tile_cols, c_stride);
  } else if (bias != nullptr) {  // a row stride of 0: every row of the tile is the bias
    _tile_loadd(0, bias, 0);
    if constexpr (Halves == 2) _tile_loadd(1, bias + tile_cols, 0);
    if constexpr (RowTiles == 2) _tile_loadd(2, bias, 0);
    if constexpr (RowTiles == 2 && Halves == 2) _tile_loadd(3, bias + tile_cols, 0);
  } else {
    _tile_zero(0);
    if constexpr (Halves == 2) _tile_zero(1);
    if constexpr (RowTiles == 2) _tile_zero(2);
    if constexpr (RowTiles == 2 && Halves == 2) _tile_zero(3);
  }
  const auto step = [&](const bf16_pair* a0, long as, const bf16_pair* bb) {
    _tile_loadd(4, a0, as);
    _tile_loadd(6, bb, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Halves == 2) {
      _tile_loadd(7, bb + tile_cols, b_stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (RowTiles == 2) {
      _tile_loadd(5, reinterpret_cast<const char*>(a0) + tile_rows * as, as);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (Halves == 2) _tile_dpbf16ps(3, 5, 7);
    }
  };
  for (std::int64_t s = 0; s < steps; ++s) {
    step(a + s * tile_pairs, a_stride, b + s * tile_pairs * nr);
  }
  if (a_tail != nullptr) step(a_tail, static_cast<long>(tail_lda * sizeof(bf16_pair)), b_tail);
  _tile_stored(0, c, c_stride);
  if constexpr (Halves == 2) _tile_stored(1, c + tile_cols, c_stride);
  if constexpr (RowTiles == 2) _tile_stored(2, c1, c_stride);
  if constexpr (RowTiles == 2 && Halves == 2) _tile_stored(3, c1 + tile_cols, c_stride);
}

// tile_block<RowTiles, Halves> for the panel width nr (16 or 32).
template <int RowTiles, class... Args>
void tile_block_of(std::int64_t nr, Args... args) noexcept {
  if (nr == 2 * tile_cols) {
    tile_block<RowTiles, 2>(args...);
  } else {
    tile_block<RowTiles, 1>(args...);
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
