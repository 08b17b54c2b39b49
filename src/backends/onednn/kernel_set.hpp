// Internal: the oneDNN backend's kernel set, what the shared drivers (driver/driver.hpp) call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/onednn/primitive_cache.hpp"
#include "backends/onednn/primitives.hpp"
#include "backends/onednn/runtime.hpp"
#include "base/bf16.hpp"
#include "common/attention_args.hpp"
#include "common/buffer.hpp"
#include "driver/kv_cache_access.hpp"
#include "mha/backend.hpp"

namespace mha::detail {

// The oneDNN primitives as a kernel set of the shared drivers, sequential between primitives
// (each primitive is threaded by oneDNN's OpenMP runtime):
//   linear:        one matmul with fused bias, on weights packed in oneDNN's preferred layout
//                  (bf16: x first rounded to bf16 by a reorder);
//   project_heads: that matmul into a staging buffer, then a reorder into (batch, heads,
//                  seq_len, head_dim), the layout the attention primitives read a group of
//                  heads from;
//   attention:     attention.hpp: scores, softmax and weights V per group of slices.
// Primitives are built on first use of their shape and team size and kept per plan
// (primitive_caches); every primitive runs on a user scratchpad, taken with the staging,
// scores and output buffers from one lease of the set's scratch pool.
class onednn_kernel_set {
 public:
  explicit onednn_kernel_set(const mha::config& cfg) : bf16_(cfg.precision == precision::bf16) {}
  using packed_linear = detail::packed_linear;

  packed_linear pack(const linear_weights& w) const;
  void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) const;
  // One head is already head-major; more go through the staging buffer and the head split.
  std::optional<head_view<const float>> project_heads(const packed_linear& w, const float* x,
                                                      std::int64_t batch, std::int64_t seq_len,
                                                      std::int64_t heads, float* y) const;

  // Decode: the plain row-major cache in the plan's precision (bf16 elements in bf16), read in
  // place through strided descriptors; no int8 cache (onednn_impl::supports says why).
  std::int64_t cache_head_bytes(std::int64_t capacity, std::int64_t head_dim,
                                mha::precision) const {
    return bf16_ ? row_major_cache::head_bytes<detail::bf16>(capacity, head_dim)
                 : row_major_cache::head_bytes<float>(capacity, head_dim);
  }

  static constexpr bool grouped_kv = true;  // a K/V head's query heads are one slice's rows
  // bf16 matmuls; the backend declines bf16 where oneDNN has no native bf16 kernels
  // (onednn_impl::supports).
  static constexpr bool bf16 = true;

  // The attention of a full forward or, with a cache, of a decode call (attention.hpp).
  void attention(const attention_args& a) const;

  // run_options::threads as the calling thread's OpenMP team size for the run.
  template <class F>
  void run(const run_options& options, F&& f) const {
    const openmp_team team(options.threads);
    f();
  }
  template <class F>
  static void for_each(std::int64_t n, F&& f) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }

  // Introspection (introspection.hpp): primitive_caches::implementations and team_sizes.
  const primitive_caches& primitives() const noexcept { return primitives_; }

 private:
  // A layer's input as its matmul reads it: x itself, or (a bf16 layer) x rounded to bf16 into
  // `floats` floats of staging.
  struct layer_input {
    std::shared_ptr<const reorder_step> rounding;  // null: x as it is
    std::size_t floats = 0;

    std::size_t scratchpad_bytes() const;
    const void* convert(dnnl::stream& stream, const float* x, float* staging,
                        std::byte* scratchpad) const;
  };
  layer_input input_of(const packed_linear& w, std::int64_t rows) const;

  primitive_caches primitives_;
  scratch_pool scratch_;
  bool bf16_;
};

}  // namespace mha::detail
