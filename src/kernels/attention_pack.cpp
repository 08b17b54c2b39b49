// Packing a head of the SIMD kernels' attention: K^T and V into a workspace's panels (pack_head),
// or a call's new keys and values into a KV cache's packed head in its format (pack_keys: fp32,
// bf16 pairs, int8 codes, k8v4's values; pack_keys4: int4). Compiled with the baseline flags.
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/checks.hpp"
#include "base/int8.hpp"
#include "base/key4.hpp"
#include "base/value4.hpp"
#include "kernels/interface/attention.hpp"
#include "kernels/interface/isa_kernels.hpp"

namespace mha::detail {
namespace {

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

}  // namespace

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

}  // namespace mha::detail
