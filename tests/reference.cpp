#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dropout.hpp"

namespace mha_test {
namespace {

// (rows, l.out) = (rows, l.in) W^T + b, double accumulation.
std::vector<double> project(const mha::linear_weights& l, const std::vector<double>& x,
                            std::int64_t rows) {
  std::vector<double> y(static_cast<std::size_t>(rows * l.out));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < l.out; ++o) {
      double acc = l.has_bias() ? l.bias[o] : 0.0;
      for (std::int64_t i = 0; i < l.in; ++i)
        acc += x[r * l.in + i] * double{l.weight[o * l.in + i]};
      y[r * l.out + o] = acc;
    }
  }
  return y;
}

}  // namespace

std::vector<double> reference_forward(const mha::config& cfg, const mha::weights& w,
                                      const std::vector<float>& x, std::int64_t batch,
                                      std::int64_t seq_len, const mha::run_options& options) {
  const std::int64_t rows = batch * seq_len, hd = cfg.head_dim(), d = cfg.d_out;
  const std::vector<double> xd(x.begin(), x.end());
  const std::vector<double> q = project(w.query, xd, rows), k = project(w.key, xd, rows),
                            v = project(w.value, xd, rows);
  const mha::detail::dropout_spec drop{options.training ? cfg.dropout : 0.0f, options.seed};
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

  std::vector<double> context(static_cast<std::size_t>(rows * d), 0.0);
  std::vector<double> a(static_cast<std::size_t>(seq_len));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
      // Element (b, t, h, e) of a projection lives at (b * seq_len + t) * d + h * hd + e.
      auto at = [&](const std::vector<double>& m, std::int64_t t, std::int64_t e) {
        return m[(b * seq_len + t) * d + h * hd + e];
      };
      for (std::int64_t i = 0; i < seq_len; ++i) {
        double max = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < seq_len; ++j) {
          double s = 0.0;
          for (std::int64_t e = 0; e < hd; ++e) s += at(q, i, e) * at(k, j, e);
          a[j] = (cfg.causal && j > i) ? -std::numeric_limits<double>::infinity() : s * scale;
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
          for (std::int64_t j = 0; j < seq_len; ++j) acc += a[j] * at(v, j, e);
          context[(b * seq_len + i) * d + h * hd + e] = acc;
        }
      }
    }
  }
  return cfg.out_proj ? project(w.out_proj, context, rows) : context;
}

}  // namespace mha_test
