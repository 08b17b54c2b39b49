#include "backends/tbb/parallel.hpp"

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <memory>
#include <vector>

#include "backends/tbb/task_trace.hpp"

namespace mha::detail {
namespace {

// GEMM tiles: rows per tile, a multiple of every micro-kernel's row count (6, 8, 12, 16), and
// columns per tile (whole panels). Smaller tiles balance 2 threads better at no cost to one
// (measurements: docs/design.md §5.1).
constexpr std::int64_t gemm_tile_rows = 48;
constexpr std::int64_t gemm_tile_cols = 128;

}  // namespace

int default_threads() noexcept { return tbb::info::default_concurrency(); }

namespace {

executor_context& this_thread_context() noexcept {
  thread_local executor_context context;
  return context;
}

// The calling thread's context for a scope.
class context_scope {
 public:
  explicit context_scope(const executor_context& context) noexcept : saved_(this_thread_context()) {
    this_thread_context() = context;
  }
  ~context_scope() { this_thread_context() = saved_; }
  context_scope(const context_scope&) = delete;
  context_scope& operator=(const context_scope&) = delete;

 private:
  executor_context saved_;
};

void in_arena(int threads, const std::function<void()>& f) {
  // The calling thread keeps its arenas of the last few thread counts: a new arena costs ~11 us
  // per run on 2 threads (a worker has to join it), a kept one 0.3 us (tbb::parallel_for of 4
  // trivial tasks, median of 2000). Per thread, so concurrent callers never share an arena.
  struct kept {
    int threads;
    std::unique_ptr<tbb::task_arena> arena;
  };
  constexpr std::size_t keep = 4;
  thread_local std::vector<kept> arenas;
  // At most the workers TBB allows (the cores, or a tbb::global_control's lower limit): asked
  // for more, the TBB runtime prints a warning on stderr, and this library never prints. The
  // fixed partitioning keeps the results identical for any thread count.
  const int allowed = static_cast<int>(std::min<std::size_t>(
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism),
      static_cast<std::size_t>(std::numeric_limits<int>::max())));
  const int slots =
      threads > 0 ? std::min(threads, std::max(allowed, 1)) : tbb::task_arena::automatic;
  auto found =
      std::find_if(arenas.begin(), arenas.end(), [&](const kept& k) { return k.threads == slots; });
  if (found == arenas.end()) {
    if (arenas.size() == keep) arenas.erase(arenas.begin());  // the oldest
    arenas.push_back({slots, std::make_unique<tbb::task_arena>(slots)});
    found = arenas.end() - 1;
  }
  found->arena->execute(f);
}

}  // namespace

const executor_context& current_executor() noexcept { return this_thread_context(); }

void run_in(const run_options& options, const std::function<void()>& f) {
  if (options.executor != nullptr) {
    const context_scope scope({options.executor, options.threads});
    f();
    return;
  }
  in_arena(options.threads, [&] {
    const context_scope scope({});  // TBB, whatever this thread ran for before
    f();
  });
}

void run_tasks(const executor_context& context, std::int64_t n,
               const std::function<void(std::int64_t)>& task) {
  if (n <= 0) return;
  std::exception_ptr first;
  std::atomic<bool> failed{false};
  context.on->parallel_for(n, context.threads, [&](std::int64_t i) {
    const context_scope scope(context);
    try {
      task(i);
    } catch (...) {
      if (!failed.exchange(true)) first = std::current_exception();
    }
  });
  if (first) std::rethrow_exception(first);
}

namespace {

// The bytes a GEMM of m rows over b moves at least: A (m, k) and B (k, n) in b's units, C floats.
template <class E>
std::int64_t gemm_bytes(std::int64_t m, const panels_of<E>& b) noexcept {
  return static_cast<std::int64_t>(sizeof(E)) * b.k * (m + b.n) +
         static_cast<std::int64_t>(sizeof(float)) * m * b.n;
}

// The fixed grid of GEMM tiles over g, each tile's rows and panels to `tile`.
template <class Args, class Tile>
void over_gemm_tiles(const Args& g, Tile&& tile) {
  const phase_scope phase(phase_kind::gemm, gemm_bytes(g.m, g.b));
  const std::int64_t panels = g.b.panels(),
                     tile_panels = std::max<std::int64_t>(1, gemm_tile_cols / g.b.nr);
  const std::int64_t row_tiles = (g.m + gemm_tile_rows - 1) / gemm_tile_rows,
                     panel_tiles = (panels + tile_panels - 1) / tile_panels;
  // Tiles row-block-major: a thread's run of consecutive tiles shares its rows of A in L2.
  for_tasks(row_tiles * panel_tiles, [&](std::int64_t t) {
    const task_scope task;
    const std::int64_t row = t / panel_tiles * gemm_tile_rows,
                       panel = t % panel_tiles * tile_panels;
    tile(row, std::min(row + gemm_tile_rows, g.m), panel, std::min(panel + tile_panels, panels));
  });
}

}  // namespace

