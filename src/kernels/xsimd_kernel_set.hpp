// Internal: the SIMD kernels of one ISA as a kernel set of the shared drivers
// (common/kernel_set.hpp), single-threaded: the xsimd backend's; the tbb backend derives its
// parallel set from it.
#pragma once

#include <optional>

#include "common/kernel_set.hpp"
#include "kernels/interface/isa_kernels.hpp"
#include "mha/weights.hpp"

namespace mha::detail {

template <mha::isa Isa>
class xsimd_kernel_set : public sequential_execution {
 public:
  explicit xsimd_kernel_set(const mha::config& cfg)
      : bf16_(cfg.precision == mha::precision::bf16) {}
  using packed_linear = packed_matrix;

  static const isa_kernels& kernels() noexcept { return kernels_for(Isa); }

  // W (out, in) into column panels of the width that pads `out` least (bf16 pairs in bf16).
  packed_linear pack(const linear_weights& w) const {
    return {w.weight.data(),
            w.has_bias() ? w.bias.data() : nullptr,
            w.out,
            w.in,
            kernels().panel_width(w.out),
            bf16_};
  }
  void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) const {
    with_gemm_args(
        w, x, rows, y, [&](const auto& g) { kernels_gemm(g); },
        [](std::int64_t n, const auto& convert) { convert(0, n); });
  }
  // Head-major where head_major_gemm applies, else nothing (the driver projects row-major); bf16
  // projections are always row-major.
  std::optional<head_view<const float>> project_heads(const packed_linear& w, const float* x,
                                                      std::int64_t batch, std::int64_t seq_len,
                                                      std::int64_t heads, float* y) const {
    if (w.bf16()) return std::nullopt;
    const head_major_gemm g{x, w.view(), y, batch, seq_len, heads};
    if (!g.applies()) return std::nullopt;
    gemm(kernels(), g);
    return g.view();
  }
  // Grouped K/V heads: a group's query heads are stacked in one block (attention.hpp).
  static constexpr bool grouped_kv = true;
  // bf16: weights packed as pairs, x and the attention's operands rounded to pairs.
  static constexpr bool bf16 = true;
  static void attention(const attention_args& args) { detail::attention(kernels(), args); }
  // Decode: the cache holds each head packed as the attention kernel reads it.
  std::int64_t cache_head_bytes(std::int64_t capacity, std::int64_t head_dim,
                                mha::precision kv) const {
    return detail::cache_head_bytes(kernels(), capacity, head_dim, bf16_, kv);
  }
  // ... or of int8 codes, widened in the kernel (docs/design.md §1.7).
  static constexpr bool coded_cache = true;
  // attention_args' window and softcap (docs/design.md §1.9).
  static constexpr bool extensions = true;

 protected:
  // f(the GEMM arguments of x W^T + b): fp32 as it is; bf16 with x rounded to pairs in a buffer
  // of the set's pool, held while f runs. for_rows(rows, convert) calls convert(r0, r1) over
  // row ranges covering [0, rows), each rounding its rows: the parallel set passes its own GEMM
  // and converts in parallel (the rounding is per element, so the result is the same).
  template <class F, class ForRows>
  void with_gemm_args(const packed_linear& w, const float* x, std::int64_t rows, float* y, F&& f,
                      ForRows&& for_rows) const {
    if (!w.bf16()) {
      const panels_view b = w.view();
      f(gemm_args{x, b.k, b, y, b.n, rows});
      return;
    }
    const pair_panels_view b = w.pair_view();
    typename scratch_pool_of<bf16_pair>::lease a(pairs_, static_cast<std::size_t>(rows * b.k));
    for_rows(rows, [&](std::int64_t r0, std::int64_t r1) {
      kernels().to_pairs(x + r0 * w.k(), r1 - r0, w.k(), w.k(), a.data() + r0 * b.k);
    });
    f(pair_gemm_args{a.data(), b.k, b, y, b.n, rows});
  }

 private:
  static void kernels_gemm(const gemm_args& g) { kernels().gemm(g, 0, g.m, 0, g.b.panels()); }
  static void kernels_gemm(const pair_gemm_args& g) {
    kernels().pair_gemm(g, 0, g.m, 0, g.b.panels());
  }

  bool bf16_;
  scratch_pool_of<bf16_pair> pairs_;  // x as bf16 pairs, per concurrent caller
};
static_assert(kernel_set<xsimd_kernel_set<isa::sse2>>);

}  // namespace mha::detail
