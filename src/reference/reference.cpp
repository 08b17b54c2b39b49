#include "reference/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dropout.hpp"

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

// One head's attention for query row i, in double: out[e] = sum_j a_j v_j[e] with
// a = dropout(softmax_j(scale q . k_j), -inf for j > i when causal). k and v: seq_len rows of
// head_dim elements, row j at k + j * stride; `a` has room for seq_len weights.
template <class T>
void attend(const double* q, const T* k, const T* v, std::int64_t stride, std::int64_t seq_len,
            std::int64_t hd, std::int64_t i, bool causal, const mha::detail::dropout_spec& drop,
            std::int64_t b, std::int64_t h, double* a, double* out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  double max = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < seq_len; ++j) {
    double s = 0.0;
    for (std::int64_t e = 0; e < hd; ++e) s += q[e] * double{k[j * stride + e]};
    a[j] = (causal && j > i) ? -std::numeric_limits<double>::infinity() : s * scale;
    max = std::max(max, a[j]);
  }
  double sum = 0.0;
  for (std::int64_t j = 0; j < seq_len; ++j) sum += (a[j] = std::exp(a[j] - max));
  for (std::int64_t j = 0; j < seq_len; ++j) {
    a[j] /= sum;
    if (drop.active()) {
      a[j] = mha::detail::dropout_keep(drop, b, h, i, j) ? a[j] / (1.0 - drop.p) : 0.0;
    }
  }
  for (std::int64_t e = 0; e < hd; ++e) {
    double acc = 0.0;
    for (std::int64_t j = 0; j < seq_len; ++j) acc += a[j] * double{v[j * stride + e]};
    out[e] = acc;
  }
}

}  // namespace

std::vector<double> forward_rows(const mha::config& cfg, const mha::weights& w,
                                 std::span<const float> x, std::int64_t batch, std::int64_t seq_len,
                                 std::span<const row> rows, const mha::run_options& options) {
  const std::int64_t hd = cfg.head_dim(), d = cfg.d_out, d_kv = cfg.d_kv();
  const std::int64_t group = cfg.n_heads / cfg.kv_heads();  // query heads per K/V head
  const mha::detail::dropout_spec drop{options.training ? cfg.dropout : 0.0f, options.seed};
  std::vector<double> result(rows.size() * static_cast<std::size_t>(d));
  std::vector<double> a(static_cast<std::size_t>(seq_len)), context(static_cast<std::size_t>(d));

  for (std::int64_t b = 0; b < batch; ++b) {
    if (std::none_of(rows.begin(), rows.end(), [&](const row& r) { return r.batch == b; }))
      continue;
    const std::vector<double> xb(x.begin() + b * seq_len * cfg.d_in,
                                 x.begin() + (b + 1) * seq_len * cfg.d_in);
    const std::vector<double> k = project(w.key, xb, 0, seq_len),
                              v = project(w.value, xb, 0, seq_len);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (rows[r].batch != b) continue;
      const std::int64_t i = rows[r].token;
      const std::vector<double> q = project(w.query, xb, i, 1);
      for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
        const std::int64_t g = h / group;
        attend(q.data() + h * hd, k.data() + g * hd, v.data() + g * hd, d_kv, seq_len, hd, i,
               cfg.causal, drop, b, h, a.data(), context.data() + h * hd);
      }
      const std::vector<double> y = cfg.out_proj ? project(w.out_proj, context, 0, 1) : context;
      std::copy(y.begin(), y.end(), result.begin() + static_cast<std::ptrdiff_t>(r) * d);
    }
  }
  return result;
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
  attend(qi.data(), k.data() + head, v.data() + head, hd, shape.seq_len, hd, i, shape.causal,
         {shape.dropout, shape.seed}, b, h, a.data(), out.data());
  return out;
}

}  // namespace mha_reference
