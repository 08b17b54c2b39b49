// The TBB backend's own contracts: results independent of the thread count and equal to the
// xsimd backend's (same kernels, fixed partitions), concurrent callers, what it reports.
// Forward-pass correctness is the conformance suite's job.
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <new>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/tbb/parallel.hpp"
#include "backends/tbb/task_trace.hpp"
#include "mha/backends/tbb.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/mha.hpp"
#include "support.hpp"

namespace {

using mha::formulation;

// Shapes whose work splits into uneven parallel pieces: ragged query blocks (T not a multiple
// of 64) over several heads and batch elements, GEMMs of several row tiles with a partial last
// one, a single head whose blocks differ in cost (causal), and a tiny problem with fewer tasks
// than threads.
const std::vector<mha_test::shape>& split_shapes() {
  static const std::vector<mha_test::shape> shapes = {
      {2, 300, 40, 48, 3}, {1, 200, 24, 32, 1}, {3, 130, 64, 96, 12}, {1, 3, 8, 8, 2}};
  return shapes;
}

std::vector<float> run(const mha::backend& backend, formulation form, const mha_test::shape& s,
                       const mha::run_options& options) {
  mha::config cfg = s.config();
  cfg.dropout = 0.2f;
  const mha::weights w = mha::weights::random(cfg, 31);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 32, 2.0f);
  return mha_test::forward(backend, form, cfg, w, x, s.batch, s.seq_len, options);
}

class TbbPlan : public testing::TestWithParam<formulation> {};

// Every thread count gives bitwise the same result, in inference and training mode. Arenas of 3
// and 4 slots are legal on a 2-core machine; raising the process-wide parallelism to 4 lets TBB
// start that many threads, so tasks land on threads in yet other ways.
TEST_P(TbbPlan, ThreadCountNeverChangesTheResult) {
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 4);
  for (const mha_test::shape& s : split_shapes()) {
    for (const bool training : {false, true}) {
      const mha::run_options one{.threads = 1, .training = training, .seed = 3};
      const std::vector<float> expected = run(mha::tbb_backend(), GetParam(), s, one);
      for (const int threads : {2, 3, 4, 0}) {
        mha::run_options options = one;
        options.threads = threads;
        EXPECT_EQ(run(mha::tbb_backend(), GetParam(), s, options), expected)
            << s.name() << " threads " << threads << (training ? " training" : "");
      }
    }
  }
}

// The parallel framework runs the xsimd kernels on pieces of the problem without changing any
// element's arithmetic: the result equals the single-threaded xsimd backend's, bit for bit.
TEST_P(TbbPlan, EqualsTheXsimdBackendBitwise) {
  for (const mha_test::shape& s : split_shapes()) {
    for (const bool training : {false, true}) {
      const mha::run_options options{.threads = 2, .training = training, .seed = 4};
      EXPECT_EQ(run(mha::tbb_backend(), GetParam(), s, options),
                run(mha::xsimd_backend(), GetParam(), s, options))
          << s.name() << (training ? " training" : "");
    }
  }
}

// Decode, split-KV included: the tbb backend's chunks and merges are the xsimd backend's, in
// parallel, so a generation loop over a long cache gives the same bits on both.
TEST_P(TbbPlan, DecodeEqualsTheXsimdBackendBitwise) {
  const mha::config cfg{.d_in = 24, .d_out = 48, .n_heads = 3, .context_length = 5000};
  const mha::weights w = mha::weights::random(cfg, 34);
  const std::vector<float> x = mha_test::random_floats(2 * 4510 * cfg.d_in, 35, 2.0f);
  const auto loop = [&](const mha::backend& backend) {
    const auto plan = backend.prepare(cfg, GetParam(), w);
    mha::kv_cache cache = plan->make_cache(2, 5000);
    std::vector<float> y;
    std::int64_t at = 0;
    for (const std::int64_t t : {4500, 1, 1, 4, 1}) {
      std::vector<float> xs, ys(static_cast<std::size_t>(2 * t * cfg.d_out));
      for (std::int64_t b = 0; b < 2; ++b) {
        const auto from = x.begin() + (b * 4510 + at) * cfg.d_in;
        xs.insert(xs.end(), from, from + t * cfg.d_in);
      }
      plan->run({xs.data(), 2, t, cfg.d_in}, {ys.data(), 2, t, cfg.d_out}, cache, {.threads = 2});
      y.insert(y.end(), ys.begin(), ys.end());
      at += t;
    }
    return y;
  };
  EXPECT_EQ(loop(mha::tbb_backend()), loop(mha::xsimd_backend()));
}

