// The GEMM framework of the SIMD kernels: packing B into panels, and the loop over the heads of a
// head-major projection. Compiled with the baseline flags.
#include "kernels/interface/gemm.hpp"

#include <algorithm>

// transpose_4x4 and copy_4: this architecture's (kernels/arch/<arch>/arch_block.hpp).
#include "arch_block.hpp"
#include "base/bf16.hpp"
#include "kernels/interface/isa_kernels.hpp"

namespace mha::detail {

void pack_block(const float* src, std::int64_t stride_k, std::int64_t stride_n, std::int64_t k,
                std::int64_t k0, std::int64_t k1, std::int64_t n0, std::int64_t n1, int nr,
                float* dst) noexcept {
  for (std::int64_t nn = n0; nn < n1;) {
    const std::int64_t offset = nn % nr, cols = std::min<std::int64_t>(nr - offset, n1 - nn);
    float* panel = dst + nn / nr * k * nr + offset;
    const float* from = src + (nn - n0) * stride_n;
    if (stride_n == 1) {
      // Rows of B are contiguous: copy row segments, inline (segments of a panel's width, 8
      // to 32 floats: a call of memmove each cost 1-2% of the attention core at head_dim 8).
      for (std::int64_t kk = k0; kk < k1; ++kk) {
        const float* row = from + (kk - k0) * stride_k;
        float* to = panel + kk * nr;
        std::int64_t c = 0;
        for (; c + 4 <= cols; c += 4) copy_4(row + c, to + c);
        for (; c < cols; ++c) to[c] = row[c];
      }
    } else {
      // Columns of B are contiguous (B is a transposed matrix, e.g. nn.Linear's W, or K^T):
      // 4 x 4 blocks transposed in registers, the rest element by element.
      std::int64_t c = 0;
      if (stride_k == 1) {
        for (; c + 4 <= cols; c += 4) {
          const float* col = from + c * stride_n;
          std::int64_t kk = k0;
          for (; kk + 4 <= k1; kk += 4)
            transpose_4x4(col + (kk - k0), stride_n, panel + kk * nr + c, nr);
          for (; kk < k1; ++kk) {
            for (int i = 0; i < 4; ++i) panel[kk * nr + c + i] = col[i * stride_n + (kk - k0)];
          }
        }
      }
      for (; c < cols; ++c) {
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

void pack_pair_block(const float* src, std::int64_t stride_k, std::int64_t stride_n, std::int64_t k,
                     std::int64_t k0, std::int64_t k1, std::int64_t n0, std::int64_t n1, int nr,
                     bf16_pair* dst) noexcept {
  const std::int64_t panel = pairs(k) * nr;
  const auto at = [&](std::int64_t kk, std::int64_t nn) {
    return bf16_pair{to_bf16(src[(kk - k0) * stride_k + (nn - n0) * stride_n])};
  };
  // Pairs whose two halves are both in [k0, k1) are written whole, the one or two at the ends
  // half (the other half kept).
  const std::int64_t whole_begin = k0 + k0 % 2, whole_end = k1 - (k1 - whole_begin) % 2;
  const auto edges = [&](std::int64_t nn, bf16_pair* column) {
    if (k0 % 2 != 0 && k0 < k1) {
      bf16_pair& word = column[k0 / 2 * nr];
      word = (word & 0x0000ffffu) | at(k0, nn) << 16;
    }
    if (whole_end < k1) {
      bf16_pair& word = column[whole_end / 2 * nr];
      word = (word & 0xffff0000u) | at(whole_end, nn);
    }
  };
  if (stride_n == 1) {
    // Rows of B contiguous (V): a pair of rows at a time, along the row a panel's columns at a
    // time, so reads and writes both run through memory and the loop vectorises (indexing
    // each word by nn / nr and nn % nr kept it scalar: 18% of a bf16 attention's time).
    for (std::int64_t kk = whole_begin; kk < whole_end; kk += 2) {
      const float* even = src + (kk - k0) * stride_k - n0;  // element nn at even[nn]
      const float* odd = even + stride_k;
      for (std::int64_t nn = n0; nn < n1;) {
        const std::int64_t p = nn / nr, end = std::min(n1, (p + 1) * nr);
        bf16_pair* out = dst + p * panel + kk / 2 * nr - p * nr;  // word of nn at out[nn]
        for (; nn < end; ++nn)
          out[nn] = bf16_pair{to_bf16(even[nn])} | bf16_pair{to_bf16(odd[nn])} << 16;
      }
    }
    for (std::int64_t nn = n0; nn < n1; ++nn) edges(nn, dst + nn / nr * panel + nn % nr);
    return;
  }
  // Columns of B contiguous (nn.Linear's W, K^T): a column's pairs converted in a run, then
  // stored a panel row apart.
  constexpr std::int64_t run = 128;
  bf16_pair converted[run];
  for (std::int64_t nn = n0; nn < n1; ++nn) {
    bf16_pair* column = dst + nn / nr * panel + nn % nr;
    for (std::int64_t kk = whole_begin; kk < whole_end; kk += 2 * run) {
      const std::int64_t count = std::min(run, (whole_end - kk) / 2);
      for (std::int64_t i = 0; i < count; ++i)
        converted[i] = at(kk + 2 * i, nn) | at(kk + 2 * i + 1, nn) << 16;
      for (std::int64_t i = 0; i < count; ++i) column[(kk / 2 + i) * nr] = converted[i];
    }
    edges(nn, column);
  }
}

void pack_pair_panels(const float* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                      std::int64_t stride_n, int nr, bf16_pair* dst,
                      pair_block_packer pack) noexcept {
  std::fill(dst, dst + pairs(k) * round_up(n, nr), bf16_pair{0});
  pack(src, stride_k, stride_n, k, 0, k, 0, n, nr, dst);
}

void pack_pair_panels(const bf16* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                      std::int64_t stride_n, int nr, bf16_pair* dst) noexcept {
  std::fill(dst, dst + pairs(k) * round_up(n, nr), bf16_pair{0});
  const std::int64_t panel = pairs(k) * nr;
  // Pair (kk / 2, nn) from elements kk and kk + 1 (the low half the even one). Rows of B
  // contiguous (V, stride_n 1): a pair of rows at a time along them, which vectorises; else
  // (K^T, a column of B contiguous) a column at a time, its pairs one 32-bit word each.
  const auto word = [&](const bf16* even, std::int64_t kk) {
    const bf16 odd = kk + 1 < k ? even[stride_k] : bf16{0};
    return even[0] | static_cast<bf16_pair>(odd) << 16;
  };
  if (stride_n == 1) {
    for (std::int64_t kk = 0; kk < k; kk += 2) {
      const bf16* row = src + kk * stride_k;
      for (std::int64_t nn = 0; nn < n;) {
        const std::int64_t p = nn / nr, end = std::min(n, (p + 1) * nr);
        bf16_pair* out = dst + p * panel + kk / 2 * nr - p * nr;  // word of nn at out[nn]
        for (; nn < end; ++nn) out[nn] = word(row + nn, kk);
      }
    }
  } else {
    for (std::int64_t nn = 0; nn < n; ++nn) {
      const bf16* column = src + nn * stride_n;
      bf16_pair* out = dst + nn / nr * panel + nn % nr;
      for (std::int64_t kk = 0; kk < k; kk += 2)
        out[kk / 2 * nr] = word(column + kk * stride_k, kk);
    }
  }
}

packed_matrix::packed_matrix(const float* weight, const float* bias, std::int64_t n, std::int64_t k,
                             int nr, bool bf16_pairs)
    : k_(k), n_(n), nr_(nr), bf16_(bf16_pairs) {
  if (bf16_pairs) {
    pairs_ = aligned_buffer<bf16_pair>(static_cast<std::size_t>(pairs(k) * round_up(n, nr)));
    pack_pair_panels(weight, k, n, /*stride_k=*/1, /*stride_n=*/k, nr, pairs_.data());
  } else {
    data_ = float_buffer(static_cast<std::size_t>(packed_size(k, n, nr)));
    pack_panels(weight, k, n, /*stride_k=*/1, /*stride_n=*/k, nr, data_.data());
  }
  if (bias != nullptr) {
    bias_ = float_buffer(static_cast<std::size_t>(round_up(n, nr)));
    for (std::int64_t i = 0; i < n; ++i)
      bias_.data()[i] = bf16_pairs ? round_bf16(bias[i]) : bias[i];
    std::fill(bias_.data() + n, bias_.data() + bias_.size(), 0.0f);
  }
}

panels_view packed_matrix::view() const noexcept {
  return {data_.data(), bias_.size() > 0 ? bias_.data() : nullptr, k_, n_, nr_};
}

pair_panels_view packed_matrix::pair_view() const noexcept {
  return {pairs_.data(), bias_.size() > 0 ? bias_.data() : nullptr, pairs(k_), n_, nr_};
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
