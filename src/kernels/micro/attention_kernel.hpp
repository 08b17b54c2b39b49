// Internal: the per-ISA attention kernel (isa_kernels::attention_rows): one block of query rows
// over key tiles with online softmax, for fp32, bf16 pairs and int8 codes. Its softmax pieces are
// in micro/softmax_kernel.hpp, its P V on tiles in micro/attention_tiles.hpp, its narrow-head
// path in micro/attention_narrow.hpp. Per-ISA code: see micro/micro_kernel.hpp for how it is
// compiled.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/bf16.hpp"
#include "core/dropout.hpp"
#include "kernels/attention.hpp"
#include "kernels/micro/code_dot.hpp"
#include "kernels/micro/micro_kernel.hpp"
#include "kernels/micro/softmax_kernel.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// A Dot whose products of bf16 pairs also come as tiles of up to Dot::tile_rows rows over panels
// of a multiple of Dot::tile_cols columns (AMX: micro/kernels_amx.cpp): Dot::product(rows, k, a,
// lda, b, nr, c, ldc, accumulate) is C (rows, nr) = [C +] A (rows, k units) B (a panel's k rows).
template <class Dot>
concept tile_products = requires {
  Dot::tile_rows;
};

// f(r, R) for the row blocks of rows [0, rows): blocks of R rows (a micro-kernel's), then the
// remainder in blocks of the smaller power-of-two row counts (the edge micro-kernels, as the
// GEMM's panel_rows), so no padding row is computed: a decode step's one query row costs one
// row. R is passed as std::integral_constant.
template <int R, class F>
void for_row_blocks(std::int64_t r, std::int64_t rows, F&& f) noexcept {
  for (; r + R <= rows; r += R) f(r, std::integral_constant<int, R>{});
  if constexpr (smaller_rows < R >> 0) {
    if (r < rows) for_row_blocks<smaller_rows<R>>(r, rows, f);
  }
}

// f(std::integral_constant<int, P>{}, p) for the panel groups of panels [p, panels): groups of
// G panels (panels_for's count), then of G / 2, ..., 1 for the panels left, each group as wide as
// what is left allows (a decode row over head_dim 64 in panels of 32 takes its two panels
// together, not one at a time with half the FMA chains). G is a power of two.
template <int G, class F>
void for_panel_groups(std::int64_t p, std::int64_t panels, F&& f) noexcept {
  for (; p + G <= panels; p += G) f(std::integral_constant<int, G>{}, p);
  if constexpr (G > 1) for_panel_groups<G / 2>(p, panels, f);
}

// f(std::integral_constant<int, n>) for the n in [1, N] equal to runtime n.
template <int N, class F>
void with_dimension(std::int64_t n, F&& f) noexcept {
  if constexpr (N > 0) {
    if (n == N) {
      f(std::integral_constant<int, N>{});
    } else {
      with_dimension<N - 1>(n, f);
    }
  }
}

// The attention of one query-row block over one range of keys, fused (FlashAttention's online
// softmax): keys are taken one key tile at a time, so scratch holds one tile of scores, never a
// whole row. Scores are in base 2 (Q scaled by scale * log2(e), so exp(s) = 2^(s log2 e)). Per
// tile:
//   S = (c Q) K^T[:, tile]              micro-tiles entirely above the diagonal skipped
//   S += log2(e) mask                   with a mask only (mha::attention: mask_scores; the
//                                       masked scores are kept halved, below)
//   m' = max(m, rowmax S)               causal mask as the row length within the tile
//   P = 2^(S - m'), l = l 2^(m - m') + rowsum P,   then P *= dropout (l stays undropped)
//   O = O 2^(m - m') + P V[tile, :]     the rescale is the micro-kernel's start (start_scaled)
// and at the end out = O / l (or O, m and l as a split's partial result). With a mask, S and m
// are kept at half their base-2 value (score_mask::exponent_scale: every finite mask value then
// has a finite log2(e) multiple, as SDPA adds a finfo.min or a +3e38 bias without overflow) and
// each exponent is 2 (S - m') (the doubling exact, so the weights are the same bits as unhalved
// wherever those did not overflow). Where P V runs on
// tiles (AMX, no dropout), P goes straight to bf16 pairs as it is made, its exponential to the
// accuracy a bf16 weight needs (softmax_kernel.hpp's exp2_sum_pairs), and O is rescaled only in
// the rows whose maximum grew. A block's rows are
// the query heads of one K/V head stacked position-major (attention_layout): row r is query
// head g * group + r % group at position row_begin + r / group, so the positions, and the
// causal limits, never decrease with r. Tiles past the block's last row are never visited. With one
// key tile (layout.key_tile >= keys) this is the unfused softmax(S) V of whole rows. Each row's
// sums run in key order, one fma at a time, so a row's result does not depend on the rows it is
// computed with: an incremental call's row equals the full forward's bit for bit.
//
// Dot sets the operands' unit (micro_kernel.hpp): fp32 (fma_dot) or, for a bf16 module, bf16
// pairs (docs/design.md §1.5): the queries, the packed K and V and the weights P are rounded
// to bf16 and the products summed in fp32; the scale is then applied to the scores in the
// softmax (Q K^T of rounded Q), where fp32 folds it into the queries. ScoreDot, Q K^T's, is
// Dot but for an int8 cache (§1.7, micro/code_dot.hpp), which holds K and V as codes c with
// k = offset + scale c per key: each query row (of a bf16 plan: rounded to bf16 first) is
// quantised to 16-bit integers q ~ qscale qi, its integer products with the code pairs of K^T
// summed exactly (code_pair_dot), each score is then qscale scale_j (qi . c_j) + offset_j sum(q);
// P V (code_dot) is sum_j (p_j scale_j) c_j + sum_j p_j offset_j, fp32 weights meeting widened
// codes.
template <class Arch, class Tiles, class Dot, class ScoreDot = Dot>
struct attention_block {
  using unit = typename Dot::unit;
  using panel_unit = b_unit_t<Dot>;
  using key_unit = b_unit_t<ScoreDot>;
  static constexpr bool pairs_of_bf16 = std::is_same_v<unit, bf16_pair>;
  static constexpr bool codes = std::is_same_v<panel_unit, std::uint8_t>;
  // K^T's rows are pairs of dimensions: bf16 pairs, or pairs of codes.
  static constexpr bool key_pairs = pairs_of_bf16 || codes;
  // The AMX build's bf16 weights come from exp2_for_bf16 on every path (tiles or vectors), so
  // that a decode step's single row, on vectors, equals the full forward's row, on tiles.
  static constexpr bool bf16_weights = tile_products<Dot> && pairs_of_bf16;

