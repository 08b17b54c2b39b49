// The GEMM framework of the SIMD kernels: packing B into panels, and the loop over the heads of a
// head-major projection. Compiled with the baseline flags.
#include "simd/gemm.hpp"

#include <algorithm>

#include "simd/isa_kernels.hpp"

namespace mha::detail {

void pack_block(const float* src, std::int64_t stride_k, std::int64_t stride_n, std::int64_t k,
                std::int64_t k0, std::int64_t k1, std::int64_t n0, std::int64_t n1, int nr,
                float* dst) noexcept {
  for (std::int64_t nn = n0; nn < n1;) {
    const std::int64_t offset = nn % nr, cols = std::min<std::int64_t>(nr - offset, n1 - nn);
    float* panel = dst + nn / nr * k * nr + offset;
    const float* from = src + (nn - n0) * stride_n;
    if (stride_n == 1) {
      // Rows of B are contiguous: copy row segments.
      for (std::int64_t kk = k0; kk < k1; ++kk) {
        const float* row = from + (kk - k0) * stride_k;
        std::copy(row, row + cols, panel + kk * nr);
      }
    } else {
      // Columns of B are contiguous (B is a transposed matrix, e.g. nn.Linear's W, or K^T):
      // read them whole.
      for (std::int64_t c = 0; c < cols; ++c) {
        const float* col = from + c * stride_n;
        for (std::int64_t kk = k0; kk < k1; ++kk) panel[kk * nr + c] = col[(kk - k0) * stride_k];
      }
    }
    nn += cols;
  }
}

void pack_panels(const float* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                 std::int64_t stride_n, int nr, float* dst) noexcept {
  pack_block(src, stride_k, stride_n, k, 0, k, 0, n, nr, dst);
  // The last panel's columns past n are zero.
  if (const std::int64_t cols = n % nr; cols != 0) {
    float* last = dst + n / nr * k * nr;
    for (std::int64_t kk = 0; kk < k; ++kk)
      std::fill(last + kk * nr + cols, last + (kk + 1) * nr, 0.0f);
  }
}

packed_matrix::packed_matrix(const float* weight, const float* bias, std::int64_t n, std::int64_t k,
                             int nr)
    : data_(static_cast<std::size_t>(packed_size(k, n, nr))), k_(k), n_(n), nr_(nr) {
  pack_panels(weight, k, n, /*stride_k=*/1, /*stride_n=*/k, nr, data_.data());
  if (bias != nullptr) {
    bias_ = float_buffer(static_cast<std::size_t>(round_up(n, nr)));
    std::copy(bias, bias + n, bias_.data());
    std::fill(bias_.data() + n, bias_.data() + bias_.size(), 0.0f);
  }
}

panels_view packed_matrix::view() const noexcept {
  return {data_.data(), bias_.size() > 0 ? bias_.data() : nullptr, k_, n_, nr_};
}

void gemm(const isa_kernels& kernels, const head_major_gemm& g) noexcept {
  for (std::int64_t bb = 0; bb < g.batch; ++bb) {
    for (std::int64_t h = 0; h < g.heads; ++h) {
      kernels.gemm(g.head(bb, h), 0, g.seq_len, h * g.panels_per_head(),
                   (h + 1) * g.panels_per_head());
    }
  }
}

}  // namespace mha::detail
