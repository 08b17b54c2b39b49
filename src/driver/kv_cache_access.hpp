// Internal: the kernel sets' view of a kv_cache's storage, and the plain row-major layout of
// the backends that read a cache as ordinary strided rows (naive, onednn; naive's int8 too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "base/int8.hpp"
#include "base/key4.hpp"
#include "base/text.hpp"
#include "base/value4.hpp"
#include "common/attention_args.hpp"
#include "mha/error.hpp"
#include "mha/kv_cache.hpp"

namespace mha::detail {

struct kv_cache_access {
  static kv_store store(kv_cache& c) noexcept {
    return {c.data_.get(),     c.heads_,     c.head_bytes_,         c.slots_,
            c.lengths_.data(), c.precision_, c.slots_ < c.capacity_};
  }
  // mha_testing::hold_zero_tokens (src/testing/mha_testing.hpp), for benchmarks.
  static void hold_zero_tokens(kv_cache& c, std::int64_t n) noexcept {
    std::fill(c.lengths_.begin(), c.lengths_.end(), n);
  }
  // mha_testing::hold: f() while c is held, as by a call in progress.
  template <class F>
  static void hold(kv_cache& c, F&& f) {
    held(c, "mha_testing::hold", std::forward<F>(f));
  }
  // f() while c is held by one call (`where` names it to a concurrent one, which throws).
  template <class F>
  static void held(kv_cache& c, std::string_view where, F&& f) {
    const kv_cache::claim claimed(c, where);
    f();
  }
  // mha::make_attention_cache's cache: `heads` K/V heads of head_bytes in the layout of
  // `owner.made_by`'s kernels for owner.isa.
  // With a window: its ring of `slots` tokens when that is fewer than the capacity (head_bytes
  // then for the slots).
  static kv_cache make_attention(const kv_cache::attention_owner& owner, precision format,
                                 std::int64_t batch, std::int64_t capacity, std::int64_t heads,
                                 std::int64_t head_bytes, std::int64_t window, std::int64_t slots) {
    kv_cache c(nullptr, format, batch, capacity, heads, head_bytes);
    c.attention_ = owner;
    c.window_ = window;
    c.slots_ = slots;
    return c;
  }
  static const kv_cache::attention_owner& attention_owner(const kv_cache& c) noexcept {
    return c.attention_;
  }
  // After a call that appended n tokens to each of `count` sequences from `first`.
  static void grow(kv_cache& c, std::int64_t n, std::int64_t first, std::int64_t count) noexcept {
    for (std::int64_t b = first; b < first + count; ++b)
      c.lengths_[static_cast<std::size_t>(b)] += n;
  }
};

// Refuses, before anything is appended, the new keys or values (a.k, a.v) of a call into an
// int8, k8v4 or int4 cache that the format cannot hold: a finite value of magnitude 2^127 or more
// (a key of 2^124: its channel scale may grow it 8 times; a k8v4 value of 2^124: turning its group
// may grow it sqrt(32) times; an int4 key of 2^126: a channel's range may double it), whose steps
// would pass float's range (int8_row and value4_row read such a row as NaN, and a NaN out of finite
// inputs is no answer). NaN and Inf pass: they propagate as IEEE arithmetic does (docs/design.md
// §1.2, §1.7). mha::invalid_argument names `where`, the element and the range.
inline void check_coded_range(std::string_view where, const attention_args& a) {
  // Keys are divided by their channel scales first (key_channel_scales), at least
  // key_channel_floor: up to 8 times their size.
  const auto check = [&](const head_view<const float>& t, const char* name, float limit,
                         const char* range) {
    for (std::int64_t b = 0; b < a.batch; ++b) {
      for (std::int64_t g = 0; g < a.kv_heads(); ++g) {
        for (std::int64_t i = 0; i < a.seq_len; ++i) {
          const float* row = t.row(b, g, i);
          const auto beyond = [&](float x) { return std::abs(x) >= limit && std::isfinite(x); };
          const float* found = std::find_if(row, row + a.head_dim, beyond);
          if (found == row + a.head_dim) continue;
          throw invalid_argument(text(where, ": ", name, " (sequence ", b, ", K/V head ", g,
                                      ", token ", i, ", element ", found - row, ") is ", *found,
                                      ": an ", to_string(a.cache->format), " cache holds finite ",
                                      range, "; keep such a model's cache in fp32 or bf16"));
        }
      }
    }
  };
  if (a.cache->format == precision::int4) {
    check(a.k, "a key", 0x1p126f,
          "keys of magnitude below 2^126 (8.507059e37: a channel's range over a group of 64 "
          "tokens must stay finite)");
  } else {
    check(a.k, "a key", 0x1p124f,
          "keys of magnitude below 2^124 (2.1267648e37: its channel scales grow them up to 8 "
          "times)");
  }
  if (a.cache->format != precision::int8) {
    check(a.v, "a value", 0x1p124f,
          "values of magnitude below 2^124 (2.1267648e37: turning a group of 32 grows them up to "
          "sqrt(32) times)");
  } else {
    check(a.v, "a value", 0x1p127f, "values of magnitude below 2^127 (1.7014118e38)");
  }
}

// The row-major layout: per (sequence, K/V head), `capacity` key rows of head_dim elements of T
// (float; std::uint16_t holding bf16 in a bf16 plan), then as many value rows. A decode step
// reads each head's keys, then its values, as one stream.
namespace row_major_cache {

template <class T>
constexpr std::int64_t head_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  return 2 * capacity * head_dim * static_cast<std::int64_t>(sizeof(T));
}

// Keys (values) of K/V head g of sequence b, row i at .row(b, g, i).
template <class T>
head_view<T> keys(const kv_store& c, std::int64_t head_dim) noexcept {
  const std::int64_t head = c.head_bytes / static_cast<std::int64_t>(sizeof(T));
  return {reinterpret_cast<T*>(c.data), c.heads * head, head, head_dim};
}
template <class T>
head_view<T> values(const kv_store& c, std::int64_t head_dim) noexcept {
  head_view<T> v = keys<T>(c, head_dim);
  v.data += c.capacity * head_dim;
  return v;
}

// An int8 cache (docs/design.md §1.7) holds codes where the others hold elements (keys<uint8_t>
// and values<uint8_t> read them), and after them, at a cache line, the int8_row of each of the
// `capacity` key rows, then of as many value rows, then the head's head_dim key channel scales.
inline std::int64_t int8_codes_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  return (head_bytes<std::uint8_t>(capacity, head_dim) + 63) / 64 * 64;
}
inline std::int64_t int8_head_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  return int8_codes_bytes(capacity, head_dim) +
         2 * capacity * static_cast<std::int64_t>(sizeof(int8_row)) +
         head_dim * static_cast<std::int64_t>(sizeof(float));
}
// The scale and zero of key row 0 of K/V head g of sequence b; value row 0's are `capacity`
// after it.
inline int8_row* int8_rows(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                           std::int64_t g) noexcept {
  return reinterpret_cast<int8_row*>(c.head(b, g) + int8_codes_bytes(c.capacity, head_dim));
}
// Its key channel scales (key_channel_scales).
inline float* int8_channels(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                            std::int64_t g) noexcept {
  return reinterpret_cast<float*>(int8_rows(c, head_dim, b, g) + 2 * c.capacity);
}

