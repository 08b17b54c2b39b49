// mha: the parameters of a module, in PyTorch nn.Linear layout, and their per-head slices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mha/config.hpp"

namespace mha {

// One nn.Linear: y = x W^T + b. `weight` is (out, in) row-major; `bias` is (out) or empty
// (no bias). An unused layer (out_proj when config::out_proj is false) has out == in == 0.
struct linear_weights {
  std::int64_t out = 0;
  std::int64_t in = 0;
  std::vector<float> weight;
  std::vector<float> bias;

  bool has_bias() const noexcept { return !bias.empty(); }
  // Rows [first, first + count) of the weight (and of the bias) as a layer of their own, in new
  // storage. Throws mha::invalid_argument when the range is not inside [0, out).
  linear_weights rows(std::int64_t first, std::int64_t count) const;
};

// One head of the wrapper form: its own (head_dim, d_in) Q/K/V projections, in storage that
// belongs to this head alone.
struct head_weights {
  linear_weights query, key, value;
};

// A module's parameters in the split layout (docs/design.md §1): query is (d_out, d_in), key and
// value are (d_kv, d_in) (d_kv = d_out unless the config groups K/V heads), out_proj is
// (out_width(), d_out); with config::qk_norm, q_norm and k_norm hold the norms' head_dim weights
// (else they are empty), and with config::sinks, sinks holds n_heads logits. Names match a PyTorch
// state_dict: W_query.weight -> query.weight, out_proj.bias -> out_proj.bias, q_norm.weight ->
// q_norm. Plain data: copy, move and edit freely; validate() checks it against a config before a
// backend uses it.
struct weights {
  linear_weights query, key, value, out_proj;
  std::vector<float> q_norm, k_norm;
  std::vector<float> sinks;  // with config::sinks: one logit per query head (n_heads), else empty

  // nn.Linear's default initialisation, reproducibly: every weight and bias element drawn from
  // U(-1/sqrt(in), 1/sqrt(in)) with the counter-based generator of docs/design.md §1.1, so a seed
  // gives the same weights on every machine. Biases exist where cfg says so; q/k norm weights
  // are drawn from U(0.5, 1.5), sinks from U(-1, 1). Validates cfg first.
  static weights random(const config& cfg, std::uint64_t seed);

  // Head h's weights: rows [h*head_dim, (h+1)*head_dim) of query and the rows of its K/V head
  // g = h / (n_heads / kv_heads) of key and value (and their biases), copied into new storage.
  // Throws mha::invalid_argument when h is not in [0, n_heads) or when the weights do not match
  // cfg.
  head_weights head(const config& cfg, std::int64_t h) const;

  // Query, key and value stacked as one (d_out + 2 d_kv, d_in) layer, biases likewise: the
  // fused_qkv formulation's projection (nn.MultiheadAttention's in_proj, GPT-2's c_attn read as
  // nn.Linear). Throws mha::invalid_argument when the three do not share d_in or bias presence.
  linear_weights fused_qkv() const;

  // The inverse of head(): stacks per-head weights (the wrapper layout of a state_dict) into the
  // split layout. Throws mha::invalid_argument when heads.size() != n_heads, a head's shapes
  // do not match cfg, or cfg groups K/V heads (each head would bring its own K/V), or
  // normalises q and k (cfg.qk_norm: the heads bring no norm weights).
  static weights from_heads(const config& cfg, std::span<const head_weights> heads,
                            linear_weights out_proj);
};

// Throws mha::invalid_argument naming the first tensor whose shape or presence disagrees with
// cfg ("W_key.weight has 100 elements, expected d_out*d_in = 96"). Validates cfg first.
void validate(const config& cfg, const weights& w);

}  // namespace mha
