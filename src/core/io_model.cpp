// A Hugging Face model folder (mha/io.hpp): config.json says what each attention block is, the
// model type says how its tensors are named, and model.safetensors (or the shards of
// model.safetensors.index.json) hold them. Everything read comes from untrusted files: sizes are
// capped before parsing, JSON types are checked key by key, and every file a name leads to must
// lie inside the folder.
#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <system_error>
#include <type_traits>

#include "core/io_common.hpp"
#include "core/io_json.hpp"
#include "core/io_layouts.hpp"
#include "core/io_state_dict.hpp"
#include "mha/io.hpp"

namespace mha::io {
namespace {

namespace fs = std::filesystem;
using detail::printable;
using mha::detail::text;
using nlohmann::json;

// Which biases a model type's block has: every one (Conv1D, BERT's nn.Linear), those
// config.json's attention_bias says (Llama, Mistral: all four or none), or Q, K and V's alone
// (Qwen2).
enum class biases { all, attention_bias, qkv_only };

// How a model type names its attention blocks.
struct model_type_rules {
  std::string_view type;  // config.json's model_type
  io::layout layout;
  // Layer n's block is <root><before>n<after>, root one of `roots` (the head classes' prefixes:
  // a *ForCausalLM saves model.layers..., the bare model layers...).
  std::string_view before, after;
  std::array<std::string_view, 2> roots;
  bool rope;  // configs state a rotary embedding (rope_theta / rope_parameters)
  biases bias;
};

// The decoders' blocks (Llama's names, which Mistral and Qwen2 share) and the encoders' (BERT's,
// RoBERTa's under its own root).
constexpr model_type_rules decoder_rules(std::string_view type, biases bias) {
  return {type, layout::llama, "layers.", ".self_attn.", {"", "model."}, true, bias};
}
constexpr model_type_rules encoder_rules(std::string_view type, std::string_view root) {
  return {type, layout::bert, "encoder.layer.", ".attention.", {"", root}, false, biases::all};
}

constexpr model_type_rules model_rules[] = {
    {"gpt2", layout::gpt2, "h.", ".attn.", {"", "transformer."}, false, biases::all},
    decoder_rules("llama", biases::attention_bias),
    decoder_rules("mistral", biases::attention_bias),
    decoder_rules("qwen2", biases::qkv_only),
    encoder_rules("bert", "bert."),
    encoder_rules("roberta", "roberta."),
    encoder_rules("xlm-roberta", "roberta."),
};

constexpr std::array<std::string_view, std::size(model_rules)> model_type_names = [] {
  std::array<std::string_view, std::size(model_rules)> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = model_rules[i].type;
  return names;
}();

// The rules of `type`; an mha::invalid_argument listing the known ones.
const model_type_rules& rules_of(const std::string& type, std::string_view source) {
  for (const model_type_rules& r : model_rules) {
    if (r.type == type) return r;
  }
  std::string known;
  for (const model_type_rules& r : model_rules) known += text(known.empty() ? "" : ", ", r.type);
  throw invalid_argument(
      text(source, ": model_type ", printable(type), " is not one mha reads; it knows ", known));
}

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

// The keys of config.json read through one object (the top level, or rope_parameters), each
// checked for its JSON type; messages name the file and the key.
class config_reader {
 public:
  config_reader(const json& object, std::string source, std::string where = "")
      : object_(object), source_(std::move(source)), where_(std::move(where)) {}

  bool has(std::string_view key) const {
    const auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  const json* find(std::string_view key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  // A positive integer; `fallback` when absent (0: required).
  std::int64_t count(std::string_view key, std::int64_t fallback = 0) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (fallback > 0) return fallback;
      detail::fail(source_, "has no ", name(key), "; a ", what_for_, " needs it");
    }
    if (!v->is_number_integer() || v->get<std::int64_t>() < 1) {
      fail(key, " is ", shown(*v), ", expected a positive integer");
    }
    return v->get<std::int64_t>();
  }

  // A finite number; `fallback` when absent.
  double number(std::string_view key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      fail(key, " is ", shown(*v), ", expected a number");
    }
    return v->get<double>();
  }

  bool boolean(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, " is ", shown(*v), ", expected true or false");
    return v->get<bool>();
  }

