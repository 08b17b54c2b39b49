// mha::attention: SDPA's arguments checked, then cut into kernel calls whose query rows stand at
// the end of their keys (detail::attention_args: query i at position past + i over past +
// seq_len keys), which is every case of docs/design.md §1.8:
//   query rows L <= keys S, not causal or bottom_right:  one call, past = S - L;
//   top_left causal, L <= S:  one causal call over the first L keys (past 0): no query sees more;
//   L > S, rows that see every key (top_left rows from S on, any non-causal row):  calls of at
//     most S rows each, not causal, past = S - rows;
//   bottom_right causal, L > S:  the first L - S rows see no key (zeros), the last S one causal
//     call over the S keys (past 0).
#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include "base/checks.hpp"
#include "base/text.hpp"
#include "common/attention_args.hpp"
#include "common/attention_calls.hpp"
#include "core/attention_checks.hpp"
#include "mha/backend.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::check_operands, detail::checked_scale, detail::empty, detail::set_extensions,
    detail::shape_of, detail::text;
constexpr std::string_view where = detail::attention_call;

// Sizes may be 0 (SDPA's empty tensors: nothing to compute); an empty view may have no data.
template <class T>
void check_view(std::string_view name, const heads_view<T>& t) {
  if (t.batch < 0 || t.heads < 0 || t.rows < 0 || t.head_dim < 0) {
    throw invalid_argument(text(where, ": ", name, " is ", shape_of(t),
                                ", expected (batch, heads, rows, head_dim) each >= 0"));
  }
  if (t.data == nullptr && !empty(t))
    throw invalid_argument(
        text(where, ": ", name, " of shape ", shape_of(t), " has no data (nullptr)"));
  if (t.batch_stride < 0 || t.head_stride < 0 || t.row_stride < 0) {
    throw invalid_argument(text(where, ": ", name, " has strides (", t.batch_stride, ", ",
                                t.head_stride, ", ", t.row_stride, ", 1), expected >= 0"));
  }
  detail::check_byte_count(where, name, {t.batch, t.heads, t.rows, t.head_dim}, sizeof(T));
}

// The last element's offset + 1 of a strided view whose last dimension is contiguous (`last`
// elements) and whose other dimensions are (size, stride) pairs (0 when a size is 0); nullopt
// past what an int64 counts (the kernels index views with int64 offsets).
std::optional<std::int64_t> extent_of(
    std::int64_t last, std::initializer_list<std::pair<std::int64_t, std::int64_t>> dims) {
  std::int64_t total = last;
  for (const auto& [n, stride] : dims) {
    if (n == 0) return 0;
  }
  for (const auto& [n, stride] : dims) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(n - 1, stride, &span) ||
        __builtin_add_overflow(total, span, &total)) {
      return std::nullopt;
    }
  }
  return total;
}

// A view's extent in floats (mha::invalid_argument naming it past 2^63).
template <class T>
std::int64_t extent(std::string_view name, const heads_view<T>& t) {
  const auto total = extent_of(
      t.head_dim, {{t.batch, t.batch_stride}, {t.heads, t.head_stride}, {t.rows, t.row_stride}});
  if (!total) {
    throw invalid_argument(text(where, ": ", name, " of shape ", shape_of(t), " has strides (",
                                t.batch_stride, ", ", t.head_stride, ", ", t.row_stride,
                                ") that reach past 2^63 elements"));
  }
  return *total;
}

// Whether two elements of a view may be one: its dimensions of more than one element, taken by
// stride, must each step past the extent of those before (a stride of 0, an expanded dimension,
// repeats every element). Such an out would be written several times over, and the work of a
// call could exceed the memory behind it.
template <class T>
bool overlaps_itself(const heads_view<T>& t) {
  if (empty(t)) return false;
  std::pair<std::int64_t, std::int64_t> dims[] = {
      {t.head_dim, 1}, {t.rows, t.row_stride}, {t.heads, t.head_stride}, {t.batch, t.batch_stride}};
  std::sort(std::begin(dims), std::end(dims),
            [](const auto& x, const auto& y) { return x.second < y.second; });
  std::int64_t extent = 1;  // of the dimensions taken so far
  for (const auto& [n, stride] : dims) {
    if (n <= 1) continue;
    if (stride < extent) return true;
    extent = (n - 1) * stride + extent;  // within the view's checked extent
  }
  return false;
}

