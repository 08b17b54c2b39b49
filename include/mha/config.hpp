// mha: what one attention module is (its constructor arguments) and the two ways to compute it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mha {

// The number format a plan computes in (docs/design.md §1.5), and the one a KV cache keeps its
// keys and values in (§1.7). fp32 is the function of §1 as written; bf16 rounds the weights and
// the operands of every product to bfloat16 and sums in fp32: naive, xsimd and tbb compute it on
// every CPU, onednn where its kernels are bf16-native (backend::supports says). int8, k8v4 and
// int4 are a KV cache's formats only: int8 stores each cached key and value row as 8-bit codes
// with a scale and an offset of its own; k8v4 its keys so and its values as 4-bit codes, each
// group of 32 elements turned and given a scale and an offset; int4 its values as k8v4's and its
// keys as 4-bit codes with a scale and an offset per channel of each group of 64 tokens, the
// newest tokens of an unfilled group kept exact (docs/design.md §1.7).
enum class precision {
  fp32,
  bf16,
  int8,
  k8v4,
  int4,
};

// Whether a KV cache of p keeps codes (int8, k8v4, int4), read by a plan of either precision.
constexpr bool coded(precision p) noexcept {
  return p == precision::int8 || p == precision::k8v4 || p == precision::int4;
}

// The formats a KV cache may keep, and their names for messages.
inline constexpr precision cache_precisions[] = {precision::fp32, precision::bf16, precision::int8,
                                                 precision::k8v4, precision::int4};
inline constexpr std::string_view cache_precision_names = "fp32, bf16, int8, k8v4 or int4";

// "fp32", "bf16", "int8", "k8v4" or "int4".
std::string_view to_string(precision p) noexcept;

// Inverse of to_string(precision); throws mha::invalid_argument listing the valid names.
precision parse_precision(std::string_view name);

// How a rotary embedding stretches its frequencies beyond the context it was trained on
// (docs/design.md §1.6), as Hugging Face's rope_type names them: none ("default"), linear (every
// frequency divided by `factor`), llama3 (Llama 3.1+: wavelengths longer than
// original_context / low_freq_factor divided by `factor`, those shorter than
// original_context / high_freq_factor kept, a linear blend in between), yarn (gpt-oss, Qwen
// long-context: the pairs that turn fewer than beta_slow times over original_context divided by
// `factor`, those that turn more than beta_fast times kept, a linear ramp between, and cos and
// sin scaled by rope_amplitude()).
struct rope_scaling {
  enum class type { none, linear, llama3, yarn };
  type kind = type::none;
  double factor = 1.0;                // linear, llama3 and yarn
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  std::int64_t original_context = 0;  // llama3 and yarn: the original max_position_embeddings
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn: the ramp's ends, in turns
  bool truncate = true;                      // yarn: the ramp's ends rounded out to whole pairs
  double attention_factor = 0.0;             // yarn: 0 for 0.1 ln(factor) + 1
  bool operator==(const rope_scaling&) const = default;
};

// "none", "linear", "llama3" or "yarn".
std::string_view to_string(rope_scaling::type t) noexcept;

// One causal multi-head attention module, described as PyTorch's constructor arguments
// describe it. d_out is the total over all heads; head_dim() = d_out / n_heads; y has
// out_width() features (d_out, or out_features after an out projection that has them).
//
// Valid when: d_in, d_out, n_heads, context_length >= 1; d_out % n_heads == 0;
// n_kv_heads == 0 or it divides n_heads; 0 <= dropout < 1; precision is fp32 or bf16;
// rope_base == 0, or rope_base > 1 and finite with an even head_dim; rope_scaling none (its
// other fields at their defaults), or with a rotary embedding: linear with a finite factor >= 1,
// llama3 with a finite factor >= 1, 0 < low_freq_factor < high_freq_factor (finite) and
// original_context >= 1, yarn with a finite factor >= 1, original_context >= 1, finite
// beta_fast > beta_slow > 0 and a finite attention_factor >= 0; window >= 0 (causal only); softcap
// finite and >= 0; out_features >= 0 (> 0 with out_proj only); qk_norm_eps finite and > 0 with
// qk_norm; every weight tensor's byte count fits in std::int64_t. validate() checks exactly this
// and throws mha::invalid_argument naming the bad value.
struct config {
  std::int64_t d_in = 0;            // features of each input token
  std::int64_t d_out = 0;           // features of each output token (all heads together)
  std::int64_t n_heads = 0;         // H
  std::int64_t context_length = 0;  // largest sequence length run() accepts
  bool causal = true;               // token i attends to tokens j <= i only
  bool qkv_bias = false;            // the Q, K and V projections have biases
  bool out_proj = true;             // a final (d_out, d_out) projection follows the heads
  bool out_proj_bias = true;        // ... with a bias (Llama-style modules have none)
  float dropout =
      0.0f;  // p, applied to attention weights in training mode only (docs/design.md §1.1)
  // Key/value heads (grouped-query attention, docs/design.md §1.3): query head h reads K/V head
  // h / (n_heads / kv_heads()). 0 means n_heads (multi-head attention); 1 is multi-query.
  std::int64_t n_kv_heads = 0;
  mha::precision precision = mha::precision::fp32;
  // Rotary position embedding (docs/design.md §1.6): 0 for none, else its base (10000 in
  // Llama 2, 500000 in Llama 3): each query and key head is rotated by its absolute position
  // after projection, in the rotate-half convention of Hugging Face's Llama.
  double rope_base = 0.0;
  mha::rope_scaling rope_scaling = {};  // with rope_base != 0 only
  // A sliding window (docs/design.md §1.9), causal only: token i attends to tokens
  // i - window < j <= i, its last `window` (its own included); 0 for every earlier token.
  // Mistral's and Qwen2's sliding layers (mha::io reads it from config.json).
  std::int64_t window = 0;
  // Logit soft-capping (docs/design.md §1.9; Gemma 2's attn_logit_softcapping, 50): each scaled
  // score s becomes softcap * tanh(s / softcap) before the mask; 0 for none.
  double softcap = 0.0;
  // Attention sinks (docs/design.md §1.9; gpt-oss): a learned logit per query head, the weights'
  // `sinks`, that joins each of its rows' softmax denominators and contributes no value.
  bool sinks = false;
  // The out projection's features (docs/design.md §1.10): 0 for d_out (out_proj is (d_out,
  // d_out), the seeds' module), else out_proj is (out_features, d_out) and y has out_features
  // columns, as in Gemma, gpt-oss and Mistral NeMo, whose n_heads * head_dim is not the model's
  // hidden size. With out_proj only.
  std::int64_t out_features = 0;
  // Query and key heads RMS-normalised before the rotary embedding (docs/design.md §1.10; Gemma
  // 3, Qwen3): each head's row x becomes x / sqrt(mean(x^2) + qk_norm_eps) * w, w the weights'
  // q_norm or k_norm (head_dim each, shared by the heads).
  bool qk_norm = false;
  double qk_norm_eps = 1e-6;

