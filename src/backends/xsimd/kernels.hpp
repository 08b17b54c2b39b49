// Internal: the xsimd backend's kernels, for this backend and for the ones that run them in
// parallel (the TBB backend). BLIS's split: the framework here (packing, loops over tiles,
// workspace sizes; ISA-neutral, compiled once) and register-tiled micro-kernels per ISA
// (kernels_impl.hpp, templates over the xsimd arch; one translation unit per ISA instantiates
// them and fills an isa_kernels table).
//
// GEMM: C (m, n) = A (m, k) B (k, n) + bias. A is read in place (rows with a stride); B is packed
// once into column panels of `nr` columns, each panel (k, nr) contiguous, so one micro-kernel
// call streams one panel row per reduction step and broadcasts one A element per C row.
// Attention: per (batch, head), K^T and V are packed into the same panel form; query rows are
// processed in blocks whose scores stay in cache (attention_layout).
#pragma once

#include <cstdint>

#include "common/attention_args.hpp"
#include "common/buffer.hpp"
#include "mha/backends/xsimd.hpp"

namespace mha::detail {

// One register-tile shape of an ISA's micro-kernel: `mr` rows by `nr` columns of C.
struct tile_shape {
  int mr = 0, nr = 0;
};

// A packed B of GEMM: ceil(n / nr) column panels, panel p holding columns [p*nr, p*nr + nr) as a
// (k, nr) row-major block at data + p*k*nr, columns past n zero. bias: n floats zero-padded to
// panels*nr, or nullptr for none. Non-owning.
struct panels_view {
  const float* data = nullptr;
  const float* bias = nullptr;
  std::int64_t k = 0, n = 0;
  int nr = 0;

  std::int64_t panels() const noexcept { return (n + nr - 1) / nr; }
  const float* panel(std::int64_t p) const noexcept { return data + p * k * nr; }
};

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

// An owning packed B with its bias: an nn.Linear prepared once for the GEMM.
class packed_matrix {
 public:
  packed_matrix() = default;
  // weight: nn.Linear's (n, k) row-major; bias: n floats or nullptr.
  packed_matrix(const float* weight, const float* bias, std::int64_t n, std::int64_t k, int nr);

  panels_view view() const noexcept;

 private:
  float_buffer data_, bias_;
  std::int64_t k_ = 0, n_ = 0;
  int nr_ = 0;
};

// The GEMM's blocking (isa_kernels::gemm). A slice of gemm_k_slice steps of k keeps one panel's
// slice of B in L1 (256 x 32 floats = 32 KiB for the widest AVX-512 tile); a group of panels
// whose slices fill gemm_b_block_bytes stays in L2 with the block of A rows (gemm_a_block_bytes
// of that slice) and the block of C they write, so neither A nor C streams from L3 once per
// panel. Measured on an Intel Xeon (AVX-512 with two FMA ports, 48 KiB L1d, 2 MiB L2), bench_gemm
// GFLOP/s, medians of 3, before -> after, AVX-512 / AVX2: (1024, 768, 768) 148 -> 159 /
// 94 -> 104; (1024, 768, 64) 150 -> 162 / 97 -> 107; (1024, 768, 2304) 141 -> 141 / 90 -> 91;
// (128, 6144, 6144) 117 -> 122 / 84 -> 88; (1024, 768, 8) unchanged. A 12 x 2 AVX-512 tile
// instead of 8 x 2 gained nothing there.
inline constexpr std::int64_t gemm_k_slice = 256;
inline constexpr std::int64_t gemm_a_block_bytes = 256 * 1024;
inline constexpr std::int64_t gemm_b_block_bytes = 512 * 1024;

// One GEMM C = A B + bias: A (m, k) with row stride lda; C (m, n) with row stride ldc.
struct gemm_args {
  const float* a = nullptr;
  std::int64_t lda = 0;
  panels_view b;
  float* c = nullptr;
  std::int64_t ldc = 0;
  std::int64_t m = 0;
};

// The split form's projection with C written head-major: C (batch * seq_len, n) = A B + bias
// stored as (batch, heads, seq_len, n / heads), so attention reads each head's rows contiguously
// (strided head rows cost the attention 4% at head_dim 64 and 17% at 32: B4 T256, one core).
// Possible when every head's columns are whole panels of B (fits()); the micro-kernels then
// write each head's block as a plain (seq_len, head_dim) matrix.
struct head_major_gemm {
  const float* a = nullptr;  // (batch * seq_len, b.k), row stride b.k
  panels_view b;
  float* c = nullptr;  // batch * seq_len * b.n floats
  std::int64_t batch = 0, seq_len = 0, heads = 0;

