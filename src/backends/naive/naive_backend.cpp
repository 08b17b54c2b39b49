// The naive backend: the spec as plain loops, one small function per step (docs/design.md §1).
// Single-threaded, float accumulation, no blocking: the readable reference, not a fast path.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/bf16.hpp"
#include "base/checks.hpp"
#include "base/int8.hpp"
#include "common/attention_calls.hpp"
#include "driver/driver.hpp"
#include "mha/backends/naive.hpp"

namespace mha {
namespace {

using detail::attention_args;

// The precision's rounding of an operand (docs/design.md §1.5): none in fp32, to the nearest
// bf16 in bf16.
float operand(float v, bool bf16) { return bf16 ? detail::round_bf16(v) : v; }

// y = x W^T + b, one output element at a time (x rounded as an operand; W already is).
void project(const linear_weights& w, const float* x, std::int64_t rows, float* y, bool bf16) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < w.out; ++o) {
      float dot = 0.0f;
      for (std::int64_t i = 0; i < w.in; ++i)
        dot += operand(x[r * w.in + i], bf16) * w.weight[o * w.in + i];
      y[r * w.out + o] = w.has_bias() ? dot + w.bias[o] : dot;
    }
  }
}

// Query row i attends to keys a.window_begin(past + i) <= j < a.key_end(i) (past + i + 1
// causal, all keys otherwise; a window's first key, else 0): row i of the scores has keys()
// columns. Keys outside never enter the arithmetic, so a NaN or Inf in a later token (or one
// that left the window) cannot reach a row (not even as 0 * NaN).

// S[i][j] = scale * q_i . k_j for one head, soft-capped (softcap tanh(s / softcap)) with a
// soft-cap, plus the mask's value with a mask (mha::attention; the entries outside each row's
// keys are set by outside_keys).
void scores(const attention_args& a, std::int64_t b, std::int64_t h, std::vector<float>& s,
            bool bf16) {
  const std::int64_t n = a.keys();
  std::vector<float> mask(static_cast<std::size_t>(a.mask.active() ? n : 0));
  for (std::int64_t i = 0; i < a.seq_len; ++i) {
    if (a.mask.active()) a.mask.row(b, h, i, 0, a.key_end(i), mask.data());
    for (std::int64_t j = a.window_begin(a.past + i); j < a.key_end(i); ++j) {
      const float* q = a.q.row(b, h, i);
      const float* k = a.k.row(b, h / a.kv_group, j);
      float dot = 0.0f;
      for (std::int64_t d = 0; d < a.head_dim; ++d)
        dot += operand(q[d], bf16) * operand(k[d], bf16);
      float score = a.scale * dot;
      if (a.softcap > 0.0f) score = a.softcap * std::tanh(score / a.softcap);
      s[i * n + j] = a.mask.active() ? score + mask[static_cast<std::size_t>(j)] : score;
    }
  }
}

// S[i][j] = -inf for j past query i's position (a token does not see later tokens) and before
// its window.
void outside_keys(const attention_args& a, std::vector<float>& s) {
  const std::int64_t n = a.keys();
  for (std::int64_t i = 0; i < a.seq_len; ++i) {
    float* row = s.data() + i * n;
    std::fill(row, row + a.window_begin(a.past + i), -std::numeric_limits<float>::infinity());
    std::fill(row + a.key_end(i), row + n, -std::numeric_limits<float>::infinity());
  }
}

// Each row of S becomes exp(s - max), the max subtracted for stability; sums[i] gets the row's
// sum. fp32 then divides the row by it (softmax(row)); bf16 keeps the unnormalised weights,
// which are rounded as the operands of P V and divided after it (docs/design.md §1.5). With a
// mask, a row whose scores are all -inf gets weights 0 and sum 0 (its output is zeros). A sink
// (its head's logit, nullptr: none) joins the max and the sum, and no weight.
void softmax_rows(std::int64_t rows, std::int64_t n, std::vector<float>& s,
                  std::vector<float>& sums, bool bf16, bool masked, const float* sink) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float* row = s.data() + i * n;
    float max = *std::max_element(row, row + n);
    if (sink != nullptr) max = std::max(max, *sink);
    if (masked && max == -std::numeric_limits<float>::infinity()) max = 0.0f;
    float sum = sink != nullptr ? std::exp(*sink - max) : 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    sums[static_cast<std::size_t>(i)] = sum;
    if (!bf16 && sum != 0.0f) {
      for (std::int64_t j = 0; j < n; ++j) row[j] /= sum;
    }
  }
}

