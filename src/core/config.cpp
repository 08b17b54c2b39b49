#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "base/checks.hpp"
#include "base/text.hpp"
#include "mha/error.hpp"
#include "mha/run_options.hpp"

namespace mha {
namespace detail {

void broken_contract(const char* condition, const char* file, int line) noexcept {
  std::fprintf(stderr, "%s:%d: contract broken: %s\n", file, line, condition);
  std::abort();
}

void check_byte_count(std::string_view where, std::string_view what,
                      std::initializer_list<std::int64_t> dims, std::int64_t element_bytes) {
  std::int64_t bytes = element_bytes;
  for (std::int64_t d : dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      std::string shape;
      for (std::int64_t e : dims) shape += (shape.empty() ? "" : " x ") + std::to_string(e);
      throw invalid_argument(text(where, ": ", what, " of shape (", shape, ") has a byte count ",
                                  "that overflows a 64-bit integer"));
    }
  }
}

std::uint64_t max_score_bytes() {
  const char* value = std::getenv("MHA_MAX_SCORE_BYTES");
  if (value == nullptr || *value == '\0') return default_max_score_bytes;
  const std::string_view s = value;
  std::uint64_t limit = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), limit);
  if (ec != std::errc{} || end != s.data() + s.size()) {
    throw invalid_argument(
        text("mha: MHA_MAX_SCORE_BYTES is '", s, "', expected a decimal byte count"));
  }
  return limit;
}

void check_score_memory(std::string_view where, std::int64_t rows, std::int64_t keys,
                        std::int64_t slices) {
  const std::uint64_t limit = max_score_bytes();
  std::uint64_t bytes = sizeof(float);
  const bool overflow = __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(rows), &bytes) ||
                        __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(keys), &bytes) ||
                        __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(slices), &bytes);
  if (overflow || bytes > limit) {
    const std::string shape = rows == keys ? text("seq_len T = ", rows)
                                           : text("T = ", rows, " queries over ", keys, " keys");
    throw invalid_argument(text(where, ": ", shape, " needs ",
                                overflow ? std::string("more than 2^64") : std::to_string(bytes),
                                " bytes for its T x ", rows == keys ? "T" : "keys",
                                " attention scores, above the limit of ", limit,
                                " bytes (raise it with the environment variable "
                                "MHA_MAX_SCORE_BYTES; the xsimd and tbb backends need no "
                                "T x T scores)"));
  }
}

namespace {

// Written so that NaN fails too.
bool finite_at_least(double value, double least) {
  return value >= least && value < std::numeric_limits<double>::infinity();
}

void check_rope_scaling(const config& cfg, std::string_view where) {
  const rope_scaling& s = cfg.rope_scaling;
  const std::string what = text(where, ": rope_scaling ", to_string(s.kind));
  switch (s.kind) {
    case rope_scaling::type::none:
      if (!(s == rope_scaling{})) {
        throw invalid_argument(text(what, " has parameters (factor ", s.factor,
                                    ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ",
                                    s.high_freq_factor, ", original_context ", s.original_context,
                                    "); leave them at their defaults or name a type"));
      }
      return;
    case rope_scaling::type::linear:
    case rope_scaling::type::llama3:
    case rope_scaling::type::yarn:
      break;
    default:
      throw invalid_argument(text(where, ": unknown rope_scaling type value ",
                                  static_cast<int>(s.kind),
                                  "; expected none, linear, llama3 or yarn"));
  }
  if (cfg.rope_base == 0.0) {
    throw invalid_argument(text(what, " scales a rotary embedding, but rope_base is 0 (none)"));
  }
  if (!finite_at_least(s.factor, 1.0)) {
    throw invalid_argument(text(what, ": factor (", s.factor, ") must be finite and >= 1"));
  }
  if (s.kind == rope_scaling::type::llama3) {
    if (!(s.low_freq_factor > 0.0 && s.low_freq_factor < s.high_freq_factor &&
          finite_at_least(s.high_freq_factor, 0.0))) {
      throw invalid_argument(text(what, ": low_freq_factor (", s.low_freq_factor,
                                  ") and high_freq_factor (", s.high_freq_factor,
                                  ") must be finite with 0 < low_freq_factor < high_freq_factor"));
    }
    if (s.original_context < 1) {
      throw invalid_argument(
          text(what, ": original_context (", s.original_context, ") must be >= 1"));
    }
  }
  if (s.kind == rope_scaling::type::yarn) {
    if (s.original_context < 1) {
      throw invalid_argument(
          text(what, ": original_context (", s.original_context, ") must be >= 1"));
    }
    if (!(s.beta_slow > 0.0 && s.beta_slow < s.beta_fast && finite_at_least(s.beta_fast, 0.0))) {
      throw invalid_argument(text(what, ": beta_fast (", s.beta_fast, ") and beta_slow (",
                                  s.beta_slow, ") must be finite with 0 < beta_slow < beta_fast"));
    }
    if (!finite_at_least(s.attention_factor, 0.0)) {
      throw invalid_argument(text(what, ": attention_factor (", s.attention_factor,
                                  ") must be finite and >= 0 (0: 0.1 ln(factor) + 1)"));
    }
  }
}

}  // namespace