  const attention_args& a;
  const attention_layout& l;
  const attention_task& t;
  const key_unit* kt;   // packed K^T: head_dim x l.kv_rows in panels of l.scores.nr
  const panel_unit* v;  // packed V: l.kv_rows x head_dim in panels of l.values.nr
  std::int64_t rows;    // stacked rows: positions * l.group
  attention_scratch s;
  // int8: the keys' scales, their offsets, the values' scales, their offsets (l.key_rows()
  // floats each, one after the other); nullptr otherwise.
  const float* scales;

  const float* key_scale() const noexcept { return scales; }
  const float* key_offset() const noexcept { return scales + l.key_rows(); }
  const float* value_scale() const noexcept { return scales + 2 * l.key_rows(); }
  const float* value_offset() const noexcept { return scales + 3 * l.key_rows(); }

  // Units of a K^T panel row (head_dim elements) and of a V panel column (kv_rows keys).
  std::int64_t dim_units() const noexcept { return key_pairs ? pairs(a.head_dim) : a.head_dim; }
  std::int64_t value_rows() const noexcept { return pairs_of_bf16 ? pairs(l.kv_rows) : l.kv_rows; }
  // Units of P per score row.
  std::int64_t weight_units() const noexcept {
    return pairs_of_bf16 ? pairs(l.score_cols) : l.score_cols;
  }
  const typename ScoreDot::unit* queries() const noexcept {
    if constexpr (pairs_of_bf16) {
      return s.query_pairs;
    } else if constexpr (codes) {
      return s.query_codes;
    } else {
      return s.queries;
    }
  }
  const unit* weights() const noexcept {
    if constexpr (pairs_of_bf16) {
      return s.weight_pairs;
    } else {
      return s.scores;
    }
  }
  // The factor between a score in s.scores and its base-2 exponent: the queries carry it in
  // fp32, and mask_scores applies it to bf16's raw scores with a mask.
  float score_scale() const noexcept {
    return pairs_of_bf16 && !a.mask.active() ? a.scale * 1.44269504088896341f : 1.0f;
  }

  // Position (relative to past) and query head of stacked row r.
  std::int64_t pos(std::int64_t r) const noexcept { return t.row_begin + r / l.group; }
  std::int64_t head(std::int64_t r) const noexcept { return t.g * l.group + r % l.group; }

  // One past the last key that any of the block's rows [r0, r1) attends to (query position i
  // stands at absolute position t.past + i), within the task's keys.
  std::int64_t rows_end(std::int64_t r0, std::int64_t r1) const noexcept {
    (void)r0;  // causal rows see a prefix of the keys: the block's last row sees the most
    const std::int64_t own = t.past + pos(r1 - 1) + 1;
    return a.causal && own < t.key_end ? own : t.key_end;
  }

  // The keys of [j0, j1) that P V takes for the row block [r0, r1), counted from j0: kc, up to
  // the last key any of its rows attends to (<= 0: none), and common, those every row of the
  // block sees (causal: the first row's keys, possibly none; otherwise kc).
  struct keys_of_block {
    std::int64_t kc, common;
  };
  keys_of_block block_keys(std::int64_t r0, std::int64_t r1, std::int64_t j0,
                           std::int64_t j1) const noexcept {
    const std::int64_t end = rows_end(r0, r1), kc = (end < j1 ? end : j1) - j0;
    if (!a.causal) return {kc, kc};
    const std::int64_t own = t.past + pos(r0) + 1, first_row_end = own < j1 ? own : j1;
    return {kc, first_row_end - j0 < 0 ? 0 : first_row_end - j0};
  }

  // Keys of [j0, j1) that row r attends to: [j0, j0 + result), possibly none.
  std::int64_t row_keys(std::int64_t r, std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t own = t.past + pos(r) + 1;
    const std::int64_t end = a.causal && own < j1 ? own : j1;
    return end - j0;
  }

