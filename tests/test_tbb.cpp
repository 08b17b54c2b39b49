// The TBB backend's own contracts: results independent of the thread count and equal to the
// xsimd backend's (same kernels, fixed partitions), concurrent callers, what it reports.
// Forward-pass correctness is the conformance suite's job.
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include <string>
#include <thread>
#include <vector>

#include "mha/backends/tbb.hpp"
#include "mha/backends/xsimd.hpp"
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
TEST(TbbBackend, ManyThreadsRun) {
  const mha_test::shape s{1, 20, 16, 16, 2};
  EXPECT_EQ(run(mha::tbb_backend(), formulation::split_weight, s, {.threads = 64}),
            run(mha::tbb_backend(), formulation::split_weight, s, {.threads = 1}));
}

}  // namespace