void check_config(const config& cfg, std::string_view where) {
  auto positive = [&](std::int64_t value, const char* name) {
    if (value < 1) throw invalid_argument(text(where, ": ", name, " (", value, ") must be >= 1"));
  };
  positive(cfg.d_in, "d_in");
  positive(cfg.d_out, "d_out");
  positive(cfg.n_heads, "n_heads");
  positive(cfg.context_length, "context_length");
  if (cfg.d_out % cfg.n_heads != 0) {
    throw invalid_argument(
        text(where, ": d_out (", cfg.d_out, ") must be divisible by n_heads (", cfg.n_heads, ")"));
  }
  if (cfg.n_kv_heads < 0 || (cfg.n_kv_heads > 0 && cfg.n_heads % cfg.n_kv_heads != 0)) {
    throw invalid_argument(text(where, ": n_kv_heads (", cfg.n_kv_heads, ") must divide n_heads (",
                                cfg.n_heads, "), or be 0 for n_kv_heads = n_heads"));
  }
  if (coded(cfg.precision)) {
    throw invalid_argument(text(where, ": precision ", to_string(cfg.precision),
                                " is a KV cache's format, not a plan's; a plan computes in fp32 or "
                                "bf16 (make_cache takes ",
                                to_string(cfg.precision), ")"));
  }
  if (cfg.precision != precision::fp32 && cfg.precision != precision::bf16) {
    throw invalid_argument(text(where, ": unknown precision value ",
                                static_cast<int>(cfg.precision), "; expected fp32 or bf16"));
  }
  if (cfg.rope_base != 0.0) {
    // Written so that NaN fails too.
    if (!(cfg.rope_base > 1.0 && cfg.rope_base < std::numeric_limits<double>::infinity())) {
      throw invalid_argument(text(where, ": rope_base (", cfg.rope_base,
                                  ") must be 0 (no rotary embedding) or a finite base > 1"));
    }
    if (cfg.head_dim() % 2 != 0) {
      throw invalid_argument(text(where, ": rotary embedding (rope_base ", cfg.rope_base,
                                  ") rotates pairs of features; head_dim (", cfg.head_dim(),
                                  ") must be even"));
    }
  }
  check_rope_scaling(cfg, where);
  if (cfg.window < 0) {
    throw invalid_argument(
        text(where, ": window (", cfg.window, ") must be >= 0 (0: no sliding window)"));
  }
  if (cfg.window > 0 && !cfg.causal) {
    throw invalid_argument(text(where, ": a sliding window (window ", cfg.window,
                                ") is causal: a non-causal module takes none"));
  }
  // Written so that NaN fails too.
  if (!(cfg.softcap >= 0.0 && cfg.softcap < std::numeric_limits<double>::infinity())) {
    throw invalid_argument(
        text(where, ": softcap (", cfg.softcap, ") must be finite and >= 0 (0: no soft-capping)"));
  }
  if (cfg.out_features < 0) {
    throw invalid_argument(text(where, ": out_features (", cfg.out_features,
                                ") must be >= 0 (0: out_proj keeps d_out features)"));
  }
  if (cfg.out_features > 0 && !cfg.out_proj) {
    throw invalid_argument(
        text(where, ": out_features (", cfg.out_features,
             ") are the out projection's; a module without out_proj takes none"));
  }
  // Written so that NaN fails too.
  if (cfg.qk_norm &&
      !(cfg.qk_norm_eps > 0.0 && cfg.qk_norm_eps < std::numeric_limits<double>::infinity())) {
    throw invalid_argument(
        text(where, ": qk_norm_eps (", cfg.qk_norm_eps, ") must be finite and > 0"));
  }
  // Written so that NaN fails too.
  if (!(cfg.dropout >= 0.0f && cfg.dropout < 1.0f)) {
    throw invalid_argument(text(where, ": dropout (", cfg.dropout, ") must be in [0, 1)"));
  }
  check_byte_count(where, "W_query.weight", {cfg.d_out, cfg.d_in}, sizeof(float));
  check_byte_count(where, "out_proj.weight", {cfg.out_width(), cfg.d_out}, sizeof(float));
}

}  // namespace detail

