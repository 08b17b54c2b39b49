// mha: weight and tensor files. safetensors holds a module's weights (a PyTorch state_dict);
// .npy holds inputs and outputs. Everything is read into memory, checked, and converted to
// float32; a malformed file is an mha::format_error naming the file and the offending value,
// never an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mha/config.hpp"
#include "mha/weights.hpp"

namespace mha::io {

// A dense, row-major float32 tensor. An empty shape is a scalar (one value); a dimension may be
// 0 (no values). Valid when every dimension is >= 0 and values.size() is their product.
struct tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// The content of a safetensors file: tensors by name and the optional "__metadata__" map of
// strings (e.g. "num_heads": "12"). Names are unique; "__metadata__" is not a tensor name.
struct tensor_file {
  std::map<std::string, tensor, std::less<>> tensors;
  std::map<std::string, std::string, std::less<>> metadata;
};

// The largest JSON header parse_safetensors accepts. An attention module's header is a few KB
// (about 150 bytes per tensor); the cap keeps a corrupt length from allocating gigabytes.
inline constexpr std::uint64_t max_safetensors_header_bytes = std::uint64_t{16} << 20;
// The largest .npy header parse_npy accepts (a header is a short dict; numpy writes ~120 bytes).
inline constexpr std::uint64_t max_npy_header_bytes = std::uint64_t{1} << 16;
// The most dimensions a .npy array may have (numpy 2 allows 64, numpy 1 allows 32).
inline constexpr std::size_t max_npy_rank = 64;

// ---- safetensors (https://github.com/huggingface/safetensors) ----
// Layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor data.

// Parses a whole safetensors file held in `bytes`. Reads dtypes F32 (copied), F16, BF16, F64
// (converted to float32, F64 rounding to nearest) and BOOL (0 or 1; PyTorch masks can be bool).
// Checks: the header length fits the file and the cap; the header is a JSON object without
// duplicate keys whose entries have exactly dtype, shape and data_offsets; shapes are
// non-negative integers whose element count times the dtype size (overflow-checked) equals the
// entry's byte range (for every dtype of the format whose size is known: integer and 8-bit float
// types too); the ranges lie in the data, do not overlap and cover it without gaps; every tensor
// has a dtype it reads.
// Throws mha::format_error prefixed by `source` (a file name) naming the first violation.
tensor_file parse_safetensors(std::span<const std::byte> bytes,
                              std::string_view source = "safetensors");

// The safetensors bytes of `file`: tensors as F32 in name order, the header padded with spaces
// to a multiple of 8 bytes (as the reference writer does), "__metadata__" only when present.
// Throws mha::invalid_argument when a tensor is not valid (see `tensor`), or a name is
// "__metadata__" or not UTF-8.
std::vector<std::byte> safetensors_bytes(const tensor_file& file);

// parse_safetensors / safetensors_bytes on a file. Throw mha::error when the file cannot be
// opened, read or written (with the system's reason) or is not a regular file (a directory,
// device or pipe), plus the errors above.
tensor_file read_safetensors(const std::filesystem::path& path);
void write_safetensors(const std::filesystem::path& path, const tensor_file& file);
// read_safetensors keeping only the tensors whose name `keep` accepts (it sees each name of the
// checked header once): the others' data is never read, whatever their dtype (an int64
// position_ids buffer, int8 weights), so one block of a whole-model checkpoint costs that
// block's bytes and memory.
tensor_file read_safetensors(const std::filesystem::path& path,
                             const std::function<bool(std::string_view name)>& keep);

// ---- .npy (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html) ----

// Parses a whole .npy file (format versions 1.0, 2.0 and 3.0) held in `bytes`: dtype '<f4'
// (copied) or '<f8' (rounded to float32), C order. The header dict must have exactly the keys
// descr, fortran_order and shape; the data must be exactly product(shape) elements. Throws
// mha::format_error prefixed by `source`: wrong magic, a header past the end or over
// max_npy_header_bytes, an unsupported dtype, Fortran order, a shape that is not a tuple of at
// most max_npy_rank non-negative integers or whose byte count overflows, missing or trailing
// data.
tensor parse_npy(std::span<const std::byte> bytes, std::string_view source = "npy");

// The .npy bytes of `t` as '<f4' in C order, format version 1.0, the header padded to a
// multiple of 64 bytes as numpy does. Throws mha::invalid_argument when `t` is not valid or has
// more than max_npy_rank dimensions.
std::vector<std::byte> npy_bytes(const tensor& t);

// parse_npy / npy_bytes on a file; errors as for read_safetensors / write_safetensors.
tensor read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, const tensor& t);

// ---- a module's state_dict (docs/design.md §1) ----

