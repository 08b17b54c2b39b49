#include "backends/onednn/attention_plan.hpp"

#include <algorithm>
#include <cassert>

#include "base/bf16.hpp"
#include "driver/kv_cache_access.hpp"

namespace mha::detail {

std::int64_t key_bucket(std::int64_t keys, std::int64_t capacity) {
  std::int64_t power = 1;
  while (power * 2 <= keys) power *= 2;
  const std::int64_t granule = std::max<std::int64_t>(64, power / 8);
  return std::min((keys + granule - 1) / granule * granule, capacity);
}

std::int64_t attention_group(std::int64_t count, std::int64_t rows, std::int64_t keys) {
  constexpr std::int64_t score_budget_bytes = std::int64_t{256} * 1024;
  const std::int64_t per_slice = rows * keys * static_cast<std::int64_t>(sizeof(float));
  for (std::int64_t g = count; g > 1; --g) {
    if (count % g == 0 && g * per_slice <= score_budget_bytes) return g;
  }
  return 1;
}

namespace {

// Elements from one sequence's keys (values) to the next's, and from one K/V head's to the
// next's: in attention_args::k and v, or with a cache in its rows (of the plan's element type).
struct kv_strides {
  std::int64_t batch, head;
};
kv_strides key_strides(const attention_args& a) {
  if (a.cache == nullptr) return {a.k.batch_stride, a.k.head_stride};
  const auto of = [](const auto& keys) { return kv_strides{keys.batch_stride, keys.head_stride}; };
  return a.bf16 ? of(row_major_cache::keys<bf16>(*a.cache, a.head_dim))
                : of(row_major_cache::keys<float>(*a.cache, a.head_dim));
}

}  // namespace

attention_plan plan_attention(const attention_args& a) {
  assert((a.cache != nullptr || a.past == 0) && a.q.row_stride == a.head_dim &&
         a.k.row_stride == a.head_dim && a.k.head_stride == a.v.head_stride &&
         a.k.batch_stride == a.v.batch_stride);
  const bool cached = a.cache != nullptr;
  const std::int64_t t = a.seq_len, hd = a.head_dim, per_kv = a.kv_group, rows = per_kv * t;
  std::int64_t longest = t;
  for (std::int64_t b = 0; b < a.batch; ++b) longest = std::max(longest, a.keys(b));
  const std::int64_t n = cached ? key_bucket(longest, a.cache->capacity) : t;

  attention_plan p;
  // Slices along the batch where a head's sequences are back to back and each is its own slice
  // (the wrapper's per-head buffers without grouping, or a single head).
  p.over_batch = !cached && per_kv == 1 && a.batch > 1 && a.q.batch_stride == t * hd &&
                 a.k.batch_stride == t * hd;
  p.outer = p.over_batch ? a.kv_heads() : a.batch;
  p.inner = p.over_batch ? a.batch : a.kv_heads();
  const kv_strides kv = key_strides(a);
  p.q_slice = p.over_batch ? a.q.batch_stride : per_kv * a.q.head_stride;
  p.kv_slice = p.over_batch ? kv.batch : kv.head;

  // A slice's query heads are one block when there is one of them or they are adjacent.
  const bool stacked = per_kv == 1 || a.q.head_stride == t * hd;
  p.queries = a.bf16    ? attention_plan::query_source::gathered_bf16
              : stacked ? attention_plan::query_source::in_place
                        : attention_plan::query_source::copied;
  p.keys_values = cached   ? attention_plan::kv_source::cache
                  : a.bf16 ? attention_plan::kv_source::gathered_bf16
                           : attention_plan::kv_source::projections;
  const bool gathered_kv = p.keys_values == attention_plan::kv_source::gathered_bf16;

  const std::int64_t group = attention_group(p.inner, rows, n);
  p.geometry = {
      .rows = rows,
      .positions = t,
      .keys = n,
      .head_dim = hd,
      .group = group,
      .q_stride = p.queries == attention_plan::query_source::in_place ? p.q_slice : rows * hd,
      .kv_stride = gathered_kv ? n * hd : p.kv_slice,
      .causal = a.causal,
      .scale = a.scale,
      .mask_per_run = cached,
      .bf16 = a.bf16};
  if (a.bf16) {
    p.gather_q = {{group, per_kv, t, hd}, {p.q_slice, a.q.head_stride, a.q.row_stride, 1}};
    if (gathered_kv) p.gather_kv = {{group, n, hd}, {p.kv_slice, a.k.row_stride, 1}};
  }

  // bf16 elements, two per float.
  const auto bf16_floats = [](std::int64_t elements) {
    return static_cast<std::size_t>((elements + 1) / 2);
  };
  const auto floats = [](std::int64_t n_floats) { return static_cast<std::size_t>(n_floats); };
  p.out_floats = floats(group * rows * hd);
  p.mask_floats = cached ? floats(rows * n) : 0;
  switch (p.queries) {
    case attention_plan::query_source::in_place:
      break;
    case attention_plan::query_source::copied:
      p.query_floats = floats(group * rows * hd);
      break;
    case attention_plan::query_source::gathered_bf16:
      p.query_floats = bf16_floats(group * rows * hd);
      break;
  }
  if (gathered_kv) p.key_floats = p.value_floats = bf16_floats(group * n * hd);
  return p;
}

}  // namespace mha::detail