  static bool fits(const panels_view& b, std::int64_t heads) noexcept {
    return (b.n / heads) % b.nr == 0;
  }
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

// The parts of one query block's scratch (attention_layout::scratch_parts).
struct attention_scratch {
  float* queries;       // padded_rows x head_dim: the block's queries times scale, zero-padded
  float* scores;        // padded_rows x score_cols: one key tile's scores, then weights
  float* accumulators;  // padded_rows x acc_cols: the output rows before dividing by row_sum
  float* row_max;       // padded_rows: running max of each row's scores
  float* row_sum;       // padded_rows: running sum of exp(score - row_max), undropped
  float* rescale;       // padded_rows: exp(previous row_max - row_max) of the current key tile
  float* dropout;       // score_cols: one row's dropout multipliers over a key tile
};

// The per-(seq_len, head_dim, key tile) geometry of the attention kernel on one ISA: panel
// widths, the query-row block, the key tile, and the floats each workspace needs.
struct attention_layout {
  tile_shape scores, values;  // micro-kernels of S = Q K^T and of O = P V
  std::int64_t seq_len = 0, head_dim = 0;
  std::int64_t block_rows = 0;   // query rows per attention_rows call (the last may be fewer)
  std::int64_t padded_rows = 0;  // block_rows rounded up for both micro-kernels' row counts
  std::int64_t key_tile = 0;     // keys per online-softmax step: a multiple of scores.nr and of
                                 // the lanes; >= seq_len means one step over whole rows
  std::int64_t score_cols = 0;   // columns of a scores tile: key_tile, or seq_len rounded up
                                 // like key_tile when that is smaller
  std::int64_t acc_cols = 0;     // head_dim rounded up to values.nr

  // Packed K^T (head_dim, seq_len) at the start, then packed V (seq_len, head_dim) at
  // values_offset(), of one head.
  std::int64_t head_floats() const noexcept;
  std::int64_t values_offset() const noexcept;
  // One query block's scratch: O(block_rows * (score_cols + head_dim)), independent of seq_len
  // once seq_len >= key_tile.
  std::int64_t scratch_floats() const noexcept;
  // Carves `scratch` (scratch_floats() floats, 64-byte aligned) into its parts, each aligned.
  attention_scratch scratch_parts(float* scratch) const noexcept;
  // Query blocks per head: ceil(seq_len / block_rows).
  std::int64_t blocks() const noexcept { return (seq_len + block_rows - 1) / block_rows; }
};

// Head (b, h) of args.k and args.v packed into `head` (layout.head_floats() floats), as every
// row block of that head reads them.
void pack_head(const attention_args& args, const attention_layout& layout, std::int64_t b,
               std::int64_t h, float* head) noexcept;

// One ISA's kernels. All entries are noexcept, allocate nothing and may run concurrently on
// disjoint outputs.
struct isa_kernels {
  xsimd_isa isa;
  const char* arch_name;  // xsimd's name of the widest arch used: "avx512bw", "fma3+avx2", ...
  int lanes;              // floats per widest register
  // The micro-kernels' tile shapes, widest panel first.
  const tile_shape* tiles;
  int tile_count;