// How a file names an attention module's tensors (docs/cli.md, "Weight files"), relative to the
// block's prefix:
//   split      the seeds' MultiHeadAttention and GroupedQueryAttention: W_query.weight
//              (d_out, d_in), W_key.weight and W_value.weight (d_kv, d_in), optional .bias of
//              each (all three or none), optional out_proj.weight (d_out, d_out) with an
//              optional out_proj.bias, optional mask (C, C);
//   wrapper    the seeds' MultiHeadAttentionWrapper: heads.{h}.W_query.weight (head_dim, d_in),
//              heads.{h}.W_key.weight, heads.{h}.W_value.weight (+ .bias, all or none, alike in
//              every head), heads.{h}.mask for h in [0, H), out_proj.* as in split;
//   torch_mha  torch.nn.MultiheadAttention: in_proj_weight (3 d, d) = [Wq; Wk; Wv], optional
//              in_proj_bias (3 d), out_proj.weight (d, d), optional out_proj.bias;
//   gpt2       GPT-2's attention (Conv1D layers, weights stored (in, out)): c_attn.weight
//              (d, 3 d), c_attn.bias, c_proj.weight (d, d), c_proj.bias; the buffers bias
//              (1, 1, C, C) (the causal mask) and masked_bias (ignored);
//   llama      Llama's attention (Hugging Face): q_proj.weight (d_out, d_in), k_proj.weight and
//              v_proj.weight (d_kv, d_in), o_proj.weight (d_out, d_out), biases as in split;
//              the buffer rotary_emb.inv_freq (ignored); rotary embedding always stated;
//              Qwen2's is the same with Q, K and V biases and no o_proj.bias;
//   bert       BERT's, RoBERTa's and MiniLM's (BertSelfAttention + BertSelfOutput's dense),
//              not causal: self.query.weight (d_out, d_in), self.key.weight, self.value.weight
//              (+ .bias, all or none), output.dense.weight (d_out, d_out) with an optional
//              .bias; output.LayerNorm.* (ignored: mha computes the dense layer's output, before
//              dropout, the residual and the LayerNorm).
enum class layout { split, wrapper, torch_mha, gpt2, llama, bert };

// Every layout, in the order above.
std::span<const layout> layouts() noexcept;

// "split", "wrapper", "torch_mha", "gpt2", "llama" or "bert".
std::string_view to_string(layout l) noexcept;

// What a state_dict determines: the module's shape and flags, its weights (split layout, K and
// V of d_kv rows), the layout the file had and where its block was. cfg.causal is the layout's
// (false for bert, an encoder's; true otherwise) and cfg.dropout 0: a state_dict does not record
// them.
struct loaded_module {
  mha::config cfg;
  mha::weights w;
  io::layout layout = layout::split;
  std::string prefix;  // the block's prefix in the file ("" for a file of one module)
  // Where cfg.context_length comes from, for messages about inputs longer than it: set by
  // load_model ("config.json's max_position_embeddings", or the sliding window that bounds what
  // mha computes exactly); empty for a state_dict.
  std::string context_source;
};

// What the file may not say, and which block to take. Each value given must agree with the file
// (metadata, head groups, shapes) where that says it too.
struct state_dict_options {
  // H, or 0 to take it from the metadata key "num_heads" or the number of heads.{h} groups.
  std::int64_t n_heads = 0;
  // K/V heads, or 0: the rows of the K projection over head_dim decide (checked against the
  // metadata "num_kv_heads" or "num_kv_groups", as the seeds call them, when present).
  std::int64_t n_kv_heads = 0;
  // Rotary embedding base (0: none), or nullopt for the metadata "rope_base" or "rope_theta",
  // else none. The llama layout needs one of them (0 included): Llama rotates.
  std::optional<double> rope_base = std::nullopt;
  // The largest sequence length, or 0 for the file's: the size C of its causal mask buffers or
  // its metadata "context_length" (they must agree). It must not exceed the file's. With
  // neither, cfg.context_length is 0: set it before preparing a plan.
  std::int64_t context_length = 0;
  // One attention block of a whole-model checkpoint: the names' common beginning ("h.3.attn."
  // in GPT-2's model.safetensors, "model.layers.0.self_attn." in Llama's; a missing final '.'
  // is added). Empty: the file is one module. Tensors outside the block are ignored.
  std::string prefix = {};
};

// The prefixes under which `names` hold an attention block, sorted: each name of a known
// layout's identifying tensor (W_query, W_key, W_value, in_proj_weight, in_proj_bias,
// c_attn.*, q_proj, k_proj, v_proj) without that tensor's name and, for the wrapper, without
// "heads.{h}.". "" when the names are one module's.
std::vector<std::string> attention_prefixes(std::span<const std::string> names);

