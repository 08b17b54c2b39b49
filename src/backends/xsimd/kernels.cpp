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

// Query rows per attention block. Attention alone (head-major Q, K, V), one core, median ms
// over 9 runs at (B, T, H, head_dim) = (1, 1024, 12, 64) / (1, 4096, 12, 64) / (1, 256, 96, 8),
// key tile 512, by rows per block:
//   32: 17.3 / 255 / 2.39   64: 17.2 / 254 / 2.44   96: 17.2 / 255 / 2.34   128: 17.2 / 258 / 2.34
// Within noise; 64 also makes enough parallel tasks (12 heads x 16 blocks at T = 1024).
constexpr std::int64_t attention_block_rows = 64;

}  // namespace

// Keys per online-softmax step. Same measurement, 64 query rows per block, by key tile:
//   128: 17.8 / 261 / 2.51    256: 17.2 / 256 / 2.37    512: 17.1 / 253 / 2.34
//   whole rows (the unfused form): 17.1 / 257 / 2.34   (medians of 3 runs).
// Narrower tiles pay per-tile costs (row maxima, the rescale); 512 keys make a 64 x 512 score
// tile of 128 KB per thread, which stays in L2 between the three stages.
const std::int64_t isa_kernels::default_key_tile = 512;

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

std::int64_t attention_layout::values_offset() const noexcept {
  return round_up(packed_size(head_dim, seq_len, scores.nr), line_floats);
}

std::int64_t attention_layout::head_floats() const noexcept {
  return values_offset() + packed_size(seq_len, head_dim, values.nr);
}

std::int64_t attention_layout::scratch_floats() const noexcept {
  // Row statistics have room for whole registers (exp2_sum runs over them).
  const std::int64_t row_floats = round_up(padded_rows, line_floats);
  return round_up(padded_rows * head_dim, line_floats) +
         round_up(padded_rows * score_cols, line_floats) +
         round_up(padded_rows * acc_cols, line_floats) + 3 * row_floats +
         round_up(score_cols, line_floats);
}

attention_scratch attention_layout::scratch_parts(float* scratch) const noexcept {
  const std::int64_t row_floats = round_up(padded_rows, line_floats);
  attention_scratch parts{};
  parts.queries = scratch;
  parts.scores = parts.queries + round_up(padded_rows * head_dim, line_floats);
  parts.accumulators = parts.scores + round_up(padded_rows * score_cols, line_floats);
  parts.row_max = parts.accumulators + round_up(padded_rows * acc_cols, line_floats);
  parts.row_sum = parts.row_max + row_floats;
  parts.rescale = parts.row_sum + row_floats;
  parts.dropout = parts.rescale + row_floats;
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

attention_layout isa_kernels::layout(std::int64_t seq_len, std::int64_t head_dim,
                                     std::int64_t key_tile) const noexcept {
  attention_layout l;
  l.scores = tiles[0];
  l.values = tile_for(panel_width(head_dim));
  l.seq_len = seq_len;
  l.head_dim = head_dim;
  l.block_rows = std::min(seq_len, attention_block_rows);
  l.padded_rows =
      std::max(round_up(l.block_rows, l.scores.mr), round_up(l.block_rows, l.values.mr));
  // Key tiles start on a K^T panel, and the softmax reads rows as whole registers: both a
  // multiple of the lanes and of the scores panel width.
  const std::int64_t step = std::lcm(l.scores.nr, lanes);
  l.key_tile = round_up(std::max<std::int64_t>(key_tile, 1), step);
  l.score_cols = std::min(l.key_tile, round_up(seq_len, step));
  l.acc_cols = round_up(head_dim, l.values.nr);
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

attention_workspace::attention_workspace(const attention_layout& layout)
    : layout_(layout),
      head_(static_cast<std::size_t>(layout.head_floats())),
      scratch_(static_cast<std::size_t>(layout.scratch_floats())) {}

void attention_workspace::run_block(const isa_kernels& kernels, const attention_args& args,
                                    std::int64_t b, std::int64_t h, std::int64_t block) noexcept {
  if (const std::int64_t head = b * args.heads + h; head != packed_) {
    pack_head(args, layout_, b, h, head_.data());
    packed_ = head;
  }
  const std::int64_t first = block * layout_.block_rows;
  kernels.attention_rows(args, layout_, head_.data(), b, h, first,
                         std::min(first + layout_.block_rows, args.seq_len), scratch_.data());
}

void gemm(const isa_kernels& kernels, const head_major_gemm& g) noexcept {
  for (std::int64_t bb = 0; bb < g.batch; ++bb) {
    for (std::int64_t h = 0; h < g.heads; ++h) {
      kernels.gemm(g.head(bb, h), 0, g.seq_len, h * g.panels_per_head(),
                   (h + 1) * g.panels_per_head());
    }
  }
}

void attention(const isa_kernels& kernels, const attention_args& args, std::int64_t key_tile) {
  const attention_layout layout = kernels.layout(args.seq_len, args.head_dim, key_tile);
  attention_workspace workspace(layout);
  for (std::int64_t b = 0; b < args.batch; ++b) {
    for (std::int64_t h = 0; h < args.heads; ++h) {
      for (std::int64_t block = 0; block < layout.blocks(); ++block)
        workspace.run_block(kernels, args, b, h, block);
    }
  }
}

}  // namespace mha::detail
