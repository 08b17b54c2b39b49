// A PyTorch state_dict <-> (config, weights), names as in docs/design.md §1.
#include <algorithm>
#include <array>
#include <charconv>
#include <optional>

#include "core/io_common.hpp"
#include "mha/io.hpp"

namespace mha::io {
namespace {

using detail::printable;
using detail::shape_text;
using mha::detail::text;

constexpr std::array<std::string_view, 3> projections = {"W_query", "W_key", "W_value"};
constexpr std::string_view heads_prefix = "heads.";

using tensor_map = std::map<std::string, tensor, std::less<>>;

// The tensors of a state_dict by owner: the module itself, and each heads.{h} of a wrapper with
// the "heads.{h}." prefix removed.
struct grouped_tensors {
  tensor_map module;
  std::map<std::int64_t, tensor_map> heads;
};

bool is_head_tensor(std::string_view rest) {
  if (rest == "mask") return true;
  return std::any_of(projections.begin(), projections.end(), [&](std::string_view p) {
    return rest == text(p, ".weight") || rest == text(p, ".bias");
  });
}

[[noreturn]] void unexpected_name(std::string_view source, std::string_view name) {
  detail::fail(source, "unexpected tensor ", printable(name),
               "; expected W_query.weight, W_key.weight, W_value.weight (each with an optional "
               ".bias), out_proj.weight, out_proj.bias, mask, or heads.{h}.W_query.weight, ... "
               "heads.{h}.mask");
}

grouped_tensors group_by_owner(tensor_file& file, std::string_view source) {
  grouped_tensors groups;
  for (auto& [name, t] : file.tensors) {
    const std::string_view n = name;
    if (!n.starts_with(heads_prefix)) {
      if (!is_head_tensor(n) && n != "out_proj.weight" && n != "out_proj.bias") {
        unexpected_name(source, n);
      }
      groups.module.emplace(name, std::move(t));
      continue;
    }
    // heads.{h}.rest with h a decimal index as PyTorch's ModuleList writes it: digits only (no
    // sign: from_chars would read "-0" as 0, shadowing heads.0), no leading 0.
    const std::string_view after = n.substr(heads_prefix.size());
    const std::size_t dot = after.find('.');
    std::int64_t h = -1;
    const std::string_view index = after.substr(0, dot);
    const bool digits_only =
        !index.empty() && std::all_of(index.begin(), index.end(),
                                      [](char c) { return c >= '0' && c <= '9'; });
    if (dot != std::string_view::npos &&
        (!digits_only || (index.size() > 1 && index[0] == '0'))) {
      detail::fail(source, "unexpected tensor ", printable(n), ": its head index ",
                   printable(index),
                   " is not canonical (expected heads.{h}.<name> with h = 0, 1, ... in digits "
                   "only: no sign, no leading zero)");
    }
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), h);
    if (dot == std::string_view::npos || ec != std::errc{} ||
        end != index.data() + index.size() || h < 0 ||
        !is_head_tensor(after.substr(dot + 1))) {
      unexpected_name(source, n);
    }
    groups.heads[h].emplace(after.substr(dot + 1), std::move(t));
  }
  return groups;
}

// Q, K and V of the module or of one head, checked against each other.
struct qkv_layers {
  linear_weights query, key, value;
  bool bias = false;
};

// The tensor `prefix + name`, which must exist: its entry in `tensors`.
tensor& find(tensor_map& tensors, std::string_view prefix, std::string_view name,
             std::string_view source) {
  const auto it = tensors.find(name);
  if (it == tensors.end()) detail::fail(source, "tensor '", prefix, name, "' is missing");
  return it->second;
}

// The values of tensor `prefix + name`, checked to have `shape`, removed from `tensors`.
std::vector<float> take(tensor_map& tensors, std::string_view prefix, std::string_view name,
                        std::span<const std::int64_t> shape, std::string_view source) {
  const tensor& t = find(tensors, prefix, name, source);
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    detail::fail(source, "tensor '", prefix, name, "' has shape ", shape_text(t.shape),
                 ", expected ", shape_text(shape));
  }
  return std::move(tensors.extract(tensors.find(name)).mapped().values);
}

