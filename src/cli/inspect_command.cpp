// mha inspect: what a Hugging Face model folder's config says, and where each layer's attention
// block lies, without reading any tensor data.
#include <cstdio>
#include <string>
#include <tuple>

#include "cli/arguments.hpp"
#include "io/common.hpp"
#include "mha/io.hpp"

namespace mha_cli {
namespace {

// A number as a config writes it: 500000, 0.5.
std::string number(double v) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%.15g", v);
  return digits;
}

// "base 500000, llama3 scaling (factor 8, low_freq_factor 1, high_freq_factor 4, original
// context 8192)", or "none".
std::string rope_text(const mha::config& cfg) {
  if (cfg.rope_base == 0.0) return "none";
  const mha::rope_scaling& s = cfg.rope_scaling;
  const std::string base = "base " + number(cfg.rope_base);
  switch (s.kind) {
    case mha::rope_scaling::type::none:
      return base;
    case mha::rope_scaling::type::linear:
      return base + ", linear scaling (factor " + number(s.factor) + ")";
    case mha::rope_scaling::type::llama3:
      return base + ", llama3 scaling (factor " + number(s.factor) + ", low_freq_factor " +
             number(s.low_freq_factor) + ", high_freq_factor " + number(s.high_freq_factor) +
             ", original context " + std::to_string(s.original_context) + ")";
    case mha::rope_scaling::type::yarn:
      return base + ", yarn scaling (factor " + number(s.factor) + ", beta_fast " +
             number(s.beta_fast) + ", beta_slow " + number(s.beta_slow) + ", original context " +
             std::to_string(s.original_context) + ", attention factor " +
             number(mha::rope_amplitude(cfg)) + (s.truncate ? "" : ", not truncated") + ")";
  }
  return base;
}

int inspect_model(const arguments& a) {
  using mha::io::detail::escaped;  // file content (a dtype, a shard's name) may hold escapes
  const std::string& dir = a.required("model");
  const mha::io::model_folder m = mha::io::read_model_folder(dir);
  const mha::config& cfg = m.cfg;
  std::printf("%s: %s model (%s layout), %lld layers, dtype %s\n", escaped(dir).c_str(),
              m.model_type.c_str(), std::string(mha::io::to_string(m.layout)).c_str(),
              static_cast<long long>(m.layers),
              m.dtype.empty() ? "not stated" : escaped(m.dtype).c_str());
  std::printf(
      "  attention: hidden %lld, %lld heads of %lld, %lld K/V heads, %s, %s%s%s\n",
      static_cast<long long>(cfg.d_in), static_cast<long long>(cfg.n_heads),
      static_cast<long long>(cfg.head_dim()), static_cast<long long>(cfg.kv_heads()),
      cfg.causal ? "causal" : "not causal", cfg.qkv_bias ? "Q/K/V biases" : "no Q/K/V biases",
      cfg.out_proj_bias ? ", output bias" : ", no output bias", cfg.qk_norm ? ", q/k norms" : "");
  std::printf("  rotary embedding: %s; max positions %lld\n", rope_text(cfg).c_str(),
              static_cast<long long>(cfg.context_length));
  // One line per layer: read_model_folder checked that each has its block among the tensors, so
  // the output is bounded by the files, whatever num_hidden_layers says.
  for (std::int64_t layer = 0; layer < m.layers; ++layer) {
    std::string files;
    for (const std::string& f : m.block_file_names(layer)) {
      files += (files.empty() ? "" : ", ") + escaped(f);
    }
    const std::int64_t window = m.windows[static_cast<std::size_t>(layer)];
    const std::string windowed = window > 0 ? "; " + m.window_key + " " + std::to_string(window) +
                                                  " (each token attends to its last " +
                                                  std::to_string(window) + " keys)"
                                            : "";
    // A layer rotating by its own embedding (Gemma 3's sliding layers).
    mha::config own = cfg;
    std::tie(own.rope_base, own.rope_scaling) = m.ropes[static_cast<std::size_t>(layer)];
    const std::string rope = own == cfg ? "" : "; rotary embedding " + rope_text(own);
    std::printf("  layer %lld: %s in %s%s%s\n", static_cast<long long>(layer),
                m.block_prefix(layer).c_str(), files.c_str(), windowed.c_str(), rope.c_str());
  }
  return 0;
}

}  // namespace

const command& inspect_command() {
  static const command c{
      "inspect",
      "show what a Hugging Face model folder holds, per layer",
      "usage: mha inspect --model DIR\n\n"
      "Reads DIR's config.json (and model.safetensors.index.json) and the safetensors\n"
      "headers, never tensor data, and prints the model type, the attention block every\n"
      "layer has (heads, K/V heads, head_dim, causality, biases, RoPE and its scaling), and\n"
      "each layer's block prefix and file: what `mha run --model DIR --layer N` runs.\n",
      {"model"},
      {},
      inspect_model};
  return c;
}

}  // namespace mha_cli
