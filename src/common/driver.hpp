// Internal: the wrapper and split-weight formulations, written once over a kernel set.
//
// A kernel set K is an object the plan owns (default-constructed before the weights are packed),
// so a set may keep per-plan state such as built primitives; its member functions are const and
// safe to call from concurrent runs. It supplies:
//   typename K::packed_linear;                      // one nn.Linear in the kernels' layout
//   K::packed_linear pack(const linear_weights&) const;
//   // y (rows, out) = x (rows, in) W^T + b; x and y contiguous row-major.
//   void linear(const packed_linear&, const float* x, std::int64_t rows, float* y) const;
//   void attention(const attention_args&) const;
//   // Optional, for split_weight's Q, K, V: the projection of x (batch * seq_len rows) into y
//   // (rows * out floats) in a layout the kernel set prefers, returned as its (batch, heads,
//   // seq_len, out / heads) view; nullopt, writing nothing, when it has none for this shape.
//   // Otherwise the driver uses linear() into (rows, out) row-major, seen through strides.
//   std::optional<head_view<const float>> project_heads(
//       const packed_linear&, const float* x, std::int64_t batch, std::int64_t seq_len,
//       std::int64_t heads, float* y) const;
//   // Run f() in the execution context options ask for (e.g. a thread arena), and f(i) for
//   // i < n, in any order or concurrently. sequential_execution is the single-thread answer.
//   template <class F> void run(const run_options&, F&& f) const;
//   template <class F> void for_each(std::int64_t n, F&& f) const;
//   // Optional: decode. Floats of one (sequence, K/V head) of a cache of `capacity` tokens in
//   // the set's layout; with it, attention() also takes attention_args::cache (appending the
//   // new keys and values there and attending over the cache), and the plan runs incremental
//   // calls (plan::make_cache, plan::run with a cache).
//   std::int64_t cache_head_floats(std::int64_t capacity, std::int64_t head_dim) const;
// Stateless sets write these as static members; the driver calls them through its instance.
#pragma once

#include <cmath>
#include <concepts>
#include <optional>
#include <vector>

#include "common/attention_args.hpp"
#include "common/buffer.hpp"
#include "common/kv_cache_access.hpp"
#include "mha/backend.hpp"

namespace mha::detail {

struct sequential_execution {
  template <class F>
  static void run(const run_options&, F&& f) {
    f();
  }
  template <class F>
  static void for_each(std::int64_t n, F&& f) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
};

template <class K>
class driver_plan final : public plan {
 public:
  driver_plan(const mha::config& cfg, mha::formulation form, const weights& w,
              std::string_view backend_name)
      : plan(cfg, form, backend_name) {
    if (form == mha::formulation::split_weight) {
      split_.emplace(qkv{kernels_.pack(w.query), kernels_.pack(w.key), kernels_.pack(w.value)});
    } else {
      // The wrapper's heads own separately allocated weights, packed one head at a time (a
      // head of a K/V group gets its own copy of the group's K/V weights).
      for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
        const head_weights hw = w.head(cfg, h);
        heads_.push_back({kernels_.pack(hw.query), kernels_.pack(hw.key), kernels_.pack(hw.value)});
      }
    }
    if (cfg.out_proj) out_proj_.emplace(kernels_.pack(w.out_proj));
  }

  // The plan's kernel set, for a backend's introspection of its own plans.
  const K& kernels() const noexcept { return kernels_; }

 private:
  struct qkv {
    typename K::packed_linear query, key, value;
  };
  struct qkv_buffers {
    float *q, *k, *v;
  };

  static constexpr bool decodes = requires(const K& k, std::int64_t n) {
    { k.cache_head_floats(n, n) } -> std::same_as<std::int64_t>;
  };

  std::int64_t cache_head_floats(std::int64_t capacity) const noexcept override {
    if constexpr (decodes) {
      return kernels_.cache_head_floats(capacity, config().head_dim());
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
      // K and V of the split form are d_kv wide; the wrapper's heads each take head_dim of all.
      const std::int64_t kv_size =
          formulation() == mha::formulation::split_weight ? rows * cfg.d_kv() : size;
      // Q, K, V (per-head slices in the wrapper) and the heads' merged outputs before out_proj,
      // in scratch the plan keeps: per-call buffers cost the split form 3000 page faults and ~4%
      // of its time per run at B4 T256 d768.
      scratch_pool::lease scratch(
          scratch_, static_cast<std::size_t>(size + 2 * kv_size + (cfg.out_proj ? size : 0)));
      const qkv_buffers buffers{scratch.data(), scratch.data() + size,
                                scratch.data() + size + kv_size};
      // Heads' outputs land in their column block of `context`: (B, T, H * head_dim).
      float* context = cfg.out_proj ? scratch.data() + size + 2 * kv_size : y.data();

      attention_args args;
      args.batch = x.batch();
      args.seq_len = x.seq_len();
      args.head_dim = cfg.head_dim();
      args.causal = cfg.causal;
      args.scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim()));
      if (options.training) args.dropout = {cfg.dropout, options.seed};

