// Internal: the formulations (wrapper, split_weight, fused_qkv), q/k norms, rotary embedding and
// the KV cache's plumbing, written once over a kernel set (the concept kernel_set below).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include "base/checks.hpp"
#include "common/attention_args.hpp"
#include "common/buffer.hpp"
#include "common/kernel_set.hpp"
#include "driver/kv_cache_access.hpp"
#include "driver/rope.hpp"
#include "mha/backend.hpp"

namespace mha::detail {

template <kernel_set K>
class driver_plan final : public plan {
 public:
  driver_plan(const mha::config& cfg, mha::formulation form, const weights& w,
              std::string_view backend_name)
      : plan(cfg, form, backend_name), kernels_(cfg) {
    const std::int64_t hd = cfg.head_dim();
    switch (form) {
      case mha::formulation::split_weight:
        split_.emplace(
            qkv_layers{kernels_.pack(w.query), kernels_.pack(w.key), kernels_.pack(w.value)});
        break;
      case mha::formulation::fused_qkv:
        fused_.emplace(kernels_.pack(w.fused_qkv()));
        break;
      case mha::formulation::wrapper:
        // Each query head and each K/V group owns separately allocated weights, packed one at a
        // time; a group's K and V are computed once for all its query heads.
        for (std::int64_t h = 0; h < cfg.n_heads; ++h)
          query_heads_.push_back(kernels_.pack(w.query.rows(h * hd, hd)));
        for (std::int64_t g = 0; g < cfg.kv_heads(); ++g) {
          kv_groups_.push_back(
              {kernels_.pack(w.key.rows(g * hd, hd)), kernels_.pack(w.value.rows(g * hd, hd))});
        }
        break;
    }
    if (cfg.out_proj) out_proj_.emplace(kernels_.pack(w.out_proj));
    if (cfg.qk_norm) norms_ = {w.q_norm, w.k_norm};
    sinks_ = w.sinks;
    if (cfg.rope_base != 0.0) {
      rope_.emplace(cfg.context_length, mha::rope_frequencies(cfg), mha::rope_amplitude(cfg));
    }
  }

  // The plan's kernel set, for a backend's introspection of its own plans.
  const K& kernels() const noexcept { return kernels_; }

 private:
  struct qkv_layers {
    typename K::packed_linear query, key, value;
  };
  struct kv_layers {
    typename K::packed_linear key, value;
  };
  // Where one call's Q, K and V projections land, and the heads' merged outputs.
  struct buffers {
    float *qkv, *context;
  };
  // One call's projections as heads: n_heads of queries, kv_heads of keys and of values.
  struct qkv_views {
    head_view<float> q, k, v;
  };

  static constexpr bool decodes = set_decodes<K>;

  std::int64_t cache_head_bytes(std::int64_t capacity, mha::precision kv) const noexcept override {
    if constexpr (decodes) {
      const bool kept = kv == config().precision || (set_caches_codes<K> && coded(kv));
      return kept ? kernels_.cache_head_bytes(capacity, config().head_dim(), kv) : 0;
    } else {
      return 0;
    }
  }

  void execute(tensor_view<const float> x, tensor_view<float> y,
               const run_options& options) const override {
    forward(x, y, options, nullptr);
  }
  void execute(tensor_view<const float> x, tensor_view<float> y, kv_cache& cache,
               const run_options& options) const override {
    if constexpr (decodes) {
      forward(x, y, options, &cache);
    } else {
      plan::execute(x, y, cache, options);  // declines
    }
  }

