// The oneDNN backend beyond the shared suites: which kernels oneDNN picked, the primitive cache
// under concurrent runs, and the OpenMP thread control.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <thread>

#include "backends/onednn/introspection.hpp"
#include "mha/backends/naive.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"
#include "support.hpp"

namespace {

using mha::formulation;

// (B, T, d_in, d_out, H): the benchmark's shapes (heads preset ends, GPT-2 small) and the
// awkward ones of the conformance suite.
std::vector<mha_test::shape> kernel_shapes() {
  std::vector<mha_test::shape> shapes = {{4, 256, 768, 768, 1},
                                         {4, 256, 768, 768, 12},
                                         {4, 256, 768, 768, 96},
                                         {1, 128, 1536, 1536, 24},
                                         {1, 1024, 768, 768, 12}};
  const auto& awkward = mha_test::conformance_shapes();
  shapes.insert(shapes.end(), awkward.begin(), awkward.end());
  return shapes;
}

// A primitive on oneDNN's reference kernels ("ref:any") is a performance bug (docs/dependencies.md
// §2: a mask broadcast over the outermost dimension is 600x slower): none may appear.
TEST(OnednnKernels, NoPrimitiveUsesAReferenceImplementation) {
  for (const mha_test::shape& s : kernel_shapes()) {
    const mha::config cfg = s.config();
    const mha::weights w = mha::weights::random(cfg, 1);
    for (formulation form : mha::formulations()) {
      // Shapes the backend declines (backend::supports) build no primitives to inspect.
      if (!mha::onednn_backend().supports({cfg, form, s.batch, s.seq_len})) continue;
      const auto plan = mha::onednn_backend().prepare(cfg, form, w);
      const std::vector<std::string> steps =
          mha::detail::onednn_implementations(*plan, s.batch, s.seq_len);
      ASSERT_GE(steps.size(), 4u) << s.name();  // projection, scores, softmax, context at least
      for (const std::string& step : steps) {
        const std::string implementation = step.substr(step.find(' ') + 1);
        EXPECT_NE(implementation.rfind("ref", 0), 0u)
            << mha::to_string(form) << " " << s.name() << ": " << step;
      }
    }
  }
}

TEST(OnednnKernels, IntrospectionRejectsOtherPlansAndShapes) {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const mha::weights w = mha::weights::random(cfg, 1);
  const auto naive = mha::naive_backend().prepare(cfg, formulation::wrapper, w);
  EXPECT_THROW(mha::detail::onednn_implementations(*naive, 1, 4), mha::invalid_argument);
  const auto plan = mha::onednn_backend().prepare(cfg, formulation::wrapper, w);
  EXPECT_THROW(mha::detail::onednn_implementations(*plan, 1, 5), mha::invalid_argument);
  EXPECT_THROW(mha::detail::onednn_implementations(*plan, 0, 4), mha::invalid_argument);
}

// Results of one plan on two thread counts: identical where oneDNN runs its AVX-512 (brgemm)
// kernels, which never split a reduction across threads; within mha::onednn_thread_tolerance
// of max|y| on lower ISAs, whose sgemm (gemm:jit) splits long reductions by team size.
void expect_thread_count_agreement(const std::vector<float>& y, const std::vector<float>& y1) {
  ASSERT_EQ(y.size(), y1.size());
  if (mha::onednn_thread_count_bitwise()) {
    EXPECT_EQ(y, y1) << mha::onednn_backend().description();
    return;
  }
  double largest = 0, difference = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    largest = std::max(largest, std::abs(double{y1[i]}));
    difference = std::max(difference, std::abs(double{y[i]} - y1[i]));
  }
  ASSERT_GT(largest, 0.0);
  EXPECT_LE(difference, mha::onednn_thread_tolerance * largest)
      << mha::onednn_backend().description() << ": max |y - y_1 thread| = " << difference
      << ", max |y| = " << largest;
}

class OnednnPlan : public testing::TestWithParam<formulation> {
 protected:
  static constexpr std::int64_t context = 40;
  const mha::config cfg{.d_in = 24, .d_out = 32, .n_heads = 4, .context_length = context};
  const mha::weights w = mha::weights::random(cfg, 2);

  std::vector<float> input(std::int64_t batch, std::int64_t seq_len, std::uint32_t seed) const {
    return mha_test::random_floats(static_cast<std::size_t>(batch * seq_len * cfg.d_in), seed);
  }
  std::vector<float> run(const mha::plan& plan, const std::vector<float>& x, std::int64_t batch,
                         std::int64_t seq_len, int threads = 0) const {
    std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
    plan.run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.d_out},
             {.threads = threads});
    return y;
  }
};