  std::string string(std::string_view key, std::string fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(key, " is ", shown(*v), ", expected a string");
    return v->get<std::string>();
  }

  // The object at `key`, or nullptr when absent.
  const json* object(std::string_view key) const {
    const json* v = find(key);
    if (v != nullptr && !v->is_object()) {
      fail(key, " is ", shown(*v), ", expected an object");
    }
    return v;
  }

  config_reader nested(const json& value, std::string_view key) const {
    config_reader r(value, source_, text(where_, key, "."));
    r.what_for_ = what_for_;
    return r;
  }

  std::string name(std::string_view key) const { return text(where_, key); }
  std::string what_for_ = "model";

  // Throws mha::format_error "<file>: <key> <args...>".
  template <class... Args>
  [[noreturn]] void fail(std::string_view key, Args&&... args) const {
    detail::fail(source_, name(key), std::forward<Args>(args)...);
  }

  // A value as a message shows it: its JSON text, cut after 64 bytes, else its type.
  static std::string shown(const json& v) {
    std::string dumped = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (dumped.size() > 64) dumped = text(v.type_name(), " ", dumped.substr(0, 61), "...");
    return detail::escaped(dumped);
  }

 private:
  const json& object_;
  std::string source_, where_;
};

// The rotary embedding of a config: rope_parameters (transformers 5) or rope_theta with
// rope_scaling (older configs and the Hub's), into cfg.rope_base and cfg.rope_scaling.
void read_rope(const config_reader& top, std::int64_t max_positions, config& cfg) {
  const json* parameters = top.object("rope_parameters");
  const json* scaling = top.object("rope_scaling");
  const json* chosen = parameters != nullptr ? parameters : scaling;
  const config_reader inner =
      chosen != nullptr
          ? top.nested(*chosen, parameters != nullptr ? "rope_parameters" : "rope_scaling")
          : top;
  // transformers moves rope_theta into rope_parameters; older configs keep it at the top level.
  cfg.rope_base = inner.number("rope_theta", top.number("rope_theta", 10000.0));
  const double partial =
      inner.number("partial_rotary_factor", top.number("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    inner.fail("partial_rotary_factor", " is ", partial,
               "; mha rotates whole heads (a partial rotary embedding is not computed)");
  }
  const std::string type =
      chosen == nullptr ? "default" : inner.string("rope_type", inner.string("type", "default"));
  rope_scaling& s = cfg.rope_scaling;
  if (type == "default") {
    s = {};
  } else if (type == "linear") {
    s.kind = rope_scaling::type::linear;
    s.factor = inner.number("factor", 1.0);
  } else if (type == "llama3") {
    s.kind = rope_scaling::type::llama3;
    s.factor = inner.number("factor", 8.0);
    s.low_freq_factor = inner.number("low_freq_factor", 1.0);
    s.high_freq_factor = inner.number("high_freq_factor", 4.0);
    // A top-level original_max_position_embeddings takes precedence, as transformers reads it.
    s.original_context = top.has("original_max_position_embeddings")
                             ? top.count("original_max_position_embeddings")
                             : inner.count("original_max_position_embeddings", max_positions);
  } else {
    inner.fail("rope_type", " is ", printable(type),
               "; mha computes the rope types default, linear and llama3");
  }
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
                 printable(dir.string()), ": ", ec.message());
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

