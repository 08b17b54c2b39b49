// Internal: the attention kernel's packed path (attention_path packed, tiles and codes): K^T and
// V in the GEMM's panels (a workspace's, packed by the call, or a KV cache's), in fp32, bf16
// pairs or int8 codes, Q K^T and P V on the register-tiled micro-kernels, or on tiles where the
// Dot has tile products (micro/attention_tiles.hpp). Per-ISA code: see micro/micro_kernel.hpp for
// how it is compiled.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/key4.hpp"
#include "base/value4.hpp"
#include "kernels/micro/attention_block.hpp"
#include "kernels/micro/attention_codes.hpp"
#include "kernels/micro/attention_tiles.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Per key tile: the scores (Q K^T), the mask, the softmax, then O = O * rescale + P V, O in
// scratch.accumulators; out at the end (attention_block).
template <class Arch, class Tiles, class Dot>
struct packed_attention : attention_block<Arch, Dot> {
  using block = attention_block<Arch, Dot>;
  using arch = Arch;
  using dot = Dot;
  using block::args, block::layout, block::task, block::rows, block::scratch;
  using block::dim_units, block::value_rows, block::weight_units, block::queries, block::weights;
  using block::pairs_of_bf16, block::codes, block::bf16_weights;
  using block::rows_end, block::row_keys;
  using typename block::panel_unit;

  const panel_unit* kt;  // packed K^T: head_dim x layout.kv_rows in panels of layout.scores.nr
  const panel_unit* v;   // packed V: layout.kv_rows x head_dim in panels of layout.values.nr
  // int8: the codes' scales and zeros (code_scales::rows); nullptr otherwise.
  const int8_row* scales;

  code_scales<Arch> code_terms() const noexcept {
    return {scales, layout.key_rows(), layout.key_words(), layout.value_groups(), layout.values4};
  }

  void run() const noexcept {
    this->start();
    const std::int64_t key_end = rows_end(0, rows);
    // Every row block of P V reads its rows' weights up to its last row's keys.
    const weights_use use{value_block_rows(), pairs_of_bf16,
                          bf16_weights && on_tiles(layout.values.nr) && !args.dropout.active()};
    for (std::int64_t j0 = task.key_begin; j0 < key_end; j0 += layout.key_tile) {
      const std::int64_t j1 = j0 + layout.key_tile < key_end ? j0 + layout.key_tile : key_end;
      with_tile(Tiles{}, layout.scores.nr, [&](auto tile) { scores(tile, j0, j1); });
      this->adjust_scores(j0, j1);
      if constexpr (codes) {
        // int8: the weights times the values' scales as 16-bit integers, and the offsets' share
        // of each row, made with the exponentials.
        const std::int64_t groups = layout.value_groups(), wu = this->weight_units();
        const std::int64_t chunks = layout.weight_chunks();
        this->softmax(j0, j1, use,
                      [&](std::int64_t r, const float* p, std::int64_t len, std::int64_t end,
                          float shift, float scale, const float* multipliers) {
                        return code_terms().value_weights(
                            p, j0, len, end, shift, scale, multipliers,
                            {scratch.weight_codes + r * groups * wu, wu,
                             scratch.weight_scales + r * groups * chunks, chunks,
                             scratch.value_offsets + r * groups});
                      });
      } else {
        this->softmax(j0, j1, use);
      }
      with_tile(Tiles{}, layout.values.nr, [&](auto tile) {
        if constexpr (codes) {
          code_values<decltype(tile)>(j0, j1);
        } else {
          values(tile, j0, j1);
        }
      });
    }
    this->store();
  }

  // Whether the products over panels of nr columns go on tiles: the tiles path (the ISA has tile
  // products, and the layout's blocks have several rows), panels a multiple of the tile's width,
  // and more than one row in this block (a call's last block of one row stays on vectors, where a
  // tile would be 1/16 full).
  bool on_tiles(int nr) const noexcept {
    if constexpr (tile_products<Dot> && pairs_of_bf16) {
      return layout.path == attention_path::tiles && nr % Dot::tile_cols == 0 && rows > 1;
    } else {
      return false;
    }
  }

  // The most rows a block of P V has: a tile's where P V runs on tiles, else the micro-kernel's.
  std::int64_t value_block_rows() const noexcept {
    if constexpr (tile_products<Dot>) {
      if (on_tiles(layout.values.nr)) {
        return layout.values.mr > Dot::tile_rows ? layout.values.mr : Dot::tile_rows;
      }
    }
    return layout.values.mr;
  }

