// The AMX tile-product peak loop (TDPBF16PS on tiles that stay in their registers: the tile
// unit's rate, no loads; compile flags: bench/CMakeLists.txt). Run only where the xsimd kernels
// may use AMX (the kernels' runnable_isas() lists it: Linux has granted this process the tiles).
#include <immintrin.h>

#include <cstdint>

#include "fma_peak_kernels.hpp"

namespace mha_bench::detail {

double bf16_tile_rounds_amx(std::int64_t rounds, float* sink) noexcept {
  // Palette 1, all 8 registers 16 rows of 64 bytes: tmm0-3 accumulate, tmm4-5 hold A (16 rows
  // of 16 bf16 pairs), tmm6-7 hold B (16 pair rows of 16 columns).
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  // A: bf16 1.0 in every half; B: bf16 2^-10: each product adds 2^-10, so the sums stay
  // normal and finite for any realistic number of rounds.
  alignas(64) static std::uint32_t a[256], b[256];
  alignas(64) float c[256];
  for (int i = 0; i < 256; ++i) {
    a[i] = 0x3f803f80u;
    b[i] = 0x3a803a80u;
  }
  _tile_loadconfig(&config);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
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
  _tile_stored(0, c, 64);
  _tile_release();
  *sink = c[0];
  // Per instruction 16 x 16 outputs, each 16 pairs: 2 products, 2 additions per pair.
  return 4.0 * 16 * 16 * 16 * 4 * static_cast<double>(rounds);
}

}  // namespace mha_bench::detail
