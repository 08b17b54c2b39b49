// A PyTorch state_dict <-> (config, weights) (mha/io.hpp): the block at the prefix, its layout
// (io/layouts.cpp reads and writes each), and what the names cannot say: H, the K/V heads, the
// rotary embedding and the context length, from options, metadata and shapes that must agree.
#include "io/state_dict.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>

#include "io/common.hpp"
#include "io/layouts.hpp"
#include "mha/io.hpp"

namespace mha::io {
namespace {

using detail::printable;
using detail::tensor_map;
using mha::detail::text;

// One statement of a value: what it is and who makes it.
template <class T>
struct statement {
  T value;
  std::string from;
  bool option = false;  // made by state_dict_options (a flag of `mha run`)
};

// A count, or a rotary embedding base in fixed notation (500000, not 5e+05: as configs write it).
std::string shown(std::int64_t count) { return std::to_string(count); }
std::string shown(double base) {
  std::array<char, 400> digits;  // the longest double in fixed notation is 309 + 17 digits
  const auto [end, ec] =
      std::to_chars(digits.data(), digits.data() + digits.size(), base, std::chars_format::fixed);
  return std::string(digits.data(), ec == std::errc{} ? end : digits.data());
}

// The value every statement makes; nullopt without any. When they disagree: an
// mha::invalid_argument if an option is among them (the caller's mistake), else an
// mha::format_error (the file's).
template <class T>
std::optional<T> agreed(const std::vector<statement<T>>& found, std::string_view what,
                        std::string_view source) {
  for (const statement<T>& s : found) {
    if (s.value == found.front().value) continue;
    const std::string message =
        text(source, ": the ", what, " disagree: ", s.from, " gives ", shown(s.value), ", ",
             found.front().from, " gives ", shown(found.front().value));
    if (std::any_of(found.begin(), found.end(), [](const auto& f) { return f.option; })) {
      throw invalid_argument(message);
    }
    throw format_error(message);
  }
  if (found.empty()) return std::nullopt;
  return found.front().value;
}

// The metadata `key` as a positive integer, added to `found` when present.
void metadata_count(const tensor_file& file, std::string_view key,
                    std::vector<statement<std::int64_t>>& found, std::string_view source) {
  const auto it = file.metadata.find(key);
  if (it == file.metadata.end()) return;
  const std::string& s = it->second;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || value < 1) {
    detail::fail(source, "metadata ", key, " is ", printable(s), ", expected a positive integer");
  }
  found.push_back({value, text("the metadata ", key)});
}

// The metadata `key` as a rotary embedding base (a finite number >= 0; 0: none), added to
// `found` when present.
void metadata_base(const tensor_file& file, std::string_view key,
                   std::vector<statement<double>>& found, std::string_view source) {
  const auto it = file.metadata.find(key);
  if (it == file.metadata.end()) return;
  const std::string& s = it->second;
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(value) || value < 0) {
    detail::fail(source, "metadata ", key, " is ", printable(s),
                 ", expected a number >= 0 (a rotary embedding base; 0 for none)");
  }
  found.push_back({value, text("the metadata ", key)});
}

// "'a.', 'b.' and 'c.'", the first 10 and how many more.
std::string listed(const std::vector<std::string>& prefixes) {
  constexpr std::size_t most = 10;
  std::string out;
  for (std::size_t i = 0; i < prefixes.size() && i < most; ++i) {
    out += (i == 0 ? "" : i + 1 == prefixes.size() ? " and " : ", ") + printable(prefixes[i]);
  }
  if (prefixes.size() > most) out += text(" and ", prefixes.size() - most, " more");
  return out;
}

// The layouts known, with their tensors: for the message when nothing matches.
std::string known_layouts() {
  std::string out;
  for (const layout l : layouts()) {
    const detail::layout_rules& r = detail::rules(l);
    out += text("; ", to_string(l), " (", r.module, "): ", r.tensors);
  }
  return out;
}

