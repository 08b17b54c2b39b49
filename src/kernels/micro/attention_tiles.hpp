// Internal: the attention kernel's P V on tiles (attention_block::tile_values, for a Dot with
// tile products: AMX, micro/kernels_amx.cpp). Included by micro/attention_kernel.hpp after
// attention_block, whose member it defines; not on its own.
#pragma once

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

template <class Arch, class Tiles, class Dot, class ScoreDot>
template <class T>
void attention_block<Arch, Tiles, Dot, ScoreDot>::tile_values(std::int64_t j0,
                                                              std::int64_t j1) const noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = batch::size;
  const std::int64_t panels = l.acc_cols / T::nr, wu = weight_units();
  const std::int64_t stride = value_rows() * T::nr;
  const bool first = j0 == t.key_begin;
  for (std::int64_t r = 0; r < rows; r += Dot::tile_rows) {
    const int block = static_cast<int>(rows - r < Dot::tile_rows ? rows - r : Dot::tile_rows);
    const keys_of_block keys = block_keys(r, r + block, j0, j1);
    const std::int64_t kc = keys.kc, common = keys.common;
    if (kc <= 0) continue;  // no keys here for these rows: rescale is 1, nothing to add
    // Whole pairs of the keys every row sees, then the diagonal's pairs up to the block's last
    // key (at most a tile's rows of keys and a pair on each side).
    const std::int64_t common_units = common / 2, all_units = (kc + 1) / 2;
    const std::int64_t diagonal_units = all_units - common_units;
    constexpr std::int64_t max_diagonal = Dot::tile_rows / 2 + 2;
    MHA_EXPECTS(diagonal_units <= max_diagonal && T::nr <= 2 * Dot::tile_cols);
    float* o = s.accumulators + r * l.acc_cols;
    // The first tile starts O from the product, or from zeros where there is none (scratch
    // holds anything, NaN included, so it is stored over, never multiplied). Later tiles
    // rescale only the rows whose maximum grew (a factor of 1 changes no bit).
    if (!first || common_units == 0) {
      for (int rr = 0; rr < block; ++rr) {
        if (!first && s.rescale[r + rr] == 1.0f) continue;
        float* row = o + rr * l.acc_cols;
        for (std::int64_t c = 0; c < l.acc_cols; c += lanes) {
          const batch kept =
              first ? batch(0.0f) : s.rescale[r + rr] * batch::load_unaligned(row + c);
          kept.store_unaligned(row + c);
        }
      }
    }
    alignas(64) panel_unit finite[max_diagonal * 2 * Dot::tile_cols];
    for (std::int64_t p = 0; p < panels; ++p) {
      const panel_unit* panel = v + p * stride + j0 / 2 * T::nr;
      if (common_units > 0) {
        Dot::product(block, common_units, weights() + r * wu, wu, panel, T::nr, o + p * T::nr,
                     l.acc_cols, !first);
      }
      if (diagonal_units > 0) {
        const panel_unit* wedge = panel + common_units * T::nr;
        const bool all_finite = finite_copy<T>(wedge, diagonal_units, finite);
        // O holds the product above, or the zeros stored over it before.
        Dot::product(block, diagonal_units, weights() + r * wu + common_units, wu, finite, T::nr,
                     o + p * T::nr, l.acc_cols, true);
        if (!all_finite)
          non_finite_values<T>(r, block, j0, 2 * common_units, j1, panel, o + p * T::nr);
      }
    }
  }
}

template <class Arch, class Tiles, class Dot, class ScoreDot>
template <class T>
bool attention_block<Arch, Tiles, Dot, ScoreDot>::finite_copy(const panel_unit* from,
                                                              std::int64_t n,
                                                              panel_unit* to) noexcept {
  // A bf16 half is Inf or NaN when its exponent bits are all ones.
  using words = xsimd::batch<std::uint32_t, Arch>;
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

template <class Arch, class Tiles, class Dot, class ScoreDot>
template <class T>
void attention_block<Arch, Tiles, Dot, ScoreDot>::non_finite_values(
    std::int64_t r, int R, std::int64_t j0, std::int64_t from, std::int64_t j1,
    const panel_unit* panel, float* o) const noexcept {
  const auto half_of = [](std::uint32_t pair, std::int64_t k) {
    return static_cast<bf16>(k % 2 == 0 ? pair & 0xffffu : pair >> 16);
  };
  for (std::int64_t rr = r; rr < r + R; ++rr) {
    const bf16_pair* w = weights() + rr * weight_units();  // P as the tile product took it
    float* out = o + (rr - r) * l.acc_cols;
    for (std::int64_t k = from; k < row_keys(rr, j0, j1); ++k) {
      for (int c = 0; c < T::nr; ++c) {
        const bf16 half = half_of(panel[k / 2 * T::nr + c], k);
        if ((half & 0x7f80u) != 0x7f80u) continue;  // finite: in the tile product already
        out[c] += from_bf16(half_of(w[k / 2], k)) * from_bf16(half);
      }
    }
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
