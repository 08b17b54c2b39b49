// mha run: one forward pass of a module loaded from a state_dict, .npy in, .npy out.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cli/arguments.hpp"
#include "io/common.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"
#include "mha/registry.hpp"

namespace mha_cli {
namespace {

using mha::io::detail::shape_text;

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

// x (batch, tokens, d_in) through a cache of `tokens` tokens in precision `kv`: `prefill` tokens
// in the first call (none when 0), then `chunk` per call; y gets each call's rows in place.
void run_incremental(const mha::plan& plan, const std::vector<float>& x, std::vector<float>& y,
                     std::int64_t batch, std::int64_t tokens, std::int64_t prefill,
                     std::int64_t chunk, mha::precision kv, const mha::run_options& options) {
  const std::int64_t d_in = plan.config().d_in, d_out = plan.config().out_width();
  mha::kv_cache cache = plan.make_cache(batch, tokens, kv);
  std::vector<float> xs, ys;
  for (std::int64_t at = 0; at < tokens;) {
    const std::int64_t t = std::min(at == 0 && prefill > 0 ? prefill : chunk, tokens - at);
    xs.resize(static_cast<std::size_t>(batch * t * d_in));
    ys.resize(static_cast<std::size_t>(batch * t * d_out));
    for (std::int64_t b = 0; b < batch; ++b) {
      std::copy_n(x.begin() + (b * tokens + at) * d_in, t * d_in, xs.begin() + b * t * d_in);
    }
    plan.run({xs.data(), batch, t, d_in}, {ys.data(), batch, t, d_out}, cache, options);
    for (std::int64_t b = 0; b < batch; ++b) {
      std::copy_n(ys.begin() + b * t * d_out, t * d_out, y.begin() + (b * tokens + at) * d_out);
    }
    at += t;
  }
}

int run_module(const arguments& a) {
  const mha::backend& backend =
      a.has("backend") ? mha::require_backend(a.required("backend")) : mha::default_backend();
  const mha::formulation form = mha::parse_formulation(a.text_or("formulation", "split_weight"));
  if (a.has("model") == a.has("weights")) {
    throw usage_error(
        "give the weights with either --model DIR --layer N (a Hugging Face model folder) or "
        "--weights W.safetensors (a state_dict)");
  }
  if (a.has("model") != a.has("layer")) {
    throw usage_error(a.has("model") ? "--model needs --layer N (the attention block of layer N)"
                                     : "--layer applies to --model DIR");
  }
  if (a.has("model") && a.has("prefix")) {
    throw usage_error("--prefix applies to --weights; with --model, --layer picks the block");
  }
  const std::string& input_path = a.required("input");
  const std::string& output_path = a.required("output");
  const mha::run_options options{
      .threads = static_cast<int>(a.integer_or("threads", 0, 0, mha::max_run_threads)),
      .training = a.has("training"),
      .seed = a.unsigned_or("seed", 0)};
  if (a.has("dropout") && !options.training) {
    throw usage_error("--dropout applies in training mode only; add --training");
  }
  const bool incremental = a.has("incremental");
  for (const char* option : {"prefill", "chunk", "kv-precision"}) {
    if (a.has(option) && !incremental) {
      throw usage_error(std::string("--") + option +
                        " applies to incremental runs; add --incremental");
    }
  }

  mha::io::tensor x = mha::io::read_npy(input_path);
  if ((x.shape.size() != 2 && x.shape.size() != 3) ||
      std::find(x.shape.begin(), x.shape.end(), 0) != x.shape.end()) {
    throw mha::invalid_argument(input_path + ": input has shape " + shape_text(x.shape) +
                                ", expected (batch, tokens, d_in) or (tokens, d_in), all >= 1");
  }
  const bool batched = x.shape.size() == 3;
  const std::int64_t batch = batched ? x.shape[0] : 1;
  const std::int64_t tokens = x.shape[batched ? 1 : 0];
  const std::int64_t d_in = x.shape.back();

  mha::io::state_dict_options load{
      .n_heads = a.integer_or("heads", 0, 1, int64_max),
      .n_kv_heads = a.integer_or("kv-heads", 0, 1, int64_max),
      .context_length = a.integer_or("context-length", 0, 1, int64_max),
      .prefix = a.text_or("prefix", "")};
  if (a.has("rope-base")) load.rope_base = a.real_or("rope-base", 0.0);
  const bool model = a.has("model");
  const std::string weights_path = model ? a.required("model") : a.required("weights");
  mha::io::loaded_module m =
      model ? mha::io::load_model(weights_path, a.integer_or("layer", 0, 0, int64_max), load)
            : mha::io::load_module(weights_path, load);
  mha::config cfg = m.cfg;
  if (cfg.context_length == 0) cfg.context_length = tokens;  // no mask, no option: any T
  // A model's context is its max_position_embeddings (or its sliding window); the plan needs the
  // input's tokens only.
  if (model && !a.has("context-length") && tokens <= cfg.context_length)
    cfg.context_length = tokens;
  cfg.causal = m.cfg.causal && !a.has("no-causal");
  cfg.precision = mha::parse_precision(a.text_or("precision", "fp32"));
  // Checked as given: 0.99999999 would round to 1 in float32 and be reported as "dropout (1)".
  const double dropout = a.real_or("dropout", 0.0);
  if (!(dropout >= 0.0 && dropout < 1.0) || static_cast<float>(dropout) >= 1.0f) {
    throw usage_error("--dropout expects a probability in [0, 1), got '" +
                      a.text_or("dropout", "") + "'" +
                      (dropout < 1.0 && dropout >= 0.0
                           ? " (it rounds to 1 in float32; the largest below 1 is 0.99999994)"
                           : ""));
  }
  cfg.dropout = static_cast<float>(dropout);
  if (d_in != cfg.d_in) {
    throw mha::invalid_argument(input_path + ": input has shape " + shape_text(x.shape) +
                                " but the weights in " + weights_path +
                                " take d_in = " + std::to_string(cfg.d_in));
  }
  if (tokens > cfg.context_length) {
    throw mha::invalid_argument(
        input_path + ": input has " + std::to_string(tokens) +
        " tokens, more than context_length " + std::to_string(cfg.context_length) + " (" +
        (m.context_source.empty() ? "the mask buffer of the weights, or --context-length"
                                  : m.context_source) +
        ")");
  }
  if (incremental && m.layout == mha::io::layout::bert && !cfg.causal) {
    throw mha::unsupported(weights_path +
                           ": an encoder's attention (BERT's layout, not causal) has no decode: "
                           "each token sees the whole sequence, which --incremental would feed "
                           "a few tokens at a time; run it without --incremental");
  }

  const std::int64_t prefill = a.integer_or("prefill", 0, 0, tokens);
  const std::int64_t chunk = a.integer_or("chunk", 1, 1, int64_max);
  const mha::precision kv =
      mha::parse_precision(a.text_or("kv-precision", std::string(mha::to_string(cfg.precision))));

  const auto plan = backend.prepare(cfg, form, m.w);
  std::vector<std::int64_t> y_shape = x.shape;
  y_shape.back() = cfg.out_width();
  mha::io::tensor y{y_shape,
                    std::vector<float>(static_cast<std::size_t>(batch * tokens * cfg.out_width()))};
  if (incremental) {
    run_incremental(*plan, x.values, y.values, batch, tokens, prefill, chunk, kv, options);
  } else {
    plan->run({x.values.data(), batch, tokens, d_in},
              {y.values.data(), batch, tokens, cfg.out_width()}, options);
  }
  mha::io::write_npy(output_path, y);

  const std::string how =
      incremental ? " through a KV cache of " + std::string(mha::to_string(kv)) + " (prefill " +
                        std::to_string(prefill) + ", then " + std::to_string(chunk) + " token" +
                        (chunk == 1 ? "" : "s") + " per call)"
                  : "";
  const std::string block = (m.prefix.empty() ? "" : " at '" + m.prefix + "'") +
                            (model ? " of the model in " + weights_path : "");
  std::printf("%s %s, %s-layout weights%s (%s): %s -> %s float32 in %s%s\n",
              std::string(backend.name()).c_str(), std::string(mha::to_string(form)).c_str(),
              std::string(mha::io::to_string(m.layout)).c_str(), block.c_str(),
              mha::to_string(cfg).c_str(), shape_text(x.shape).c_str(), shape_text(y.shape).c_str(),
              output_path.c_str(), how.c_str());
  return 0;
}

}  // namespace

const command& run_command() {
  static const command c{
      "run",
      "run an attention block (a model folder's layer or a state_dict) on an input (.npy)",
      "usage: mha run --model DIR --layer N --input X.npy --output Y.npy [options]\n"
      "       mha run --weights W.safetensors --input X.npy --output Y.npy [options]\n\n"
      "Runs an attention block on X and writes Y (docs/cli.md, \"Weight files\").\n"
      "  --model DIR        a Hugging Face model folder (config.json, model.safetensors or\n"
      "                     model.safetensors.index.json and its shards; gpt2, llama,\n"
      "                     mistral, qwen2, bert, roberta): its config gives heads, K/V heads,\n"
      "                     RoPE (and its scaling) and causality; `mha inspect` shows them\n"
      "  --layer N          with --model: layer N's attention block (0 = the first); Y is the\n"
      "                     block's output before the residual add (and BERT's LayerNorm)\n"
      "  --weights W        a state_dict in one of the layouts (docs/cli.md, \"Weight files\"),\n"
      "                     told apart by its names: split (W_query.weight, ...), wrapper\n"
      "                     (heads.{h}.W_query.weight, ...), torch_mha (in_proj_weight, ...),\n"
      "                     gpt2 (c_attn.weight, ...), llama (q_proj.weight, ...); F32, F16,\n"
      "                     BF16 or F64\n"
      "  --prefix P         the attention block at P in a whole-model checkpoint\n"
      "                     (h.3.attn. in GPT-2's, model.layers.0.self_attn. in Llama's);\n"
      "                     other tensors are not read\n"
      "  --input X          float32 or float64 .npy, (batch, tokens, d_in) or (tokens, d_in)\n"
      "  --output Y         float32 .npy, (batch, tokens, d_out) or (tokens, d_out); d_out\n"
      "                     the module's output width (a model's hidden size)\n"
      "  --backend B        a name from `mha backends` (default: MHA_BACKEND, else the best)\n"
      "  --formulation F    wrapper, split_weight or fused_qkv (default split_weight); each\n"
      "                     runs weights of every layout\n"
      "  --heads H          number of heads, when the file has no metadata num_heads and no\n"
      "                     heads.{h} groups (must agree with them, or with the model's\n"
      "                     config, when it has)\n"
      "  --kv-heads K       K/V heads (grouped-query attention); the K projection's rows\n"
      "                     give them, and the metadata num_kv_heads or num_kv_groups: it\n"
      "                     must agree\n"
      "  --rope-base B      rotary embedding base (0: none), when the file has no metadata\n"
      "                     rope_base or rope_theta (must agree with it when it has); the\n"
      "                     llama layout needs one of them\n"
      "  --no-causal        every token attends to every token (BERT's layout always does)\n"
      "  --context-length N largest tokens accepted (default: the mask buffer's size, else\n"
      "                     any); must not exceed the mask's size or the model's\n"
      "                     max_position_embeddings\n"
      "  --precision P      fp32 or bf16 (default fp32): bf16 rounds the weights and every\n"
      "                     product's operands to bfloat16 and sums in fp32\n"
      "                     (docs/design.md 1.5); the weights are read as stored whatever P is\n"
      "  --threads N        worker threads, 0 = all cores (default 0)\n"
      "  --training         apply dropout to the attention weights\n"
      "  --dropout P        dropout probability in [0, 1) (needs --training)\n"
      "  --seed S           dropout seed (default 0); the mask is the same on every backend\n"
      "  --incremental      feed X through a KV cache as a generation loop would (decode);\n"
      "                     Y is the full forward's (with --no-causal, each call's tokens\n"
      "                     see the tokens fed so far)\n"
      "  --prefill N        with --incremental: the first call takes N tokens (default 0:\n"
      "                     none, chunks from the start); 0 <= N <= tokens\n"
      "  --chunk S          with --incremental: tokens per later call (default 1)\n"
      "  --kv-precision P   with --incremental: the cache keeps keys and values in fp32, bf16,\n"
      "                     int8, k8v4 or int4 (default: the plan's --precision; int8: codes\n"
      "                     with a scale and offset per token, a quarter of fp32's bytes; k8v4:\n"
      "                     int8's keys, 4-bit values in groups of 32, a fifth of fp32's bytes;\n"
      "                     int4: k8v4's values, 4-bit keys per channel of each 64 tokens, the\n"
      "                     newest exact, about a seventh of fp32's bytes)\n",
      {"backend", "formulation", "weights", "model", "layer", "prefix", "input", "output", "heads",
       "kv-heads", "rope-base", "context-length", "precision", "threads", "dropout", "seed",
       "prefill", "chunk", "kv-precision"},
      {"no-causal", "training", "incremental"},
      run_module};
  return c;
}

}  // namespace mha_cli
