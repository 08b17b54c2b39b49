// Internal: the attention kernel's terms of an int8 cache's codes (docs/design.md §1.7), applied
// around the packed path's micro-kernels (micro/attention_packed.hpp). Per-ISA code: see
// micro/micro_kernel.hpp for how it is compiled.
//
// The cache holds K and V as codes c with k = offset + scale c per key (a scale and a zero per
// key in one word: offset = scale zero, base/int8.hpp). Each query row (of a bf16
// plan: rounded to bf16 first) is quantised to 16-bit integers q ~ qscale qi
// (attention_block::scale_queries), and its integer products with the code pairs of K^T are
// summed exactly (code_pair_dot); each score is then qscale scale_j (qi . c_j) + offset_j sum(q)
// (key_scores). P V is sum_j (p_j scale_j) c_j + sum_j p_j offset_j: the weights times the
// values' scales (value_weights, made with the softmax's exponentials in one pass), quantised to
// 16-bit integers per chunk of keys, meet the code pairs of V in exact integer sums
// (code_pair_dot), each chunk's converted and scaled into O (add_chunk); each output row then
// gains the second sum (add_value_offsets).
//
// A k8v4 cache's values (base/value4.hpp) come in groups of value4_group elements of turned rows,
// each group's codes with a scale and an offset of their own: the weights are made per group
// (value_weights, the exponentials once for all groups), P V reads the 4-bit codes
// (nibble_panels) with each panel's group's weights, and each output row is turned back when it
// is stored (attention_block::store).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "base/int8.hpp"
#include "base/key4.hpp"
#include "base/value4.hpp"
#include "kernels/micro/code_dot.hpp"
#include "kernels/micro/micro_kernel.hpp"
#include "kernels/micro/softmax_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

template <class Arch>
struct code_scales {
  // The keys' words (key_words of them: int8_rows, one per key row; int4: its channel groups'
  // value4_rows), then the values': key_rows each, per group of the values (int8: one group of
  // int8_rows; k8v4, int4: value_groups() of value4_rows; attention_layout::scales_offset()).
  const int8_row* rows;
  std::int64_t key_rows, key_words;
  std::int64_t groups = 1;
  // The values are a k8v4 cache's 4-bit codes (value4_row words) rather than int8's.
  bool four_bit = false;

  // What a value word's zero counts: steps (int8_row), or sixteenths of one (value4_row).
  float zero_unit() const noexcept { return four_bit ? 0.0625f : 1.0f; }

  const int8_row* key_rows_at(std::int64_t j) const noexcept { return rows + j; }
  const int8_row* value_rows_at(std::int64_t group, std::int64_t j) const noexcept {
    return rows + key_words + key_rows * group + j;
  }