// Training mode: A[i][j] *= 0 or 1/(1-p), the shared mask of docs/design.md §1.1, keyed on the
// sequence, head and absolute positions.
void dropout(const attention_args& a, std::int64_t b, std::int64_t h, std::vector<float>& s) {
  const std::int64_t n = a.keys();
  std::vector<float> multipliers(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < a.seq_len; ++i) {
    detail::dropout_multipliers(a.dropout, a.first_batch + b, a.first_head + h, a.past + i, 0, n,
                                multipliers.data());
    for (std::int64_t j = 0; j < n; ++j) s[i * n + j] *= multipliers[j];
  }
}

// out_i = sum_j A[i][j] v_j; bf16: sum_j bf16(P[i][j]) bf16(v_j) / sums[i].
void weighted_values(const attention_args& a, std::int64_t b, std::int64_t h,
                     const std::vector<float>& s, const std::vector<float>& sums, bool bf16) {
  const std::int64_t n = a.keys();
  for (std::int64_t i = 0; i < a.seq_len; ++i) {
    float* out = a.out.row(b, h, i);
    std::fill(out, out + a.head_dim, 0.0f);
    for (std::int64_t j = a.window_begin(a.past + i); j < a.key_end(i); ++j) {
      const float* v = a.v.row(b, h / a.kv_group, j);
      const float p = operand(s[i * n + j], bf16);
      for (std::int64_t d = 0; d < a.head_dim; ++d) out[d] += p * operand(v[d], bf16);
    }
    if (bf16 && sums[static_cast<std::size_t>(i)] != 0.0f) {
      for (std::int64_t d = 0; d < a.head_dim; ++d) out[d] /= sums[static_cast<std::size_t>(i)];
    }
  }
}

// The kernel set of docs/design.md §2: the functions above, in the module's precision.
class naive_kernels : public detail::sequential_execution {
 public:
  explicit naive_kernels(const mha::config& cfg) : bf16_(cfg.precision == precision::bf16) {}

