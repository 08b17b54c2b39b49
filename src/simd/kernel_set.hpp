// Internal: the SIMD kernels of one ISA as a kernel set of the shared drivers
// (common/driver.hpp), single-threaded: the xsimd backend's; the tbb backend derives its
// parallel set from it.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string_view>

#include "common/driver.hpp"
#include "mha/weights.hpp"
#include "simd/isa_kernels.hpp"

namespace mha::detail {

template <xsimd_isa Isa>
struct xsimd_kernel_set : sequential_execution {
  using packed_linear = packed_matrix;

  static const isa_kernels& kernels() noexcept { return kernels_for(Isa); }

  // W (out, in) into column panels of the width that pads `out` least.
  static packed_linear pack(const linear_weights& w) {
    return {w.weight.data(), w.has_bias() ? w.bias.data() : nullptr, w.out, w.in,
            kernels().panel_width(w.out)};
  }
  static void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) {
    const panels_view b = w.view();
    kernels().gemm({x, b.k, b, y, b.n, rows}, 0, rows, 0, b.panels());
  }
  // Head-major when each head's columns are whole panels (head_major_gemm), else nothing.
  static std::optional<head_view<const float>> project_heads(const packed_linear& w, const float* x,
                                                             std::int64_t batch,
                                                             std::int64_t seq_len,
                                                             std::int64_t heads, float* y) {
    const head_major_gemm g{x, w.view(), y, batch, seq_len, heads};
    if (!head_major_gemm::fits(g.b, heads)) return std::nullopt;
    gemm(kernels(), g);
    return g.view();
  }
  // Grouped K/V heads: a group's query heads are stacked in one block (attention.hpp).
  static constexpr bool grouped_kv = true;
  static void attention(const attention_args& args) { detail::attention(kernels(), args); }
  // Decode: the cache holds each head packed as the attention kernel reads it.
  static std::int64_t cache_head_floats(std::int64_t capacity, std::int64_t head_dim) {
    return detail::cache_head_floats(kernels(), capacity, head_dim);
  }
};

// A driver plan over Set<isa>, the kernel-set template instantiated for the ISA chosen at run
// time (Set<Isa> must be a kernel set for every xsimd_isa).
template <template <xsimd_isa> class Set>
std::unique_ptr<plan> make_isa_plan(xsimd_isa isa, const config& cfg, formulation form,
                                    const weights& w, std::string_view backend_name) {
  switch (isa) {
    case xsimd_isa::avx512:
      return std::make_unique<driver_plan<Set<xsimd_isa::avx512>>>(cfg, form, w, backend_name);
    case xsimd_isa::avx2:
      return std::make_unique<driver_plan<Set<xsimd_isa::avx2>>>(cfg, form, w, backend_name);
    case xsimd_isa::sse2:
      break;
  }
  return std::make_unique<driver_plan<Set<xsimd_isa::sse2>>>(cfg, form, w, backend_name);
}

}  // namespace mha::detail
