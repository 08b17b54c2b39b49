// A Hugging Face config.json read for its attention blocks: what each model type's keys say
// (sizes, rotary embedding, causality, sliding windows), which keys change the attention in a way
// mha does not compute, and values checked key by key. Everything here comes from an untrusted
// file: JSON types are checked, sizes multiplied with overflow checks, and a message names the
// key and its value.
#include "io/model_config.hpp"

#include <cmath>
#include <limits>

#include "base/checks.hpp"
#include "io/common.hpp"
#include "io/json.hpp"

namespace mha::io::detail {
namespace {

using mha::detail::text;
using nlohmann::json;

// The decoders' blocks (Llama's names, which Mistral and Qwen2 share) and the encoders' (BERT's,
// RoBERTa's under its own root).
constexpr model_type_rules decoder_rules(std::string_view type, biases bias, windowing windows) {
  return {type, layout::llama, "layers.", ".self_attn.", {"", "model."}, true, bias, windows};
}
constexpr model_type_rules encoder_rules(std::string_view type, std::string_view root) {
  return {type,       layout::bert, "encoder.layer.", ".attention.",
          {"", root}, false,        biases::all,      windowing::none};
}
// Gemma's decoders: Llama's names, q/k norms in Gemma 3, every `pattern`-th layer full, and
// their configs' defaults (Gemma2Config soft-caps at 50, Gemma3TextConfig not).
constexpr model_type_rules gemma_rules(std::string_view type, bool qk_norm, std::int64_t pattern,
                                       double softcap, double query_pre_attn_scalar) {
  return {type,
          layout::llama,
          "layers.",
          ".self_attn.",
          {"", "model."},
          true,
          biases::attention_bias,
          windowing::layer_types,
          true,
          qk_norm,
          pattern,
          softcap,
          query_pre_attn_scalar};
}

constexpr model_type_rules model_rules[] = {
    {"gpt2",
     layout::gpt2,
     "h.",
     ".attn.",
     {"", "transformer."},
     false,
     biases::all,
     windowing::none},
    decoder_rules("llama", biases::attention_bias, windowing::none),
    decoder_rules("mistral", biases::none, windowing::every_layer),
    decoder_rules("qwen2", biases::qkv_only, windowing::by_layer_type),
    gemma_rules("gemma2", false, 2, 50.0, 224.0),
    gemma_rules("gemma3_text", true, 6, 0.0, 256.0),
    // gpt-oss: Llama's names with every bias and a sink per head, every other layer sliding.
    {.type = "gpt_oss",
     .layout = layout::llama,
     .before = "layers.",
     .after = ".self_attn.",
     .roots = {"", "model."},
     .rope = true,
     .bias = biases::attention_bias,
     .windows = windowing::layer_types,
     .sliding_pattern = 2,
     .sinks = true,
     .attention_bias = true,
     .sliding_window = 128},
    encoder_rules("bert", "bert."),
    encoder_rules("roberta", "roberta."),
    encoder_rules("xlm-roberta", "roberta."),
};

constexpr std::array<std::string_view, std::size(model_rules)> model_type_names = [] {
  std::array<std::string_view, std::size(model_rules)> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = model_rules[i].type;
  return names;
}();

// A key that changes the attention of a layout's model types in transformers in a way mha does
// not compute: accepted absent, null, or holding `computed` (its JSON text), the value under
// which the model's attention is mha's (transformers' default); any other value is refused. The
// one list of them: `mha run --model`, `mha inspect`, Plan.from_pretrained and Plan.from_module
// all read configs through it. Keys with a sliding window are read by window_rule instead.
struct refused_key {
  io::layout layout;
  std::string_view key, computed;
  std::string_view effect;  // what another value does
};
constexpr refused_key refused_keys[] = {
    {layout::gpt2, "scale_attn_weights", "true",
     "leaves the scores unscaled (mha scales them by 1/sqrt(head_dim))"},
    {layout::gpt2, "scale_attn_by_inverse_layer_idx", "false",
     "divides layer n's scores by n + 1 as well"},
    {layout::llama, "use_bidirectional_attention", "false",
     "lets each token attend to later tokens too"},
    {layout::bert, "position_embedding_type", "\"absolute\"",
     "adds a relative position term to the scores (mha computes absolute position embeddings "
     "only)"},
};

// The keys of config.json read through one object (the top level, or rope_parameters), each
// checked for its JSON type; messages name the file and the key.
class config_reader {
 public:
  config_reader(const json& object, std::string_view source, std::string where = "")
      : object_(object), source_(source), where_(std::move(where)) {}