// Every tensor of the group was used, but for its mask (checked by mask_size).
void check_all_used(const tensor_map& tensors, std::string_view prefix, std::string_view source) {
  for (const auto& [name, t] : tensors) {
    if (name != "mask") unexpected_name(source, text(prefix, name));
  }
}

qkv_layers read_qkv(tensor_map& tensors, std::string_view prefix, std::string_view source) {
  const std::vector<std::int64_t> shape = find(tensors, prefix, "W_query.weight", source).shape;
  if (shape.size() != 2 || shape[0] < 1 || shape[1] < 1) {
    detail::fail(source, "tensor '", prefix, "W_query.weight' has shape ", shape_text(shape),
                 ", expected (out, in) with both >= 1");
  }
  const std::size_t biases = static_cast<std::size_t>(
      std::count_if(projections.begin(), projections.end(),
                    [&](std::string_view p) { return tensors.contains(text(p, ".bias")); }));
  if (biases != 0 && biases != projections.size()) {
    detail::fail(source, "has ", biases, " of the 3 biases ", prefix, "W_query.bias, ", prefix,
                 "W_key.bias, ", prefix, "W_value.bias; expected all or none");
  }

  qkv_layers layers;
  layers.bias = biases != 0;
  linear_weights* into[] = {&layers.query, &layers.key, &layers.value};
  for (std::size_t i = 0; i < projections.size(); ++i) {
    linear_weights& l = *into[i];
    l.out = shape[0];
    l.in = shape[1];
    l.weight = take(tensors, prefix, text(projections[i], ".weight"), shape, source);
    if (layers.bias) {
      l.bias =
          take(tensors, prefix, text(projections[i], ".bias"), std::span(shape).first(1), source);
    }
  }
  return layers;
}

// out_proj.weight (d_out, d_out) with out_proj.bias (d_out), or neither (no out_proj).
std::optional<linear_weights> read_out_proj(tensor_map& tensors, std::int64_t d_out,
                                            std::string_view source) {
  const bool weight = tensors.contains("out_proj.weight"), bias = tensors.contains("out_proj.bias");
  if (!weight && !bias) return std::nullopt;
  if (weight != bias) {
    detail::fail(source, "tensor 'out_proj.", weight ? "weight" : "bias",
                 "' is present without 'out_proj.", weight ? "bias" : "weight",
                 "'; mha's out_proj is an nn.Linear with bias");
  }
  const std::array<std::int64_t, 2> shape = {d_out, d_out};
  linear_weights l{d_out, d_out, take(tensors, "", "out_proj.weight", shape, source), {}};
  l.bias = take(tensors, "", "out_proj.bias", std::span(shape).first(1), source);
  return l;
}

// The common size C of the (C, C) mask buffers, 0 when there are none.
std::int64_t mask_size(const grouped_tensors& groups, std::string_view source) {
  std::int64_t size = 0;
  std::string first;
  auto check = [&](const tensor_map& tensors, const std::string& prefix) {
    const auto it = tensors.find("mask");
    if (it == tensors.end()) return;
    const std::vector<std::int64_t>& s = it->second.shape;
    if (s.size() != 2 || s[0] != s[1] || s[0] < 1) {
      detail::fail(source, "tensor '", prefix, "mask' has shape ", shape_text(s),
                   ", expected (C, C) with C >= 1 (the context length)");
    }
    if (size != 0 && s[0] != size) {
      detail::fail(source, "tensor '", prefix, "mask' is (", s[0], ", ", s[0], ") but '", first,
                   "mask' is (", size, ", ", size, "); masks must agree");
    }
    size = s[0];
    if (first.empty()) first = prefix;
  };
  check(groups.module, "");
  for (const auto& [h, tensors] : groups.heads) check(tensors, text(heads_prefix, h, "."));
  return size;
}