std::string normalized(std::string prefix) {
  if (!prefix.empty() && !prefix.ends_with('.')) prefix += '.';
  return prefix;
}

// Throws unless `prefix` holds an attention block of the file whose tensors are `names`.
void check_prefix(std::string_view prefix, std::span<const std::string> names,
                  std::string_view source) {
  const std::vector<std::string> blocks = attention_prefixes(names);
  if (std::binary_search(blocks.begin(), blocks.end(), prefix)) return;
  if (blocks.empty()) {
    detail::fail(source, "has no attention weights in a layout mha knows", known_layouts());
  }
  const std::string where = blocks.size() == 1
                                ? "an attention block at the prefix "
                                : text("attention blocks at the ", blocks.size(), " prefixes ");
  if (prefix.empty()) {
    throw invalid_argument(text(source, ": holds ", where, listed(blocks),
                                ", none at the top level; pick one with the prefix option "
                                "(--prefix)"));
  }
  throw invalid_argument(text(source, ": no attention block at the prefix ", printable(prefix),
                              "; the file holds ", where, listed(blocks)));
}

// The layout of a block: the one whose identifying tensors it has.
layout detect(const tensor_map& block, std::string_view prefix, std::string_view source) {
  std::optional<layout> found;
  std::string found_by;
  for (const layout l : layouts()) {
    for (const auto& [name, t] : block) {
      if (!detail::rules(l).identifies(name)) continue;
      if (found && *found != l) {
        detail::fail(source, "has tensors of two layouts at the prefix ", printable(prefix), ": ",
                     to_string(*found), " (", printable(found_by), ") and ", to_string(l), " (",
                     printable(name), "); expected one");
      }
      if (!found) found_by = name;
      found = l;
    }
  }
  return *found;  // check_prefix saw one
}

// H from the option, the metadata num_heads and the layout's head groups.
std::int64_t resolve_heads(const tensor_file& file, const detail::block_weights& b,
                           const state_dict_options& options, const detail::option_source& by,
                           std::string_view source) {
  std::vector<statement<std::int64_t>> found;
  if (options.n_heads > 0) found.push_back({options.n_heads, std::string(by.heads), by.caller});
  metadata_count(file, "num_heads", found, source);
  if (b.heads > 0) found.push_back({b.heads, text("the ", b.heads, " heads.{h} groups")});
  const std::optional<std::int64_t> heads = agreed(found, "head counts", source);
  if (!heads) {
    throw invalid_argument(text(source,
                                ": the number of heads is unknown (no metadata num_heads); "
                                "give n_heads (--heads)"));
  }
  return *heads;
}

// The K/V heads: the K projection's rows over head_dim, which the option and the metadata
// num_kv_heads or num_kv_groups must match.
std::int64_t resolve_kv_heads(const tensor_file& file, const config& cfg, const weights& w,
                              layout l, const state_dict_options& options,
                              const detail::option_source& by, std::string_view source) {
  const std::string_view key = detail::rules(l).key_tensor;
  const std::int64_t head_dim = cfg.head_dim();
  if (w.key.out % head_dim != 0 || cfg.n_heads % (w.key.out / head_dim) != 0) {
    throw invalid_argument(text(source, ": ", key, " has ", w.key.out,
                                " rows, which is not head_dim ", head_dim, " (d_out ", cfg.d_out,
                                " / n_heads ", cfg.n_heads,
                                ") times a number of K/V heads dividing n_heads"));
  }
  std::vector<statement<std::int64_t>> found;
  found.push_back({w.key.out / head_dim, text("the shape of ", key)});
  if (options.n_kv_heads > 0) {
    found.push_back({options.n_kv_heads, std::string(by.kv_heads), by.caller});
  }
  metadata_count(file, "num_kv_heads", found, source);
  metadata_count(file, "num_kv_groups", found, source);
  return *agreed(found, "K/V head counts", source);
}

