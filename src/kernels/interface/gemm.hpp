// Internal: the GEMM half of the SIMD kernels' framework (ISA-neutral, compiled once): the packed
// B panels the micro-kernels stream, the blocking, and the head-major projection. The per-ISA
// micro-kernels are in micro/gemm_kernel.hpp; isa_kernels.hpp ties them to this framework.
//
// GEMM: C (m, n) = A (m, k) B (k, n) + bias. A is read in place (rows with a stride); B is packed
// once into column panels of `nr` columns, each panel (k, nr) contiguous, so one micro-kernel
// call streams one panel row per reduction step and broadcasts one A element per C row.
//
// Operands come in one of two units (docs/design.md §1.5): float (fp32), or a bf16 pair, the
// bf16 of two consecutive k in one 32-bit word, the even k in the low half (bf16 modules: A is
// converted to pairs once per call, B packed as pairs once per plan). Everything below counts k
// in its unit: a pair panel (k pairs, nr) holds 2k rows of B, and a 32-bit broadcast of A and
// one lane of a panel row feed a dot product of two.
#pragma once

#include <cstdint>

#include "common/attention_args.hpp"
#include "common/buffer.hpp"

namespace mha::detail {

struct isa_kernels;

constexpr std::int64_t round_up(std::int64_t x, std::int64_t multiple) noexcept {
  return (x + multiple - 1) / multiple * multiple;
}

// One register-tile shape of an ISA's micro-kernel: `mr` rows by `nr` columns of C.
struct tile_shape {
  int mr = 0, nr = 0;
};

// One bf16 pair: two bf16 of consecutive k, the even k in the low half.
using bf16_pair = std::uint32_t;

// A packed B of GEMM in unit E (float or bf16_pair): ceil(n / nr) column panels, panel p holding
// columns [p*nr, p*nr + nr) as a (k, nr) row-major block of units at data + p*k*nr, columns
// past n zero. bias: n floats zero-padded to panels*nr, or nullptr for none. Non-owning.
template <class E>
struct panels_of {
  const E* data = nullptr;
  const float* bias = nullptr;
  std::int64_t k = 0, n = 0;  // k in units of E
  int nr = 0;

  std::int64_t panels() const noexcept { return (n + nr - 1) / nr; }
  const E* panel(std::int64_t p) const noexcept { return data + p * k * nr; }
};
using panels_view = panels_of<float>;
using pair_panels_view = panels_of<bf16_pair>;

// Pairs of a k-element dimension: ceil(k / 2).
constexpr std::int64_t pairs(std::int64_t k) noexcept { return (k + 1) / 2; }

// Floats a packing of (k, n) into panels of nr columns occupies.
constexpr std::int64_t packed_size(std::int64_t k, std::int64_t n, int nr) noexcept {
  return k * ((n + nr - 1) / nr) * nr;
}

// Packs B (k, n), element (kk, nn) at src[kk * stride_k + nn * stride_n], into packed_size()
// floats at dst in the panel layout of panels_view. An nn.Linear weight W (n, k) row-major is
// B = W^T: stride_k = 1, stride_n = k. A row-major (k, n) matrix: stride_k = row stride,
// stride_n = 1.
void pack_panels(const float* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                 std::int64_t stride_n, int nr, float* dst) noexcept;

// Writes the block rows [k0, k1) x columns [n0, n1) of a (k, n) B into its packing at dst (as
// pack_panels lays it out), leaving every other element as it is: element (kk, nn) from
// src[(kk - k0) * stride_k + (nn - n0) * stride_n]. How a KV cache grows by a few keys.
void pack_block(const float* src, std::int64_t stride_k, std::int64_t stride_n, std::int64_t k,
                std::int64_t k0, std::int64_t k1, std::int64_t n0, std::int64_t n1, int nr,
                float* dst) noexcept;

// pack_panels and pack_block for bf16 pair panels: element (kk, nn) rounded to bf16 (to_bf16)
// into its half of pair (kk / 2, nn % nr) of panel nn / nr (word p * pairs(k) * nr +
// kk / 2 * nr + nn % nr; the low half for even kk). pack_pair_block leaves every other element
// as it is; pack_pair_panels zeroes the padding (the missing odd k, columns past n), then packs
// the whole of B with `pack` (pack_pair_block, or an ISA's vectorised twin: isa_kernels).
void pack_pair_block(const float* src, std::int64_t stride_k, std::int64_t stride_n, std::int64_t k,
                     std::int64_t k0, std::int64_t k1, std::int64_t n0, std::int64_t n1, int nr,
                     bf16_pair* dst) noexcept;
using pair_block_packer = decltype(&pack_pair_block);
void pack_pair_panels(const float* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                      std::int64_t stride_n, int nr, bf16_pair* dst,
                      pair_block_packer pack = &pack_pair_block) noexcept;
// pack_pair_panels of a B whose elements are bf16 already (base/bf16.hpp): each as it is.
void pack_pair_panels(const bf16* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                      std::int64_t stride_n, int nr, bf16_pair* dst) noexcept;

// An owning packed B with its bias: an nn.Linear prepared once for the GEMM, in fp32 panels or
// (bf16) pair panels; the bias stays float.
class packed_matrix {
 public:
  packed_matrix() = default;
  // weight: nn.Linear's (n, k) row-major; bias: n floats or nullptr. bf16: weight and bias
  // rounded to bf16 (docs/design.md §1.5), the weight packed as pairs.
  packed_matrix(const float* weight, const float* bias, std::int64_t n, std::int64_t k, int nr,
                bool bf16_pairs = false);