void validate(const config& cfg) { detail::check_config(cfg, "mha"); }

std::string to_string(const config& cfg) {
  return detail::text(
      "d_in=", cfg.d_in, " d_out=", cfg.d_out, " n_heads=", cfg.n_heads,
      " context_length=", cfg.context_length, " causal=", cfg.causal, " qkv_bias=", cfg.qkv_bias,
      " out_proj=", cfg.out_proj, " dropout=", cfg.dropout,
      cfg.out_proj_bias ? std::string() : std::string(" out_proj_bias=0"),
      cfg.n_kv_heads > 0 ? detail::text(" n_kv_heads=", cfg.n_kv_heads) : std::string(),
      cfg.rope_base != 0.0 ? detail::text(" rope_base=", cfg.rope_base) : std::string(),
      cfg.rope_scaling.kind != rope_scaling::type::none
          ? detail::text(" rope_scaling=", rope_scaling_name(cfg.rope_scaling))
          : std::string(),
      cfg.window > 0 ? detail::text(" window=", cfg.window) : std::string(),
      cfg.softcap > 0.0 ? detail::text(" softcap=", cfg.softcap) : std::string(),
      cfg.sinks ? std::string(" sinks=1") : std::string(),
      cfg.out_features > 0 ? detail::text(" out_features=", cfg.out_features) : std::string(),
      cfg.qk_norm ? detail::text(" qk_norm_eps=", cfg.qk_norm_eps) : std::string(),
      cfg.precision != precision::fp32 ? detail::text(" precision=", to_string(cfg.precision))
                                       : std::string());
}

std::string_view to_string(rope_scaling::type t) noexcept {
  switch (t) {
    case rope_scaling::type::none:
      return "none";
    case rope_scaling::type::linear:
      return "linear";
    case rope_scaling::type::llama3:
      return "llama3";
    case rope_scaling::type::yarn:
      return "yarn";
  }
  return "unknown";
}

std::string rope_scaling_name(const rope_scaling& s) {
  switch (s.kind) {
    case rope_scaling::type::none:
      return "";
    case rope_scaling::type::linear:
      return detail::text("linear", s.factor);
    case rope_scaling::type::llama3:
      return detail::text("llama3_", s.factor, "_", s.low_freq_factor, "_", s.high_freq_factor, "_",
                          s.original_context);
    case rope_scaling::type::yarn:
      return detail::text("yarn_", s.factor, "_", s.beta_fast, "_", s.beta_slow, "_",
                          s.original_context, "_", s.attention_factor, "_", s.truncate ? 1 : 0);
  }
  return "unknown";
}

std::optional<rope_scaling> parse_rope_scaling(std::string_view name) {
  // A number as std::from_chars reads it, the whole of `field`.
  auto number = [](std::string_view field, auto& into) {
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), into);
    return !field.empty() && ec == std::errc{} && end == field.data() + field.size();
  };
  rope_scaling s;
  if (name.starts_with("linear")) {
    s.kind = rope_scaling::type::linear;
    return number(name.substr(6), s.factor) ? std::optional(s) : std::nullopt;
  }
  // The '_'-separated fields after `prefix`: exactly `count` non-empty ones, else none.
  auto fields = [&](std::string_view prefix, std::size_t count) {
    std::vector<std::string_view> out;
    std::string_view rest = name.substr(prefix.size());
    while (out.size() < count) {
      const std::size_t sep = rest.find('_');
      out.push_back(rest.substr(0, sep));
      rest = sep == std::string_view::npos ? std::string_view() : rest.substr(sep + 1);
      if (out.back().empty()) return std::vector<std::string_view>{};
    }
    if (!rest.empty()) out.clear();
    return out;
  };
  if (name.starts_with("llama3_")) {
    s.kind = rope_scaling::type::llama3;
    const auto f = fields("llama3_", 4);
    const bool read = f.size() == 4 && number(f[0], s.factor) && number(f[1], s.low_freq_factor) &&
                      number(f[2], s.high_freq_factor) && number(f[3], s.original_context);
    return read ? std::optional(s) : std::nullopt;
  }
  if (!name.starts_with("yarn_")) return std::nullopt;
  s.kind = rope_scaling::type::yarn;
  const auto f = fields("yarn_", 6);
  int truncate = -1;
  const bool read = f.size() == 6 && number(f[0], s.factor) && number(f[1], s.beta_fast) &&
                    number(f[2], s.beta_slow) && number(f[3], s.original_context) &&
                    number(f[4], s.attention_factor) && number(f[5], truncate) &&
                    (truncate == 0 || truncate == 1);
  s.truncate = truncate == 1;
  return read ? std::optional(s) : std::nullopt;
}

