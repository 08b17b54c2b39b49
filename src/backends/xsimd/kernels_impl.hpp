// Internal: the bodies of the per-ISA kernels, templates over the xsimd arch. Included only by
// the per-ISA translation units (kernels_avx512.cpp, ...), each compiled with its own -march,
// after defining MHA_XSIMD_ISA_NAMESPACE (avx512, avx2, sse2).
//
// ODR: as Highway does per target, everything here lives in a namespace of its own per ISA.
// A function emitted by two translation units under one name (an inline helper, or a template
// instantiated with the same arguments, e.g. an AVX2-width tile used by both the AVX-512 and the
// AVX2 builds) would be kept once by the linker for every caller, possibly running AVX-512 code
// on a CPU without it (notes/deps.md §4.4). A test checks the objects for such symbols.
#pragma once

#include <cstdint>
#include <limits>

#include "backends/xsimd/isa_table.hpp"
#include "core/dropout.hpp"

#ifndef MHA_XSIMD_ISA_NAMESPACE
#error "define MHA_XSIMD_ISA_NAMESPACE (the ISA's name) before including kernels_impl.hpp"
#endif

namespace mha::detail::MHA_XSIMD_ISA_NAMESPACE {

// A register tile of the micro-kernel: MR rows of C by NV batches of Arch (nr floats).
template <class Arch, int MR, int NV>
struct tile {
  using batch = xsimd::batch<float, Arch>;
  static constexpr int mr = MR, nv = NV, nr = NV * static_cast<int>(batch::size);
};

// The tiles one ISA offers, widest panel first (isa_kernels::tiles lists the same).
template <class... Tiles>
struct tile_list {
  static constexpr tile_shape shapes[] = {{Tiles::mr, Tiles::nr}...};
};

// Calls f(T{}) for the tile T of the list whose panel width is nr.
template <class F, class... Tiles>
void with_tile(tile_list<Tiles...>, int nr, F&& f) noexcept {
  (void)((Tiles::nr == nr ? (f(Tiles{}), true) : false) || ...);
}

// The largest power of two below R (0 for R = 1): the row counts of the edge micro-kernels.
template <int R>
inline constexpr int smaller_rows = [] {
  int p = 1;
  while (2 * p < R) p *= 2;
  return R > 1 ? p : 0;
}();

// The micro-kernel: the (R, T::nr) tile c = init + sum over kk < kc of a(:, kk) b(kk, :).
// a: R rows with stride lda (A read in place, one element broadcast per row and step);
// b: a packed panel, (kc, nr) row-major; init: nr floats added to every row (the bias) or
// nullptr; c: row stride ldc. All R * NV accumulators stay in registers for the whole kc loop.
template <class T, int R>
void micro_kernel(std::int64_t kc, const float* a, std::int64_t lda, const float* b,
                  const float* init, float* c, std::int64_t ldc) noexcept {
  using batch = typename T::batch;
  constexpr int lanes = static_cast<int>(batch::size), nv = T::nv, nr = T::nr;
  batch acc[R][nv];
#pragma GCC unroll 8
  for (int v = 0; v < nv; ++v) {
    const batch start = init ? batch::load_unaligned(init + v * lanes) : batch(0.0f);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) acc[r][v] = start;
  }
  for (std::int64_t kk = 0; kk < kc; ++kk) {
    batch bk[nv];
#pragma GCC unroll 8
    for (int v = 0; v < nv; ++v) bk[v] = batch::load_unaligned(b + kk * nr + v * lanes);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const batch ar(a[r * lda + kk]);
#pragma GCC unroll 8
      for (int v = 0; v < nv; ++v) acc[r][v] = xsimd::fma(ar, bk[v], acc[r][v]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < nv; ++v) acc[r][v].store_unaligned(c + r * ldc + v * lanes);
  }
}

// The micro-kernel writing only the first `cols` columns of its tile (the last panel of an n
// that is not a multiple of nr), through a tile on the stack.
template <class T, int R>
void micro_kernel_cols(std::int64_t kc, const float* a, std::int64_t lda, const float* b,
                       const float* init, float* c, std::int64_t ldc, int cols) noexcept {
  if (cols == T::nr) {
    micro_kernel<T, R>(kc, a, lda, b, init, c, ldc);
    return;
  }
  alignas(64) float part[R * T::nr];
  micro_kernel<T, R>(kc, a, lda, b, init, part, T::nr);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < cols; ++j) c[r * ldc + j] = part[r * T::nr + j];
  }
}

// `rows` rows of one column panel: blocks of R rows, then the remainder in blocks of the
// smaller power-of-two row counts (edge micro-kernels instead of padding A).
template <class T, int R>
void panel_rows(std::int64_t rows, std::int64_t kc, const float* a, std::int64_t lda,
                const float* b, const float* init, float* c, std::int64_t ldc, int cols) noexcept {
  for (; rows >= R; rows -= R, a += R * lda, c += R * ldc)
    micro_kernel_cols<T, R>(kc, a, lda, b, init, c, ldc, cols);
  if constexpr (smaller_rows < R >> 0) {
    if (rows > 0) panel_rows<T, smaller_rows<R>>(rows, kc, a, lda, b, init, c, ldc, cols);
  }
}