  // The scales and offsets of a batch of rows' words: the low half's bf16 (shifted up to a
  // float's top bits), times the high half's int16 (shifted down with its sign) in its unit (1 or
  // 1/16): exact.
  template <class A>
  struct factors {
    xsimd::batch<float, A> scale, offset;
  };
  template <class A>
  static factors<A> unpack(const int8_row* at, float zero_unit = 1.0f) noexcept {
    using words = xsimd::batch<std::int32_t, A>;
    const words w = words::load_unaligned(reinterpret_cast<const std::int32_t*>(at));
    const auto scale = xsimd::bitwise_cast<xsimd::batch<float, A>>(w << 16);
    return {scale, scale * (xsimd::to_float(w >> 16) * xsimd::batch<float, A>(zero_unit))};
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

  // Where one row's weights of a key tile go (value_weights): per group of the values, its
  // 16-bit integer pairs at codes + group * code_stride, its chunks' scales at chunk_scales +
  // group * scale_stride, and its offsets' sum at offsets[group].
  struct row_weights {
    query_pair* codes;
    std::int64_t code_stride;
    float* chunk_scales;
    std::int64_t scale_stride;
    float* offsets;
  };

  // One row's weights of a key tile (keys from j0), made and quantised in one pass, in
  // registers: the weights p_j = 2^(scale x_j - shift) of its first len scores x (exp2_sum's, the
  // same bits; len <= 0: none), times dropout's multipliers m_j where there are any (nullptr:
  // none), times their values' scales (unpacked as they are read, per group of the values),
  // w_j = p_j m_j scale_j, as code_pair_dot's pairs of 16-bit integers for the keys P V reads of
  // the row ([0, end)): per chunk of weight_chunk_keys keys w_j ~ s q_j, q_j = round(w_j / s) in
  // [0, weight_code_limit], s the chunk's largest w over the limit (one per chunk), keys from len
  // on 0, so that P V adds nothing for keys past the row's own, however far its block reads; and
  // each group's sum_j p_j m_j offset_j, what every element of its output group gains. No fp32
  // weight is stored: P V reads only the codes. An offsets' sum is NaN where a value row is read
  // as NaN (its offset NaN), whatever its codes and weight then are. Returns sum_j p_j,
  // undropped: the row's share of the softmax's denominator.
  float value_weights(const float* x, std::int64_t j0, std::int64_t len, std::int64_t end,
                      float shift, float scale, const float* multipliers,
                      const row_weights& to) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = batch::size, chunk = weight_chunk_keys;
    constexpr int count = static_cast<int>(chunk / lanes);
    static_assert(chunk % (2 * lanes) == 0, "a chunk of whole pairs of batches");
    const batch minus_shift(-shift), c(scale), zero(0.0f);
    // 4-bit values' P V reads whole word rows of 8 keys (nibble_panels): pairs of 4.
    const std::int64_t granule = four_bit ? 4 : 1;
    batch sum(0.0f);
    for (std::int64_t g = 0; g < groups; ++g) to.offsets[g] = 0.0f;
    // The chunk from key c0; Whole: all of its keys within len (no lane past it).
    const auto weigh = [&]<bool Whole>(std::integral_constant<bool, Whole>, std::int64_t c0) {
      batch kept[count];
#pragma GCC unroll 16
      for (int i = 0; i < count; ++i) {
        const std::int64_t j = c0 + i * lanes;
        kept[i] = zero;
        if (!Whole && j >= len) continue;
        const batch p = exp2_batch<Arch, false>(x, j, len, c, minus_shift);
        sum += p;  // in key order, as exp2_sum adds them
        kept[i] = multipliers != nullptr ? p * batch::load_unaligned(multipliers + j) : p;
        if (!Whole && j + lanes > len) {  // the lanes past len: no weight
          kept[i] =
              xsimd::select(lane_index<Arch>() < batch(static_cast<float>(len - j)), kept[i], zero);
        }
      }
      for (std::int64_t g = 0; g < groups; ++g) {
        const int8_row* words = value_rows_at(g, j0);
        batch w[count], largest(0.0f), offsets(0.0f);
#pragma GCC unroll 16
        for (int i = 0; i < count; ++i) {
          const std::int64_t j = c0 + i * lanes;
          w[i] = zero;
          if (!Whole && j >= len) continue;
          factors<Arch> value = unpack<Arch>(words + j, zero_unit());
          if (!Whole && j + lanes > len) {  // the lanes past len: no offset (a NaN row's too)
            const auto inside = lane_index<Arch>() < batch(static_cast<float>(len - j));
            value = {xsimd::select(inside, value.scale, zero),
                     xsimd::select(inside, value.offset, zero)};
          }
          offsets = fused_fma(kept[i], value.offset, offsets);
          w[i] = kept[i] * value.scale;
          largest = xsimd::max(largest, w[i]);  // a NaN weight is passed over (its offset is NaN)
        }
        to.offsets[g] += xsimd::hadd(offsets);
        quantize_chunk(w, largest, pairs(end) - c0 / 2, granule,
                       to.codes + g * to.code_stride + c0 / 2,
                       to.chunk_scales + g * to.scale_stride + c0 / weight_chunk_keys);
      }
    };
    std::int64_t c0 = 0;
    for (; c0 + chunk <= len && c0 + chunk <= end; c0 += chunk) weigh(std::true_type{}, c0);
    for (; c0 < end; c0 += chunk) weigh(std::false_type{}, c0);
    return xsimd::hadd(sum);
  }

