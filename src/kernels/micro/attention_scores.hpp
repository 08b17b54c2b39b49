// Internal: what the attention function does to a key tile's scores after Q K^T, before the
// softmax (docs/design.md §1.9): soft-capping, a mask, a window, over a block's rows
// (attention_block::adjust_scores: Block is an attention_block). Per-ISA code: see
// micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#include "common/attention_args.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// Soft-capping: each row's scores of keys [j0, j1), up to its own keys, become
// softcap tanh(s / softcap) of their natural-log value s, written back in the units the mask
// and the softmax then read: base 2, halved with a mask (bf16's raw scores take their scale
// here, so that score_scale() is 1 and mask_scores adds to them as to fp32's).
template <class Block>
void cap_scores(const Block& block, std::int64_t j0, std::int64_t j1) noexcept {
  const auto& [args, layout, task, rows, scratch] =
      std::tie(block.args, block.layout, block.task, block.rows, block.scratch);
  constexpr float log2e = 1.44269504088896341f;
  const float units = args.mask.active() ? 0.5f * log2e : log2e;  // per natural-log unit
  const float to_natural = Block::pairs_of_bf16 ? args.scale : 1.0f / units;
  const float cap = args.softcap, inverse = 1.0f / cap;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t len = block.row_keys(r, j0, j1);
    float* p = scratch.scores + r * layout.score_cols;
    for (std::int64_t j = 0; j < len; ++j)
      p[j] = units * cap * std::tanh(p[j] * to_natural * inverse);
  }
}

// A window: each row's scores of the keys of [j0, j1) before its window's first are -inf (the
// softmax's guards then keep a row that has no key of the tile at weights 0).
template <class Block>
void window_scores(const Block& block, std::int64_t j0, std::int64_t j1) noexcept {
  const auto& [args, layout, task, rows, scratch] =
      std::tie(block.args, block.layout, block.task, block.rows, block.scratch);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t len = block.row_keys(r, j0, j1);
    const std::int64_t before = args.window_begin(task.past + block.pos(r)) - j0;
    const std::int64_t n = before < len ? before : len;
    float* p = scratch.scores + r * layout.score_cols;
    if (n > 0) std::fill(p, p + n, -std::numeric_limits<float>::infinity());
  }
}

// With a mask (mha::attention): each row's scores of keys [j0, j1), up to its own keys, gain
// the mask's values in base 2 (boolean: false sets -inf), both halved (exactly: a power of
// two; score_mask::exponent_scale: fp32's queries carry the half); bf16's raw scores take
// their scale first (unless cap_scores did), so that both terms meet in base 2 (the softmax
// then reads them at scale 1).
template <class Block>
void mask_scores(const Block& block, std::int64_t j0, std::int64_t j1) noexcept {
  const auto& [args, layout, task, rows, scratch] =
      std::tie(block.args, block.layout, block.task, block.rows, block.scratch);
  constexpr float half_log2e = 0.5f * 1.44269504088896341f;
  const float raw = Block::pairs_of_bf16 && args.softcap == 0.0f
                        ? 0.5f * args.scale * 1.44269504088896341f
                        : 1.0f;
  const score_mask& m = args.mask;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t len = block.row_keys(r, j0, j1);
    float* p = scratch.scores + r * layout.score_cols;
    const std::int64_t at = m.offset(task.b, block.head(r), block.pos(r)) + j0;
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

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