  // Scores of keys [j0, j1) (j0 a multiple of T::nr) into columns [0, j1 - j0) of
  // scratch.scores. Panels outer, micro-blocks inner: a (head_dim, nr) panel of K^T stays in L1.
  // A row block too short to hide the FMA latency on its own (a decode step's one row) takes
  // panels_for<T, R> panels at once (for_panel_groups); an int8 cache's one row instead takes one
  // panel at a time on integer accumulators (code_pair_row), so that K^T's codes are one stream.
  template <class T>
  void scores(T, std::int64_t j0, std::int64_t j1) const noexcept {
    if constexpr (tile_products<Dot>) {
      if (on_tiles(T::nr)) return tile_path<packed_attention>{*this}.template scores<T>(j0, j1);
    }
    const std::int64_t last = rows_end(0, rows);
    const std::int64_t panels = ((last < j1 ? last : j1) - j0 + T::nr - 1) / T::nr;
    if constexpr (codes) {
      if (layout.keys4) return key4_scores<T>(*this, j0, j1);
      if (rows == 1) {  // a decode step's one row: K^T read as one stream (code_pair_row)
        const std::int64_t du = dim_units();
        for (std::int64_t p = 0; p < panels; ++p) {
          float* tile = scratch.scores + p * T::nr;
          code_pair_row<T>(du, queries(), kt + j0 * du + p * du * T::nr, tile);
          code_terms().template key_scores<T>(scratch.query_scales, scratch.query_sums, 1,
                                              j0 + p * T::nr, tile, layout.score_cols);
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

  // Panel rows read ahead in software (panels_kernel's ahead) over a KV cache: 4 KiB of a panel,
  // as nibble_panels reads a decode step's 4-bit codes. A block of several rows has too many
  // products between its loads for the hardware prefetcher to keep enough misses in flight; a
  // single row of pairs (bf16, int8 codes) takes its panels side by side, streams too short for
  // it. A single fp32 row, which streams at the read rate without, and heads packed by the call
  // (in cache already) read none.
  template <class T>
  std::int64_t ahead_rows() const noexcept {
    constexpr std::int64_t row_bytes = T::nr * std::int64_t{sizeof(panel_unit)};
    const bool reads_ahead = rows > 1 || !std::is_same_v<panel_unit, float>;
    return args.cache != nullptr && reads_ahead ? 4096 / row_bytes : 0;
  }

  // The scores of rows [r, r + R) and the keys of panels [p, p + P) from key j0.
  template <class T, int R, int P>
  void score_panels(std::int64_t r, std::int64_t j0, std::int64_t p) const noexcept {
    const std::int64_t du = dim_units();
    float* tile = scratch.scores + r * layout.score_cols + p * T::nr;
    // Panel j0 / nr + p, each du * nr units.
    panels_kernel<T, R, P, Dot, true>(du, queries() + r * du, du, kt + j0 * du + p * du * T::nr,
                                      du * T::nr, tile, layout.score_cols, start_bias<T>{nullptr},
                                      ahead_rows<T>());
    if constexpr (codes) {
      for (int q = 0; q < P; ++q) {
        code_terms().template key_scores<T>(scratch.query_scales + r, scratch.query_sums + r, R,
                                            j0 + (p + q) * T::nr, tile + q * T::nr,
                                            layout.score_cols);
      }
    }
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
    if (!args.causal) return {kc, kc};
    const std::int64_t own = task.past + this->pos(r0) + 1, first_row_end = own < j1 ? own : j1;
    return {kc, first_row_end - j0 < 0 ? 0 : first_row_end - j0};
  }

  // O = O * rescale + P V[j0, j1) (O = P V on the first tile), O in scratch.accumulators.
  // The micro-kernel takes the keys every row of a row block attends to; the keys of the
  // diagonal, which only the block's later rows see, are added row by row up to each row's own
  // causal limit. A key past a row's limit never meets that row's (zero) weight, so a NaN or Inf
  // in a later token cannot reach an earlier row as 0 * NaN.
  template <class T>
  void values(T, std::int64_t j0, std::int64_t j1) const noexcept {
    if constexpr (tile_products<Dot>) {
      if (on_tiles(T::nr)) return tile_path<packed_attention>{*this}.template values<T>(j0, j1);
    }
    const std::int64_t panels = layout.acc_cols / T::nr, wu = weight_units();
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
        float* o = scratch.accumulators + r * layout.acc_cols + p * T::nr;
        if (j0 == task.key_begin) {
          panels_kernel<T, block_rows, P, Dot, true>(common_units, weights() + r * wu, wu, panel,
                                                     stride, o, layout.acc_cols,
                                                     start_bias<T>{nullptr}, ahead_rows<T>());
        } else {
          panels_kernel<T, block_rows, P, Dot, true>(
              common_units, weights() + r * wu, wu, panel, stride, o, layout.acc_cols,
              start_scaled<T>{o, layout.acc_cols, scratch.rescale + r}, ahead_rows<T>());
        }
        for (int q = 0; q < P; ++q) {
          if (done < kc) diagonal<T>(r, R, j0, done, j1, panel + q * stride, o + q * T::nr);
        }
      };
      // A row block too short to hide the FMA latency takes several panels at once.
      for_panel_groups<panels_for<T, block_rows>>(0, panels, add);
    });
  }

  // int8: O = O * rescale + P V[j0, j1) on integers (O = P V on the first tile). Each row block
  // takes every key any of its rows attends to (kc): a row's weight codes are 0 past its own
  // keys (code_scales::value_weights), so nothing is added for them, and the codes being
  // integers, not even 0 * NaN; no diagonal row by row. The keys go in chunks of
  // weight_chunk_keys, each chunk's integer sums (code_pair_dot over its pairs of keys) scaled
  // by the rows' chunk scales into O (add_chunk); then each row gains its sum of p_j offset_j.
  // k8v4 (attention_layout::values4): each panel's weights, chunk scales and offsets are those of
  // the group of the values it lies in (a panel of nr columns, nr dividing value4_group, never
  // straddles two), and V's codes are read a word row of 8 keys at a time (nibble_panels: a
  // chunk's keys rounded up to 8, whose weight codes past a row's keys are 0).
  template <class T>
  void code_values(std::int64_t j0, std::int64_t j1) const noexcept {
    static_assert(value4_group % T::nr == 0, "a panel within one group of the values");
    const bool four_bit = layout.values4;
    const std::int64_t panels = layout.acc_cols / T::nr, wu = this->weight_units();
    const std::int64_t groups = layout.value_groups(), chunks = layout.weight_chunks();
    // A panel's units: code pairs, pairs(kv_rows) rows of them; or 32-bit words of 8 keys each.
    const std::int64_t stride = (four_bit ? layout.key_rows() / 8 : value_rows()) * T::nr;
    for_row_blocks<T::mr>(0, rows, [&](std::int64_t r, auto R) {
      const std::int64_t kc = block_keys(r, r + R, j0, j1).kc;
      if (kc <= 0) return;  // no keys here for these rows: rescale is 1, nothing to add
      constexpr int block_rows = decltype(R)::value;
      const auto add = [&]<int P>(std::integral_constant<int, P>, std::int64_t p) {
        constexpr int cols = P * T::nr;
        float sums[block_rows * cols];
        const std::int64_t ldo = layout.acc_cols;
        float* o = scratch.accumulators + r * ldo + p * T::nr;
        // Each panel's group of the values (one group with int8).
        std::int64_t group[P];
        for (int q = 0; q < P; ++q) group[q] = four_bit ? (p + q) * T::nr / value4_group : 0;
        for (std::int64_t c0 = 0; c0 < kc; c0 += weight_chunk_keys) {
          const std::int64_t keys = std::min(weight_chunk_keys, kc - c0);
          if (four_bit) {
            const query_pair* a[P];
            for (int q = 0; q < P; ++q) a[q] = weights() + (r * groups + group[q]) * wu + c0 / 2;
            const auto* words = reinterpret_cast<const std::uint32_t*>(v);
            nibble_panels<T, block_rows, P>((keys + 7) / 8, a, groups * wu,
                                            words + p * stride + (j0 + c0) / 8 * T::nr, stride,
                                            sums, cols);
          } else {
            // Panels [p, p + P)'s pair rows from key j0 + c0 (even: a key tile is a multiple of
            // the lanes).
            panels_kernel<T, block_rows, P, Dot, true>(pairs(keys), weights() + r * wu + c0 / 2, wu,
                                                       v + p * stride + (j0 + c0) / 2 * T::nr,
                                                       stride, sums, cols, start_bias<T>{nullptr},
                                                       ahead_rows<T>());
          }
          for (int q = 0; q < P; ++q) {
            const float* s =
                scratch.weight_scales + (r * groups + group[q]) * chunks + c0 / weight_chunk_keys;
            float* oq = o + q * T::nr;
            const float* part = sums + q * T::nr;
            using terms = code_scales<Arch>;
            if (c0 > 0) {
              terms::template add_chunk<T, block_rows, T::nv>(part, cols, s, groups * chunks, oq,
                                                              ldo, start_sum<T>{oq, ldo});
            } else if (j0 == task.key_begin) {
              terms::template add_chunk<T, block_rows, T::nv>(part, cols, s, groups * chunks, oq,
                                                              ldo, start_bias<T>{nullptr});
            } else {
              terms::template add_chunk<T, block_rows, T::nv>(
                  part, cols, s, groups * chunks, oq, ldo,
                  start_scaled<T>{oq, ldo, scratch.rescale + r});
            }
          }
        }
        for (int q = 0; q < P; ++q) {
          code_scales<Arch>::template add_value_offsets<T>(
              scratch.value_offsets + r * groups + group[q], groups, block_rows, o + q * T::nr,
              ldo);
        }
      };
      // A row block too short to hide the latency takes several panels at once.
      for_panel_groups<panels_for<T, block_rows>>(0, panels, add);
    });
  }

  // Row k (key j0 + k) of a V panel as floats, batch c of the tile: fp32 as is, bf16 widened
  // from its half of the pair.
  template <class T>
  static typename T::batch value_row(const panel_unit* panel, std::int64_t k, int c) noexcept {
    using batch = typename T::batch;
    constexpr std::int64_t lanes = batch::size;
    if constexpr (pairs_of_bf16) {
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
      const float* w = scratch.scores + rr * layout.score_cols;
      float* out = o + (rr - r) * layout.acc_cols;
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
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
