#include "mha/problem.hpp"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <optional>

#include "base/text.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

// The value of a part: the text to write after its prefix, or nullopt when the problem has the
// part's default and the part is left out.
using written = std::optional<std::string>;

// The value of `digits` when it is a non-empty run of decimal digits, else nullopt.
std::optional<std::int64_t> count(std::string_view digits) {
  if (digits.empty() || digits.front() < '0' || digits.front() > '9') return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// The value of a decimal number as std::from_chars reads one ("10000", "1e4", "2.5"), else nullopt.
std::optional<double> decimal(std::string_view number) {
  double value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc{} || end != number.data() + number.size()) {
    return std::nullopt;
  }
  return value;
}

// Writing a part: `value` when the part is `present`, nullopt when it is left out.
template <class T>
written value_if(bool present, const T& value) {
  if (!present) return std::nullopt;
  return text(value);
}
// A flag: nothing after its name when `set`.
written flag_if(bool set) { return value_if(set, ""); }

// Reading a part: the count `value` into `into`; false when `value` is not a count.
bool read_count(std::string_view value, std::int64_t& into) {
  const auto n = count(value);
  if (n) into = *n;
  return n.has_value();
}
// A flag (nothing after its name): sets `field` to `to`.
bool read_flag(std::string_view value, bool& field, bool to) {
  if (!value.empty()) return false;
  field = to;
  return true;
}

// One part of the canonical string after the formulation: its prefix followed by its value (a
// flag has none; the precision is its value alone). `write` gives the value, or nullopt when the
// problem has the part's default and the part is left out (a required part is always written);
// `read` sets the part from the text after the prefix and says whether that text is a value of
// the part, leaving the problem as it was when not.
struct part {
  std::string_view prefix;
  std::string_view syntax;  // in messages: "b<B>", "noncausal", "fp32 or bf16"
  bool required;
  written (*write)(const problem&);
  bool (*read)(std::string_view value, problem&);
};

// The grammar of the canonical problem string after the formulation, written once: its parts in
// the order to_string writes them, their spelling and their defaults (include/mha/problem.hpp
// states it in words). tools/mhapy/problem.py's PARTS mirrors this table, and
// tools/tests/test_problem.py holds the two to the same strings on every preset's problems: a
// new axis of the problem is a row here and one there.
constexpr part parts[] = {
    {"b", "b<B>", true, [](const problem& p) -> written { return text(p.batch); },
     [](std::string_view v, problem& p) { return read_count(v, p.batch); }},
    {"t", "t<T>", true, [](const problem& p) -> written { return text(p.seq_len); },
     [](std::string_view v, problem& p) { return read_count(v, p.seq_len); }},
    {"past", "past<P>", false, [](const problem& p) { return value_if(p.past != 0, p.past); },
     [](std::string_view v, problem& p) { return read_count(v, p.past); }},
    {"din", "din<N>", true, [](const problem& p) -> written { return text(p.cfg.d_in); },
     [](std::string_view v, problem& p) { return read_count(v, p.cfg.d_in); }},
    {"dout", "dout<N>", true, [](const problem& p) -> written { return text(p.cfg.d_out); },
     [](std::string_view v, problem& p) { return read_count(v, p.cfg.d_out); }},
    {"h", "h<H>", true, [](const problem& p) -> written { return text(p.cfg.n_heads); },
     [](std::string_view v, problem& p) { return read_count(v, p.cfg.n_heads); }},
    {"kvh", "kvh<K>", false,
     [](const problem& p) { return value_if(p.cfg.kv_heads() != p.cfg.n_heads, p.cfg.kv_heads()); },
     [](std::string_view v, problem& p) { return read_count(v, p.cfg.n_kv_heads); }},
    // The base in its shortest round-trip digits, as std::to_chars writes it: "10000", "5e+05".
    {"rope", "rope<base>", false,
     [](const problem& p) { return value_if(p.cfg.rope_base != 0.0, p.cfg.rope_base); },
     [](std::string_view v, problem& p) {
       const auto base = decimal(v);
       if (base) p.cfg.rope_base = *base;
       return base.has_value();
     }},
    // Its type and parameters (mha::rope_scaling_name): "linear4", "llama3_8_1_4_8192".
    {"rope_", "rope_linear<factor> or rope_llama3_<factor>_<low>_<high>_<context>", false,
     [](const problem& p) {
       return value_if(p.cfg.rope_scaling.kind != rope_scaling::type::none,
                       rope_scaling_name(p.cfg.rope_scaling));
     },
     [](std::string_view v, problem& p) {
       const auto scaling = parse_rope_scaling(v);
       if (scaling) p.cfg.rope_scaling = *scaling;
       return scaling.has_value();
     }},
    {"w", "w<W>", false, [](const problem& p) { return value_if(p.cfg.window != 0, p.cfg.window); },
     [](std::string_view v, problem& p) { return read_count(v, p.cfg.window); }},
    // The cap in its shortest round-trip digits: "cap50".
    {"cap", "cap<C>", false,
     [](const problem& p) { return value_if(p.cfg.softcap != 0.0, p.cfg.softcap); },
     [](std::string_view v, problem& p) {
       const auto cap = decimal(v);
       if (cap) p.cfg.softcap = *cap;
       return cap.has_value();
     }},
    {"sinks", "sinks", false, [](const problem& p) { return flag_if(p.cfg.sinks); },
     [](std::string_view v, problem& p) { return read_flag(v, p.cfg.sinks, true); }},
    {"noncausal", "noncausal", false, [](const problem& p) { return flag_if(!p.cfg.causal); },
     [](std::string_view v, problem& p) { return read_flag(v, p.cfg.causal, false); }},
    {"qkv_bias", "qkv_bias", false, [](const problem& p) { return flag_if(p.cfg.qkv_bias); },
     [](std::string_view v, problem& p) { return read_flag(v, p.cfg.qkv_bias, true); }},
    {"no_out_proj", "no_out_proj", false, [](const problem& p) { return flag_if(!p.cfg.out_proj); },
     [](std::string_view v, problem& p) { return read_flag(v, p.cfg.out_proj, false); }},
    // Without an out_proj there is no bias to lack.
    {"no_out_bias", "no_out_bias", false,
     [](const problem& p) { return flag_if(p.cfg.out_proj && !p.cfg.out_proj_bias); },
     [](std::string_view v, problem& p) { return read_flag(v, p.cfg.out_proj_bias, false); }},
    {"out", "out<N>", false,
     [](const problem& p) { return value_if(p.cfg.out_features != 0, p.cfg.out_features); },
     [](std::string_view v, problem& p) { return read_count(v, p.cfg.out_features); }},
    // The q/k norms' epsilon in its shortest round-trip digits: "qknorm1e-06".
    {"qknorm", "qknorm<eps>", false,
     [](const problem& p) { return value_if(p.cfg.qk_norm, p.cfg.qk_norm_eps); },
     [](std::string_view v, problem& p) {
       const auto eps = decimal(v);
       if (eps) p.cfg.qk_norm = true, p.cfg.qk_norm_eps = *eps;
       return eps.has_value();
     }},
    {"", "fp32 or bf16", false,
     [](const problem& p) {
       return value_if(p.cfg.precision != precision::fp32, to_string(p.cfg.precision));
     },
     [](std::string_view v, problem& p) {
       for (const precision named : {precision::fp32, precision::bf16}) {
         if (v == to_string(named)) {
           p.cfg.precision = named;
           return true;
         }
       }
       return false;
     }},
    {"kv_", "kv_<fp32, bf16, int8, k8v4 or int4>", false,
     [](const problem& p) {
       return value_if(p.cache_precision() != p.cfg.precision, to_string(p.cache_precision()));
     },
     [](std::string_view v, problem& p) {
       for (const precision named : cache_precisions) {
         if (v == to_string(named)) {
           p.kv_precision = named;
           return true;
         }
       }
       return false;
     }},
};

}  // namespace

