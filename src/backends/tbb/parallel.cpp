#include "backends/tbb/parallel.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>

namespace mha::detail {
namespace {

// GEMM tiles: rows per tile, a multiple of every micro-kernel's row count (6, 8, 12, 16), and
// columns per tile (whole panels).
constexpr std::int64_t gemm_tile_rows = 96;
constexpr std::int64_t gemm_tile_cols = 128;

}  // namespace

int default_threads() noexcept { return tbb::info::default_concurrency(); }

void in_arena(int threads, const std::function<void()>& f) {
  tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
  arena.execute(f);
}

void parallel_gemm(const isa_kernels& kernels, const gemm_args& g) {
  const std::int64_t panels = g.b.panels(),
                     tile_panels = std::max<std::int64_t>(1, gemm_tile_cols / g.b.nr);
  const std::int64_t row_tiles = (g.m + gemm_tile_rows - 1) / gemm_tile_rows,
                     panel_tiles = (panels + tile_panels - 1) / tile_panels;
  // Tiles row-block-major: a thread's run of consecutive tiles shares its rows of A in L2.
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, row_tiles * panel_tiles),
                    [&](const tbb::blocked_range<std::int64_t>& range) {
                      for (std::int64_t t = range.begin(); t != range.end(); ++t) {
                        const std::int64_t row = t / panel_tiles * gemm_tile_rows,
                                           panel = t % panel_tiles * tile_panels;
                        kernels.gemm(g, row, std::min(row + gemm_tile_rows, g.m), panel,
                                     std::min(panel + tile_panels, panels));
                      }
                    });
}

void parallel_attention(const isa_kernels& kernels, const attention_args& args,
                        std::int64_t key_tile) {
  const attention_layout layout = kernels.layout(args.seq_len, args.head_dim, key_tile);
  const std::int64_t blocks = layout.blocks();
  // One workspace per thread that takes part, made on its first task.
  tbb::enumerable_thread_specific<attention_workspace> workspaces(layout);
  // Tasks head-major, blocks of a head consecutive: a thread running a stretch of them packs
  // each head once.
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, args.batch * args.heads * blocks),
                    [&](const tbb::blocked_range<std::int64_t>& range) {
                      attention_workspace& workspace = workspaces.local();
                      for (std::int64_t t = range.begin(); t != range.end(); ++t) {
                        const std::int64_t head = t / blocks;
                        workspace.run_block(kernels, args, head / args.heads, head % args.heads,
                                            t % blocks);
                      }
                    });
}

}  // namespace mha::detail