  // One chunk of value_weights: its weights w (largest: their lanes' largest, a NaN passed over)
  // as 16-bit integers, the first `words` pairs of them (rounded up to a multiple of granule, at
  // most a chunk's) into codes, and the chunk's scale.
  static void quantize_chunk(
      const xsimd::batch<float, Arch> (&w)[weight_chunk_keys / xsimd::batch<float, Arch>::size],
      xsimd::batch<float, Arch> largest, std::int64_t words, std::int64_t granule,
      query_pair* codes, float* chunk_scale) noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = batch::size, chunk = weight_chunk_keys;
    constexpr int count = static_cast<int>(chunk / lanes);
    const float most = largest_lane<Arch>(largest);
    constexpr float limit = weight_code_limit;
    // w / s = w limit / most. limit / most overflows below most = 2^-113, and a chunk's largest
    // weight is that small whenever its values are (w = p scale, the values' scale about
    // max|v| / 127: values of 2^-88 and below), so such a chunk is lifted by 2^64 first: exact
    // (a power of two, every w then normal or zero), so its codes are the codes its weights
    // would have without the overflow. Every other chunk's lift is 1 (the same bits as without
    // it); only s = most / limit, applied once the chunk's sums are made, is of the true scale.
    // A chunk without weight (most 0, or NaN: a NaN weight is passed over) adds nothing.
    const bool tiny = most < 0x1p-64f;
    const float lift = tiny ? 0x1p64f : 1.0f;
    const float inverse = most > 0.0f ? limit / (most * lift) : 0.0f;
    *chunk_scale = inverse > 0.0f ? most * (1.0f / limit) : 0.0f;
    // Rounded to the nearest integer, ties to even (base/int8.hpp's round_ties_even: the
    // conversion's, in the default rounding mode), at most the limit (w is at most the chunk's
    // largest); a NaN weight's code is what the conversion makes of it (its row's offsets' sum is
    // NaN: value_weights).
    const auto code = [&](batch v) {
      return xsimd::nearbyint_as_int(tiny ? v * batch(lift) * batch(inverse) : v * batch(inverse));
    };
    words = (words + granule - 1) & -granule;  // granule: a power of two
    query_pair pairs_out[chunk / 2];
    query_pair* out = words >= chunk / 2 ? codes : pairs_out;
    for (int i = 0; i < count; i += 2) {
      narrow_pairs<Arch>(code(w[i]), code(w[i + 1])).store_unaligned(out + i * lanes / 2);
    }
    if (out != codes) std::copy_n(pairs_out, words > 0 ? words : 0, codes);
  }

  // O (R rows of NV batches at o, row stride ldo) = start (a micro-kernel's start policy over
  // o: start_bias{nullptr}, start_scaled or start_sum) + each row's chunk scale (chunk_scales,
  // row stride scales_stride) times the chunk's integer sums (code_pair_dot's: R rows of NV
  // batches at sums, row stride lds).
  template <class T, int R, int NV, class Start>
  static void add_chunk(const float* sums, std::int64_t lds, const float* chunk_scales,
                        std::int64_t scales_stride, float* o, std::int64_t ldo,
                        const Start& start) noexcept {
    using batch = typename T::batch;
    using words = xsimd::batch<std::int32_t, typename T::arch>;
    constexpr int lanes = static_cast<int>(batch::size);
    batch acc[R][NV];
    start(acc);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const batch s(chunk_scales[r * scales_stride]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        const words integers = words::load_unaligned(
            reinterpret_cast<const std::int32_t*>(sums + r * lds + v * lanes));
        acc[r][v] = fused_fma(s, xsimd::to_float(integers), acc[r][v]);
      }
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v].store_unaligned(o + r * ldo + v * lanes);
    }
  }

  // The R output rows of one V panel's nr columns at o (stride ld) gain their rows' sums of
  // value_weights (value_offsets, one per row, `stride` apart: the panel's group's).
  template <class T>
  static void add_value_offsets(const float* value_offsets, std::int64_t stride, int R, float* o,
                                std::int64_t ld) noexcept {
    using batch = typename T::batch;
    constexpr std::int64_t lanes = batch::size;
    for (int rr = 0; rr < R; ++rr) {
      const batch gain(value_offsets[rr * stride]);
      float* out = o + rr * ld;
      for (int c = 0; c < T::nv; ++c)
        (batch::load_unaligned(out + c * lanes) + gain).store_unaligned(out + c * lanes);
    }
  }
};

