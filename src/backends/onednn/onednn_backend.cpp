// The oneDNN backend: the shared wrapper / split-weight drivers (driver/driver.hpp) over a kernel
// set of oneDNN primitives (docs/design.md §2), built on first use of a shape and cached per plan.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/onednn/introspection.hpp"
#include "backends/onednn/primitive_cache.hpp"
#include "backends/onednn/primitives.hpp"
#include "backends/onednn/runtime.hpp"
#include "core/bf16.hpp"
#include "core/checks.hpp"
#include "core/dropout.hpp"
#include "core/text.hpp"
#include "driver/driver.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::caller_stream;
using detail::cpu_engine;
using detail::rethrowing_dnnl_errors;
using detail::scratch_pool;
using detail::text;

// Training mode: every row of a group's attention weights (slices x rows x keys) times the
// shared dropout mask of its (b, h, absolute position) = origin(slice, row) (docs/design.md §1.1).
struct row_origin {
  std::int64_t b, h, position;
};

template <class Origin>
void apply_dropout(const detail::dropout_spec& dropout, float* weights, std::int64_t slices,
                   std::int64_t rows, std::int64_t keys, Origin origin) {
  std::vector<float> multipliers(static_cast<std::size_t>(keys));
  for (std::int64_t s = 0; s < slices; ++s) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const row_origin o = origin(s, r);
      detail::dropout_multipliers(dropout, o.b, o.h, o.position, 0, keys, multipliers.data());
      float* row = weights + (s * rows + r) * keys;
      for (std::int64_t j = 0; j < keys; ++j) row[j] *= multipliers[j];
    }
  }
}

// The oneDNN primitives as a kernel set of the shared drivers (driver/driver.hpp), sequential
// between primitives (each primitive is threaded by oneDNN's OpenMP runtime):
//   linear:        one matmul with fused bias, on weights packed in oneDNN's preferred layout
//                  (bf16: x first rounded to bf16 by a reorder);
//   project_heads: that matmul into a staging buffer, then a reorder into (batch, heads,
//                  seq_len, head_dim), the layout the attention primitives read a group of
//                  heads from;
//   attention:     per group of (b, K/V head) slices, each the rows of the K/V head's query
//                  heads stacked: scores (matmul with the scale and the mask fused), softmax in
//                  place, weights V (matmul) into a dense buffer, whose rows are then copied to
//                  the output's strided columns (the head merge). bf16: Q (and, without a
//                  cache, K and V) gathered by reorders into dense bf16 slices first, the
//                  softmax weights rounded as attention_steps::run_group says, the cache
//                  held as bf16.
// Primitives are built on first use of their shape and team size and kept per plan
// (primitive_cache.hpp); every primitive runs on a user scratchpad, taken with the staging,
// scores and output buffers from one lease of the set's scratch pool.
class onednn_kernel_set {
 public:
  explicit onednn_kernel_set(const mha::config& cfg) : bf16_(cfg.precision == precision::bf16) {}
  using packed_linear = detail::packed_linear;

  packed_linear pack(const linear_weights& w) const {
    return rethrowing_dnnl_errors([&] { return text("packing a (", w.out, ", ", w.in, ") layer"); },
                                  [&] { return detail::pack_linear(cpu_engine(), w, bf16_); });
  }