std::vector<double> rope_frequencies(const config& cfg) {
  std::vector<double> f;
  if (cfg.rope_base == 0.0) return f;
  const std::int64_t hd = cfg.head_dim();
  const rope_scaling& s = cfg.rope_scaling;
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (std::int64_t e = 0; e < hd / 2; ++e) {
    const double unscaled = std::pow(cfg.rope_base, -2.0 * static_cast<double>(e) / hd);
    double scaled = unscaled;
    if (s.kind == rope_scaling::type::linear) {
      scaled = unscaled / s.factor;
    } else if (s.kind == rope_scaling::type::llama3) {
      // Hugging Face's llama3 rope type: long wavelengths (low frequencies) slowed by `factor`,
      // short ones kept, and between them a blend linear in original_context / wavelength.
      const double wavelength = two_pi / unscaled;
      const double context = static_cast<double>(s.original_context);
      if (wavelength > context / s.low_freq_factor) {
        scaled = unscaled / s.factor;
      } else if (!(wavelength < context / s.high_freq_factor)) {
        const double smooth =
            (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        scaled = (1.0 - smooth) * unscaled / s.factor + smooth * unscaled;
      }
    }
    f.push_back(scaled);
  }
  if (s.kind == rope_scaling::type::yarn) {
    // Hugging Face's yarn rope type: pair e kept below the ramp's low end, divided by `factor`
    // above its high end, blended linearly between; the ends are the pairs that turn beta_fast
    // and beta_slow times over original_context.
    const double dim = static_cast<double>(hd), context = static_cast<double>(s.original_context);
    const auto pair_of = [&](double turns) {
      return dim * std::log(context / (turns * two_pi)) / (2.0 * std::log(cfg.rope_base));
    };
    double low = pair_of(s.beta_fast), high = pair_of(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // as transformers avoids dividing by zero
    for (std::size_t e = 0; e < f.size(); ++e) {
      const double ramp = std::clamp((static_cast<double>(e) - low) / (high - low), 0.0, 1.0);
      f[e] = f[e] / s.factor * ramp + f[e] * (1.0 - ramp);
    }
  }
  return f;
}

double rope_amplitude(const config& cfg) {
  const rope_scaling& s = cfg.rope_scaling;
  if (cfg.rope_base == 0.0 || s.kind != rope_scaling::type::yarn) return 1.0;
  if (s.attention_factor > 0.0) return s.attention_factor;
  return s.factor <= 1.0 ? 1.0 : 0.1 * std::log(s.factor) + 1.0;
}

std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::fp32:
      return "fp32";
    case precision::bf16:
      return "bf16";
    case precision::int8:
      return "int8";
    case precision::k8v4:
      return "k8v4";
    case precision::int4:
      return "int4";
  }
  return "unknown";
}

precision parse_precision(std::string_view name) {
  for (precision p : cache_precisions) {
    if (name == to_string(p)) return p;
  }
  throw invalid_argument(
      detail::text("mha: unknown precision '", name, "'; expected ", cache_precision_names));
}

std::span<const formulation> formulations() noexcept {
  static constexpr formulation all[] = {formulation::wrapper, formulation::split_weight,
                                        formulation::fused_qkv};
  return all;
}

std::string_view to_string(formulation f) noexcept {
  switch (f) {
    case formulation::wrapper:
      return "wrapper";
    case formulation::split_weight:
      return "split_weight";
    case formulation::fused_qkv:
      return "fused_qkv";
  }
  return "unknown";
}

formulation parse_formulation(std::string_view name) {
  for (formulation f : formulations()) {
    if (name == to_string(f)) return f;
  }
  throw invalid_argument(detail::text("mha: unknown formulation '", name,
                                      "'; expected wrapper, split_weight or fused_qkv"));
}

}  // namespace mha
