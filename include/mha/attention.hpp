// mha: attention on queries, keys and values a model has already projected: PyTorch's
// F.scaled_dot_product_attention, on mha's kernels (docs/design.md §1.8).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "mha/config.hpp"
#include "mha/kv_cache.hpp"
#include "mha/run_options.hpp"

namespace mha {

class backend;

// A (batch, heads, rows, head_dim) tensor seen through strides in elements: element (b, h, i, d)
// at data[b * batch_stride + h * head_stride + i * row_stride + d]. The last dimension is
// contiguous; the others take any stride, so a (B, T, H, D) buffer is read as (B, H, T, D)
// where it lies.
template <class T>
struct heads_view {
  T* data = nullptr;
  std::int64_t batch = 0, heads = 0, rows = 0, head_dim = 0;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;

  // A dense row-major (batch, heads, rows, head_dim) tensor.
  static constexpr heads_view dense(T* data, std::int64_t batch, std::int64_t heads,
                                    std::int64_t rows, std::int64_t head_dim) noexcept {
    return {data, batch, heads, rows, head_dim, heads * rows * head_dim, rows * head_dim, head_dim};
  }
};

// SDPA's attn_mask over the scores of (query row i, key j) of each (b, h): a float added to the
// score (additive; -inf masks), or a boolean, true where the query attends (bytes of 0 or 1).
// Shape (batch or 1, heads or 1, query rows, keys), the key dimension contiguous; give a
// broadcast dimension a stride of 0 (a (rows, keys) mask: both batch and head strides 0).
struct attention_mask {
  enum class kind { none, additive, boolean };
  kind type = kind::none;
  const void* data = nullptr;  // float (additive) or bytes (boolean)
  std::int64_t batch = 1, heads = 1, rows = 0, keys = 0;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

// Where the causal diagonal lies when the query has fewer rows (L) than the keys (S):
//   top_left      query i sees keys j <= i: PyTorch's is_causal (torch.tril(ones(L, S)));
//   bottom_right  query i sees keys j <= i + S - L: the queries are the last L positions of the
//                 sequence (a decode step, a chunk of a prefill over a cache; FlashAttention's
//                 causal, torch.nn.attention.bias.causal_lower_right).
// They agree when L == S.
enum class causal_alignment { top_left, bottom_right };

// A bfloat16 number as its bits: the upper half of a float32's (PyTorch's torch.bfloat16, the
// bf16 of docs/design.md §1.5).
struct bfloat16 {
  std::uint16_t bits;
};

struct attention_options {
  bool causal = false;
  causal_alignment alignment = causal_alignment::top_left;
  std::optional<float> scale;  // the scores' factor; nullopt: 1 / sqrt(head_dim)
  attention_mask mask;         // none by default
  // bf16: q, k, v and the weights rounded to bf16 as every product's operands, the sums in fp32
  // (a bf16 module's arithmetic, docs/design.md §1.5); fp32 otherwise. int8 and k8v4 (a
  // cache's formats) are refused. bfloat16
  // operands need bf16.
  mha::precision precision = mha::precision::fp32;
  int threads = 0;                          // as run_options::threads
  const mha::executor* executor = nullptr;  // as run_options::executor
  // The models' extensions of the function (docs/design.md §1.9), each off by default:
  //   window   a sliding window, with causal: the query at position p sees the keys j with
  //            p - window < j <= p (window keys, its own included: transformers' sliding_window,
  //            Mistral's and Gemma's); 0: none. Keys outside a row's window are never read, so a
  //            call costs O(L window), not O(L S).
  //   softcap  logit soft-capping: each score s (after scale) becomes softcap tanh(s / softcap)
  //            before the mask (Gemma 2's attn_logit_softcapping); 0: none.
  //   sinks    one logit per query head (H of them) that joins the softmax's denominator of
  //            each of its rows and adds no value (gpt-oss's sinks, transformers' s_aux): row
  //            weights e^(s_j - m) / (e^(sink - m) + sum_k e^(s_k - m)); empty: none.
  std::int64_t window = 0;
  float softcap = 0.0f;
  std::span<const float> sinks;
};

// out[b, h] = softmax(scale q[b, h] k[b, g]^T + mask[b, h] + causal) v[b, g], g = h / (heads /
// kv_heads), for q (B, H, L, D), k and v (B, H_kv, S, D) with H a multiple of H_kv (grouped-query
// attention: PyTorch's enable_gqa), out (B, H, L, D). A query row that sees no key (every key
// masked, or none under bottom_right causal when L > S) is zeros, as PyTorch's SDPA gives.
// Runs `backend`'s fused kernels (no L x S scores on xsimd and tbb; naive holds them as the
// reference). Sizes may be 0, as SDPA's: nothing to compute, or zeros where there is no key. out
// must not share memory with q, k, v or the mask, and its elements (and each key of k and v)
// must lie in memory of their own (no stride of 0 over a dimension of several). Every finite
// mask value computes as SDPA's (float32's lowest included). Throws mha::invalid_argument naming
// the shape, stride or option that does not hold, mha::unsupported when the backend has no
// attention call (backend::supports_attention says why).
void attention(const backend& backend, heads_view<const float> q, heads_view<const float> k,
               heads_view<const float> v, heads_view<float> out,
               const attention_options& options = {});

// The same on bfloat16 operands (a bf16 model's tensors), computed in precision bf16 (options
// must say so): they are read where they lie, never widened to float copies; a block of a few
// query rows (a decode step) reads K and V in place. out in float32, or in bfloat16 (each
// result rounded to the nearest bf16, as PyTorch's bf16 SDPA returns it).
void attention(const backend& backend, heads_view<const bfloat16> q, heads_view<const bfloat16> k,
               heads_view<const bfloat16> v, heads_view<float> out,
               const attention_options& options = {});
void attention(const backend& backend, heads_view<const bfloat16> q, heads_view<const bfloat16> k,
               heads_view<const bfloat16> v, heads_view<bfloat16> out,
               const attention_options& options = {});

// Decode through a KV cache, for a model that projects (and rotates) its own queries, keys and
// values (transformers' attention functions): make_attention_cache makes an empty cache for
// `batch` sequences of up to `capacity` tokens of `kv_heads` K/V heads of head_dim, its bytes
// allocated now (kv_cache::bytes()), in the layout of `backend`'s kernels, keeping keys and
// values in `kv` and computed in `precision`: an fp32 cache in fp32, a bf16 cache in bf16, an
// int8 cache (codes with a scale and an offset per token and K/V head, docs/design.md §1.7) or a
// k8v4 one (int8's keys, values as 4-bit codes of turned groups of 32) in either. Throws
// mha::unsupported when the backend takes no cache in its attention calls (xsimd, tbb and naive
// do), mha::invalid_argument naming a bad size or precision.
//
// With a window (a sliding-window layer's cache, docs/design.md §1.9), every call over the cache
// attends over each query's last `window` keys (its options.window must be 0 or the same), and
// the cache keeps only what they read: ring_slots(window) tokens per sequence (mha/kv_cache.hpp)
// when that is less than the capacity, whatever the capacity. Gemma 3's fifteen sliding layers
// of 512 keys then hold 832 tokens each at any context (kv_cache::slots()).
kv_cache make_attention_cache(const backend& backend, std::int64_t batch, std::int64_t capacity,
                              std::int64_t kv_heads, std::int64_t head_dim, mha::precision kv,
                              mha::precision precision, std::int64_t window = 0);

// The next T tokens of each sequence of `cache` (make_attention_cache's, made by this backend):
// appends their keys k and values v (B, H_kv, T, D) to it, then out (B, H, T, D) = attention of
// their queries q (B, H, T, D) over all the sequence then holds, causal: query row i of sequence
// b stands at position length(b) + i and sees the keys up to its own (for T = 1 the causal flag
// makes no difference; non-causal T > 1 is refused: it would need keys the cache does not hold
// yet). That is bottom_right causal: T > 1 rows top_left (attention_options' default) over a
// sequence that holds tokens are refused, naming bottom_right; into an empty one the two agree.
// The lengths then grow by T. options: scale, threads and executor as above; precision
// must be the cache's; no mask (refused). The cache's codes and bf16 elements are read where
// they lie. Throws mha::invalid_argument, leaving the cache unchanged and out untouched, on a
// shape that does not match the cache, a length that would pass its capacity (naming b), a cache
// of a plan or another backend, out overlapping q, k, v or itself, or a cache in use by another
// call. The call's B sequences are the cache's first_sequence .. first_sequence + B - 1 (all of
// them by default): a padded batch prefills each sequence on its own, without its padding.
void attention(const backend& backend, heads_view<const float> q, heads_view<const float> k,
               heads_view<const float> v, kv_cache& cache, heads_view<float> out,
               const attention_options& options = {}, std::int64_t first_sequence = 0);

}  // namespace mha