// Appends a cached call's new keys and values (a.k, a.v) after each sequence's length (a ring:
// at their slots), each element converted by to_element (identity for float, to_bf16 for bf16).
template <class T, class Convert>
void append(const attention_args& a, Convert to_element) noexcept {
  const head_view<T> k = keys<T>(*a.cache, a.head_dim), v = values<T>(*a.cache, a.head_dim);
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int64_t past = a.cache->lengths[b];
    for (std::int64_t g = 0; g < a.kv_heads(); ++g) {
      for (std::int64_t i = 0; i < a.seq_len; ++i) {
        const std::int64_t slot = a.cache->slot(past + i);
        std::transform(a.k.row(b, g, i), a.k.row(b, g, i) + a.head_dim, k.row(b, g, slot),
                       to_element);
        std::transform(a.v.row(b, g, i), a.v.row(b, g, i) + a.head_dim, v.row(b, g, slot),
                       to_element);
      }
    }
  }
}
inline void append(const attention_args& a) noexcept {
  append<float>(a, [](float x) { return x; });
}
// A k8v4 cache (docs/design.md §1.7): its key codes and rows as int8's, its values as 4-bit
// codes, two a byte (element d of a row in byte d / 2, the low half for even d), pairs(head_dim)
// bytes a row after the key codes; after them, at a cache line, the int8_row of each key row,
// then value4_groups(head_dim) value4_rows per value row, then the key channel scales.
inline std::int64_t k8v4_codes_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  return (capacity * (head_dim + (head_dim + 1) / 2) + 63) / 64 * 64;
}
inline std::int64_t k8v4_head_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  return k8v4_codes_bytes(capacity, head_dim) +
         capacity * (1 + value4_groups(head_dim)) * static_cast<std::int64_t>(sizeof(int8_row)) +
         head_dim * static_cast<std::int64_t>(sizeof(float));
}
// Of K/V head g of sequence b: value row j's codes (a row of pairs(head_dim) bytes), key row 0's
// int8_row, value row j's value4_rows (value4_groups(head_dim) of them), the channel scales.
inline std::uint8_t* k8v4_value_codes(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                                      std::int64_t g, std::int64_t j) noexcept {
  return reinterpret_cast<std::uint8_t*>(c.head(b, g)) + c.capacity * head_dim +
         j * ((head_dim + 1) / 2);
}
inline int8_row* k8v4_key_rows(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                               std::int64_t g) noexcept {
  return reinterpret_cast<int8_row*>(c.head(b, g) + k8v4_codes_bytes(c.capacity, head_dim));
}
inline value4_row* k8v4_value_rows(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                                   std::int64_t g, std::int64_t j) noexcept {
  return reinterpret_cast<value4_row*>(k8v4_key_rows(c, head_dim, b, g) + c.capacity) +
         j * value4_groups(head_dim);
}
inline float* k8v4_channels(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                            std::int64_t g) noexcept {
  return reinterpret_cast<float*>(k8v4_value_rows(c, head_dim, b, g, c.capacity));
}

