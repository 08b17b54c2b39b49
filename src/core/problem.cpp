#include "mha/problem.hpp"

#include "core/text.hpp"

namespace mha {

std::string to_string(const problem& p) {
  std::string s = detail::text(to_string(p.form), "/b", p.batch, "/t", p.seq_len, "/din",
                               p.cfg.d_in, "/dout", p.cfg.d_out, "/h", p.cfg.n_heads);
  if (!p.cfg.causal) s += "/noncausal";
  if (p.cfg.qkv_bias) s += "/qkv_bias";
  if (!p.cfg.out_proj) s += "/no_out_proj";
  return s;
}

double flops(const problem& p) noexcept {
  const double b = static_cast<double>(p.batch), t = static_cast<double>(p.seq_len);
  const double d_in = static_cast<double>(p.cfg.d_in), d_out = static_cast<double>(p.cfg.d_out);
  const double h = static_cast<double>(p.cfg.n_heads);
  const double hd = static_cast<double>(p.cfg.head_dim());
  const double pairs = p.cfg.causal ? t * (t + 1) / 2 : t * t;
  double total = 2 * b * t * d_in * d_out * 3 + 4 * b * h * hd * pairs;
  if (p.cfg.out_proj) total += 2 * b * t * d_out * d_out;
  return total;
}

}  // namespace mha
