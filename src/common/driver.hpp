// Internal: the wrapper and split-weight formulations, written once over a kernel set.
//
// A kernel set K supplies:
//   typename K::packed_linear;                      // one nn.Linear in the kernels' layout
//   static K::packed_linear K::pack(const linear_weights&);
//   // y (rows, out) = x (rows, in) W^T + b; x and y contiguous row-major.
//   static void K::linear(const packed_linear&, const float* x, std::int64_t rows, float* y);
//   static void K::attention(const attention_args&);
//   // Optional, for split_weight's Q, K, V: the projection of x (batch * seq_len rows) into y
//   // (rows * out floats) in a layout the kernel set prefers, returned as its (batch, heads,
//   // seq_len, out / heads) view; nullopt, writing nothing, when it has none for this shape.
//   // Otherwise the driver uses linear() into (rows, out) row-major, seen through strides.
//   static std::optional<head_view<const float>> K::project_heads(
//       const packed_linear&, const float* x, std::int64_t batch, std::int64_t seq_len,
//       std::int64_t heads, float* y);
//   // Run f() in the execution context options ask for (e.g. a thread arena), and f(i) for
//   // i < n, in any order or concurrently. sequential_execution is the single-thread answer.
//   template <class F> static void K::run(const run_options&, F&& f);
//   template <class F> static void K::for_each(std::int64_t n, F&& f);
#pragma once

#include <cmath>
#include <optional>
#include <vector>

#include "common/attention_args.hpp"
#include "common/buffer.hpp"
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
      split_.emplace(qkv{K::pack(w.query), K::pack(w.key), K::pack(w.value)});
    } else {
      // The wrapper's heads own separately allocated weights, packed one head at a time.
      for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
        const head_weights hw = w.head(cfg, h);
        heads_.push_back({K::pack(hw.query), K::pack(hw.key), K::pack(hw.value)});
      }
    }
    if (cfg.out_proj) out_proj_.emplace(K::pack(w.out_proj));
  }

 private:
  struct qkv {
    typename K::packed_linear query, key, value;
  };
  struct qkv_buffers {
    float *q, *k, *v;
  };

  void execute(tensor_view<const float> x, tensor_view<float> y,
               const run_options& options) const override {
    K::run(options, [&] {
      const mha::config& cfg = config();
      const std::int64_t rows = x.batch() * x.seq_len(), size = rows * cfg.d_out;
      // Q, K, V (B*T x d_out floats each; per-head slices in the wrapper) and the heads' merged
      // outputs before out_proj, in scratch the plan keeps: per-call buffers cost the split
      // form 3000 page faults and ~4% of its time per run at B4 T256 d768.
      scratch_pool::lease scratch(scratch_,
                                  static_cast<std::size_t>((cfg.out_proj ? 4 : 3) * size));
      const qkv_buffers buffers{scratch.data(), scratch.data() + size, scratch.data() + 2 * size};
      // Heads' outputs land in their column block of `context`: (B, T, H * head_dim).
      float* context = cfg.out_proj ? scratch.data() + 3 * size : y.data();

      attention_args args;
      args.batch = x.batch();
      args.seq_len = x.seq_len();
      args.head_dim = cfg.head_dim();
      args.causal = cfg.causal;
      args.scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim()));
      if (options.training) args.dropout = {cfg.dropout, options.seed};

      if (formulation() == mha::formulation::split_weight) {
        split_weight(x, buffers, context, args);
      } else {
        wrapper(x, buffers, context, args);
      }
      if (out_proj_) K::linear(*out_proj_, context, rows, y.data());
    });
  }

  // One projection per Q, K, V over all heads, seen as (B, H, T, head_dim) (project_heads);
  // attention writes each head into its columns of `context`, which is the merge.
  void split_weight(tensor_view<const float> x, const qkv_buffers& buf, float* context,
                    attention_args args) const {
    const mha::config& cfg = config();
    args.q = project_heads(split_->query, x, buf.q);
    args.k = project_heads(split_->key, x, buf.k);
    args.v = project_heads(split_->value, x, buf.v);
    const std::int64_t batch_stride = x.seq_len() * cfg.d_out, head_stride = cfg.head_dim();
    args.out = {context, batch_stride, head_stride, cfg.d_out};
    args.heads = cfg.n_heads;
    K::attention(args);
  }

  // x W^T + b into y, as heads: the kernel set's layout, or (B, T, d_out) row-major viewed with
  // strides (row stride d_out, head h at column h * head_dim).
  head_view<const float> project_heads(const typename K::packed_linear& w,
                                       tensor_view<const float> x, float* y) const {
    const mha::config& cfg = config();
    if constexpr (requires { K::project_heads(w, x.data(), 1, 1, 1, y); }) {
      if (const auto heads = K::project_heads(w, x.data(), x.batch(), x.seq_len(), cfg.n_heads, y))
        return *heads;
    }
    K::linear(w, x.data(), x.batch() * x.seq_len(), y);
    return {y, x.seq_len() * cfg.d_out, cfg.head_dim(), cfg.d_out};
  }

  // H independent heads: each projects x with its own (head_dim, d_in) weights into its own
  // (B, T, head_dim) slices of the buffers, attends, and writes its result into its column
  // block of `context` (the concatenation).
  void wrapper(tensor_view<const float> x, const qkv_buffers& buf, float* context,
               const attention_args& shared) const {
    const mha::config& cfg = config();
    const std::int64_t rows = x.batch() * x.seq_len(), hd = cfg.head_dim();
    K::for_each(cfg.n_heads, [&](std::int64_t h) {
      float *q = buf.q + h * rows * hd, *k = buf.k + h * rows * hd, *v = buf.v + h * rows * hd;
      K::linear(heads_[h].query, x.data(), rows, q);
      K::linear(heads_[h].key, x.data(), rows, k);
      K::linear(heads_[h].value, x.data(), rows, v);

      attention_args args = shared;
      const std::int64_t batch_stride = x.seq_len() * hd;
      args.q = {q, batch_stride, 0, hd};
      args.k = {k, batch_stride, 0, hd};
      args.v = {v, batch_stride, 0, hd};
      args.out = {context + h * hd, x.seq_len() * cfg.d_out, 0, cfg.d_out};
      args.heads = 1;
      args.first_head = h;
      K::attention(args);
    });
  }

  std::optional<qkv> split_;  // split_weight form
  std::vector<qkv> heads_;    // n_heads entries in wrapper form
  std::optional<typename K::packed_linear> out_proj_;
  scratch_pool scratch_;
};

}  // namespace mha::detail