// Whether a's first a_size and b's first b_size elements share a byte.
template <class A, class B>
bool overlap(const A* a, std::int64_t a_size, const B* b, std::int64_t b_size) {
  const auto* a0 = reinterpret_cast<const std::byte*>(a);
  const auto* b0 = reinterpret_cast<const std::byte*>(b);
  const std::less<const std::byte*> before;  // total order even for unrelated pointers
  return before(a0, b0 + b_size * static_cast<std::int64_t>(sizeof(B))) &&
         before(b0, a0 + a_size * static_cast<std::int64_t>(sizeof(A)));
}

// The mask's extent in bytes (0 without one); checked by check_mask.
std::int64_t mask_bytes(const attention_mask& m) {
  if (m.type == attention_mask::kind::none) return 0;
  const std::int64_t unit = m.type == attention_mask::kind::boolean ? 1 : sizeof(float);
  return unit *
         *extent_of(m.keys,
                    {{m.batch, m.batch_stride}, {m.heads, m.head_stride}, {m.rows, m.row_stride}});
}

void check_mask(const attention_mask& m, std::int64_t batch, std::int64_t heads, std::int64_t rows,
                std::int64_t keys) {
  if (m.type == attention_mask::kind::none) return;
  if (m.type != attention_mask::kind::additive && m.type != attention_mask::kind::boolean) {
    throw invalid_argument(text(where, ": the mask's kind (", static_cast<int>(m.type),
                                ") is not none, additive or boolean"));
  }
  if (m.data == nullptr && rows * keys != 0)
    throw invalid_argument(text(where, ": the mask has no data (nullptr)"));
  const auto dim = [](std::string_view name, std::int64_t got, std::int64_t full) {
    if (got != full && got != 1) {
      throw invalid_argument(
          text(where, ": the mask's ", name, " (", got, ") must be ", full, " or 1 (broadcast)"));
    }
  };
  dim("batch", m.batch, batch);
  dim("heads", m.heads, heads);
  if (m.rows != rows || m.keys != keys) {
    throw invalid_argument(text(where, ": the mask is (", m.batch, ", ", m.heads, ", ", m.rows,
                                ", ", m.keys, "), expected (", batch, " or 1, ", heads, " or 1, ",
                                rows, ", ", keys, "): (query rows, keys) of q and k"));
  }
  if (m.batch_stride < 0 || m.head_stride < 0 || m.row_stride < 0) {
    throw invalid_argument(text(where, ": the mask has strides (", m.batch_stride, ", ",
                                m.head_stride, ", ", m.row_stride, ", 1), expected >= 0"));
  }
  const auto extent = extent_of(
      m.keys, {{m.batch, m.batch_stride}, {m.heads, m.head_stride}, {m.rows, m.row_stride}});
  if (!extent || *extent > std::numeric_limits<std::int64_t>::max() / 4) {
    throw invalid_argument(text(where, ": the mask's strides (", m.batch_stride, ", ",
                                m.head_stride, ", ", m.row_stride, ") reach past 2^63 elements"));
  }
}

// Rows [i0, i1) of every (b, h) of out: zeros (rows that see no key).
template <class O>
void zero_rows(const heads_view<O>& out, std::int64_t i0, std::int64_t i1) {
  for (std::int64_t b = 0; b < out.batch; ++b) {
    for (std::int64_t h = 0; h < out.heads; ++h) {
      for (std::int64_t i = i0; i < i1; ++i) {
        O* row = out.data + b * out.batch_stride + h * out.head_stride + i * out.row_stride;
        std::fill(row, row + out.head_dim, O{});
      }
    }
  }
}

}  // namespace