  // Present and not null (null reads as absent, as transformers reads None).
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Present, null included.
  bool contains(std::string_view key) const { return object_.contains(key); }
  const json* find(std::string_view key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  // A positive integer (at least `least`: 0 or 1); `fallback` when absent (-1: required).
  std::int64_t count(std::string_view key, std::int64_t fallback = -1, int least = 1) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (fallback >= 0) return fallback;
      detail::fail(source_, "has no ", name(key), "; a model needs it");
    }
    if (!v->is_number_integer() || v->get<std::int64_t>() < least) {
      fail(key, "is ", shown(*v),
           least == 1 ? ", expected a positive integer" : ", expected an integer >= 0");
    }
    return v->get<std::int64_t>();
  }

  // A finite number; `fallback` when absent.
  double number(std::string_view key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      fail(key, "is ", shown(*v), ", expected a number");
    }
    return v->get<double>();
  }

  bool boolean(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, "is ", shown(*v), ", expected true or false");
    return v->get<bool>();
  }

  std::string string(std::string_view key, std::string fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(key, "is ", shown(*v), ", expected a string");
    return v->get<std::string>();
  }

  // The object at `key`, or nullptr when absent.
  const json* object(std::string_view key) const {
    const json* v = find(key);
    if (v != nullptr && !v->is_object()) fail(key, "is ", shown(*v), ", expected an object");
    return v;
  }

  config_reader nested(const json& value, std::string_view key) const {
    return config_reader(value, source_, text(where_, key, "."));
  }

  std::string name(std::string_view key) const { return text(where_, key); }

  // Throws mha::format_error "<file>: <key> <args...>".
  template <class... Args>
  [[noreturn]] void fail(std::string_view key, Args&&... args) const {
    detail::fail(source_, name(key), " ", std::forward<Args>(args)...);
  }
  // Throws mha::unsupported "<file>: <key> <args...>": a valid value whose attention mha does
  // not compute.
  template <class... Args>
  [[noreturn]] void refuse(std::string_view key, Args&&... args) const {
    throw unsupported(text(source_, ": ", name(key), " ", std::forward<Args>(args)...));
  }

  // A value as a message shows it: its JSON text, cut after 64 bytes, else its type.
  static std::string shown(const json& v) {
    std::string dumped = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (dumped.size() > 64) dumped = text(v.type_name(), " ", dumped.substr(0, 61), "...");
    return escaped(dumped);
  }

 private:
  const json& object_;
  std::string_view source_;
  std::string where_;
};

// Written so that NaN fails too.
bool finite_above(double value, double least) {
  return value > least && value < std::numeric_limits<double>::infinity();
}