// Eight callers share one plan, each with its own batch size and thread count, three runs each
// at once: every result equals the same call made alone.
TEST_P(TbbPlan, EightConcurrentCallsEqualSerialCalls) {
  const mha_test::shape s{1, 150, 32, 48, 4};
  const mha::config cfg = s.config();
  const auto plan = mha::tbb_backend().prepare(cfg, GetParam(), mha::weights::random(cfg, 33));
  constexpr int callers = 8;
  std::vector<std::vector<float>> x(callers), expected(callers), got(callers);
  const auto batch = [](int c) { return std::int64_t{1} + c % 3; };
  const auto options = [](int c) { return mha::run_options{.threads = 1 + c % 2}; };
  for (int c = 0; c < callers; ++c) {
    x[c] = mha_test::random_floats(batch(c) * s.seq_len * cfg.d_in, 40 + c);
    expected[c].resize(batch(c) * s.seq_len * cfg.d_out);
    plan->run({x[c].data(), batch(c), s.seq_len, cfg.d_in},
              {expected[c].data(), batch(c), s.seq_len, cfg.d_out}, options(c));
  }
  // matches[c]: how many of caller c's runs equalled its serial result.
  std::vector<int> matches(callers, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      std::vector<float> y(expected[c].size());
      for (int repeat = 0; repeat < 3; ++repeat) {
        plan->run({x[c].data(), batch(c), s.seq_len, cfg.d_in},
                  {y.data(), batch(c), s.seq_len, cfg.d_out}, options(c));
        matches[c] += y == expected[c] ? 1 : 0;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < callers; ++c) EXPECT_EQ(matches[c], 3) << "caller " << c;
}

// A caller's pool (mha::executor): each grid on `threads` std::threads (the caller's one among
// them) taking task indices from a shared counter; a nested grid runs in the calling task's
// thread. It counts the grids and tasks, and the threads that ran them (which of the threads
// gets a task is up to the scheduler: at most `threads`).
class counting_pool final : public mha::executor {
 public:
  void parallel_for(std::int64_t n, int threads,
                    const std::function<void(std::int64_t)>& task) const override {
    thread_local bool inside = false;
    const auto work = [&](std::atomic<std::int64_t>& next) {
      const bool was = inside;
      inside = true;
      for (std::int64_t i = next++; i < n; i = next++) {
        task(i);
        ++tasks;
        const std::lock_guard<std::mutex> lock(mutex);
        ran_on.insert(std::this_thread::get_id());
      }
      inside = was;
    };
    std::atomic<std::int64_t> next{0};
    if (inside) {
      work(next);
      return;
    }
    ++grids;
    asked = threads;
    std::vector<std::thread> helpers;
    for (int t = 1; t < std::max(threads, 1); ++t) helpers.emplace_back([&] { work(next); });
    work(next);
    for (std::thread& h : helpers) h.join();
  }
  std::string name() const override { return "counting"; }

  mutable std::atomic<std::int64_t> tasks{0}, grids{0};
  mutable std::atomic<int> asked{-1};  // the threads the last grid was asked to run on
  mutable std::mutex mutex;
  mutable std::set<std::thread::id> ran_on;
};

// Every executor runs the same grid of tasks, so the results are the TBB arena's bit for bit:
// a caller's pool at 1, 2 and 3 workers (which gets every grid: its tasks counted, on as many
// threads as asked), the serial executor, and OpenMP where the build has it; in inference and
// training mode, a full forward and a decode loop.
TEST_P(TbbPlan, EveryExecutorGivesTheArenasBits) {
  const mha_test::shape s{2, 150, 32, 48, 4};
  for (const bool training : {false, true}) {
    const mha::run_options arena{.threads = 2, .training = training, .seed = 5};
    const std::vector<float> expected = run(mha::tbb_backend(), GetParam(), s, arena);
    for (const int threads : {1, 2, 3}) {
      counting_pool pool;
      mha::run_options options = arena;
      options.threads = threads;
      options.executor = &pool;
      EXPECT_EQ(run(mha::tbb_backend(), GetParam(), s, options), expected)
          << "pool of " << threads << (training ? " training" : "");
      EXPECT_GT(pool.grids.load(), 2);  // the projections and the attention at least
      EXPECT_GT(pool.tasks.load(), pool.grids.load());
      EXPECT_EQ(pool.asked.load(), threads);
      EXPECT_LE(pool.ran_on.size(), static_cast<std::size_t>(threads));
    }
    std::vector<const mha::executor*> others = {&mha::serial_executor()};
    if (mha::openmp_executor() != nullptr) others.push_back(mha::openmp_executor());
    for (const mha::executor* e : others) {
      mha::run_options options = arena;
      options.executor = e;
      EXPECT_EQ(run(mha::tbb_backend(), GetParam(), s, options), expected) << e->name();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Form, TbbPlan, testing::ValuesIn(mha::formulations()),
                         [](const testing::TestParamInfo<formulation>& p) {
                           return std::string(mha::to_string(p.param));
                         });

TEST(TbbBackend, ReportsItsThreadsAndKernels) {
  const mha::backend& tbb = mha::tbb_backend();
  EXPECT_EQ(tbb.name(), "tbb");
  EXPECT_EQ(tbb.max_threads(), tbb::info::default_concurrency());
  const std::string description = tbb.description();
  EXPECT_NE(description.find("oneTBB"), std::string::npos) << description;
  EXPECT_NE(description.find(mha::xsimd_backend().description()), std::string::npos) << description;
  EXPECT_EQ(tbb.isa(), mha::xsimd_default_isa());
}

// More threads than cores is not an error: the arena has that many slots.
// A decode loop (split over key chunks at 4500 cached tokens) and the attention call on a
// caller's pool give the arena's bits.
TEST(TbbBackend, DecodeAndTheAttentionCallOnAnExecutorGiveTheArenasBits) {
  const mha::config cfg{.d_in = 24, .d_out = 48, .n_heads = 3, .context_length = 5000};
  const mha::weights w = mha::weights::random(cfg, 36);
  const std::vector<float> x = mha_test::random_floats(4501 * cfg.d_in, 37, 2.0f);
  const auto plan = mha::tbb_backend().prepare(cfg, formulation::split_weight, w);
  const auto loop = [&](const mha::run_options& options) {
    mha::kv_cache cache = plan->make_cache(1, 5000);
    std::vector<float> y(4501 * cfg.d_out);
    plan->run({x.data(), 1, 4500, cfg.d_in}, {y.data(), 1, 4500, cfg.d_out}, cache, options);
    plan->run({x.data() + 4500 * cfg.d_in, 1, 1, cfg.d_in},
              {y.data() + 4500 * cfg.d_out, 1, 1, cfg.d_out}, cache, options);
    return y;
  };
  counting_pool pool;
  EXPECT_EQ(loop({.threads = 3, .executor = &pool}), loop({.threads = 2}));
  EXPECT_EQ(pool.asked.load(), 3);

  const std::vector<float> q = mha_test::random_floats(2 * 4 * 3 * 16, 38),
                           k = mha_test::random_floats(2 * 2 * 3000 * 16, 39);
  const auto call = [&](const mha::executor* e) {
    std::vector<float> out(q.size());
    mha::attention_options o;
    o.causal = true;
    o.alignment = mha::causal_alignment::bottom_right;
    o.threads = 2;
    o.executor = e;
    using view = mha::heads_view<const float>;
    mha::attention(mha::tbb_backend(), view::dense(q.data(), 2, 4, 3, 16),
                   view::dense(k.data(), 2, 2, 3000, 16), view::dense(k.data(), 2, 2, 3000, 16),
                   mha::heads_view<float>::dense(out.data(), 2, 4, 3, 16), o);
    return out;
  };
  counting_pool calls;
  EXPECT_EQ(call(&calls), call(nullptr));
  EXPECT_GT(calls.tasks.load(), 0);
}

// A task's exception reaches the caller of the run once the grid is done (the executor sees
// tasks that do not throw).
TEST(TbbBackend, ATasksExceptionReachesTheCallerThroughAnExecutor) {
  counting_pool pool;
  std::atomic<int> ran{0};
  EXPECT_THROW(mha::detail::run_in({.threads = 2, .executor = &pool},
                                   [&] {
                                     mha::detail::for_tasks(10, [&](std::int64_t i) {
                                       ++ran;
                                       if (i == 3) throw std::bad_alloc();
                                     });
                                   }),
               std::bad_alloc);
  EXPECT_EQ(ran.load(), 10);
}

TEST(TbbBackend, ManyThreadsRun) {
  const mha_test::shape s{1, 20, 16, 16, 2};
  EXPECT_EQ(run(mha::tbb_backend(), formulation::split_weight, s, {.threads = 64}),
            run(mha::tbb_backend(), formulation::split_weight, s, {.threads = 1}));
}

// ---- The task trace: what the scaling model reads (src/backends/tbb/task_trace.hpp) ----

using mha::detail::phase_kind;
using mha::detail::traced_phase;

// The phases of one run of `plan` (with `cache`, an incremental call) under a trace.
std::vector<traced_phase> traced_run(const mha::plan& plan, const mha::config& cfg,
                                     std::int64_t batch, std::int64_t seq_len, int threads,
                                     mha::kv_cache* cache = nullptr) {
  const std::vector<float> x = mha_test::random_floats(batch * seq_len * cfg.d_in, 50);
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
  mha::detail::task_trace trace;
  if (cache) {
    plan.run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.d_out}, *cache,
             {.threads = threads});
  } else {
    plan.run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.d_out},
             {.threads = threads});
  }
  return trace.finish();
}