// The rotary embedding base from the option and the metadata rope_base or rope_theta; 0 (none)
// without them, which the llama layout does not allow: Llama rotates.
double resolve_rope(const tensor_file& file, layout l, const state_dict_options& options,
                    const detail::option_source& by, std::string_view source) {
  std::vector<statement<double>> found;
  if (options.rope_base)
    found.push_back({*options.rope_base, std::string(by.rope_base), by.caller});
  metadata_base(file, "rope_base", found, source);
  metadata_base(file, "rope_theta", found, source);
  const std::optional<double> base = agreed(found, "rotary embedding bases", source);
  if (!base && l == layout::llama) {
    throw invalid_argument(text(source,
                                ": Llama's attention rotates queries and keys but the file has no "
                                "metadata rope_theta or rope_base; give rope_base (--rope-base B: "
                                "10000 in Llama 2, 500000 in Llama 3; 0 for none)"));
  }
  return base.value_or(0.0);
}

// The context length: the option, else the file's (its mask buffers' size C or the metadata
// context_length, which must agree), else 0 (unknown). The option may not exceed the file's.
std::int64_t resolve_context(const tensor_file& file, std::int64_t mask_size,
                             const state_dict_options& options, std::string_view source) {
  std::vector<statement<std::int64_t>> found;
  if (mask_size > 0) {
    found.push_back({mask_size, text("the mask buffer (", mask_size, ", ", mask_size, ")")});
  }
  metadata_count(file, "context_length", found, source);
  const std::optional<std::int64_t> in_file = agreed(found, "context lengths", source);
  if (in_file && options.context_length > *in_file) {
    throw invalid_argument(text(source, ": context_length ", options.context_length,
                                " exceeds the file's, ", *in_file, " (", found.front().from, ")"));
  }
  return options.context_length > 0 ? options.context_length : in_file.value_or(0);
}

void check_options(const state_dict_options& options, std::string_view source) {
  if (options.n_heads < 0 || options.n_kv_heads < 0 || options.context_length < 0) {
    throw invalid_argument(text(source, ": state_dict_options n_heads (", options.n_heads,
                                "), n_kv_heads (", options.n_kv_heads, ") and context_length (",
                                options.context_length, ") must be >= 0 (0 = from the file)"));
  }
  if (options.rope_base && !(*options.rope_base >= 0 && std::isfinite(*options.rope_base))) {
    throw invalid_argument(text(source, ": the rope_base option (", *options.rope_base,
                                ") must be a finite number >= 0 (0 for no rotary embedding)"));
  }
}

}  // namespace

loaded_module detail::map_state_dict(tensor_file file, std::span<const std::string> names,
                                     const state_dict_options& options, std::string_view source,
                                     const option_source& by) {
  check_options(options, source);
  loaded_module m;
  m.prefix = normalized(options.prefix);
  check_prefix(m.prefix, names, source);
  tensor_map block;
  for (auto& [name, t] : file.tensors) {
    if (name.starts_with(m.prefix)) block.emplace(name.substr(m.prefix.size()), std::move(t));
  }
  m.layout = detect(block, m.prefix, source);
  detail::block_weights b = detail::rules(m.layout).read(block, m.prefix, source);
  m.w = std::move(b.w);

  config& cfg = m.cfg;
  cfg.causal = detail::rules(m.layout).causal;
  cfg.d_in = m.w.query.in;
  cfg.d_out = m.w.query.out;
  cfg.qkv_bias = m.w.query.has_bias();
  cfg.out_proj = m.w.out_proj.out != 0;
  cfg.out_proj_bias = !cfg.out_proj || m.w.out_proj.has_bias();
  cfg.out_features = cfg.out_proj && m.w.out_proj.out != cfg.d_out ? m.w.out_proj.out : 0;
  cfg.sinks = !m.w.sinks.empty();
  cfg.qk_norm =
      !m.w.q_norm.empty();  // its epsilon: config::qk_norm_eps's default, or config.json's
  cfg.n_heads = resolve_heads(file, b, options, by, source);
  if (cfg.d_out % cfg.n_heads != 0) {
    throw invalid_argument(text(source, ": n_heads ", cfg.n_heads, " does not divide d_out ",
                                cfg.d_out, " (the rows of the Q projection)"));
  }
  const std::int64_t kv = resolve_kv_heads(file, cfg, m.w, m.layout, options, by, source);
  cfg.n_kv_heads = kv == cfg.n_heads ? 0 : kv;
  cfg.rope_base = resolve_rope(file, m.layout, options, by, source);
  cfg.context_length = resolve_context(file, b.mask_size, options, source);
  // Everything but context_length, which may legitimately be unknown (0) here.
  config checked = cfg;
  checked.context_length = std::max<std::int64_t>(1, cfg.context_length);
  validate(checked, m.w);
  return m;
}