// isa_kernels::gemm for one tile shape. Panels outer, rows inner: one (k, nr) panel of B stays
// in L1/L2 while A streams through once per panel. Neither packing A nor blocking k pays on
// Zen4 at our shapes (measured with the single-tile kernels, GFLOP/s at (M,K,N) =
// (1024,768,768) / (1024,768,64): A read in place 114 / 114, packed A 109 / 102; at
// (128,6144,6144) k blocks of 256..1024 lost 5-15% against whole k).
template <class T>
void gemm_panels(const gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
                 std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  const panels_view& b = g.b;
  for (std::int64_t p = panel_begin; p < panel_end; ++p) {
    const std::int64_t first_col = p * T::nr;
    const int cols = static_cast<int>(b.n - first_col < T::nr ? b.n - first_col : T::nr);
    panel_rows<T, T::mr>(row_end - row_begin, b.k, g.a + row_begin * g.lda, g.lda, b.panel(p),
                         b.bias ? b.bias + first_col : nullptr, g.c + row_begin * g.ldc + first_col,
                         g.ldc, cols);
  }
}

template <class Arch, class Tiles>
void gemm(const gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
          std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  with_tile(Tiles{}, g.b.nr, [&](auto t) {
    gemm_panels<decltype(t)>(g, row_begin, row_end, panel_begin, panel_end);
  });
}

// {0, 1, ..., lanes - 1}: compared with a count to mask the lanes past the end of a row.
template <class Arch>
xsimd::batch<float, Arch> lane_index() noexcept {
  using batch = xsimd::batch<float, Arch>;
  alignas(64) float index[batch::size];
  for (std::size_t l = 0; l < batch::size; ++l) index[l] = static_cast<float>(l);
  return batch::load_aligned(index);
}

// isa_kernels::row_max: reads x up to n rounded up to the lanes; lanes past n count as -inf.
// (xsimd 8.1 has no horizontal max: the lanes go through memory.)
template <class Arch>
float row_max(const float* x, std::int64_t n) noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = batch::size;
  const batch minus_inf(-std::numeric_limits<float>::infinity());
  batch m = minus_inf;
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes) m = xsimd::max(m, batch::load_unaligned(x + j));
  if (j < n) {
    const auto inside = lane_index<Arch>() < batch(static_cast<float>(n - j));
    m = xsimd::max(m, xsimd::select(inside, batch::load_unaligned(x + j), minus_inf));
  }
  alignas(64) float lane[lanes];
  m.store_aligned(lane);
  float largest = lane[0];
  for (std::int64_t l = 1; l < lanes; ++l) largest = lane[l] > largest ? lane[l] : largest;
  return largest;
}

// isa_kernels::exp_sum: x[j] = exp(x[j] - shift) for j < n, returns their sum; the lanes past
// n up to the next multiple of the lanes are set to 0 (x has room for them).
template <class Arch>
float exp_sum(float* x, std::int64_t n, float shift) noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = batch::size;
  const batch s(shift);
  batch sum(0.0f);
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    const batch p = xsimd::exp(batch::load_unaligned(x + j) - s);
    p.store_unaligned(x + j);
    sum += p;
  }
  if (j < n) {
    const auto inside = lane_index<Arch>() < batch(static_cast<float>(n - j));
    const batch p =
        xsimd::select(inside, xsimd::exp(batch::load_unaligned(x + j) - s), batch(0.0f));
    p.store_unaligned(x + j);
    sum += p;
  }
  return xsimd::hadd(sum);
}

// The attention of one query-row block, in three stages over scratch (attention_layout):
//   S = (scale Q) K^T        micro-tiles entirely above the diagonal skipped
//   P = exp(S - rowmax)      causal mask as the row length; 1/rowsum kept, dropout applied
//   out = (P V) / rowsum     normalisation fused into the store of the output tile
template <class Arch, class Tiles>
struct attention_block {
  const attention_args& a;
  const attention_layout& l;
  const float* kt;  // packed K^T: head_dim x score_cols
  const float* v;   // packed V: seq_len x head_dim in panels of l.values.nr
  std::int64_t b, h, i0, rows;
  float *q, *s, *inv_sum, *dropout_row;

  // Row r's last column + 1 that any row of its micro-block of `mr` rows reads.
  std::int64_t block_end(std::int64_t r, int mr) const noexcept {
    if (!a.causal) return a.seq_len;
    const std::int64_t end = i0 + (r / mr + 1) * mr;
    return end < a.seq_len ? end : a.seq_len;
  }