std::vector<phase_kind> kinds(const std::vector<traced_phase>& phases) {
  std::vector<phase_kind> out;
  for (const traced_phase& p : phases) out.push_back(p.kind);
  return out;
}

// Bytes of a GEMM of m rows by (n, k) fp32 weights: A, B and C once each.
std::int64_t gemm_bytes(std::int64_t m, std::int64_t n, std::int64_t k) {
  return 4 * (k * (m + n) + m * n);
}

// Every phase has tasks, and its tasks fit in its span on one thread.
void expect_tasks_within_spans(const std::vector<traced_phase>& phases) {
  for (const traced_phase& p : phases) {
    EXPECT_FALSE(p.task_ns.empty()) << mha::detail::to_string(p.kind);
    EXPECT_LE(std::accumulate(p.task_ns.begin(), p.task_ns.end(), std::int64_t{0}), p.span_ns)
        << mha::detail::to_string(p.kind);
  }
}

// A forward pass of B2 T100 through a 3-head module, d_in 32 and d_out 48, in `form`, traced on
// one thread.
std::vector<traced_phase> traced_forward(formulation form) {
  const mha::config cfg{.d_in = 32, .d_out = 48, .n_heads = 3, .context_length = 100};
  const auto plan = mha::tbb_backend().prepare(cfg, form, mha::weights::random(cfg, 51));
  return traced_run(*plan, cfg, 2, 100, 1);
}

