// A Hugging Face model folder (mha/io.hpp): config.json says what each attention block is, the
// model type says how its tensors are named, and model.safetensors (or the shards of
// model.safetensors.index.json) hold them. Everything read comes from untrusted files: sizes are
// capped before parsing, JSON types are checked key by key, and every file a name leads to must
// lie inside the folder.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>
#include <type_traits>

#include "io/common.hpp"
#include "io/index.hpp"
#include "io/json.hpp"
#include "io/layouts.hpp"
#include "io/model_config.hpp"
#include "io/state_dict.hpp"
#include "mha/io.hpp"

namespace mha::io {
namespace {

namespace fs = std::filesystem;
using detail::model_type_rules;
using detail::printable;
using detail::rules_of;
using mha::detail::text;
using nlohmann::json;

// A file of at most `cap` bytes, whole: refuses a larger one before reading it.
std::string read_capped(const fs::path& path, std::uint64_t cap, std::string_view what) {
  detail::input_file in(path);
  if (in.size() > cap) {
    detail::fail(path.string(), in.size(), " bytes, more than the ", cap, " bytes a ", what,
                 " may have");
  }
  std::string bytes(static_cast<std::size_t>(in.size()), '\0');
  in.read(0, std::as_writable_bytes(std::span(bytes)));
  return bytes;
}

// A JSON file read as an object.
json read_json_object(const fs::path& path, std::uint64_t cap, std::string_view what) {
  const std::string bytes = read_capped(path, cap, what);
  const json value = detail::parse_json(bytes, path.string(), "its JSON");
  if (!value.is_object()) {
    detail::fail(path.string(), "is a JSON ", value.type_name(), ", expected an object");
  }
  return value;
}

// Why `path` could not be resolved (canonical's error `ec`): a link that dangles or loops is
// said to be one (a cache snapshot whose blob was deleted), else the system's reason.
std::string why_not(const fs::path& path, std::error_code ec) {
  std::error_code link_ec;
  if (ec == std::errc::too_many_symbolic_link_levels) return "it is a link in a loop of links";
  if (fs::is_symlink(fs::symlink_status(path, link_ec))) {
    const fs::path target = fs::read_symlink(path, link_ec);
    return text("it is a link to ", printable(target.string()), ", which ",
                ec == std::errc::no_such_file_or_directory ? "does not exist (a dangling link)"
                                                           : ec.message());
  }
  return ec.message();
}

// The real path `name` (a file name from the folder's index, or one of its own files) leads to,
// which must lie under one of `allowed` (real directories).
fs::path contained(const fs::path& dir, std::string_view name, std::span<const fs::path> allowed,
                   std::string_view source) {
  const fs::path relative(name);
  if (name.empty() || relative.is_absolute()) {
    detail::fail(source, "names the file ", printable(name),
                 ", which is not a relative path inside the folder");
  }
  std::error_code ec;
  const fs::path real = fs::canonical(dir / relative, ec);
  if (ec) {
    detail::fail(source, "names the file ", printable(name), ", which cannot be opened in ",
                 printable(dir.string()), ": ", why_not(dir / relative, ec));
  }
  for (const fs::path& root : allowed) {
    const fs::path inside = real.lexically_relative(root);
    if (!inside.empty() && *inside.begin() != "..") return real;
  }
  detail::fail(source, "names the file ", printable(name), ", whose real path ",
               printable(real.string()), " lies outside the model folder ",
               printable(allowed.front().string()));
}

// The real directories a model folder's files may lie in: the folder, and for a snapshot of a
// Hugging Face cache (<repo>/snapshots/<revision>/, whose files are links into <repo>/blobs/) that
// repo's blobs.
std::vector<fs::path> allowed_roots(const fs::path& real_dir) {
  std::vector<fs::path> roots = {real_dir};
  if (real_dir.parent_path().filename() == "snapshots") {
    roots.push_back(real_dir.parent_path().parent_path() / "blobs");
  }
  return roots;
}

// The tensor names of a safetensors file, from its header alone.
std::vector<std::string> tensor_names(const fs::path& file) {
  std::vector<std::string> names;
  read_safetensors(file, [&](std::string_view name) {
    names.emplace_back(name);
    return false;
  });
  return names;
}

// The files holding tensors of the block at `prefix`, as indices into files, in order.
std::vector<std::size_t> files_under(const model_folder& m, const std::string& prefix) {
  if (!m.index) return {0};
  std::set<std::size_t> found;
  const auto [first, last] = m.index->under(prefix);
  for (std::size_t i = first; i < last; ++i) found.insert(m.index->file(i));
  return {found.begin(), found.end()};
}

// The blocks of layers [0, m.layers), which must all be among the blocks `blocks` (sorted)
// holds, at m.root; else an mha::format_error naming the first missing one.
void check_layers(const model_folder& m, std::span<const std::string_view> blocks) {
  // Distinct layers have distinct prefixes: more layers than blocks means one is missing, and
  // the search stops at the first (the loop runs at most blocks.size() + 1 times).
  for (std::int64_t layer = 0; layer < m.layers; ++layer) {
    const std::string prefix = m.block_prefix(layer);
    if (!std::binary_search(blocks.begin(), blocks.end(), std::string_view(prefix))) {
      detail::fail((m.dir / "config.json").string(), "says the model has ", m.layers,
                   " layers, but its tensors hold no attention block of layer ", layer, " at ",
                   printable(prefix), " (they hold ", blocks.size(), " block",
                   blocks.size() == 1 ? "" : "s", ")");
    }
  }
}

std::int64_t window_of(const model_folder& m, std::int64_t layer) {
  return m.windows[static_cast<std::size_t>(layer)];
}

}  // namespace

std::string model_folder::block_prefix(std::int64_t layer) const {
  const model_type_rules& r = rules_of(model_type, (dir / "config.json").string());
  return text(root, r.before, layer, r.after);
}

std::vector<fs::path> model_folder::block_files(std::int64_t layer) const {
  std::vector<fs::path> out;
  for (const std::size_t i : files_under(*this, block_prefix(layer))) out.push_back(files[i]);
  return out;
}

std::vector<std::string> model_folder::block_file_names(std::int64_t layer) const {
  std::vector<std::string> out;
  for (const std::size_t i : files_under(*this, block_prefix(layer))) {
    out.push_back(file_names[i]);
  }
  return out;
}

model_folder read_model_folder(const fs::path& dir) {
  model_folder m;
  m.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw invalid_argument(
        text(printable(dir.string()),
             " is not a folder; expected a model folder with config.json and "
             "model.safetensors (or model.safetensors.index.json and its shards)"));
  }
  const fs::path real_dir = fs::canonical(dir, ec);
  if (ec) throw error(text(printable(dir.string()), ": ", ec.message()));
  const std::vector<fs::path> allowed = allowed_roots(real_dir);
  const std::string config_source = (dir / "config.json").string();