// config.json's sizes, rotary embedding and causality for a model of `rules`.
config read_config(const config_reader& c, const model_type_rules& rules, std::int64_t& layers,
                   std::string_view type) {
  config cfg;
  const bool gpt2 = rules.layout == layout::gpt2;
  const std::int64_t hidden = c.count(gpt2 ? "n_embd" : "hidden_size");
  const std::int64_t heads = c.count(gpt2 ? "n_head" : "num_attention_heads");
  layers = c.count(gpt2 ? "n_layer" : "num_hidden_layers");
  cfg.context_length = c.count(gpt2 ? "n_positions" : "max_position_embeddings");
  cfg.d_in = cfg.d_out = hidden;
  cfg.n_heads = heads;
  const std::int64_t kv_heads = c.count("num_key_value_heads", heads);
  cfg.n_kv_heads = kv_heads == heads ? 0 : kv_heads;
  if (heads > hidden || hidden % heads != 0) {
    c.fail(gpt2 ? "n_head" : "num_attention_heads", " is ", heads,
           ", which does not divide the hidden size ", hidden);
  }
  if (heads % kv_heads != 0) {
    c.fail("num_key_value_heads", " is ", kv_heads, ", which does not divide num_attention_heads ",
           heads);
  }
  if (const std::int64_t head_dim = c.count("head_dim", hidden / heads);
      head_dim * heads != hidden) {
    throw invalid_argument(text(
        "mha: the ", type, " model has ", heads, " heads of head_dim ", head_dim, " (",
        heads * head_dim, " features) but hidden_size ", hidden,
        "; mha computes heads of hidden_size / num_attention_heads features (an inner width "
        "distinct from the hidden size, as in Qwen3, Gemma and Mistral-Nemo, is not computed)"));
  }
  const bool attention_bias =
      rules.bias == biases::attention_bias && c.boolean("attention_bias", false);
  cfg.qkv_bias = rules.bias != biases::attention_bias || attention_bias;
  cfg.out_proj_bias = rules.bias == biases::all || attention_bias;
  if (rules.rope) read_rope(c, cfg.context_length, cfg);
  if (rules.layout == layout::bert) {
    const std::string position = c.string("position_embedding_type", "absolute");
    if (position != "absolute") {
      c.fail("position_embedding_type", " is ", printable(position),
             "; mha computes BERT's attention with absolute position embeddings only");
    }
    cfg.causal = c.boolean("is_decoder", false);
  }
  return cfg;
}

}  // namespace

std::span<const std::string_view> model_types() noexcept { return model_type_names; }

std::string model_folder::block_prefix(std::int64_t layer) const {
  const model_type_rules& r = rules_of(model_type, (dir / "config.json").string());
  return text(root, r.before, layer, r.after);
}

std::vector<fs::path> model_folder::block_files(std::int64_t layer) const {
  if (weight_map.empty()) return files;
  const std::string prefix = block_prefix(layer);
  std::set<fs::path> found;
  for (auto it = weight_map.lower_bound(prefix);
       it != weight_map.end() && it->first.starts_with(prefix); ++it) {
    found.insert(it->second);
  }
  return {found.begin(), found.end()};
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
  const json top = read_json_object(config_path, max_model_config_bytes, "model's config.json");
  const config_reader c(top, config_source);
  if (!c.has("model_type")) detail::fail(config_source, "has no model_type");
  m.model_type = c.string("model_type", "");
  const model_type_rules& rules = rules_of(m.model_type, config_source);
  m.layout = rules.layout;
  m.cfg = read_config(c, rules, m.layers, m.model_type);
  m.dtype = c.string("dtype", c.string("torch_dtype", ""));

  // model.safetensors when the folder has one (as transformers prefers it), else the index.
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(single, ec)) {
    m.files = {contained(dir, "model.safetensors", allowed, dir.string())};
    names = tensor_names(m.files.front());
  } else if (fs::exists(index, ec)) {
    const fs::path index_path = contained(dir, index.filename().string(), allowed, dir.string());
    const std::string source = index.string();
    const json whole = read_json_object(index_path, max_model_index_bytes, "safetensors index");
    const auto map = whole.find("weight_map");
    if (map == whole.end() || !map->is_object()) {
      detail::fail(source, "has no weight_map object (tensor name -> shard file)");
    }
    std::map<std::string, fs::path, std::less<>> shard_paths;  // file name -> real path
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) {
        detail::fail(source, "weight_map entry ", printable(name), " is ",
                     config_reader::shown(file), ", expected a shard's file name");
      }
      const std::string& shard = file.get_ref<const std::string&>();
      auto it = shard_paths.find(shard);
      if (it == shard_paths.end()) {
        fs::path real = contained(dir, shard, allowed, source);
        if (real == index_path || real == config_path) {
          detail::fail(source, "weight_map entry ", printable(name), " names ", printable(shard),
                       ", the folder's own ", real == index_path ? "index" : "config.json",
                       ", as a shard");
        }
        it = shard_paths.emplace(shard, std::move(real)).first;
      }
      m.weight_map.emplace(name, it->second);
      names.push_back(name);
    }
    std::set<fs::path> distinct;
    for (const auto& [shard, real] : shard_paths) distinct.insert(real);
    m.files.assign(distinct.begin(), distinct.end());
  } else {
    const bool pickle = fs::exists(dir / "pytorch_model.bin", ec);
    throw invalid_argument(text(
        printable(dir.string()), " has neither model.safetensors nor model.safetensors.index.json",
        pickle ? "; its pytorch_model.bin is a pickle, which mha does not read: save the model "
                 "with save_pretrained(dir, safe_serialization=True)"
               : ""));
  }

  // The root: the head class's prefix under which layer 0's block lies.
  const std::vector<std::string> blocks = attention_prefixes(names);
  for (const std::string_view root : rules.roots) {
    const std::string first = text(root, rules.before, 0, rules.after);
    if (std::binary_search(blocks.begin(), blocks.end(), first)) {
      m.root = root;
      return m;
    }
  }
  detail::fail(
      dir.string(), "a ", m.model_type, " model's layer 0 attention block is at ",
      printable(text(rules.before, 0, rules.after)), " or ",
      printable(text(rules.roots[1], rules.before, 0, rules.after)), ", but its tensors hold ",
      blocks.empty() ? std::string("no attention block")
                     : text(blocks.size(), " blocks, the first at ", printable(blocks.front())));
}