// Query row q (head_dim floats: the block's scaled queries) against one channel group of an int4
// cache's keys (base/key4.hpp; channel d's value4_row at words[d]): x = q s (times the channels'
// scales) as 16-bit integers x ~ scale xi, |xi| <= key4_query_limit, in query_pairs for
// nibble_panels (4 key4_words(head_dim) of them, 0 past head_dim), the scale returned (0 for a row
// of zeros; NaN where x holds a NaN or an Inf, so that the group's scores are NaN, as the float
// product would make them); *offsets = sum_d q_d o_d (o: the channels' offsets). A key's score is
// then scale (xi . c) + *offsets.
template <class Arch>
float key4_query(const float* q, const value4_row* words, std::int64_t head_dim, query_pair* out,
                 float* offsets) noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = batch::size;
  constexpr float most_finite = std::numeric_limits<float>::max();
  const auto* rows = reinterpret_cast<const int8_row*>(words);  // the same 32-bit word
  batch largest(0.0f), sum(0.0f);
  auto bad = batch(0.0f) != batch(0.0f);
  std::int64_t d = 0;
  for (; d + lanes <= head_dim; d += lanes) {
    const auto channel = code_scales<Arch>::template unpack<Arch>(rows + d, 0.0625f);
    const batch x = batch::load_unaligned(q + d), y = x * channel.scale;
    bad = bad | (xsimd::abs(y) > batch(most_finite)) | (y != y);  // Inf and NaN
    largest = xsimd::max(largest, xsimd::abs(y));
    sum = fused_fma(x, channel.offset, sum);
  }
  float most = largest_lane<Arch>(largest), beta = xsimd::hadd(sum);
  bool finite = !xsimd::any(bad);
  for (std::int64_t e = d; e < head_dim; ++e) {
    const float y = q[e] * words[e].scale();
    finite = finite && std::fabs(y) <= most_finite;
    most = std::fabs(y) > most ? std::fabs(y) : most;
    beta += q[e] * words[e].offset();
  }
  *offsets = beta;
  const std::int64_t units = 4 * key4_words(head_dim);
  if (!finite || !(most > 0.0f)) {
    std::fill(out, out + units, query_pair{0});
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float limit = static_cast<float>(key4_query_limit(head_dim)), inverse = limit / most;
  // Rounded to the nearest integer, ties to even (round_ties_even), within the limit.
  constexpr float shift = 12582912.0f;  // 1.5 * 2^23
  const auto code = [&](std::int64_t at) {
    const auto channel = code_scales<Arch>::template unpack<Arch>(rows + at, 0.0625f);
    const batch r =
        (batch::load_unaligned(q + at) * channel.scale * batch(inverse) + batch(shift)) -
        batch(shift);
    return xsimd::to_int(xsimd::min(xsimd::max(r, batch(-limit)), batch(limit)));
  };
  std::int64_t e = 0;
  for (; e + 2 * lanes <= head_dim; e += 2 * lanes)
    narrow_pairs<Arch>(code(e), code(e + lanes)).store_unaligned(out + e / 2);
  const auto scalar = [&](std::int64_t at) -> std::uint32_t {
    if (at >= head_dim) return 0;
    const float r = round_ties_even(q[at] * words[at].scale() * inverse);
    const float c = r > limit ? limit : r < -limit ? -limit : r;
    return static_cast<std::uint16_t>(static_cast<std::int16_t>(c));
  };
  for (; e < 2 * units; e += 2)
    out[e / 2] = static_cast<query_pair>(scalar(e) | scalar(e + 1) << 16);
  return most / limit;
}

