// The stated bytes of one cached token's key and value rows (one K/V head) in a KV cache format
// (docs/design.md §1.7), without a layout's padding: what mha_bench's bytes_min and
// bench_attention's decode GBps count (mhapy.problem.cache_token_bytes is its Python twin).
#pragma once

#include <cstdint>

#include "base/key4.hpp"
#include "base/value4.hpp"
#include "mha/config.hpp"

namespace mha_bench {

// fp32 4 bytes an element, bf16 2; int8 1 and a 4-byte word a row; k8v4 its key as int8's and its
// value half a byte an element and a 4-byte word a group of value4_group; int4 its value as
// k8v4's, its key half a byte an element and its share of its channel group's words (a 4-byte
// word per channel a key4_group of tokens).
inline double cache_token_bytes(mha::precision kv, std::int64_t head_dim) {
  const double hd = static_cast<double>(head_dim);
  switch (kv) {
    case mha::precision::int8:
      return 2.0 * (hd + 4);
    case mha::precision::k8v4:
      return hd + 4 + static_cast<double>((head_dim + 1) / 2) +
             4.0 * static_cast<double>(mha::detail::value4_groups(head_dim));
    case mha::precision::int4:
      return 2.0 * static_cast<double>((head_dim + 1) / 2) +
             4.0 * hd / static_cast<double>(mha::detail::key4_group) +
             4.0 * static_cast<double>(mha::detail::value4_groups(head_dim));
    case mha::precision::bf16:
      return 4.0 * hd;
    default:
      return 8.0 * hd;
  }
}

}  // namespace mha_bench