  // d_out / n_heads; 0 when n_heads is not positive (validate() rejects such a config).
  constexpr std::int64_t head_dim() const noexcept { return n_heads > 0 ? d_out / n_heads : 0; }
  // The K/V heads: n_kv_heads, or n_heads when it is 0.
  constexpr std::int64_t kv_heads() const noexcept { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Rows of the K and V projections: kv_heads() * head_dim() (d_out without grouping).
  constexpr std::int64_t d_kv() const noexcept { return kv_heads() * head_dim(); }
  // Features of each output token: out_features when the out projection has its own, else d_out.
  constexpr std::int64_t out_width() const noexcept {
    return out_proj && out_features > 0 ? out_features : d_out;
  }
  bool operator==(const config&) const = default;
};

// Throws mha::invalid_argument naming the first field that breaks the contract above.
void validate(const config& cfg);

// "d_in=768 d_out=768 n_heads=12 context_length=1024 causal=1 qkv_bias=0 out_proj=1 dropout=0",
// followed by " out_proj_bias=0", " n_kv_heads=K", " rope_base=B", " rope_scaling=" and the
// spelling of rope_scaling_name, " window=W", " softcap=C", " sinks=1", " out_features=N", "
// qk_norm_eps=E" (with qk_norm) and " precision=bf16" when they are not the defaults.
std::string to_string(const config& cfg);

// The rotary embedding's scaling as the canonical problem string spells it (include/mha/
// problem.hpp): "linear<factor>", "llama3_<factor>_<low>_<high>_<original_context>" or
// "yarn_<factor>_<beta_fast>_<beta_slow>_<original_context>_<attention_factor>_<truncate: 0|1>",
// numbers in std::to_chars' shortest form; "" for none. parse_rope_scaling is its inverse (nullopt
// for a text that is not such a spelling; the values are not validated).
std::string rope_scaling_name(const rope_scaling& s);
std::optional<rope_scaling> parse_rope_scaling(std::string_view name);

// The rotary embedding's inverse frequencies of `cfg` (docs/design.md §1.6), one per pair
// e < head_dim / 2: base^(-2e / head_dim), then scaled by cfg.rope_scaling as Hugging Face's
// rope types define it (linear: / factor; llama3: by wavelength 2 pi / f against
// original_context / low_freq_factor and / high_freq_factor). In double; empty without a rotary
// embedding. A position pos turns pair e by the angle pos * f_e.
std::vector<double> rope_frequencies(const config& cfg);
// The factor yarn scales cos and sin by: attention_factor, or 0.1 ln(factor) + 1 when that is 0
// (1 for factor <= 1); 1 for every other scaling and without a rotary embedding.
double rope_amplitude(const config& cfg);

// How a backend computes the module. All compute the same function (docs/design.md §1).
enum class formulation {
  // H independent heads, each with its own separately allocated (head_dim, d_in) Q weights and
  // its K/V group's (head_dim, d_in) K/V weights, computed once per group: H small Q projections
  // and n_kv_heads small K and V projections, outputs concatenated.
  wrapper,
  // One (d_out, d_in) projection for Q and one (d_kv, d_in) each for K and V, viewed as heads,
  // batched attention, heads merged.
  split_weight,
  // One (d_out + 2 d_kv, d_in) projection for Q, K and V together (the fused in_proj of
  // nn.MultiheadAttention and GPT-2's c_attn), then as split_weight.
  fused_qkv,
};

// Every formulation, in the order above: what tests, benchmarks and commands iterate.
std::span<const formulation> formulations() noexcept;

// "wrapper", "split_weight" or "fused_qkv".
std::string_view to_string(formulation f) noexcept;

// Inverse of to_string(formulation); throws mha::invalid_argument listing the valid names.
formulation parse_formulation(std::string_view name);

}  // namespace mha