// Maps a PyTorch state_dict to a module: picks the block at options.prefix, detects its layout
// from the names, reads its weights (rearranged once into the split layout, so any layout runs
// in any formulation) and resolves H, the K/V heads, the rotary embedding and the context
// length. An mha::format_error names the file and the tensor or value: a name the layout does
// not have, a missing or mis-shaped tensor, two layouts in one block, no layout at all (listing
// the layouts known and their tensors), a gap in the head indices, disagreeing metadata. An
// mha::invalid_argument when `options` disagree with the file, a needed value is missing
// (naming the option that gives it), or the prefix holds no attention block (listing those
// that do). Consumes `file` (moves its values).
loaded_module module_from_state_dict(tensor_file file, const state_dict_options& options = {});

// read_safetensors then module_from_state_dict; with a prefix only that block's tensors are
// read (see read_safetensors with `keep`).
loaded_module load_module(const std::filesystem::path& path,
                          const state_dict_options& options = {});

// The state_dict in `layout` of the module (cfg, w), which module_from_state_dict maps back to
// (cfg, w) (but for causal, which is the layout's): the names above, the metadata num_heads (and
// num_kv_heads when K/V heads are grouped, rope_base when it is not 0 or the layout is llama), and
// the causal mask buffers of C = cfg.context_length where the layout has them (split, one per head
// in wrapper as PyTorch stores them: C * C floats each; gpt2's bias), else the metadata
// context_length (torch_mha, llama, bert). Validates cfg and w first, then that the layout can hold
// them (mha::invalid_argument naming what it cannot): wrapper no grouped K/V heads, torch_mha and
// gpt2 d_in = d_out, no grouped K/V heads and an out_proj, gpt2 every bias, bert an out_proj.
tensor_file to_state_dict(const mha::config& cfg, const mha::weights& w, io::layout layout);

// to_state_dict in the layout of the PyTorch module of each formulation: wrapper (the wrapper),
// split (split_weight), torch_mha (fused_qkv: nn.MultiheadAttention's in_proj).
tensor_file to_state_dict(const mha::config& cfg, const mha::weights& w, formulation form);

// ---- a Hugging Face model folder (docs/cli.md, "Weight files") ----

// The largest config.json and model.safetensors.index.json read_model_folder accepts, and the
// most tensors and shard files an index may name. A config is a few KB; an index about 100 bytes
// per tensor (a 90k-tensor model's is 9 MB, and the largest published ones name under 200k
// tensors in under 200 shards).
inline constexpr std::uint64_t max_model_config_bytes = std::uint64_t{1} << 20;
inline constexpr std::uint64_t max_model_index_bytes = std::uint64_t{64} << 20;
inline constexpr std::int64_t max_model_index_entries = std::int64_t{1} << 20;
inline constexpr std::int64_t max_model_shards = 16384;

namespace detail {
class tensor_index;
}

// What config.json says of one layer's attention block: the model type, its sizes, rotary
// embedding and causality (read_model_folder documents the keys), and the sliding window that
// transformers applies to that layer, if any.
struct model_config {
  std::string model_type;  // gpt2, llama, mistral, qwen2, gemma2, gemma3_text, bert, roberta, ...
  io::layout layout = layout::llama;
  std::int64_t layers = 0;  // num_hidden_layers (n_layer in GPT-2's)
  // Every block's module: d_in = d_out = hidden_size, n_heads, n_kv_heads, causal (false for
  // encoders), rope_base and rope_scaling, context_length = max_position_embeddings, and the
  // biases the model type has (Llama's as attention_bias says), which load_model checks against
  // the tensors.
  mha::config cfg;
  std::string dtype;  // config.json's dtype (torch_dtype in older ones), "" when absent
  // Keys each query sees under the model's own attention in the layer asked for, when that is a
  // sliding window (Mistral's sliding_window, Qwen2's layers past max_window_layers): the last
  // `window` keys, the query's own included; 0 when every earlier key. cfg.window says the same:
  // mha computes it (docs/design.md §1.9).
  std::int64_t window = 0;
  std::string window_key;  // the key that sets it: "sliding_window"
  // Added to the q/k norms' weights as a model folder's tensors hold them: 1 for Gemma, whose
  // norms scale by 1 + weight (config::qk_norm's w), 0 otherwise.
  double qk_norm_offset = 0.0;
};

