// Internal: the layouts of mha::io::layout, each as the tensor names it reads and writes
// (docs/cli.md, "Weight files"). io/state_dict.cpp picks the block and the layout and resolves what
// names cannot say (heads, K/V heads, rotary embedding, context length).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "mha/io.hpp"

namespace mha::io::detail {

using tensor_map = std::map<std::string, tensor, std::less<>>;

// What a block's tensors give: the weights in the split layout (K and V of any common row
// count; out_proj empty when the block has none), the head count when the names count heads
// (the wrapper's heads.{h} groups; else 0) and the size C of its causal mask buffers (else 0).
struct block_weights {
  weights w;
  std::int64_t heads = 0;
  std::int64_t mask_size = 0;
};

// One layout: how to tell it, read it and write it.
struct layout_rules {
  io::layout id;
  std::string_view module;      // the PyTorch module it is, for messages
  std::string_view tensors;     // its tensor names, for messages
  std::string_view key_tensor;  // the tensor whose rows give the K/V heads, for messages
  // Whether `name` (relative to a block) is one of the tensors that identify the layout.
  bool (*identifies)(std::string_view name);
  // Reads a block whose names are relative to `prefix` (put back in messages), consuming every
  // tensor; a missing, mis-shaped or unknown one is an mha::format_error.
  block_weights (*read)(tensor_map& block, std::string_view prefix, std::string_view source);
  // Adds the tensors of a validated (cfg, w); mha::invalid_argument when the layout cannot
  // hold them.
  void (*write)(const config& cfg, const weights& w, tensor_map& out);
  // Whether the module masks later tokens (every layout but bert, an encoder's).
  bool causal;
};

const layout_rules& rules(io::layout l);

}  // namespace mha::io::detail
