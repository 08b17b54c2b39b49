// The ISA-neutral half of the xsimd kernels: packing, workspace geometry, the single-threaded
// attention loop, and the choice of ISA. Compiled with the baseline flags.
#include "backends/xsimd/kernels.hpp"

#include <algorithm>
#include <numeric>

#include "backends/xsimd/isa_table.hpp"

namespace mha::detail {
namespace {

constexpr std::int64_t round_up(std::int64_t x, std::int64_t multiple) noexcept {
  return (x + multiple - 1) / multiple * multiple;
}

// Scratch parts start on a cache line (and an AVX-512 register boundary).
constexpr std::int64_t line_floats = 16;

// Query rows per attention block: its scores (rows x seq_len) stay in L2 next to the head's
// packed K^T and V while its three stages run. Attention alone, split form, one core, ms:
//   rows per block           16     32     64    128
//   B1 T1024 d768 H12      20.9   20.4   19.9   20.3
//   B4 T256  d768 H12       7.5    6.4    6.4    6.4
//   B1 T4096 d768 H12       276    278    281      -   (1 MB of scores at 64 rows: still fine)
constexpr std::int64_t attention_block_rows = 64;

}  // namespace

void pack_panels(const float* src, std::int64_t k, std::int64_t n, std::int64_t stride_k,
                 std::int64_t stride_n, int nr, float* dst) noexcept {
  for (std::int64_t first = 0; first < n; first += nr, dst += k * nr) {
    const std::int64_t cols = std::min<std::int64_t>(nr, n - first);
    if (stride_n == 1) {
      // Rows of B are contiguous: copy row segments.
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const float* row = src + kk * stride_k + first;
        std::copy(row, row + cols, dst + kk * nr);
        std::fill(dst + kk * nr + cols, dst + (kk + 1) * nr, 0.0f);
      }
    } else {
      // Columns of B are contiguous (B is a transposed matrix, e.g. nn.Linear's W): read them
      // whole.
      for (std::int64_t c = 0; c < cols; ++c) {
        const float* col = src + (first + c) * stride_n;
        for (std::int64_t kk = 0; kk < k; ++kk) dst[kk * nr + c] = col[kk * stride_k];
      }
      for (std::int64_t kk = 0; kk < k; ++kk)
        std::fill(dst + kk * nr + cols, dst + (kk + 1) * nr, 0.0f);
    }
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

std::int64_t attention_layout::head_floats() const noexcept {
  return values_offset() + packed_size(seq_len, head_dim, values.nr);
}

std::int64_t attention_layout::scratch_floats() const noexcept {
  return round_up(padded_rows * head_dim, line_floats) +
         round_up(padded_rows * score_cols, line_floats) + round_up(padded_rows, line_floats) +
         round_up(seq_len, line_floats);
}

attention_scratch attention_layout::scratch_parts(float* scratch) const noexcept {
  attention_scratch parts{};
  parts.queries = scratch;
  parts.scores = parts.queries + round_up(padded_rows * head_dim, line_floats);
  parts.inv_sums = parts.scores + round_up(padded_rows * score_cols, line_floats);
  parts.dropout = parts.inv_sums + round_up(padded_rows, line_floats);
  return parts;
}

void pack_head(const attention_args& args, const attention_layout& layout, std::int64_t b,
               std::int64_t h, float* head) noexcept {
  // K^T (head_dim, seq_len): element (d, j) is K[j][d]. A transpose copy, and worth it: S = Q K^T
  // of one (1024, 64) head on the split form's strided rows took 1.4 ms packing included, the
  // transpose-free form (4x4 blocks of dot products over head_dim, one horizontal add per
  // score) 2.7 ms (Zen4, AVX-512).
  pack_panels(args.k.row(b, h, 0), layout.head_dim, layout.seq_len, /*stride_k=*/1,
              args.k.row_stride, layout.scores.nr, head);
  // V (seq_len, head_dim) as it is.
  pack_panels(args.v.row(b, h, 0), layout.seq_len, layout.head_dim, args.v.row_stride,
              /*stride_n=*/1, layout.values.nr, head + layout.values_offset());
}

int isa_kernels::panel_width(std::int64_t n) const noexcept {
  int best = tiles[0].nr;
  for (int t = 1; t < tile_count; ++t) {
    if (round_up(n, tiles[t].nr) < round_up(n, best)) best = tiles[t].nr;
  }
  return best;
}

tile_shape isa_kernels::tile_for(int nr) const noexcept {
  for (int t = 0; t < tile_count; ++t) {
    if (tiles[t].nr == nr) return tiles[t];
  }
  return tiles[0];
}

attention_layout isa_kernels::layout(std::int64_t seq_len, std::int64_t head_dim) const noexcept {
  attention_layout l;
  l.scores = tiles[0];
  l.values = tile_for(panel_width(head_dim));
  l.seq_len = seq_len;
  l.head_dim = head_dim;
  l.block_rows = std::min(seq_len, attention_block_rows);
  l.padded_rows =
      std::max(round_up(l.block_rows, l.scores.mr), round_up(l.block_rows, l.values.mr));
  // Row vectors of the softmax read whole registers: room up to a multiple of the lanes too.
  l.score_cols = round_up(seq_len, std::lcm(l.scores.nr, lanes));
  return l;
}

const isa_kernels& kernels_for(xsimd_isa isa) noexcept {
  switch (isa) {
    case xsimd_isa::avx512:
      return *kernel_table{}(xsimd::avx512bw{});
    case xsimd_isa::avx2:
      return *kernel_table{}(xsimd::fma3<xsimd::avx2>{});
    case xsimd_isa::sse2:
      break;
  }
  return *kernel_table{}(xsimd::sse2{});
}

bool cpu_runs(xsimd_isa isa) noexcept {
  switch (isa) {
    case xsimd_isa::avx512:
      return __builtin_cpu_supports("x86-64-v4");
    case xsimd_isa::avx2:
      return __builtin_cpu_supports("x86-64-v3");
    case xsimd_isa::sse2:
      return true;  // the x86-64 baseline
  }
  return false;
}

xsimd_isa best_isa() noexcept {
  static const xsimd_isa best = [] {
    auto isa = xsimd::dispatch<kernel_archs>(kernel_table{})()->isa;
    while (!cpu_runs(isa)) isa = static_cast<xsimd_isa>(static_cast<int>(isa) + 1);
    return isa;
  }();
  return best;
}

void attention(const isa_kernels& kernels, const attention_args& args) {
  const attention_layout layout = kernels.layout(args.seq_len, args.head_dim);
  float_buffer head(static_cast<std::size_t>(layout.head_floats()));
  float_buffer scratch(static_cast<std::size_t>(layout.scratch_floats()));
  for (std::int64_t b = 0; b < args.batch; ++b) {
    for (std::int64_t h = 0; h < args.heads; ++h) {
      pack_head(args, layout, b, h, head.data());
      for (std::int64_t i = 0; i < args.seq_len; i += layout.block_rows) {
        kernels.attention_rows(args, layout, head.data(), b, h, i,
                               std::min(i + layout.block_rows, args.seq_len), scratch.data());
      }
    }
  }
}

}  // namespace mha::detail
