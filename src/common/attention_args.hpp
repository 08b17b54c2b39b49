// Internal: the attention core's arguments, shared by every kernel set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "base/bf16.hpp"
#include "base/dropout.hpp"
#include "mha/config.hpp"

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
  // A writable view reads as a read-only one.
  operator head_view<const T>() const noexcept {
    return {data, batch_stride, head_stride, row_stride};
  }
};

// A KV cache's storage in the layout of the kernel set that made it (mha::kv_cache,
// docs/design.md §1.4): K/V head g of sequence b at head(b, g), `head_bytes` each with room for
// `capacity` tokens, holding elements of `format`: the plan's precision (fp32 floats, or bf16 in
// the set's own unit), or int8 codes with a scale and an offset per token (§1.7); lengths[b]
// tokens of sequence b held before the current call.
//
// A ring (a sliding window's cache, mha::ring_slots): `capacity` slots hold each sequence's last
// tokens, key j (its position) at slot j mod capacity; the lengths count every token fed.
struct kv_store {
  std::byte* data = nullptr;
  std::int64_t heads = 0, head_bytes = 0, capacity = 0;
  const std::int64_t* lengths = nullptr;
  precision format = precision::fp32;
  bool ring = false;

  std::byte* head(std::int64_t b, std::int64_t g) const noexcept {
    return data + (b * heads + g) * head_bytes;
  }
  // The slot of key j.
  std::int64_t slot(std::int64_t j) const noexcept { return ring ? j % capacity : j; }
};

// An additive mask on the scores of a call without a cache (mha::attention, SDPA's attn_mask):
// score (b, h, i, j) gains value(b, h, i, j) before the softmax; boolean: false is -inf, true 0.
// Elements of a (query row, key) row are contiguous (key j at row + j); a stride of 0 broadcasts.
// A row that sees no key, or only keys at -inf, comes out as zeros (as PyTorch's SDPA does).
struct score_mask {
  const void* data = nullptr;
  bool boolean = false;  // bytes of 0 or 1 (bool), else float
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;

  bool active() const noexcept { return data != nullptr; }
  // The factor between a score (or a row's maximum, a split's partial result's too) of the SIMD
  // kernels and its base-2 exponent: 2 with a mask, whose scores are kept at half their base-2
  // value so that no finite mask value overflows in the log2(e) scaling (transformers' finfo.min
  // mask is -3.4e38, and 1.44 times that is -inf); 1 otherwise.
  float exponent_scale() const noexcept { return active() ? 2.0f : 1.0f; }
  // Where row (b, h, i) starts, in elements (floats, or bytes when boolean).
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t i) const noexcept {
    return b * batch_stride + h * head_stride + i * row_stride;
  }
  // The mask's values of row (b, h, i) from key j0 as floats, n of them, into `to`.
  void row(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0, std::int64_t n,
           float* to) const noexcept {
    const std::int64_t at = offset(b, h, i) + j0;
    if (boolean) {
      const auto* from = static_cast<const unsigned char*>(data) + at;
      for (std::int64_t j = 0; j < n; ++j)
        to[j] = from[j] ? 0.0f : -std::numeric_limits<float>::infinity();
    } else {
      const float* from = static_cast<const float*>(data) + at;
      for (std::int64_t j = 0; j < n; ++j) to[j] = from[j];
    }
  }
};

// out[b, h] = dropout(softmax(scale * q[b, h] k[b, g]^T + causal mask)) v[b, g], g = h / kv_group,
// for every b < batch, h < heads. Each (b, h) has seq_len query rows and keys() key/value rows:
// the past keys of a cache (decode) followed by the seq_len new ones, query row i standing at
// absolute position past + i (causal: it sees keys 0 .. past + i). k and v hold heads / kv_group
// heads (grouped-query attention; kv_group = 1 without grouping).
//
// With a cache, k and v hold only this call's seq_len new keys and values: the kernel set
// appends them to `cache` after each sequence's cache->lengths[b] tokens and attends over the
// lengths[b] + seq_len keys then held (`past` is then per sequence, and the field below is 0).
struct attention_args {
  head_view<const float> q, k, v;
  // mha::attention's bf16 operands (then bf16 is set, and q, k and v above are empty): read as
  // the kernels read q, k and v, each value already a bf16 (base/bf16.hpp). Never with a cache.
  head_view<const detail::bf16> q16, k16, v16;
  head_view<float> out;
  head_view<detail::bf16> out16;  // with bf16 operands: bf16 results (rounded) instead of out
  std::int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  std::int64_t past = 0;         // keys before the first query's own (0: a full forward)
  std::int64_t kv_group = 1;     // query heads per K/V head
  std::int64_t first_batch = 0;  // module-wide index of sequence 0 here: the dropout mask's b
  std::int64_t first_head = 0;   // module-wide index of head 0 here: the dropout mask's h
  bool causal = true;
  float scale = 1.0f;  // 1 / sqrt(head_dim)
  dropout_spec dropout;
  bool bf16 = false;  // a bf16 module: every product's operands rounded (docs/design.md §1.5)
  const kv_store* cache = nullptr;  // decode: where k and v are appended and keys are read
  // An int8 or k8v4 cache: the rows of k from row 0 that set a sequence's key channel scales
  // where this call sets them (base/int8.hpp; 0: the call's own seq_len). A call taken in parts
  // (a ring's, mha::ring_chunk) sets them from all of its keys, not its first part's.
  std::int64_t channel_rows = 0;
  // The rows that set the channel scales: channel_rows, or the call's own.
  std::int64_t channel_scale_rows() const noexcept {
    return channel_rows > 0 ? channel_rows : seq_len;
  }
  score_mask mask;  // none unless set (never with a cache or dropout)
  // K and V are this call's alone (mha::attention): a block of few fp32 query rows may read them
  // where they lie instead of packing them (attention_layout::in_place). A plan's forward leaves
  // it false, so that its rows round as its decode steps over a packed cache do.
  bool heads_in_place = false;
  // The function's extensions (docs/design.md §1.9), each off at its default:
  //   window   a sliding window (causal only): the query at absolute position p sees the keys
  //            p - window < j <= p, `window` keys its own included (transformers' definition);
  //   softcap  logit soft-capping: each scaled score s becomes softcap tanh(s / softcap),
  //            before the mask;
  //   sinks    a logit per query head (heads of this call) that joins its rows' softmax
  //            denominator and contributes no value (gpt-oss's sinks).
  std::int64_t window = 0;
  float softcap = 0.0f;
  const float* sinks = nullptr;

  std::int64_t kv_heads() const noexcept { return heads / kv_group; }
  bool bf16_operands() const noexcept { return q16.data != nullptr; }
  // Whether a row may see none of a key tile's keys though it sees later ones (a mask, or a
  // window): the softmax then guards rows whose scores so far are all -inf.
  bool masks_keys() const noexcept { return mask.active() || window > 0; }
  // Keys sequence b attends over.
  std::int64_t keys(std::int64_t b = 0) const noexcept {
    return (cache ? cache->lengths[b] : past) + seq_len;
  }
  // One past the last key query row i attends to (without a cache).
  std::int64_t key_end(std::int64_t i) const noexcept { return causal ? past + i + 1 : keys(); }
  // The first key the query at absolute position `position` attends to: 0, or with a window the
  // window's first.
  std::int64_t window_begin(std::int64_t position) const noexcept {
    return window > 0 && position >= window ? position - window + 1 : 0;
  }
};

}  // namespace mha::detail