// Element d of a row of 4-bit codes two a byte (element d in byte d / 2, the low half for even d).
inline std::uint8_t nibble(const std::uint8_t* codes, std::int64_t d) noexcept {
  return static_cast<std::uint8_t>(d % 2 == 0 ? codes[d / 2] & 15 : codes[d / 2] >> 4);
}
inline void set_nibble(std::uint8_t* codes, std::int64_t d, std::uint8_t code) noexcept {
  std::uint8_t& byte = codes[d / 2];
  byte = static_cast<std::uint8_t>(d % 2 == 0 ? (byte & 0xf0) | code : (byte & 0x0f) | code << 4);
}

// A value row v[0, head_dim) as k8v4 and int4 caches hold it: each group turned and coded
// (quantize_value4), two codes a byte into codes[0, (head_dim + 1) / 2) (element d in byte d / 2,
// the low half for even d), the groups' words into words[0, value4_groups(head_dim)).
inline void write_value4(const float* v, std::int64_t head_dim, std::uint8_t* codes,
                         value4_row* words) {
  std::vector<std::uint8_t> each(static_cast<std::size_t>(head_dim));
  quantize_value4(v, head_dim, each.data(), words);
  for (std::int64_t d = 0; d < head_dim; d += 2) {
    const std::uint8_t high = d + 1 < head_dim ? each[static_cast<std::size_t>(d + 1)] : 0;
    codes[d / 2] = static_cast<std::uint8_t>(each[static_cast<std::size_t>(d)] | high << 4);
  }
}
// The row write_value4 wrote, read back: each group's codes as values, then turned back.
inline void read_value4(const std::uint8_t* codes, const value4_row* words, std::int64_t head_dim,
                        float* to) noexcept {
  for (std::int64_t d = 0; d < head_dim; ++d)
    to[d] = dequantize(nibble(codes, d), words[d / value4_group]);
  turn_groups(to, head_dim);
}

