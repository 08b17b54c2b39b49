#include "mha/weights.hpp"

#include <cmath>
#include <string_view>
#include <utility>

#include "base/checks.hpp"
#include "base/philox.hpp"
#include "base/text.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

// nn.Linear's reset_parameters: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)). Element n of the
// tensor with id `tensor` uses Philox counter (n / 4, n >> 34, tensor, 'mhaw'), word n % 4, so
// the values do not depend on the order in which tensors or elements are drawn.
void fill_uniform(std::vector<float>& values, std::int64_t fan_in, std::uint64_t seed,
                  std::uint32_t tensor) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  const detail::philox_key key = detail::philox_key_from(seed);
  detail::philox_counter words{};
  for (std::size_t n = 0; n < values.size(); ++n) {
    if (n % 4 == 0) {
      const std::uint64_t block = n / 4;
      words = detail::philox4x32_10({static_cast<std::uint32_t>(block),
                                     static_cast<std::uint32_t>(block >> 32), tensor, 0x6d686177u},
                                    key);
    }
    // 24 random bits -> u in [0, 1) exactly representable; value in [-bound, bound).
    const float u = static_cast<float>(words[n % 4] >> 8) * 0x1.0p-24f;
    values[n] = (2.0f * u - 1.0f) * bound;
  }
}

linear_weights random_linear(std::int64_t out, std::int64_t in, bool bias, std::uint64_t seed,
                             std::uint32_t id) {
  linear_weights l{out, in, std::vector<float>(static_cast<std::size_t>(out * in)), {}};
  fill_uniform(l.weight, in, seed, 2 * id);
  if (bias) {
    l.bias.resize(static_cast<std::size_t>(out));
    fill_uniform(l.bias, in, seed, 2 * id + 1);
  }
  return l;
}

// Throws unless `l` is a (out, in) layer with (bias) or without (!bias) a bias vector.
void check_linear(std::string_view where, std::string_view name, const linear_weights& l,
                  std::int64_t out, std::int64_t in, bool bias) {
  if (l.out != out || l.in != in) {
    throw invalid_argument(text(where, ": ", name, ".weight is (", l.out, ", ", l.in,
                                "), expected (", out, ", ", in, ")"));
  }
  if (l.weight.size() != static_cast<std::size_t>(out * in)) {
    throw invalid_argument(text(where, ": ", name, ".weight holds ", l.weight.size(),
                                " elements, expected ", out, " x ", in, " = ", out * in));
  }
  if (bias && l.bias.size() != static_cast<std::size_t>(out)) {
    throw invalid_argument(
        text(where, ": ", name, ".bias holds ", l.bias.size(), " elements, expected ", out));
  }
  if (!bias && !l.bias.empty()) {
    throw invalid_argument(text(where, ": ", name, ".bias is present (", l.bias.size(),
                                " elements) but the config has no bias for it"));
  }
}

void append_rows(linear_weights& to, const linear_weights& from) {
  to.out += from.out;
  to.in = from.in;
  to.weight.insert(to.weight.end(), from.weight.begin(), from.weight.end());
  to.bias.insert(to.bias.end(), from.bias.begin(), from.bias.end());
}

}  // namespace

linear_weights linear_weights::rows(std::int64_t first, std::int64_t count) const {
  if (first < 0 || count < 0 || first > out - count) {
    throw invalid_argument(text("mha: rows [", first, ", ", first + count,
                                ") are not inside the layer's ", out, " rows"));
  }
  const auto begin = weight.begin() + first * in;
  linear_weights slice{count, in, std::vector<float>(begin, begin + count * in), {}};
  if (has_bias()) slice.bias.assign(bias.begin() + first, bias.begin() + first + count);
  return slice;
}

linear_weights weights::fused_qkv() const {
  if (key.in != query.in || value.in != query.in || key.has_bias() != query.has_bias() ||
      value.has_bias() != query.has_bias()) {
    throw invalid_argument(text("mha: fused_qkv stacks W_query (", query.out, ", ", query.in,
                                "), W_key (", key.out, ", ", key.in, ") and W_value (", value.out,
                                ", ", value.in, "); they must share d_in and bias presence"));
  }
  linear_weights fused{0, query.in, {}, {}};
  for (const linear_weights* part : {&query, &key, &value}) append_rows(fused, *part);
  return fused;
}

