// Internal: what every path of the per-ISA attention kernel shares (micro/attention_kernel.hpp
// runs the layout's attention_path): one block of query rows, its row geometry, its queries in the
// operands' unit, the mask, the online-softmax step and the store. Per-ISA code: see
// micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "base/bf16.hpp"
#include "base/dropout.hpp"
#include "base/value4.hpp"
#include "kernels/interface/attention.hpp"
#include "kernels/micro/attention_scores.hpp"
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

// How a path reads the weights P that attention_block::softmax makes of a key tile's scores.
struct weights_use {
  // The most rows of one of its P V blocks: each row's weights are zero past its own keys up to
  // the last key any block it is in reads.
  std::int64_t block_rows = 1;
  // bf16 pairs (in scratch.weight_pairs) besides the fp32 weights.
  bool pairs = false;
  // Only the pairs, made as the exponentials are, no fp32 weight stored (P V on tiles without
  // dropout).
  bool pairs_only = false;
};

// The attention of one query-row block over one range of keys, fused (FlashAttention's online
// softmax): keys are taken one key tile at a time, so scratch holds one tile of scores, never a
// whole row. Scores are in base 2 (Q scaled by scale * log2(e), so exp(s) = 2^(s log2 e)). Per
// tile:
//   S = (c Q) K^T[:, tile]              micro-tiles entirely above the diagonal skipped
//   S += log2(e) mask                   with a mask only (mask_scores; the masked scores are
//                                       kept halved, below)
//   m' = max(m, rowmax S)               causal mask as the row length within the tile
//   P = 2^(S - m'), l = l 2^(m - m') + rowsum P,   then P *= dropout (l stays undropped)
//   O = O 2^(m - m') + P V[tile, :]     the rescale is the micro-kernel's start (start_scaled)
// and at the end out = O / l (or O, m and l as a split's partial result). With a mask, S and m
// are kept at half their base-2 value (score_mask::exponent_scale: every finite mask value then
// has a finite log2(e) multiple, as SDPA adds a finfo.min or a +3e38 bias without overflow) and
// each exponent is 2 (S - m') (the doubling exact, so the weights are the same bits as unhalved
// wherever those did not overflow). Where P V runs on tiles (AMX, no dropout), P goes straight to
// bf16 pairs as it is made, its exponential to the accuracy a bf16 weight needs
// (softmax_kernel.hpp's exp2_sum_pairs), and O is rescaled only in the rows whose maximum grew.
// A block's rows are the query heads of one K/V head stacked position-major (attention_layout):
// row r is query head g * group + r % group at position row_begin + r / group, so the
// positions, and the causal limits, never decrease with r. Tiles past the block's last row are
// never visited. With one key tile (layout.key_tile >= keys) this is the unfused softmax(S) V of
// whole rows. Each row's sums run in key order, one fma at a time, so a row's result does not
// depend on the rows it is computed with: an incremental call's row equals the full forward's
// bit for bit.
//
// Dot sets the operands' unit (micro_kernel.hpp): fp32 (fma_dot) or, for a bf16 module, bf16
// pairs (docs/design.md §1.5): the queries, the K and V and the weights P are rounded to bf16
// and the products summed in fp32; the scale is then applied to the scores in the softmax (Q K^T
// of rounded Q), where fp32 folds it into the queries; or, for an int8 cache, pairs of codes
// on integers (code_pair_dot, micro/attention_codes.hpp).
//
// This type holds what every path reads; each path is a type deriving from it
// (micro/attention_packed.hpp, attention_direct.hpp, attention_narrow.hpp) with its own run().
template <class Arch, class Dot>
struct attention_block {
  using unit = typename Dot::unit;
  using panel_unit = b_unit_t<Dot>;
  static constexpr bool pairs_of_bf16 = std::is_same_v<unit, bf16_pair>;
  static constexpr bool codes = std::is_same_v<Dot, code_pair_dot>;
  // K^T's rows are pairs of dimensions: bf16 pairs, or pairs of codes.
  static constexpr bool key_pairs = pairs_of_bf16 || codes;
  // The AMX build's bf16 weights come from exp2_for_bf16 on every path (tiles or vectors), so
  // that a decode step's single row, on vectors, equals the full forward's row, on tiles.
  static constexpr bool bf16_weights = tile_products<Dot> && pairs_of_bf16;

  const attention_args& args;
  const attention_layout& layout;
  const attention_task& task;
  std::int64_t rows;  // stacked rows: positions * layout.group
  attention_scratch scratch;

  // V's rows are pairs of keys: bf16 pairs, or pairs of codes (and P's rows pairs of weights).
  static constexpr bool value_pairs = pairs_of_bf16 || codes;