  // The block's queries in the unit: fp32 times the scale in base 2, or bf16 pairs as they are;
  // int8: of a bf16 plan rounded to bf16 first, then as 16-bit integer pairs with a scale, and
  // each row's sum.
  void scale_queries() const noexcept {
    const std::int64_t hd = a.head_dim;
    // log2(e), halved with a mask (score_mask::exponent_scale; exact: a power of two).
    const float c = a.scale * 1.44269504088896341f * (a.mask.active() ? 0.5f : 1.0f);
    if constexpr (pairs_of_bf16) {
      if (a.bf16_operands()) {
        for (std::int64_t r = 0; r < rows; ++r) {
          const bf16* row = a.q16.row(t.b, head(r), pos(r));
          // The pairs as they lie in the row (the odd one past an odd head_dim zero), and for
          // a direct block the floats too (its dimensions past whole registers).
          bf16_pair* to = s.query_pairs + r * pairs(hd);
          for (std::int64_t i = 0; i < pairs(hd); ++i) {
            const bf16 odd = 2 * i + 1 < hd ? row[2 * i + 1] : bf16{0};
            to[i] = row[2 * i] | static_cast<bf16_pair>(odd) << 16;
          }
          if (l.direct) {
            for (std::int64_t d = 0; d < hd; ++d) s.queries[r * hd + d] = from_bf16(row[d]);
          }
        }
        return;
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = a.q.row(t.b, head(r), pos(r));
      if constexpr (pairs_of_bf16) {
        Dot::to_pairs(row, hd, s.query_pairs + r * pairs(hd));
      } else if constexpr (codes) {
        float sum = 0.0f;
        for (std::int64_t d = 0; d < hd; ++d) {
          s.queries[r * hd + d] = c * (a.bf16 ? round_bf16(row[d]) : row[d]);
          sum += s.queries[r * hd + d];
        }
        s.query_sums[r] = sum;
        s.query_scales[r] = quantize_query(s.queries + r * hd, hd, s.query_codes + r * pairs(hd));
      } else {
        for (std::int64_t d = 0; d < hd; ++d) s.queries[r * hd + d] = c * row[d];
      }
    }
  }

  // int8: the R x nr tile of the integer sums qi . c_j at `tile` (rows [r, r + R), keys
  // [j, j + nr), as code_pair_dot left them) into the scores
  // q . k_j = qscale scale_j (qi . c_j) + offset_j sum(q).
  template <class T>
  void key_scores(std::int64_t r, int R, std::int64_t j, float* tile) const noexcept {
    using batch = typename T::batch;
    using words = xsimd::batch<std::int32_t, typename T::arch>;
    constexpr std::int64_t lanes = batch::size;
    for (int c = 0; c < T::nv; ++c) {
      const batch scale = batch::load_unaligned(key_scale() + j + c * lanes),
                  offset = batch::load_unaligned(key_offset() + j + c * lanes);
      for (int rr = 0; rr < R; ++rr) {
        float* x = tile + rr * l.score_cols + c * lanes;
        const batch sums =
            xsimd::to_float(words::load_unaligned(reinterpret_cast<const std::int32_t*>(x)));
        fused_fma(sums, batch(s.query_scales[r + rr]) * scale, batch(s.query_sums[r + rr]) * offset)
            .store_unaligned(x);
      }
    }
  }

  // int8: row p's weights of keys [j0, j0 + len) times their values' scales (what multiplies
  // the codes); returns sum_j p_j offset_j (what every element of the output row gains).
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

  // Scores of keys [j0, j1) (j0 a multiple of T::nr) into columns [0, j1 - j0) of s.scores.
  // Panels outer, micro-blocks inner: a (head_dim, nr) panel of K^T stays in L1. A row block
  // too short to hide the FMA latency on its own (a decode step's one row) takes
  // panels_for<T, R> panels at once (for_panel_groups); an int8 cache's one row instead takes one
  // panel at a time over several integer accumulators (code_pair_row), so that K^T's codes are one
  // stream.
  template <class T>
  void scores(T, std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t last = rows_end(0, rows);
    const std::int64_t panels = ((last < j1 ? last : j1) - j0 + T::nr - 1) / T::nr;
    if constexpr (tile_products<Dot>) {
      if (on_tiles(T::nr)) {
        // Blocks of two row tiles where head_dim is whole tile steps (each tile loaded serves two
        // products), else of one; each over its panels up to its own diagonal.
        const std::int64_t du = dim_units();
        const int most = du % Dot::tile_pairs == 0 ? Dot::pair_rows : Dot::tile_rows;
        for (std::int64_t r = 0; r < rows;) {
          const int block = static_cast<int>(rows - r >= most            ? most
                                             : rows - r < Dot::tile_rows ? rows - r
                                                                         : Dot::tile_rows);
          const std::int64_t end = rows_end(r, r + block);
          for (std::int64_t p = 0; p < panels && j0 + p * T::nr < end; ++p) {
            Dot::product(block, du, queries() + r * du, du, kt + j0 * du + p * du * T::nr, T::nr,
                         s.scores + r * l.score_cols + p * T::nr, l.score_cols, false);
          }
          r += block;
        }
        return;
      }
    }
    if constexpr (codes) {
      if (rows == 1) {  // a decode step's one row: K^T read as one stream (code_pair_row)
        const std::int64_t du = dim_units();
        for (std::int64_t p = 0; p < panels; ++p) {
          float* tile = s.scores + p * T::nr;
          code_pair_row<T>(du, queries(), kt + j0 * du + p * du * T::nr, tile);
          key_scores<T>(0, 1, j0 + p * T::nr, tile);
        }
        return;
      }
    }
    if (rows * T::nv < 8) {
      for_row_blocks<T::mr>(0, rows, [&](std::int64_t r, auto R) {
        for_panel_groups<panels_for<T, R>>(0, panels, [&](auto group, std::int64_t p) {
          score_panels<T, R, decltype(group)::value>(r, j0, p);
        });
      });
      return;
    }
    for (std::int64_t p = 0; p < panels; ++p) {
      for_row_blocks<T::mr>(0, rows, [&](std::int64_t r, auto R) {
        if (j0 + p * T::nr >= rows_end(r, r + R)) return;  // above the diagonal
        score_panels<T, R, 1>(r, j0, p);
      });
    }
  }

  // The scores of rows [r, r + R) and the keys of panels [p, p + P) from key j0.
  template <class T, int R, int P>
  void score_panels(std::int64_t r, std::int64_t j0, std::int64_t p) const noexcept {
    const std::int64_t du = dim_units();
    float* tile = s.scores + r * l.score_cols + p * T::nr;
    // Panel j0 / nr + p, each du * nr units.
    panels_kernel<T, R, P, ScoreDot>(du, queries() + r * du, du, kt + j0 * du + p * du * T::nr,
                                     du * T::nr, tile, l.score_cols, start_bias<T>{nullptr});
    if constexpr (codes) {
      for (int q = 0; q < P; ++q) key_scores<T>(r, R, j0 + (p + q) * T::nr, tile + q * T::nr);
    }
  }

  // With a mask (mha::attention): each row's scores of keys [j0, j1), up to its own keys, gain
  // the mask's values in base 2 (boolean: false sets -inf), both halved (exactly: a power of
  // two; score_mask::exponent_scale: fp32's queries carry the half); bf16's raw scores take
  // their scale first, so that both terms meet in base 2 (the softmax then reads them at
  // scale 1).
  void mask_scores(std::int64_t j0, std::int64_t j1) const noexcept {
    constexpr float half_log2e = 0.5f * 1.44269504088896341f;
    const float raw = pairs_of_bf16 ? 0.5f * a.scale * 1.44269504088896341f : 1.0f;
    const score_mask& m = a.mask;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      float* p = s.scores + r * l.score_cols;
      const std::int64_t at = m.offset(t.b, head(r), pos(r)) + j0;
      if (m.boolean) {
        const auto* keep = static_cast<const unsigned char*>(m.data) + at;
        for (std::int64_t j = 0; j < len; ++j)
          p[j] = keep[j] ? p[j] * raw : -std::numeric_limits<float>::infinity();
      } else {
        const float* add = static_cast<const float*>(m.data) + at;
        for (std::int64_t j = 0; j < len; ++j) p[j] = std::fma(add[j], half_log2e, p[j] * raw);
      }
    }
  }