  using packed_linear = linear_weights;  // nn.Linear's own layout, rounded in bf16
  packed_linear pack(const linear_weights& w) const {
    packed_linear p = w;
    for (float& v : p.weight) v = operand(v, bf16_);
    for (float& v : p.bias) v = operand(v, bf16_);
    return p;
  }
  void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) const {
    project(w, x, rows, y, bf16_);
  }
  static constexpr bool grouped_kv = true;   // each query head reads K/V head h / kv_group
  static constexpr bool bf16 = true;         // the bf16 reference (docs/design.md §1.5)
  static constexpr bool coded_cache = true;  // the int8, k8v4, int4 caches' reference (§1.7)
  static constexpr bool extensions = true;   // config::window and softcap (§1.9)
  // Decode: the plain row-major cache (bf16 elements in bf16, int8 codes and their rows'
  // scales in int8); each sequence attends over its rows as a full forward with past = its
  // length would.
  std::int64_t cache_head_bytes(std::int64_t capacity, std::int64_t head_dim, precision kv) const {
    namespace cache = detail::row_major_cache;
    switch (kv) {
      case precision::bf16:
        return cache::head_bytes<detail::bf16>(capacity, head_dim);
      case precision::int8:
        return cache::int8_head_bytes(capacity, head_dim);
      case precision::k8v4:
        return cache::k8v4_head_bytes(capacity, head_dim);
      case precision::int4:
        return cache::int4_head_bytes(capacity, head_dim);
      default:
        return cache::head_bytes<float>(capacity, head_dim);
    }
  }
  void attention(const attention_args& a) const {
    namespace cache = detail::row_major_cache;
    if (a.cache == nullptr) {
      attend(a, bf16_);
    } else if (a.cache->format == precision::fp32 && !a.cache->ring) {
      cache::append(a);
      for (std::int64_t b = 0; b < a.batch; ++b) attend(cache::sequence(a, b), bf16_);
    } else if (a.cache->format == precision::fp32) {  // a ring: its rows read in key order
      cache::append(a);
      const auto keys = cache::keys<float>(*a.cache, a.head_dim),
                 values = cache::values<float>(*a.cache, a.head_dim);
      attend_widened(a, bf16_,
                     [&](std::int64_t b, std::int64_t g, std::int64_t, std::int64_t slot,
                         bool value, float* to) {
                       const float* row = (value ? values : keys).row(b, g, slot);
                       std::copy(row, row + a.head_dim, to);
                     });
    } else if (a.cache->format == precision::bf16) {
      // The cache holds bf16; each sequence's rows are widened to float for the loops.
      cache::append<detail::bf16>(a, detail::to_bf16);
      const auto keys = cache::keys<detail::bf16>(*a.cache, a.head_dim),
                 values = cache::values<detail::bf16>(*a.cache, a.head_dim);
      attend_widened(a, bf16_,
                     [&](std::int64_t b, std::int64_t g, std::int64_t, std::int64_t slot,
                         bool value, float* to) {
                       const detail::bf16* row = (value ? values : keys).row(b, g, slot);
                       std::transform(row, row + a.head_dim, to, detail::from_bf16);
                     });
    } else {
      // int8: each element is scale * (zero + code), in fp32 (§1.7): K, V and the weights are
      // not rounded to bf16; the queries are, in a bf16 plan, as its operands are. k8v4: its keys
      // so, each value row's groups read back (scale code + offset) and turned back. int4: its
      // values as k8v4's, its keys from their channel groups' codes, or exact where their group is
      // not yet coded.
      const bool k8v4 = a.cache->format == precision::k8v4;
      const bool int4 = a.cache->format == precision::int4;
      cache::append_coded(a);
      const auto keys = cache::keys<std::uint8_t>(*a.cache, a.head_dim),
                 values = cache::values<std::uint8_t>(*a.cache, a.head_dim);
      std::vector<float> q;
      attention_args rounded = a;
      if (bf16_) {
        const std::int64_t hd = a.head_dim, head = a.seq_len * hd;
        q.resize(static_cast<std::size_t>(a.batch * a.heads * head));
        const detail::head_view<float> to{q.data(), a.heads * head, head, hd};
        for (std::int64_t b = 0; b < a.batch; ++b) {
          for (std::int64_t h = 0; h < a.heads; ++h) {
            for (std::int64_t i = 0; i < a.seq_len; ++i) {
              std::transform(a.q.row(b, h, i), a.q.row(b, h, i) + hd, to.row(b, h, i),
                             detail::round_bf16);
            }
          }
        }
        rounded.q = to;
      }
      attend_widened(
          rounded, false,
          [&](std::int64_t b, std::int64_t g, std::int64_t j, std::int64_t slot, bool value,
              float* to) {
            if (int4) {
              if (!value) return cache::int4_key(*a.cache, a.head_dim, b, g, j, a.keys(b), to);
              return cache::read_value4(cache::int4_codes(*a.cache, a.head_dim, b, g, slot, true),
                                        cache::int4_value_words(*a.cache, a.head_dim, b, g, slot),
                                        a.head_dim, to);
            }
            if (k8v4 && value) {
              cache::k8v4_value(*a.cache, a.head_dim, b, g, slot, to);
              return;
            }
            const std::uint8_t* codes = (value ? values : keys).row(b, g, slot);
            const detail::int8_row row =
                k8v4 ? cache::k8v4_key_rows(*a.cache, a.head_dim, b, g)[slot]
                     : cache::int8_rows(*a.cache, a.head_dim, b,
                                        g)[value ? a.cache->capacity + slot : slot];
            // A key back over its channel scales: s_d (k_d / s_d).
            const float* channels = k8v4 ? cache::k8v4_channels(*a.cache, a.head_dim, b, g)
                                         : cache::int8_channels(*a.cache, a.head_dim, b, g);
            for (std::int64_t d = 0; d < a.head_dim; ++d) {
              to[d] = detail::dequantize(codes[d], row);
              if (!value) to[d] *= channels[d];
            }
          });
    }
  }

 private:
  // Attention over a cache after the append: each sequence's keys and values widened to float
  // rows by row(b, g, j, slot, value, to) (key j's row in `slot`, or its value row when `value`),
  // key j from slot(j), then attended as a full forward with past = the sequence's length. A
  // ring holds only its last keys: the earlier ones, which no window reaches, stay zeros.
  template <class Widen>
  static void attend_widened(const attention_args& a, bool rounded, Widen row) {
    namespace cache = detail::row_major_cache;
    for (std::int64_t b = 0; b < a.batch; ++b) {
      const std::int64_t n = a.keys(b), hd = a.head_dim;
      const std::int64_t first =
          a.cache->ring ? std::max<std::int64_t>(0, n - a.cache->capacity) : 0;
      std::vector<float> k(static_cast<std::size_t>(a.kv_heads() * n * hd)), v(k.size());
      for (std::int64_t g = 0; g < a.kv_heads(); ++g) {
        for (std::int64_t j = first; j < n; ++j) {
          row(b, g, j, a.cache->slot(j), false, k.data() + (g * n + j) * hd);
          row(b, g, j, a.cache->slot(j), true, v.data() + (g * n + j) * hd);
        }
      }
      attend(cache::sequence(a, b, {k.data(), 0, n * hd, hd}, {v.data(), 0, n * hd, hd}), rounded);
    }
  }

  // Attention without a cache: the loops above, rounding the operands to bf16 or not.
  static void attend(const attention_args& a, bool rounded) {
    detail::check_score_memory("naive", a.seq_len, a.keys(), 1);
    std::vector<float> s(static_cast<std::size_t>(a.seq_len * a.keys())),
        sums(static_cast<std::size_t>(a.seq_len));
    for (std::int64_t b = 0; b < a.batch; ++b) {
      for (std::int64_t h = 0; h < a.heads; ++h) {
        scores(a, b, h, s, rounded);
        outside_keys(a, s);
        softmax_rows(a.seq_len, a.keys(), s, sums, rounded, a.mask.active(),
                     a.sinks ? a.sinks + h : nullptr);
        if (a.dropout.active()) dropout(a, b, h, s);
        weighted_values(a, b, h, s, sums, rounded);
      }
    }
  }

  bool bf16_;
};
static_assert(detail::kernel_set<naive_kernels>);

