// Internal: a Hugging Face config.json read for its attention blocks (io/model_config.cpp), for
// the model folder reader (io/model.cpp) and parse_model_config.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "mha/io.hpp"

namespace mha::io::detail {

// Which biases a model type's block has: every one (Conv1D, BERT's nn.Linear), those
// config.json's attention_bias says (Llama: all four or none), Q, K and V's alone (Qwen2), or
// none (Mistral's nn.Linear layers are built without).
enum class biases { all, attention_bias, qkv_only, none };

// Which layers transformers gives a sliding window: none, every layer (Mistral's
// sliding_window, 4096 when the key is absent), by layer type (Qwen2's layer_types, or
// use_sliding_window from max_window_layers on), or by layer type always (Gemma's and gpt-oss's
// layer_types, or every layer but each sliding_pattern-th: Gemma's sliding_window_pattern).
enum class windowing { none, every_layer, by_layer_type, layer_types };

// How a model type names its attention blocks, and what of its attention config.json states.
struct model_type_rules {
  std::string_view type;  // config.json's model_type
  io::layout layout;
  // Layer n's block is <root><before>n<after>, root one of `roots` (the head classes' prefixes:
  // a *ForCausalLM saves model.layers..., the bare model layers...).
  std::string_view before, after;
  std::array<std::string_view, 2> roots;
  bool rope;  // configs state a rotary embedding (rope_theta / rope_parameters)
  biases bias;
  windowing windows;
  // Gemma's attention: q/k norms scaling by 1 + weight (rms_norm_eps), scores scaled by
  // query_pre_attn_scalar^-0.5, an inner width of its own (head_dim), and the sliding layers'
  // own rotary embedding (rope_parameters.sliding_attention, or rope_local_base_freq).
  bool gemma = false;
  bool qk_norm = false;              // the blocks hold q_norm and k_norm (Gemma 3)
  std::int64_t sliding_pattern = 0;  // windowing::layer_types without them: each n-th is full
  // Gemma's config defaults where a key is absent: attn_logit_softcapping (0: None) and
  // query_pre_attn_scalar.
  double softcap = 0.0, query_pre_attn_scalar = 0.0;
  bool sinks = false;                  // the blocks hold a sink logit per head (gpt-oss)
  bool attention_bias = false;         // config.json's attention_bias when absent
  std::int64_t sliding_window = 4096;  // ... and its sliding_window
};

// The rules of `type`; an mha::invalid_argument listing the known ones.
const model_type_rules& rules_of(std::string_view type, std::string_view source);

// The sliding window of each layer, as config.json sets them.
struct window_rule {
  std::int64_t size = 0;        // keys each query sees; 0: no layer has a window
  std::string key;              // the key that sets the size
  std::int64_t from_layer = 0;  // layers from this one on have it (Qwen2's max_window_layers)
  std::vector<bool> by_layer;   // or, when not empty, those whose layer_types entry says so
  std::int64_t of(std::int64_t layer) const noexcept;
};

// config.json as read for every layer: the model_config (window 0) and the window rule.
struct model_json {
  model_config config;
  window_rule windows;
  // The sliding layers' rotary embedding where it is their own (Gemma 3), else base 0.
  std::pair<double, mha::rope_scaling> sliding_rope{0.0, {}};
  // Layer `layer`'s config: config.cfg with its window and, sliding, its rotary embedding.
  mha::config layer_config(std::int64_t layer) const;
};

// `top` (config.json's object, `source` naming it) read as parse_model_config documents.
model_json read_model_json(const nlohmann::json& top, std::string_view source);

// The context length of layer `layer`'s block of a model `m` says for a caller asking for
// `asked` tokens (0: as many as the model takes): `asked`, else max_position_embeddings (a
// sliding layer's window is computed, config::window, so it caps nothing). With where it comes
// from, for messages. `asker` names who asked ("the context_length option (--context-length)");
// asking past max_position_embeddings is an mha::invalid_argument prefixed by `where`.
struct block_context {
  std::int64_t length;
  std::string source;
};
block_context context_of(const model_config& m, std::int64_t layer, std::int64_t asked,
                         std::string_view asker, std::string_view where);

}  // namespace mha::io::detail