  // Units of a K^T panel row (head_dim elements) and of a V panel column (kv_rows keys).
  std::int64_t dim_units() const noexcept {
    return key_pairs ? pairs(args.head_dim) : args.head_dim;
  }
  std::int64_t value_rows() const noexcept {
    return value_pairs ? pairs(layout.kv_rows) : layout.kv_rows;
  }
  // Units of P per score row.
  std::int64_t weight_units() const noexcept {
    return value_pairs ? pairs(layout.score_cols) : layout.score_cols;
  }
  const unit* queries() const noexcept {
    if constexpr (pairs_of_bf16) {
      return scratch.query_pairs;
    } else if constexpr (codes) {
      return scratch.query_codes;
    } else {
      return scratch.queries;
    }
  }
  const unit* weights() const noexcept {
    if constexpr (pairs_of_bf16) {
      return scratch.weight_pairs;
    } else if constexpr (codes) {
      return scratch.weight_codes;
    } else {
      return scratch.scores;
    }
  }
  // The factor between a score in scratch.scores and its base-2 exponent: the queries carry it
  // in fp32, and mask_scores applies it to bf16's raw scores with a mask.
  // A soft-capped tile's scores are made base 2 by cap_scores, so they are at scale 1 then.
  float score_scale() const noexcept {
    return pairs_of_bf16 && !args.mask.active() && args.softcap == 0.0f
               ? args.scale * 1.44269504088896341f
               : 1.0f;
  }

  // Position (relative to past) and query head of stacked row r.
  std::int64_t pos(std::int64_t r) const noexcept { return task.row_begin + r / layout.group; }
  std::int64_t head(std::int64_t r) const noexcept {
    return task.g * layout.group + r % layout.group;
  }

  // One past the last key that any of the block's rows [r0, r1) attends to (query position i
  // stands at absolute position task.past + i), within the task's keys.
  std::int64_t rows_end(std::int64_t r0, std::int64_t r1) const noexcept {
    (void)r0;  // causal rows see a prefix of the keys: the block's last row sees the most
    const std::int64_t own = task.past + pos(r1 - 1) + 1;
    return args.causal && own < task.key_end ? own : task.key_end;
  }

  // Keys of [j0, j1) that row r attends to: [j0, j0 + result), possibly none.
  std::int64_t row_keys(std::int64_t r, std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t own = task.past + pos(r) + 1;
    const std::int64_t end = args.causal && own < j1 ? own : j1;
    return end - j0;
  }

  // Every path's start: the block's contract, then its queries in the unit.
  void start() const noexcept {
    // The block's rows fit its scratch; key tiles and chunks start on a K^T panel and cover whole
    // registers of scores (attention_layout).
    MHA_EXPECTS(rows >= 1 && rows <= layout.block_rows && task.key_begin < task.key_end);
    MHA_EXPECTS(task.key_begin % layout.key_step == 0 && layout.key_tile % layout.key_step == 0);
    MHA_EXPECTS(layout.key_step % layout.scores.nr == 0 &&
                layout.key_step % xsimd::batch<float, Arch>::size == 0);
    scale_queries();
  }

