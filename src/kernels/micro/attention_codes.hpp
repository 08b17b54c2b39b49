// Internal: the attention kernel's terms of an int8 cache's codes (docs/design.md §1.7), applied
// around the packed path's micro-kernels (micro/attention_packed.hpp). Per-ISA code: see
// micro/micro_kernel.hpp for how it is compiled.
//
// The cache holds K and V as codes c with k = offset + scale c per key (a scale and a zero per
// key in one word: offset = scale zero, core/int8.hpp). Each query row (of a bf16
// plan: rounded to bf16 first) is quantised to 16-bit integers q ~ qscale qi
// (attention_block::scale_queries), and its integer products with the code pairs of K^T are
// summed exactly (code_pair_dot); each score is then qscale scale_j (qi . c_j) + offset_j sum(q)
// (key_scores). P V (code_dot) is sum_j (p_j scale_j) c_j + sum_j p_j offset_j: fp32 weights
// times the values' scales (value_weights, from the key tile's scales and offsets unpacked once:
// unpack_values) meet widened codes, and each output row then gains the second sum
// (add_value_offsets).
#pragma once

#include <cstdint>

#include "core/int8.hpp"
#include "kernels/micro/code_dot.hpp"
#include "kernels/micro/micro_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

template <class Arch>
struct code_scales {
  // The keys' int8_row words, then the values': key_rows each (attention_layout::scales_offset()).
  const int8_row* rows;
  std::int64_t key_rows;

  const int8_row* key_rows_at(std::int64_t j) const noexcept { return rows + j; }
  const int8_row* value_rows_at(std::int64_t j) const noexcept { return rows + key_rows + j; }

  // The scales and offsets of a batch of rows' words: the low half's bf16 (shifted up to a
  // float's top bits), times the high half's int16 (shifted down with its sign): exact.
  template <class A>
  struct factors {
    xsimd::batch<float, A> scale, offset;
  };
  template <class A>
  static factors<A> unpack(const int8_row* at) noexcept {
    using words = xsimd::batch<std::int32_t, A>;
    const words w = words::load_unaligned(reinterpret_cast<const std::int32_t*>(at));
    const auto scale = xsimd::bitwise_cast<xsimd::batch<float, A>>(w << 16);
    return {scale, scale * xsimd::to_float(w >> 16)};
  }

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
      const factors<typename T::arch> key = unpack<typename T::arch>(key_rows_at(j + c * lanes));
      for (int rr = 0; rr < R; ++rr) {
        float* x = tile + rr * ld + c * lanes;
        const batch sums =
            xsimd::to_float(words::load_unaligned(reinterpret_cast<const std::int32_t*>(x)));
        fused_fma(sums, batch(query_scales[rr]) * key.scale, batch(query_sums[rr]) * key.offset)
            .store_unaligned(x);
      }
    }
  }

  // The values' scales and offsets of keys [j0, j1) into scale and offset from index 0, whole
  // batches (the words and the key tile's scratch have room for them): unpacked once a key tile,
  // for every row's value_weights.
  void unpack_values(std::int64_t j0, std::int64_t j1, float* scale, float* offset) const noexcept {
    constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
    for (std::int64_t j = 0; j < j1 - j0; j += lanes) {
      const factors<Arch> value = unpack<Arch>(value_rows_at(j0 + j));
      value.scale.store_unaligned(scale + j);
      value.offset.store_unaligned(offset + j);
    }
  }

  // A row's weights p of a key tile's first len keys times their values' scales (what multiplies
  // the codes), from unpack_values' scale and offset; returns sum_j p_j offset_j (what every
  // element of the output row gains).
  static float value_weights(float* p, const float* scale, const float* offset,
                             std::int64_t len) noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = batch::size;
    batch sum(0.0f);
    std::int64_t j = 0;
    for (; j + lanes <= len; j += lanes) {
      const batch w = batch::load_unaligned(p + j);
      sum = fused_fma(w, batch::load_unaligned(offset + j), sum);
      (w * batch::load_unaligned(scale + j)).store_unaligned(p + j);
    }
    float total = xsimd::hadd(sum);
    for (; j < len; ++j) {
      total += p[j] * offset[j];
      p[j] *= scale[j];
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