namespace detail {

template <class T, class O>
void check_operands(const heads_view<const T>& q, const heads_view<const T>& k,
                    const heads_view<const T>& v, const heads_view<O>& out) {
  check_view("q", q);
  check_view("k", k);
  check_view("v", v);
  check_view("out", out);
  const std::int64_t batch = q.batch, heads = q.heads, rows = q.rows, keys = k.rows;
  const std::int64_t hd = q.head_dim;
  if (k.batch != batch || v.batch != batch || out.batch != batch) {
    throw invalid_argument(text(where, ": q is ", shape_of(q), ", k ", shape_of(k), ", v ",
                                shape_of(v), ", out ", shape_of(out), ": the batches differ"));
  }
  if (k.head_dim != hd || v.head_dim != hd) {
    throw invalid_argument(text(where, ": q is ", shape_of(q), ", k ", shape_of(k), ", v ",
                                shape_of(v),
                                ": head_dim must be the same (a value head_dim "
                                "other than the query's is not implemented)"));
  }
  if (v.heads != k.heads || v.rows != keys) {
    throw invalid_argument(
        text(where, ": k is ", shape_of(k), " and v ", shape_of(v), ", expected the same shape"));
  }
  if (k.heads == 0 ? heads != 0 : heads % k.heads != 0) {
    throw invalid_argument(text(where, ": q has ", heads, " heads and k ", k.heads,
                                ": the query heads must be a multiple of the key/value heads"));
  }
  if (out.heads != heads || out.rows != rows) {
    throw invalid_argument(
        text(where, ": out is ", shape_of(out), ", expected ", shape_of(q), " (q's shape)"));
  }
  // Every element of out its own memory, which holds none of the operands: each result is
  // written once, after what it reads. (Whole memory ranges are compared: views that interleave
  // without sharing an element are refused too.)
  if (overlaps_itself(out)) {
    throw invalid_argument(text(where, ": out of shape ", shape_of(out), " has strides (",
                                out.batch_stride, ", ", out.head_stride, ", ", out.row_stride,
                                ", 1) under which its elements overlap (a stride of 0, an expanded "
                                "dimension?): each result needs memory of its own"));
  }
  // A key is its own memory too: with a row stride of 0 (an expanded key dimension) the keys, and
  // the work, would have no bound in the memory behind them.
  for (const auto& [name, in] : {std::pair{"k", k}, {"v", v}}) {
    if (!empty(in) && in.rows > 1 && in.row_stride == 0) {
      throw invalid_argument(text(where, ": ", name, " has ", in.rows,
                                  " keys at row stride 0 (an expanded key dimension): expected "
                                  "each key in memory of its own"));
    }
  }
  const std::int64_t out_size = extent("out", out);
  for (const auto& [name, in] : {std::pair{"q", q}, {"k", k}, {"v", v}}) {
    if (overlap(out.data, out_size, in.data, extent(name, in))) {
      throw invalid_argument(text(where, ": out may overlap ", name,
                                  ": their memory ranges intersect (out must not share memory "
                                  "with q, k, v or the mask)"));
    }
  }
}

void set_extensions(const attention_options& options, std::int64_t heads, bool causal,
                    attention_args& a) {
  if (options.window < 0) {
    throw invalid_argument(
        text(where, ": window (", options.window, ") must be >= 0 (0: no sliding window)"));
  }
  if (options.window > 0 && !causal) {
    throw invalid_argument(text(where, ": a sliding window (", options.window,
                                ") is causal: set causal (a window of keys on both sides is not "
                                "implemented)"));
  }
  if (!(options.softcap >= 0.0f) || std::isinf(options.softcap)) {
    throw invalid_argument(text(where, ": softcap (", options.softcap,
                                ") must be finite and >= 0 (0: no soft-capping)"));
  }
  if (!options.sinks.empty()) {
    if (static_cast<std::int64_t>(options.sinks.size()) != heads) {
      throw invalid_argument(text(where, ": ", options.sinks.size(), " sinks for ", heads,
                                  " query heads: expected one logit per query head"));
    }
    for (std::size_t h = 0; h < options.sinks.size(); ++h) {
      const float sink = options.sinks[h];
      if (std::isnan(sink) || sink == std::numeric_limits<float>::infinity()) {
        throw invalid_argument(text(where, ": the sink of head ", h, " is ", sink,
                                    ": expected a finite logit (or -inf: no sink)"));
      }
    }
  }
  a.window = options.window;
  a.softcap = options.softcap;
  a.sinks = options.sinks.empty() ? nullptr : options.sinks.data();
}

float checked_scale(const attention_options& options, std::int64_t hd) {
  const float scale = options.scale ? *options.scale
                      : hd > 0      ? 1.0f / std::sqrt(static_cast<float>(hd))
                                    : 1.0f;
  if (!std::isfinite(scale)) {
    throw invalid_argument(text(where, ": scale (", scale, ") must be finite"));
  }
  if (options.threads < 0 || options.threads > max_run_threads) {
    throw invalid_argument(text(where, ": threads (", options.threads,
                                ") must be >= 0 (0 = all cores) and <= ", max_run_threads));
  }
  return scale;
}

template void check_operands(const heads_view<const float>&, const heads_view<const float>&,
                             const heads_view<const float>&, const heads_view<float>&);

}  // namespace detail

