// Internal: the oneDNN primitives the backend's kernel set builds, and how to run them on raw
// buffers (which shapes attention asks for: attention_plan.hpp; how a plan keeps them:
// primitive_cache.hpp).
//
// Everything here is built once per shape (and OpenMP team size) and then only executed. Every
// primitive uses a user-managed scratchpad: oneDNN's default (library) scratchpad is shared by the
// primitives of a thread and may only be used from the thread that created them, while user mode is
// thread-safe as long as each execution passes its own scratchpad (oneDNN 2.6,
// dnnl::scratchpad_mode). So a run allocates one scratchpad of the largest size its steps report
// and passes it to each step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "backends/onednn/attention_plan.hpp"
#include "common/buffer.hpp"
#include "mha/weights.hpp"

namespace mha::detail {

// One matmul primitive.
struct matmul_step {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;

  // dst = src * weights (+ bias) (+ the post-op operand `post`), each pointer viewed through the
  // descriptors the step was built with (f32 or bf16 data). `bias` and `post` are null when the
  // step has none.
  void run(dnnl::stream& stream, const void* src, const void* weights, const float* bias,
           float* dst, const float* post, std::byte* scratchpad) const;
};

// One nn.Linear repacked for oneDNN's matmul: W^T as (in, out) in the layout matmul prefers for
// it (asked once per layer; on avx512_core brgemm's BA16a64b, 16 x 64 blocks with `out` padded
// to a multiple of 64, whatever the row count), and the bias as is: faster than W used in place
// (format `ba`, which brgemm repacks block by block on every run) (measurements: docs/design.md
// §5.1).
//
// bf16 (docs/design.md §1.5): the weights repacked as bf16 and the bias rounded to bf16 values
// (kept f32); the step then takes its input x as bf16 (converted by a to_bf16 reorder).
struct packed_linear {
  dnnl::memory weights;     // owns its storage
  std::vector<float> bias;  // (out), or empty for no bias
  bool bf16 = false;

  const void* weight_data() const { return weights.get_data_handle(); }
  const float* bias_data() const { return bias.empty() ? nullptr : bias.data(); }
};

packed_linear pack_linear(const dnnl::engine& engine, const linear_weights& w, bool in_bf16);

// y (rows, out) = x (rows, in) W^T + b for `layer`'s shape, weights layout and bias (present or
// not). x (f32, or bf16 for a bf16 layer) and y (f32) contiguous row-major.
matmul_step make_linear(const dnnl::engine& engine, std::int64_t rows, const packed_linear& layer);

// One reorder primitive: the same (batch, heads, seq_len, head_dim) tensor moved between two
// layouts.
struct reorder_step {
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder primitive;

  void run(dnnl::stream& stream, const void* src, void* dst, std::byte* scratchpad) const;
};

// The head split: (batch, seq_len, heads * head_dim) row-major -> (batch, heads, seq_len,
// head_dim) dense. A copy, kept because it measured no slower than reading the heads in place,
// which oneDNN 2.6 runs on gemm:jit (strided heads) or as short matmuls (all heads of a block of
// rows) (measurements: docs/design.md §5.1).
reorder_step make_head_split(const dnnl::engine& engine, std::int64_t batch, std::int64_t seq_len,
                             std::int64_t heads, std::int64_t head_dim);

// An f32 tensor of `dims` read through `strides` (in elements) -> the same tensor as dense
// row-major bf16, rounded to nearest even: a bf16 layer's input, and a bf16 attention's Q, K
// and V gathered from their projections.
reorder_step make_to_bf16(const dnnl::engine& engine, const dnnl::memory::dims& dims,
                          const dnnl::memory::dims& strides);

// The attention core over `group` slices at a time:
//   scores  = scale * Q K^T (+ mask: -inf where a query does not see a key)   batched matmul
//   weights = softmax over the last axis of scores, in place                  softmax_v2
//   out     = weights V                                                       batched matmul
// One execution covers Q, K, V as {1, group, rows | keys, head_dim}, out (dense) as
// {1, group, rows, head_dim} and the scores as {1, group, rows, keys}; the mask is one
// {1, 1, rows, keys} tensor broadcast over the group: the form oneDNN 2.6 keeps on brgemm for
// dense slices (a mask broadcast over the outermost dimension falls back to the reference
// kernel, docs/dependencies.md §2; strided slices run on gemm:jit).
class attention_steps {
 public:
  attention_steps(const dnnl::engine& engine, const attention_geometry& g);

