// mha::make_attention_cache and mha::attention over a kv_cache (include/mha/attention.hpp): the
// cache made in the layout its backend's kernels read, and each call's new tokens checked against
// it, appended and attended over what each sequence then holds (docs/design.md §1.4, §1.9).
#include <algorithm>
#include <iterator>
#include <new>
#include <string_view>

#include "base/checks.hpp"
#include "base/text.hpp"
#include "common/attention_args.hpp"
#include "common/attention_calls.hpp"
#include "core/attention_checks.hpp"
#include "driver/kv_cache_access.hpp"
#include "mha/backend.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::check_operands, detail::checked_scale, detail::empty, detail::set_extensions,
    detail::shape_of, detail::text;
constexpr std::string_view where = detail::attention_call;

}  // namespace

kv_cache make_attention_cache(const backend& backend, std::int64_t batch, std::int64_t capacity,
                              std::int64_t kv_heads, std::int64_t head_dim, precision kv,
                              precision compute, std::int64_t window) {
  constexpr std::string_view made = "mha::make_attention_cache";
  if (window < 0) {
    throw invalid_argument(
        text(made, ": window (", window, ") must be >= 0 (0: no sliding window)"));
  }
  if (std::find(std::begin(cache_precisions), std::end(cache_precisions), kv) ==
      std::end(cache_precisions)) {
    throw invalid_argument(text(made, ": unknown KV cache precision value ", static_cast<int>(kv),
                                "; expected ", cache_precision_names));
  }
  if (compute != precision::fp32 && compute != precision::bf16) {
    throw invalid_argument(text(made, ": the attention's precision is ", to_string(compute),
                                ", expected fp32 or bf16"));
  }
  if (!coded(kv) && kv != compute) {
    throw invalid_argument(text(made, ": a ", to_string(kv), " cache is computed in ",
                                to_string(kv), ", not ", to_string(compute),
                                " (an int8, k8v4 or int4 cache in either)"));
  }
  if (batch < 1 || capacity < 1 || kv_heads < 1 || head_dim < 1) {
    throw invalid_argument(text(made, ": batch (", batch, "), capacity (", capacity,
                                "), kv_heads (", kv_heads, ") and head_dim (", head_dim,
                                ") must each be >= 1"));
  }
  if (const support s = backend.supports_attention(compute); !s)
    throw unsupported(text(backend.name(), ": ", s.reason()));
  // A window shorter than the capacity keeps a ring of its last tokens (docs/design.md §1.9).
  const std::int64_t slots =
      window > 0 && ring_slots(window) < capacity ? ring_slots(window) : capacity;
  // The nominal size first, so that the layout's own arithmetic cannot overflow.
  detail::check_byte_count(made, "kv cache", {2, batch, slots, kv_heads, head_dim}, sizeof(float));
  const std::int64_t head_bytes =
      detail::attention_cache_head_bytes(backend, slots, head_dim, kv, compute);
  if (head_bytes == 0) {
    throw unsupported(
        text(backend.name(), ": its attention calls take no KV cache (xsimd, tbb and naive do)"));
  }
  detail::check_byte_count(made, "kv cache", {batch, kv_heads, head_bytes}, 1);
  const kv_cache::attention_owner owner{&backend, backend.isa(), head_dim, compute};
  try {
    return detail::kv_cache_access::make_attention(owner, kv, batch, capacity, kv_heads, head_bytes,
                                                   window, slots);
  } catch (const std::bad_alloc&) {
    throw error(text(made, ": a kv cache of ", batch, " sequences of capacity ", capacity,
                     " needs ", batch * kv_heads * head_bytes,
                     " bytes, which could not be allocated"));
  }
}