void parallel_gemm(const isa_kernels& kernels, const gemm_args& g) {
  over_gemm_tiles(g, [&](auto... range) { kernels.gemm(g, range...); });
}

void parallel_gemm(const isa_kernels& kernels, const pair_gemm_args& g) {
  over_gemm_tiles(g, [&](auto... range) { kernels.pair_gemm(g, range...); });
}

void parallel_gemm(const isa_kernels& kernels, const head_major_gemm& g) {
  const std::int64_t row_tiles = (g.seq_len + gemm_tile_rows - 1) / gemm_tile_rows,
                     per_head = g.panels_per_head(),
                     tile_panels = std::max<std::int64_t>(1, gemm_tile_cols / g.b.nr),
                     panel_tiles = (per_head + tile_panels - 1) / tile_panels;
  // Tiles head-major, then row-block-major within a head.
  const std::int64_t per_head_tiles = row_tiles * panel_tiles;
  const phase_scope phase(phase_kind::gemm, gemm_bytes(g.batch * g.seq_len, g.b));
  for_tasks(g.batch * g.heads * per_head_tiles, [&](std::int64_t t) {
    const task_scope task;
    const std::int64_t head = t / per_head_tiles, tile = t % per_head_tiles;
    const std::int64_t h = head % g.heads, row = tile / panel_tiles * gemm_tile_rows,
                       panel = h * per_head + tile % panel_tiles * tile_panels;
    kernels.gemm(g.head(head / g.heads, h), row, std::min(row + gemm_tile_rows, g.seq_len), panel,
                 std::min(panel + tile_panels, (h + 1) * per_head));
  });
}

void parallel_attention(const isa_kernels& kernels, const attention_args& args,
                        std::int64_t key_tile) {
  const attention_schedule schedule(kernels, args, key_tile);
  // What the phases move in memory: the new keys and values written into the cache, and every
  // key and value the tasks read from it (a prefill's come from the projection just before).
  std::int64_t appended = 0, cached = 0;
  if (args.cache) {
    const std::int64_t key_bytes = schedule.layout().key_bytes();
    for (std::int64_t b = 0; b < args.batch; ++b) cached += args.keys(b);
    appended = args.batch * args.seq_len * args.kv_heads() * key_bytes;
    cached *= args.kv_heads() * key_bytes;
  }
  if (schedule.appends() > 0) {
    const phase_scope phase(phase_kind::attention_append, appended);
    for_tasks(schedule.appends(), [&](std::int64_t i) {
      const task_scope task;
      schedule.append(i);
    });
  }
  {
    const phase_scope phase(phase_kind::attention, cached);
    const auto run = [&](std::int64_t begin, std::int64_t end, attention_workspace& workspace) {
      for (std::int64_t i = begin; i != end; ++i) {
        const task_scope task;
        schedule.run(i, workspace);
      }
    };
    if (schedule.packs_heads()) {
      // One workspace per thread that takes part (a TBB worker's or an executor's), made on its
      // first task. Tasks head-major, blocks of a head consecutive: a thread running a stretch
      // of them packs each head once.
      tbb::enumerable_thread_specific<attention_workspace> workspaces(schedule.layout(), true);
      for_ranges(schedule.tasks(), [&](std::int64_t begin, std::int64_t end) {
        run(begin, end, workspaces.local());
      });
    } else {
      // Only scratch: each thread's own, kept across calls.
      for_ranges(schedule.tasks(), [&](std::int64_t begin, std::int64_t end) {
        run(begin, end, thread_workspace(schedule.layout()));
      });
    }
  }
  if (schedule.merges() == 0) return;
  const phase_scope phase(phase_kind::attention_merge, 0);
  for_tasks(schedule.merges(), [&](std::int64_t i) {
    const task_scope task;
    schedule.merge(i);
  });
}

}  // namespace mha::detail
