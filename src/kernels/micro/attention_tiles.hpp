// Internal: the attention kernel's Q K^T and P V on tiles (for a Dot with tile products: AMX,
// micro/kernels_amx.cpp), for a packed block whose products its on_tiles() puts there
// (micro/attention_packed.hpp). Per-ISA code: see micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <cstdint>

#include "kernels/micro/attention_block.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// The products on tiles of a packed_attention's bf16 pairs (Packed), for the tile shape T it
// takes from its ISA's tiles (T::nr a multiple of the tile's columns).
template <class Packed>
struct tile_path {
  using Dot = typename Packed::dot;
  using panel_unit = typename Packed::panel_unit;
  const Packed& block;

  // Packed::scores on tiles: blocks of two row tiles where head_dim is whole tile steps (each
  // tile loaded serves two products), else of one; each over its panels up to its own diagonal.
  template <class T>
  void scores(std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t rows = block.rows, last = block.rows_end(0, rows);
    const std::int64_t panels = ((last < j1 ? last : j1) - j0 + T::nr - 1) / T::nr;
    const std::int64_t du = block.dim_units(), ld = block.layout.score_cols;
    const int most = du % Dot::tile_pairs == 0 ? Dot::pair_rows : Dot::tile_rows;
    for (std::int64_t r = 0; r < rows;) {
      const int rows_here = static_cast<int>(rows - r >= most            ? most
                                             : rows - r < Dot::tile_rows ? rows - r
                                                                         : Dot::tile_rows);
      const std::int64_t end = block.rows_end(r, r + rows_here);
      for (std::int64_t p = 0; p < panels && j0 + p * T::nr < end; ++p) {
        Dot::product(rows_here, du, block.queries() + r * du, du,
                     block.kt + j0 * du + p * du * T::nr, T::nr,
                     block.scratch.scores + r * ld + p * T::nr, ld, false);
      }
      r += rows_here;
    }
  }

  // Packed::values on tiles: per block of tile rows, O = O * rescale (vectors, in place), then
  // O += P V on tiles over the whole pairs of keys every row of the block sees, then over the
  // pairs of the diagonal (the keys only the block's later rows see), each row's weights zero
  // past its own keys, from a copy of their values with every NaN and Inf set to 0 (so a
  // masked weight meets only finite values and adds an exact 0), and last each non-finite value
  // times its weight for the rows that see it. Which products run where depends on positions
  // only, never on the values, so a row's result does not depend on a later token.
  template <class T>
  void values(std::int64_t j0, std::int64_t j1) const noexcept;

 private:
  // The n pair rows of a V panel (nr columns) at `from` into `to`, every NaN and Inf half set
  // to 0; false when there was one.
  template <class T>
  static bool finite_copy(const panel_unit* from, std::int64_t n, panel_unit* to) noexcept;
  // O[rr] += P[rr, k] V[j0 + k] for the NaN and Inf elements of V only, for the rows rr of
  // [r, r + R) and their keys k in [from, row_keys(rr)) (a panel from key j0, O of its columns).
  template <class T>
  void non_finite_values(std::int64_t r, int R, std::int64_t j0, std::int64_t from, std::int64_t j1,
                         const panel_unit* panel, float* o) const noexcept;
};

