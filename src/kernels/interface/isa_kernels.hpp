// Internal: the SIMD kernels shared by the xsimd and tbb backends, as one table per ISA. BLIS's
// split: an ISA-neutral framework, compiled once (gemm.hpp: packing and blocking; attention.hpp:
// the attention geometry and workspaces; dispatch.cpp: which ISA runs), and register-tiled
// micro-kernels per ISA (micro/: templates over the xsimd arch; one translation unit per ISA
// instantiates them and fills an isa_kernels table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/attention_args.hpp"
#include "kernels/interface/attention.hpp"
#include "kernels/interface/gemm.hpp"
#include "mha/isa.hpp"

namespace mha::detail {

// A peak loop of isa_kernels (fma_rounds, bf16_rounds).
using peak_loop = double (*)(std::int64_t rounds, float* sink) noexcept;

// One ISA's kernels. Each entry's contract, one fact a line: what it reads, writes and requires,
// and what its result depends on. Every entry is noexcept, allocates nothing and may run
// concurrently with any other on disjoint outputs.
struct isa_kernels {
  mha::isa isa;           // which of mha::isa: its row of kernel_isas.def
  const char* arch_name;  // xsimd's name of the widest arch used: "avx512bw", "fma3+avx2", ...
  int lanes;              // floats per widest register
  // The micro-kernels' tile shapes, widest panel first.
  const tile_shape* tiles;
  int tile_count;

  // gemm: C = A B + bias, one range of C.
  //   reads:    A's rows [row_begin, row_end), B's packed panels [panel_begin, panel_end), bias
  //   writes:   those rows x panels of C; C outside the range untouched
  //   requires: g.b.nr one of tiles[].nr
  void (*gemm)(const gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
               std::int64_t panel_begin, std::int64_t panel_end) noexcept;
  // to_pairs: rows of A rounded to bf16 pairs (gemm.hpp).
  //   reads:    A (rows, k), row r at a + r * lda
  //   writes:   dst (rows, pairs(k)), the missing odd k zero
  void (*to_pairs)(const float* a, std::int64_t rows, std::int64_t k, std::int64_t lda,
                   bf16_pair* dst) noexcept;
  // pack_pair_block (gemm.hpp), the same words, vectorised: how attention packs K^T and V.
  pair_block_packer pack_pairs;
  // pair_gemm: gemm over bf16 pairs (A converted, B packed as pairs: gemm.hpp), sums in fp32;
  // the same reads, writes and requirement.
  void (*pair_gemm)(const pair_gemm_args& g, std::int64_t row_begin, std::int64_t row_end,
                    std::int64_t panel_begin, std::int64_t panel_end) noexcept;
  // attention_rows: dropout(softmax(scale Q K^T + mask)) V for one block of query rows, fused
  // over key tiles of layout.key_tile (online softmax: no row of scores is ever whole unless
  // one tile covers it).
  //   reads:    query positions [task.row_begin, task.row_end) of the query heads of K/V head
  //             (task.b, task.g) in args, stacked position-major (attention_layout); keys
  //             [task.key_begin, task.key_end) of the packed head task.head (args' own K and V
  //             where layout.in_place)
  //   writes:   those rows of args.out, or with task.partial the chunk's partial softmax there
  //   requires: task.row_end - task.row_begin <= layout.block_positions; scratch holds
  //             layout.scratch_floats() floats, the caller's, not shared
  //   depends:  on the key tile and the keys' range; never on the block or on other rows
  void (*attention_rows)(const attention_args& args, const attention_layout& layout,
                         const attention_task& task, float* scratch) noexcept;
  // row_max and exp2_sum: softmax pieces over a row x[0, n).
  //   requires: n >= 1; x has room for n rounded up to `lanes` floats; exp2_sum: scale x[j] <=
  //             shift
  //   row_max:  returns the largest of x[0, n) (the padding is read and ignored; with NaNs in
  //             x, some element or NaN)
  //   exp2_sum: writes x[j] = 2^(scale x[j] - shift) in place for j < n (exactly 0 below
  //             shift - 125; NaN stays NaN; relative error below 2e-7; scale 1 takes
  //             x[j] - shift exactly) and the padding 0; returns their sum
  float (*row_max)(const float* x, std::int64_t n) noexcept;
  float (*exp2_sum)(float* x, std::int64_t n, float shift, float scale) noexcept;
  // fma_rounds and bf16_rounds: the peak loops that figures on this ISA are read against
  // (bench/machine/fma_peak.cpp times them; micro/peak_loops.hpp).
  //   fma_rounds:  `rounds` rounds of independent FP32 FMA chains on full-width registers (a
  //                multiply and an add where the ISA has no FMA)
  //   bf16_rounds: the same with its native bf16 pair products (vdpbf16ps; AMX: tile products
  //                on registers loaded once); nullptr where bf16 pairs are widened to FP32 FMAs
  //   writes:      a value of the accumulators at *sink (so no loop can be removed)
  //   returns:     the FLOPs done (a product and a sum: 2)
  peak_loop fma_rounds;
  peak_loop bf16_rounds;
  // The narrowest V panel whose P V of bf16 pairs runs as tile products (AMX: 16 columns; 0
  // where there are none): a bf16 attention's narrower heads, packed per call (not a cache's),
  // take panels this wide (zero padded), so that their P V runs on tiles rather than vectors.
  int pair_tile_cols = 0;

