#include "backends/onednn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/onednn/attention_plan.hpp"
#include "backends/onednn/runtime.hpp"
#include "base/bf16.hpp"
#include "base/checks.hpp"
#include "base/dropout.hpp"
#include "driver/kv_cache_access.hpp"

namespace mha::detail {
namespace {

// Training mode: every row of a group's attention weights (slices x rows x keys) times the
// shared dropout mask of its (b, h, absolute position) = origin(slice, row) (docs/design.md §1.1).
struct row_origin {
  std::int64_t b, h, position;
};

template <class Origin>
void apply_dropout(const dropout_spec& dropout, float* weights, std::int64_t slices,
                   std::int64_t rows, std::int64_t keys, Origin origin) {
  std::vector<float> multipliers(static_cast<std::size_t>(keys));
  for (std::int64_t s = 0; s < slices; ++s) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const row_origin o = origin(s, r);
      dropout_multipliers(dropout, o.b, o.h, o.position, 0, keys, multipliers.data());
      float* row = weights + (s * rows + r) * keys;
      for (std::int64_t j = 0; j < keys; ++j) row[j] *= multipliers[j];
    }
  }
}

// Floats of each part of a group's lease: scores (with bf16 P after them), then the plan's
// buffers (attention_plan: dense outputs, the decode mask, staged queries, gathered keys and
// values), then the primitives' scratchpad in bytes.
struct group_sizes {
  std::size_t scores, out, mask, queries, keys, values, scratchpad_bytes;
};
// One lease of the scratch pool with those parts, each starting on a 64-byte boundary.
struct group_lease {
  group_lease(const scratch_pool& pool, const group_sizes& s)
      : lease(pool, padded(s.scores) + padded(s.out) + padded(s.mask) + padded(s.queries) +
                        padded(s.keys) + padded(s.values) + floats_holding(s.scratchpad_bytes)),
        scores(lease.data()),
        out(scores + padded(s.scores)),
        mask(out + padded(s.out)),
        queries(mask + padded(s.mask)),
        keys(queries + padded(s.queries)),
        values(keys + padded(s.keys)),
        scratchpad(reinterpret_cast<std::byte*>(values + padded(s.values))) {}
  static std::size_t padded(std::size_t n) { return (n + 15) / 16 * 16; }
  scratch_pool::lease lease;
  float *scores, *out, *mask, *queries, *keys, *values;
  std::byte* scratchpad;
};

// Before sequence b of a decode call attends: its cache rows from its length to the bucket's
// end n zeroed (a reset sequence's stale tokens, NaN among them, never reach the new one), and
// `mask` (rows x n) set for its length: stacked row r (position r % seq_len) sees keys up to
// its own position when causal, all of the sequence's otherwise.
template <class T>
void prepare_sequence(const attention_args& a, std::int64_t b, std::int64_t n, float* mask) {
  namespace cache = row_major_cache;
  const head_view<T> keys = cache::keys<T>(*a.cache, a.head_dim),
                     values = cache::values<T>(*a.cache, a.head_dim);
  const std::int64_t past = a.cache->lengths[b], end = a.keys(b), t = a.seq_len;
  for (std::int64_t g = 0; g < a.kv_heads(); ++g) {
    std::fill(keys.row(b, g, end), keys.row(b, g, n), T{0});  // +0 in float and bf16
    std::fill(values.row(b, g, end), values.row(b, g, n), T{0});
  }
  for (std::int64_t r = 0; r < a.kv_group * t; ++r) {
    const std::int64_t seen = a.causal ? past + r % t + 1 : end;
    for (std::int64_t j = 0; j < n; ++j)
      mask[r * n + j] = j < seen ? 0.0f : -std::numeric_limits<float>::infinity();
  }
}

// The first element e in [from, to) where keys[e] or values[e] is NaN or infinite, else `to`.
// Every causal call scans each slice's new keys and values. Out of line: inlined into attend(),
// GCC 12 reloads a constant on every element for want of registers (measurements: docs/design.md
// §5.1).
template <class T>
[[gnu::noinline]] std::int64_t first_non_finite(const T* keys, const T* values, std::int64_t from,
                                                std::int64_t to) {
  const auto finite = [](T x) {
    if constexpr (std::is_same_v<T, bf16>) {
      return std::isfinite(from_bf16(x));
    } else {
      return std::isfinite(x);
    }
  };
  for (std::int64_t e = from; e < to; ++e) {
    if (!finite(keys[e]) || !finite(values[e])) return e;
  }
  return to;
}