// An int4 cache (docs/design.md §1.7): key codes, then value codes, two a byte as write_value4
// writes them, (head_dim + 1) / 2 bytes a row, `capacity` rows each; after them, at a cache line,
// the keys' channel groups' value4_rows (head_dim per group of key4_group slots), then
// value4_groups(head_dim) value4_rows per value row; then, at the head's end, its recent exact
// keys (base/key4.hpp).
inline std::int64_t int4_codes_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  return (2 * capacity * ((head_dim + 1) / 2) + 63) / 64 * 64;
}
inline std::int64_t int4_head_bytes(std::int64_t capacity, std::int64_t head_dim) noexcept {
  const std::int64_t words = key4_groups(capacity) * head_dim + capacity * value4_groups(head_dim);
  return int4_codes_bytes(capacity, head_dim) +
         (words * static_cast<std::int64_t>(sizeof(value4_row)) + 63) / 64 * 64 +
         key4_recent_bytes(head_dim);
}
// Of K/V head g of sequence b: key (value) row `slot`'s codes, the keys' channel group words
// (group s / key4_group's at s / key4_group * head_dim), value row `slot`'s words, the recent keys.
inline std::uint8_t* int4_codes(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                                std::int64_t g, std::int64_t slot, bool value) noexcept {
  return reinterpret_cast<std::uint8_t*>(c.head(b, g)) +
         (slot + (value ? c.capacity : 0)) * ((head_dim + 1) / 2);
}
inline value4_row* int4_key_words(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                                  std::int64_t g) noexcept {
  return reinterpret_cast<value4_row*>(c.head(b, g) + int4_codes_bytes(c.capacity, head_dim));
}
inline value4_row* int4_value_words(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                                    std::int64_t g, std::int64_t slot) noexcept {
  return int4_key_words(c, head_dim, b, g) + key4_groups(c.capacity) * head_dim +
         slot * value4_groups(head_dim);
}
inline key4_recent_rows int4_recent(const kv_store& c, std::int64_t head_dim, std::int64_t b,
                                    std::int64_t g) noexcept {
  return key4_recent_of(c.head(b, g), c.head_bytes, head_dim);
}

// ... into an int4 cache: each key kept exact (key4_keep), each group of key4_group keys coded
// per channel when its last one arrives (key4_code_group); each value row as k8v4's.
inline void append_int4(const attention_args& a) {
  const std::int64_t hd = a.head_dim;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int64_t past = a.cache->lengths[b];
    for (std::int64_t g = 0; g < a.kv_heads(); ++g) {
      const key4_recent_rows recent = int4_recent(*a.cache, hd, b, g);
      for (std::int64_t i = 0; i < a.seq_len; ++i) {
        const std::int64_t position = past + i, slot = a.cache->slot(position);
        write_value4(a.v.row(b, g, i), hd, int4_codes(*a.cache, hd, b, g, slot, true),
                     int4_value_words(*a.cache, hd, b, g, slot));
        if (!key4_keep(recent, hd, position, a.k.row(b, g, i))) continue;
        const std::int64_t first = position + 1 - key4_group, at = a.cache->slot(first);
        key4_code_group(recent, hd, first,
                        int4_key_words(*a.cache, hd, b, g) + at / key4_group * hd,
                        [&](std::int64_t t, std::int64_t d, std::uint8_t code) {
                          set_nibble(int4_codes(*a.cache, hd, b, g, at + t, false), d, code);
                        });
      }
    }
  }
}
// Key row `slot` (at `position`) of K/V head g of sequence b of an int4 cache holding n keys, as
// floats: coded (its channel group's scale code + offset) before key4_coded_end(n), else exact.
inline void int4_key(const kv_store& c, std::int64_t head_dim, std::int64_t b, std::int64_t g,
                     std::int64_t position, std::int64_t n, float* to) noexcept {
  if (position >= key4_coded_end(n)) {
    const float* row = int4_recent(c, head_dim, b, g).row(position, head_dim);
    std::copy(row, row + head_dim, to);
    return;
  }
  const std::int64_t slot = c.slot(position);
  const std::uint8_t* codes = int4_codes(c, head_dim, b, g, slot, false);
  const value4_row* words = int4_key_words(c, head_dim, b, g) + slot / key4_group * head_dim;
  for (std::int64_t d = 0; d < head_dim; ++d) to[d] = dequantize(nibble(codes, d), words[d]);
}

