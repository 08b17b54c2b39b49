// The sweep logic of mha_bench (bench/): overrides, expansion, cases, budget, filter, check,
// progress, command line and shards (the presets: test_bench_presets.cpp). Behaviour only:
// nothing here is timed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "bench/sweep_points.hpp"
#include "check.hpp"
#include "command_line.hpp"
#include "mha/error.hpp"
#include "progress.hpp"
#include "sweep.hpp"

namespace {

using mha_bench::bench_case;
using mha_bench::expansion;
using mha_bench::same_shape;
using mha_bench::series;
using mha_bench::sweep_point;
using mha_bench::sweep_problem;
using testing::ElementsAre;
using testing::HasSubstr;

constexpr auto wrapper = mha::formulation::wrapper;
constexpr auto split = mha::formulation::split_weight;

using mha_test::in_series;
using mha_test::points_of;

// The name of the one split_weight case of `backend` (one thread) computing `shape`, which must
// read back (mha::parse_problem) as the case's problem.
std::string split_case_name(const mha::problem& shape, const std::string& backend) {
  const std::vector<sweep_point> points = {{shape, 1, {"decode"}}};
  const std::vector<mha_bench::backend_info> backends = {{backend, 2}};
  const auto cases = mha_bench::make_cases(points, backends, std::vector{split});
  if (cases.size() != 1) return "expected one case, got " + std::to_string(cases.size());
  const std::string name = cases[0].name();
  const std::size_t begin = ("mha/" + backend + "/").size();
  EXPECT_EQ(mha::parse_problem(name.substr(begin, name.rfind('/') - begin)), cases[0].problem);
  return name;
}

TEST(BenchOverrides, ReplaceListsInEverySeries) {
  mha_bench::overrides o;
  o.heads = {2, 4};
  o.batch = {3};
  o.d_model = {256};
  o.threads = {1};
  const expansion e = mha_bench::expand(mha_bench::apply(mha_bench::preset("heads", 2), o));
  std::set<std::pair<std::int64_t, std::int64_t>> d_model_by_heads;
  for (const sweep_point& p : e.points) {
    EXPECT_EQ(p.problem.batch, 3);
    EXPECT_EQ(p.threads, 1);
    d_model_by_heads.insert({p.problem.cfg.n_heads, p.problem.cfg.d_out});
  }
  // The fixed-d_model series takes --d-model; the fixed-head_dim one keeps d_model = 64 * H.
  EXPECT_EQ(d_model_by_heads, (std::set<std::pair<std::int64_t, std::int64_t>>{
                                  {2, 256}, {4, 256}, {2, 128}, {4, 256}}));
}

TEST(BenchOverrides, NonDivisibleShapesAreDroppedAndListed) {
  mha_bench::overrides o;
  o.d_model = {100};
  o.heads = {3, 4};
  const expansion e = mha_bench::expand(mha_bench::apply(mha_bench::preset("seq", 1), o));
  for (const sweep_point& p : e.points) EXPECT_EQ(p.problem.cfg.n_heads, 4);
  ASSERT_FALSE(e.dropped.empty());
  EXPECT_THAT(e.dropped.front(), HasSubstr("d_model 100 is not divisible by 3 heads"));
}

TEST(BenchOverrides, NothingLeftOrBadValuesThrow) {
  mha_bench::overrides o;
  o.d_model = {100};
  o.heads = {3};
  EXPECT_THROW(mha_bench::expand(mha_bench::apply(mha_bench::preset("seq", 1), o)),
               mha::invalid_argument);
  mha_bench::overrides zero;
  zero.seq_len = {0};
  EXPECT_THROW(mha_bench::expand(mha_bench::apply(mha_bench::preset("seq", 1), zero)),
               mha::invalid_argument);
}

// The wave's axes multiply the shapes like the other lists; heads not divisible by the K/V heads
// are dropped with a notice; the names carry the axes as the problem string does.
TEST(BenchOverrides, KvHeadsPastAndPrecisionAreAxes) {
  mha_bench::overrides o;
  o.heads = {4, 6};
  o.threads = {1};
  o.kv_heads = {0, 2, 4};
  o.past = {0, 100};
  o.precisions = {mha::precision::fp32, mha::precision::bf16};
  const expansion e = mha_bench::expand(mha_bench::apply(mha_bench::preset("seq", 1), o));
  // Per T: H=4 with kv {0, 2} (4 K/V heads of 4 is multi-head, the kv 0 shape), H=6 with
  // kv {0, 2}; each x 2 past x 2 precisions.
  EXPECT_EQ(e.points.size(), 7u * (2 + 2) * 2 * 2);
  for (const sweep_point& p : e.points) {
    EXPECT_TRUE(p.problem.cfg.n_kv_heads == 0 ||
                p.problem.cfg.n_heads % p.problem.cfg.n_kv_heads == 0);
    EXPECT_NE(p.problem.cfg.n_kv_heads, p.problem.cfg.n_heads);
    EXPECT_EQ(p.problem.cfg.context_length, p.problem.past + p.problem.seq_len);
  }
  ASSERT_FALSE(e.dropped.empty());
  EXPECT_THAT(e.dropped.front(), HasSubstr("6 heads are not divisible by 4 K/V heads"));

  EXPECT_EQ(split_case_name(sweep_problem(1, 1, 4096, 32, 8, 1023, mha::precision::bf16), "xsimd"),
            "mha/xsimd/split_weight/b1/t1/past1023/din4096/dout4096/h32/kvh8/bf16/threads:1");

  mha_bench::overrides negative;
  negative.past = {-1};
  EXPECT_THROW(mha_bench::expand(mha_bench::apply(mha_bench::preset("seq", 1), negative)),
               mha::invalid_argument);
}

TEST(BenchCases, NamesReadLikeTheProblemString) {
  const std::vector<sweep_point> points = {{sweep_problem(4, 256, 768, 12), 2, {"heads_d_model"}}};
  const std::vector<mha_bench::backend_info> backends = {{"tbb", 2}};
  const auto cases = mha_bench::make_cases(points, backends, std::vector{split});
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].name(), "mha/tbb/split_weight/b4/t256/din768/dout768/h12/threads:2");
  EXPECT_EQ(cases[0].label(), "series=heads_d_model");
}