  void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) const {
    rethrowing_dnnl_errors(
        [&] { return text("in a (", rows, " rows) projection"); },
        [&] {
          const auto step = primitives_.linear(w, rows);
          const layer_input in = input_of(w, rows);
          scratch_pool::lease scratch(
              scratch_, in.floats + floats(std::max(detail::scratchpad_bytes(step->pd),
                                                    in.scratchpad_bytes())));
          std::byte* scratchpad = bytes(scratch, in.floats);
          dnnl::stream& stream = caller_stream();
          const void* src = in.convert(stream, x, scratch.data(), scratchpad);
          step->run(stream, src, w.weight_data(), w.bias_data(), y, nullptr, scratchpad);
          stream.wait();
        });
  }

  // One head is already head-major; more go through the staging buffer and the head split.
  std::optional<detail::head_view<const float>> project_heads(const packed_linear& w,
                                                              const float* x, std::int64_t batch,
                                                              std::int64_t seq_len,
                                                              std::int64_t heads, float* y) const {
    if (heads == 1) return std::nullopt;
    const std::int64_t rows = batch * seq_len, width = w.weights.get_desc().dims()[1];
    const std::int64_t hd = width / heads;
    rethrowing_dnnl_errors(
        [&] { return text("in a (", rows, " rows) head projection"); },
        [&] {
          const auto step = primitives_.linear(w, rows);
          const layer_input in = input_of(w, rows);
          const auto split = primitives_.head_split(batch, seq_len, heads, hd);
          const std::size_t staging = static_cast<std::size_t>(rows * width);
          const std::size_t pad =
              floats(std::max({detail::scratchpad_bytes(step->pd),
                               detail::scratchpad_bytes(split->pd), in.scratchpad_bytes()}));
          scratch_pool::lease scratch(scratch_, staging + in.floats + pad);
          float* projected = scratch.data();
          std::byte* scratchpad = bytes(scratch, staging + in.floats);
          dnnl::stream& stream = caller_stream();
          const void* src = in.convert(stream, x, projected + staging, scratchpad);
          step->run(stream, src, w.weight_data(), w.bias_data(), projected, nullptr, scratchpad);
          split->run(stream, projected, y, scratchpad);
          stream.wait();
        });
    return detail::head_view<const float>{y, heads * seq_len * hd, seq_len * hd, hd};
  }

  // Decode: the plain row-major cache (bf16 elements in bf16), read in place through strided
  // descriptors.
  std::int64_t cache_head_bytes(std::int64_t capacity, std::int64_t head_dim) const {
    return bf16_ ? detail::row_major_cache::head_bytes<detail::bf16>(capacity, head_dim)
                 : detail::row_major_cache::head_bytes<float>(capacity, head_dim);
  }

  static constexpr bool grouped_kv = true;  // a K/V head's query heads are one slice's rows
  // bf16 matmuls; the backend declines bf16 where oneDNN has no native bf16 kernels
  // (onednn_impl::supports).
  static constexpr bool bf16 = true;

  // The attention of a full forward or, with a cache, of a decode call (docs/design.md §1.4:
  // the new keys and values appended to the row-major cache, then each sequence's queries
  // against its cached rows, read in place through strided descriptors and padded to a bucket
  // of keys all sequences of the call share: key_bucket rebuilds primitives ~8 times per
  // doubling of the context, not every step; the padding is zeroed and masked).
  //
  // A slice is one (b, g): the rows of K/V head g's query heads, stacked head after head
  // (rows = kv_group * seq_len), against g's keys and values. Slices are taken `group` at a
  // time along the axis their memory runs along: K/V heads within a sequence, or (the
  // wrapper's per-head buffers, one head per K/V head) sequences within a head. When a
  // slice's query rows are not one dense block (the wrapper with grouped K/V and batch > 1),
  // they are copied into one first.
  void attention(const detail::attention_args& a) const {
    if (bf16_) {
      attend<detail::bf16>(a);
    } else {
      attend<float>(a);
    }
  }

  // run_options::threads as the calling thread's OpenMP team size for the run.
  template <class F>
  void run(const run_options& options, F&& f) const {
    const detail::openmp_team team(options.threads);
    f();
  }
  template <class F>
  static void for_each(std::int64_t n, F&& f) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }

  // Introspection (introspection.hpp): primitive_caches::implementations and team_sizes.
  const detail::primitive_caches& primitives() const noexcept { return primitives_; }

 private:
  static std::size_t floats(std::size_t bytes) {
    return (bytes + sizeof(float) - 1) / sizeof(float);
  }
  static std::byte* bytes(scratch_pool::lease& scratch, std::size_t offset = 0) {
    return reinterpret_cast<std::byte*>(scratch.data() + offset);
  }

  // A layer's input as its matmul reads it: x itself, or (a bf16 layer) x rounded to bf16 into
  // `floats` floats of staging.
  struct layer_input {
    std::shared_ptr<const detail::reorder_step> rounding;  // null: x as it is
    std::size_t floats = 0;

    std::size_t scratchpad_bytes() const {
      return rounding ? detail::scratchpad_bytes(rounding->pd) : 0;
    }
    const void* convert(dnnl::stream& stream, const float* x, float* staging,
                        std::byte* scratchpad) const {
      if (!rounding) return x;
      rounding->run(stream, x, staging, scratchpad);
      return staging;
    }
  };
  layer_input input_of(const packed_linear& w, std::int64_t rows) const {
    if (!w.bf16) return {};
    const std::int64_t in = w.weights.get_desc().dims()[0];
    return {primitives_.to_bf16({rows, in}, {in, 1}),
            static_cast<std::size_t>((rows * in + 1) / 2)};
  }

  // Floats of each part of a group's lease: scores (with bf16 P after them), dense outputs,
  // the (rows, keys) mask (decode), staged queries (f32 when a slice's rows are not one dense
  // block; bf16 always), gathered bf16 keys and values (bf16 without a cache), then the
  // primitives' scratchpad in bytes.
  struct group_sizes {
    std::size_t scores, out, mask, queries, keys, values, scratchpad_bytes;
  };
  // One lease of the scratch pool with those parts, each starting on a 64-byte boundary.
  struct group_lease {
    group_lease(const scratch_pool& pool, const group_sizes& s)
        : lease(pool, padded(s.scores) + padded(s.out) + padded(s.mask) + padded(s.queries) +
                          padded(s.keys) + padded(s.values) + floats(s.scratchpad_bytes)),
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

  // attention() with the primitives reading Q, K and V as T: float, or detail::bf16 (Q, and K
  // and V without a cache, gathered into dense bf16 slices per group; the cache holds bf16).
  template <class T>
  void attend(const detail::attention_args& a) const {
    namespace cache = detail::row_major_cache;
    constexpr bool in_bf16 = std::is_same_v<T, detail::bf16>;
    if (a.cache != nullptr) {
      if constexpr (in_bf16) {
        cache::append<T>(a, detail::to_bf16);
      } else {
        cache::append(a);
      }
    }
    const std::int64_t t = a.seq_len, hd = a.head_dim, per_kv = a.kv_group, rows = per_kv * t;
    std::int64_t longest = t;
    for (std::int64_t b = 0; b < a.batch; ++b) longest = std::max(longest, a.keys(b));
    const std::int64_t n = a.cache ? detail::key_bucket(longest, a.cache->capacity) : t;
    // The scores of a group (at least one slice of rows x n) and the mask (rows x n).
    detail::check_score_memory(detail::onednn_name, rows, n, 2);
    // The cache's rows (as T), or this call's projections (as float).
    const detail::head_view<const T> cached_k = a.cache ? cache::keys<T>(*a.cache, hd)
                                                        : detail::head_view<T>{},
                                     cached_v = a.cache ? cache::values<T>(*a.cache, hd)
                                                        : detail::head_view<T>{};
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
          const std::int64_t group = detail::attention_group(inner, rows, n);
          const detail::attention_geometry g{.rows = rows,
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
          const auto steps = primitives_.attention(g);
          // bf16: the reorders gathering a group's queries, keys and values.
          std::shared_ptr<const detail::reorder_step> gather_q, gather_kv;
          if constexpr (in_bf16) {
            gather_q = primitives_.to_bf16({group, per_kv, t, hd},
                                           {q_slice, a.q.head_stride, a.q.row_stride, 1});
            if (gathered_kv)
              gather_kv = primitives_.to_bf16({group, n, hd}, {kv_slice, a.k.row_stride, 1});
          }
          const auto gathered = [&](std::int64_t elements) {
            return static_cast<std::size_t>(in_bf16 ? (elements + 1) / 2 : 0);
          };
          std::size_t scratchpad = steps->scratchpad_bytes();
          for (const auto& r : {gather_q, gather_kv}) {
            if (r) scratchpad = std::max(scratchpad, detail::scratchpad_bytes(r->pd));
          }
          group_lease buf(scratch_,
                          {.scores = steps->score_buffer_floats(),
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

  // Before sequence b of a decode call attends: its cache rows from its length to the bucket's
  // end n zeroed (a reset sequence's stale tokens, NaN among them, never reach the new one), and
  // `mask` (rows x n) set for its length: stacked row r (position r % seq_len) sees keys up to
  // its own position when causal, all of the sequence's otherwise.
  template <class T>
  static void prepare_sequence(const detail::attention_args& a, std::int64_t b, std::int64_t n,
                               float* mask) {
    namespace cache = detail::row_major_cache;
    const detail::head_view<T> keys = cache::keys<T>(*a.cache, a.head_dim),
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
  void keep_causal_rows_finite(const detail::attention_steps& steps, dnnl::stream& stream,
                               const group_lease& buf, const void* q, const T* k, const T* v,
                               std::int64_t past, std::int64_t end, Between& between) const {
    const detail::attention_geometry& g = steps.geometry();
    const std::int64_t hd = g.head_dim, stride = g.kv_stride > 0 ? g.kv_stride : g.keys * hd;
    const auto finite = [](T x) {
      if constexpr (std::is_same_v<T, detail::bf16>) {
        return std::isfinite(detail::from_bf16(x));
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

  detail::primitive_caches primitives_;
  scratch_pool scratch_;
  bool bf16_;
};

using onednn_plan = detail::driver_plan<onednn_kernel_set>;

// The ISA oneDNN's kernels run on (dnnl::get_effective_cpu_isa()), in oneDNN's spelling.
std::string_view isa_name(dnnl::cpu_isa isa) {
  using enum dnnl::cpu_isa;
  static constexpr std::pair<dnnl::cpu_isa, std::string_view> names[] = {
      {sse41, "sse41"},
      {avx, "avx"},
      {avx2, "avx2"},
      {avx2_vnni, "avx2_vnni"},
      {avx512_mic, "avx512_mic"},
      {avx512_mic_4ops, "avx512_mic_4ops"},
      {avx512_core, "avx512_core"},
      {avx512_core_vnni, "avx512_core_vnni"},
      {avx512_core_bf16, "avx512_core_bf16"},
      {avx512_core_amx, "avx512_core_amx"}};
  for (const auto& [value, name] : names) {
    if (value == isa) return name;
  }
  return "unknown ISA";
}

// The class of oneDNN's effective ISA (its "avx" has no FMA: portable, as sse41).
mha::isa isa_class(dnnl::cpu_isa isa) {
  using enum dnnl::cpu_isa;
  switch (isa) {
    case avx2:
    case avx2_vnni:
      return mha::isa::avx2;
    case avx512_mic:
    case avx512_mic_4ops:
    case avx512_core:
    case avx512_core_vnni:
      return mha::isa::avx512;
    case avx512_core_bf16:
      return mha::isa::avx512bf16;
    case avx512_core_amx:
      return mha::isa::amx;
    default:
      return mha::isa::sse41;
  }
}

// Whether oneDNN's kernels multiply bf16 natively here (AVX512_BF16 or AMX). Below that,
// oneDNN 2.6 emulates bf16 on avx512_core with extra instructions per product, or (AVX2) has
// no bf16 matmul at all: slower than fp32, which is not what a bf16 plan is for.
bool native_bf16() { return mha::native_bf16(isa_class(dnnl::get_effective_cpu_isa())); }

// dnnl::version()->cpu_runtime as a word.
std::string_view runtime_name(unsigned runtime) {
  switch (runtime) {
    case DNNL_RUNTIME_OMP:
      return "OpenMP";
    case DNNL_RUNTIME_TBB:
      return "TBB";
    case DNNL_RUNTIME_SEQ:
      return "sequential";
    default:
      return "unknown";
  }
}

struct onednn_impl final : backend {
  std::string_view name() const noexcept override { return detail::onednn_name; }
  std::string description() const override {
    const dnnl::version_t* v = dnnl::version();
    return text("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (",
                runtime_name(v->cpu_runtime), " runtime), ",
                isa_name(dnnl::get_effective_cpu_isa()),
                native_bf16() ? ", fp32 and bf16" : ", fp32");
  }
  mha::isa isa() const override { return isa_class(dnnl::get_effective_cpu_isa()); }
  int max_threads() const noexcept override { return detail::team_size(); }
  // What the kernel set computes: grouped K/V heads, decode and bf16, the last only where
  // oneDNN runs bf16 matmuls natively.
  support supports(const problem& p) const override {
    if (p.cfg.precision == precision::bf16 && !native_bf16()) {
      return support::no(
          text("bf16 needs oneDNN's avx512_core_bf16 kernels or newer, and its "
               "effective ISA here is ",
               isa_name(dnnl::get_effective_cpu_isa())));
    }
    return detail::driver_support<onednn_kernel_set>(p);
  }

 private:
  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return std::make_unique<onednn_plan>(cfg, form, w, name());
  }
};

}  // namespace

const backend& onednn_backend() {
  static const onednn_impl instance;
  return instance;
}

bool onednn_thread_count_bitwise() {
  using enum dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case avx512_core:
    case avx512_core_vnni:
    case avx512_core_bf16:
    case avx512_core_amx:
      return true;
    default:
      return false;
  }
}

namespace {

// p as the oneDNN plan it must be, with (batch, seq_len) in its range; `caller` names the
// introspection function in the errors.
const onednn_plan& introspected(std::string_view caller, const plan& p, std::int64_t batch,
                                std::int64_t seq_len) {
  const auto* own = dynamic_cast<const onednn_plan*>(&p);
  if (own == nullptr) {
    throw invalid_argument(
        text(caller, ": the plan is from backend '", p.backend_name(), "', expected onednn"));
  }
  if (batch < 1 || seq_len < 1 || seq_len > p.config().context_length) {
    throw invalid_argument(
        text(caller, ": shape (batch ", batch, ", seq_len ", seq_len,
             ") needs batch >= 1 and 1 <= seq_len <= ", p.config().context_length));
  }
  return *own;
}

}  // namespace

std::vector<std::string> detail::onednn_implementations(const plan& p, std::int64_t batch,
                                                        std::int64_t seq_len) {
  const onednn_plan& own = introspected("onednn_implementations", p, batch, seq_len);
  // A run on zeros builds (or finds) every primitive of the shape at the caller's team size.
  const std::vector<float> x(static_cast<std::size_t>(batch * seq_len * p.config().d_in));
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * p.config().d_out));
  p.run({x.data(), batch, seq_len, p.config().d_in}, {y.data(), batch, seq_len, p.config().d_out});
  return own.kernels().primitives().implementations(batch, seq_len);
}

std::vector<int> detail::onednn_cached_team_sizes(const plan& p, std::int64_t batch,
                                                  std::int64_t seq_len) {
  return introspected("onednn_cached_team_sizes", p, batch, seq_len)
      .kernels()
      .primitives()
      .team_sizes(batch, seq_len);
}

}  // namespace mha
