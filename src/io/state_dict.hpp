// Internal: the state_dict mapping of io/state_dict.cpp, for the model folder reader
// (io/model.cpp), which states a block's heads and rotary embedding from config.json.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mha/io.hpp"

namespace mha::io::detail {

// Who gives state_dict_options' values, for messages and for the kind of error a disagreement
// with the tensors or metadata is: the caller (the flags of `mha run`; mha::invalid_argument) by
// default, or a model folder's config.json (mha::format_error: the folder contradicts itself).
struct option_source {
  std::string_view heads = "the n_heads option (--heads)";
  std::string_view kv_heads = "the n_kv_heads option (--kv-heads)";
  std::string_view rope_base = "the rope_base option (--rope-base)";
  bool caller = true;
};

// The prefix of the attention block `name` belongs to when it is the name of a tensor that
// identifies a layout (attention_prefixes), else nullopt; a view into `name`.
std::optional<std::string_view> attention_block_of(std::string_view name);

// `file`'s tensors whose names are `names` (all of them, or the block's when the caller read
// only those) mapped to a module, as module_from_state_dict documents.
loaded_module map_state_dict(tensor_file file, std::span<const std::string> names,
                             const state_dict_options& options, std::string_view source,
                             const option_source& by = {});

}  // namespace mha::io::detail