  bool bf16() const noexcept { return bf16_; }
  std::int64_t k() const noexcept { return k_; }  // in elements
  panels_view view() const noexcept;              // fp32 only
  pair_panels_view pair_view() const noexcept;    // bf16 only

 private:
  float_buffer data_, bias_;         // fp32 panels, bias
  aligned_buffer<bf16_pair> pairs_;  // bf16 pair panels
  std::int64_t k_ = 0, n_ = 0;
  int nr_ = 0;
  bool bf16_ = false;
};

// The GEMM's blocking (isa_kernels::gemm). A slice of gemm_k_slice steps of k keeps one panel's
// slice of B in L1 (256 x 32 floats = 32 KiB for the widest AVX-512 tile); a group of panels
// whose slices fill gemm_b_block_bytes stays in L2 with the block of A rows (gemm_a_block_bytes
// of that slice) and the block of C they write, so neither A nor C streams from L3 once per
// panel (measurements: docs/design.md §5.1).
inline constexpr std::int64_t gemm_k_slice = 256;
inline constexpr std::int64_t gemm_a_block_bytes = 256 * 1024;
inline constexpr std::int64_t gemm_b_block_bytes = 512 * 1024;

// One GEMM C = A B + bias in unit E: A (m, b.k units) with row stride lda units; C (m, n)
// floats with row stride ldc.
template <class E>
struct gemm_args_of {
  const E* a = nullptr;
  std::int64_t lda = 0;
  panels_of<E> b;
  float* c = nullptr;
  std::int64_t ldc = 0;
  std::int64_t m = 0;
};
using gemm_args = gemm_args_of<float>;
using pair_gemm_args = gemm_args_of<bf16_pair>;

// The split form's projection with C written head-major: C (batch * seq_len, n) = A B + bias
// stored as (batch, heads, seq_len, n / heads), so attention reads each head's rows contiguously
// (strided head rows cost the attention 4% at head_dim 64 and 17% at 32: B4 T256, one core).
// Possible when every head's columns are whole panels of B; the micro-kernels then write each
// head's block as a plain (seq_len, head_dim) matrix. Worth it (applies()) for more than one
// token per sequence: with one (a decode step) the head-major C is the row-major one, and one
// GEMM of `batch` rows reads each weight once where a GEMM per sequence and head read every
// weight once per sequence (B32: 32 times).
struct head_major_gemm {
  const float* a = nullptr;  // (batch * seq_len, b.k), row stride b.k
  panels_view b;
  float* c = nullptr;  // batch * seq_len * b.n floats
  std::int64_t batch = 0, seq_len = 0, heads = 0;

  bool applies() const noexcept { return seq_len > 1 && (b.n / heads) % b.nr == 0; }
  std::int64_t head_dim() const noexcept { return b.n / heads; }
  std::int64_t panels_per_head() const noexcept { return head_dim() / b.nr; }
  // The GEMM of head (bb, h) alone: its seq_len rows of A and, over panels [h, h + 1) *
  // panels_per_head(), its block of C as a (seq_len, head_dim) matrix. Its c points head_dim * h
  // floats before the block (still inside c's buffer), since gemm() offsets by the column.
  gemm_args head(std::int64_t bb, std::int64_t h) const noexcept {
    const std::int64_t hd = head_dim();
    return {a + bb * seq_len * b.k, b.k, b, c + ((bb * heads + h) * seq_len - h) * hd, hd, seq_len};
  }
  head_view<const float> view() const noexcept {
    return {c, heads * seq_len * head_dim(), seq_len * head_dim(), head_dim()};
  }
};

// Every head of g, one after another, on the calling thread.
void gemm(const isa_kernels& kernels, const head_major_gemm& g) noexcept;

}  // namespace mha::detail