  // The panel width that wastes the fewest padding columns for an n-column B, the widest of
  // equals (wider tiles run closer to peak).
  int panel_width(std::int64_t n) const noexcept;
  // The tile whose panel width is nr (one of tiles[]).
  tile_shape tile_for(int nr) const noexcept;
  // The attention geometry `request` asks for (attention_request says what each field means).
  attention_layout layout(const attention_request& request) const noexcept;
};

// The ISAs this CPU runs, of kernel_isas.def's rows, best first.
std::vector<mha::isa> runnable_isas();
// The ISA the kernels dispatch to: MHA_XSIMD_ISA when set (invalid_argument when it names no row
// or one this CPU does not run), else the best runnable. Read at each call.
mha::isa dispatched_isa();

// The kernels of `which` (one of runnable_isas()).
const isa_kernels& kernels_for(mha::isa which) noexcept;

// Every ISA the kernels are built for (the architecture's kernel_isas.def), best first.
std::vector<mha::isa> built_isas();

// Whether this CPU (and OS) runs the kernels of `which` (false for an isa without kernels): its
// row's `runs` in its kernel_isas.def (kernels/arch/<arch>/), the whole x86-64 level its
// translation unit is compiled for (x86-64-v4, -v3, baseline, and the extensions beside it); for
// amx also the tiles, granted to this process (amx_refusal).
bool cpu_runs(mha::isa which) noexcept;

// Why this process runs no AMX kernels ("" when it does): no AMX-BF16 on this CPU, no AVX512_BF16
// (the AMX build's vector half), the OS has not enabled the tile state, or Linux refused this
// process the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once, on
// the first call).
const std::string& amx_refusal() noexcept;
// What an error saying this CPU does not run `which` adds after the ISA's name: " (<why>)" for
// amx (amx_refusal), "" for the rest (their CPUID bits say it all). Both are the
// architecture's (kernels/arch/<arch>/arch_cpu.cpp): on aarch64 the reason is the architecture.
std::string refusal_note(mha::isa which);

// The best ISA this CPU runs, chosen once: the first row of kernel_isas.def that it runs.
mha::isa best_isa() noexcept;

// "xsimd <version>, <arch>, <lanes> lanes": what the kernels of `which` run on, for backends'
// descriptions.
std::string kernels_description(mha::isa which);
// The ISAs' names (to_string), comma-separated, for messages.
std::string isa_names(const std::vector<mha::isa>& isas);

}  // namespace mha::detail
