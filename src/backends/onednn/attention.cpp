#include "backends/onednn/attention.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/onednn/runtime.hpp"
#include "core/bf16.hpp"
#include "core/checks.hpp"
#include "core/dropout.hpp"
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
  const auto finite = [](T x) {
    if constexpr (std::is_same_v<T, bf16>) {
      return std::isfinite(from_bf16(x));
    } else {
      return std::isfinite(x);
    }
  };
  std::vector<std::int64_t> first_bad(static_cast<std::size_t>(g.group), end);
  bool any = false;
  for (std::int64_t s = 0; s < g.group; ++s) {
    for (std::int64_t e = past * hd; e < end * hd; ++e) {
      if (!finite(k[s * stride + e]) || !finite(v[s * stride + e])) {
        first_bad[static_cast<std::size_t>(s)] = e / hd;
        any = true;
        break;
      }
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

// onednn_attention() with the primitives reading Q, K and V as T: float, or bf16 (Q, and K
// and V without a cache, gathered into dense bf16 slices per group; the cache holds bf16).
template <class T>
void attend(const attention_args& a, const primitive_caches& primitives, const scratch_pool& pool) {
  namespace cache = row_major_cache;
  constexpr bool in_bf16 = std::is_same_v<T, bf16>;
  if (a.cache != nullptr) {
    if constexpr (in_bf16) {
      cache::append<T>(a, to_bf16);
    } else {
      cache::append(a);
    }
  }
  const std::int64_t t = a.seq_len, hd = a.head_dim, per_kv = a.kv_group, rows = per_kv * t;
  std::int64_t longest = t;
  for (std::int64_t b = 0; b < a.batch; ++b) longest = std::max(longest, a.keys(b));
  const std::int64_t n = a.cache ? key_bucket(longest, a.cache->capacity) : t;
  // The scores of a group (at least one slice of rows x n) and the mask (rows x n).
  check_score_memory(onednn_name, rows, n, 2);
  // The cache's rows (as T), or this call's projections (as float).
  const head_view<const T> cached_k = a.cache ? cache::keys<T>(*a.cache, hd) : head_view<T>{},
                           cached_v = a.cache ? cache::values<T>(*a.cache, hd) : head_view<T>{};
  const std::int64_t kv_batch_stride = a.cache ? cached_k.batch_stride : a.k.batch_stride,
                     kv_head_stride = a.cache ? cached_k.head_stride : a.k.head_stride;
  assert(a.q.row_stride == hd && a.k.row_stride == hd && a.k.head_stride == a.v.head_stride &&
         a.k.batch_stride == a.v.batch_stride);
  const bool over_batch = a.cache == nullptr && per_kv == 1 && a.batch > 1 &&
                          a.q.batch_stride == t * hd && a.k.batch_stride == t * hd;
  const bool stacked = per_kv == 1 || a.q.head_stride == t * hd;
  const std::int64_t outer = over_batch ? a.kv_heads() : a.batch,
                     inner = over_batch ? a.batch : a.kv_heads();
  // Elements from one slice's queries (keys and values) to the next's in a.q (a.k, a.v or
  // the cache).
  const std::int64_t q_slice = over_batch ? a.q.batch_stride : per_kv * a.q.head_stride,
                     kv_slice = over_batch ? kv_batch_stride : kv_head_stride;
  // Where the primitives read K and V from: the projections or cache in place, or (bf16
  // without a cache) dense gathered slices.
  const bool gathered_kv = in_bf16 && a.cache == nullptr;
  rethrowing_dnnl_errors(
      [&] { return text("in attention over ", n, " keys"); },
      [&] {
        const std::int64_t group = attention_group(inner, rows, n);
        const attention_geometry g{.rows = rows,
                                   .positions = t,
                                   .keys = n,
                                   .head_dim = hd,
                                   .group = group,
                                   .q_stride = in_bf16 || !stacked ? rows * hd : q_slice,
                                   .kv_stride = gathered_kv ? n * hd : kv_slice,
                                   .causal = a.causal,
                                   .scale = a.scale,
                                   .mask_per_run = a.cache != nullptr,
                                   .bf16 = in_bf16};
        const auto steps = primitives.attention(g);
        // bf16: the reorders gathering a group's queries, keys and values.
        std::shared_ptr<const reorder_step> gather_q, gather_kv;
        if constexpr (in_bf16) {
          gather_q = primitives.to_bf16({group, per_kv, t, hd},
                                        {q_slice, a.q.head_stride, a.q.row_stride, 1});
          if (gathered_kv)
            gather_kv = primitives.to_bf16({group, n, hd}, {kv_slice, a.k.row_stride, 1});
        }
        const auto gathered = [&](std::int64_t elements) {
          return static_cast<std::size_t>(in_bf16 ? (elements + 1) / 2 : 0);
        };
        std::size_t scratchpad = steps->scratchpad_bytes();
        for (const auto& r : {gather_q, gather_kv}) {
          if (r) scratchpad = std::max(scratchpad, scratchpad_bytes(r->pd));
        }
        group_lease buf(pool, {.scores = steps->score_buffer_floats(),
                               .out = static_cast<std::size_t>(group * rows * hd),
                               .mask = a.cache ? static_cast<std::size_t>(rows * n) : 0,
                               .queries = in_bf16   ? gathered(group * rows * hd)
                                          : stacked ? 0
                                                    : static_cast<std::size_t>(group * rows * hd),
                               .keys = gathered_kv ? gathered(group * n * hd) : 0,
                               .values = gathered_kv ? gathered(group * n * hd) : 0,
                               .scratchpad_bytes = scratchpad});
        dnnl::stream& stream = caller_stream();
        for (std::int64_t o = 0; o < outer; ++o) {
          if (a.cache != nullptr) prepare_sequence<T>(a, o, n, buf.mask);
          const std::int64_t past = a.cache ? a.cache->lengths[o] : 0,
                             end = a.cache ? a.keys(o) : t;
          for (std::int64_t first = 0; first < inner; first += group) {
            // Slice s of this group as (b, K/V head).
            const auto slice = [&](std::int64_t s) {
              return over_batch ? std::pair{first + s, o} : std::pair{o, first + s};
            };
            // Row r of slice s as (b, module-wide h, absolute position).
            const auto origin = [&](std::int64_t s, std::int64_t r) {
              const auto [b, kv] = slice(s);
              return row_origin{a.first_batch + b, a.first_head + kv * per_kv + r / t,
                                past + r % t};
            };
            const auto between = [&](float* weights) {
              if (a.dropout.active()) apply_dropout(a.dropout, weights, group, rows, n, origin);
            };
            const auto [b0, kv0] = slice(0);
            const void* q = a.q.row(b0, kv0 * per_kv, 0);
            if (gather_q) {
              gather_q->run(stream, q, buf.queries, buf.scratchpad);
              q = buf.queries;
            } else if (!stacked) {
              for (std::int64_t s = 0; s < group; ++s) {
                const auto [b, kv] = slice(s);
                for (std::int64_t r = 0; r < rows; ++r)
                  std::copy_n(a.q.row(b, kv * per_kv + r / t, r % t), hd,
                              buf.queries + (s * rows + r) * hd);
              }
              q = buf.queries;
            }
            const T *ks = nullptr, *vs = nullptr;
            if (a.cache != nullptr) {
              ks = cached_k.row(b0, kv0, 0);
              vs = cached_v.row(b0, kv0, 0);
            } else if (gather_kv) {
              gather_kv->run(stream, a.k.row(b0, kv0, 0), buf.keys, buf.scratchpad);
              gather_kv->run(stream, a.v.row(b0, kv0, 0), buf.values, buf.scratchpad);
              ks = reinterpret_cast<const T*>(buf.keys);
              vs = reinterpret_cast<const T*>(buf.values);
            } else {
              ks = reinterpret_cast<const T*>(a.k.row(b0, kv0, 0));
              vs = reinterpret_cast<const T*>(a.v.row(b0, kv0, 0));
            }
            steps->run_group(stream, q, ks, vs, buf.out, buf.scores, buf.scratchpad, between,
                             a.cache ? buf.mask : nullptr);
            stream.wait();
            if (a.causal)
              keep_causal_rows_finite(*steps, stream, buf, q, ks, vs, past, end, between);
            // The head merge: each row into its head's columns of the output.
            for (std::int64_t s = 0; s < group; ++s) {
              const auto [b, kv] = slice(s);
              for (std::int64_t r = 0; r < rows; ++r)
                std::copy_n(buf.out + (s * rows + r) * hd, hd,
                            a.out.row(b, kv * per_kv + r / t, r % t));
            }
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