std::optional<std::string_view> detail::attention_block_of(std::string_view name) {
  // Every identifying name is a weight or a bias (an index of a million names is read here).
  if (!name.ends_with("weight") && !name.ends_with("bias")) return std::nullopt;
  // The longest ending, after a '.', that identifies a layout: the rest is its block's prefix.
  for (std::size_t at = 0;;) {
    const std::string_view ending = name.substr(at);
    if (std::any_of(layouts().begin(), layouts().end(),
                    [&](layout l) { return detail::rules(l).identifies(ending); })) {
      return name.substr(0, at);
    }
    at = name.find('.', at);
    if (at == std::string_view::npos) return std::nullopt;
    ++at;
  }
}

std::vector<std::string> attention_prefixes(std::span<const std::string> names) {
  std::set<std::string, std::less<>> found;
  for (const std::string& name : names) {
    if (const auto block = detail::attention_block_of(name)) found.emplace(*block);
  }
  return {found.begin(), found.end()};
}

loaded_module module_from_state_dict(tensor_file file, const state_dict_options& options) {
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors) names.push_back(name);
  return detail::map_state_dict(std::move(file), names, options, "state_dict");
}

loaded_module load_module(const std::filesystem::path& path, const state_dict_options& options) {
  // Only the block's tensors are read; every name is kept for finding blocks.
  const std::string prefix = normalized(options.prefix);
  std::vector<std::string> names;
  tensor_file file = read_safetensors(path, [&](std::string_view name) {
    names.emplace_back(name);
    return name.starts_with(prefix);
  });
  return detail::map_state_dict(std::move(file), names, options, path.string());
}

tensor_file to_state_dict(const config& cfg, const weights& w, layout l) {
  validate(cfg, w);
  tensor_file file;
  detail::rules(l).write(cfg, w, file.tensors);
  file.metadata["num_heads"] = std::to_string(cfg.n_heads);
  if (cfg.kv_heads() != cfg.n_heads) file.metadata["num_kv_heads"] = std::to_string(cfg.kv_heads());
  if (cfg.rope_base != 0.0 || l == layout::llama) file.metadata["rope_base"] = shown(cfg.rope_base);
  // Where no mask buffer carries the context length.
  if (l == layout::torch_mha || l == layout::llama || l == layout::bert) {
    file.metadata["context_length"] = std::to_string(cfg.context_length);
  }
  return file;
}

tensor_file to_state_dict(const config& cfg, const weights& w, formulation form) {
  switch (form) {
    case formulation::wrapper:
      return to_state_dict(cfg, w, layout::wrapper);
    case formulation::split_weight:
      return to_state_dict(cfg, w, layout::split);
    case formulation::fused_qkv:
      return to_state_dict(cfg, w, layout::torch_mha);
  }
  throw invalid_argument(text("to_state_dict: unknown formulation value ", static_cast<int>(form)));
}

}  // namespace mha::io