std::string to_string(const problem& p) {
  std::string s(to_string(p.form));
  for (const part& each : parts) {
    if (const written value = each.write(p)) s += text("/", each.prefix, *value);
  }
  return s;
}

problem parse_problem(std::string_view name) {
  const std::string_view whole = name;
  auto next = [&] {
    const std::size_t slash = name.find('/');
    const std::string_view text_part = name.substr(0, slash);
    name = slash == std::string_view::npos ? std::string_view() : name.substr(slash + 1);
    return text_part;
  };
  problem p;
  p.form = parse_formulation(next());
  bool seen[std::size(parts)] = {};
  while (!name.empty()) {
    const std::string_view given = next();
    std::size_t i = 0;
    while (i < std::size(parts) && !(given.starts_with(parts[i].prefix) &&
                                     parts[i].read(given.substr(parts[i].prefix.size()), p))) {
      ++i;
    }
    if (i == std::size(parts)) {
      std::string expected;
      for (const part& each : parts) expected += text(expected.empty() ? "" : ", ", each.syntax);
      throw invalid_argument(
          text("mha: '", whole, "': unknown part '", given, "'; expected ", expected));
    }
    if (seen[i]) {
      const std::string_view which = parts[i].prefix.empty() ? parts[i].syntax : parts[i].prefix;
      throw invalid_argument(text("mha: '", whole, "' gives ", which, " twice"));
    }
    seen[i] = true;
  }
  for (std::size_t i = 0; i < std::size(parts); ++i) {
    if (parts[i].required && !seen[i]) {
      throw invalid_argument(text("mha: '", whole, "' has no ", parts[i].prefix, "<number> part"));
    }
  }
  p.cfg.context_length = p.past + p.seq_len;
  if (p.kv_precision == p.cfg.precision) p.kv_precision.reset();  // one problem, one value
  return p;
}

double flops(const problem& p) noexcept {
  const double b = static_cast<double>(p.batch), t = static_cast<double>(p.seq_len);
  const double past = static_cast<double>(p.past);
  const double d_in = static_cast<double>(p.cfg.d_in), d_out = static_cast<double>(p.cfg.d_out);
  const double d_kv = static_cast<double>(p.cfg.d_kv());
  const double h = static_cast<double>(p.cfg.n_heads);
  const double hd = static_cast<double>(p.cfg.head_dim());
  double pairs = p.cfg.causal ? t * past + t * (t + 1) / 2 : t * (past + t);
  if (p.cfg.causal && p.cfg.window > 0) {
    // The query at position a (past <= a < past + T) attends to min(a + 1, w) keys: a + 1 up to
    // position w - 1, w from there on.
    const double w = static_cast<double>(p.cfg.window), end = past + t;
    const double growing_end = std::min(end, std::max(past, w));  // positions past..w-1
    pairs = (growing_end * (growing_end + 1) - past * (past + 1)) / 2 + w * (end - growing_end);
  }
  double total = 2 * b * t * d_in * (d_out + 2 * d_kv) + 4 * b * h * hd * pairs;
  if (p.cfg.out_proj) total += 2 * b * t * d_out * static_cast<double>(p.cfg.out_width());
  return total;
}

}  // namespace mha