struct naive_impl final : backend, detail::attention_calls {
  std::string_view name() const noexcept override { return "naive"; }
  std::string description() const override {
    return "reference loops, single-threaded, float accumulation";
  }
  // Plain loops compiled for the x86-64 baseline; whatever the compiler vectorises is SSE2.
  mha::isa isa() const override { return isa::scalar; }
  // Grouped-query attention too (each query head reads its group's K/V head, kv_group), and
  // decode (keys from a cache): naive_kernels says so.
  support supports(const problem& p) const override {
    return detail::driver_support<naive_kernels>(p);
  }
  // mha::attention: the loops above (holding each head's scores), fp32 or bf16.
  support supports_attention(precision) const override { return support::yes(); }

 private:
  // An attention cache: a plan's row-major one.
  std::int64_t attention_cache_head_bytes(std::int64_t capacity, std::int64_t head_dim,
                                          precision kv, precision compute) const noexcept override {
    mha::config cfg;
    cfg.precision = compute;
    return naive_kernels(cfg).cache_head_bytes(capacity, head_dim, kv);
  }
  void attend(const attention_args& args, const run_options&) const override {
    mha::config cfg;
    cfg.precision = args.bf16 ? precision::bf16 : precision::fp32;
    if (!args.bf16_operands()) {
      naive_kernels(cfg).attention(args);
      return;
    }
    // bf16 operands: the loops read floats, so q, k and v are widened to dense copies (exact).
    attention_args a = args;
    const std::int64_t hd = a.head_dim, keys = a.keys();
    const auto widen = [&](const detail::head_view<const detail::bf16>& from, std::int64_t heads,
                           std::int64_t rows,
                           std::vector<float>& to) -> detail::head_view<const float> {
      to.resize(static_cast<std::size_t>(a.batch * heads * rows * hd));
      float* row = to.data();
      for (std::int64_t b = 0; b < a.batch; ++b) {
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t i = 0; i < rows; ++i, row += hd)
            std::transform(from.row(b, h, i), from.row(b, h, i) + hd, row, detail::from_bf16);
        }
      }
      return {to.data(), heads * rows * hd, rows * hd, hd};
    };
    std::vector<float> q, k, v, out;
    a.q = widen(args.q16, a.heads, a.seq_len, q);
    a.k = widen(args.k16, a.kv_heads(), keys, k);
    a.v = widen(args.v16, a.kv_heads(), keys, v);
    a.q16 = a.k16 = a.v16 = {};
    if (args.out16.data == nullptr) {
      naive_kernels(cfg).attention(a);
      return;
    }
    // bf16 results: computed into dense floats, then rounded.
    out.resize(q.size());
    a.out = {out.data(), a.heads * a.seq_len * hd, a.seq_len * hd, hd};
    a.out16 = {};
    naive_kernels(cfg).attention(a);
    const float* row = out.data();
    for (std::int64_t b = 0; b < a.batch; ++b) {
      for (std::int64_t h = 0; h < a.heads; ++h) {
        for (std::int64_t i = 0; i < a.seq_len; ++i, row += hd)
          std::transform(row, row + hd, args.out16.row(b, h, i), detail::to_bf16);
      }
    }
  }
  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return std::make_unique<detail::driver_plan<naive_kernels>>(cfg, form, w, name());
  }
};

}  // namespace

const backend& naive_backend() {
  static const naive_impl instance;
  return instance;
}

}  // namespace mha
