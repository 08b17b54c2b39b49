#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/bf16.hpp"
#include "base/dropout.hpp"
#include "base/int8.hpp"
#include "base/key4.hpp"
#include "base/value4.hpp"

namespace mha_reference {
namespace {

// (rows, l.out) = (rows, l.in) W^T + b for the `count` rows of x starting at `first`, double
// accumulation.
std::vector<double> project(const mha::linear_weights& l, std::span<const double> x,
                            std::int64_t first, std::int64_t count) {
  std::vector<double> y(static_cast<std::size_t>(count * l.out));
  for (std::int64_t r = 0; r < count; ++r) {
    const double* xr = x.data() + (first + r) * l.in;
    for (std::int64_t o = 0; o < l.out; ++o) {
      double acc = l.has_bias() ? l.bias[o] : 0.0;
      for (std::int64_t i = 0; i < l.in; ++i) acc += xr[i] * double{l.weight[o * l.in + i]};
      y[r * l.out + o] = acc;
    }
  }
  return y;
}

// v rounded to the nearest bf16 (through float: a double that is not a float's value rounds
// twice, which can differ from one rounding in a tie; the oracle accepts that).
double round_bf16(double v) { return mha::detail::round_bf16(static_cast<float>(v)); }

// The operands of a bf16 module's products (docs/design.md §1.5) rounded, in place; fp32: as is.
void round_operands(std::vector<double>& values, bool bf16) {
  if (bf16) {
    for (double& v : values) v = round_bf16(v);
  }
}

// One head's attention for query row i, in double: out[e] = sum_j a_j v_j[e] with
// a = dropout(softmax_j(cap(scale q . k_j)), -inf for j > i when causal and for j <= i - window
// with a window), j < keys; cap(s) = softcap tanh(s / softcap) with a softcap, else s; a sink's
// exp(sink) joins the softmax's denominator only. key(j) and
// value(j) give row j (head_dim elements); `a` has room for `keys` weights. b, h and i key the
// dropout mask (i is the absolute position). bf16: q, k and v are already rounded, and the weights
// are the unnormalised exp(s - max), dropped and rounded, the sum divided after (§1.5).
template <class KeyRow, class ValueRow>
void attend(const double* q, KeyRow key, ValueRow value, std::int64_t keys, std::int64_t hd,
            std::int64_t i, bool causal, const mha::detail::dropout_spec& drop, std::int64_t b,
            std::int64_t h, double* a, double* out, bool bf16 = false, std::int64_t window = 0,
            double softcap = 0.0, const float* sink = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  double max = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < keys; ++j) {
    const auto* k = key(j);
    double s = 0.0;
    for (std::int64_t e = 0; e < hd; ++e) s += q[e] * double{k[e]};
    const bool outside = (causal && j > i) || (window > 0 && j <= i - window);
    s *= scale;
    if (softcap > 0.0) s = softcap * std::tanh(s / softcap);
    a[j] = outside ? -std::numeric_limits<double>::infinity() : s;
    max = std::max(max, a[j]);
  }
  if (sink != nullptr) max = std::max(max, double{*sink});
  // A sink joins the denominator only.
  double sum = sink != nullptr ? std::exp(*sink - max) : 0.0;
  for (std::int64_t j = 0; j < keys; ++j) sum += (a[j] = std::exp(a[j] - max));
  for (std::int64_t j = 0; j < keys; ++j) {
    if (!bf16) a[j] /= sum;
    if (drop.active()) {
      a[j] = mha::detail::dropout_keep(drop, b, h, i, j) ? a[j] / (1.0 - drop.p) : 0.0;
    }
    if (bf16) a[j] = round_bf16(a[j]);
  }
  for (std::int64_t e = 0; e < hd; ++e) out[e] = 0.0;
  for (std::int64_t j = 0; j < keys; ++j) {
    const auto* v = value(j);
    for (std::int64_t e = 0; e < hd; ++e) out[e] += a[j] * double{v[e]};
  }
  if (bf16) {
    for (std::int64_t e = 0; e < hd; ++e) out[e] /= sum;
  }
}

// w with every weight and bias rounded to bf16 (a bf16 module's parameters); fp32: as is.
mha::weights parameters(const mha::weights& w, bool bf16) {
  mha::weights rounded = w;
  if (bf16) {
    for (mha::linear_weights* l :
         {&rounded.query, &rounded.key, &rounded.value, &rounded.out_proj}) {
      for (float& v : l->weight) v = mha::detail::round_bf16(v);
      for (float& v : l->bias) v = mha::detail::round_bf16(v);
    }
  }
  return rounded;
}

// The q/k norm (docs/design.md §1.10) of `row`, `width` features in heads of hd, in double: each
// head divided by its root mean square (plus eps) and scaled by `w`'s head_dim weights. No norm
// (cfg.qk_norm false): as is.
void normalise(double* row, std::int64_t width, const mha::config& cfg,
               const std::vector<float>& w) {
  if (!cfg.qk_norm) return;
  const std::int64_t hd = cfg.head_dim();
  for (std::int64_t head = 0; head < width; head += hd) {
    double squares = 0.0;
    for (std::int64_t e = 0; e < hd; ++e) squares += row[head + e] * row[head + e];
    const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(hd) + cfg.qk_norm_eps);
    for (std::int64_t e = 0; e < hd; ++e) row[head + e] *= inverse * double{w[e]};
  }
}

