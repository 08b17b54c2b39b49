// Internal: the attention kernel's terms of an int8 cache's codes (docs/design.md §1.7), applied
// around the packed path's micro-kernels (micro/attention_packed.hpp). Per-ISA code: see
// micro/micro_kernel.hpp for how it is compiled.
//
// The cache holds K and V as codes c with k = offset + scale c per key. Each query row (of a bf16
// plan: rounded to bf16 first) is quantised to 16-bit integers q ~ qscale qi
// (attention_block::scale_queries), and its integer products with the code pairs of K^T are
// summed exactly (code_pair_dot); each score is then qscale scale_j (qi . c_j) + offset_j sum(q)
// (key_scores). P V (code_dot) is sum_j (p_j scale_j) c_j + sum_j p_j offset_j: fp32 weights
// times the values' scales (value_weights) meet widened codes, and each output row then gains
// the second sum (add_value_offsets).
#pragma once

#include <cstdint>

#include "kernels/micro/code_dot.hpp"
#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

template <class Arch>
struct code_scales {
  // The keys' scales, their offsets, the values' scales, their offsets: key_rows floats each,
  // one after the other (attention_layout::scales_offset()).
  const float* scales;
  std::int64_t key_rows;

  const float* key_scale() const noexcept { return scales; }
  const float* key_offset() const noexcept { return scales + key_rows; }
  const float* value_scale() const noexcept { return scales + 2 * key_rows; }
  const float* value_offset() const noexcept { return scales + 3 * key_rows; }

  // The R x nr tile of integer sums qi . c_j at `tile` (R rows of stride ld, keys [j, j + nr), as
  // code_pair_dot left them) into the scores q . k_j = qscale scale_j (qi . c_j) + offset_j
  // sum(q), for the rows' query_scales and query_sums.
  template <class T>
  void key_scores(const float* query_scales, const float* query_sums, int R, std::int64_t j,
                  float* tile, std::int64_t ld) const noexcept {
    using batch = typename T::batch;
    using words = xsimd::batch<std::int32_t, typename T::arch>;
    constexpr std::int64_t lanes = batch::size;
    for (int c = 0; c < T::nv; ++c) {
      const batch scale = batch::load_unaligned(key_scale() + j + c * lanes),
                  offset = batch::load_unaligned(key_offset() + j + c * lanes);
      for (int rr = 0; rr < R; ++rr) {
        float* x = tile + rr * ld + c * lanes;
        const batch sums =
            xsimd::to_float(words::load_unaligned(reinterpret_cast<const std::int32_t*>(x)));
        fused_fma(sums, batch(query_scales[rr]) * scale, batch(query_sums[rr]) * offset)
            .store_unaligned(x);
      }
    }
  }

  // A row's weights p of keys [j0, j0 + len) times their values' scales (what multiplies the
  // codes); returns sum_j p_j offset_j (what every element of the output row gains).
  float value_weights(float* p, std::int64_t j0, std::int64_t len) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = batch::size;
    batch sum(0.0f);
    std::int64_t j = 0;
    for (; j + lanes <= len; j += lanes) {
      const batch w = batch::load_unaligned(p + j);
      sum = fused_fma(w, batch::load_unaligned(value_offset() + j0 + j), sum);
      (w * batch::load_unaligned(value_scale() + j0 + j)).store_unaligned(p + j);
    }
    float total = xsimd::hadd(sum);
    for (; j < len; ++j) {
      total += p[j] * value_offset()[j0 + j];
      p[j] *= value_scale()[j0 + j];
    }
    return total;
  }

  // The R output rows of one V panel's nr columns at o (stride ld) gain their rows' sums of
  // value_weights (value_offsets, one per row).
  template <class T>
  static void add_value_offsets(const float* value_offsets, int R, float* o,
                                std::int64_t ld) noexcept {
    using batch = typename T::batch;
    constexpr std::int64_t lanes = batch::size;
    for (int rr = 0; rr < R; ++rr) {
      const batch gain(value_offsets[rr]);
      float* out = o + rr * ld;
      for (int c = 0; c < T::nv; ++c)
        (batch::load_unaligned(out + c * lanes) + gain).store_unaligned(out + c * lanes);
    }
  }
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