  // The shift and scale of a row's weights 2^(scale x - shift) (exp2_sum) at the row's maximum
  // `max` (in the scores' units). With a mask, the halved scores' exponents 2 (x - max) are
  // fma(x, 2, -2 max), the same bits (the doubling is exact) unless 2 max overflows (a finite
  // mask value beyond float32's half range at the maximum): then the row's scores are made
  // their exponents first, the shift before the doubling, and the weights taken at scale 1.
  std::pair<float, float> exponent_of(float* p, std::int64_t n, float max) const noexcept {
    if (!a.mask.active()) return {max, score_scale()};
    if (std::fabs(max) <= 0.5f * std::numeric_limits<float>::max()) return {2.0f * max, 2.0f};
    for (std::int64_t j = 0; j < n; ++j) p[j] = 2.0f * (p[j] - max);
    return {0.0f, 1.0f};
  }

  // The online-softmax step over keys [j0, j1): scores become weights P, the running max and
  // sum move on, s.rescale gets 2^(m - m') per row. Each row's weights are zeroed past its own
  // keys up to what P V reads for any row block it can be in (at most values.mr rows from it, or
  // a tile's rows where P V runs on tiles). With a mask, a row whose keys so far are all at
  // -inf has the running max -inf, weights 0 and sum 0 (its max moves nothing until a key counts).
  // P V on tiles without dropout reads only the pairs: there the weights are made as pairs
  // (exp2_sum_pairs) and no fp32 weight is stored.
  void softmax(std::int64_t j0, std::int64_t j1) const noexcept {
    constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
    constexpr float minus_inf = -std::numeric_limits<float>::infinity();
    const bool first = j0 == t.key_begin, masked = a.mask.active();
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      float shift = 0.0f;  // m - m' (no change for a row without keys here)
      if (len > 0) {
        const float tile_max = score_scale() * row_max<Arch>(s.scores + r * l.score_cols, len);
        const float m = first || tile_max > s.row_max[r] ? tile_max : s.row_max[r];
        shift = first || (masked && m == minus_inf) ? 0.0f : s.row_max[r] - m;
        s.row_max[r] = m;
      }
      s.rescale[r] = masked ? 2.0f * shift : shift;  // halved scores: 2 (m - m')
    }
    if (!first) exp2_sum<Arch>(s.rescale, rows, 0.0f, 1.0f);  // 2^(m - m'), vectorised over rows
    const std::int64_t block_rows = value_block_rows();
    // P V on tiles reads only the pairs: without dropout the weights go to them as they are made.
    const bool weights_as_pairs =
        bf16_weights && on_tiles(l.values.nr) && !a.dropout.active() && !l.direct;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      const std::int64_t block_end = rows_end(r, r + block_rows < rows ? r + block_rows : rows);
      const std::int64_t end = (block_end < j1 ? block_end : j1) - j0;
      float* p = s.scores + r * l.score_cols;
      if constexpr (bf16_weights) {
        if (weights_as_pairs) {
          const float max = len <= 0 || (masked && s.row_max[r] == minus_inf) ? 0.0f : s.row_max[r];
          const auto [shift, scale] = exponent_of(p, len > 0 ? len : 0, max);
          const float sum = exp2_sum_pairs<Arch, Dot>(
              p, len > 0 ? len : 0, shift, scale, s.weight_pairs + r * weight_units(), pairs(end));
          if (len > 0) s.row_sum[r] = first ? sum : s.row_sum[r] * s.rescale[r] + sum;
          continue;
        }
      }
      std::int64_t zero_from = 0;
      if constexpr (codes) s.value_offsets[r] = 0.0f;
      if (len > 0) {
        const float max = masked && s.row_max[r] == minus_inf ? 0.0f : s.row_max[r];
        const auto [shift, scale] = exponent_of(p, len, max);
        const float sum = exp2_sum<Arch, bf16_weights>(p, len, shift, scale);
        s.row_sum[r] = first ? sum : s.row_sum[r] * s.rescale[r] + sum;
        zero_from = (len + lanes - 1) / lanes * lanes;  // exp2_sum zeroed up to here
        if (a.dropout.active()) {
          dropout_multipliers(a.dropout, a.first_batch + t.b, a.first_head + head(r),
                              t.past + pos(r), j0, j0 + len, s.dropout);
          for (std::int64_t j = 0; j < len; ++j) p[j] *= s.dropout[j];
        }
        if constexpr (codes) s.value_offsets[r] = value_weights(p, j0, len);
      }
      // bf16 reads the weights in pairs: a pair's other half is zero too.
      const std::int64_t read = pairs_of_bf16 ? round_up(end, 2) : end;
      for (std::int64_t j = zero_from; j < read; ++j) p[j] = 0.0f;
      if constexpr (pairs_of_bf16) {
        if (!l.direct) Dot::to_pairs(p, read, s.weight_pairs + r * weight_units());
      }
    }
  }

  // O = O * rescale + P V[j0, j1) (O = P V on the first tile), O in s.accumulators.
  // The micro-kernel takes the keys every row of a row block attends to; the keys of the
  // diagonal, which only the block's later rows see, are added row by row up to each row's own
  // causal limit. A key past a row's limit never meets that row's (zero) weight, so a NaN or Inf
  // in a later token cannot reach an earlier row as 0 * NaN.
  template <class T>
  void values(T, std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t panels = l.acc_cols / T::nr, wu = weight_units();
    if constexpr (tile_products<Dot>) {
      if (on_tiles(T::nr)) {
        tile_values<T>(j0, j1);
        return;
      }
    }
    for_row_blocks<T::mr>(0, rows, [&](std::int64_t r, auto R) {
      const keys_of_block keys = block_keys(r, r + R, j0, j1);
      const std::int64_t kc = keys.kc, common = keys.common;
      if (kc <= 0) return;  // no keys here for these rows: rescale is 1, nothing to add
      // bf16: whole pairs of keys only, so that a key past a row's limit never meets its zero
      // weight in a pair; the odd one left goes to the diagonal.
      const std::int64_t common_units = pairs_of_bf16 ? common / 2 : common;
      const std::int64_t done = pairs_of_bf16 ? 2 * common_units : common;
      constexpr int block_rows = decltype(R)::value;
      const auto add = [&]<int P>(std::integral_constant<int, P>, std::int64_t p) {
        // Panels [p, p + P)'s rows from key j0 (even: a key tile is a multiple of the lanes).
        const std::int64_t stride = value_rows() * T::nr;
        const panel_unit* panel = v + p * stride + (pairs_of_bf16 ? j0 / 2 : j0) * T::nr;
        float* o = s.accumulators + r * l.acc_cols + p * T::nr;
        if (j0 == t.key_begin) {
          panels_kernel<T, block_rows, P, Dot>(common_units, weights() + r * wu, wu, panel, stride,
                                               o, l.acc_cols, start_bias<T>{nullptr});
        } else {
          panels_kernel<T, block_rows, P, Dot>(common_units, weights() + r * wu, wu, panel, stride,
                                               o, l.acc_cols,
                                               start_scaled<T>{o, l.acc_cols, s.rescale + r});
        }
        for (int q = 0; q < P; ++q) {
          if (done < kc) diagonal<T>(r, R, j0, done, j1, panel + q * stride, o + q * T::nr);
          if constexpr (codes) {
            using batch = typename T::batch;
            constexpr std::int64_t lanes = batch::size;
            for (std::int64_t rr = r; rr < r + R; ++rr) {
              const batch gain(s.value_offsets[rr]);
              float* out = o + q * T::nr + (rr - r) * l.acc_cols;
              for (int c = 0; c < T::nv; ++c)
                (batch::load_unaligned(out + c * lanes) + gain).store_unaligned(out + c * lanes);
            }
          }
        }
      };
      // A row block too short to hide the FMA latency takes several panels at once.
      for_panel_groups<panels_for<T, block_rows>>(0, panels, add);
    });
  }

  // Whether the products over panels of nr columns go on tiles: a Dot with tile products, bf16
  // pairs (not an int8 cache's codes), panels a multiple of the tile's width, and more than one
  // row (a decode step's single query row stays on vectors, where a tile would be 1/16 full).
  bool on_tiles(int nr) const noexcept {
    if constexpr (tile_products<Dot> && pairs_of_bf16) {
      return nr % Dot::tile_cols == 0 && rows > 1;
    } else {
      return false;
    }
  }

  // The most rows a block of P V has: a tile's where P V runs on tiles, else the micro-kernel's.
  std::int64_t value_block_rows() const noexcept {
    if constexpr (tile_products<Dot>) {
      if (on_tiles(l.values.nr)) return l.values.mr > Dot::tile_rows ? l.values.mr : Dot::tile_rows;
    }
    return l.values.mr;
  }

  // values() on tiles: per block of tile rows, O = O * rescale (vectors, in place), then
  // O += P V on tiles over the whole pairs of keys every row of the block sees, then over the
  // pairs of the diagonal (the keys only the block's later rows see), each row's weights zero
  // past its own keys, from a copy of their values with every NaN and Inf set to 0 (so a
  // masked weight meets only finite values and adds an exact 0), and last each non-finite value
  // times its weight for the rows that see it. Which products run where depends on positions
  // only, never on the values, so a row's result does not depend on a later token.
  template <class T>
  void tile_values(std::int64_t j0, std::int64_t j1) const noexcept;  // attention_tiles.hpp
  // The n pair rows of a V panel (nr columns) at `from` into `to`, every NaN and Inf half set
  // to 0; false when there was one.
  template <class T>
  static bool finite_copy(const panel_unit* from, std::int64_t n, panel_unit* to) noexcept;
  // O[rr] += P[rr, k] V[j0 + k] for the NaN and Inf elements of V only, for the rows rr of
  // [r, r + R) and their keys k in [from, row_keys(rr)) (a panel from key j0, O of its columns).
  template <class T>
  void non_finite_values(std::int64_t r, int R, std::int64_t j0, std::int64_t from, std::int64_t j1,
                         const panel_unit* panel, float* o) const noexcept;

  // Row k (key j0 + k) of a V panel as floats, batch c of the tile: fp32 as is, bf16 widened
  // from its half of the pair, codes widened.
  template <class T>
  typename T::batch value_row(const panel_unit* panel, std::int64_t k, int c) const noexcept {
    using batch = typename T::batch;
    constexpr std::int64_t lanes = batch::size;
    if constexpr (codes) {
      return widen_codes<typename T::arch>(panel + k * T::nr + c * lanes);
    } else if constexpr (pairs_of_bf16) {
      using words = xsimd::batch<std::uint32_t, typename T::arch>;
      const auto h = widen(words::load_unaligned(panel + k / 2 * T::nr + c * lanes));
      return k % 2 == 0 ? h.even : h.odd;
    } else {
      return batch::load_unaligned(panel + k * T::nr + c * lanes);
    }
  }

  // O[rr] += P[rr, k] V[j0 + k] for the rows rr of the row block [r, r + R) and their keys
  // k in [from, row_keys(rr)): the part of the diagonal each row attends to (bf16: its weights
  // rounded as in the pairs).
  template <class T>
  void diagonal(std::int64_t r, int R, std::int64_t j0, std::int64_t from, std::int64_t j1,
                const panel_unit* panel, float* o) const noexcept {
    using batch = typename T::batch;
    constexpr std::int64_t lanes = batch::size;
    for (std::int64_t rr = r; rr < r + R; ++rr) {
      const std::int64_t keys = row_keys(rr, j0, j1);
      const float* w = s.scores + rr * l.score_cols;
      float* out = o + (rr - r) * l.acc_cols;
      for (int c = 0; c < T::nv; ++c) {
        batch acc = batch::load_unaligned(out + c * lanes);
        for (std::int64_t k = from; k < keys; ++k) {
          const float weight = pairs_of_bf16 ? round_bf16(w[k]) : w[k];
          acc = fused_fma(batch(weight), value_row<T>(panel, k, c), acc);
        }
        acc.store_unaligned(out + c * lanes);
      }
    }
  }

  // out = O / l; or, for a split's chunk, O, m and l per row (a row that sees no key of the
  // chunk: zeros, -inf and 0).
  void store() const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = batch::size;
    const std::int64_t hd = a.head_dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* o = s.accumulators + r * l.acc_cols;
      if (t.partial != nullptr) {
        float* part = t.partial + (t.row_begin * l.group + r) * (hd + 2);
        if (row_keys(r, t.key_begin, t.key_end) > 0) {
          for (std::int64_t d = 0; d < hd; ++d) part[d] = o[d];
          part[hd] = s.row_max[r];
          part[hd + 1] = s.row_sum[r];
        } else {
          for (std::int64_t d = 0; d < hd; ++d) part[d] = 0.0f;
          part[hd] = -std::numeric_limits<float>::infinity();
          part[hd + 1] = 0.0f;
        }
        continue;
      }
      // A masked row that saw no key at all: zeros (its O is 0 and its sum 0).
      const float f = a.mask.active() && s.row_sum[r] == 0.0f ? 0.0f : 1.0f / s.row_sum[r];
      if (a.out16.data != nullptr) {  // bf16 results
        bf16* out = a.out16.row(t.b, head(r), pos(r));
        for (std::int64_t d = 0; d < hd; ++d) out[d] = to_bf16(o[d] * f);
        continue;
      }
      float* out = a.out.row(t.b, head(r), pos(r));
      std::int64_t d = 0;
      for (; d + lanes <= hd; d += lanes)
        (batch(f) * batch::load_unaligned(o + d)).store_unaligned(out + d);
      for (; d < hd; ++d) out[d] = o[d] * f;
    }
  }

  // Heads of at most narrow_dims dimensions in fp32 without dropout or a mask take the rows of a
  // block a register of rows at a time (K and V packed, or in place in a direct block),
  // transposed: lane i is row r0 + i, Q^T and O^T are head_dim
  // registers each, and per key one register of scores (K's row broadcast against Q^T), so the
  // row maxima and sums are lane-wise, never horizontal, and a key's P V is head_dim FMAs with
  // V's row broadcast. At head_dim 8 the register tiles above spent as much time starting and
  // storing their accumulators (8 k-steps each) and in row-wise reductions as multiplying.
  // Per key tile: the scores and their lane-wise max, the rescale of O and l, then P and P V;
  // keys past a row's causal limit are -inf scores and skipped FMAs (masked lanes), never 0 * V.
  // With 16 registers (AVX2, SSE2) Q^T and O^T of 8 dimensions fill them, and the compiler
  // takes Q^T from the stack as FMA memory operands, and it is still faster (measurements:
  // docs/design.md §5.1).
  static constexpr int narrow_dims = 8;
  static constexpr bool narrow_operands = std::is_same_v<Dot, fma_dot>;  // fp32 only
  bool narrow() const noexcept {
    return a.head_dim <= narrow_dims && !a.dropout.active() && !a.mask.active();
  }

  template <int HD>
  void narrow_rows(std::int64_t r0) const noexcept;  // attention_narrow.hpp

  // attention_layout::direct: K and V read where they lie, not packed: fp32 rows of head_dim in
  // a.k and a.v, or, in a bf16 call on bfloat16 operands, bf16 rows in a.k16 and a.v16 (each
  // value already a bf16, so nothing is rounded). Per key tile, each row's scores as vectors of
  // `lanes` keys: one register of products per key over head_dim (bf16: Dot's product of the
  // query's pairs and the key row's, which are pairs as they lie), summed across their lanes at
  // once (lane_sums); then the mask and softmax as the packed path's; then O = O * rescale + P V
  // with V's rows broadcast weights (bf16: rounded), key by key up to each row's own limit
  // (never 0 * V past it). Dimensions past the whole registers go one at a time.
  static constexpr bool direct_operands = !codes;
  using direct_unit = std::conditional_t<pairs_of_bf16, bf16, float>;
  static constexpr std::int64_t direct_lanes = xsimd::batch<float, Arch>::size;
  // Dimensions per register step over a row: a register of floats, or of bf16 pairs.
  static constexpr std::int64_t direct_step = (pairs_of_bf16 ? 2 : 1) * direct_lanes;

  const direct_unit* key_row(std::int64_t j) const noexcept {
    if constexpr (pairs_of_bf16) {
      return a.k16.row(t.b, t.g, j);
    } else {
      return a.k.row(t.b, t.g, j);
    }
  }
  const direct_unit* value_row_in_place(std::int64_t j) const noexcept {
    if constexpr (pairs_of_bf16) {
      return a.v16.row(t.b, t.g, j);
    } else {
      return a.v.row(t.b, t.g, j);
    }
  }
  static float direct_element(const direct_unit* row, std::int64_t d) noexcept {
    if constexpr (pairs_of_bf16) {
      return from_bf16(row[d]);
    } else {
      return row[d];
    }
  }
  // acc + the products of row r's query and `key` over dimensions [d, d + direct_step).
  xsimd::batch<float, Arch> direct_product(std::int64_t r, const direct_unit* key, std::int64_t d,
                                           xsimd::batch<float, Arch> acc) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    if constexpr (pairs_of_bf16) {
      const auto* q = s.query_pairs + r * pairs(a.head_dim) + d / 2;
      const auto* k = reinterpret_cast<const bf16_pair*>(key + d);
      return Dot::dot(acc, Dot::template load_b<Arch>(q), Dot::template load_b<Arch>(k));
    } else {
      return fused_fma(batch::load_unaligned(s.queries + r * a.head_dim + d),
                       batch::load_unaligned(key + d), acc);
    }
  }
  // V's row j widened: O's registers of dimensions [d, d + direct_step) gain w times it (bf16:
  // two registers, the even dimensions' then the odd ones').
  template <class Batch>
  static void direct_value_step(const direct_unit* value, std::int64_t d, Batch w,
                                Batch* o) noexcept {
    if constexpr (pairs_of_bf16) {
      using words = xsimd::batch<std::uint32_t, Arch>;
      const auto h =
          widen(words::load_unaligned(reinterpret_cast<const std::uint32_t*>(value + d)));
      o[0] = fused_fma(w, h.even, o[0]);
      o[1] = fused_fma(w, h.odd, o[1]);
    } else {
      o[0] = fused_fma(w, Batch::load_unaligned(value + d), o[0]);
    }
  }

  void direct_scores(std::int64_t j0, std::int64_t j1) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    const std::int64_t hd = a.head_dim, whole = hd / direct_step * direct_step;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      const float* q = s.queries + r * hd;
      float* out = s.scores + r * l.score_cols;
      std::int64_t j = 0;
      if (whole == hd) {
        // `lanes` keys at a time, head_dim a compile-time count of steps where it is small.
        with_dimension<direct_registers / direct_units>(hd / direct_step, [&](auto n) {
          j = direct_score_keys<decltype(n)::value>(r, j0, len);
        });
      }
      for (; j < len; ++j) {
        const direct_unit* k = key_row(j0 + j);
        batch acc(0.0f);
        for (std::int64_t d = 0; d < whole; d += direct_step) acc = direct_product(r, k, d, acc);
        float sum = xsimd::hadd(acc);
        for (std::int64_t d = whole; d < hd; ++d) sum = std::fma(q[d], direct_element(k, d), sum);
        out[j] = sum;
      }
    }
  }
  // Row r's scores of keys [j0, j0 + len) `lanes` at a time, over N steps of head_dim; returns
  // the keys done (the rest are fewer than the lanes).
  template <int N>
  std::int64_t direct_score_keys(std::int64_t r, std::int64_t j0, std::int64_t len) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = direct_lanes;
    float* out = s.scores + r * l.score_cols;
    std::int64_t j = 0;
    for (; j + lanes <= len; j += lanes) {
      batch acc[lanes];
      for (std::int64_t i = 0; i < lanes; ++i) {
        const direct_unit* k = key_row(j0 + j + i);
        acc[i] = direct_product(r, k, 0, batch(0.0f));
        for (int step = 1; step < N; ++step)
          acc[i] = direct_product(r, k, step * direct_step, acc[i]);
      }
      lane_sums<Arch>(acc).store_unaligned(out + j);
    }
    return j;
  }

  // O's registers per row at most (the rest of the 16 or 32 being V's and a weight).
  static constexpr int direct_registers = direct_lanes >= 16 ? 16 : 8;
  static constexpr int direct_units = pairs_of_bf16 ? 2 : 1;  // O's registers per step

  // Rows whose O is held in registers at once, over `steps` register steps of head_dim.
  static constexpr int direct_block_rows(std::int64_t steps) noexcept {
    return static_cast<int>(direct_registers / (steps * direct_units));
  }
  // Dimension steps of O kept in registers by direct_values (0: none, head_dim is too wide).
  std::int64_t direct_register_steps() const noexcept {
    const std::int64_t steps = a.head_dim / direct_step;
    return steps * direct_units <= direct_registers ? steps : 0;
  }

  // Over the register steps' dimensions, bf16's O holds each step's even dimensions, then its
  // odd ones, until direct_order puts them in order after the last key tile.
  void direct_values(std::int64_t j0, std::int64_t j1) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = direct_lanes;
    const std::int64_t hd = a.head_dim, steps = direct_register_steps();
    const std::int64_t done = steps * direct_step;
    const bool first = j0 == t.key_begin;
    for (std::int64_t r = 0; r < rows; ++r) {
      float* o = s.accumulators + r * l.acc_cols;
      for (std::int64_t d = 0; d < hd; ++d) o[d] = first ? 0.0f : o[d] * s.rescale[r];
    }
    if constexpr (pairs_of_bf16) {  // the weights as P V's operands, once
      for (std::int64_t r = 0; r < rows; ++r) {
        float* p = s.scores + r * l.score_cols;
        const std::int64_t len = row_keys(r, j0, j1);
        for (std::int64_t j = 0; j < len; ++j) p[j] = round_bf16(p[j]);
      }
    }
    // The register steps with O in registers: rows a few at a time, each V row widened once
    // for them, over the keys they all see; then each row's own further keys, and the
    // dimensions past the register steps, in memory.
    with_dimension<direct_registers / direct_units>(steps, [&](auto n) {
      constexpr int N = decltype(n)::value, R = direct_block_rows(N);
      for (std::int64_t r = 0; r < rows; r += R) {
        with_dimension<R>(rows - r < R ? rows - r : R,
                          [&](auto m) { direct_values_rows<N, decltype(m)::value>(r, j0, j1); });
      }
    });
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      const std::int64_t from = steps > 0 ? common_keys(r, j0, j1) : 0;
      float* o = s.accumulators + r * l.acc_cols;
      const float* p = s.scores + r * l.score_cols;
      for (std::int64_t j = done < hd ? 0 : from; j < len; ++j) {
        const direct_unit* value = value_row_in_place(j0 + j);
        const float weight = p[j];
        if (j >= from) {
          for (std::int64_t d = 0; d < done; d += direct_step) {
            batch acc[direct_units];
            for (int u = 0; u < direct_units; ++u)
              acc[u] = batch::load_unaligned(o + d + u * lanes);
            direct_value_step(value, d, batch(weight), acc);
            for (int u = 0; u < direct_units; ++u) acc[u].store_unaligned(o + d + u * lanes);
          }
        }
        for (std::int64_t d = done; d < hd; ++d)
          o[d] = std::fma(weight, direct_element(value, d), o[d]);
      }
    }
  }

  // Keys of [j0, j1) that every row of the register block of row r sees (the block's first row's:
  // positions, and so limits, do not decrease with the row).
  std::int64_t common_keys(std::int64_t r, std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t R = direct_block_rows(a.head_dim / direct_step);
    const std::int64_t keys = row_keys(r / R * R, j0, j1);
    return keys < 0 ? 0 : keys;
  }

  // O[r0, r0 + R) over dimensions [0, N * direct_step) gains P V of the keys all R rows see, in
  // registers.
  template <int N, int R>
  void direct_values_rows(std::int64_t r0, std::int64_t j0, std::int64_t j1) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = direct_lanes;
    batch o[R][N * direct_units];
    const std::int64_t keys = common_keys(r0, j0, j1);
    for (int i = 0; i < R; ++i) {
      for (int u = 0; u < N * direct_units; ++u)
        o[i][u] = batch::load_unaligned(s.accumulators + (r0 + i) * l.acc_cols + u * lanes);
    }
    for (std::int64_t j = 0; j < keys; ++j) {
      const direct_unit* value = value_row_in_place(j0 + j);
      for (int i = 0; i < R; ++i) {
        const batch w(s.scores[(r0 + i) * l.score_cols + j]);
        for (int step = 0; step < N; ++step)
          direct_value_step(value, step * direct_step, w, o[i] + step * direct_units);
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int u = 0; u < N * direct_units; ++u)
        o[i][u].store_unaligned(s.accumulators + (r0 + i) * l.acc_cols + u * lanes);
    }
  }

  // bf16: O's register steps' dimensions back in order (each step's even dimensions, then its
  // odd ones, as direct_value_step leaves them).
  void direct_order() const noexcept {
    constexpr std::int64_t lanes = direct_lanes;
    const std::int64_t whole = direct_register_steps() * direct_step;
    float halves[direct_step];
    for (std::int64_t r = 0; r < rows; ++r) {
      float* o = s.accumulators + r * l.acc_cols;
      for (std::int64_t d = 0; d < whole; d += direct_step) {
        std::copy(o + d, o + d + direct_step, halves);
        for (std::int64_t i = 0; i < lanes; ++i) {
          o[d + 2 * i] = halves[i];
          o[d + 2 * i + 1] = halves[lanes + i];
        }
      }
    }
  }

  void run() const noexcept {
    // The block's rows fit its scratch; key tiles and chunks start on a K^T panel and cover whole
    // registers of scores (attention_layout).
    MHA_EXPECTS(rows >= 1 && rows <= l.block_rows && t.key_begin < t.key_end);
    MHA_EXPECTS(t.key_begin % l.key_step == 0 && l.key_tile % l.key_step == 0);
    MHA_EXPECTS(l.key_step % l.scores.nr == 0 && l.key_step % xsimd::batch<float, Arch>::size == 0);
    scale_queries();
    if constexpr (narrow_operands) {
      if (narrow()) {
        constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
        with_dimension<narrow_dims>(a.head_dim, [&](auto hd) {
          for (std::int64_t r0 = 0; r0 < rows; r0 += lanes) narrow_rows<decltype(hd)::value>(r0);
        });
        return;
      }
    }
    const std::int64_t key_end = rows_end(0, rows);
    if constexpr (direct_operands) {
      if (l.direct) {
        for (std::int64_t j0 = t.key_begin; j0 < key_end; j0 += l.key_tile) {
          const std::int64_t j1 = j0 + l.key_tile < key_end ? j0 + l.key_tile : key_end;
          direct_scores(j0, j1);
          if (a.mask.active()) mask_scores(j0, j1);
          softmax(j0, j1);
          direct_values(j0, j1);
        }
        if constexpr (pairs_of_bf16) direct_order();
        store();
        return;
      }
    }
    for (std::int64_t j0 = t.key_begin; j0 < key_end; j0 += l.key_tile) {
      const std::int64_t j1 = j0 + l.key_tile < key_end ? j0 + l.key_tile : key_end;
      with_tile(Tiles{}, l.scores.nr, [&](auto tile) { scores(tile, j0, j1); });
      if (a.mask.active()) mask_scores(j0, j1);
      softmax(j0, j1);
      with_tile(Tiles{}, l.values.nr, [&](auto tile) { values(tile, j0, j1); });
    }
    store();
  }
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE

