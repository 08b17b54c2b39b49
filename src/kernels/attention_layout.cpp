// The geometry of the SIMD kernels' attention (attention_layout, isa_kernels::layout): panel
// widths, query blocks, key tiles, the kernel's path, where a packed head's parts lie and each
// workspace's parts. Compiled with the baseline flags.
#include <algorithm>
#include <numeric>

#include "base/int8.hpp"
#include "base/key4.hpp"
#include "base/value4.hpp"
#include "kernels/interface/attention.hpp"
#include "kernels/interface/isa_kernels.hpp"

namespace mha::detail {
namespace {

// Scratch parts start on a cache line (and an AVX-512 register boundary).
constexpr std::int64_t line_floats = 16, line_bytes = 64;
// Strides of a multiple of this many floats (1 KiB) put rows into few L1 sets: with 64 sets of
// 64-byte lines, rows 2 KiB apart fall in 2 of them.
constexpr std::int64_t set_aliasing_floats = 256;

// Query rows per attention block (positions x grouped heads): 32 to 128 run alike (measurements:
// docs/design.md §5.1); 64 also makes enough parallel tasks (12 heads x 16 blocks at T = 1024).
constexpr std::int64_t attention_block_rows = 64;

}  // namespace

std::int64_t attention_layout::value_groups() const noexcept {
  return values4 ? value4_groups(head_dim) : 1;
}

std::int64_t attention_layout::key_words() const noexcept {
  return keys4 ? key_rows() / key4_group * head_dim : key_rows();
}

std::int64_t attention_layout::query_units() const noexcept {
  return keys4 ? 4 * key4_words(head_dim) : pairs(head_dim);
}

std::int64_t attention_layout::values_offset() const noexcept {
  if (keys4) return round_up(4 * key4_words(head_dim) * key_rows(), line_bytes);
  if (int8) return round_up(2 * pairs(head_dim) * round_up(kv_rows, scores.nr), line_bytes);
  const std::int64_t keys_units = bf16 ? pairs(head_dim) * round_up(kv_rows, scores.nr)
                                       : packed_size(head_dim, kv_rows, scores.nr);
  return round_up(keys_units, line_floats);
}

std::int64_t attention_layout::head_units() const noexcept {
  if (int8) return head_bytes();
  return values_offset() + (bf16 ? pairs(kv_rows) * round_up(head_dim, values.nr)
                                 : packed_size(kv_rows, head_dim, values.nr));
}

std::int64_t attention_layout::scales_offset() const noexcept {
  const std::int64_t value_bytes =
      values4 ? acc_cols * key_rows() / 2 : 2 * pairs(kv_rows) * round_up(head_dim, values.nr);
  return round_up(values_offset() + value_bytes, line_bytes);
}

std::int64_t attention_layout::channels_offset() const noexcept {
  return round_up(scales_offset() +
                      (key_words() + value_groups() * key_rows()) * std::int64_t{sizeof(int8_row)},
                  line_bytes);
}

std::int64_t attention_layout::head_bytes() const noexcept {
  // Floats and bf16 pairs are both 4 bytes.
  // keys4: its recent exact keys where the channel scales would be (base/key4.hpp).
  if (keys4) return channels_offset() + key4_recent_bytes(head_dim);
  return int8 ? channels_offset() + head_dim * std::int64_t{sizeof(float)} : head_units() * 4;
}

std::int64_t attention_layout::key_bytes() const noexcept {
  const std::int64_t elements = head_dim + round_up(head_dim, values.nr);
  if (keys4) {  // a key's codes and its share of its group's channel words, a value as k8v4's
    return 4 * key4_words(head_dim) + head_dim * std::int64_t{sizeof(value4_row)} / key4_group +
           round_up(head_dim, values.nr) / 2 + value_groups() * std::int64_t{sizeof(value4_row)};
  }
  if (values4) {
    return head_dim + round_up(head_dim, values.nr) / 2 +
           (1 + value_groups()) * std::int64_t{sizeof(int8_row)};
  }
  if (int8) return elements + 2 * std::int64_t{sizeof(int8_row)};
  return (bf16 ? 2 : 4) * elements;
}

std::int64_t attention_layout::weight_chunks() const noexcept {
  return (score_cols + weight_chunk_keys - 1) / weight_chunk_keys;
}

std::int64_t attention_layout::score_floats() const noexcept {
  // Rows for a whole register of rows at least: the narrow-head kernel keeps one key's scores
  // of a register of rows (line_floats, the most lanes) per key.
  return round_up(block_rows, line_floats) * score_cols;
}

std::int64_t attention_layout::scratch_floats() const noexcept {
  // Row statistics have room for whole registers (exp2_sum runs over them).
  const std::int64_t row_floats = round_up(block_rows, line_floats);
  const std::int64_t pair_parts = bf16 ? round_up(block_rows * pairs(head_dim), line_floats) +
                                             round_up(block_rows * pairs(score_cols), line_floats)
                                       : 0;
  const std::int64_t groups = value_groups();
  const std::int64_t code_parts =
      int8 ? 2 * row_floats + round_up(block_rows * groups, line_floats) +
                 round_up(block_rows * query_units(), line_floats) +
                 round_up(block_rows * groups * pairs(score_cols), line_floats) +
                 round_up(block_rows * groups * weight_chunks(), line_floats)
           : 0;
  return round_up(block_rows * head_dim, line_floats) + score_floats() +
         round_up(block_rows * acc_cols, line_floats) + 3 * row_floats +
         round_up(score_cols, line_floats) + pair_parts + code_parts;
}

attention_scratch attention_layout::scratch_parts(float* scratch) const noexcept {
  const std::int64_t row_floats = round_up(block_rows, line_floats);
  attention_scratch parts{};
  parts.queries = scratch;
  parts.scores = parts.queries + round_up(block_rows * head_dim, line_floats);
  parts.accumulators = parts.scores + score_floats();
  parts.row_max = parts.accumulators + round_up(block_rows * acc_cols, line_floats);
  parts.row_sum = parts.row_max + row_floats;
  parts.rescale = parts.row_sum + row_floats;
  parts.dropout = parts.rescale + row_floats;
  if (bf16) {
    // 32-bit words in float storage the fp32 parts never touch.
    float* pairs_start = parts.dropout + round_up(score_cols, line_floats);
    parts.query_pairs = reinterpret_cast<bf16_pair*>(pairs_start);
    parts.weight_pairs = parts.query_pairs + round_up(block_rows * pairs(head_dim), line_floats);
  }
  if (int8) {
    const std::int64_t groups = value_groups();
    parts.query_sums = parts.dropout + round_up(score_cols, line_floats);
    parts.query_scales = parts.query_sums + row_floats;
    parts.value_offsets = parts.query_scales + row_floats;
    // 32-bit integers in float storage the fp32 parts never touch.
    float* codes_start = parts.value_offsets + round_up(block_rows * groups, line_floats);
    parts.query_codes = reinterpret_cast<std::int32_t*>(codes_start);
    float* weights_start = codes_start + round_up(block_rows * query_units(), line_floats);
    parts.weight_codes = reinterpret_cast<std::int32_t*>(weights_start);
    parts.weight_scales =
        weights_start + round_up(block_rows * groups * pairs(score_cols), line_floats);
  }
  return parts;
}

attention_layout isa_kernels::layout(const attention_request& r) const noexcept {
  const auto [seq_len, keys, head_dim, key_tile, kv_rows, group, bf16_operands, int8_codes,
              four_bit_values, four_bit_keys, in_place, plain_scores] = r;
  attention_layout l;
  l.int8 = int8_codes;
  l.values4 = int8_codes && four_bit_values;
  l.keys4 = l.values4 && four_bit_keys;
  l.bf16 = bf16_operands && !int8_codes;
  l.scores = tiles[0];
  // Heads packed per call (no cache) take V panels wide enough for tile products; a cache keeps
  // the narrowest panels, whose bytes a decode step reads.
  const int width = panel_width(head_dim);
  const bool widen = l.bf16 && kv_rows == 0 && width < pair_tile_cols;
  l.values = tile_for(widen ? pair_tile_cols : width);
  l.seq_len = seq_len;
  l.group = group;
  l.keys = keys;
  l.kv_rows = kv_rows > 0 ? kv_rows : keys;
  l.head_dim = head_dim;
  l.block_positions = std::min(seq_len, std::max<std::int64_t>(attention_block_rows / group, 1));
  l.block_rows = l.block_positions * group;
  // Key tiles start on a K^T panel, and the softmax reads rows as whole registers: both a
  // multiple of the lanes and of the scores panel width.
  // 4-bit values: a multiple of 8 keys too (a word row of their codes); 4-bit keys: of a channel
  // group (key4_group keys: a tile's groups are whole).
  l.key_step = std::lcm(std::lcm(l.scores.nr, lanes), l.keys4 ? key4_group : l.values4 ? 8 : 1);
  l.key_tile = round_up(std::max<std::int64_t>(key_tile, 1), l.key_step);
  // The scores' row stride: two lines more where it would be a multiple of 1 KiB, so that the
  // rows of P's pairs (half as wide) stay whole lines and neither falls into few L1 sets: at 512
  // keys a 2 x 2 tile block's 64 lines fell into 4 sets of 12 ways (docs/design.md §5.1).
  l.score_cols = std::min(l.key_tile, round_up(keys, l.key_step));
  if (l.score_cols % set_aliasing_floats == 0) l.score_cols += 2 * line_floats;
  l.acc_cols = round_up(head_dim, l.values.nr);
  l.in_place = in_place && l.block_rows <= direct_rows;
  if (l.int8) {
    l.path = attention_path::codes;
  } else if (!l.bf16 && head_dim <= narrow_dims && plain_scores) {
    l.path = attention_path::narrow;
  } else if (l.in_place) {
    l.path = attention_path::direct;
  } else {
    l.path = l.bf16 && pair_tile_cols > 0 && l.block_rows > 1 ? attention_path::tiles
                                                              : attention_path::packed;
  }
  return l;
}

std::int64_t cache_head_bytes(const isa_kernels& kernels, std::int64_t capacity,
                              std::int64_t head_dim, bool bf16_operands, precision kv) noexcept {
  attention_request request{.seq_len = 1,
                            .keys = capacity,
                            .head_dim = head_dim,
                            .kv_rows = capacity,
                            .bf16_operands = bf16_operands};
  return kernels.layout(request.cache_format(kv)).head_bytes();
}

}  // namespace mha::detail