// The fused form is one projection, attention over B x H x query blocks, and out_proj, each a
// phase with the bytes of its operands (attention's come from the projection: none counted).
TEST(TbbTaskTrace, AForwardPassIsProjectionAttentionOutProj) {
  const std::vector<traced_phase> phases = traced_forward(formulation::fused_qkv);
  ASSERT_EQ(kinds(phases),
            (std::vector{phase_kind::gemm, phase_kind::attention, phase_kind::gemm}));
  EXPECT_EQ(phases[0].bytes, gemm_bytes(200, 3 * 48, 32));
  EXPECT_EQ(phases[1].bytes, 0);
  EXPECT_EQ(phases[2].bytes, gemm_bytes(200, 48, 48));
  EXPECT_GE(phases[1].task_ns.size(), 2u * 3u);  // at least a task per (b, h)
  expect_tasks_within_spans(phases);
}

// The wrapper's per-head projections are one phase whose tasks are their GEMM tiles (not the
// loop's bodies), with every head's bytes.
TEST(TbbTaskTrace, TheWrappersHeadsAreOnePhaseOfTheirTiles) {
  const std::vector<traced_phase> phases = traced_forward(formulation::wrapper);
  ASSERT_EQ(kinds(phases),
            (std::vector{phase_kind::for_each, phase_kind::attention, phase_kind::gemm}));
  EXPECT_EQ(phases[0].bytes, 3 * 3 * gemm_bytes(200, 16, 32));  // Q, K, V of 3 heads
  EXPECT_GT(phases[0].task_ns.size(), 3u * 3u);                 // 200 rows: several tiles each
  expect_tasks_within_spans(phases);
}