TEST(BenchCases, ThreadCountsAreCappedPerBackend) {
  const mha::problem s = sweep_problem(1, 64, 64, 4);
  const std::vector<sweep_point> points = {
      {s, 1, {"a"}}, {s, 2, {"a", "b"}}, {s, 4, {"c"}}, {sweep_problem(1, 8, 8, 2), 1, {"a"}}};
  const std::vector<mha_bench::backend_info> backends = {{"parallel", 2}, {"serial", 1}};
  const auto cases = mha_bench::make_cases(points, backends, std::vector{wrapper, split});
  std::vector<std::string> names;
  for (const bench_case& c : cases) names.push_back(c.name() + " " + c.label());
  EXPECT_THAT(names,
              ElementsAre("mha/parallel/wrapper/b1/t64/din64/dout64/h4/threads:1 series=a",
                          "mha/parallel/wrapper/b1/t64/din64/dout64/h4/threads:2 series=a,b,c",
                          "mha/parallel/split_weight/b1/t64/din64/dout64/h4/threads:1 series=a",
                          "mha/parallel/split_weight/b1/t64/din64/dout64/h4/threads:2 series=a,b,c",
                          "mha/serial/wrapper/b1/t64/din64/dout64/h4/threads:1 series=a,b,c",
                          "mha/serial/split_weight/b1/t64/din64/dout64/h4/threads:1 series=a,b,c",
                          "mha/parallel/wrapper/b1/t8/din8/dout8/h2/threads:1 series=a",
                          "mha/parallel/split_weight/b1/t8/din8/dout8/h2/threads:1 series=a",
                          "mha/serial/wrapper/b1/t8/din8/dout8/h2/threads:1 series=a",
                          "mha/serial/split_weight/b1/t8/din8/dout8/h2/threads:1 series=a"));
  EXPECT_EQ(cases[4].backend, 1u);
}

TEST(BenchBudget, EstimateIsFlopsOverRateAndThreads) {
  bench_case c;
  c.problem = sweep_problem(1, 1024, 768, 12);
  c.threads = 2;
  const double gflop = mha::flops(c.problem) * 1e-9;
  EXPECT_DOUBLE_EQ(mha_bench::estimated_seconds(c, 4.0), gflop / 8.0);
}

