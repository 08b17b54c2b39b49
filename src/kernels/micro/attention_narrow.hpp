// Internal: the attention kernel's path for heads of at most narrow_dims dimensions in fp32
// (attention_path::narrow): a register of rows transposed into lanes. Per-ISA
// code: see micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/micro/attention_block.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Heads of at most narrow_dims dimensions in fp32 whose scores go to the softmax as they are (no
// key mask, dropout, soft-cap or sinks) take the rows of a block a register of rows at a time (K
// and V packed, or in place),
// transposed: lane i is row r0 + i, Q^T and O^T are head_dim registers each, and per key one
// register of scores (K's row broadcast against Q^T), so the row maxima and sums are lane-wise,
// never horizontal, and a key's P V is head_dim FMAs with V's row broadcast. At head_dim 8 the
// register tiles of the packed path spent as much time starting and storing their accumulators
// (8 k-steps each) and in row-wise reductions as multiplying. Per key tile: the scores and their
// lane-wise max, the rescale of O and l, then P and P V; keys past a row's causal limit are -inf
// scores and skipped FMAs (masked lanes), never 0 * V. With 16 registers (AVX2, SSE2) Q^T and
// O^T of 8 dimensions fill them, and the compiler takes Q^T from the stack as FMA memory
// operands, and it is still faster (measurements: docs/design.md §5.1).
template <class Arch>
struct narrow_attention : attention_block<Arch, fma_dot> {
  using block = attention_block<Arch, fma_dot>;
  using block::args, block::layout, block::task, block::rows, block::scratch;
  using block::rows_end, block::row_keys, block::head, block::pos;

  const float* kt;  // packed K^T (layout.scores.nr panels), nullptr where K and V are read in place
  const float* v;   // packed V (layout.values.nr panels), nullptr where K and V are read in place

  void run() const noexcept {
    this->start();
    constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
    with_dimension<narrow_dims>(args.head_dim, [&](auto hd) {
      for (std::int64_t r0 = 0; r0 < rows; r0 += lanes) rows_in_lanes<decltype(hd)::value>(r0);
    });
  }

