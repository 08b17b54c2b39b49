// The attention call's tests' cases and data (test_attention_call.cpp,
// test_attention_call_edges.cpp): one case's shape, flags and operands, their views, and a
// float64 reference of SDPA's meaning written from its definition (mask matrix first, then the
// softmax).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

#include "base/bf16.hpp"
#include "mha/mha.hpp"
#include "support.hpp"

// The tests' names, brought into each test file with one using-directive.
namespace mha_test::attention_call {

using mha::attention_mask;
using mha::causal_alignment;
using mha::heads_view;
using mha_test::expect_error;

constexpr float minus_inf = -std::numeric_limits<float>::infinity();

struct call_case {
  std::int64_t batch = 2, heads = 4, kv_heads = 2, rows = 5, keys = 9, head_dim = 16;
  bool causal = false;
  causal_alignment alignment = causal_alignment::top_left;
  attention_mask::kind mask = attention_mask::kind::none;
  bool mask_per_batch = true, mask_per_head = false;
  bool transposed = false;  // q, k, v and out as (B, T, H, D) buffers seen through strides
  mha::precision precision = mha::precision::fp32;
  bool bf16_operands = false;  // q, k and v passed as bfloat16 (the values rounded to bf16)
  bool bf16_out = false;       // with bf16_operands: out in bfloat16 (widened into `out`)
  // The extensions (docs/design.md §1.9): a sliding window, soft-capping, a sink per head.
  std::int64_t window = 0;
  float softcap = 0.0f;
  bool sinks = false;

  std::string name() const {
    std::string n;
    for (const auto& [key, value] : {std::pair{"b", batch},
                                     {"_h", heads},
                                     {"_kv", kv_heads},
                                     {"_l", rows},
                                     {"_s", keys},
                                     {"_d", head_dim}}) {
      n += key;
      n += std::to_string(value);
    }
    if (causal) n += alignment == causal_alignment::top_left ? "_topleft" : "_bottomright";
    if (mask == attention_mask::kind::additive) n += "_additive";
    if (mask == attention_mask::kind::boolean) n += "_boolean";
    if (mask != attention_mask::kind::none && !mask_per_batch) n += "_maskb1";
    if (mask != attention_mask::kind::none && mask_per_head) n += "_maskperhead";
    if (transposed) n += "_bthd";
    if (precision == mha::precision::bf16) n += "_bf16";
    if (bf16_operands) n += "_operands";
    if (bf16_out) n += "_out";
    if (window > 0) n += "_window" + std::to_string(window);
    if (softcap > 0.0f) n += "_softcap" + std::to_string(static_cast<int>(softcap));
    if (sinks) n += "_sinks";
    return n;
  }
};
// gtest prints a case by its name (tests/support.hpp says why).
inline void PrintTo(const call_case& c, std::ostream* os) { *os << c.name(); }

// Tensors of one case, with the mask's rows: the last query row of batch 0 sees no key (every
// key masked), other entries masked at random (a quarter), additive values in [-2, 2].
struct call_data {
  call_case c;
  std::vector<float> q, k, v, out, additive, sinks;
  std::vector<unsigned char> keep;

  explicit call_data(const call_case& cc, std::uint32_t seed = 7) : c(cc) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto fill = [&](std::vector<float>& t, std::int64_t n) {
      t.resize(static_cast<std::size_t>(n));
      for (float& x : t) x = u(rng);
    };
    fill(q, c.batch * c.heads * c.rows * c.head_dim);
    fill(k, c.batch * c.kv_heads * c.keys * c.head_dim);
    fill(v, c.batch * c.kv_heads * c.keys * c.head_dim);
    out.assign(q.size(), std::nanf(""));
    const std::int64_t mb = c.mask_per_batch ? c.batch : 1, mh = c.mask_per_head ? c.heads : 1;
    const std::int64_t n = mb * mh * c.rows * c.keys;
    additive.resize(static_cast<std::size_t>(n));
    keep.resize(static_cast<std::size_t>(n));
    std::uniform_int_distribution<int> quarter(0, 3);
    for (std::int64_t i = 0; i < n; ++i) {
      const bool masked = quarter(rng) == 0 || i / c.keys == c.rows - 1;  // row L-1 of (0, 0)
      keep[static_cast<std::size_t>(i)] = masked ? 0 : 1;
      additive[static_cast<std::size_t>(i)] = masked ? minus_inf : 2.0f * u(rng);
    }
    // Sinks from below the scores to well above them (head 1's dominates its rows).
    if (c.sinks) {
      for (std::int64_t h = 0; h < c.heads; ++h) sinks.push_back(h == 1 ? 40.0f : 2.0f * u(rng));
    }
  }

