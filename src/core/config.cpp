#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/checks.hpp"
#include "core/text.hpp"
#include "mha/error.hpp"
#include "mha/run_options.hpp"

namespace mha {
namespace detail {

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
  if (cfg.precision == precision::int8) {
    throw invalid_argument(text(where,
                                ": precision int8 is a KV cache's format, not a plan's; a plan "
                                "computes in fp32 or bf16 (make_cache takes int8)"));
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
  // Written so that NaN fails too.
  if (!(cfg.dropout >= 0.0f && cfg.dropout < 1.0f)) {
    throw invalid_argument(text(where, ": dropout (", cfg.dropout, ") must be in [0, 1)"));
  }
  check_byte_count(where, "W_query.weight", {cfg.d_out, cfg.d_in}, sizeof(float));
  check_byte_count(where, "out_proj.weight", {cfg.d_out, cfg.d_out}, sizeof(float));
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
      cfg.precision != precision::fp32 ? detail::text(" precision=", to_string(cfg.precision))
                                       : std::string());
}

std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::fp32:
      return "fp32";
    case precision::bf16:
      return "bf16";
    case precision::int8:
      return "int8";
  }
  return "unknown";
}

precision parse_precision(std::string_view name) {
  for (precision p : {precision::fp32, precision::bf16, precision::int8}) {
    if (name == to_string(p)) return p;
  }
  throw invalid_argument(
      detail::text("mha: unknown precision '", name, "'; expected fp32, bf16 or int8"));
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