      if (formulation() == mha::formulation::split_weight) {
        split_weight(x, buffers, context, args, cache);
      } else {
        wrapper(x, buffers, context, args, cache);
      }
      if (out_proj_) kernels_.linear(*out_proj_, context, rows, y.data());
    });
  }

  // One projection per Q, K, V over all heads, seen as (B, H, T, head_dim) (project_heads; K and
  // V have kv_heads heads); attention writes each head into its columns of `context`, which is
  // the merge.
  void split_weight(tensor_view<const float> x, const qkv_buffers& buf, float* context,
                    attention_args args, kv_cache* cache) const {
    const mha::config& cfg = config();
    args.q = project_heads(split_->query, x, cfg.n_heads, buf.q);
    args.k = project_heads(split_->key, x, cfg.kv_heads(), buf.k);
    args.v = project_heads(split_->value, x, cfg.kv_heads(), buf.v);
    const std::int64_t batch_stride = x.seq_len() * cfg.d_out, head_stride = cfg.head_dim();
    args.out = {context, batch_stride, head_stride, cfg.d_out};
    args.heads = cfg.n_heads;
    args.kv_group = cfg.n_heads / cfg.kv_heads();
    attend(args, cache);
  }

  // x W^T + b into y as `heads` heads of head_dim: the kernel set's layout, or (B, T, width)
  // row-major viewed with strides (row stride width, head h at column h * head_dim).
  head_view<const float> project_heads(const typename K::packed_linear& w,
                                       tensor_view<const float> x, std::int64_t heads,
                                       float* y) const {
    const std::int64_t hd = config().head_dim(), width = heads * hd;
    if constexpr (requires(const K& k) { k.project_heads(w, x.data(), 1, 1, 1, y); }) {
      if (const auto view = kernels_.project_heads(w, x.data(), x.batch(), x.seq_len(), heads, y))
        return *view;
    }
    kernels_.linear(w, x.data(), x.batch() * x.seq_len(), y);
    return {y, x.seq_len() * width, hd, width};
  }

  // H independent heads: each projects x with its own (head_dim, d_in) weights into its own
  // (B, T, head_dim) slices of the buffers; then each head attends over its own Q, K, V (one
  // attention call covers them all, head h's slices head_stride apart) and writes its result
  // into its column block of `context` (the concatenation). With a cache, head h has its own
  // K/V cache head h.
  void wrapper(tensor_view<const float> x, const qkv_buffers& buf, float* context,
               attention_args args, kv_cache* cache) const {
    const mha::config& cfg = config();
    const std::int64_t rows = x.batch() * x.seq_len(), hd = cfg.head_dim();
    kernels_.for_each(cfg.n_heads, [&](std::int64_t h) {
      kernels_.linear(heads_[h].query, x.data(), rows, buf.q + h * rows * hd);
      kernels_.linear(heads_[h].key, x.data(), rows, buf.k + h * rows * hd);
      kernels_.linear(heads_[h].value, x.data(), rows, buf.v + h * rows * hd);
    });
    const std::int64_t batch_stride = x.seq_len() * hd, head_stride = rows * hd;
    args.q = {buf.q, batch_stride, head_stride, hd};
    args.k = {buf.k, batch_stride, head_stride, hd};
    args.v = {buf.v, batch_stride, head_stride, hd};
    args.out = {context, x.seq_len() * cfg.d_out, hd, cfg.d_out};
    args.heads = cfg.n_heads;
    attend(args, cache);
  }

  // Attention of `args`, or with a cache: this call's keys and values appended to it and
  // attention over all it holds (attention_args::cache). The cache's lengths are run()'s to move.
  void attend(attention_args args, kv_cache* cache) const {
    if (cache == nullptr) {
      kernels_.attention(args);
      return;
    }
    const kv_store store = kv_cache_access::store(*cache);
    args.cache = &store;
    kernels_.attention(args);
  }

  K kernels_;                 // before the packed weights: packing may use its state
  std::optional<qkv> split_;  // split_weight form
  std::vector<qkv> heads_;    // n_heads entries in wrapper form
  std::optional<typename K::packed_linear> out_proj_;
  scratch_pool scratch_;
};

}  // namespace mha::detail
