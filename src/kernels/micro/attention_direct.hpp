// Internal: the attention kernel's direct path (attention_path::direct: a layout in place, fp32
// or bf16 operands): K and V read where they lie, not packed. Per-ISA code: see
// micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/micro/attention_block.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// K and V are fp32 rows of head_dim in args.k and args.v, or, in a bf16 call on bfloat16
// operands, bf16 rows in args.k16 and args.v16 (each value already a bf16, so nothing is
// rounded). Per key tile, each row's scores as vectors of `lanes` keys: one register of products
// per key over head_dim (bf16: Dot's product of the query's pairs and the key row's, which are
// pairs as they lie), summed across their lanes at once (lane_sums); then the mask and softmax as
// the packed path's; then O = O * rescale + P V with V's rows broadcast weights (bf16: rounded),
// key by key up to each row's own limit (never 0 * V past it). Dimensions past the whole
// registers go one at a time. A block of at most direct_rows rows (attention_layout) reads each
// key once, where packing the head would cost as much memory traffic as reading it.
template <class Arch, class Dot>
struct direct_attention : attention_block<Arch, Dot> {
  using block = attention_block<Arch, Dot>;
  using block::args, block::layout, block::task, block::rows, block::scratch;
  using block::pairs_of_bf16;
  using block::row_keys;

  void run() const noexcept {
    this->start();
    const std::int64_t key_end = this->rows_end(0, rows);
    for (std::int64_t j0 = task.key_begin; j0 < key_end; j0 += layout.key_tile) {
      const std::int64_t j1 = j0 + layout.key_tile < key_end ? j0 + layout.key_tile : key_end;
      scores(j0, j1);
      this->adjust_scores(j0, j1);
      // Each row reads its own keys' weights only, as floats.
      this->softmax(j0, j1, weights_use{});
      values(j0, j1);
    }
    if constexpr (pairs_of_bf16) order();
    this->store();
  }

  using unit_in_place = std::conditional_t<pairs_of_bf16, bf16, float>;
  static constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
  // Dimensions per register step over a row: a register of floats, or of bf16 pairs.
  static constexpr std::int64_t step_dims = (pairs_of_bf16 ? 2 : 1) * lanes;

