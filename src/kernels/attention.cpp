// The attention framework of the SIMD kernels: the geometry of the fused kernel, packing a head
// (into a workspace or a KV cache), the per-thread workspace, the schedule of a call and its
// single-threaded loop. Compiled with the baseline flags.
#include "kernels/interface/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "base/checks.hpp"
#include "base/int8.hpp"
#include "base/key4.hpp"
#include "base/value4.hpp"
#include "kernels/interface/isa_kernels.hpp"

namespace mha::detail {
namespace {

// Scratch parts start on a cache line (and an AVX-512 register boundary).
constexpr std::int64_t line_floats = 16, line_bytes = 64;

// Query rows per attention block (positions x grouped heads): 32 to 128 run alike (measurements:
// docs/design.md §5.1); 64 also makes enough parallel tasks (12 heads x 16 blocks at T = 1024).
constexpr std::int64_t attention_block_rows = 64;

// Value row j (value[0, head_dim)) of a k8v4 layout: each group turned and coded
// (quantize_group), its word into value_words[group * key_rows() + j], its codes into the 4-bit
// panels at `panels` (attention_layout: word (j / 8, d % nr) of panel d / nr, bits 4 ((j % 8) /
// 2) + 16 (j % 2)), each nibble replaced (a truncated cache's old codes may lie there).
void pack_value4(const attention_layout& l, const float* value, std::int64_t j,
                 std::uint8_t* panels, int8_row* value_words) noexcept {
  const std::int64_t vr = l.values.nr, panel_words = l.key_rows() / 8 * vr;
  auto* words = reinterpret_cast<std::uint32_t*>(panels);
  const int shift = static_cast<int>(4 * ((j % 8) / 2) + 16 * (j % 2));
  std::uint8_t codes[value4_group];
  for (std::int64_t g = 0; g < l.value_groups(); ++g) {
    const std::int64_t at = g * value4_group, n = value4_group_size(l.head_dim, g);
    value_words[g * l.key_rows() + j] = {quantize_group(value + at, n, codes).word};
    for (std::int64_t c = 0; c < n; ++c) {
      const std::int64_t d = at + c;
      std::uint32_t& word = words[d / vr * panel_words + j / 8 * vr + d % vr];
      word = (word & ~(std::uint32_t{15} << shift)) | std::uint32_t{codes[c]} << shift;
    }
  }
}

// Keys [j0, j1) of a packed head at `head` from K/V head g of sequence b of args (its rows 0,
// 1, ... of args.k and args.v), rounded to bf16 pairs in a bf16 layout; in an int8 layout coded
// over the head's key channel scales, which the sequence's first keys (`first`) set.
void pack_keys(const isa_kernels& kernels, const attention_args& args, const attention_layout& l,
               std::int64_t b, std::int64_t g, std::int64_t j0, std::int64_t j1, void* head,
               bool first) noexcept {
  // K^T (head_dim, kv_rows): element (d, j) is K[j][d]. A transpose copy, and worth it: half the
  // time of the transpose-free form, dot products over head_dim with a horizontal add per score
  // (measurements: docs/design.md §5.1). V (kv_rows, head_dim) as it is.
  MHA_EXPECTS(!args.bf16_operands());  // a cache takes float keys and values
  const float *k = args.k.row(b, g, 0), *v = args.v.row(b, g, 0);
  if (l.int8) {
    // Codes in the panels' places (K^T in pairs along head_dim, V in pairs along keys, as
    // code_pair_dot reads them), each row's scale and zero in the arrays after them.
    std::uint8_t* codes = static_cast<std::uint8_t*>(head);
    int8_row* scales = reinterpret_cast<int8_row*>(codes + l.scales_offset());
    float* channels = reinterpret_cast<float*>(codes + l.channels_offset());
    if (first)
      key_channel_scales(k, args.channel_scale_rows(), args.k.row_stride, l.head_dim, channels);
    const std::int64_t rows = l.key_rows(), kr = l.scores.nr, vr = l.values.nr;
    const std::int64_t key_panel = 2 * pairs(l.head_dim) * kr;  // bytes of a K^T panel
    // Each row's codes a chunk at a time into `chunk` (contiguous floats to contiguous bytes, a
    // loop the compiler vectorises), then into their places: K^T two bytes per pair row, V a
    // panel's width at a time. Element by element with d / 2, d % 2, d / vr and d % vr (divisions
    // by values known only here) it took 9.6 us of a 12-head decode step's 55 (Zen3).
    const std::int64_t value_panel = 2 * pairs(l.kv_rows) * vr;  // bytes of a V panel
    constexpr std::int64_t chunk_codes = 64;  // even: a K^T pair never straddles two chunks
    std::uint8_t chunk[chunk_codes];
    for (std::int64_t j = j0; j < j1; ++j) {
      // Row j - j0 of the new keys, over the channel scales (scaled_key, as they are read).
      const float* key = k + (j - j0) * args.k.row_stride;
      const int8_row ks =
          row_scale([&](std::int64_t d) { return scaled_key(key, channels, d); }, l.head_dim);
      const int8_encoder key_code(ks);
      // Element (d, j) of K^T: panel j / kr, pair row d / 2, key j % kr, byte d % 2.
      std::uint8_t* column = codes + j / kr * key_panel + 2 * (j % kr);
      float part[chunk_codes];
      for (std::int64_t d0 = 0; d0 < l.head_dim; d0 += chunk_codes) {
        const std::int64_t n = std::min(chunk_codes, l.head_dim - d0);
        for (std::int64_t c = 0; c < n; ++c) part[c] = scaled_key(key, channels, d0 + c);
        key_code(part, n, chunk);
        for (std::int64_t c = 0; c < n; c += 2, column += 2 * kr) {
          column[0] = chunk[c];
          if (c + 1 < n) column[1] = chunk[c + 1];
        }
      }
      scales[j] = ks;
      const float* value = v + (j - j0) * args.v.row_stride;
      if (l.values4) {
        pack_value4(l, value, j, codes + l.values_offset(), scales + l.key_words());
        continue;
      }
      // Element (j, d) of V: panel d / vr, pair row j / 2, column d % vr, byte j % 2.
      const int8_row vs = row_scale(value, l.head_dim);
      const int8_encoder value_code(vs);
      std::uint8_t* row = codes + l.values_offset() + j / 2 * 2 * vr + j % 2;
      std::int64_t column_in_panel = 0;
      for (std::int64_t d0 = 0; d0 < l.head_dim; d0 += chunk_codes) {
        const std::int64_t n = std::min(chunk_codes, l.head_dim - d0);
        value_code(value + d0, n, chunk);
        for (std::int64_t c = 0; c < n; ++c) {
          row[2 * column_in_panel] = chunk[c];
          if (++column_in_panel == vr) {
            column_in_panel = 0;
            row += value_panel;
          }
        }
      }
      scales[rows + j] = vs;
    }
  } else if (l.bf16) {
    bf16_pair* units = static_cast<bf16_pair*>(head);
    kernels.pack_pairs(k, /*stride_k=*/1, args.k.row_stride, l.head_dim, 0, l.head_dim, j0, j1,
                       l.scores.nr, units);
    kernels.pack_pairs(v, args.v.row_stride, /*stride_n=*/1, l.kv_rows, j0, j1, 0, l.head_dim,
                       l.values.nr, units + l.values_offset());
  } else {
    float* units = static_cast<float*>(head);
    pack_block(k, /*stride_k=*/1, args.k.row_stride, l.head_dim, 0, l.head_dim, j0, j1, l.scores.nr,
               units);
    pack_block(v, args.v.row_stride, /*stride_n=*/1, l.kv_rows, j0, j1, 0, l.head_dim, l.values.nr,
               units + l.values_offset());
  }
}

// The new keys and values of K/V head g of sequence b of a call into an int4 cache (args' rows
// 0 to seq_len - 1 at positions past, past + 1, ...) into its packed head at `head`: each value
// as k8v4's (pack_value4), each key kept exact in the head's recent keys, and each group of
// key4_group keys coded per channel when its last one arrives, into K^T's 4-bit panels (whole
// words: a truncated cache's old codes may lie there) and its group's channel words.
void pack_keys4(const attention_args& args, const attention_layout& l, std::int64_t b,
                std::int64_t g, std::int64_t past, std::byte* head) noexcept {
  const kv_store& cache = *args.cache;
  const std::int64_t hd = l.head_dim, kr = l.scores.nr, words = key4_words(hd);
  auto* codes = reinterpret_cast<std::uint8_t*>(head);
  auto* scales = reinterpret_cast<int8_row*>(codes + l.scales_offset());
  auto* panels = reinterpret_cast<std::uint32_t*>(codes);
  const key4_recent_rows recent = key4_recent_of(head, cache.head_bytes, hd);
  for (std::int64_t i = 0; i < args.seq_len; ++i) {
    const std::int64_t position = past + i, slot = cache.slot(position);
    pack_value4(l, args.v.row(b, g, i), slot, codes + l.values_offset(), scales + l.key_words());
    if (!key4_keep(recent, hd, position, args.k.row(b, g, i))) continue;
    const std::int64_t first = position + 1 - key4_group, at = cache.slot(first);
    // Word (w, j % kr) of panel j / kr holds key j's dimensions 8w to 8w + 7.
    const auto word = [&](std::int64_t j, std::int64_t w) -> std::uint32_t& {
      return panels[j / kr * words * kr + w * kr + j % kr];
    };
    for (std::int64_t t = 0; t < key4_group; ++t) {
      for (std::int64_t w = 0; w < words; ++w) word(at + t, w) = 0;  // dimensions past hd: 0
    }
    key4_code_group(recent, hd, first, reinterpret_cast<value4_row*>(scales) + at / key4_group * hd,
                    [&](std::int64_t t, std::int64_t d, std::uint8_t c) {
                      const int shift = static_cast<int>(4 * ((d % 8) / 2) + 16 * (d % 2));
                      word(at + t, d / 8) |= std::uint32_t{c} << shift;
                    });
  }
}

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

void pack_head(const isa_kernels& kernels, const attention_args& args,
               const attention_layout& layout, std::int64_t b, std::int64_t g,
               void* head) noexcept {
  // The padding (columns of the last panels, the missing odd k of a pair) is zero.
  if (args.bf16_operands()) {
    bf16_pair* units = static_cast<bf16_pair*>(head);
    pack_pair_panels(args.k16.row(b, g, 0), layout.head_dim, layout.kv_rows, /*stride_k=*/1,
                     args.k16.row_stride, layout.scores.nr, units);
    pack_pair_panels(args.v16.row(b, g, 0), layout.kv_rows, layout.head_dim, args.v16.row_stride,
                     /*stride_n=*/1, layout.values.nr, units + layout.values_offset());
    return;
  }
  const float *k = args.k.row(b, g, 0), *v = args.v.row(b, g, 0);
  if (layout.bf16) {
    bf16_pair* units = static_cast<bf16_pair*>(head);
    pack_pair_panels(k, layout.head_dim, layout.kv_rows, /*stride_k=*/1, args.k.row_stride,
                     layout.scores.nr, units, kernels.pack_pairs);
    pack_pair_panels(v, layout.kv_rows, layout.head_dim, args.v.row_stride, /*stride_n=*/1,
                     layout.values.nr, units + layout.values_offset(), kernels.pack_pairs);
  } else {
    float* units = static_cast<float*>(head);
    pack_panels(k, layout.head_dim, layout.kv_rows, /*stride_k=*/1, args.k.row_stride,
                layout.scores.nr, units);
    pack_panels(v, layout.kv_rows, layout.head_dim, args.v.row_stride, /*stride_n=*/1,
                layout.values.nr, units + layout.values_offset());
  }
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
  l.score_cols = std::min(l.key_tile, round_up(keys, l.key_step));
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

attention_workspace::attention_workspace(const attention_layout& layout, bool packs_heads)
    : layout_(layout),
      head_(packs_heads && !layout.bf16 ? static_cast<std::size_t>(layout.head_units()) : 0),
      scratch_(static_cast<std::size_t>(layout.scratch_floats())),
      pair_head_(packs_heads && layout.bf16 ? static_cast<std::size_t>(layout.head_units()) : 0) {}

void attention_workspace::run(const isa_kernels& kernels, const attention_args& args,
                              attention_task task) noexcept {
  void* own = layout_.bf16 ? static_cast<void*>(pair_head_.data()) : head_.data();
  if (head_.size() > 0 || pair_head_.size() > 0) {
    if (const std::int64_t head = task.b * args.kv_heads() + task.g; head != packed_) {
      pack_head(kernels, args, layout_, task.b, task.g, own);
      packed_ = head;
    }
    task.head = own;
  }
  kernels.attention_rows(args, layout_, task, scratch_.data());
}

bool attention_workspace::reuse_for(const attention_layout& layout) noexcept {
  if (head_.size() > 0 || pair_head_.size() > 0 ||
      scratch_.size() < static_cast<std::size_t>(layout.scratch_floats()))
    return false;
  layout_ = layout;
  return true;
}

attention_workspace& thread_workspace(const attention_layout& layout) {
  thread_local std::optional<attention_workspace> kept;
  if (!kept || !kept->reuse_for(layout)) kept.emplace(layout, false);
  return *kept;
}

attention_schedule::attention_schedule(const isa_kernels& kernels, const attention_args& args,
                                       std::int64_t key_tile)
    : kernels_(kernels), args_(args) {
  // The most keys a sequence holds, and the most its first query row reads (a window's).
  std::int64_t keys = 0, span = 0;
  for (std::int64_t b = 0; b < args.batch; ++b) {
    keys = std::max(keys, this->keys(b));
    span = std::max(span, this->keys(b) - args.window_begin(past(b)));
  }
  const bool split = args.seq_len <= split_rows && span > split_keys;
  if (key_tile == 0) key_tile = split ? decode_key_tile : default_key_tile;
  attention_request request{
      .seq_len = args.seq_len,
      .keys = keys,
      .head_dim = args.head_dim,
      .key_tile = key_tile,
      .kv_rows = args.cache ? args.cache->capacity : 0,
      .group = args.kv_group,
      .bf16_operands = args.bf16,
      .in_place = args.heads_in_place && args.cache == nullptr &&
                  (!args.bf16 || args.bf16_operands()) && !args.dropout.active(),
      .plain_scores = !args.dropout.active() && !args.masks_keys() && args.softcap == 0.0f &&
                      args.sinks == nullptr,
  };
  if (args.cache) request.cache_format(args.cache->format);
  layout_ = kernels.layout(request);
  if (args.cache && args.cache->ring) pieces_ = 2;
  // Counted from the first key rounded down to the key step, as chunk_keys sizes them: one chunk
  // more than the window's own keys make where the rounding passes a multiple of split_keys (a
  // window of 4,096 over 4,097 keys).
  for (std::int64_t b = 0; split && b < args.batch; ++b) chunks_ = std::max(chunks_, key_chunks(b));
  per_head_ = (split ? chunks_ : layout_.blocks()) * pieces_;
  if (merges() > 0) {
    // Per (b, g, chunk, piece), seq_len * kv_group stacked rows: batch * heads * seq_len in all.
    partials_ = float_buffer(static_cast<std::size_t>(
        args.batch * args.heads * partials_per_head() * args.seq_len * (args.head_dim + 2)));
    if (args.out16.data != nullptr)
      merged_ = float_buffer(static_cast<std::size_t>(merges() * args.head_dim));
  }
}

std::int64_t attention_schedule::appends() const noexcept {
  return args_.cache ? args_.batch * args_.kv_heads() : 0;
}

void attention_schedule::append(std::int64_t i) const noexcept {
  const std::int64_t b = i / args_.kv_heads(), g = i % args_.kv_heads(), past = this->past(b);
  const kv_store& cache = *args_.cache;
  if (layout_.keys4) return pack_keys4(args_, layout_, b, g, past, cache.head(b, g));
  // An int8 head's channel scales are set by these keys (the sequence's first, or the first
  // appended at all: channel_scales_set).
  const bool first =
      past == 0 || (layout_.int8 && !channel_scales_set(reinterpret_cast<const float*>(
                                        cache.head(b, g) + layout_.channels_offset())));
  if (!cache.ring) {
    pack_keys(kernels_, args_, layout_, b, g, past, past + args_.seq_len, cache.head(b, g), first);
    return;
  }
  // A ring: the new keys at their slots, in two runs where they pass its end (a call holds
  // fewer keys than the ring: mha::ring_chunk).
  const std::int64_t slot = cache.slot(past);
  const std::int64_t before_end = std::min(args_.seq_len, cache.capacity - slot);
  pack_keys(kernels_, args_, layout_, b, g, slot, slot + before_end, cache.head(b, g), first);
  if (before_end < args_.seq_len) {
    attention_args rest = args_;  // the keys from row before_end on
    rest.k.data = args_.k.row(0, 0, before_end);
    rest.v.data = args_.v.row(0, 0, before_end);
    pack_keys(kernels_, rest, layout_, b, g, 0, args_.seq_len - before_end, cache.head(b, g),
              false);
  }
}

std::int64_t attention_schedule::first_key(std::int64_t b, std::int64_t row) const noexcept {
  const std::int64_t first = args_.window_begin(past(b) + row);
  return first - first % layout_.key_step;
}

std::int64_t attention_schedule::key_chunks(std::int64_t b) const noexcept {
  return (keys(b) - first_key(b, 0) + split_keys - 1) / split_keys;
}

std::int64_t attention_schedule::chunk_keys(std::int64_t b) const noexcept {
  // key_chunks of equal keys up to the key step: 2049 keys are 1040 + 1009, not 2048 + a task and
  // a merge for one.
  const std::int64_t span = keys(b) - first_key(b, 0), chunks = key_chunks(b);
  return round_up((span + chunks - 1) / chunks, layout_.key_step);
}

float* attention_schedule::partial(std::int64_t b, std::int64_t g,
                                   std::int64_t chunk) const noexcept {
  const std::int64_t stacked = args_.seq_len * args_.kv_group;  // rows per (b, g)
  return partials_.data() + ((b * args_.kv_heads() + g) * partials_per_head() + chunk) * stacked *
                                (args_.head_dim + 2);
}

void attention_schedule::run(std::int64_t i, attention_workspace& workspace) const noexcept {
  const std::int64_t head = i / per_head_, part = (i % per_head_) / pieces_, piece = i % pieces_;
  attention_task t;
  t.b = head / args_.kv_heads();
  t.g = head % args_.kv_heads();
  t.past = past(t.b);
  if (args_.cache) t.head = args_.cache->head(t.b, t.g);
  if (chunks_ > 1) {
    t.row_end = args_.seq_len;
    t.key_begin = first_key(t.b, 0) + part * chunk_keys(t.b);
    t.key_end = std::min(t.key_begin + chunk_keys(t.b), keys(t.b));
    t.partial = partial(t.b, t.g, part * pieces_ + piece);
  } else {
    t.row_begin = part * layout_.block_positions;
    t.row_end = std::min(t.row_begin + layout_.block_positions, args_.seq_len);
    // With a window, the keys before the block's first row's window are never read: O(T w).
    t.key_begin = first_key(t.b, t.row_begin);
    t.key_end = keys(t.b);
    if (pieces_ > 1) t.partial = partial(t.b, t.g, piece);
  }
  if (pieces_ > 1) {
    // A ring: this piece of the keys, before the wrap that follows key_begin or after it, in
    // slots with the positions shifted by its base.
    const std::int64_t slots = args_.cache->capacity;
    MHA_EXPECTS(t.key_begin >= t.key_end || t.key_begin >= keys(t.b) - slots);
    const std::int64_t wrap = (t.key_begin / slots + 1) * slots;
    const std::int64_t base = piece == 0 ? wrap - slots : wrap;
    if (piece == 1) t.key_begin = std::max(t.key_begin, wrap);
    if (piece == 0) t.key_end = std::min(t.key_end, wrap);
    t.key_begin -= base;
    t.key_end -= base;
    t.past -= base;
  }
  if (t.key_begin >= t.key_end) {  // no key here (a shorter sequence's chunk, an empty piece)
    if (t.partial != nullptr) empty_partial(t);
    return;
  }
  workspace.run(kernels_, args_, t);
}

void attention_schedule::empty_partial(const attention_task& t) const noexcept {
  const std::int64_t hd = args_.head_dim;
  for (std::int64_t r = t.row_begin * args_.kv_group; r < t.row_end * args_.kv_group; ++r) {
    float* part = t.partial + r * (hd + 2);
    std::fill(part, part + hd, 0.0f);
    part[hd] = -std::numeric_limits<float>::infinity();
    part[hd + 1] = 0.0f;
  }
}

void attention_schedule::merge(std::int64_t i) const noexcept {
  // out = (sum_c O_c 2^(m_c - m)) / (sum_c l_c 2^(m_c - m)), m = max_c m_c, in chunk order
  // (with a mask the maxima are halved: 2^(2 (m_c - m)).
  const std::int64_t b = i / args_.kv_heads(), g = i % args_.kv_heads(), hd = args_.head_dim;
  const std::int64_t group = args_.kv_group;
  const std::int64_t chunks = partials_per_head();
  for (std::int64_t r = 0; r < args_.seq_len * group; ++r) {
    const auto row = [&](std::int64_t c) { return partial(b, g, c) + r * (hd + 2); };
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < chunks; ++c) m = std::max(m, row(c)[hd]);
    // Stacked row r is query head g * group + r % group at position r / group.
    const std::int64_t h = g * group + r % group, position = r / group;
    float* out = args_.out16.data ? merged_.data() + i * hd : args_.out.row(b, h, position);
    float sum = 0.0f;
    std::fill(out, out + hd, 0.0f);
    for (std::int64_t c = 0; c < chunks; ++c) {
      const float* part = row(c);
      if (part[hd + 1] == 0.0f) continue;  // no key of chunk c for this row
      const float f = std::exp2(args_.mask.exponent_scale() * (part[hd] - m));
      sum += f * part[hd + 1];
      for (std::int64_t d = 0; d < hd; ++d) out[d] += f * part[d];
    }
    const float inv = output_factor(args_, h, m, sum);
    for (std::int64_t d = 0; d < hd; ++d) out[d] *= inv;
    if (args_.out16.data) {
      bf16* to = args_.out16.row(b, h, position);
      for (std::int64_t d = 0; d < hd; ++d) to[d] = to_bf16(out[d]);
    }
  }
}

void attention(const isa_kernels& kernels, const attention_args& args, std::int64_t key_tile) {
  const attention_schedule schedule(kernels, args, key_tile);
  for (std::int64_t i = 0; i < schedule.appends(); ++i) schedule.append(i);
  std::optional<attention_workspace> packing;
  if (schedule.packs_heads()) packing.emplace(schedule.layout(), true);
  attention_workspace& workspace = packing ? *packing : thread_workspace(schedule.layout());
  for (std::int64_t i = 0; i < schedule.tasks(); ++i) schedule.run(i, workspace);
  for (std::int64_t i = 0; i < schedule.merges(); ++i) schedule.merge(i);
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