  // C rows [row_begin, row_end) x column panels [panel_begin, panel_end) of C = A B + bias;
  // g.b.nr must be one of tiles[].nr. Rows and panels of C outside the range are untouched.
  void (*gemm)(const gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
               std::int64_t panel_begin, std::int64_t panel_end) noexcept;
  // Query rows [row_begin, row_end) of head (b, h), row_end - row_begin <= layout.block_rows:
  // out rows = dropout(softmax(scale Q K^T + causal mask)) V, fused over key tiles of
  // layout.key_tile (online softmax; no row of scores is ever whole unless one tile covers
  // it), with `head` from pack_head and `scratch` layout.scratch_floats() floats owned by the
  // caller. A row's result depends on the key tile, never on the block or on other rows.
  void (*attention_rows)(const attention_args& args, const attention_layout& layout,
                         const float* head, std::int64_t b, std::int64_t h, std::int64_t row_begin,
                         std::int64_t row_end, float* scratch) noexcept;
  // Softmax pieces over a row with room for n rounded up to `lanes` floats: the largest of
  // x[0, n) (n >= 1; the padding is read and ignored; with NaNs in x, some element or NaN), and
  // x[j] = 2^(x[j] - shift) in place for j < n (x[j] <= shift; exactly 0 below shift - 125;
  // NaN stays NaN; relative error below 2e-7), the padding set to 0, returning the sum.
  float (*row_max)(const float* x, std::int64_t n) noexcept;
  float (*exp2_sum)(float* x, std::int64_t n, float shift) noexcept;

  // The panel width that wastes the fewest padding columns for an n-column B, the widest of
  // equals (wider tiles run closer to peak).
  int panel_width(std::int64_t n) const noexcept;
  // The tile whose panel width is nr (one of tiles[]).
  tile_shape tile_for(int nr) const noexcept;
  // The attention geometry; key_tile is rounded up to a multiple of scores.nr and the lanes
  // (default_key_tile: the measured fused kernel; seq_len or more: the unfused one).
  attention_layout layout(std::int64_t seq_len, std::int64_t head_dim,
                          std::int64_t key_tile = default_key_tile) const noexcept;
  // Keys per online-softmax step of the fused kernel (measured: kernels.cpp).
  static const std::int64_t default_key_tile;
};

// The kernels of `isa` (which this CPU must support: see xsimd_supported_isas()).
const isa_kernels& kernels_for(xsimd_isa isa) noexcept;

// Whether this CPU (and OS) runs the kernels of `isa`: the whole x86-64 level its translation
// unit is compiled for (x86-64-v4, -v3, baseline), AVX state enabled by the OS.
bool cpu_runs(xsimd_isa isa) noexcept;

// The best ISA this CPU runs, chosen once: xsimd::dispatch's pick (CPUID feature bits), or the
// next one down when cpu_runs() says no (xsimd 8.1 checks neither the OS's XGETBV state nor
// the rest of the x86-64 level, e.g. BMI2 or AVX512VL, that our builds may use).
xsimd_isa best_isa() noexcept;

// One thread's attention workspace for one attention call (one args, one layout): a packed
// head and one query block's scratch, O(seq_len * head_dim + block_rows * (key_tile +
// head_dim)) floats whatever the batch and head count. Allocated once; run_block() allocates
// nothing. Not shared between threads.
class attention_workspace {
 public:
  // Throws std::bad_alloc.
  explicit attention_workspace(const attention_layout& layout);

  // Query block `block` (rows [block * block_rows, ...)) of head (b, h) of `args`, with the
  // layout the workspace was made for. Packs K and V of (b, h) unless they are the ones packed
  // last, so blocks of one head in a row pack it once.
  void run_block(const isa_kernels& kernels, const attention_args& args, std::int64_t b,
                 std::int64_t h, std::int64_t block) noexcept;

 private:
  attention_layout layout_;
  float_buffer head_, scratch_;
  std::int64_t packed_ = -1;  // b * heads + h of the packed head, -1 before the first
};

// Every head of g, one after another, on the calling thread.
void gemm(const isa_kernels& kernels, const head_major_gemm& g) noexcept;

// Every query block of every (b, h) of `args`, in order, on the calling thread, with the
// kernels' layout for key_tile (default: the fused kernel's). Throws std::bad_alloc.
void attention(const isa_kernels& kernels, const attention_args& args,
               std::int64_t key_tile = isa_kernels::default_key_tile);

}  // namespace mha::detail