// Several threads run one plan at once, on more shapes than the plan caches (so entries are
// built, shared and evicted concurrently); every result equals the same run done alone.
TEST_P(OnednnPlan, ConcurrentRunsEqualSerialRuns) {
  const auto plan = mha::onednn_backend().prepare(cfg, GetParam(), w);
  struct job {
    std::int64_t batch, seq_len;
    std::vector<float> x, expected;
  };
  std::vector<job> jobs;
  for (std::int64_t i = 0; i < 12; ++i) {
    const std::int64_t batch = 1 + i % 3, seq_len = 1 + (i * 7) % context;
    job j{batch, seq_len, input(batch, seq_len, static_cast<std::uint32_t>(i)), {}};
    j.expected = run(*plan, j.x, batch, seq_len, 1);
    jobs.push_back(std::move(j));
  }
  constexpr int thread_count = 4;
  // matches[t][j]: how many of thread t's runs of job j equalled the serial result.
  std::vector<std::vector<int>> matches(thread_count, std::vector<int>(jobs.size(), 0));
  std::vector<std::thread> threads;
  threads.reserve(thread_count);
  for (int t = 0; t < thread_count; ++t) {
    threads.emplace_back([&, t] {
      // Every thread runs every job twice, each starting at a different job.
      for (int pass = 0; pass < 2; ++pass) {
        for (std::size_t n = 0; n < jobs.size(); ++n) {
          const std::size_t j = (n + static_cast<std::size_t>(t) * 3) % jobs.size();
          const job& work = jobs[j];
          matches[t][j] += run(*plan, work.x, work.batch, work.seq_len, 1) == work.expected;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < thread_count; ++t) {
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      EXPECT_EQ(matches[t][j], 2) << "thread " << t << ", b" << jobs[j].batch << " t"
                                  << jobs[j].seq_len;
    }
  }
}

// run_options::threads changes how many OpenMP threads oneDNN uses, and the caller's OpenMP
// setting is restored afterwards. The result is bitwise the same on oneDNN's AVX-512 kernels
// and within the stated tolerance on its AVX2 ones (include/mha/backends/onednn.hpp).
TEST_P(OnednnPlan, ThreadCountKeepsResultAndCallerSetting) {
  const auto plan = mha::onednn_backend().prepare(cfg, GetParam(), w);
  const std::vector<float> x = input(3, context, 7);
  const int before = omp_get_max_threads();
  const std::vector<float> one = run(*plan, x, 3, context, 1);
  EXPECT_EQ(omp_get_max_threads(), before);
  expect_thread_count_agreement(run(*plan, x, 3, context, 2), one);
  expect_thread_count_agreement(run(*plan, x, 3, context, 0), one);
  EXPECT_EQ(omp_get_max_threads(), before);
  EXPECT_EQ(mha::onednn_backend().max_threads(), before);
}

// Primitives are built per OpenMP team size (oneDNN fixes a primitive's thread partition when
// it is created) and reused when a team size comes back.
TEST_P(OnednnPlan, PrimitivesAreBuiltPerThreadCountAndReused) {
  const auto plan = mha::onednn_backend().prepare(cfg, GetParam(), w);
  const std::vector<float> x = input(2, context, 5);
  const int all = omp_get_max_threads();
  ASSERT_TRUE(mha::detail::onednn_cached_team_sizes(*plan, 2, context).empty());
  run(*plan, x, 2, context, 1);
  EXPECT_EQ(mha::detail::onednn_cached_team_sizes(*plan, 2, context), std::vector<int>{1});
  run(*plan, x, 2, context, 2);
  EXPECT_EQ(mha::detail::onednn_cached_team_sizes(*plan, 2, context), (std::vector<int>{2, 1}));
  run(*plan, x, 2, context, 1);
  EXPECT_EQ(mha::detail::onednn_cached_team_sizes(*plan, 2, context), (std::vector<int>{1, 2}));
  run(*plan, x, 2, context, 0);  // 0: the caller's team size
  EXPECT_EQ(mha::detail::onednn_cached_team_sizes(*plan, 2, context).front(), all);
  EXPECT_THROW(mha::detail::onednn_cached_team_sizes(*plan, 2, context + 1), mha::invalid_argument);
}

// One token through long rows: the shape where a GEMM library is most tempted to split the
// reduction across threads, which would change the rounding.
TEST_P(OnednnPlan, OneLongTokenIsThreadCountIndependent) {
  const mha::config wide{.d_in = 2048, .d_out = 64, .n_heads = 4, .context_length = 1};
  const auto plan = mha::onednn_backend().prepare(wide, GetParam(), mha::weights::random(wide, 3));
  const std::vector<float> x = mha_test::random_floats(2048, 8);
  std::vector<float> y1(64), y2(64);
  plan->run({x.data(), 1, 1, 2048}, {y1.data(), 1, 1, 64}, {.threads = 1});
  plan->run({x.data(), 1, 1, 2048}, {y2.data(), 1, 1, 64}, {.threads = 2});
  expect_thread_count_agreement(y2, y1);
}

INSTANTIATE_TEST_SUITE_P(All, OnednnPlan, testing::ValuesIn(mha::formulations()),
                         [](const auto& p) { return std::string(mha::to_string(p.param)); });

TEST(OnednnBackend, DescriptionNamesVersionRuntimeAndIsa) {
  const dnnl::version_t* v = dnnl::version();
  const std::string d = mha::onednn_backend().description();
  EXPECT_NE(d.find("oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor)),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("OpenMP"), std::string::npos) << d;
  EXPECT_EQ(d.find("unknown"), std::string::npos) << d;
}

// isa() is the class of the ISA oneDNN dispatches after its cap: ctest runs this suite a second
// time with ONEDNN_MAX_CPU_ISA=AVX2 (tests/CMakeLists.txt), where it must say avx2 and not
// promise bitwise.
TEST(OnednnBackend, IsaFollowsOnednnsCap) {
  const mha::isa isa = mha::onednn_backend().isa();
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  __builtin_cpu_init();
  if (cap == nullptr || std::string(cap) != "AVX2" || !__builtin_cpu_supports("avx2")) {
    GTEST_SKIP() << "oneDNN runs uncapped (" << mha::to_string(isa)
                 << "); the AVX2-capped ctest run checks the cap";
  }
  EXPECT_EQ(isa, mha::isa::avx2);
  EXPECT_FALSE(mha::onednn_thread_count_bitwise());
}

}  // namespace