// ... into an int8 or k8v4 cache: each key row over its head's channel scales (set from the
// sequence's first call's keys: key_channel_scales) quantised (quantize_row); each value row so
// (int8), or turned and coded per group, two codes a byte (k8v4: write_value4).
inline void append_coded(const attention_args& a) {
  if (a.cache->format == precision::int4) return append_int4(a);
  const bool k8v4 = a.cache->format == precision::k8v4;
  const std::int64_t hd = a.head_dim;
  const head_view<std::uint8_t> k = keys<std::uint8_t>(*a.cache, hd),
                                v = values<std::uint8_t>(*a.cache, hd);
  std::vector<float> scaled(static_cast<std::size_t>(hd));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int64_t past = a.cache->lengths[b];
    for (std::int64_t g = 0; g < a.kv_heads(); ++g) {
      int8_row* rows = k8v4 ? k8v4_key_rows(*a.cache, hd, b, g) : int8_rows(*a.cache, hd, b, g);
      float* channels =
          k8v4 ? k8v4_channels(*a.cache, hd, b, g) : int8_channels(*a.cache, hd, b, g);
      if (past == 0 || !channel_scales_set(channels)) {
        key_channel_scales(a.k.row(b, g, 0), a.channel_scale_rows(), a.k.row_stride, hd, channels);
      }
      for (std::int64_t i = 0; i < a.seq_len; ++i) {
        const std::int64_t slot = a.cache->slot(past + i);
        for (std::int64_t d = 0; d < hd; ++d)
          scaled[static_cast<std::size_t>(d)] = scaled_key(a.k.row(b, g, i), channels, d);
        rows[slot] = quantize_row(scaled.data(), hd, k.row(b, g, slot));
        if (!k8v4) {
          rows[a.cache->capacity + slot] = quantize_row(a.v.row(b, g, i), hd, v.row(b, g, slot));
          continue;
        }
        write_value4(a.v.row(b, g, i), hd, k8v4_value_codes(*a.cache, hd, b, g, slot),
                     k8v4_value_rows(*a.cache, hd, b, g, slot));
      }
    }
  }
}
// Value row `slot` of K/V head g of sequence b of a k8v4 cache as floats (to[0, head_dim)).
inline void k8v4_value(const kv_store& c, std::int64_t head_dim, std::int64_t b, std::int64_t g,
                       std::int64_t slot, float* to) noexcept {
  read_value4(k8v4_value_codes(c, head_dim, b, g, slot), k8v4_value_rows(c, head_dim, b, g, slot),
              head_dim, to);
}

// Sequence b of a cached call (after append) as a cache-free call of one sequence: its queries
// over the keys and values k and v (the cache's rows, or a widened copy of them), past =
// lengths[b].
inline attention_args sequence(const attention_args& a, std::int64_t b,
                               const head_view<const float>& k,
                               const head_view<const float>& v) noexcept {
  attention_args one = a;
  one.cache = nullptr;
  one.batch = 1;
  one.past = a.cache->lengths[b];
  one.first_batch = a.first_batch + b;
  one.q.data = a.q.row(b, 0, 0);
  one.out.data = a.out.row(b, 0, 0);
  one.k = k;
  one.v = v;
  return one;
}
// ... over the cache's own float rows (not a ring's: its rows are not in key order).
inline attention_args sequence(const attention_args& a, std::int64_t b) noexcept {
  const head_view<float> k = keys<float>(*a.cache, a.head_dim),
                         v = values<float>(*a.cache, a.head_dim);
  return sequence(a, b, {k.row(b, 0, 0), k.batch_stride, k.head_stride, k.row_stride},
                  {v.row(b, 0, 0), v.batch_stride, v.head_stride, v.row_stride});
}

}  // namespace row_major_cache
}  // namespace mha::detail