// Rotary position embedding (docs/design.md §1.6) of `row`, `width` features in heads of hd, at
// position `pos`, in double: the pairs (e, e + hd/2) of each head turn by pos * f_e, f the
// inverse frequencies (mha::rope_frequencies), scaled by `amplitude` (mha::rope_amplitude).
void rotate(double* row, std::int64_t width, std::int64_t hd, std::int64_t pos,
            const std::vector<double>& f, double amplitude) {
  const std::int64_t half = hd / 2;
  for (std::int64_t head = 0; head < width; head += hd) {
    for (std::int64_t e = 0; e < half; ++e) {
      const double angle = static_cast<double>(pos) * f[static_cast<std::size_t>(e)];
      const double c = amplitude * std::cos(angle), s = amplitude * std::sin(angle);
      const double a = row[head + e], b = row[head + e + half];
      row[head + e] = a * c - b * s;
      row[head + e + half] = b * c + a * s;
    }
  }
}

}  // namespace

std::vector<double> forward_rows(const mha::config& cfg, const mha::weights& weights,
                                 std::span<const float> x, std::int64_t batch, std::int64_t seq_len,
                                 std::span<const row> rows, const mha::run_options& options,
                                 std::int64_t zero_past) {
  const bool bf16 = cfg.precision == mha::precision::bf16;
  const mha::weights w = parameters(weights, bf16);
  const std::int64_t hd = cfg.head_dim(), d = cfg.d_out, d_kv = cfg.d_kv(), width = cfg.out_width();
  const std::int64_t group = cfg.n_heads / cfg.kv_heads();  // query heads per K/V head
  const std::vector<double> frequencies = mha::rope_frequencies(cfg);
  const double amplitude = mha::rope_amplitude(cfg);  // yarn's attention factor, else 1
  const mha::detail::dropout_spec drop{options.training ? cfg.dropout : 0.0f, options.seed};
  std::vector<double> result(rows.size() * static_cast<std::size_t>(width));
  std::vector<double> a(static_cast<std::size_t>(zero_past + seq_len)),
      context(static_cast<std::size_t>(d));
  // The keys and values of a token x = 0: the biases, or 0 (rotated by position with RoPE).
  const std::vector<double> zero_x(static_cast<std::size_t>(cfg.d_in), 0.0);
  std::vector<double> k0 = project(w.key, zero_x, 0, 1), v0 = project(w.value, zero_x, 0, 1);
  normalise(k0.data(), d_kv, cfg, w.k_norm);
  std::vector<double> zero_keys;  // zero_past rows of d_kv, when RoPE makes them differ
  if (cfg.rope_base != 0.0) {
    for (std::int64_t j = 0; j < zero_past; ++j) {
      zero_keys.insert(zero_keys.end(), k0.begin(), k0.end());
      rotate(zero_keys.data() + j * d_kv, d_kv, hd, j, frequencies, amplitude);
    }
  }
  round_operands(k0, bf16);
  round_operands(v0, bf16);
  round_operands(zero_keys, bf16);

  for (std::int64_t b = 0; b < batch; ++b) {
    if (std::none_of(rows.begin(), rows.end(), [&](const row& r) { return r.batch == b; }))
      continue;
    std::vector<double> xb(x.begin() + b * seq_len * cfg.d_in,
                           x.begin() + (b + 1) * seq_len * cfg.d_in);
    round_operands(xb, bf16);
    std::vector<double> k = project(w.key, xb, 0, seq_len), v = project(w.value, xb, 0, seq_len);
    for (std::int64_t j = 0; j < seq_len; ++j) normalise(k.data() + j * d_kv, d_kv, cfg, w.k_norm);
    if (cfg.rope_base != 0.0) {
      for (std::int64_t j = 0; j < seq_len; ++j)
        rotate(k.data() + j * d_kv, d_kv, hd, zero_past + j, frequencies, amplitude);
    }
    round_operands(k, bf16);
    round_operands(v, bf16);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (rows[r].batch != b) continue;
      const std::int64_t i = rows[r].token;
      std::vector<double> q = project(w.query, xb, i, 1);
      normalise(q.data(), d, cfg, w.q_norm);
      if (cfg.rope_base != 0.0) rotate(q.data(), d, hd, zero_past + i, frequencies, amplitude);
      round_operands(q, bf16);
      for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
        const std::int64_t g = h / group;
        // Token j of the sequence: a zero token before zero_past, else row j - zero_past of x.
        const auto key = [&](std::int64_t j) {
          const double* row = j >= zero_past      ? k.data() + (j - zero_past) * d_kv
                              : zero_keys.empty() ? k0.data()
                                                  : zero_keys.data() + j * d_kv;
          return row + g * hd;
        };
        const auto value = [&](std::int64_t j) {
          return j < zero_past ? v0.data() + g * hd : v.data() + (j - zero_past) * d_kv + g * hd;
        };
        attend(q.data() + h * hd, key, value, zero_past + seq_len, hd, zero_past + i, cfg.causal,
               drop, b, h, a.data(), context.data() + h * hd, bf16, cfg.window, cfg.softcap,
               cfg.sinks ? w.sinks.data() + h : nullptr);
      }
      std::vector<double> c = context;
      round_operands(c, bf16 && cfg.out_proj);
      const std::vector<double> y = cfg.out_proj ? project(w.out_proj, c, 0, 1) : c;
      std::copy(y.begin(), y.end(), result.begin() + static_cast<std::ptrdiff_t>(r) * width);
    }
  }
  return result;
}