namespace {

// mha::attention on operands of T (float, or bfloat16 read as detail::bf16) into out of O (float,
// or bfloat16 with bfloat16 operands).
template <class T, class O>
void attend(const backend& backend, heads_view<const T> q, heads_view<const T> k,
            heads_view<const T> v, heads_view<O> out, const attention_options& options) {
  constexpr bool bf16_operands = std::is_same_v<T, bfloat16>;
  check_operands(q, k, v, out);
  const std::int64_t batch = q.batch, heads = q.heads, rows = q.rows, keys = k.rows;
  const std::int64_t hd = q.head_dim;
  const std::int64_t out_size = extent("out", out);
  check_mask(options.mask, batch, heads, rows, keys);
  if (overlap(reinterpret_cast<const std::byte*>(out.data), out_size * std::int64_t{sizeof(O)},
              static_cast<const std::byte*>(options.mask.data), mask_bytes(options.mask))) {
    throw invalid_argument(text(where,
                                ": out may overlap the mask: their memory ranges intersect (out "
                                "must not share memory with q, k, v or the mask)"));
  }
  if (coded(options.precision)) {
    throw invalid_argument(text(where, ": precision ", to_string(options.precision),
                                " is a KV cache's, expected fp32 or bf16"));
  }
  if (bf16_operands && options.precision != precision::bf16) {
    throw invalid_argument(text(where, ": q, k and v are bfloat16 and the precision is ",
                                to_string(options.precision),
                                ": bfloat16 operands are computed in precision bf16 (set it)"));
  }
  const float scale = checked_scale(options, hd);
  detail::attention_args extensions;
  set_extensions(options, heads, options.causal, extensions);
  if (options.window > 0 && options.alignment == causal_alignment::top_left && rows > keys) {
    throw invalid_argument(
        text(where, ": a sliding window with ", rows, " query rows over ", keys,
             " keys, causal top-left: the rows past the keys would stand past "
             "them; pass causal_alignment bottom_right, or as many rows as keys"));
  }
  if (const support s = backend.supports_attention(options.precision); !s)
    throw unsupported(text(backend.name(), ": ", s.reason()));
  if (empty(out)) return;  // nothing to compute (SDPA's empty result)
  if (keys == 0) {         // every row sees no key: zeros
    zero_rows(out, 0, rows);
    return;
  }

  const bool boolean = options.mask.type == attention_mask::kind::boolean;
  const std::int64_t mask_unit = boolean ? 1 : static_cast<std::int64_t>(sizeof(float));
  // Query rows [r0, r0 + n) over the first `seen` keys, query i at position seen - n + i.
  const auto call = [&](std::int64_t r0, std::int64_t n, std::int64_t seen, bool causal) {
    detail::attention_args a;
    if constexpr (bf16_operands) {
      static_assert(sizeof(bfloat16) == sizeof(detail::bf16));
      const auto words = [](const bfloat16* p) { return reinterpret_cast<const detail::bf16*>(p); };
      a.q16 = {words(q.data) + r0 * q.row_stride, q.batch_stride, q.head_stride, q.row_stride};
      a.k16 = {words(k.data), k.batch_stride, k.head_stride, k.row_stride};
      a.v16 = {words(v.data), v.batch_stride, v.head_stride, v.row_stride};
    } else {
      a.q = {q.data + r0 * q.row_stride, q.batch_stride, q.head_stride, q.row_stride};
      a.k = {k.data, k.batch_stride, k.head_stride, k.row_stride};
      a.v = {v.data, v.batch_stride, v.head_stride, v.row_stride};
    }
    if constexpr (std::is_same_v<O, bfloat16>) {
      a.out16 = {reinterpret_cast<detail::bf16*>(out.data) + r0 * out.row_stride, out.batch_stride,
                 out.head_stride, out.row_stride};
    } else {
      a.out = {out.data + r0 * out.row_stride, out.batch_stride, out.head_stride, out.row_stride};
    }
    a.batch = batch;
    a.heads = heads;
    a.seq_len = n;
    a.head_dim = hd;
    a.past = seen - n;
    a.kv_group = heads / k.heads;
    a.causal = causal;
    a.scale = scale;
    a.bf16 = options.precision == precision::bf16;
    a.heads_in_place = true;
    a.window = extensions.window;
    a.softcap = extensions.softcap;
    a.sinks = extensions.sinks;
    if (options.mask.type != attention_mask::kind::none) {
      const attention_mask& m = options.mask;
      a.mask = {static_cast<const std::byte*>(m.data) + r0 * m.row_stride * mask_unit, boolean,
                m.batch == 1 ? 0 : m.batch_stride, m.heads == 1 ? 0 : m.head_stride, m.row_stride};
    }
    detail::attend(backend, a,
                   run_options{.threads = options.threads, .executor = options.executor});
  };
  // Rows [r0, rows) that see all `keys` keys, in calls of at most `keys` rows.
  const auto all_keys = [&](std::int64_t r0) {
    for (; r0 < rows; r0 += keys) call(r0, std::min(keys, rows - r0), keys, false);
  };

  if (!options.causal) {
    if (rows <= keys) {
      call(0, rows, keys, false);
    } else {
      all_keys(0);
    }
  } else if (options.alignment == causal_alignment::top_left) {
    call(0, std::min(rows, keys), std::min(rows, keys), true);
    if (rows > keys) all_keys(keys);
  } else if (rows <= keys) {
    call(0, rows, keys, true);
  } else {
    zero_rows(out, 0, rows - keys);  // the first rows - keys rows see no key
    call(rows - keys, keys, keys, true);
  }
}

}  // namespace