loaded_module load_model(const fs::path& dir, std::int64_t layer,
                         const state_dict_options& options) {
  const model_folder m = read_model_folder(dir);
  const std::string config_source = (dir / "config.json").string();
  if (layer < 0 || layer >= m.layers) {
    throw invalid_argument(text(config_source, ": layer ", layer, " is not one of the model's ",
                                m.layers, " layers (0 to ", m.layers - 1, ")"));
  }
  if (!options.prefix.empty()) {
    throw invalid_argument(text(dir.string(),
                                ": a model folder's layer gives the block's prefix; "
                                "the prefix option (--prefix) applies to --weights"));
  }
  // The caller's values must be the config's.
  const config& cfg = m.cfg;
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
  if (options.context_length > cfg.context_length) {
    throw invalid_argument(text(dir.string(), ": the context_length option (--context-length) ",
                                options.context_length, " exceeds config.json's ",
                                "max_position_embeddings ", cfg.context_length));
  }

  const std::string prefix = m.block_prefix(layer);
  tensor_file block;
  std::vector<std::string> names;
  for (const fs::path& file : m.block_files(layer)) {
    tensor_file part = read_safetensors(file, [&](std::string_view name) {
      if (!name.starts_with(prefix)) return false;
      // With an index, a tensor must be in the shard the index names for it.
      if (!m.weight_map.empty()) {
        const auto it = m.weight_map.find(name);
        if (it == m.weight_map.end() || it->second != file) return false;
      }
      names.emplace_back(name);
      return true;
    });
    for (auto& [name, t] : part.tensors) block.tensors.emplace(name, std::move(t));
  }
  for (const auto& [name, file] : m.weight_map) {
    if (name.starts_with(prefix) && !block.tensors.contains(name)) {
      detail::fail(file.string(), "lacks the tensor ", printable(name),
                   ", which model.safetensors.index.json says it holds");
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
  if (found.d_in != cfg.d_in || found.d_out != cfg.d_out) {
    detail::fail(config_source, "says hidden size ", cfg.d_in, ", but the block at ",
                 printable(prefix), " maps ", found.d_in, " features to ", found.d_out);
  }
  if (found.qkv_bias != cfg.qkv_bias || found.out_proj_bias != cfg.out_proj_bias) {
    auto said = [](bool bias) { return bias ? "with" : "without"; };
    detail::fail(config_source, "describes a ", m.model_type, " block ", said(cfg.qkv_bias),
                 " Q/K/V biases and ", said(cfg.out_proj_bias), " an output bias",
                 rules_of(m.model_type, config_source).bias == biases::attention_bias
                     ? " (attention_bias)"
                     : "",
                 ", but the tensors at ", printable(prefix), " are ", said(found.qkv_bias), " and ",
                 said(found.out_proj_bias));
  }
  module.cfg.causal = cfg.causal;
  module.cfg.rope_scaling = cfg.rope_scaling;
  module.cfg.context_length =
      options.context_length > 0 ? options.context_length : cfg.context_length;
  return module;
}

}  // namespace mha::io