// n_heads from whichever of the options, the metadata num_heads and the number of head groups
// give one; they must agree.
std::int64_t resolve_heads(const tensor_file& file, const grouped_tensors& groups,
                           const state_dict_options& options, std::string_view source) {
  struct candidate {
    std::int64_t value;
    std::string from;
  };
  std::vector<candidate> found;
  if (options.n_heads > 0) found.push_back({options.n_heads, "the n_heads option (--heads)"});
  if (const auto it = file.metadata.find("num_heads"); it != file.metadata.end()) {
    const std::string& s = it->second;
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc{} || end != s.data() + s.size() || value < 1) {
      detail::fail(source, "metadata num_heads is ", printable(s), ", expected a positive integer");
    }
    found.push_back({value, "the metadata num_heads"});
  }
  if (!groups.heads.empty()) {
    found.push_back({static_cast<std::int64_t>(groups.heads.size()),
                     text("the ", groups.heads.size(), " heads.{h} groups")});
  }
  if (found.empty()) {
    throw invalid_argument(text(source,
                                ": the number of heads is unknown (split-layout weights "
                                "without metadata num_heads); give n_heads (--heads)"));
  }
  for (const candidate& c : found) {
    if (c.value != found.front().value) {
      const std::string message =
          text(source, ": the head counts disagree: ", c.from, " gives ", c.value, ", ",
               found.front().from, " gives ", found.front().value);
      if (options.n_heads > 0) throw invalid_argument(message);
      throw format_error(message);
    }
  }
  return found.front().value;
}

loaded_module map_state_dict(tensor_file file, const state_dict_options& options,
                             std::string_view source) {
  if (options.n_heads < 0 || options.context_length < 0) {
    throw invalid_argument(text(source, ": state_dict_options n_heads (", options.n_heads,
                                ") and context_length (", options.context_length,
                                ") must be >= 0 (0 = from the file)"));
  }
  grouped_tensors groups = group_by_owner(file, source);
  const bool split = groups.module.contains("W_query.weight") ||
                     groups.module.contains("W_key.weight") ||
                     groups.module.contains("W_value.weight");
  if (split && !groups.heads.empty()) {
    detail::fail(source, "has both split names (W_query.weight, ...) and wrapper names (heads.",
                 groups.heads.begin()->first, ".*); expected one layout");
  }
  if (!split && groups.heads.empty()) {
    detail::fail(source,
                 "has no attention weights: expected W_query.weight or "
                 "heads.0.W_query.weight");
  }

  loaded_module m;
  m.layout = split ? formulation::split_weight : formulation::wrapper;
  config& cfg = m.cfg;
  cfg.n_heads = resolve_heads(file, groups, options, source);
  const std::int64_t masks = mask_size(groups, source);
  if (masks != 0 && options.context_length > masks) {
    throw invalid_argument(text(source, ": context_length ", options.context_length,
                                " exceeds the size of the file's mask buffer (", masks, ", ", masks,
                                ")"));
  }
  cfg.context_length = options.context_length > 0 ? options.context_length : masks;

  std::vector<head_weights> heads;
  if (split) {
    qkv_layers layers = read_qkv(groups.module, "", source);
    cfg.d_out = layers.query.out;
    cfg.d_in = layers.query.in;
    cfg.qkv_bias = layers.bias;
    m.w.query = std::move(layers.query);
    m.w.key = std::move(layers.key);
    m.w.value = std::move(layers.value);
  } else {
    // Indices 0..H-1 each once: the map is sorted, so the last index is H-1 exactly when there is
    // no gap.
    if (const std::int64_t last = groups.heads.rbegin()->first;
        last != static_cast<std::int64_t>(groups.heads.size()) - 1) {
      std::int64_t missing = 0;
      while (groups.heads.contains(missing)) ++missing;
      detail::fail(source, "has heads up to heads.", last, " but no heads.", missing);
    }
    for (auto& [h, tensors] : groups.heads) {
      const std::string prefix = text(heads_prefix, h, ".");
      qkv_layers layers = read_qkv(tensors, prefix, source);
      if (h == 0) {
        cfg.d_in = layers.query.in;
        cfg.qkv_bias = layers.bias;
      } else if (layers.query.in != cfg.d_in || layers.query.out != heads[0].query.out ||
                 layers.bias != cfg.qkv_bias) {
        detail::fail(source, "head ", h, " has W_query.weight (", layers.query.out, ", ",
                     layers.query.in, ")", layers.bias ? " with" : " without",
                     " biases but head 0 has (", heads[0].query.out, ", ", cfg.d_in, ")",
                     cfg.qkv_bias ? " with" : " without", " biases");
      }
      heads.push_back({std::move(layers.query), std::move(layers.key), std::move(layers.value)});
    }
    cfg.d_out = heads[0].query.out * cfg.n_heads;
  }
  if (cfg.d_out % cfg.n_heads != 0) {
    throw invalid_argument(text(source, ": n_heads ", cfg.n_heads, " does not divide d_out ",
                                cfg.d_out, " (the rows of W_query.weight)"));
  }

  std::optional<linear_weights> out_proj = read_out_proj(groups.module, cfg.d_out, source);
  cfg.out_proj = out_proj.has_value();
  check_all_used(groups.module, "", source);
  // Everything but context_length, which may legitimately be unknown (0) here.
  config checked = cfg;
  checked.context_length = std::max<std::int64_t>(1, cfg.context_length);
  if (split) {
    if (out_proj) m.w.out_proj = std::move(*out_proj);
    validate(checked, m.w);
  } else {
    m.w = weights::from_heads(checked, heads, out_proj ? std::move(*out_proj) : linear_weights{});
  }
  return m;
}

}  // namespace