  // Rows [r0, r0 + lanes) (those of them within the block) in the lanes.
  template <int HD>
  void rows_in_lanes(std::int64_t r0) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr int lanes = static_cast<int>(batch::size);
    const int n = static_cast<int>(rows - r0 < lanes ? rows - r0 : lanes);  // rows in the lanes
    const float minus_inf = -std::numeric_limits<float>::infinity();
    // Q^T, and each lane's keys [task.key_begin, limit) (lanes past n: the last row's).
    alignas(64) float staged[HD][lanes];
    alignas(64) float limits[lanes];
    for (int i = 0; i < lanes; ++i) {
      const std::int64_t r = r0 + (i < n ? i : n - 1);
      for (int d = 0; d < HD; ++d) staged[d][i] = i < n ? scratch.queries[r * HD + d] : 0.0f;
      limits[i] = static_cast<float>(task.key_begin + row_keys(r, task.key_begin, task.key_end));
    }
    batch qt[HD];
    for (int d = 0; d < HD; ++d) qt[d] = batch::load_aligned(staged[d]);
    const batch limit = batch::load_aligned(limits);
    // Keys every lane sees: [task.key_begin, common); some lane sees [common, end).
    const std::int64_t end = rows_end(r0, r0 + n);
    const std::int64_t common =
        task.key_begin + (args.causal ? row_keys(r0, task.key_begin, task.key_end) : 0);
    const std::int64_t seen_by_all = args.causal ? common : end;
    // Key j's element d at column[d * key_dim_stride] (column: below), value j's at
    // value_rows[j * value_stride + d]. Packed: K^T in panels of nr keys (element (d, j) at panel j
    // / nr, row d, column j % nr), V's rows whole in its first panel (narrow_dims is no wider than
    // any ISA's narrowest panel), row j at v + j * vr; key tiles, and split-KV chunks, start on a
    // panel. In place (a call of at most direct_rows rows, attention_layout::in_place): K and V
    // rows where they lie, and no packed head exists.
    const std::int64_t nr = layout.scores.nr, vr = layout.values.nr;
    MHA_EXPECTS(HD <= vr && task.key_begin % nr == 0 && layout.key_tile % nr == 0);
    const bool in_place = layout.in_place;
    const std::int64_t key_dim_stride = in_place ? 1 : nr;
    const float* const key_rows = in_place ? args.k.row(task.b, task.g, 0) : nullptr;
    const float* const value_rows = in_place ? args.v.row(task.b, task.g, 0) : v;
    const std::int64_t value_stride = in_place ? args.v.row_stride : vr;
    batch m(minus_inf), sum(0.0f), o[HD];
    for (int d = 0; d < HD; ++d) o[d] = batch(0.0f);
    float* scores = scratch.scores;  // (j1 - j0) registers of one key each
    for (std::int64_t j0 = task.key_begin; j0 < end; j0 += layout.key_tile) {
      const std::int64_t j1 = j0 + layout.key_tile < end ? j0 + layout.key_tile : end;
      batch tile_max(minus_inf);
      for (std::int64_t p0 = j0; p0 < j1; p0 += nr) {
        const float* panel = in_place ? nullptr : kt + p0 * HD;  // panel p0 / nr: HD * nr floats
        const std::int64_t p1 = p0 + nr < j1 ? p0 + nr : j1;
        for (std::int64_t j = p0; j < p1; ++j) {
          const float* column = in_place ? key_rows + j * args.k.row_stride : panel + (j - p0);
          batch x = qt[0] * batch(column[0]);
          for (int d = 1; d < HD; ++d) x = fused_fma(qt[d], batch(column[d * key_dim_stride]), x);
          if (j >= seen_by_all)
            x = xsimd::select(batch(static_cast<float>(j)) < limit, x, batch(minus_inf));
          x.store_aligned(scores + (j - j0) * lanes);
          tile_max = xsimd::max(tile_max, x);
        }
      }
      // A lane with no key yet keeps m = -inf and shifts by 0 (never -inf - -inf).
      const batch next = xsimd::max(m, tile_max);
      const auto none = next == batch(minus_inf);
      const batch shift = xsimd::select(none, batch(0.0f), next);
      const batch rescale = xsimd::select(none, batch(1.0f), exp2_nonpositive<Arch>(m - shift));
      sum *= rescale;
      for (int d = 0; d < HD; ++d) o[d] *= rescale;
      // P and P V: the keys every lane sees, two at a time (their exponentials' dependency
      // chains interleaved), then the diagonal's under the lanes' limits.
      const std::int64_t split = seen_by_all < j0 ? j0 : seen_by_all < j1 ? seen_by_all : j1;
      const auto weight = [&](std::int64_t j) {
        return exp2_nonpositive<Arch>(batch::load_aligned(scores + (j - j0) * lanes) - shift);
      };
      std::int64_t j = j0;
      for (; j + 2 <= split; j += 2) {
        const batch p0 = weight(j), p1 = weight(j + 1);
        const float *v0 = value_rows + j * value_stride, *v1 = v0 + value_stride;
        sum += p0;
        sum += p1;
        for (int d = 0; d < HD; ++d)
          o[d] = fused_fma(p1, batch(v1[d]), fused_fma(p0, batch(v0[d]), o[d]));
      }
      for (; j < j1; ++j) {
        const batch p = weight(j);
        const float* value = value_rows + j * value_stride;
        sum += p;
        if (j < seen_by_all) {
          for (int d = 0; d < HD; ++d) o[d] = fused_fma(p, batch(value[d]), o[d]);
        } else {
          const auto seen = batch(static_cast<float>(j)) < limit;
          for (int d = 0; d < HD; ++d)
            o[d] = xsimd::select(seen, fused_fma(p, batch(value[d]), o[d]), o[d]);
        }
      }
      m = next;
    }
    // Out: O / l per row; or a split's chunk: O, m and l (zeros, -inf and 0 for a row that sees
    // no key of the chunk, as the lanes hold then).
    for (int d = 0; d < HD; ++d) o[d].store_aligned(staged[d]);
    alignas(64) float maxima[lanes], sums[lanes];
    m.store_aligned(maxima);
    sum.store_aligned(sums);
    for (int i = 0; i < n; ++i) {
      const std::int64_t r = r0 + i;
      if (task.partial != nullptr) {
        float* part = task.partial + (task.row_begin * layout.group + r) * (HD + 2);
        for (int d = 0; d < HD; ++d) part[d] = staged[d][i];
        part[HD] = maxima[i];
        part[HD + 1] = sums[i];
      } else {
        const float f = 1.0f / sums[i];
        float* out = args.out.row(task.b, head(r), pos(r));
        for (int d = 0; d < HD; ++d) out[d] = staged[d][i] * f;
      }
    }
  }
};

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