double max_abs_score(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                     std::int64_t batch, std::int64_t seq_len) {
  const std::int64_t hd = cfg.head_dim(), d_kv = cfg.d_kv();
  const std::int64_t group = cfg.n_heads / cfg.kv_heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const std::vector<double> frequencies = mha::rope_frequencies(cfg);
  const double amplitude = mha::rope_amplitude(cfg);  // yarn's attention factor, else 1
  double largest = 0.0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::vector<double> xb(x.begin() + b * seq_len * cfg.d_in,
                                 x.begin() + (b + 1) * seq_len * cfg.d_in);
    std::vector<double> q = project(w.query, xb, 0, seq_len), k = project(w.key, xb, 0, seq_len);
    for (std::int64_t i = 0; i < seq_len; ++i) {
      normalise(q.data() + i * cfg.d_out, cfg.d_out, cfg, w.q_norm);
      normalise(k.data() + i * d_kv, d_kv, cfg, w.k_norm);
    }
    if (cfg.rope_base != 0.0) {
      for (std::int64_t i = 0; i < seq_len; ++i) {
        rotate(q.data() + i * cfg.d_out, cfg.d_out, hd, i, frequencies, amplitude);
        rotate(k.data() + i * d_kv, d_kv, hd, i, frequencies, amplitude);
      }
    }
    for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
      for (std::int64_t i = 0; i < seq_len; ++i) {
        for (std::int64_t j = cfg.window > 0 ? std::max<std::int64_t>(0, i - cfg.window + 1) : 0;
             j < (cfg.causal ? i + 1 : seq_len); ++j) {
          double s = 0.0;
          for (std::int64_t e = 0; e < hd; ++e)
            s += q[i * cfg.d_out + h * hd + e] * k[j * d_kv + h / group * hd + e];
          largest = std::max(largest, std::abs(s * scale));
        }
      }
    }
  }
  return largest;
}