loaded_module module_from_state_dict(tensor_file file, const state_dict_options& options) {
  return map_state_dict(std::move(file), options, "state_dict");
}

loaded_module load_module(const std::filesystem::path& path, const state_dict_options& options) {
  return map_state_dict(read_safetensors(path), options, path.string());
}

tensor_file to_state_dict(const config& cfg, const weights& w, formulation layout) {
  validate(cfg, w);
  std::int64_t mask_elements = 0;
  const std::array<std::int64_t, 2> mask_shape = {cfg.context_length, cfg.context_length};
  if (!detail::element_count(mask_shape, sizeof(float), mask_elements)) {
    throw invalid_argument(text("to_state_dict: context_length ", cfg.context_length,
                                " is too large for a (C, C) mask buffer"));
  }
  // PyTorch's causal mask: triu(ones(C, C), diagonal=1), 1 where token j is after token i.
  tensor mask{{cfg.context_length, cfg.context_length},
              std::vector<float>(static_cast<std::size_t>(mask_elements))};
  for (std::int64_t i = 0; i < cfg.context_length; ++i) {
    for (std::int64_t j = i + 1; j < cfg.context_length; ++j) {
      mask.values[static_cast<std::size_t>(i * cfg.context_length + j)] = 1.0f;
    }
  }

  tensor_file file;
  file.metadata["num_heads"] = std::to_string(cfg.n_heads);
  auto put = [&](const std::string& prefix, const linear_weights& l) {
    file.tensors[prefix + ".weight"] = {{l.out, l.in}, l.weight};
    if (l.has_bias()) file.tensors[prefix + ".bias"] = {{l.out}, l.bias};
  };
  if (layout == formulation::split_weight) {
    put("W_query", w.query);
    put("W_key", w.key);
    put("W_value", w.value);
    file.tensors["mask"] = std::move(mask);
  } else {
    for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
      const head_weights hw = w.head(cfg, h);
      const std::string prefix = text(heads_prefix, h, ".");
      put(prefix + "W_query", hw.query);
      put(prefix + "W_key", hw.key);
      put(prefix + "W_value", hw.value);
      file.tensors[prefix + "mask"] = mask;
    }
  }
  if (cfg.out_proj) put("out_proj", w.out_proj);
  return file;
}

}  // namespace mha::io