void attention(const backend& backend, heads_view<const float> q, heads_view<const float> k,
               heads_view<const float> v, heads_view<float> out, const attention_options& options) {
  attend(backend, q, k, v, out, options);
}

void attention(const backend& backend, heads_view<const bfloat16> q, heads_view<const bfloat16> k,
               heads_view<const bfloat16> v, heads_view<float> out,
               const attention_options& options) {
  attend(backend, q, k, v, out, options);
}

void attention(const backend& backend, heads_view<const bfloat16> q, heads_view<const bfloat16> k,
               heads_view<const bfloat16> v, heads_view<bfloat16> out,
               const attention_options& options) {
  attend(backend, q, k, v, out, options);
}

void detail::attend(const backend& backend, const attention_args& args,
                    const run_options& options) {
  const auto* calls = dynamic_cast<const attention_calls*>(&backend);
  if (calls == nullptr) {
    throw unsupported(
        text(backend.name(), ": the attention call (mha::attention) is not implemented"));
  }
  calls->attend(args, options);
}

std::int64_t detail::attention_cache_head_bytes(const backend& backend, std::int64_t capacity,
                                                std::int64_t head_dim, precision kv,
                                                precision compute) {
  const auto* calls = dynamic_cast<const attention_calls*>(&backend);
  return calls ? calls->attention_cache_head_bytes(capacity, head_dim, kv, compute) : 0;
}

support backend::supports_attention(precision) const {
  return support::no(text("the attention call (mha::attention) is not implemented on ", name(),
                          "; xsimd, tbb and naive run it"));
}

}  // namespace mha
