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
    // Whole pairs of keys only, as in values().
    const std::int64_t common_units = common / 2, done = 2 * common_units;
    float* o = s.accumulators + r * l.acc_cols;
    // The first tile starts O from the product, or from zeros where there is none (scratch
    // holds anything, NaN included, so it is stored over, never multiplied).
    if (!first || common_units == 0) {
      for (int rr = 0; rr < block; ++rr) {
        float* row = o + rr * l.acc_cols;
        for (std::int64_t c = 0; c < l.acc_cols; c += lanes) {
          const batch kept =
              first ? batch(0.0f) : s.rescale[r + rr] * batch::load_unaligned(row + c);
          kept.store_unaligned(row + c);
        }
      }
    }
    for (std::int64_t p = 0; p < panels; ++p) {
      const panel_unit* panel = v + p * stride + j0 / 2 * T::nr;
      if (common_units > 0) {
        Dot::product(block, common_units, weights() + r * wu, wu, panel, T::nr, o + p * T::nr,
                     l.acc_cols, !first);
      }
      if (done < kc) diagonal<T>(r, block, j0, done, j1, panel, o + p * T::nr);
    }
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
