// The checks mha::attention's calls share: src/core/attention.cpp defines them for the call on
// tensors, and src/core/attention_cache.cpp's call over a kv_cache takes them too, so that both
// refuse the same operands in the same words.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/text.hpp"
#include "common/attention_args.hpp"
#include "mha/attention.hpp"

namespace mha::detail {

// How the calls' messages begin.
inline constexpr std::string_view attention_call = "mha::attention";

template <class T>
std::string shape_of(const heads_view<T>& t) {
  return text("(", t.batch, ", ", t.heads, ", ", t.rows, ", ", t.head_dim, ")");
}

template <class T>
bool empty(const heads_view<T>& t) {
  return t.batch == 0 || t.heads == 0 || t.rows == 0 || t.head_dim == 0;
}

// q, k, v and out of a call: each view sound, their shapes one call's (q (B, H, L, D), k and v
// (B, H_kv, S, D), H a multiple of H_kv, out q's shape), out its own memory and none of theirs.
// Instantiated for float here (the call over a cache); the bfloat16 forms are attention.cpp's.
template <class T, class O>
void check_operands(const heads_view<const T>& q, const heads_view<const T>& k,
                    const heads_view<const T>& v, const heads_view<O>& out);

// options' window, soft-cap and sinks (docs/design.md §1.9) checked for a call of `heads` query
// heads, causal or not, into the kernels' arguments.
void set_extensions(const attention_options& options, std::int64_t heads, bool causal,
                    attention_args& a);

// The scores' factor of a call with head_dim hd, once options' scale and threads are checked.
float checked_scale(const attention_options& options, std::int64_t hd);

}  // namespace mha::detail