  const attention_geometry& geometry() const noexcept { return g_; }
  // Floats of one group's scores: group * rows * keys.
  std::size_t score_floats() const noexcept {
    return static_cast<std::size_t>(g_.group * g_.rows * g_.keys);
  }

  // Attention for the `group` slices starting at q, k, v (f32, or bf16 in a bf16 geometry) into
  // the dense out. `scores` holds score_buffer_floats(); `mask` is the (rows, keys) additive
  // mask when geometry().mask_per_run; between(weights) runs after softmax, before the weights
  // multiply V (training-mode dropout).
  //
  // bf16 rounds the unnormalised weights exp(s - max), as the design's function does (its
  // fused kernels round P before they know the row's sum): oneDNN's softmax normalises, so
  // each row of weights a is divided by its largest, max_j a_j = 1 / sum (taken before
  // dropout), which gives back exp(s - max) to an fp32 rounding; P V is then multiplied by it.
  template <class Between>
  void run_group(dnnl::stream& stream, const void* q, const void* k, const void* v, float* out,
                 float* scores, std::byte* scratchpad, Between&& between,
                 const float* mask = nullptr) const {
    if (mask == nullptr && mask_.size() > 0) mask = mask_.data();
    scores_.run(stream, q, k, nullptr, scores, mask, scratchpad);
    run_softmax(stream, scores, scratchpad);
    if (!g_.bf16) {
      between(scores);
      context_.run(stream, scores, v, nullptr, out, nullptr, scratchpad);
      return;
    }
    float* largest = scores + score_floats();
    auto* p = reinterpret_cast<std::uint16_t*>(largest + weight_rows());
    row_maxima(scores, largest);
    between(scores);
    unnormalised_bf16(scores, largest, p);
    context_.run(stream, p, v, nullptr, out, nullptr, scratchpad);
    scale_rows(out, largest);
  }
  // Floats run_group's `scores` holds: the scores, and in bf16 each weight row's largest and
  // the bf16 P after them.
  std::size_t score_buffer_floats() const noexcept {
    return g_.bf16 ? score_floats() + weight_rows() + (score_floats() + 1) / 2 : score_floats();
  }

  std::size_t scratchpad_bytes() const;
  // Appends "scores <implementation>", "softmax <...>", "context <...>".
  void describe(std::vector<std::string>& out) const;

 private:
  void run_softmax(dnnl::stream& stream, float* scores, std::byte* scratchpad) const;
  std::size_t weight_rows() const noexcept { return static_cast<std::size_t>(g_.group * g_.rows); }
  // bf16 (run_group): largest[r] = max of weight row r; p = bf16(weights / largest) row by row;
  // out row r *= largest[r].
  void row_maxima(const float* weights, float* largest) const;
  void unnormalised_bf16(const float* weights, const float* largest, std::uint16_t* p) const;
  void scale_rows(float* out, const float* largest) const;

  attention_geometry g_;
  float_buffer mask_;  // the full forward's (rows, rows) causal mask; empty otherwise
  matmul_step scores_, context_;
  dnnl::softmax_v2_forward::primitive_desc softmax_pd_;
  dnnl::softmax_v2_forward softmax_;
};

std::size_t scratchpad_bytes(const dnnl::primitive_desc_base& pd);
// Floats of a scratch lease that hold `bytes` (a scratchpad), rounded up.
constexpr std::size_t floats_holding(std::size_t bytes) noexcept {
  return (bytes + sizeof(float) - 1) / sizeof(float);
}
// "<name> <implementation>", e.g. "projection brg:avx512_core".
std::string describe(const char* name, const dnnl::primitive_desc_base& pd);

}  // namespace mha::detail