#include "kernels/micro/attention_narrow.hpp"
#include "kernels/micro/attention_tiles.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// isa_kernels::attention_rows over the layout's unit: bf16 pairs through PairDot, int8 codes
// through code_pair_dot (Q K^T) and code_dot (P V), else fp32.
template <class Arch, class Tiles, class PairDot>
void attention_rows(const attention_args& a, const attention_layout& l, const attention_task& t,
                    float* scratch) noexcept {
  const auto run = [&](auto dot, auto score_dot) {
    using Dot = decltype(dot);
    using ScoreDot = decltype(score_dot);
    // A direct layout has no packed head (t.head is nullptr): K and V are read from `a`.
    const auto* head = static_cast<const std::uint8_t*>(t.head);
    const std::int64_t unit_bytes = l.int8 ? 1 : 4;  // the layout's offsets count its units
    const float* scales =
        l.int8 ? reinterpret_cast<const float*>(head + l.scales_offset()) : nullptr;
    const std::int64_t values_at = head ? unit_bytes * l.values_offset() : 0;
    const attention_block<Arch, Tiles, Dot, ScoreDot> block{
        a,
        l,
        t,
        reinterpret_cast<const b_unit_t<ScoreDot>*>(head),
        reinterpret_cast<const b_unit_t<Dot>*>(head + values_at),
        (t.row_end - t.row_begin) * l.group,
        l.scratch_parts(scratch),
        scales};
    block.run();
  };
  if (l.int8) {
    run(code_dot{}, code_pair_dot{});
  } else if (l.bf16) {
    run(PairDot{}, PairDot{});
  } else {
    run(fma_dot{}, fma_dot{});
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