// The rotary embedding of a config, as transformers 5 reads it (convert_rope_params_to_dict): a
// non-empty rope_scaling (older configs and the Hub's) wins over rope_parameters (transformers
// 5's), and rope_theta is the chosen object's, else the top level's, else 10000. Into
// cfg.rope_base and cfg.rope_scaling, each value checked as a plan checks it, naming its key.
void read_rope(const config_reader& top, std::string_view type, std::int64_t max_positions,
               config& cfg) {
  const json* parameters = top.object("rope_parameters");
  const json* scaling = top.object("rope_scaling");
  const bool legacy = scaling != nullptr && !scaling->empty();
  const json* chosen = legacy ? scaling : parameters;
  const config_reader inner =
      chosen != nullptr ? top.nested(*chosen, legacy ? "rope_scaling" : "rope_parameters") : top;

  const config_reader& theta_at = inner.has("rope_theta") ? inner : top;
  cfg.rope_base = theta_at.number("rope_theta", 10000.0);
  if (!finite_above(cfg.rope_base, 1.0)) {
    theta_at.fail("rope_theta", "is ", cfg.rope_base, ", expected a finite base > 1 (a ", type,
                  " model rotates its queries and keys by it)");
  }
  const double partial =
      inner.number("partial_rotary_factor", top.number("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    inner.refuse("partial_rotary_factor", "is ", partial,
                 "; mha rotates whole heads (a partial rotary embedding is not computed)");
  }
  const std::string kind =
      chosen == nullptr ? "default" : inner.string("rope_type", inner.string("type", "default"));
  rope_scaling& s = cfg.rope_scaling;
  if (kind == "default") {
    s = {};
    return;
  }
  if (kind == "linear") {
    s.kind = rope_scaling::type::linear;
    s.factor = inner.number("factor", 1.0);
  } else if (kind == "llama3") {
    s.kind = rope_scaling::type::llama3;
    s.factor = inner.number("factor", 8.0);
    s.low_freq_factor = inner.number("low_freq_factor", 1.0);
    s.high_freq_factor = inner.number("high_freq_factor", 4.0);
    // A top-level original_max_position_embeddings takes precedence, as transformers reads it.
    s.original_context = top.has("original_max_position_embeddings")
                             ? top.count("original_max_position_embeddings")
                             : inner.count("original_max_position_embeddings", max_positions);
    if (!(s.low_freq_factor > 0.0)) {
      inner.fail("low_freq_factor", "is ", s.low_freq_factor, ", expected a number > 0");
    }
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      inner.fail("high_freq_factor", "is ", s.high_freq_factor,
                 ", expected a number above low_freq_factor (", s.low_freq_factor, ")");
    }
  } else if (kind == "yarn") {
    // As transformers' _compute_yarn_parameters reads it: factor (else max_position_embeddings
    // over the original), beta_fast 32 and beta_slow 1 when absent or 0, truncate true, and an
    // attention_factor, else one from mscale and mscale_all_dim, else 0.1 ln(factor) + 1.
    s.kind = rope_scaling::type::yarn;
    s.original_context = top.has("original_max_position_embeddings")
                             ? top.count("original_max_position_embeddings")
                             : inner.count("original_max_position_embeddings");
    s.factor = inner.number(
        "factor", static_cast<double>(max_positions) / static_cast<double>(s.original_context));
    const double fast = inner.number("beta_fast", 0.0), slow = inner.number("beta_slow", 0.0);
    s.beta_fast = fast != 0.0 ? fast : 32.0;
    s.beta_slow = slow != 0.0 ? slow : 1.0;
    s.truncate = inner.boolean("truncate", true);
    const auto mscale = [&](double m) {
      return s.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0;
    };
    const double m = inner.number("mscale", 0.0), all = inner.number("mscale_all_dim", 0.0);
    s.attention_factor = inner.has("attention_factor") ? inner.number("attention_factor", 0.0)
                         : m != 0.0 && all != 0.0      ? mscale(m) / mscale(all)
                                                       : mscale(1.0);
    if (!(s.beta_slow > 0.0 && s.beta_slow < s.beta_fast)) {
      inner.fail("beta_slow", "is ", s.beta_slow, ", expected a number between 0 and beta_fast (",
                 s.beta_fast, ")");
    }
    if (!(s.attention_factor > 0.0)) {
      inner.fail("attention_factor", "is ", s.attention_factor, ", expected a number > 0");
    }
  } else {
    inner.refuse(inner.has("rope_type") ? "rope_type" : "type", "is ", printable(kind),
                 "; mha computes the rope types default, linear, llama3 and yarn");
  }
  if (!(s.factor >= 1.0)) inner.fail("factor", "is ", s.factor, ", expected a number >= 1");
}

// A window's size at `key`: its count, `absent` when the key is missing, 0 when null.
std::int64_t window_size(const config_reader& c, std::string_view key, std::int64_t absent) {
  if (!c.contains(key)) return absent;
  return c.has(key) ? c.count(key) : 0;
}

// The sliding windows transformers gives the layers of a model of `rules`.
window_rule read_windows(const config_reader& c, const model_type_rules& rules,
                         std::int64_t layers) {
  window_rule w;
  w.key = "sliding_window";
  switch (rules.windows) {
    case windowing::none:
      return {};
    case windowing::every_layer:  // MistralConfig: sliding_window = 4096 unless stated
      w.size = window_size(c, "sliding_window", rules.sliding_window);
      return w;
    case windowing::by_layer_type:  // Qwen2Config
      w.size = c.boolean("use_sliding_window", false)
                   ? window_size(c, "sliding_window", rules.sliding_window)
                   : 0;
      break;
    case windowing::layer_types:  // Gemma2Config, Gemma3TextConfig, GptOssConfig
      w.size = window_size(c, "sliding_window", rules.sliding_window);
      if (!c.has("layer_types")) {
        // Configs before transformers 4.53 say which layers slide by a pattern.
        const std::string_view key =
            c.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
        const std::int64_t pattern = c.count(key, rules.sliding_pattern);
        for (std::int64_t layer = 0; layer < layers; ++layer)
          w.by_layer.push_back(w.size > 0 && (layer + 1) % pattern != 0);
        return w;
      }
      break;
  }
  if (const json* types = c.find("layer_types")) {
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != layers) {
      c.fail("layer_types", "is ", config_reader::shown(*types), ", expected a list of ", layers,
             " layer types (num_hidden_layers)");
    }
    for (const json& t : *types) {
      const bool sliding = t == "sliding_attention";
      if (!sliding && t != "full_attention") {
        c.refuse("layer_types", "holds ", config_reader::shown(t), "; a ", rules.type,
                 " model's layers mha computes are full_attention and sliding_attention");
      }
      if (sliding && w.size == 0) {
        c.fail("layer_types",
               "holds sliding_attention, but no sliding window is set "
               "(use_sliding_window false or sliding_window null)");
      }
      w.by_layer.push_back(sliding);
    }
    return w;
  }
  w.from_layer = w.size > 0 ? c.count("max_window_layers", 28, 0) : 0;
  return w;
}

}  // namespace