template <class Packed>
template <class T>
void tile_path<Packed>::values(std::int64_t j0, std::int64_t j1) const noexcept {
  using batch = xsimd::batch<float, typename Packed::arch>;
  const attention_layout& layout = block.layout;
  const attention_scratch& scratch = block.scratch;
  const std::int64_t rows = block.rows;
  constexpr std::int64_t lanes = batch::size;
  const std::int64_t panels = layout.acc_cols / T::nr, wu = block.weight_units();
  const std::int64_t stride = block.value_rows() * T::nr;
  const bool first = j0 == block.task.key_begin;
  for (std::int64_t r = 0; r < rows; r += Dot::tile_rows) {
    const int rows_here = static_cast<int>(rows - r < Dot::tile_rows ? rows - r : Dot::tile_rows);
    const auto keys = block.block_keys(r, r + rows_here, j0, j1);
    const std::int64_t kc = keys.kc, common = keys.common;
    if (kc <= 0) continue;  // no keys here for these rows: rescale is 1, nothing to add
    // Whole pairs of the keys every row sees, then the diagonal's pairs up to the block's last
    // key (at most a tile's rows of keys and a pair on each side).
    const std::int64_t common_units = common / 2, all_units = (kc + 1) / 2;
    const std::int64_t diagonal_units = all_units - common_units;
    constexpr std::int64_t max_diagonal = Dot::tile_rows / 2 + 2;
    MHA_EXPECTS(diagonal_units <= max_diagonal && T::nr <= 2 * Dot::tile_cols);
    float* o = scratch.accumulators + r * layout.acc_cols;
    // The first tile starts O from the product, or from zeros where there is none (scratch
    // holds anything, NaN included, so it is stored over, never multiplied). Later tiles
    // rescale only the rows whose maximum grew (a factor of 1 changes no bit).
    if (!first || common_units == 0) {
      for (int rr = 0; rr < rows_here; ++rr) {
        if (!first && scratch.rescale[r + rr] == 1.0f) continue;
        float* row = o + rr * layout.acc_cols;
        for (std::int64_t c = 0; c < layout.acc_cols; c += lanes) {
          const batch kept =
              first ? batch(0.0f) : scratch.rescale[r + rr] * batch::load_unaligned(row + c);
          kept.store_unaligned(row + c);
        }
      }
    }
    alignas(64) panel_unit finite[max_diagonal * 2 * Dot::tile_cols];
    for (std::int64_t p = 0; p < panels; ++p) {
      const panel_unit* panel = block.v + p * stride + j0 / 2 * T::nr;
      if (common_units > 0) {
        Dot::product(rows_here, common_units, block.weights() + r * wu, wu, panel, T::nr,
                     o + p * T::nr, layout.acc_cols, !first);
      }
      if (diagonal_units > 0) {
        const panel_unit* wedge = panel + common_units * T::nr;
        const bool all_finite = finite_copy<T>(wedge, diagonal_units, finite);
        // O holds the product above, or the zeros stored over it before.
        Dot::product(rows_here, diagonal_units, block.weights() + r * wu + common_units, wu, finite,
                     T::nr, o + p * T::nr, layout.acc_cols, true);
        if (!all_finite)
          non_finite_values<T>(r, rows_here, j0, 2 * common_units, j1, panel, o + p * T::nr);
      }
    }
  }
}

template <class Packed>
template <class T>
bool tile_path<Packed>::finite_copy(const panel_unit* from, std::int64_t n,
                                    panel_unit* to) noexcept {
  // A bf16 half is Inf or NaN when its exponent bits are all ones.
  using words = xsimd::batch<std::uint32_t, typename Packed::arch>;
  constexpr std::int64_t lanes = words::size;
  const words lo(0x00007f80u), hi(0x7f800000u), lo_half(0x0000ffffu), hi_half(0xffff0000u);
  auto bad = words(0u) != words(0u);  // all false
  for (std::int64_t w = 0; w < n * T::nr; w += lanes) {
    const words x = words::load_unaligned(from + w);
    const auto bad_lo = (x & lo) == lo, bad_hi = (x & hi) == hi;
    bad = bad || bad_lo || bad_hi;
    const words keep =
        xsimd::select(bad_lo, words(0u), lo_half) | xsimd::select(bad_hi, words(0u), hi_half);
    (x & keep).store_unaligned(to + w);
  }
  return !xsimd::any(bad);
}

template <class Packed>
template <class T>
void tile_path<Packed>::non_finite_values(std::int64_t r, int R, std::int64_t j0, std::int64_t from,
                                          std::int64_t j1, const panel_unit* panel,
                                          float* o) const noexcept {
  const auto half_of = [](std::uint32_t pair, std::int64_t k) {
    return static_cast<bf16>(k % 2 == 0 ? pair & 0xffffu : pair >> 16);
  };
  for (std::int64_t rr = r; rr < r + R; ++rr) {
    const bf16_pair* w =
        block.weights() + rr * block.weight_units();  // P as the tile product took it
    float* out = o + (rr - r) * block.layout.acc_cols;
    for (std::int64_t k = from; k < block.row_keys(rr, j0, j1); ++k) {
      for (int c = 0; c < T::nr; ++c) {
        const bf16 half = half_of(panel[k / 2 * T::nr + c], k);
        if ((half & 0x7f80u) != 0x7f80u) continue;  // finite: in the tile product already
        out[c] += from_bf16(half_of(w[k / 2], k)) * from_bf16(half);
      }
    }
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