  const unit_in_place* key_row(std::int64_t j) const noexcept {
    if constexpr (pairs_of_bf16) {
      return args.k16.row(task.b, task.g, j);
    } else {
      return args.k.row(task.b, task.g, j);
    }
  }
  const unit_in_place* value_row(std::int64_t j) const noexcept {
    if constexpr (pairs_of_bf16) {
      return args.v16.row(task.b, task.g, j);
    } else {
      return args.v.row(task.b, task.g, j);
    }
  }
  static float element(const unit_in_place* row, std::int64_t d) noexcept {
    if constexpr (pairs_of_bf16) {
      return from_bf16(row[d]);
    } else {
      return row[d];
    }
  }
  // acc + the products of row r's query and `key` over dimensions [d, d + step_dims).
  xsimd::batch<float, Arch> product(std::int64_t r, const unit_in_place* key, std::int64_t d,
                                    xsimd::batch<float, Arch> acc) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    if constexpr (pairs_of_bf16) {
      const auto* q = scratch.query_pairs + r * pairs(args.head_dim) + d / 2;
      const auto* k = reinterpret_cast<const bf16_pair*>(key + d);
      return Dot::dot(acc, Dot::template load_b<Arch>(q), Dot::template load_b<Arch>(k));
    } else {
      return fused_fma(batch::load_unaligned(scratch.queries + r * args.head_dim + d),
                       batch::load_unaligned(key + d), acc);
    }
  }
  // V's row j widened: O's registers of dimensions [d, d + step_dims) gain w times it (bf16:
  // two registers, the even dimensions' then the odd ones').
  template <class Batch>
  static void value_step(const unit_in_place* value, std::int64_t d, Batch w, Batch* o) noexcept {
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

  void scores(std::int64_t j0, std::int64_t j1) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    const std::int64_t hd = args.head_dim, whole = hd / step_dims * step_dims;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      const float* q = scratch.queries + r * hd;
      float* out = scratch.scores + r * layout.score_cols;
      std::int64_t j = 0;
      if (whole == hd) {
        // `lanes` keys at a time, head_dim a compile-time count of steps where it is small.
        with_dimension<registers / units>(
            hd / step_dims, [&](auto n) { j = score_keys<decltype(n)::value>(r, j0, len); });
      }
      for (; j < len; ++j) {
        const unit_in_place* k = key_row(j0 + j);
        batch acc(0.0f);
        for (std::int64_t d = 0; d < whole; d += step_dims) acc = product(r, k, d, acc);
        float sum = xsimd::hadd(acc);
        for (std::int64_t d = whole; d < hd; ++d) sum = std::fma(q[d], element(k, d), sum);
        out[j] = sum;
      }
    }
  }
  // Row r's scores of keys [j0, j0 + len) `lanes` at a time, over N steps of head_dim; returns
  // the keys done (the rest are fewer than the lanes).
  template <int N>
  std::int64_t score_keys(std::int64_t r, std::int64_t j0, std::int64_t len) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    float* out = scratch.scores + r * layout.score_cols;
    std::int64_t j = 0;
    for (; j + lanes <= len; j += lanes) {
      batch acc[lanes];
      for (std::int64_t i = 0; i < lanes; ++i) {
        const unit_in_place* k = key_row(j0 + j + i);
        acc[i] = product(r, k, 0, batch(0.0f));
        for (int step = 1; step < N; ++step) acc[i] = product(r, k, step * step_dims, acc[i]);
      }
      lane_sums<Arch>(acc).store_unaligned(out + j);
    }
    return j;
  }

  // O's registers per row at most (the rest of the 16 or 32 being V's and a weight).
  static constexpr int registers = lanes >= 16 ? 16 : 8;
  static constexpr int units = pairs_of_bf16 ? 2 : 1;  // O's registers per step

  // Rows whose O is held in registers at once, over `steps` register steps of head_dim.
  static constexpr int register_rows(std::int64_t steps) noexcept {
    return static_cast<int>(registers / (steps * units));
  }
  // Dimension steps of O kept in registers by values (0: none, head_dim is too wide).
  std::int64_t register_steps() const noexcept {
    const std::int64_t steps = args.head_dim / step_dims;
    return steps * units <= registers ? steps : 0;
  }

  // Over the register steps' dimensions, bf16's O holds each step's even dimensions, then its
  // odd ones, until order puts them in order after the last key tile.
  void values(std::int64_t j0, std::int64_t j1) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    const std::int64_t hd = args.head_dim, steps = register_steps();
    const std::int64_t done = steps * step_dims;
    const bool first = j0 == task.key_begin;
    for (std::int64_t r = 0; r < rows; ++r) {
      float* o = scratch.accumulators + r * layout.acc_cols;
      for (std::int64_t d = 0; d < hd; ++d) o[d] = first ? 0.0f : o[d] * scratch.rescale[r];
    }
    if constexpr (pairs_of_bf16) {  // the weights as P V's operands, once
      for (std::int64_t r = 0; r < rows; ++r) {
        float* p = scratch.scores + r * layout.score_cols;
        const std::int64_t len = row_keys(r, j0, j1);
        for (std::int64_t j = 0; j < len; ++j) p[j] = round_bf16(p[j]);
      }
    }
    // The register steps with O in registers: rows a few at a time, each V row widened once
    // for them, over the keys they all see; then each row's own further keys, and the
    // dimensions past the register steps, in memory.
    with_dimension<registers / units>(steps, [&](auto n) {
      constexpr int N = decltype(n)::value, R = register_rows(N);
      for (std::int64_t r = 0; r < rows; r += R) {
        with_dimension<R>(rows - r < R ? rows - r : R,
                          [&](auto m) { values_in_registers<N, decltype(m)::value>(r, j0, j1); });
      }
    });
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t len = row_keys(r, j0, j1);
      const std::int64_t from = steps > 0 ? common_keys(r, j0, j1) : 0;
      float* o = scratch.accumulators + r * layout.acc_cols;
      const float* p = scratch.scores + r * layout.score_cols;
      for (std::int64_t j = done < hd ? 0 : from; j < len; ++j) {
        const unit_in_place* value = value_row(j0 + j);
        const float weight = p[j];
        if (j >= from) {
          for (std::int64_t d = 0; d < done; d += step_dims) {
            batch acc[units];
            for (int u = 0; u < units; ++u) acc[u] = batch::load_unaligned(o + d + u * lanes);
            value_step(value, d, batch(weight), acc);
            for (int u = 0; u < units; ++u) acc[u].store_unaligned(o + d + u * lanes);
          }
        }
        for (std::int64_t d = done; d < hd; ++d) o[d] = std::fma(weight, element(value, d), o[d]);
      }
    }
  }

  // Keys of [j0, j1) that every row of the register block of row r sees (the block's first row's:
  // positions, and so limits, do not decrease with the row).
  std::int64_t common_keys(std::int64_t r, std::int64_t j0, std::int64_t j1) const noexcept {
    const std::int64_t R = register_rows(args.head_dim / step_dims);
    const std::int64_t keys = row_keys(r / R * R, j0, j1);
    return keys < 0 ? 0 : keys;
  }

  // O[r0, r0 + R) over dimensions [0, N * step_dims) gains P V of the keys all R rows see, in
  // registers.
  template <int N, int R>
  void values_in_registers(std::int64_t r0, std::int64_t j0, std::int64_t j1) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    batch o[R][N * units];
    const std::int64_t keys = common_keys(r0, j0, j1);
    for (int i = 0; i < R; ++i) {
      for (int u = 0; u < N * units; ++u)
        o[i][u] =
            batch::load_unaligned(scratch.accumulators + (r0 + i) * layout.acc_cols + u * lanes);
    }
    for (std::int64_t j = 0; j < keys; ++j) {
      const unit_in_place* value = value_row(j0 + j);
      for (int i = 0; i < R; ++i) {
        const batch w(scratch.scores[(r0 + i) * layout.score_cols + j]);
        for (int step = 0; step < N; ++step)
          value_step(value, step * step_dims, w, o[i] + step * units);
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int u = 0; u < N * units; ++u)
        o[i][u].store_unaligned(scratch.accumulators + (r0 + i) * layout.acc_cols + u * lanes);
    }
  }

  // bf16: O's register steps' dimensions back in order (each step's even dimensions, then its
  // odd ones, as value_step leaves them).
  void order() const noexcept {
    const std::int64_t whole = register_steps() * step_dims;
    float halves[step_dims];
    for (std::int64_t r = 0; r < rows; ++r) {
      float* o = scratch.accumulators + r * layout.acc_cols;
      for (std::int64_t d = 0; d < whole; d += step_dims) {
        std::copy(o + d, o + d + step_dims, halves);
        for (std::int64_t i = 0; i < lanes; ++i) {
          o[d + 2 * i] = halves[i];
          o[d + 2 * i + 1] = halves[lanes + i];
        }
      }
    }
  }
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
