// Internal: the attention core's arguments, shared by every kernel set.
#pragma once

#include <cstdint>

#include "core/dropout.hpp"

namespace mha::detail {

// (batch, heads, rows, head_dim) viewed through strides, so one layout describes both a head
// slice of a (B, T, d_out) projection (split_weight: head_stride = head_dim, row_stride = d_out)
// and a head's own (B, T, head_dim) buffer (wrapper). Elements within a row are contiguous.
template <class T>
struct head_view {
  T* data = nullptr;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;

  T* row(std::int64_t b, std::int64_t h, std::int64_t i) const noexcept {
    return data + b * batch_stride + h * head_stride + i * row_stride;
  }
};

// out[b, h] = dropout(softmax(scale * q[b, h] k[b, g]^T + causal mask)) v[b, g], g = h / kv_group,
// for every b < batch, h < heads. Each (b, h) has seq_len query rows and keys() key/value rows:
// the past keys of a cache (decode) followed by the seq_len new ones, query row i standing at
// absolute position past + i (causal: it sees keys 0 .. past + i). k and v hold heads / kv_group
// heads (grouped-query attention; kv_group = 1 without grouping).
struct attention_args {
  head_view<const float> q, k, v;
  head_view<float> out;
  std::int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  std::int64_t past = 0;         // keys before the first query's own (0: a full forward)
  std::int64_t kv_group = 1;     // query heads per K/V head
  std::int64_t first_batch = 0;  // module-wide index of sequence 0 here: the dropout mask's b
  std::int64_t first_head = 0;   // module-wide index of head 0 here: the dropout mask's h
  bool causal = true;
  float scale = 1.0f;  // 1 / sqrt(head_dim)
  dropout_spec dropout;

  std::int64_t keys() const noexcept { return past + seq_len; }
  // One past the last key query row i attends to.
  std::int64_t key_end(std::int64_t i) const noexcept { return causal ? past + i + 1 : keys(); }
};

}  // namespace mha::detail
