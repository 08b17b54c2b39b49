// mha: what one attention module is (its constructor arguments) and the two ways to compute it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mha {

// One causal multi-head attention module, described as PyTorch's constructor arguments
// describe it. d_out is the total over all heads; head_dim() = d_out / n_heads.
//
// Valid when: d_in, d_out, n_heads, context_length >= 1; d_out % n_heads == 0;
// 0 <= dropout < 1; every weight tensor's byte count fits in std::int64_t.
// validate() checks exactly this and throws mha::invalid_argument naming the bad value.
struct config {
  std::int64_t d_in = 0;            // features of each input token
  std::int64_t d_out = 0;           // features of each output token (all heads together)
  std::int64_t n_heads = 0;         // H
  std::int64_t context_length = 0;  // largest sequence length run() accepts
  bool causal = true;               // token i attends to tokens j <= i only
  bool qkv_bias = false;            // the Q, K and V projections have biases
  bool out_proj = true;             // a final (d_out, d_out) projection with bias follows the heads
  float dropout = 0.0f;  // p, applied to attention weights in training mode only (docs/design.md §1.1)

  // d_out / n_heads; 0 when n_heads is not positive (validate() rejects such a config).
  constexpr std::int64_t head_dim() const noexcept { return n_heads > 0 ? d_out / n_heads : 0; }
};

// Throws mha::invalid_argument naming the first field that breaks the contract above.
void validate(const config& cfg);

// "d_in=768 d_out=768 n_heads=12 context_length=1024 causal qkv_bias=0 out_proj=1 dropout=0".
std::string to_string(const config& cfg);

// How a backend computes the module. Both compute the same function (docs/design.md §1).
enum class formulation {
  // H independent heads, each with its own separately allocated (head_dim, d_in) Q/K/V
  // weights: H small projections per Q, K and V, outputs concatenated.
  wrapper,
  // One (d_out, d_in) projection per Q, K and V, viewed as H heads, batched attention,
  // heads merged.
  split_weight,
};

// "wrapper" or "split_weight".
std::string_view to_string(formulation f) noexcept;

// Inverse of to_string(formulation); throws mha::invalid_argument listing the valid names.
formulation parse_formulation(std::string_view name);

}  // namespace mha