const model_type_rules& rules_of(std::string_view type, std::string_view source) {
  for (const model_type_rules& r : model_rules) {
    if (r.type == type) return r;
  }
  std::string known;
  for (const model_type_rules& r : model_rules) known += text(known.empty() ? "" : ", ", r.type);
  throw unsupported(
      text(source, ": model_type ", printable(type), " is not one mha reads; it knows ", known));
}

mha::config model_json::layer_config(std::int64_t layer) const {
  mha::config cfg = config.cfg;
  cfg.window = windows.of(layer);
  if (cfg.window > 0 && sliding_rope.first != 0.0) {
    cfg.rope_base = sliding_rope.first;
    cfg.rope_scaling = sliding_rope.second;
  }
  return cfg;
}

std::int64_t window_rule::of(std::int64_t layer) const noexcept {
  if (!by_layer.empty()) {
    return layer < static_cast<std::int64_t>(by_layer.size()) &&
                   by_layer[static_cast<std::size_t>(layer)]
               ? size
               : 0;
  }
  return layer >= from_layer ? size : 0;
}

model_json read_model_json(const json& top, std::string_view source) {
  const config_reader c(top, source);
  if (!c.has("model_type")) detail::fail(source, "has no model_type");
  model_json out;
  model_config& m = out.config;
  m.model_type = c.string("model_type", "");
  const model_type_rules& rules = rules_of(m.model_type, source);
  m.layout = rules.layout;
  m.dtype = c.string("dtype", c.string("torch_dtype", ""));
  for (const refused_key& r : refused_keys) {
    const json* v = c.find(r.key);
    if (r.layout == rules.layout && v != nullptr && v->dump() != r.computed) {
      c.refuse(r.key, "is ", config_reader::shown(*v), ": a ", m.model_type, " model with it ",
               r.effect, ", which mha does not compute");
    }
  }

  config& cfg = m.cfg;
  const bool gpt2 = rules.layout == layout::gpt2;
  const std::string_view heads_key = gpt2 ? "n_head" : "num_attention_heads";
  const std::int64_t hidden = c.count(gpt2 ? "n_embd" : "hidden_size");
  const std::int64_t heads = c.count(heads_key);
  m.layers = c.count(gpt2 ? "n_layer" : "num_hidden_layers");
  cfg.context_length = c.count(gpt2 ? "n_positions" : "max_position_embeddings");
  cfg.d_in = hidden;
  cfg.n_heads = heads;
  const std::int64_t kv_heads = c.count("num_key_value_heads", heads);
  cfg.n_kv_heads = kv_heads == heads ? 0 : kv_heads;
  if (!c.has("head_dim") && (heads > hidden || hidden % heads != 0)) {
    c.fail(heads_key, "is ", heads, ", which does not divide the hidden size ", hidden);
  }
  if (heads % kv_heads != 0) {
    c.fail("num_key_value_heads", "is ", kv_heads, ", which does not divide ", heads_key, " ",
           heads);
  }
  // An inner width of its own (Gemma, Mistral NeMo: head_dim * heads is not hidden_size): the
  // out projection maps it back to hidden_size (config::out_features).
  const std::int64_t head_dim = c.count("head_dim", hidden / heads);
  if (__builtin_mul_overflow(head_dim, heads, &cfg.d_out)) {
    c.fail("head_dim", "is ", head_dim, ", whose product with ", heads_key, " ", heads,
           " overflows");
  }
  if (cfg.d_out != hidden) cfg.out_features = hidden;
  if (rules.gemma) {
    // Gemma scales scores by query_pre_attn_scalar^-0.5 where mha scales by head_dim^-0.5.
    const double scalar = c.number("query_pre_attn_scalar", rules.query_pre_attn_scalar);
    if (scalar != static_cast<double>(head_dim)) {
      c.refuse("query_pre_attn_scalar", "is ", scalar, ": a ", m.model_type,
               " model with it scales its scores by ", scalar, "^-0.5, not head_dim ", head_dim,
               "^-0.5, which mha does not compute");
    }
    m.qk_norm_offset = 1.0;  // Gemma's RMS norms scale by 1 + weight
    // Soft-capping (null: none), as Gemma2Config reads it: 50 when the key is absent.
    cfg.softcap = c.contains("attn_logit_softcapping") ? c.number("attn_logit_softcapping", 0.0)
                                                       : rules.softcap;
    if (!(cfg.softcap >= 0.0)) {
      c.fail("attn_logit_softcapping", "is ", cfg.softcap, ", expected a number >= 0 or null");
    }
  }
  cfg.qk_norm = rules.qk_norm;
  cfg.sinks = rules.sinks;
  if (cfg.qk_norm) {
    cfg.qk_norm_eps = c.number("rms_norm_eps", 1e-6);
    if (!finite_above(cfg.qk_norm_eps, 0.0)) {
      c.fail("rms_norm_eps", "is ", cfg.qk_norm_eps, ", expected a finite number > 0");
    }
  }
  const bool attention_bias =
      rules.bias == biases::attention_bias && c.boolean("attention_bias", rules.attention_bias);
  cfg.qkv_bias = rules.bias == biases::all || rules.bias == biases::qkv_only || attention_bias;
  cfg.out_proj_bias = rules.bias == biases::all || attention_bias;
  const json* typed = c.object("rope_parameters");
  if (rules.gemma && typed != nullptr && typed->contains("full_attention")) {
    // transformers 5's Gemma 3: rope_parameters per layer type, each read as a model's.
    for (const std::string_view type : {"full_attention", "sliding_attention"}) {
      json view = top;
      view["rope_parameters"] = typed->value(type, json::object());
      view.erase("rope_scaling");
      config each = cfg;
      read_rope(config_reader(view, source), m.model_type, cfg.context_length, each);
      if (type == "full_attention") {
        cfg.rope_base = each.rope_base, cfg.rope_scaling = each.rope_scaling;
      } else {
        out.sliding_rope = {each.rope_base, each.rope_scaling};
      }
    }
  } else if (rules.rope) {
    read_rope(c, m.model_type, cfg.context_length, cfg);
    if (rules.qk_norm) {  // Gemma 3 before transformers 5: the sliding layers' own base
      out.sliding_rope = {c.number("rope_local_base_freq", 10000.0), {}};
      if (!finite_above(out.sliding_rope.first, 1.0)) {
        c.fail("rope_local_base_freq", "is ", out.sliding_rope.first,
               ", expected a finite base > 1");
      }
    }
  }
  if (rules.layout == layout::bert) cfg.causal = c.boolean("is_decoder", false);
  // What the keys above let through, a plan checks again (sizes whose bytes overflow).
  mha::detail::check_config(cfg, source);

  out.windows = read_windows(c, rules, m.layers);
  return out;
}