// The dense products multiply masked weights (0) by every key and value, and a masked score
// is computed before the mask is added: a NaN or Inf in token j's K or V would reach the rows
// before j (0 * NaN, NaN + -inf). When a slice of the group has one among this call's tokens
// (key rows [past, end); earlier tokens are seen by every row anyway), its rows at positions
// before the first such token are recomputed from K and V with that token and every later
// one replaced by 0, which those rows never see: their outputs are then exactly those of the
// same input without the NaN.
template <class T, class Between>
void keep_causal_rows_finite(const attention_steps& steps, dnnl::stream& stream,
                             const group_lease& buf, const void* q, const T* k, const T* v,
                             std::int64_t past, std::int64_t end, Between& between) {
  const attention_geometry& g = steps.geometry();
  const std::int64_t hd = g.head_dim, stride = g.kv_stride > 0 ? g.kv_stride : g.keys * hd;
  std::vector<std::int64_t> first_bad(static_cast<std::size_t>(g.group), end);
  bool any = false;
  for (std::int64_t s = 0; s < g.group; ++s) {
    const std::int64_t bad = first_non_finite(k + s * stride, v + s * stride, past * hd, end * hd);
    if (bad < end * hd) {
      first_bad[static_cast<std::size_t>(s)] = bad / hd;
      any = true;
    }
  }
  if (!any) return;
  // Copies of the group's keys and values in their strided layout, each slice's tokens from
  // its first_bad on zeroed.
  const auto cleaned = [&](const T* from) {
    std::vector<T> copy(from, from + (g.group - 1) * stride + g.keys * hd);
    for (std::int64_t s = 0; s < g.group; ++s) {
      std::fill(copy.begin() + s * stride + first_bad[static_cast<std::size_t>(s)] * hd,
                copy.begin() + s * stride + g.keys * hd, T{0});
    }
    return copy;
  };
  const std::vector<T> clean_k = cleaned(k), clean_v = cleaned(v);
  std::vector<float> rows(static_cast<std::size_t>(g.group * g.rows * hd));
  steps.run_group(stream, q, clean_k.data(), clean_v.data(), rows.data(), buf.scores,
                  buf.scratchpad, between, g.mask_per_run ? buf.mask : nullptr);
  stream.wait();
  for (std::int64_t s = 0; s < g.group; ++s) {
    const std::int64_t before = first_bad[static_cast<std::size_t>(s)] - past;
    for (std::int64_t r = 0; r < g.rows; ++r) {
      if (r % g.positions < before) {
        std::copy_n(rows.data() + (s * g.rows + r) * hd, hd, buf.out + (s * g.rows + r) * hd);
      }
    }
  }
}

// A group's queries (slices p.slice(o, first, 0 .. group - 1)) where the primitives read
// them: in place in a.q, or staged in buf.queries (copied, or gathered by `gather`).
const void* group_queries(const attention_args& a, const attention_plan& p, std::int64_t o,
                          std::int64_t first, const reorder_step* gather, dnnl::stream& stream,
                          const group_lease& buf) {
  const std::int64_t t = a.seq_len, hd = a.head_dim, per_kv = a.kv_group, rows = p.geometry.rows;
  const auto [b0, kv0] = p.slice(o, first, 0);
  switch (p.queries) {
    case attention_plan::query_source::in_place:
      break;
    case attention_plan::query_source::copied:
      for (std::int64_t s = 0; s < p.geometry.group; ++s) {
        const auto [b, kv] = p.slice(o, first, s);
        for (std::int64_t r = 0; r < rows; ++r)
          std::copy_n(a.q.row(b, kv * per_kv + r / t, r % t), hd,
                      buf.queries + (s * rows + r) * hd);
      }
      return buf.queries;
    case attention_plan::query_source::gathered_bf16:
      gather->run(stream, a.q.row(b0, kv0 * per_kv, 0), buf.queries, buf.scratchpad);
      return buf.queries;
  }
  return a.q.row(b0, kv0 * per_kv, 0);
}

// A group's keys and values where the primitives read them: in place in a.k and a.v or in the
// cache (cached_k, cached_v), or gathered by `gather` into buf.keys and buf.values.
template <class T>
std::pair<const T*, const T*> group_keys_values(const attention_args& a, const attention_plan& p,
                                                std::int64_t o, std::int64_t first,
                                                const head_view<const T>& cached_k,
                                                const head_view<const T>& cached_v,
                                                const reorder_step* gather, dnnl::stream& stream,
                                                const group_lease& buf) {
  const auto [b0, kv0] = p.slice(o, first, 0);
  switch (p.keys_values) {
    case attention_plan::kv_source::projections:
      break;
    case attention_plan::kv_source::cache:
      return {cached_k.row(b0, kv0, 0), cached_v.row(b0, kv0, 0)};
    case attention_plan::kv_source::gathered_bf16:
      gather->run(stream, a.k.row(b0, kv0, 0), buf.keys, buf.scratchpad);
      gather->run(stream, a.v.row(b0, kv0, 0), buf.values, buf.scratchpad);
      return {reinterpret_cast<const T*>(buf.keys), reinterpret_cast<const T*>(buf.values)};
  }
  return {reinterpret_cast<const T*>(a.k.row(b0, kv0, 0)),
          reinterpret_cast<const T*>(a.v.row(b0, kv0, 0))};
}