TEST(BenchBudget, SkipsOnlyCasesOverTheBudget) {
  EXPECT_FALSE(mha_bench::budget_skip_reason(4.9, 5.0));
  EXPECT_FALSE(mha_bench::budget_skip_reason(5.0, 5.0));
  const auto reason = mha_bench::budget_skip_reason(25.3, 5.0);
  ASSERT_TRUE(reason);
  EXPECT_THAT(*reason, HasSubstr("over budget"));
  EXPECT_THAT(*reason, HasSubstr("25.3 s"));
  EXPECT_THAT(*reason, HasSubstr("--budget 5 s"));
  EXPECT_FALSE(mha_bench::budget_skip_reason(1e9, 0.0)) << "0 disables the budget";
}

TEST(BenchFilter, FollowsGoogleBenchmarkRules) {
  const std::string name = "mha/naive/wrapper/b1/t8/din16/dout16/h2/threads:1/real_time";
  EXPECT_TRUE(mha_bench::filter_selects("", name));
  EXPECT_TRUE(mha_bench::filter_selects("all", name));
  EXPECT_TRUE(mha_bench::filter_selects("naive/.*/h2/", name));
  EXPECT_FALSE(mha_bench::filter_selects("split_weight", name));
  EXPECT_FALSE(mha_bench::filter_selects("-naive", name));
  EXPECT_TRUE(mha_bench::filter_selects("-split_weight", name));
  EXPECT_THROW(mha_bench::filter_selects("(", name), mha::invalid_argument);
}

TEST(BenchCheck, SampleRowsIncludeFirstAndLastTokenOfFirstAndLastBatch) {
  const auto rows = mha_bench::sample_rows(4, 256);
  std::set<std::pair<std::int64_t, std::int64_t>> seen;
  for (const mha_reference::row& r : rows) {
    EXPECT_TRUE(r.batch >= 0 && r.batch < 4 && r.token >= 0 && r.token < 256);
    EXPECT_TRUE(seen.insert({r.batch, r.token}).second) << "duplicate row";
  }
  for (auto row : {std::pair<std::int64_t, std::int64_t>{0, 0}, {0, 255}, {3, 0}, {3, 255}})
    EXPECT_TRUE(seen.contains(row));
  EXPECT_LE(rows.size(), 8u);
  const auto one = mha_bench::sample_rows(1, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].token, 0);
}

