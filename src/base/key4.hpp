// Internal: the keys of an int4 KV cache (docs/design.md §1.7): values as the k8v4 cache keeps
// them (base/value4.hpp), keys as 4-bit codes per channel of each group of key4_group tokens.
// Every backend that keeps one codes with these, so "a key in an int4 cache" means one thing
// everywhere.
//
// Trained models' keys have outlier channels (a few dimensions far larger than the rest, the same
// ones in every token), so a range per token spends its 16 levels on those channels (KIVI,
// KVQuant). Here each channel of a group of 64 tokens gets 16 levels of its own (a value4_row:
// a bf16 scale and an offset in sixteenths of a step), so an outlier channel costs only itself.
// A group is coded when its last token arrives; until then its tokens (the newest, at most 63)
// are kept exact and read exact. The exact rows of the last 128 positions are kept (`recent`):
// those of the unfilled group, and of the group before it, so that a rollback into the last
// coded group (a rejected draft of speculative decoding) finds its keys exact again. On Gemma 3
// 270M over real text, channel groups measured 0.025 nats of KL divergence where 4-bit keys per
// token measured 2.3, and rotated per token 0.17 (reports/xeon-2core-cache-formats-2026-11-28).
//
// Scores read the codes in place: q . k_j = sum_d (q_d s_gd) c_jd + sum_d q_d o_gd for key j of
// group g (s_gd, o_gd the channel's scale and offset): the query is multiplied by the group's
// scales and made 16-bit integers once per group of 64 keys, and each key's score is one integer
// dot product, one multiply and one add.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/value4.hpp"

namespace mha::detail {

// Tokens per channel group of the keys.
inline constexpr std::int64_t key4_group = 64;
// Positions whose exact keys a head keeps: the unfilled group's and the last coded one's.
inline constexpr std::int64_t key4_recent = 2 * key4_group;

// Of a sequence of n keys: the first key not yet coded (its unfilled group's first).
constexpr std::int64_t key4_coded_end(std::int64_t n) noexcept {
  return n / key4_group * key4_group;
}

// The 32-bit words of one key's codes in the SIMD kernels' panels: 8 dimensions each.
constexpr std::int64_t key4_words(std::int64_t head_dim) noexcept { return (head_dim + 7) / 8; }

// The channel groups of `rows` key slots (each slot group holds key4_group consecutive slots).
constexpr std::int64_t key4_groups(std::int64_t rows) noexcept {
  return (rows + key4_group - 1) / key4_group;
}

// A head's exact recent keys: key4_recent rows of head_dim floats (position p in row
// p % key4_recent), then the position each row holds (a row of a sequence's position p < its
// length holds p unless a later position took the row: positions are rewritten as keys are
// appended, never read beyond the length). They lie at the end of the head in every layout, the
// positions last, so that kv_cache::truncate finds them knowing only the head's bytes.
struct key4_recent_rows {
  float* rows;
  std::int64_t* positions;

  float* row(std::int64_t position, std::int64_t head_dim) const noexcept {
    return rows + position % key4_recent * head_dim;
  }
};
constexpr std::int64_t key4_positions_bytes = key4_recent * std::int64_t{sizeof(std::int64_t)};
constexpr std::int64_t key4_recent_bytes(std::int64_t head_dim) noexcept {
  return key4_recent * head_dim * std::int64_t{sizeof(float)} + key4_positions_bytes;
}
inline std::int64_t* key4_positions(std::byte* head, std::int64_t head_bytes) noexcept {
  return reinterpret_cast<std::int64_t*>(head + head_bytes - key4_positions_bytes);
}
inline key4_recent_rows key4_recent_of(std::byte* head, std::int64_t head_bytes,
                                       std::int64_t head_dim) noexcept {
  std::int64_t* positions = key4_positions(head, head_bytes);
  return {reinterpret_cast<float*>(positions) - key4_recent * head_dim, positions};
}
// Whether a sequence of a head whose positions are `positions` can be taken back to `length`
// keys: the keys of its then unfilled group are held exact.
inline bool key4_can_truncate(const std::int64_t* positions, std::int64_t length) noexcept {
  for (std::int64_t p = key4_coded_end(length); p < length; ++p) {
    if (positions[p % key4_recent] != p) return false;
  }
  return true;
}

// Keeps the exact key (key[0, head_dim)) of `position`; returns whether it fills its group (the
// group from position + 1 - key4_group is then to be coded: key4_code_group).
inline bool key4_keep(const key4_recent_rows& r, std::int64_t head_dim, std::int64_t position,
                      const float* key) noexcept {
  float* to = r.row(position, head_dim);
  for (std::int64_t d = 0; d < head_dim; ++d) to[d] = key[d];
  r.positions[position % key4_recent] = position;
  return (position + 1) % key4_group == 0;
}

// The group of key4_group keys from position `first` (a multiple of key4_group, every key held
// in r) coded: each channel d's 64 elements get a value4_row, words[d], and codes in [0, 15],
// code(i, d, c) for token first + i.
template <class Code>
void key4_code_group(const key4_recent_rows& r, std::int64_t head_dim, std::int64_t first,
                     value4_row* words, Code code) noexcept {
  const float* rows = r.row(first, head_dim);  // the group's rows are consecutive
  float channel[key4_group];
  std::uint8_t codes[key4_group];
  for (std::int64_t d = 0; d < head_dim; ++d) {
    for (std::int64_t i = 0; i < key4_group; ++i) channel[i] = rows[i * head_dim + d];
    words[d] = value4_scale(channel, key4_group);
    value4_codes(channel, key4_group, words[d], codes);
    for (std::int64_t i = 0; i < key4_group; ++i) code(i, d, codes[i]);
  }
}

// The 16-bit queries of an int4 cache's SIMD kernels: x = q s_g (a query row times a group's
// channel scales) as integers of magnitude at most this limit, with a scale per row and group, so
// that a score's integer sums stay below 2^31: the SIMD kernels sum a quarter of the products
// apart with their codes times 16 (micro/code_dot.hpp's nibble_panels), head_dim / 4 (padded to
// 8 / 4) of them at most 15 * 16 times the limit each: 32767 up to head_dim 1,092, less beyond.
constexpr std::int32_t key4_query_limit(std::int64_t head_dim) noexcept {
  const std::int64_t padded = (head_dim + 7) / 8 * 8;
  const std::int64_t limit = 2147483647 / (60 * padded);
  return static_cast<std::int32_t>(limit < 32767 ? limit : 32767);
}

// An int4 key's largest error over its channel group's range (max - min): value4_row's half step.
constexpr double key4_element_error = value4_element_error;

}  // namespace mha::detail