// A decode step over a split cache: the projection, the append, the chunks, their merge and
// out_proj; the chunks read every cached key and value once (head_dim 64: no padding).
TEST(TbbTaskTrace, ADecodeStepReadsItsCacheOnce) {
  const mha::config cfg{
      .d_in = 32, .d_out = 128, .n_heads = 2, .context_length = 2200, .n_kv_heads = 1};
  const auto plan =
      mha::tbb_backend().prepare(cfg, formulation::fused_qkv, mha::weights::random(cfg, 53));
  mha::kv_cache cache = plan->make_cache(2, 2200);
  const std::vector<float> prompt = mha_test::random_floats(2 * 2100 * cfg.d_in, 54);
  std::vector<float> y(2 * 2100 * cfg.d_out);
  plan->run({prompt.data(), 2, 2100, cfg.d_in}, {y.data(), 2, 2100, cfg.d_out}, cache);
  const std::vector<traced_phase> phases = traced_run(*plan, cfg, 2, 1, 1, &cache);
  ASSERT_EQ(kinds(phases),
            (std::vector{phase_kind::gemm, phase_kind::attention_append, phase_kind::attention,
                         phase_kind::attention_merge, phase_kind::gemm}));
  const std::int64_t key_bytes = 2 * 64 * 4;  // a key and a value, fp32
  EXPECT_EQ(phases[1].bytes, 2 * 1 * key_bytes);
  EXPECT_EQ(phases[2].bytes, 2 * 2101 * key_bytes);
  EXPECT_EQ(phases[2].task_ns.size(), 2u * 2u);  // 2101 keys: two chunks per sequence
  expect_tasks_within_spans(phases);
}

// The partition is the problem's, not the thread count's: the same phases and task counts on
// 1, 2 and 3 threads.
TEST(TbbTaskTrace, TheTasksAreTheSameOnAnyThreadCount) {
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 4);
  const mha::config cfg{.d_in = 32, .d_out = 48, .n_heads = 3, .context_length = 130};
  for (const formulation form : {formulation::split_weight, formulation::fused_qkv}) {
    const auto plan = mha::tbb_backend().prepare(cfg, form, mha::weights::random(cfg, 55));
    const std::vector<traced_phase> one = traced_run(*plan, cfg, 3, 130, 1);
    for (const int threads : {2, 3}) {
      const std::vector<traced_phase> many = traced_run(*plan, cfg, 3, 130, threads);
      ASSERT_EQ(kinds(many), kinds(one)) << mha::to_string(form) << " threads " << threads;
      for (std::size_t i = 0; i < one.size(); ++i) {
        EXPECT_EQ(many[i].bytes, one[i].bytes) << "phase " << i;
        EXPECT_EQ(many[i].task_ns.size(), one[i].task_ns.size()) << "phase " << i;
      }
    }
  }
}

// One trace at a time; none alive, runs record nothing.
TEST(TbbTaskTrace, OneAtATimeAndOnlyWhileAlive) {
  const mha::config cfg{.d_in = 16, .d_out = 16, .n_heads = 2, .context_length = 20};
  const auto plan =
      mha::tbb_backend().prepare(cfg, formulation::fused_qkv, mha::weights::random(cfg, 56));
  {
    mha::detail::task_trace first;
    EXPECT_THROW(mha::detail::task_trace second, std::logic_error);
  }
  const std::vector<float> x = mha_test::random_floats(20 * cfg.d_in, 57);
  std::vector<float> y(20 * cfg.d_out);
  plan->run({x.data(), 1, 20, cfg.d_in}, {y.data(), 1, 20, cfg.d_out});  // not traced
  mha::detail::task_trace trace;
  EXPECT_TRUE(trace.finish().empty());
  EXPECT_EQ(traced_run(*plan, cfg, 1, 20, 1).size(), 3u);  // a new trace after finish()
}

}  // namespace