  const fs::path config_path = contained(dir, "config.json", allowed, dir.string());
  const detail::model_json config = detail::read_model_json(
      read_json_object(config_path, max_model_config_bytes, "model's config.json"), config_source);
  m.model_type = config.config.model_type;
  m.layout = config.config.layout;
  m.layers = config.config.layers;
  m.cfg = config.config.cfg;
  m.dtype = config.config.dtype;
  const model_type_rules& rules = rules_of(m.model_type, config_source);

  // model.safetensors when the folder has one (as transformers prefers it; a link counts even
  // when it dangles, which contained() says), else the index.
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  const auto present = [&](const fs::path& p) {
    return fs::symlink_status(p, ec).type() != fs::file_type::not_found;
  };
  std::vector<std::string> single_names;  // a single file's tensor names
  std::vector<std::string_view> blocks;   // every attention block's prefix
  if (present(single)) {
    m.files = {contained(dir, "model.safetensors", allowed, dir.string())};
    m.file_names = {"model.safetensors"};
    single_names = tensor_names(m.files.front());
    for (const std::string& name : single_names) {
      if (const auto block = detail::attention_block_of(name)) blocks.push_back(*block);
    }
  } else if (present(index)) {
    const fs::path index_path = contained(dir, index.filename().string(), allowed, dir.string());
    const std::string source = index.string();
    std::map<fs::path, std::uint32_t> numbers;  // real path -> file number
    const auto file = [&](std::string_view shard, std::string_view tensor) {
      fs::path real = contained(dir, shard, allowed, source);
      if (real == index_path || real == config_path) {
        detail::fail(source, "weight_map entry ", printable(tensor), " names ", printable(shard),
                     ", the folder's own ", real == index_path ? "index" : "config.json",
                     ", as a shard");
      }
      const auto [it, added] = numbers.emplace(real, static_cast<std::uint32_t>(m.files.size()));
      if (added) {
        m.files.push_back(std::move(real));
        m.file_names.emplace_back(shard);
      }
      return it->second;
    };
    auto parsed = std::make_shared<detail::tensor_index>(detail::parse_tensor_index(
        read_capped(index_path, max_model_index_bytes, "safetensors index"), source, file));
    for (std::size_t i = 0; i < parsed->size(); ++i) {
      if (const auto block = detail::attention_block_of(parsed->name(i))) blocks.push_back(*block);
    }
    m.index = std::move(parsed);
  } else {
    const bool pickle = fs::exists(dir / "pytorch_model.bin", ec);
    throw invalid_argument(text(
        printable(dir.string()), " has neither model.safetensors nor model.safetensors.index.json",
        pickle ? "; its pytorch_model.bin is a pickle, which mha does not read: save the model "
                 "with save_pretrained(dir, safe_serialization=True)"
               : ""));
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());