// config.json's text read as read_model_folder reads it (`source` names it in messages), for
// layer `layer`'s block (its sliding window; the layer is not checked against num_hidden_layers
// here). A key that changes a model type's attention in a way mha does not compute (GPT-2's
// scale_attn_weights false or scale_attn_by_inverse_layer_idx, BERT's relative position
// embeddings, a partial rotary embedding, an unknown rope type, a layer type other than full or
// sliding attention) is an mha::invalid_argument naming the key, its value and the model type; a
// value of the wrong type or out of range (rope_theta <= 1, a factor below 1) an
// mha::format_error naming the key. mha.Plan.from_module checks a live module's config here too.
model_config parse_model_config(std::string_view json_text, std::string_view source,
                                std::int64_t layer = 0);

// What a model folder (`save_pretrained`'s output, or a Hugging Face cache snapshot) says about
// its attention blocks: config.json's model type, sizes and rotary embedding, and where each
// layer's block lies among its safetensors files.
struct model_folder {
  std::filesystem::path dir;
  std::string model_type;
  io::layout layout = layout::llama;
  std::int64_t layers = 0;  // num_hidden_layers, each of which has a block among the tensors
  mha::config cfg;          // as model_config's
  std::string dtype;        // config.json's dtype (torch_dtype in older ones), "" when absent
  // The prefix every block name starts with: "" or the head class's ("model.", "transformer.",
  // "bert.", "roberta."), as the tensor names have it.
  std::string root;
  // The safetensors files: model.safetensors, or the shards model.safetensors.index.json names,
  // each resolved to its real path (inside the folder, or a Hugging Face cache repo's blobs),
  // and beside each the name the folder gives it (a snapshot's link name, not its blob's).
  std::vector<std::filesystem::path> files;
  std::vector<std::string> file_names;

  // The prefix of layer `layer`'s attention block: "model.layers.3.self_attn.".
  std::string block_prefix(std::int64_t layer) const;
  // The files holding tensors of that block (one, or the shards the index names for it): their
  // real paths, or their names in the folder.
  std::vector<std::filesystem::path> block_files(std::int64_t layer) const;
  std::vector<std::string> block_file_names(std::int64_t layer) const;

  // Per layer, its sliding window (model_config::window; 0: none), and the key that sets them.
  std::vector<std::int64_t> windows;
  std::string window_key;
  // Per layer, its rotary embedding's base and scaling (Gemma 3's sliding layers have their own;
  // cfg's are the full layers').
  std::vector<std::pair<double, mha::rope_scaling>> ropes;
  double qk_norm_offset = 0.0;  // model_config's
  // Which file holds each tensor, from the index (null for a single file).
  std::shared_ptr<const detail::tensor_index> index;
};

// Reads `dir`'s config.json (parse_model_config) and model.safetensors.index.json when the
// folder has no model.safetensors: the model type (one of model_types(), else an
// mha::invalid_argument listing them), its sizes and rotary embedding (RoPE as transformers 5
// writes it, rope_parameters, and as older configs do, rope_theta and rope_scaling; types
// default, linear and llama3; both present must agree), checked as a plan checks a config: a key
// of the wrong JSON type or out of range, a missing size, heads whose head_dim times count is not
// hidden_size, a key whose attention mha does not compute is an error naming the key and its
// value. Every layer of num_hidden_layers must have its block among the tensors (else an
// mha::format_error naming the first missing block). Files are size-capped before parsing
// (max_model_config_bytes, _index_bytes; an index names at most max_model_index_entries tensors
// in at most max_model_shards files, and is read without building a document of it: peak memory
// about twice its size) and every file named must resolve inside the folder (or, for a snapshot
// of a Hugging Face cache, models--*/snapshots/<rev>/, inside that repo's blobs/), else an
// mha::format_error naming the path (and saying when it is a link that dangles or loops); reads
// only safetensors headers, never tensor data.
model_folder read_model_folder(const std::filesystem::path& dir);

// The model types read_model_folder knows, with their layouts: gpt2 (gpt2), llama, mistral and
// qwen2 (llama), bert, roberta and xlm-roberta (bert).
std::span<const std::string_view> model_types() noexcept;

// Layer `layer`'s attention block of the model in `dir`: read_model_folder, then only the block's
// tensors from only the file(s) holding them, mapped as module_from_state_dict maps a state_dict
// with the config's heads, K/V heads, rotary embedding and context length. `options` are checked
// against the config (a value that disagrees is an mha::invalid_argument naming both), except
// context_length, which may be lower than the config's max_position_embeddings; options.prefix
// must be empty. A layer outside [0, layers) or a tensor missing from its file is an error.
// The context length is options.context_length, else max_position_embeddings, and with a
// sliding window at most the window (where full attention, which mha computes, is the model's):
// a context_length option longer than the window is an mha::invalid_argument naming the key.
loaded_module load_model(const std::filesystem::path& dir, std::int64_t layer,
                         const state_dict_options& options = {});

}  // namespace mha::io