void attention(const backend& backend, heads_view<const float> q, heads_view<const float> k,
               heads_view<const float> v, kv_cache& cache, heads_view<float> out,
               const attention_options& options, std::int64_t first_sequence) {
  using detail::kv_cache_access;
  kv_cache_access::held(cache, where, [&] {
    const kv_cache::attention_owner& owner = kv_cache_access::attention_owner(cache);
    if (owner.made_by != &backend) {
      throw invalid_argument(
          text(where, ": the kv_cache was made ",
               owner.made_by ? text("for the attention calls of ", owner.made_by->name())
                             : std::string("by a plan"),
               ", not for ", backend.name(),
               "'s: a cache is read in the layout of the kernels it was made for"));
    }
    if (backend.isa() != owner.isa) {
      throw invalid_argument(text(where, ": the kv_cache holds the layout of ", backend.name(),
                                  "'s ", to_string(owner.isa), " kernels, and ", backend.name(),
                                  " now runs ", to_string(backend.isa()),
                                  " (MHA_XSIMD_ISA changed?): make the cache again"));
    }
    check_operands(q, k, v, out);
    if (first_sequence < 0 || first_sequence >= cache.batch()) {
      throw invalid_argument(text(where, ": first_sequence (", first_sequence,
                                  ") must be a sequence of the cache, 0 to ", cache.batch() - 1));
    }
    const std::int64_t tokens = q.rows, sequences = cache.batch() - first_sequence;
    if (q.batch < 1 || q.batch > sequences || k.heads != cache.heads() ||
        q.head_dim != owner.head_dim || k.rows != tokens) {
      throw invalid_argument(
          text(where, ": q is ", shape_of(q), ", k ", shape_of(k), "; the cache holds ",
               cache.batch(), " sequences of ", cache.heads(), " K/V heads of head_dim ",
               owner.head_dim, ": expected q (B, H, T, ", owner.head_dim, ") and k, v (B, ",
               cache.heads(), ", T, ", owner.head_dim, "), T the new tokens of sequences ",
               first_sequence, " to ", first_sequence, " + B - 1, 1 <= B <= ", sequences));
    }
    if (options.mask.type != attention_mask::kind::none) {
      throw invalid_argument(text(where,
                                  ": a mask with a kv_cache is not implemented (the "
                                  "call is causal over what each sequence holds)"));
    }
    if (!options.causal && tokens > 1) {
      throw invalid_argument(text(where, ": ", tokens,
                                  " new tokens over a kv_cache, not causal: the queries would "
                                  "see keys the cache does not hold yet; set causal"));
    }
    if (options.precision != owner.precision) {
      throw invalid_argument(text(where, ": precision ", to_string(options.precision),
                                  ", and the kv_cache was made for ", to_string(owner.precision),
                                  " calls"));
    }
    const float scale = checked_scale(options, q.head_dim);
    if (options.window != 0 && options.window != cache.window()) {
      throw invalid_argument(text(where, ": window ", options.window,
                                  ", and the kv_cache was made ",
                                  cache.window() > 0 ? text("for a window of ", cache.window())
                                                     : std::string("without a window"),
                                  ": a cache's calls take its window (0: say nothing)"));
    }
    detail::attention_args a;
    attention_options with_window = options;
    with_window.window = cache.window();
    set_extensions(with_window, q.heads, true, a);  // a call over a cache is causal
    for (std::int64_t b = first_sequence; b < first_sequence + q.batch; ++b) {
      const std::int64_t past = cache.length(b);
      // Top-left, the new rows would stand at positions 0 .. T - 1, before what the cache holds.
      if (tokens > 1 && past > 0 && options.alignment == causal_alignment::top_left) {
        throw invalid_argument(text(where, ": ", tokens, " new tokens, causal top-left, over a ",
                                    "kv_cache whose sequence ", b, " holds ", past,
                                    " tokens: with a cache the queries stand after what it "
                                    "holds; pass causal_alignment bottom_right"));
      }
      if (past + tokens > cache.capacity()) {
        throw invalid_argument(text(where, ": sequence ", b, " holds ", past, " tokens; ", tokens,
                                    " more make ", past + tokens, ", past the cache's capacity (",
                                    cache.capacity(), ")"));
      }
    }
    if (empty(q)) return;  // no new token, or no query head: nothing to append or compute
    // The call's sequences: the cache's from first_sequence.
    detail::kv_store store = kv_cache_access::store(cache);
    store.data = store.head(first_sequence, 0);
    store.lengths += first_sequence;
    a.q = {q.data, q.batch_stride, q.head_stride, q.row_stride};
    a.k = {k.data, k.batch_stride, k.head_stride, k.row_stride};
    a.v = {v.data, v.batch_stride, v.head_stride, v.row_stride};
    a.out = {out.data, out.batch_stride, out.head_stride, out.row_stride};
    a.batch = q.batch;
    a.heads = q.heads;
    a.seq_len = tokens;
    a.head_dim = q.head_dim;
    a.kv_group = q.heads / k.heads;
    a.causal = true;
    a.scale = scale;
    a.bf16 = owner.precision == precision::bf16;
    a.cache = &store;
    if (coded(store.format)) detail::check_coded_range(where, a);
    // A ring holds a call of at most ring_chunk tokens beyond its window: a longer one is taken
    // that many at a time, each appended and attended before the next; a coded cache's channel
    // scales are set from all of the call's keys (each part's k rows to the call's end).
    const std::int64_t step = store.ring ? ring_chunk : tokens;
    for (std::int64_t r0 = 0; r0 < tokens; r0 += step) {
      detail::attention_args part = a;
      part.seq_len = std::min(step, tokens - r0);
      part.channel_rows = tokens - r0;
      part.q.data = a.q.row(0, 0, r0);
      part.k.data = a.k.row(0, 0, r0);
      part.v.data = a.v.row(0, 0, r0);
      part.out.data = a.out.row(0, 0, r0);
      detail::attend(backend, part,
                     run_options{.threads = options.threads, .executor = options.executor});
      kv_cache_access::grow(cache, part.seq_len, first_sequence, q.batch);
    }
  });
}

}  // namespace mha
