// The attention framework of the SIMD kernels: the geometry of the fused kernel, packing a head,
// the per-thread workspace and the single-threaded loop. Compiled with the baseline flags.
#include "simd/attention.hpp"

#include <algorithm>
#include <numeric>

#include "simd/isa_kernels.hpp"

namespace mha::detail {
namespace {

// Scratch parts start on a cache line (and an AVX-512 register boundary).
constexpr std::int64_t line_floats = 16;

// Query rows per attention block. Attention alone (head-major Q, K, V), one core, median ms
// over 9 runs at (B, T, H, head_dim) = (1, 1024, 12, 64) / (1, 4096, 12, 64) / (1, 256, 96, 8),
// key tile 512, by rows per block:
//   32: 17.3 / 255 / 2.39   64: 17.2 / 254 / 2.44   96: 17.2 / 255 / 2.34   128: 17.2 / 258 / 2.34
// Within noise; 64 also makes enough parallel tasks (12 heads x 16 blocks at T = 1024).
constexpr std::int64_t attention_block_rows = 64;

}  // namespace

std::int64_t attention_layout::values_offset() const noexcept {
  return round_up(packed_size(head_dim, keys, scores.nr), line_floats);
}

std::int64_t attention_layout::head_floats() const noexcept {
  return values_offset() + packed_size(keys, head_dim, values.nr);
}

std::int64_t attention_layout::scratch_floats() const noexcept {
  // Row statistics have room for whole registers (exp2_sum runs over them).
  const std::int64_t row_floats = round_up(padded_rows, line_floats);
  return round_up(padded_rows * head_dim, line_floats) +
         round_up(padded_rows * score_cols, line_floats) +
         round_up(padded_rows * acc_cols, line_floats) + 3 * row_floats +
         round_up(score_cols, line_floats);
}

attention_scratch attention_layout::scratch_parts(float* scratch) const noexcept {
  const std::int64_t row_floats = round_up(padded_rows, line_floats);
  attention_scratch parts{};
  parts.queries = scratch;
  parts.scores = parts.queries + round_up(padded_rows * head_dim, line_floats);
  parts.accumulators = parts.scores + round_up(padded_rows * score_cols, line_floats);
  parts.row_max = parts.accumulators + round_up(padded_rows * acc_cols, line_floats);
  parts.row_sum = parts.row_max + row_floats;
  parts.rescale = parts.row_sum + row_floats;
  parts.dropout = parts.rescale + row_floats;
  return parts;
}

void pack_head(const attention_args& args, const attention_layout& layout, std::int64_t b,
               std::int64_t h, float* head) noexcept {
  // K^T (head_dim, keys): element (d, j) is K[j][d]. A transpose copy, and worth it: S = Q K^T
  // of one (1024, 64) head on the split form's strided rows took 1.4 ms packing included, the
  // transpose-free form (4x4 blocks of dot products over head_dim, one horizontal add per
  // score) 2.7 ms (Zen4, AVX-512).
  pack_panels(args.k.row(b, h, 0), layout.head_dim, layout.keys, /*stride_k=*/1,
              args.k.row_stride, layout.scores.nr, head);
  // V (keys, head_dim) as it is.
  pack_panels(args.v.row(b, h, 0), layout.keys, layout.head_dim, args.v.row_stride,
              /*stride_n=*/1, layout.values.nr, head + layout.values_offset());
}

attention_layout isa_kernels::layout(std::int64_t seq_len, std::int64_t keys,
                                     std::int64_t head_dim, std::int64_t key_tile) const noexcept {
  attention_layout l;
  l.scores = tiles[0];
  l.values = tile_for(panel_width(head_dim));
  l.seq_len = seq_len;
  l.keys = keys;
  l.head_dim = head_dim;
  l.block_rows = std::min(seq_len, attention_block_rows);
  l.padded_rows =
      std::max(round_up(l.block_rows, l.scores.mr), round_up(l.block_rows, l.values.mr));
  // Key tiles start on a K^T panel, and the softmax reads rows as whole registers: both a
  // multiple of the lanes and of the scores panel width.
  const std::int64_t step = std::lcm(l.scores.nr, lanes);
  l.key_tile = round_up(std::max<std::int64_t>(key_tile, 1), step);
  l.score_cols = std::min(l.key_tile, round_up(keys, step));
  l.acc_cols = round_up(head_dim, l.values.nr);
  return l;
}

attention_workspace::attention_workspace(const attention_layout& layout)
    : layout_(layout),
      head_(static_cast<std::size_t>(layout.head_floats())),
      scratch_(static_cast<std::size_t>(layout.scratch_floats())) {}

void attention_workspace::run_block(const isa_kernels& kernels, const attention_args& args,
                                    std::int64_t b, std::int64_t h, std::int64_t block) noexcept {
  if (const std::int64_t head = b * args.heads + h; head != packed_) {
    pack_head(args, layout_, b, h, head_.data());
    packed_ = head;
  }
  const std::int64_t first = block * layout_.block_rows;
  kernels.attention_rows(args, layout_, head_.data(), b, h, first,
                         std::min(first + layout_.block_rows, args.seq_len), scratch_.data());
}

void attention(const isa_kernels& kernels, const attention_args& args, std::int64_t key_tile) {
  const attention_layout layout = kernels.layout(args.seq_len, args.keys(), args.head_dim, key_tile);
  attention_workspace workspace(layout);
  for (std::int64_t b = 0; b < args.batch; ++b) {
    for (std::int64_t h = 0; h < args.heads; ++h) {
      for (std::int64_t block = 0; block < layout.blocks(); ++block)
        workspace.run_block(kernels, args, b, h, block);
    }
  }
}

}  // namespace mha::detail