std::vector<double> forward(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                            std::int64_t batch, std::int64_t seq_len,
                            const mha::run_options& options) {
  std::vector<row> all;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq_len; ++t) all.push_back({b, t});
  return forward_rows(cfg, w, x, batch, seq_len, all, options);
}

std::vector<double> attention_row(const attention_shape& shape, std::span<const float> q,
                                  std::span<const float> k, std::span<const float> v,
                                  std::int64_t b, std::int64_t h, std::int64_t i) {
  const std::int64_t hd = shape.head_dim, head = (b * shape.heads + h) * shape.seq_len * hd;
  const std::vector<double> qi(q.begin() + head + i * hd, q.begin() + head + (i + 1) * hd);
  std::vector<double> a(static_cast<std::size_t>(shape.seq_len)), out(static_cast<std::size_t>(hd));
  attend(
      qi.data(), [&](std::int64_t j) { return k.data() + head + j * hd; },
      [&](std::int64_t j) { return v.data() + head + j * hd; }, shape.seq_len, hd, i, shape.causal,
      {shape.dropout, shape.seed}, b, h, a.data(), out.data(), false, shape.window);
  return out;
}

namespace {

// What an int8 cache's bounds read of a module over the first `rows` rows of x: the largest
// query, key and value (times sqrt 2 with RoPE, which mixes pairs) and out_proj's largest row
// sum of |W| (1 without out_proj).
struct int8_bound_terms {
  double q, k, v, rows_sum;
};

int8_bound_terms int8_terms(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                            std::int64_t rows) {
  const std::vector<double> xs(x.begin(), x.begin() + rows * cfg.d_in);
  const auto largest = [&](const mha::linear_weights& l, const std::vector<float>* norm = nullptr) {
    std::vector<double> y = project(l, xs, 0, rows);
    double m = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      if (norm != nullptr) normalise(y.data() + r * l.out, l.out, cfg, *norm);
      for (std::int64_t o = 0; o < l.out; ++o) m = std::max(m, std::abs(y[r * l.out + o]));
    }
    return cfg.rope_base != 0.0 ? std::sqrt(2.0) * mha::rope_amplitude(cfg) * m : m;
  };
  double rows_sum = 1.0;
  if (cfg.out_proj) {
    rows_sum = 0.0;
    for (std::int64_t o = 0; o < w.out_proj.out; ++o) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < w.out_proj.in; ++i)
        sum += std::abs(double{w.out_proj.weight[o * w.out_proj.in + i]});
      rows_sum = std::max(rows_sum, sum);
    }
  }
  return {largest(w.query, &w.q_norm), largest(w.key, &w.k_norm), largest(w.value), rows_sum};
}