  // The root: the head class's prefix under which layer 0's block lies.
  const auto root = std::find_if(rules.roots.begin(), rules.roots.end(), [&](auto r) {
    return std::binary_search(blocks.begin(), blocks.end(),
                              std::string_view(text(r, rules.before, 0, rules.after)));
  });
  if (root == rules.roots.end()) {
    detail::fail(
        dir.string(), "a ", m.model_type, " model's layer 0 attention block is at ",
        printable(text(rules.before, 0, rules.after)), " or ",
        printable(text(rules.roots[1], rules.before, 0, rules.after)), ", but its tensors hold ",
        blocks.empty() ? std::string("no attention block")
                       : text(blocks.size(), " blocks, the first at ", printable(blocks.front())));
  }
  m.root = *root;
  check_layers(m, blocks);
  m.window_key = config.windows.key;
  m.qk_norm_offset = config.config.qk_norm_offset;
  for (std::int64_t layer = 0; layer < m.layers; ++layer) {
    const mha::config layer_cfg = config.layer_config(layer);
    m.windows.push_back(layer_cfg.window);
    m.ropes.emplace_back(layer_cfg.rope_base, layer_cfg.rope_scaling);
  }
  return m;
}

loaded_module load_model(const fs::path& dir, std::int64_t layer,
                         const state_dict_options& options) {
  const model_folder m = read_model_folder(dir);
  const std::string config_source = (dir / "config.json").string();
  if (layer < 0 || layer >= m.layers) {
    throw invalid_argument(text(config_source, ": layer ", layer, " is not one of the model's ",
                                m.layers, " layers (0 to ", m.layers - 1, ")"));
  }
  if (options.n_heads < 0 || options.n_kv_heads < 0 || options.context_length < 0) {
    throw invalid_argument(text(dir.string(), ": n_heads (", options.n_heads, "), n_kv_heads (",
                                options.n_kv_heads, ") and context_length (",
                                options.context_length, ") must be >= 0 (0 = from config.json)"));
  }
  if (!options.prefix.empty()) {
    throw invalid_argument(text(dir.string(),
                                ": a model folder's layer gives the block's prefix; "
                                "the prefix option (--prefix) applies to --weights"));
  }
  // The caller's values must be the layer's config's.
  config cfg = m.cfg;
  std::tie(cfg.rope_base, cfg.rope_scaling) = m.ropes[static_cast<std::size_t>(layer)];
  // Numbers as configs write them: 500000, not 5e+05.
  auto shown = [](auto v) {
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      if (v == std::floor(v) && std::abs(v) < 1e15) return text(static_cast<std::int64_t>(v));
    }
    return text(v);
  };
  auto check = [&](auto given, auto stated, std::string_view option, std::string_view key) {
    if (given != stated) {
      throw invalid_argument(text(dir.string(), ": the ", option, " gives ", shown(given),
                                  " but config.json's ", key, " is ", shown(stated)));
    }
  };
  if (options.n_heads > 0) check(options.n_heads, cfg.n_heads, "n_heads option (--heads)", "heads");
  if (options.n_kv_heads > 0) {
    check(options.n_kv_heads, cfg.kv_heads(), "n_kv_heads option (--kv-heads)", "K/V heads");
  }
  if (options.rope_base) {
    check(*options.rope_base, cfg.rope_base, "rope_base option (--rope-base)",
          "rotary embedding base");
  }
  model_config stated_config{m.model_type,        m.layout,    m.layers, m.cfg, m.dtype,
                             window_of(m, layer), m.window_key};
  const detail::block_context context =
      detail::context_of(stated_config, layer, options.context_length,
                         "the context_length option (--context-length)", dir.string());

  const std::string prefix = m.block_prefix(layer);
  tensor_file block;
  std::vector<std::string> names;
  const std::vector<std::size_t> holding = files_under(m, prefix);
  for (const std::size_t f : holding) {
    tensor_file part = read_safetensors(m.files[f], [&](std::string_view name) {
      if (!name.starts_with(prefix)) return false;
      // With an index, a tensor must be in the shard the index names for it.
      if (m.index && m.index->file_of(name) != std::optional<std::uint32_t>(f)) return false;
      names.emplace_back(name);
      return true;
    });
    for (auto& [name, t] : part.tensors) block.tensors.emplace(name, std::move(t));
  }
  if (m.index) {
    const auto [first, last] = m.index->under(prefix);
    for (std::size_t i = first; i < last; ++i) {
      if (!block.tensors.contains(m.index->name(i))) {
        detail::fail(m.files[m.index->file(i)].string(), "lacks the tensor ",
                     printable(m.index->name(i)),
                     ", which model.safetensors.index.json says it holds");
      }
    }
  }
  state_dict_options stated;
  stated.n_heads = cfg.n_heads;
  stated.n_kv_heads = cfg.kv_heads();
  stated.rope_base = cfg.rope_base;
  stated.prefix = prefix;
  const detail::option_source by{"config.json's num_attention_heads",
                                 "config.json's num_key_value_heads", "config.json's rope_theta",
                                 false};
  loaded_module module =
      detail::map_state_dict(std::move(block), names, stated,
                             m.files.size() == 1 ? m.files.front().string() : dir.string(), by);
  const config& found = module.cfg;
  if (found.d_in != cfg.d_in || found.d_out != cfg.d_out || found.out_width() != cfg.out_width()) {
    detail::fail(config_source, "says hidden size ", cfg.d_in, " and heads of ", cfg.d_out,
                 " features, but the block at ", printable(prefix), " maps ", found.d_in,
                 " features to ", found.d_out, " and back to ", found.out_width());
  }
  if (found.sinks != cfg.sinks) {
    detail::fail(config_source, "describes a ", m.model_type, " block ",
                 cfg.sinks ? "with" : "without", " sinks, but the tensors at ", printable(prefix),
                 cfg.sinks ? " lack" : " hold", " them");
  }
  if (found.qk_norm != cfg.qk_norm) {
    detail::fail(config_source, "describes a ", m.model_type, " block ",
                 cfg.qk_norm ? "with" : "without", " q/k norms, but the tensors at ",
                 printable(prefix), cfg.qk_norm ? " lack" : " hold",
                 " q_norm.weight and k_norm.weight");
  }
  for (std::vector<float>* norm : {&module.w.q_norm, &module.w.k_norm}) {
    for (float& v : *norm) v = static_cast<float>(v + m.qk_norm_offset);  // Gemma's 1 + weight
  }
  module.cfg.qk_norm_eps = cfg.qk_norm_eps;
  module.cfg.out_features = cfg.out_features;
  if (found.qkv_bias != cfg.qkv_bias || found.out_proj_bias != cfg.out_proj_bias) {
    auto said = [](bool bias) { return bias ? "with" : "without"; };
    detail::fail(config_source, "describes a ", m.model_type, " block ", said(cfg.qkv_bias),
                 " Q/K/V biases and ", said(cfg.out_proj_bias), " an output bias",
                 rules_of(m.model_type, config_source).bias == detail::biases::attention_bias
                     ? " (attention_bias)"
                     : "",
                 ", but the tensors at ", printable(prefix), " are ", said(found.qkv_bias), " and ",
                 said(found.out_proj_bias));
  }
  module.cfg.causal = cfg.causal;
  module.cfg.rope_scaling = cfg.rope_scaling;
  module.cfg.rope_base = cfg.rope_base;
  module.cfg.window = window_of(m, layer);
  module.cfg.softcap = cfg.softcap;  // computed as a window (docs/design.md §1.9)
  module.cfg.context_length = context.length;
  module.context_source = context.source;
  return module;
}

}  // namespace mha::io