  // A (B, H, T, D) view of t, or of t laid out as (B, T, H, D).
  template <class T>
  heads_view<T> view(T* t, std::int64_t heads, std::int64_t rows) const {
    if (!c.transposed) return heads_view<T>::dense(t, c.batch, heads, rows, c.head_dim);
    return {t,          c.batch,           heads, rows, c.head_dim, rows * heads * c.head_dim,
            c.head_dim, heads * c.head_dim};
  }
  float at(const std::vector<float>& t, std::int64_t heads, std::int64_t rows, std::int64_t b,
           std::int64_t h, std::int64_t i, std::int64_t d) const {
    const heads_view<const float> w = view<const float>(t.data(), heads, rows);
    return w.data[b * w.batch_stride + h * w.head_stride + i * w.row_stride + d];
  }
  std::int64_t mask_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return (((c.mask_per_batch ? b : 0) * (c.mask_per_head ? c.heads : 1) +
             (c.mask_per_head ? h : 0)) *
                c.rows +
            i) *
               c.keys +
           j;
  }

  mha::attention_options options() const {
    mha::attention_options o;
    o.causal = c.causal;
    o.alignment = c.alignment;
    o.precision = c.precision;
    o.window = c.window;
    o.softcap = c.softcap;
    o.sinks = sinks;
    if (c.mask != attention_mask::kind::none) {
      const bool boolean = c.mask == attention_mask::kind::boolean;
      const std::int64_t mb = c.mask_per_batch ? c.batch : 1, mh = c.mask_per_head ? c.heads : 1;
      o.mask = {c.mask,
                boolean ? static_cast<const void*>(keep.data()) : additive.data(),
                mb,
                mh,
                c.rows,
                c.keys,
                c.mask_per_batch ? mh * c.rows * c.keys : 0,
                c.mask_per_head ? c.rows * c.keys : 0,
                c.keys};
    }
    return o;
  }

  void run(const mha::backend& backend, int threads = 0) {
    mha::attention_options o = options();
    o.threads = threads;
    if (c.bf16_operands) {
      const auto words = [](const std::vector<float>& t) {
        std::vector<mha::bfloat16> w(t.size());
        for (std::size_t i = 0; i < t.size(); ++i) w[i] = {mha::detail::to_bf16(t[i])};
        return w;
      };
      const std::vector<mha::bfloat16> q16 = words(q), k16 = words(k), v16 = words(v);
      const auto q_view = view<const mha::bfloat16>(q16.data(), c.heads, c.rows);
      const auto k_view = view<const mha::bfloat16>(k16.data(), c.kv_heads, c.keys);
      const auto v_view = view<const mha::bfloat16>(v16.data(), c.kv_heads, c.keys);
      if (!c.bf16_out) {
        mha::attention(backend, q_view, k_view, v_view, view(out.data(), c.heads, c.rows), o);
        return;
      }
      std::vector<mha::bfloat16> out16(out.size(), mha::bfloat16{0x7fc0});  // NaN
      mha::attention(backend, q_view, k_view, v_view, view(out16.data(), c.heads, c.rows), o);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = mha::detail::from_bf16(out16[i].bits);
      return;
    }
    mha::attention(backend, view<const float>(q.data(), c.heads, c.rows),
                   view<const float>(k.data(), c.kv_heads, c.keys),
                   view<const float>(v.data(), c.kv_heads, c.keys),
                   view(out.data(), c.heads, c.rows), o);
  }

  // SDPA's definition in float64 (bf16: q, k and v rounded first, as the kernels' operands are).
  std::vector<double> reference() const {
    const bool bf16 = c.precision == mha::precision::bf16;
    const auto operand = [&](float x) {
      return bf16 ? static_cast<double>(mha::detail::round_bf16(x)) : static_cast<double>(x);
    };
    std::vector<double> y(q.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    const std::int64_t group = c.heads / c.kv_heads;
    for (std::int64_t b = 0; b < c.batch; ++b) {
      for (std::int64_t h = 0; h < c.heads; ++h) {
        for (std::int64_t i = 0; i < c.rows; ++i) {
          std::vector<double> s(static_cast<std::size_t>(c.keys), -INFINITY);
          double max = c.sinks ? sinks[static_cast<std::size_t>(h)] : -INFINITY;
          for (std::int64_t j = 0; j < c.keys; ++j) {
            const std::int64_t limit = c.alignment == causal_alignment::top_left
                                           ? i
                                           : i + c.keys - c.rows;  // attends to j <= limit
            if (c.causal && j > limit) continue;
            if (c.window > 0 && j <= limit - c.window) continue;
            double bias = 0.0;
            if (c.mask == attention_mask::kind::boolean && !keep[mask_index(b, h, i, j)]) continue;
            if (c.mask == attention_mask::kind::additive) bias = additive[mask_index(b, h, i, j)];
            if (bias == -INFINITY) continue;
            double dot = 0.0;
            for (std::int64_t d = 0; d < c.head_dim; ++d) {
              dot += operand(at(q, c.heads, c.rows, b, h, i, d)) *
                     operand(at(k, c.kv_heads, c.keys, b, h / group, j, d));
            }
            const double score =
                c.softcap > 0.0f ? c.softcap * std::tanh(scale * dot / c.softcap) : scale * dot;
            s[j] = score + bias;
            max = std::max(max, s[j]);
          }
          double sum = c.sinks && max != -INFINITY
                           ? std::exp(sinks[static_cast<std::size_t>(h)] - max)
                           : 0.0;
          for (double& x : s) sum += x = x == -INFINITY ? 0.0 : std::exp(x - max);
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            double o = 0.0;
            for (std::int64_t j = 0; j < c.keys; ++j)
              if (s[j] != 0.0) o += s[j] * operand(at(v, c.kv_heads, c.keys, b, h / group, j, d));
            const heads_view<const float> w = view<const float>(nullptr, c.heads, c.rows);
            y[b * w.batch_stride + h * w.head_stride + i * w.row_stride + d] =
                sum == 0.0 ? 0.0 : o / sum;
          }
        }
      }
    }
    return y;
  }
};

// The default case's data and its views, for the tests of bad arguments.
struct default_views {
  call_case c;
  call_data data{c};

  struct views {
    heads_view<const float> q, k, v;
    heads_view<float> out;
  };
  views operands() {
    return {data.view<const float>(data.q.data(), c.heads, c.rows),
            data.view<const float>(data.k.data(), c.kv_heads, c.keys),
            data.view<const float>(data.v.data(), c.kv_heads, c.keys),
            data.view(data.out.data(), c.heads, c.rows)};
  }
};

}  // namespace mha_test::attention_call