  void scale_queries() const noexcept {
    const std::int64_t hd = a.head_dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = a.q.row(b, h, i0 + r);
      for (std::int64_t d = 0; d < hd; ++d) q[r * hd + d] = a.scale * row[d];
    }
    for (std::int64_t e = rows * hd; e < l.padded_rows * hd; ++e) q[e] = 0.0f;
  }

  // Panels outer, micro-blocks inner: a (head_dim, nr) panel of K^T stays in L1.
  template <class T>
  void scores(T) const noexcept {
    const std::int64_t hd = a.head_dim, panels = (block_end(rows - 1, T::mr) + T::nr - 1) / T::nr;
    for (std::int64_t p = 0; p < panels; ++p) {
      for (std::int64_t r = 0; r < rows; r += T::mr) {
        if (p * T::nr >= block_end(r, T::mr)) continue;  // above the diagonal
        micro_kernel<T, T::mr>(hd, q + r * hd, hd, kt + p * hd * T::nr, nullptr,
                               s + r * l.score_cols + p * T::nr, l.score_cols);
      }
    }
  }

  void softmax() const noexcept {
    constexpr std::int64_t lanes = xsimd::batch<float, Arch>::size;
    const int mr = l.values.mr;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = i0 + r, len = a.causal ? i + 1 : a.seq_len;
      float* p = s + r * l.score_cols;
      const float sum = exp_sum<Arch>(p, len, row_max<Arch>(p, len));
      // Zeros up to what the P V micro-kernel reads for this row's micro-block.
      for (std::int64_t j = (len + lanes - 1) / lanes * lanes; j < block_end(r, mr); ++j)
        p[j] = 0.0f;
      if (a.dropout.active()) {
        dropout_multipliers(a.dropout, b, a.first_head + h, i, 0, len, dropout_row);
        for (std::int64_t j = 0; j < len; ++j) p[j] *= dropout_row[j];
      }
      inv_sum[r] = 1.0f / sum;
    }
    // Rows past the block's end that the last micro-block of P V reads.
    const std::int64_t padded = (rows + mr - 1) / mr * mr;
    for (std::int64_t r = rows; r < padded; ++r) {
      for (std::int64_t j = 0; j < block_end(rows - 1, mr); ++j) s[r * l.score_cols + j] = 0.0f;
    }
  }

  template <class T>
  void values(T) const noexcept {
    const std::int64_t hd = a.head_dim, panels = (hd + T::nr - 1) / T::nr;
    alignas(64) float part[T::mr * T::nr];
    for (std::int64_t r = 0; r < rows; r += T::mr) {
      const std::int64_t kc = block_end(r, T::mr);
      const std::int64_t valid_rows = rows - r < T::mr ? rows - r : T::mr;
      for (std::int64_t p = 0; p < panels; ++p) {
        micro_kernel<T, T::mr>(kc, s + r * l.score_cols, l.score_cols, v + p * a.seq_len * T::nr,
                               nullptr, part, T::nr);
        const std::int64_t first = p * T::nr, cols = hd - first < T::nr ? hd - first : T::nr;
        for (std::int64_t rr = 0; rr < valid_rows; ++rr) {
          float* out = a.out.row(b, h, i0 + r + rr) + first;
          const float f = inv_sum[r + rr];
          for (std::int64_t d = 0; d < cols; ++d) out[d] = part[rr * T::nr + d] * f;
        }
      }
    }
  }

  void run() const noexcept {
    scale_queries();
    with_tile(Tiles{}, l.scores.nr, [&](auto t) { scores(t); });
    softmax();
    with_tile(Tiles{}, l.values.nr, [&](auto t) { values(t); });
  }
};

template <class Arch, class Tiles>
void attention_rows(const attention_args& a, const attention_layout& l, const float* head,
                    std::int64_t b, std::int64_t h, std::int64_t row_begin, std::int64_t row_end,
                    float* scratch) noexcept {
  const attention_scratch parts = l.scratch_parts(scratch);
  const attention_block<Arch, Tiles> block{a,
                                           l,
                                           head,
                                           head + l.values_offset(),
                                           b,
                                           h,
                                           row_begin,
                                           row_end - row_begin,
                                           parts.queries,
                                           parts.scores,
                                           parts.inv_sums,
                                           parts.dropout};
  block.run();
}

// The table of one ISA: Arch is its widest arch, Tiles its micro-kernels (which may use
// narrower batches: the AVX-512 build runs 8-float panels with AVX2-width registers).
template <class Arch, class Tiles>
const isa_kernels* kernels_of(xsimd_isa isa) noexcept {
  static const isa_kernels table{isa,
                                 Arch::name(),
                                 static_cast<int>(xsimd::batch<float, Arch>::size),
                                 Tiles::shapes,
                                 static_cast<int>(sizeof(Tiles::shapes) / sizeof(tile_shape)),
                                 &gemm<Arch, Tiles>,
                                 &attention_rows<Arch, Tiles>,
                                 &row_max<Arch>,
                                 &exp_sum<Arch>};
  return &table;
}

}  // namespace mha::detail::MHA_XSIMD_ISA_NAMESPACE