weights weights::random(const config& cfg, std::uint64_t seed) {
  validate(cfg);
  weights w;
  w.query = random_linear(cfg.d_out, cfg.d_in, cfg.qkv_bias, seed, 0);
  w.key = random_linear(cfg.d_kv(), cfg.d_in, cfg.qkv_bias, seed, 1);
  w.value = random_linear(cfg.d_kv(), cfg.d_in, cfg.qkv_bias, seed, 2);
  if (cfg.out_proj) {
    w.out_proj = random_linear(cfg.out_width(), cfg.d_out, cfg.out_proj_bias, seed, 3);
  }
  if (cfg.sinks) {
    w.sinks.resize(static_cast<std::size_t>(cfg.n_heads));
    fill_uniform(w.sinks, 1, seed, 10);  // U(-1, 1)
  }
  if (cfg.qk_norm) {
    for (auto [norm, id] : {std::pair{&w.q_norm, 8u}, std::pair{&w.k_norm, 9u}}) {
      norm->resize(static_cast<std::size_t>(cfg.head_dim()));
      fill_uniform(*norm, 4, seed, id);  // U(-0.5, 0.5)
      for (float& v : *norm) v += 1.0f;
    }
  }
  return w;
}

head_weights weights::head(const config& cfg, std::int64_t h) const {
  validate(cfg, *this);
  if (h < 0 || h >= cfg.n_heads) {
    throw invalid_argument(text("mha: head index ", h, " is out of range [0, ", cfg.n_heads, ")"));
  }
  const std::int64_t hd = cfg.head_dim(), kv = h / (cfg.n_heads / cfg.kv_heads());
  return {query.rows(h * hd, hd), key.rows(kv * hd, hd), value.rows(kv * hd, hd)};
}

weights weights::from_heads(const config& cfg, std::span<const head_weights> heads,
                            linear_weights out_proj) {
  validate(cfg);
  if (cfg.qk_norm) {
    throw invalid_argument(
        "mha: from_heads takes no q/k norm weights; a config with qk_norm needs weights with "
        "q_norm and k_norm");
  }
  if (cfg.kv_heads() != cfg.n_heads) {
    throw invalid_argument(text("mha: from_heads stacks one K/V projection per head; n_kv_heads (",
                                cfg.n_kv_heads, ") must equal n_heads (", cfg.n_heads,
                                ") or be 0"));
  }
  if (static_cast<std::int64_t>(heads.size()) != cfg.n_heads) {
    throw invalid_argument(
        text("mha: ", heads.size(), " heads given, expected n_heads = ", cfg.n_heads));
  }
  weights w;
  for (std::size_t h = 0; h < heads.size(); ++h) {
    const std::string where = text("mha: head ", h);
    auto stack = [&](const char* name, const linear_weights& layer, linear_weights& into) {
      check_linear(where, name, layer, cfg.head_dim(), cfg.d_in, cfg.qkv_bias);
      append_rows(into, layer);
    };
    stack("W_query", heads[h].query, w.query);
    stack("W_key", heads[h].key, w.key);
    stack("W_value", heads[h].value, w.value);
  }
  w.out_proj = std::move(out_proj);
  validate(cfg, w);
  return w;
}

void validate(const config& cfg, const weights& w) {
  detail::check_config(cfg, "mha");
  check_linear("mha", "W_query", w.query, cfg.d_out, cfg.d_in, cfg.qkv_bias);
  check_linear("mha", "W_key", w.key, cfg.d_kv(), cfg.d_in, cfg.qkv_bias);
  check_linear("mha", "W_value", w.value, cfg.d_kv(), cfg.d_in, cfg.qkv_bias);
  if (cfg.out_proj) {
    check_linear("mha", "out_proj", w.out_proj, cfg.out_width(), cfg.d_out, cfg.out_proj_bias);
  } else if (w.out_proj.out != 0 || !w.out_proj.weight.empty() || !w.out_proj.bias.empty()) {
    throw invalid_argument(text("mha: out_proj weights are present (", w.out_proj.out, " x ",
                                w.out_proj.in, ") but the config has out_proj = false"));
  }
  const std::size_t sinks = cfg.sinks ? static_cast<std::size_t>(cfg.n_heads) : 0;
  if (w.sinks.size() != sinks) {
    throw invalid_argument(
        cfg.sinks ? text("mha: sinks holds ", w.sinks.size(), " logits, expected n_heads = ", sinks)
                  : text("mha: sinks are present (", w.sinks.size(),
                         " logits) but the config has sinks = false"));
  }
  for (float s : w.sinks) {
    if (!std::isfinite(s)) throw invalid_argument(text("mha: a sink is ", s, ", expected finite"));
  }
  for (auto [name, norm] : {std::pair{"q_norm", &w.q_norm}, std::pair{"k_norm", &w.k_norm}}) {
    const std::size_t expected = cfg.qk_norm ? static_cast<std::size_t>(cfg.head_dim()) : 0;
    if (norm->size() != expected) {
      throw invalid_argument(cfg.qk_norm ? text("mha: ", name, ".weight holds ", norm->size(),
                                                " elements, expected head_dim = ", expected)
                                         : text("mha: ", name, ".weight is present (", norm->size(),
                                                " elements) but the config has qk_norm = false"));
    }
  }
}

}  // namespace mha