  // The forward pass over x, or with a cache the incremental call: the new tokens' K and V
  // appended to it and attention over all it holds.
  void forward(tensor_view<const float> x, tensor_view<float> y, const run_options& options,
               kv_cache* cache) const {
    kernels_.run(options, [&] {
      const mha::config& cfg = config();
      const std::int64_t rows = x.batch() * x.seq_len(), size = rows * cfg.d_out;
      const std::int64_t qkv_size = rows * (cfg.d_out + 2 * cfg.d_kv());
      // Q, K, V and the heads' merged outputs before out_proj, in scratch the plan keeps:
      // per-call buffers cost the split form 3000 page faults and ~4% of its time per run at
      // B4 T256 d768.
      scratch_pool::lease scratch(scratch_,
                                  static_cast<std::size_t>(qkv_size + (cfg.out_proj ? size : 0)));
      // Heads' outputs land in their column block of `context`: (B, T, H * head_dim).
      const buffers buf{scratch.data(), cfg.out_proj ? scratch.data() + qkv_size : y.data()};

      attention_args args;
      args.batch = x.batch();
      args.seq_len = x.seq_len();
      args.head_dim = cfg.head_dim();
      args.heads = cfg.n_heads;
      args.kv_group = cfg.n_heads / cfg.kv_heads();
      args.causal = cfg.causal;
      args.window = cfg.window;
      args.softcap = static_cast<float>(cfg.softcap);
      args.sinks = sinks_.empty() ? nullptr : sinks_.data();
      args.bf16 = cfg.precision == precision::bf16;
      args.scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim()));
      args.out = {buf.context, x.seq_len() * cfg.d_out, cfg.head_dim(), cfg.d_out};
      if (options.training) args.dropout = {cfg.dropout, options.seed};

      const qkv_views views = project(x, buf.qkv);
      normalise(views, x);
      args.q = views.q;
      args.k = views.k;
      args.v = views.v;
      if (cache != nullptr) {
        const kv_store store = kv_cache_access::store(*cache);
        args.cache = &store;
        rotate(views, x, [&](std::int64_t b) { return store.lengths[b]; });
        if (coded(store.format)) check_coded_range(backend_name(), args);
        kernels_.attention(args);
      } else {
        rotate(views, x, [](std::int64_t) { return std::int64_t{0}; });
        kernels_.attention(args);
      }
      if (out_proj_) kernels_.linear(*out_proj_, buf.context, rows, y.data());
    });
  }

  // Q, K and V of x in the formulation's way, into `qkv` (rows * (d_out + 2 d_kv) floats).
  // Attention writes each head into its columns of `context`, which is the merge.
  qkv_views project(tensor_view<const float> x, float* qkv) const {
    switch (formulation()) {
      case mha::formulation::split_weight:
        return split_weight(x, qkv);
      case mha::formulation::fused_qkv:
        return fused_qkv(x, qkv);
      case mha::formulation::wrapper:
        break;
    }
    return wrapper(x, qkv);
  }

  // One projection per Q, K, V over all heads, seen as (B, H, T, head_dim) (project_heads; K and
  // V have kv_heads heads).
  qkv_views split_weight(tensor_view<const float> x, float* qkv) const {
    const mha::config& cfg = config();
    const std::int64_t rows = x.batch() * x.seq_len();
    return {project_heads(split_->query, x, cfg.n_heads, qkv),
            project_heads(split_->key, x, cfg.kv_heads(), qkv + rows * cfg.d_out),
            project_heads(split_->value, x, cfg.kv_heads(), qkv + rows * (cfg.d_out + cfg.d_kv()))};
  }

  // One projection for Q, K and V together, seen as n_heads + 2 kv_heads heads: the first
  // n_heads are the queries, then the keys, then the values; from there as split_weight.
  qkv_views fused_qkv(tensor_view<const float> x, float* qkv) const {
    const mha::config& cfg = config();
    const head_view<float> all = project_heads(*fused_, x, cfg.n_heads + 2 * cfg.kv_heads(), qkv);
    const auto from = [&](std::int64_t head) {
      head_view<float> v = all;
      v.data += head * all.head_stride;
      return v;
    };
    return {from(0), from(cfg.n_heads), from(cfg.n_heads + cfg.kv_heads())};
  }

  // x W^T + b into y as `heads` heads of head_dim: the kernel set's layout, or (B, T, width)
  // row-major viewed with strides (row stride width, head h at column h * head_dim).
  head_view<float> project_heads(const typename K::packed_linear& w, tensor_view<const float> x,
                                 std::int64_t heads, float* y) const {
    const std::int64_t hd = config().head_dim(), width = heads * hd;
    if constexpr (requires(const K& k) { k.project_heads(w, x.data(), 1, 1, 1, y); }) {
      if (const auto view = kernels_.project_heads(w, x.data(), x.batch(), x.seq_len(), heads, y))
        return {y + (view->data - y), view->batch_stride, view->head_stride, view->row_stride};
    }
    kernels_.linear(w, x.data(), x.batch() * x.seq_len(), y);
    return {y, x.seq_len() * width, hd, width};
  }

  // H independent query heads, each projecting x with its own (head_dim, d_in) weights into its
  // own (B, T, head_dim) slice, and kv_heads K/V groups likewise (a group's K and V computed
  // once for its heads); attention then covers every head at once, head h's slices
  // head_stride apart, writing each head into its column block of `context` (the
  // concatenation). With a cache, each group has its own K/V cache head.
  qkv_views wrapper(tensor_view<const float> x, float* qkv) const {
    const mha::config& cfg = config();
    const std::int64_t rows = x.batch() * x.seq_len(), hd = cfg.head_dim(), slice = rows * hd;
    float *q = qkv, *k = qkv + rows * cfg.d_out, *v = k + rows * cfg.d_kv();
    kernels_.for_each(cfg.n_heads + cfg.kv_heads(), [&](std::int64_t i) {
      if (i < cfg.n_heads) {
        kernels_.linear(query_heads_[i], x.data(), rows, q + i * slice);
      } else {
        const std::int64_t g = i - cfg.n_heads;
        kernels_.linear(kv_groups_[g].key, x.data(), rows, k + g * slice);
        kernels_.linear(kv_groups_[g].value, x.data(), rows, v + g * slice);
      }
    });
    const std::int64_t batch_stride = x.seq_len() * hd;
    return {
        {q, batch_stride, slice, hd}, {k, batch_stride, slice, hd}, {v, batch_stride, slice, hd}};
  }

  // With qk_norm, every query and key head's rows RMS-normalised and scaled by q_norm or k_norm
  // (docs/design.md §1.10), before the rotary embedding and before keys enter a cache.
  void normalise(const qkv_views& views, tensor_view<const float> x) const {
    if (!config().qk_norm) return;
    const std::int64_t heads = config().n_heads, hd = config().head_dim();
    const float eps = static_cast<float>(config().qk_norm_eps);
    kernels_.for_each(heads + config().kv_heads(), [&](std::int64_t i) {
      const bool query = i < heads;
      const head_view<float>& view = query ? views.q : views.k;
      const float* w = query ? norms_[0].data() : norms_[1].data();
      for (std::int64_t b = 0; b < x.batch(); ++b) {
        for (std::int64_t t = 0; t < x.seq_len(); ++t) {
          float* row = view.data + b * view.batch_stride +
                       (query ? i : i - heads) * view.head_stride + t * view.row_stride;
          float squares = 0.0f;
          for (std::int64_t e = 0; e < hd; ++e) squares += row[e] * row[e];
          const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(hd) + eps);
          for (std::int64_t e = 0; e < hd; ++e) row[e] = row[e] * inverse * w[e];
        }
      }
    });
  }

  // With RoPE, every query and key head turned by its rows' absolute positions, row i of
  // sequence b at first(b) + i, before attention (and before keys enter a cache).
  template <class First>
  void rotate(const qkv_views& views, tensor_view<const float> x, First first) const {
    if (!rope_) return;
    std::int64_t end = 0;
    for (std::int64_t b = 0; b < x.batch(); ++b) end = std::max(end, first(b) + x.seq_len());
    const auto held = rope_->reach(end);
    const std::int64_t heads = config().n_heads;
    kernels_.for_each(heads + config().kv_heads(), [&](std::int64_t i) {
      const bool query = i < heads;
      rope_->rotate(query ? views.q : views.k, query ? i : i - heads, x.batch(), x.seq_len(),
                    first);
    });
  }

  K kernels_;                        // before the packed weights: packing may use its state
  std::optional<qkv_layers> split_;  // split_weight form
  std::optional<typename K::packed_linear> fused_;      // fused_qkv form
  std::vector<typename K::packed_linear> query_heads_;  // wrapper form: n_heads
  std::vector<kv_layers> kv_groups_;                    // wrapper form: kv_heads
  std::optional<typename K::packed_linear> out_proj_;
  std::array<std::vector<float>, 2> norms_;  // qk_norm: q_norm's and k_norm's head_dim weights
  std::vector<float> sinks_;                 // config::sinks: one logit per query head
  std::optional<rope_table> rope_;
  scratch_pool scratch_;
};

}  // namespace mha::detail