TEST(BenchCheck, ComparesSampledRowsRelativeToTheReference) {
  // y (1, 3, 2); rows 0 and 2 are checked.
  const std::vector<mha_reference::row> rows = {{0, 0}, {0, 2}};
  const std::vector<double> reference = {1.0, -4.0, 2.0, 0.5};
  std::vector<float> y = {1.0f, -4.0f, 99.0f, 99.0f, 2.0f, 0.5f};  // row 1 is not checked
  auto r = mha_bench::compare_rows(y, 3, 2, rows, reference);
  EXPECT_EQ(r.rows, 2u);
  EXPECT_EQ(r.max_error, 0.0);
  EXPECT_EQ(r.max_reference, 4.0);
  EXPECT_TRUE(r.passed(1e-4));

  y[5] = 0.5f + 1e-3f;  // error 1e-3 = 2.5e-4 of max|reference|
  r = mha_bench::compare_rows(y, 3, 2, rows, reference);
  EXPECT_NEAR(r.relative_error(), 2.5e-4, 1e-8);
  EXPECT_FALSE(r.passed(1e-4));
  EXPECT_TRUE(r.passed(1e-3));

  y[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(mha_bench::compare_rows(y, 3, 2, rows, reference).passed(1.0));
}

TEST(BenchCheck, FixtureChecksAgainstTheOracleOnSampledRows) {
  const mha_bench::shape_fixture f(sweep_problem(2, 5, 8, 2));
  // The oracle on every row of the fixture's own inputs passes; a sampled row changed fails.
  const auto all = mha_reference::forward(f.problem().cfg, f.weights(), f.x(), 2, 5);
  std::vector<float> y(all.begin(), all.end());
  EXPECT_TRUE(f.check(y).passed(1e-6));
  y[(1 * 5 + 4) * 8 + 3] += 1.0f;  // batch 1, last token: a sampled row
  EXPECT_FALSE(f.check(y).passed(1e-3));
}

TEST(BenchProgress, EtaScalesTheRemainingEstimateByTheObservedPace) {
  const mha_bench::progress p({"a", "b", "c"}, {1.0, 2.0, 3.0}, nullptr);
  EXPECT_DOUBLE_EQ(p.eta_seconds(0, 0.0), 6.0);
  EXPECT_DOUBLE_EQ(p.eta_seconds(1, 2.0), 10.0);  // a took twice its estimate
  EXPECT_DOUBLE_EQ(p.eta_seconds(2, 1.5), 1.5);   // a and b took half
}

TEST(BenchProgress, PrintsEachBenchmarkOnce) {
  std::ostringstream out;
  mha_bench::progress p({"mha/a", "mha/b"}, {1.0, 1.0}, &out);
  p.start(0);
  p.start(0);
  p.start(1, "over budget: estimated 9 s");
  const std::string text = out.str();
  EXPECT_THAT(text, testing::StartsWith("[1/2] mha/a  ETA"));
  EXPECT_THAT(text, HasSubstr("[2/2] mha/b  (over budget: estimated 9 s)  ETA"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
}

TEST(BenchProgress, ExpectedWallFollowsGoogleBenchmarksIterationGrowth) {
  EXPECT_DOUBLE_EQ(mha_bench::expected_wall_seconds(0.01, 0.5, 1), 0.01 + 0.8);
  EXPECT_DOUBLE_EQ(mha_bench::expected_wall_seconds(2.0, 0.5, 3), 2.0 + 6.0);
  EXPECT_EQ(mha_bench::format_duration(4.25), "4.2s");
  EXPECT_EQ(mha_bench::format_duration(185), "3m05s");
  EXPECT_EQ(mha_bench::format_duration(7620), "2h07m");
}

TEST(BenchCommandLine, ParsesFlagsInBothForms) {
  const std::vector<std::string> args = {
      "--preset", "heads", "--backends=xsimd,naive",      "--heads", "1,96", "--threads=1,2",
      "--budget", "0",     "--formulations=split_weight", "--quiet"};
  const mha_bench::options o = mha_bench::parse_command_line(args);
  EXPECT_EQ(o.preset, "heads");
  EXPECT_THAT(o.backends, ElementsAre("xsimd", "naive"));
  EXPECT_THAT(*o.lists.heads, ElementsAre(1, 96));
  EXPECT_THAT(*o.lists.threads, ElementsAre(1, 2));
  EXPECT_FALSE(o.lists.seq_len);
  EXPECT_EQ(o.budget_seconds, 0.0);
  EXPECT_THAT(o.formulations, ElementsAre(split));
  EXPECT_TRUE(o.quiet);
  EXPECT_FALSE(o.list_shapes);
  EXPECT_FALSE(o.lists.kv_heads);

  const std::vector<std::string> axes = {"--kv-heads=0,8", "--past", "0,1023",
                                         "--precision=fp32,bf16", "--window=0,512"};
  const mha_bench::options a = mha_bench::parse_command_line(axes);
  EXPECT_THAT(*a.lists.kv_heads, ElementsAre(0, 8));
  EXPECT_THAT(*a.lists.past, ElementsAre(0, 1023));
  EXPECT_THAT(*a.lists.window, ElementsAre(0, 512));
  EXPECT_THROW(mha_bench::parse_command_line(std::vector<std::string>{"--window=-2"}),
               mha::invalid_argument);
  EXPECT_THAT(*a.lists.precisions, ElementsAre(mha::precision::fp32, mha::precision::bf16));
  EXPECT_THROW(mha_bench::parse_command_line(std::vector<std::string>{"--precision=fp16"}),
               mha::invalid_argument);
  EXPECT_THROW(mha_bench::parse_command_line(std::vector<std::string>{"--past=-1"}),
               mha::invalid_argument);
  const mha_bench::options kv =
      mha_bench::parse_command_line(std::vector<std::string>{"--kv-precision=int8,fp32"});
  EXPECT_THAT(*kv.lists.kv_precisions, ElementsAre(mha::precision::int8, mha::precision::fp32));
  EXPECT_THROW(mha_bench::parse_command_line(std::vector<std::string>{"--kv-precision=int2"}),
               mha::invalid_argument);
}

// The cache's precision is an axis too: every plan precision with every cache precision it can
// keep, named /kv_int8 in the problem string and "kv_precision" in the peers' shape file.
TEST(BenchOverrides, KvPrecisionIsAnAxis) {
  mha_bench::overrides o;
  o.batch = {1};
  o.past = {64};
  o.threads = {1};
  o.precisions = {mha::precision::fp32, mha::precision::bf16};
  o.kv_precisions = {mha::precision::int8, mha::precision::bf16};
  const expansion e = mha_bench::expand(mha_bench::apply(mha_bench::preset("threads", 1), o));
  std::set<std::pair<mha::precision, mha::precision>> pairs;  // (plan, cache)
  for (const sweep_point& p : e.points)
    pairs.insert({p.problem.cfg.precision, p.problem.cache_precision()});
  EXPECT_THAT(pairs, ElementsAre(std::pair{mha::precision::fp32, mha::precision::int8},
                                 std::pair{mha::precision::bf16, mha::precision::bf16},
                                 std::pair{mha::precision::bf16, mha::precision::int8}));
  EXPECT_THAT(e.dropped, ElementsAre(HasSubstr("the bf16 KV cache with fp32 plans")));
  // A forward pass keeps no cache: only the cache in its plan's precision is left (bf16's).
  o.past = {0};
  const expansion forward = mha_bench::expand(mha_bench::apply(mha_bench::preset("threads", 1), o));
  ASSERT_EQ(forward.points.size(), 1u);
  EXPECT_EQ(forward.points[0].problem.cfg.precision, mha::precision::bf16);
  EXPECT_FALSE(forward.points[0].problem.kv_precision);
  EXPECT_THAT(forward.dropped,
              ElementsAre(HasSubstr("the int8 KV cache of forward passes (series threads)"),
                          HasSubstr("the bf16 KV cache of forward passes (series threads)")));
  // A cache in the plan's own precision is the default: no kv_precision, one name.
  EXPECT_EQ(sweep_problem(1, 1, 64, 4, 0, 8, mha::precision::bf16, mha::precision::bf16),
            sweep_problem(1, 1, 64, 4, 0, 8, mha::precision::bf16));

  const mha::problem int8 =
      sweep_problem(1, 1, 768, 12, 0, 8192, mha::precision::fp32, mha::precision::int8);
  EXPECT_EQ(split_case_name(int8, "tbb"),
            "mha/tbb/split_weight/b1/t1/past8192/din768/dout768/h12/kv_int8/threads:1");
  const std::string json = mha_bench::shapes_json({{{int8, 1, {"decode_cache"}}}, {}});
  EXPECT_THAT(json, HasSubstr("\"past\": 8192, \"kv_precision\": \"int8\", \"name\": "
                              "\"b1/t1/past8192/din768/dout768/h12/kv_int8\""));
}

// Sliding windows are an axis: every series' shapes with each window (0: causal), named /w<W>,
// "window" in the peers' shape file, FLOPs counting the window's pairs only; a window that
// covers every key of a shape is its causal attention, dropped with a notice.
TEST(BenchOverrides, WindowIsAnAxis) {
  mha_bench::overrides o;
  o.seq_len = {64, 256};
  o.threads = {1};
  o.window = {0, 128};
  const expansion e = mha_bench::expand(mha_bench::apply(mha_bench::preset("threads", 1), o));
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;  // (T, w)
  for (const sweep_point& p : e.points) shapes.insert({p.problem.seq_len, p.problem.cfg.window});
  EXPECT_THAT(shapes, ElementsAre(std::pair{64, 0}, std::pair{256, 0}, std::pair{256, 128}));
  EXPECT_THAT(e.dropped, ElementsAre(HasSubstr("window 128 over 64 positions: it covers every "
                                               "key, the causal attention of window 0 (B=1 T=64")));
  EXPECT_THAT(mha_bench::to_string(mha_bench::apply(mha_bench::preset("threads", 1), o)[0]),
              HasSubstr(" window=0,128 "));
  const mha::problem windowed =
      sweep_problem(1, 256, 768, 12, 0, 0, mha::precision::fp32, std::nullopt, 128);
  EXPECT_EQ(split_case_name(windowed, "tbb"),
            "mha/tbb/split_weight/b1/t256/din768/dout768/h12/w128/threads:1");
  const std::string json = mha_bench::shapes_json({{{windowed, 1, {"window"}}}, {}});
  EXPECT_THAT(json, HasSubstr("\"window\": 128, \"name\": \"b1/t256/din768/dout768/h12/w128\""));
  // Rows 0..127 see 1..128 keys, the 128 after them 128 each: 128*129/2 + 128*128 pairs.
  const double causal_pairs = 256.0 * 257 / 2, window_pairs = 128.0 * 129 / 2 + 128.0 * 128;
  EXPECT_DOUBLE_EQ(mha::flops(sweep_problem(1, 256, 768, 12)) - mha::flops(windowed),
                   4.0 * 12 * 64 * (causal_pairs - window_pairs));
}

TEST(BenchCommandLine, RejectsBadInputNamingIt) {
  const auto error_of = [](std::vector<std::string> args) -> std::string {
    try {
      mha_bench::parse_command_line(args);
    } catch (const mha::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(error_of({"--heads", "1,,2"}), HasSubstr("--heads '1,,2'"));
  EXPECT_THAT(error_of({"--seq=0"}), HasSubstr("--seq '0'"));
  EXPECT_THAT(error_of({"--batch", "x"}), HasSubstr("--batch"));
  EXPECT_THAT(error_of({"--budget", "-1"}), HasSubstr("--budget '-1'"));
  EXPECT_THAT(error_of({"--tolerance", "0"}), HasSubstr("--tolerance '0'"));
  EXPECT_THAT(error_of({"--formulations", "fused"}), HasSubstr("'fused'"));
  EXPECT_THAT(error_of({"--threads"}), HasSubstr("--threads needs a value"));
  EXPECT_THAT(error_of({"--bogus"}), HasSubstr("unknown argument '--bogus'"));
}

TEST(BenchCommandLine, ReadsGoogleBenchmarkFlagsForTheEstimate) {
  const std::vector<std::string> args = {"--benchmark_min_time=0.2", "--benchmark_repetitions=3",
                                         "--benchmark_min_time_bogus=9"};
  EXPECT_EQ(mha_bench::benchmark_flag(args, "benchmark_min_time", 0.5), 0.2);
  EXPECT_EQ(mha_bench::benchmark_flag(args, "benchmark_repetitions", 1), 3.0);
  EXPECT_EQ(mha_bench::benchmark_flag(args, "benchmark_filter", 7), 7.0);
}

// ---- --shard I/N: a deterministic partition of the selection (issue 18) ----

// The cases of a preset on four backends (two parallel, two single-threaded), both formulations.
std::vector<bench_case> preset_cases(std::string_view preset) {
  const std::vector<mha_bench::backend_info> backends = {
      {"tbb", 2}, {"xsimd", 1}, {"onednn", 2}, {"naive", 1}};
  return mha_bench::make_cases(points_of(preset), backends, std::vector{wrapper, split});
}

std::vector<std::string> names_of(const std::vector<bench_case>& cases) {
  std::vector<std::string> names;
  for (const bench_case& c : cases) names.push_back(c.name());
  return names;
}

TEST(BenchShard, ParsesIOfNAndRejectsAnythingElse) {
  EXPECT_EQ(mha_bench::parse_shard("1/1"), (mha_bench::shard{1, 1}));
  EXPECT_EQ(mha_bench::parse_shard("3/4"), (mha_bench::shard{3, 4}));
  EXPECT_EQ(mha_bench::to_string(mha_bench::shard{2, 16}), "2/16");
  for (const char* bad : {"", "1", "0/2", "3/2", "1/0", "-1/2", "a/2", "1/2x", "1//2", " 1/2"}) {
    EXPECT_THROW(mha_bench::parse_shard(bad), mha::invalid_argument) << bad;
  }
  try {
    mha_bench::parse_shard("5/4");
  } catch (const mha::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("--shard '5/4'"));
    EXPECT_THAT(e.what(), HasSubstr("1 <= I <= N"));
  }
  EXPECT_EQ(mha_bench::parse_command_line(std::vector<std::string>{"--shard=2/3"}).shard,
            (mha_bench::shard{2, 3}));
  EXPECT_EQ(mha_bench::parse_command_line(std::vector<std::string>{"--shard", "1/2"}).shard,
            (mha_bench::shard{1, 2}));
  EXPECT_EQ(mha_bench::parse_command_line(std::vector<std::string>{}).shard,
            (mha_bench::shard{1, 1}));
  EXPECT_THROW(mha_bench::parse_command_line(std::vector<std::string>{"--shard=2/1"}),
               mha::invalid_argument);
}

// Shards 1/N .. N/N together run exactly the selection: every case once, none twice, each
// shard in the selection's run order (a shape's cases stay together).
TEST(BenchShard, ShardsTogetherAreExactlyTheSelection) {
  for (std::string_view preset : {"quick", "heads", "decode", "full"}) {
    const std::vector<bench_case> all = preset_cases(preset);
    const std::vector<std::string> names = names_of(all);
    for (int n : {1, 2, 3, 7}) {
      std::multiset<std::string> seen;
      for (int i = 1; i <= n; ++i) {
        const auto part = names_of(mha_bench::cases_of_shard(all, {i, n}));
        EXPECT_FALSE(part.empty()) << preset << " " << i << "/" << n;
        // A subsequence of the run order.
        auto at = names.begin();
        for (const std::string& name : part) {
          at = std::find(at, names.end(), name);
          ASSERT_NE(at, names.end()) << name << " out of order in " << i << "/" << n;
        }
        seen.insert(part.begin(), part.end());
      }
      EXPECT_EQ(seen, std::multiset<std::string>(names.begin(), names.end()))
          << preset << " /" << n;
    }
    EXPECT_EQ(names_of(mha_bench::cases_of_shard(all, {1, 1})), names) << "1/1 is everything";
  }
}

// Every task of an array computes the partition on its own: it depends on the names and model
// FLOPs of the selection, not on the order the cases come in nor on the machine.
TEST(BenchShard, PartitionIsDeterministicAndIndependentOfOrder) {
  const std::vector<bench_case> all = preset_cases("heads");
  std::vector<bench_case> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(18));
  const auto shard_by_name = [](const std::vector<bench_case>& cases) {
    const std::vector<int> assignment = mha_bench::assign_shards(cases, 3);
    std::map<std::string, int> by_name;
    for (std::size_t i = 0; i < cases.size(); ++i) by_name[cases[i].name()] = assignment[i];
    return by_name;
  };
  EXPECT_EQ(shard_by_name(all), shard_by_name(shuffled));
  EXPECT_EQ(mha_bench::assign_shards(all, 3), mha_bench::assign_shards(all, 3));
  EXPECT_THROW(mha_bench::assign_shards(all, 0), mha::invalid_argument);
  EXPECT_TRUE(mha_bench::assign_shards(std::vector<bench_case>{}, 2).empty());
}

// Balanced by cost: the greedy rule leaves no shard more than one case's cost above another.
TEST(BenchShard, ShardsAreBalancedByModelFlops) {
  for (std::string_view preset : {"quick", "heads", "seq", "full"}) {
    const std::vector<bench_case> all = preset_cases(preset);
    std::int64_t largest = 0, total = 0;
    for (const bench_case& c : all) {
      largest = std::max(largest, mha_bench::shard_cost(c));
      total += mha_bench::shard_cost(c);
    }
    for (int n : {2, 4}) {
      const std::vector<int> assignment = mha_bench::assign_shards(all, n);
      std::vector<std::int64_t> load(static_cast<std::size_t>(n), 0);
      for (std::size_t i = 0; i < all.size(); ++i)
        load[static_cast<std::size_t>(assignment[i])] += mha_bench::shard_cost(all[i]);
      const auto [low, high] = std::minmax_element(load.begin(), load.end());
      EXPECT_LE(*high - *low, largest) << preset << " into " << n;
      EXPECT_LE(*high, std::max(largest, total / n + largest)) << preset << " into " << n;
    }
  }
  // The cost grows with the FLOPs and falls with threads; every case costs at least its timing.
  bench_case small, large;
  small.problem = sweep_problem(1, 128, 768, 12);
  large.problem = sweep_problem(1, 4096, 768, 12);
  EXPECT_LT(mha_bench::shard_cost(small), mha_bench::shard_cost(large));
  bench_case large2 = large;
  large2.threads = 2;
  EXPECT_LT(mha_bench::shard_cost(large2), mha_bench::shard_cost(large));
  EXPECT_GE(mha_bench::shard_cost(small), 800000) << "min_time dominates a short pass";
}

// More shards than benchmarks: the extra shards are empty, the others one case each.
TEST(BenchShard, MoreShardsThanCasesLeavesSomeEmpty) {
  const std::vector<bench_case> all = preset_cases("quick");
  const int n = static_cast<int>(all.size()) + 3;
  std::size_t non_empty = 0;
  for (int i = 1; i <= n; ++i) {
    const std::size_t size = mha_bench::cases_of_shard(all, {i, n}).size();
    EXPECT_LE(size, 1u);
    non_empty += size;
  }
  EXPECT_EQ(non_empty, all.size());
}

TEST(BenchShard, FingerprintNamesTheSelectionInAnyOrder) {
  const std::vector<bench_case> all = preset_cases("quick");
  const std::string f = mha_bench::selection_fingerprint(all);
  EXPECT_EQ(f.size(), 16u);
  EXPECT_EQ(f.find_first_not_of("0123456789abcdef"), std::string::npos) << f;
  std::vector<bench_case> reversed(all.rbegin(), all.rend());
  EXPECT_EQ(mha_bench::selection_fingerprint(reversed), f);
  std::vector<bench_case> fewer(all.begin() + 1, all.end());
  EXPECT_NE(mha_bench::selection_fingerprint(fewer), f);
  EXPECT_NE(mha_bench::selection_fingerprint(preset_cases("heads")), f);
  // FNV-1a 64 of nothing is its offset basis.
  EXPECT_EQ(mha_bench::selection_fingerprint(std::vector<bench_case>{}), "cbf29ce484222325");
}

// With --with-pytorch each shard times the points it owns: disjoint, together all of them.
TEST(BenchShard, ShardPointsSplitThePeersShapesWithoutOverlap) {
  const expansion e = mha_bench::expand(mha_bench::preset("heads", 2));
  const std::vector<bench_case> all = preset_cases("heads");
  const expansion covered = mha_bench::covered_points(e, all);
  for (int n : {1, 2, 5}) {
    std::vector<int> owners(covered.points.size(), 0);  // how many shards time each point
    for (int i = 1; i <= n; ++i) {
      const expansion part = mha_bench::shard_points(e, all, {i, n});
      EXPECT_EQ(part.dropped, e.dropped);
      const auto mine = mha_bench::cases_of_shard(all, {i, n});
      for (const sweep_point& p : part.points) {
        const auto at = std::ranges::find_if(covered.points, [&](const sweep_point& q) {
          return q.problem == p.problem && q.threads == p.threads;
        });
        ASSERT_NE(at, covered.points.end());
        ++owners[static_cast<std::size_t>(at - covered.points.begin())];
        // Owned by shard i: one of its cases runs it.
        EXPECT_TRUE(std::ranges::any_of(mine, [&](const bench_case& c) {
          return same_shape(c.problem, p.problem) && c.threads == p.threads;
        }));
      }
    }
    EXPECT_THAT(owners, testing::Each(1)) << n << " shards";
  }
}

// The peers time what mha_bench runs: points no selected case runs are left out.
TEST(ShapesJson, CoveredPointsAreThoseTheSelectedCasesRun) {
  const mha::problem a = sweep_problem(1, 64, 64, 4), b = sweep_problem(1, 8, 8, 2);
  mha_bench::expansion e;
  e.points = {{a, 1, {"s"}}, {a, 2, {"s"}}, {b, 1, {"s"}}, {b, 2, {"s"}}};
  e.dropped = {"one dropped shape"};
  const std::vector<mha_bench::backend_info> serial = {{"serial", 1}};
  auto cases = mha_bench::make_cases(e.points, serial, std::vector{split});
  std::erase_if(
      cases, [&](const bench_case& c) { return same_shape(c.problem, b); });  // a filter on /t64/
  const mha_bench::expansion covered = mha_bench::covered_points(e, cases);
  ASSERT_EQ(covered.points.size(), 1u);
  EXPECT_EQ(covered.points[0].problem, a);
  EXPECT_EQ(covered.points[0].threads, 1);
  EXPECT_EQ(covered.dropped, e.dropped);
  EXPECT_TRUE(mha_bench::covered_points(e, {}).points.empty());
}

// The peers' shape file lists each shape once, with all its thread counts and series.
TEST(ShapesJson, OneObjectPerShapeWithItsThreadsAndSeries) {
  const std::string json = mha_bench::shapes_json(mha_bench::expand(mha_bench::preset("quick", 2)));
  EXPECT_THAT(json,
              HasSubstr("{\"batch\": 1, \"seq_len\": 128, \"d_in\": 768, \"d_out\": 768, "
                        "\"n_heads\": 12, \"causal\": true, \"qkv_bias\": false, "
                        "\"out_proj\": true, \"threads\": [1, 2], \"series\": \"quick_heads\", "
                        "\"name\": \"b1/t128/din768/dout768/h12\", \"flops\": "));
  std::size_t objects = 0;
  for (std::size_t at = json.find('{'); at != std::string::npos; at = json.find('{', at + 1))
    ++objects;
  EXPECT_EQ(objects, points_of("quick").size() / 2);  // two thread counts per shape
  EXPECT_EQ(json.front(), '[');
  EXPECT_EQ(json.substr(json.size() - 2), "]\n");
}

}  // namespace