block_context context_of(const model_config& m, std::int64_t layer, std::int64_t asked,
                         std::string_view asker, std::string_view where) {
  const std::string_view positions =
      m.layout == layout::gpt2 ? "n_positions" : "max_position_embeddings";
  if (asked > m.cfg.context_length) {
    throw invalid_argument(text(where, ": ", asker, " ", asked, " exceeds config.json's ",
                                positions, " ", m.cfg.context_length));
  }
  (void)layer;  // a sliding layer's window is computed (config::window): no cap at it
  return {asked > 0 ? asked : m.cfg.context_length,
          asked > 0 ? std::string(asker) : text("config.json's ", positions)};
}

}  // namespace mha::io::detail

namespace mha::io {

model_config parse_model_config(std::string_view json_text, std::string_view source,
                                std::int64_t layer) {
  using detail::fail;
  if (json_text.size() > max_model_config_bytes) {
    fail(source, json_text.size(), " bytes, more than the ", max_model_config_bytes,
         " bytes a model's config.json may have");
  }
  const nlohmann::json top = detail::parse_json(json_text, source, "its JSON");
  if (!top.is_object()) fail(source, "is a JSON ", top.type_name(), ", expected an object");
  if (layer < 0) {
    throw invalid_argument(mha::detail::text(source, ": layer ", layer, " must be >= 0"));
  }
  detail::model_json m = detail::read_model_json(top, source);
  m.config.cfg = m.layer_config(layer);
  m.config.window = m.config.cfg.window;
  if (m.config.window > 0) m.config.window_key = m.windows.key;
  return std::move(m.config);
}

std::span<const std::string_view> model_types() noexcept { return detail::model_type_names; }

}  // namespace mha::io