// The packed path's scores of keys [j0, j1) over an int4 cache (base/key4.hpp; Path:
// packed_attention): per channel group of key4_group
// keys (a key tile's groups are whole: its key step), each row's queries times the group's
// channel scales as 16-bit integers (key4_query), their integer sums with the keys' 4-bit codes
// (nibble_panels, K^T's word rows as V's are read for P V), each score then scale (sum) +
// offsets; the keys of the unfilled group, not yet coded, scored exact from the head's recent
// keys. Task keys are slots; key j stands at position base + j (base: a ring piece's first).
template <class T, class Path>
void key4_scores(const Path& path, std::int64_t j0, std::int64_t j1) noexcept {
  using Arch = typename Path::arch;
  const auto& [args, layout, task, rows, scratch] =
      std::tie(path.args, path.layout, path.task, path.rows, path.scratch);
  using batch = typename T::batch;
  using ints = xsimd::batch<std::int32_t, typename T::arch>;
  constexpr std::int64_t lanes = batch::size;
  const std::int64_t hd = args.head_dim, words = key4_words(hd), units = layout.query_units();
  const std::int64_t last = path.rows_end(0, rows), end = last < j1 ? last : j1;
  const std::int64_t base = args.cache->lengths[task.b] - task.past;
  const std::int64_t coded = std::min(end, key4_coded_end(args.keys(task.b)) - base);
  const auto* panels = reinterpret_cast<const std::uint32_t*>(path.kt);
  const auto* channel_words = reinterpret_cast<const value4_row*>(path.scales);
  const std::int64_t ld = layout.score_cols, panel_words = words * T::nr;
  for (std::int64_t g0 = j0; g0 < coded; g0 += key4_group) {
    const value4_row* group = channel_words + g0 / key4_group * hd;
    for (std::int64_t r = 0; r < rows; ++r) {
      scratch.query_scales[r] =
          key4_query<Arch>(scratch.queries + r * hd, group, hd, scratch.query_codes + r * units,
                           scratch.query_sums + r);
    }
    const std::int64_t cols = std::min(g0 + key4_group, end) - g0;
    const std::int64_t group_panels = (cols + T::nr - 1) / T::nr;
    float* tile = scratch.scores + (g0 - j0);
    for_row_blocks<T::mr>(0, rows, [&](std::int64_t r, auto R) {
      constexpr int block_rows = decltype(R)::value;
      // One row (a decode step's) takes one panel at a time, so that K^T's codes are read as
      // one stream (as code_pair_row does: panels side by side are streams too short for the
      // hardware prefetcher); nibble_panels' chains then hide the latency.
      constexpr int side_by_side = block_rows == 1 ? 1 : panels_for<T, block_rows>;
      for_panel_groups<side_by_side>(
          0, group_panels, [&]<int P>(std::integral_constant<int, P>, std::int64_t p) {
            const query_pair* a[P];
            for (int q = 0; q < P; ++q) a[q] = scratch.query_codes + r * units;
            nibble_panels<T, block_rows, P>(words, a, units,
                                            panels + (g0 / T::nr + p) * panel_words, panel_words,
                                            tile + r * ld + p * T::nr, ld);
          });
    });
    // The sums (bits in floats) into scores, whole batches of the panels written.
    for (std::int64_t r = 0; r < rows; ++r) {
      const batch scale(scratch.query_scales[r]), offset(scratch.query_sums[r]);
      float* x = tile + r * ld;
      for (std::int64_t c = 0; c < group_panels * T::nr; c += lanes) {
        const batch sums =
            xsimd::to_float(ints::load_unaligned(reinterpret_cast<const std::int32_t*>(x + c)));
        fused_fma(sums, scale, offset).store_unaligned(x + c);
      }
    }
  }
  const key4_recent_rows recent = key4_recent_of(
      const_cast<std::byte*>(static_cast<const std::byte*>(task.head)), args.cache->head_bytes, hd);
  for (std::int64_t j = std::max(j0, coded); j < end; ++j) {
    const float* key = recent.row(base + j, hd);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* q = scratch.queries + r * hd;
      batch acc(0.0f);
      std::int64_t d = 0;
      for (; d + lanes <= hd; d += lanes)
        acc = fused_fma(batch::load_unaligned(q + d), batch::load_unaligned(key + d), acc);
      float score = xsimd::hadd(acc);
      for (; d < hd; ++d) score = std::fma(q[d], key[d], score);
      scratch.scores[r * ld + (j - j0)] = score;
    }
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
