#include "mha/problem.hpp"

#include <charconv>
#include <optional>

#include "core/text.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

// The flags of the canonical string: the name of each and whether a problem sets it.
struct flag {
  std::string_view name;
  bool (*is_set)(const config&);
  void (*set)(config&);
};
constexpr flag flags[] = {
    {"noncausal", [](const config& c) { return !c.causal; }, [](config& c) { c.causal = false; }},
    {"qkv_bias", [](const config& c) { return c.qkv_bias; }, [](config& c) { c.qkv_bias = true; }},
    {"no_out_proj", [](const config& c) { return !c.out_proj; },
     [](config& c) { c.out_proj = false; }},
    {"no_out_bias", [](const config& c) { return c.out_proj && !c.out_proj_bias; },
     [](config& c) { c.out_proj_bias = false; }},
};

// The base of "rope<base>" (a decimal number, "rope10000") when `part` is one, else nullopt.
std::optional<double> rope_part(std::string_view part) {
  constexpr std::string_view prefix = "rope";
  if (!part.starts_with(prefix) || part.size() == prefix.size()) return std::nullopt;
  double value = 0;
  const char* first = part.data() + prefix.size();
  const char* last = part.data() + part.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc{} || end != last) return std::nullopt;
  return value;
}

// The value of "<prefix><digits>" when `part` is one, else nullopt.
std::optional<std::int64_t> numbered(std::string_view part, std::string_view prefix) {
  if (!part.starts_with(prefix) || part.size() == prefix.size()) return std::nullopt;
  std::int64_t value = 0;
  const char* first = part.data() + prefix.size();
  const char* last = part.data() + part.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc{} || end != last) return std::nullopt;
  return value;
}

}  // namespace

std::string to_string(const problem& p) {
  std::string s = text(to_string(p.form), "/b", p.batch, "/t", p.seq_len);
  if (p.past != 0) s += text("/past", p.past);
  s += text("/din", p.cfg.d_in, "/dout", p.cfg.d_out, "/h", p.cfg.n_heads);
  if (p.cfg.kv_heads() != p.cfg.n_heads) s += text("/kvh", p.cfg.kv_heads());
  if (p.cfg.rope_base != 0.0) s += text("/rope", p.cfg.rope_base);
  for (const flag& f : flags) {
    if (f.is_set(p.cfg)) s += text("/", f.name);
  }
  if (p.cfg.precision != precision::fp32) s += text("/", to_string(p.cfg.precision));
  return s;
}

problem parse_problem(std::string_view name) {
  const std::string_view whole = name;
  auto next = [&] {
    const std::size_t slash = name.find('/');
    const std::string_view part = name.substr(0, slash);
    name = slash == std::string_view::npos ? std::string_view() : name.substr(slash + 1);
    return part;
  };
  problem p;
  p.form = parse_formulation(next());
  // The numbered parts; b, t, din, dout and h are required.
  struct number {
    std::string_view prefix;
    std::int64_t* into;
    bool required, seen = false;
  };
  number numbers[] = {{"b", &p.batch, true},
                      {"t", &p.seq_len, true},
                      {"past", &p.past, false},
                      {"din", &p.cfg.d_in, true},
                      {"dout", &p.cfg.d_out, true},
                      {"h", &p.cfg.n_heads, true},
                      {"kvh", &p.cfg.n_kv_heads, false}};
  while (!name.empty()) {
    const std::string_view part = next();
    bool known = false;
    for (number& n : numbers) {
      if (const auto value = numbered(part, n.prefix)) {
        if (n.seen) throw invalid_argument(text("mha: '", whole, "' gives ", n.prefix, " twice"));
        *n.into = *value;
        n.seen = known = true;
        break;
      }
    }
    for (const flag& f : flags) {
      if (!known && part == f.name) {
        f.set(p.cfg);
        known = true;
      }
    }
    if (const auto base = known ? std::nullopt : rope_part(part)) {
      p.cfg.rope_base = *base;
      known = true;
    }
    if (!known && (part == "fp32" || part == "bf16")) {
      p.cfg.precision = parse_precision(part);
      known = true;
    }
    if (!known) {
      throw invalid_argument(text("mha: '", whole, "': unknown part '", part,
                                  "'; expected b<B>, t<T>, past<P>, din<N>, dout<N>, h<H>, "
                                  "kvh<K>, rope<base>, noncausal, qkv_bias, no_out_proj, "
                                  "no_out_bias, fp32 or bf16"));
    }
  }
  for (const number& n : numbers) {
    if (n.required && !n.seen) {
      throw invalid_argument(text("mha: '", whole, "' has no ", n.prefix, "<number> part"));
    }
  }
  p.cfg.context_length = p.past + p.seq_len;
  return p;
}

double flops(const problem& p) noexcept {
  const double b = static_cast<double>(p.batch), t = static_cast<double>(p.seq_len);
  const double past = static_cast<double>(p.past);
  const double d_in = static_cast<double>(p.cfg.d_in), d_out = static_cast<double>(p.cfg.d_out);
  const double d_kv = static_cast<double>(p.cfg.d_kv());
  const double h = static_cast<double>(p.cfg.n_heads);
  const double hd = static_cast<double>(p.cfg.head_dim());
  const double pairs = p.cfg.causal ? t * past + t * (t + 1) / 2 : t * (past + t);
  double total = 2 * b * t * d_in * (d_out + 2 * d_kv) + 4 * b * h * hd * pairs;
  if (p.cfg.out_proj) total += 2 * b * t * d_out * d_out;
  return total;
}

}  // namespace mha