// The largest magnitude and the largest range of a turned group of the value rows of the first
// `rows` rows of x (what a k8v4 cache codes, base/value4.hpp).
struct turned_values {
  double largest = 0.0, range = 0.0;
};
turned_values turned_value_groups(const mha::config& cfg, const mha::weights& w,
                                  std::span<const float> x, std::int64_t rows) {
  const std::vector<double> xs(x.begin(), x.begin() + rows * cfg.d_in);
  const std::vector<double> y = project(w.value, xs, 0, rows);
  const std::int64_t hd = cfg.head_dim();
  turned_values t;
  std::vector<float> group(static_cast<std::size_t>(mha::detail::value4_group));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < cfg.kv_heads(); ++g) {
      for (std::int64_t i = 0; i < mha::detail::value4_groups(hd); ++i) {
        const std::int64_t n = mha::detail::value4_group_size(hd, i);
        const double* from = y.data() + r * w.value.out + g * hd + i * mha::detail::value4_group;
        std::transform(from, from + n, group.begin(),
                       [](double e) { return static_cast<float>(e); });
        mha::detail::turn(group.data(), n);
        const auto [lo, hi] = std::minmax_element(group.begin(), group.begin() + n);
        t.range = std::max(t.range, double{*hi} - *lo);
        t.largest = std::max({t.largest, std::abs(double{*lo}), std::abs(double{*hi})});
      }
    }
  }
  return t;
}

}  // namespace

double int8_cache_bound(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                        std::int64_t rows, double max_y, mha::precision kv) {
  const auto [q, k, v, rows_sum] = int8_terms(cfg, w, x, rows);
  // The codes' error in a score, plus the SIMD kernels' 16-bit queries'; in an output, the
  // values' codes' plus their 16-bit weights' (docs/design.md §1.7).
  const double limit = mha::detail::query_code_limit(cfg.head_dim());
  const double code = mha::detail::int8_element_error;
  double delta = std::sqrt(static_cast<double>(cfg.head_dim())) * q * k * (code + 1.0 / limit);
  if (kv == mha::precision::int4) {
    // Each key element within key4_element_error of its channel group's range (2 max|k| at
    // most); the 16-bit queries times a group's scales as int8's queries (key4_query_limit).
    const double key4_limit = mha::detail::key4_query_limit(cfg.head_dim());
    delta = std::sqrt(static_cast<double>(cfg.head_dim())) * q * k *
            (2.0 * mha::detail::key4_element_error + 1.0 / key4_limit);
  }
  if (kv == mha::precision::k8v4 || kv == mha::precision::int4) {
    // Each turned element within value4_element_error of its group's range, so each element of a
    // value row (turned back) within sqrt(32) times that; and the 16-bit weights' share.
    const turned_values t = turned_value_groups(cfg, w, x, rows);
    const double root = std::sqrt(double{mha::detail::value4_group});
    const double values = root * mha::detail::value4_element_error * t.range;
    const double heads = (v + values) * std::expm1(2.0 * delta) + values +
                         mha::detail::value4_weight_error * t.largest;
    return rows_sum * heads + 1e-5 * max_y;
  }
  const double heads = v * (std::expm1(2.0 * delta) * (1.0 + code) + mha::detail::int8_value_error);
  return rows_sum * heads + 1e-5 * max_y;
}

double int8_kernels_bound(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                          std::int64_t rows, double max_y, mha::precision kv) {
  const auto [q, k, v, rows_sum] = int8_terms(cfg, w, x, rows);
  // The 16-bit queries' share of a score, and the 16-bit weights' of an output.
  const double limit = mha::detail::query_code_limit(cfg.head_dim());
  const double code = mha::detail::int8_element_error;
  // int4's queries are made integers per key group, times the group's channel scales, whose
  // codes of at most 15 weigh at most a channel's range (2 max|k|): the same share of a score
  // with key4_query_limit.
  const double query_limit =
      kv == mha::precision::int4 ? mha::detail::key4_query_limit(cfg.head_dim()) : limit;
  const double delta = std::sqrt(static_cast<double>(cfg.head_dim())) * q * k / query_limit;
  const bool values4 = kv == mha::precision::k8v4 || kv == mha::precision::int4;
  const double weights =
      values4 ? std::sqrt(double{mha::detail::value4_group}) * mha::detail::value4_weight_error
              : mha::detail::int8_value_error - code;
  const double heads = v * (std::expm1(2.0 * delta) * (1.0 + code) + weights);
  return rows_sum * heads + 1e-5 * max_y;
}

}  // namespace mha_reference
