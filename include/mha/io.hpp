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
#include <span>
#include <string>
#include <string_view>
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
// entry's byte range; the ranges lie in the data, do not overlap and cover it without gaps.
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

// What a state_dict determines: the module's shape and flags, its weights (split layout), and
// which layout the file had. cfg.causal and cfg.dropout are the defaults (true, 0): a
// state_dict does not record them.
struct loaded_module {
  mha::config cfg;
  mha::weights w;
  formulation layout = formulation::split_weight;  // split names or heads.{h}.* names
};

struct state_dict_options {
  // H, or 0 to take it from the metadata key "num_heads" or the number of heads.{h} groups.
  // When several of these are present they must agree.
  std::int64_t n_heads = 0;
  // The largest sequence length, or 0 for the size C of the (C, C) mask buffers. When the file
  // has masks it must not exceed C. With neither, cfg.context_length is 0: set it before
  // preparing a plan.
  std::int64_t context_length = 0;
};

// Maps a PyTorch state_dict to a module. Accepted names, either layout:
//   split:   W_query.weight (d_out, d_in), W_key.weight, W_value.weight, optional W_query.bias,
//            W_key.bias, W_value.bias (d_out) (all three or none: cfg.qkv_bias), optional
//            out_proj.weight (d_out, d_out) with out_proj.bias (d_out) (cfg.out_proj), mask;
//   wrapper: heads.{h}.W_query.weight (head_dim, d_in), ... for h in [0, H), the same bias rule
//            in every head, heads.{h}.mask, optional out_proj.* as above (d_out = H * head_dim).
// Masks are (C, C) and all the same C. Any other name, a missing or mis-shaped tensor, a mixed
// layout, a gap in the head indices or disagreeing head counts is an mha::format_error (an
// mha::invalid_argument when `options` disagree with the file) naming the tensor or value.
// Consumes `file` (moves its values).
loaded_module module_from_state_dict(tensor_file file, const state_dict_options& options = {});

// read_safetensors then module_from_state_dict.
loaded_module load_module(const std::filesystem::path& path,
                          const state_dict_options& options = {});

// The state_dict of the PyTorch module of `layout` with these weights, which
// module_from_state_dict maps back to (cfg, w): the names above, the metadata num_heads, and the
// causal mask buffer(s) triu(ones(C, C), 1) with C = cfg.context_length (one per head in the
// wrapper layout, as PyTorch stores them: C * C floats each). Validates cfg and w first
// (mha::invalid_argument).
tensor_file to_state_dict(const mha::config& cfg, const mha::weights& w, formulation layout);

}  // namespace mha::io