  // The block's queries in the unit: fp32 times the scale in base 2, or bf16 pairs as they are;
  // int8: of a bf16 plan rounded to bf16 first, then as 16-bit integer pairs with a scale, and
  // each row's sum.
  void scale_queries() const noexcept {
    const std::int64_t hd = args.head_dim;
    // log2(e), halved with a mask (score_mask::exponent_scale; exact: a power of two).
    const float c = args.scale * 1.44269504088896341f * (args.mask.active() ? 0.5f : 1.0f);
    if constexpr (pairs_of_bf16) {
      if (args.bf16_operands()) {
        for (std::int64_t r = 0; r < rows; ++r) {
          const bf16* row = args.q16.row(task.b, head(r), pos(r));
          // The pairs as they lie in the row (the odd one past an odd head_dim zero), and for
          // a direct block the floats too (its dimensions past whole registers).
          bf16_pair* to = scratch.query_pairs + r * pairs(hd);
          for (std::int64_t i = 0; i < pairs(hd); ++i) {
            const bf16 odd = 2 * i + 1 < hd ? row[2 * i + 1] : bf16{0};
            to[i] = row[2 * i] | static_cast<bf16_pair>(odd) << 16;
          }
          if (layout.path == attention_path::direct) {
            for (std::int64_t d = 0; d < hd; ++d) scratch.queries[r * hd + d] = from_bf16(row[d]);
          }
        }
        return;
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = args.q.row(task.b, head(r), pos(r));
      if constexpr (pairs_of_bf16) {
        Dot::to_pairs(row, hd, scratch.query_pairs + r * pairs(hd));
      } else if constexpr (codes) {
        // Times the keys' channel scales (q . k = (q s) . (k / s), base/int8.hpp); an int4
        // cache's have none: its queries are made integers per channel group of the keys
        // (key4_scores), from these.
        const float* channels =
            layout.keys4
                ? nullptr
                : reinterpret_cast<const float*>(static_cast<const std::uint8_t*>(task.head) +
                                                 layout.channels_offset());
        float* scaled = scratch.queries + r * hd;
        float sum = 0.0f;
        for (std::int64_t d = 0; d < hd; ++d) {
          scaled[d] =
              c * (args.bf16 ? round_bf16(row[d]) : row[d]) * (channels ? channels[d] : 1.0f);
          sum += scaled[d];
        }
        if (layout.keys4) continue;
        scratch.query_sums[r] = sum;
        scratch.query_scales[r] = quantize_query(scaled, hd, scratch.query_codes + r * pairs(hd));
      } else {
        for (std::int64_t d = 0; d < hd; ++d) scratch.queries[r * hd + d] = c * row[d];
      }
    }
  }

  // What the function does to a key tile's scores after Q K^T, in its order: soft-capping, the
  // mask, the window (docs/design.md §1.9; micro/attention_scores.hpp).
  void adjust_scores(std::int64_t j0, std::int64_t j1) const noexcept {
    if (args.softcap > 0.0f) cap_scores(*this, j0, j1);
    if (args.mask.active()) mask_scores(*this, j0, j1);
    if (args.window > 0) window_scores(*this, j0, j1);
  }

  // The shift and scale of a row's weights 2^(scale x - shift) (exp2_sum) at the row's maximum
  // `max` (in the scores' units). With a mask, the halved scores' exponents 2 (x - max) are
  // fma(x, 2, -2 max), the same bits (the doubling is exact) unless 2 max overflows (a finite
  // mask value beyond float32's half range at the maximum): then the row's scores are made
  // their exponents first, the shift before the doubling, and the weights taken at scale 1.
  std::pair<float, float> exponent_of(float* p, std::int64_t n, float max) const noexcept {
    if (!args.mask.active()) return {max, score_scale()};
    if (std::fabs(max) <= 0.5f * std::numeric_limits<float>::max()) return {2.0f * max, 2.0f};
    for (std::int64_t j = 0; j < n; ++j) p[j] = 2.0f * (p[j] - max);
    return {0.0f, 1.0f};
  }

  // The online-softmax step over keys [j0, j1): scores become weights P, the running max and
  // sum move on, scratch.rescale gets 2^(m - m') per row. Each row's weights are zeroed past its
  // own keys up to what P V reads for any row block it can be in (`use`). With a mask, a row
  // whose keys so far are all at -inf has the running max -inf, weights 0 and sum 0 (its max
  // moves nothing until a key counts). An int8 cache's rows are made by
  // code_weights(r, p, len, end, shift, scale, multipliers) instead, which returns their sum:
  // row r's weights 2^(scale p_j - shift) of its first len scores p (len <= 0: none), times
  // dropout's multipliers (nullptr: none), for the keys P V reads of the row ([0, end)), in
  // whatever form its P V reads (code_scales::value_weights: 16-bit integers, no fp32 weight).
  void softmax(std::int64_t j0, std::int64_t j1, weights_use use) const noexcept {
    softmax(j0, j1, use, [](auto&&...) { return 0.0f; });
  }
  template <class F>
  void softmax(std::int64_t j0, std::int64_t j1, weights_use use, F&& code_weights) const noexcept {
    constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
    constexpr float minus_inf = -std::numeric_limits<float>::infinity();
    // guarded: a row may have no key in this tile and some in later ones (a mask, a window);
    // halved: the scores and maxima are at half their base-2 value (a mask).
    const bool first = j0 == task.key_begin, guarded = args.masks_keys();
    const bool halved = args.mask.active();
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      float shift = 0.0f;  // m - m' (no change for a row without keys here)
      if (len > 0) {
        const float tile_max =
            score_scale() * row_max<Arch>(scratch.scores + r * layout.score_cols, len);
        const float m = first || tile_max > scratch.row_max[r] ? tile_max : scratch.row_max[r];
        shift = first || (guarded && m == minus_inf) ? 0.0f : scratch.row_max[r] - m;
        scratch.row_max[r] = m;
      }
      scratch.rescale[r] = halved ? 2.0f * shift : shift;  // halved scores: 2 (m - m')
    }
    if (!first) exp2_sum<Arch>(scratch.rescale, rows, 0.0f, 1.0f);  // 2^(m - m'), over rows
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      const std::int64_t last = r + use.block_rows < rows ? r + use.block_rows : rows;
      const std::int64_t block_end = rows_end(r, last);
      const std::int64_t end = (block_end < j1 ? block_end : j1) - j0;
      float* p = scratch.scores + r * layout.score_cols;
      const std::int64_t keys = len > 0 ? len : 0;
      // The weights 2^(scale x - shift) at the running max (0 for a row whose keys so far are all
      // at -inf); the sum of a row with keys here moves on.
      const float max =
          keys == 0 || (guarded && scratch.row_max[r] == minus_inf) ? 0.0f : scratch.row_max[r];
      const auto [shift, scale] = exponent_of(p, keys, max);
      const auto add_sum = [&](float sum) {
        if (keys > 0)
          scratch.row_sum[r] = first ? sum : scratch.row_sum[r] * scratch.rescale[r] + sum;
      };
      if constexpr (bf16_weights) {
        if (use.pairs_only) {
          add_sum(exp2_sum_pairs<Arch, Dot>(p, keys, shift, scale,
                                            scratch.weight_pairs + r * weight_units(), pairs(end)));
          continue;
        }
      }
      if constexpr (codes) {
        add_sum(code_weights(r, p, len, end, shift, scale, dropout_of(r, j0, keys)));
        continue;
      }
      std::int64_t zero_from = 0;
      if (keys > 0) {
        add_sum(exp2_sum<Arch, bf16_weights>(p, keys, shift, scale));
        zero_from = (keys + lanes - 1) / lanes * lanes;  // exp2_sum zeroed up to here
        if (const float* multipliers = dropout_of(r, j0, keys)) {
          for (std::int64_t j = 0; j < keys; ++j) p[j] *= multipliers[j];
        }
      }
      // bf16 reads the weights in pairs: a pair's other half is zero too.
      const std::int64_t read = pairs_of_bf16 ? round_up(end, 2) : end;
      for (std::int64_t j = zero_from; j < read; ++j) p[j] = 0.0f;
      if constexpr (pairs_of_bf16) {
        if (use.pairs) Dot::to_pairs(p, read, scratch.weight_pairs + r * weight_units());
      }
    }
  }

  // Row r's dropout multipliers of keys [j0, j0 + n) in scratch.dropout, or nullptr where
  // dropout is off or there are no keys.
  const float* dropout_of(std::int64_t r, std::int64_t j0, std::int64_t n) const noexcept {
    if (!args.dropout.active() || n <= 0) return nullptr;
    dropout_multipliers(args.dropout, args.first_batch + task.b, args.first_head + head(r),
                        task.past + pos(r), j0, j0 + n, scratch.dropout);
    return scratch.dropout;
  }

  // out = O / l; or, for a split's chunk, O, m and l per row (a row that sees no key of the
  // chunk: zeros, -inf and 0). A k8v4 cache's O is of turned values: each row's groups are turned
  // back first (base/value4.hpp; a split's chunks so too, their merge being linear in O).
  void store() const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::int64_t lanes = batch::size;
    const std::int64_t hd = args.head_dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      float* o = scratch.accumulators + r * layout.acc_cols;
      if (layout.values4) turn_groups(o, hd);
      if (task.partial != nullptr) {
        float* part = task.partial + (task.row_begin * layout.group + r) * (hd + 2);
        if (row_keys(r, task.key_begin, task.key_end) > 0) {
          for (std::int64_t d = 0; d < hd; ++d) part[d] = o[d];
          part[hd] = scratch.row_max[r];
          part[hd + 1] = scratch.row_sum[r];
        } else {
          for (std::int64_t d = 0; d < hd; ++d) part[d] = 0.0f;
          part[hd] = -std::numeric_limits<float>::infinity();
          part[hd + 1] = 0.0f;
        }
        continue;
      }
      const float f = output_factor(args, head(r), scratch.row_max[r], scratch.row_sum[r]);
      if (args.out16.data != nullptr) {  // bf16 results
        bf16* out = args.out16.row(task.b, head(r), pos(r));
        for (std::int64_t d = 0; d < hd; ++d) out[d] = to_bf16(o[d] * f);
        continue;
      }
      float* out = args.out.row(task.b, head(r), pos(r));
      std::int64_t d = 0;
      for (; d + lanes <= hd; d += lanes)
        (batch(f) * batch::load_unaligned(o + d)).store_unaligned(out + d);
      for (; d < hd; ++d) out[d] = o[d] * f;
    }
  }
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