// The head merge: each row of a group's dense outputs into its head's columns of a.out.
void merge_heads(const attention_args& a, const attention_plan& p, std::int64_t o,
                 std::int64_t first, const float* out) {
  const std::int64_t t = a.seq_len, hd = a.head_dim, per_kv = a.kv_group, rows = p.geometry.rows;
  for (std::int64_t s = 0; s < p.geometry.group; ++s) {
    const auto [b, kv] = p.slice(o, first, s);
    for (std::int64_t r = 0; r < rows; ++r)
      std::copy_n(out + (s * rows + r) * hd, hd, a.out.row(b, kv * per_kv + r / t, r % t));
  }
}

// onednn_attention() with the primitives reading Q, K and V as T: float, or bf16 (the cache
// holds bf16).
template <class T>
void attend(const attention_args& a, const primitive_caches& primitives, const scratch_pool& pool) {
  namespace cache = row_major_cache;
  if (a.cache != nullptr) {
    if constexpr (std::is_same_v<T, bf16>) {
      cache::append<T>(a, to_bf16);
    } else {
      cache::append(a);
    }
  }
  const attention_plan p = plan_attention(a);
  const attention_geometry& g = p.geometry;
  // The scores of a group (at least one slice of rows x keys) and the mask (rows x keys).
  check_score_memory(onednn_name, g.rows, g.keys, 2);
  head_view<const T> cached_k, cached_v;  // decode: the cache's rows
  if (a.cache != nullptr) {
    cached_k = cache::keys<T>(*a.cache, a.head_dim);
    cached_v = cache::values<T>(*a.cache, a.head_dim);
  }
  rethrowing_dnnl_errors(
      [&] { return text("in attention over ", g.keys, " keys"); },
      [&] {
        const auto steps = primitives.attention(g);
        std::shared_ptr<const reorder_step> gather_q, gather_kv;
        if (p.queries == attention_plan::query_source::gathered_bf16)
          gather_q = primitives.to_bf16(p.gather_q.dims, p.gather_q.strides);
        if (p.keys_values == attention_plan::kv_source::gathered_bf16)
          gather_kv = primitives.to_bf16(p.gather_kv.dims, p.gather_kv.strides);
        std::size_t scratchpad = steps->scratchpad_bytes();
        for (const auto& r : {gather_q, gather_kv}) {
          if (r) scratchpad = std::max(scratchpad, scratchpad_bytes(r->pd));
        }
        const group_lease buf(pool, {.scores = steps->score_buffer_floats(),
                                     .out = p.out_floats,
                                     .mask = p.mask_floats,
                                     .queries = p.query_floats,
                                     .keys = p.key_floats,
                                     .values = p.value_floats,
                                     .scratchpad_bytes = scratchpad});
        dnnl::stream& stream = caller_stream();
        for (std::int64_t o = 0; o < p.outer; ++o) {
          if (a.cache != nullptr) prepare_sequence<T>(a, o, g.keys, buf.mask);
          const std::int64_t past = a.cache ? a.cache->lengths[o] : 0,
                             end = a.cache ? a.keys(o) : a.seq_len;
          for (std::int64_t first = 0; first < p.inner; first += g.group) {
            // Row r of slice s of this group as (b, module-wide h, absolute position).
            const auto origin = [&](std::int64_t s, std::int64_t r) {
              const auto [b, kv] = p.slice(o, first, s);
              return row_origin{a.first_batch + b, a.first_head + kv * a.kv_group + r / a.seq_len,
                                past + r % a.seq_len};
            };
            const auto between = [&](float* weights) {
              if (a.dropout.active())
                apply_dropout(a.dropout, weights, g.group, g.rows, g.keys, origin);
            };
            const void* q = group_queries(a, p, o, first, gather_q.get(), stream, buf);
            const auto [k, v] = group_keys_values<T>(a, p, o, first, cached_k, cached_v,
                                                     gather_kv.get(), stream, buf);
            steps->run_group(stream, q, k, v, buf.out, buf.scores, buf.scratchpad, between,
                             a.cache ? buf.mask : nullptr);
            stream.wait();
            if (a.causal) keep_causal_rows_finite(*steps, stream, buf, q, k, v, past, end, between);
            merge_heads(a, p, o, first, buf.out);
          }
        }
      });
}

}  // namespace

void onednn_attention(const attention_args& a, const primitive_caches& primitives,
                      const scratch_pool& scratch) {
  if (a.bf16) {
    attend<bf16>(a, primitives, scratch);
  } else {
    attend<float>(a, primitives, scratch);
  }
}

}  // namespace mha::detail
