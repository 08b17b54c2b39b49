// The benchmark presets: each one's series, shapes, thread counts and precisions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "bench/sweep_points.hpp"
#include "mha/error.hpp"
#include "sweep.hpp"

namespace {

using mha_bench::expansion;
using mha_bench::series;
using mha_bench::sweep_point;
using mha_bench::sweep_problem;
using mha_test::in_series;
using mha_test::points_of;
using testing::ElementsAre;
using testing::HasSubstr;

std::vector<std::int64_t> heads_at_one_thread(const std::vector<sweep_point>& points) {
  std::vector<std::int64_t> h;
  for (const sweep_point& p : points) {
    if (p.threads == 1) h.push_back(p.problem.cfg.n_heads);
  }
  return h;
}

TEST(BenchPresets, HeadsCoversBothSeriesUpTo96Heads) {
  const auto points = points_of("heads");
  const auto d_model = in_series(points, "heads_d_model");
  const auto head_dim = in_series(points, "heads_head_dim");
  const std::vector<std::int64_t> axis = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96};
  EXPECT_EQ(heads_at_one_thread(d_model), axis);
  EXPECT_EQ(heads_at_one_thread(head_dim), axis);
  for (const sweep_point& p : d_model) {
    EXPECT_EQ(p.problem.cfg.d_out, 768);
    EXPECT_EQ(p.problem.batch, 4);
    EXPECT_EQ(p.problem.seq_len, 256);
  }
  for (const sweep_point& p : head_dim) {
    EXPECT_EQ(p.problem.cfg.head_dim(), 64);
    EXPECT_EQ(p.problem.cfg.d_out, 64 * p.problem.cfg.n_heads);
    EXPECT_EQ(p.problem.batch, 1);
    EXPECT_EQ(p.problem.seq_len, 128);
  }
  EXPECT_EQ(head_dim.back().problem.cfg.d_out, 6144);
}

TEST(BenchPresets, HeadsHasKvGroupsOfOneFourEightAndAll) {
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;  // (H, K/V heads; 0: H)
  for (const sweep_point& p : in_series(points_of("heads"), "heads_kv")) {
    EXPECT_EQ(p.problem,
              sweep_problem(4, 256, 768, p.problem.cfg.n_heads, p.problem.cfg.n_kv_heads));
    shapes.insert({p.problem.cfg.n_heads, p.problem.cfg.n_kv_heads});
  }
  std::set<std::pair<std::int64_t, std::int64_t>> expected;
  for (std::int64_t h : {8, 16, 24, 32, 48, 64, 96}) {
    for (std::int64_t kv : {std::int64_t{0}, h / 4, h / 8, std::int64_t{1}}) {
      expected.insert({h, kv});
    }
  }
  EXPECT_EQ(shapes, expected);
  // Its multi-head shapes are heads_d_model's: one point, both names.
  for (const sweep_point& p : in_series(points_of("heads"), "heads_d_model")) {
    const bool grouped_series_h = p.problem.cfg.n_heads >= 8 && p.problem.cfg.n_heads % 8 == 0;
    EXPECT_EQ(p.series.size(), grouped_series_h ? 2u : 1u) << p.problem.cfg.n_heads;
  }
}

TEST(BenchPresets, KvGroupsDropHeadsTheyDoNotDivide) {
  series s{"g", {1}, {8}, {1, 6, 8}, {48}, 0, {1}};
  s.kv_groups = {1, 4, 0};
  const mha_bench::expansion e = mha_bench::expand(std::vector{s});
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;
  for (const sweep_point& p : e.points)
    shapes.insert({p.problem.cfg.n_heads, p.problem.cfg.n_kv_heads});
  // H1: every group is multi-head (0); H6: groups of 4 dropped; H8: 2 and 1 K/V heads.
  EXPECT_EQ(shapes, (std::set<std::pair<std::int64_t, std::int64_t>>{
                        {1, 0}, {6, 0}, {6, 1}, {8, 0}, {8, 2}, {8, 1}}));
  ASSERT_EQ(e.dropped.size(), 2u);  // H1 and H6 with groups of 4
  EXPECT_THAT(e.dropped[1], HasSubstr("6 heads do not form groups of 4"));
  EXPECT_THAT(mha_bench::to_string(s), HasSubstr("kv_groups=1,4,0"));
  // --kv-heads replaces the groups.
  mha_bench::overrides o;
  o.kv_heads = std::vector<std::int64_t>{2};
  const std::vector<series> applied = mha_bench::apply({s}, o);
  EXPECT_TRUE(applied[0].kv_groups.empty());
}

TEST(BenchPresets, EveryPresetShapeHasWholeHeads) {
  for (std::string_view name : mha_bench::preset_names()) {
    for (const sweep_point& p : points_of(name)) {
      EXPECT_EQ(p.problem.cfg.d_out % p.problem.cfg.n_heads, 0) << name;
      EXPECT_FALSE(p.series.empty()) << name;
    }
  }
}

TEST(BenchPresets, SeqSweepsGpt2SmallUpTo4096Tokens) {
  std::vector<std::int64_t> t;
  for (const sweep_point& p : points_of("seq")) {
    EXPECT_EQ(p.problem, sweep_problem(1, p.problem.seq_len, 768, 12));
    if (p.threads == 1) t.push_back(p.problem.seq_len);
  }
  EXPECT_THAT(t, ElementsAre(64, 128, 256, 512, 1024, 2048, 4096));
}

TEST(BenchPresets, ThreadsRunsOneToEveryCore) {
  std::vector<int> threads;
  for (const sweep_point& p : points_of("threads", 4)) {
    EXPECT_EQ(p.problem, sweep_problem(1, 1024, 768, 12));
    threads.push_back(p.threads);
  }
  EXPECT_THAT(threads, ElementsAre(1, 2, 3, 4));
  // Elsewhere one thread and all of them; a one-core machine has one thread count.
  for (const sweep_point& p : points_of("quick", 4)) EXPECT_TRUE(p.threads == 1 || p.threads == 4);
  for (const sweep_point& p : points_of("heads", 1)) EXPECT_EQ(p.threads, 1);
}

// Scaling past two cores: GPT-2 small's prefill (B1, B4) and decode over 8k (B1, 8, 32; and
// with 3 K/V heads at B1, 8) at doubling thread counts and all cores, never a count twice.
TEST(BenchPresets, CoresDoublesTheThreadsUpToEveryCore) {
  const auto threads_of = [](int hardware_threads) {
    std::set<int> t;
    for (const sweep_point& p : points_of("cores", hardware_threads)) t.insert(p.threads);
    return std::vector<int>(t.begin(), t.end());
  };
  EXPECT_THAT(threads_of(16), ElementsAre(1, 2, 4, 8, 16));
  EXPECT_THAT(threads_of(6), ElementsAre(1, 2, 4, 6));
  EXPECT_THAT(threads_of(1), ElementsAre(1));
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> shapes;
  for (const sweep_point& p : points_of("cores", 16)) {
    EXPECT_EQ(p.problem, sweep_problem(p.problem.batch, p.problem.seq_len, 768, 12,
                                       p.problem.cfg.n_kv_heads, p.problem.past));
    shapes.insert({p.problem.batch, p.problem.seq_len, p.problem.cfg.n_kv_heads, p.problem.past});
  }
  // (B, T, K/V heads: 0 for H, past)
  EXPECT_THAT(shapes, ElementsAre(std::tuple(1, 1, 0, 8192), std::tuple(1, 1, 3, 8192),
                                  std::tuple(1, 1024, 0, 0), std::tuple(4, 1024, 0, 0),
                                  std::tuple(8, 1, 0, 8192), std::tuple(8, 1, 3, 8192),
                                  std::tuple(32, 1, 0, 8192)));
}

TEST(BenchPresets, DecodeIsOneTokenOverCachesFrom128To32k) {
  std::set<std::pair<std::int64_t, std::int64_t>> steps;  // (B, past)
  for (const sweep_point& p : in_series(points_of("decode", 4), "decode")) {
    EXPECT_EQ(p.problem, sweep_problem(p.problem.batch, 1, 768, 12, 0, p.problem.past))
        << "GPT-2 small";
    EXPECT_TRUE(p.threads == 1 || p.threads == 4);
    steps.insert({p.problem.batch, p.problem.past});
  }
  std::set<std::pair<std::int64_t, std::int64_t>> expected;
  for (std::int64_t b : {1, 8, 32})
    for (std::int64_t past : {128, 512, 2048, 8192, 32768}) expected.insert({b, past});
  EXPECT_EQ(steps, expected);
}

TEST(BenchPresets, DecodeHasGroupedQueryStepsAtLongCaches) {
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> steps;  // (B, K/V heads, past)
  for (const sweep_point& p : in_series(points_of("decode", 2), "decode_kv")) {
    EXPECT_EQ(p.problem,
              sweep_problem(p.problem.batch, 1, 768, 12, p.problem.cfg.n_kv_heads, p.problem.past));
    steps.insert({p.problem.batch, p.problem.cfg.n_kv_heads, p.problem.past});
  }
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> expected;
  for (std::int64_t b : {1, 8})
    for (std::int64_t kv : {3, 1})
      for (std::int64_t past : {2048, 8192, 32768}) expected.insert({b, kv, past});
  EXPECT_EQ(steps, expected);
}

// The cache precisions of the decode preset: each plan precision with its own cache and with an
// int8 and a k8v4 one, at B1 and B32 over 2k and 8k; the float pairs mha does not keep are
// dropped, once each, with a notice naming the series.
TEST(BenchPresets, DecodeCacheHasEachPlanWithItsOwnCacheAndCodedOnes) {
  using mha::precision;
  std::set<std::tuple<std::int64_t, std::int64_t, precision, precision>> steps;
  for (const sweep_point& p : in_series(points_of("decode", 2), "decode_cache")) {
    EXPECT_EQ(p.problem, sweep_problem(p.problem.batch, 1, 768, 12, 0, p.problem.past,
                                       p.problem.cfg.precision, p.problem.cache_precision()));
    steps.insert(
        {p.problem.batch, p.problem.past, p.problem.cfg.precision, p.problem.cache_precision()});
  }
  std::set<std::tuple<std::int64_t, std::int64_t, precision, precision>> expected;
  for (std::int64_t b : {1, 32}) {
    for (std::int64_t past : {2048, 8192}) {
      for (precision plan : {precision::fp32, precision::bf16}) {
        expected.insert({b, past, plan, plan});
        expected.insert({b, past, plan, precision::int8});
        expected.insert({b, past, plan, precision::k8v4});
        expected.insert({b, past, plan, precision::int4});
      }
    }
  }
  EXPECT_EQ(steps, expected);
  const expansion e = mha_bench::expand(mha_bench::preset("decode", 2));
  EXPECT_THAT(e.dropped,
              ElementsAre("the bf16 KV cache with fp32 plans (series decode_cache): a float cache "
                          "is kept in its plan's precision",
                          "the fp32 KV cache with bf16 plans (series decode_cache): a float cache "
                          "is kept in its plan's precision",
                          "the bf16 KV cache with fp32 plans (series decode_long): a float cache "
                          "is kept in its plan's precision",
                          "the fp32 KV cache with bf16 plans (series decode_long): a float cache "
                          "is kept in its plan's precision"));
}

// Long contexts: one sequence over 32k and 128k cached tokens, each plan with its own cache, an
// int8, a k8v4 and an int4 one.
TEST(BenchPresets, DecodeLongIsOneSequenceOver32kAnd128k) {
  using mha::precision;
  std::set<std::tuple<std::int64_t, precision, precision>> steps;
  for (const sweep_point& p : in_series(points_of("decode", 2), "decode_long")) {
    EXPECT_EQ(p.problem.batch, 1);
    steps.insert({p.problem.past, p.problem.cfg.precision, p.problem.cache_precision()});
  }
  std::set<std::tuple<std::int64_t, precision, precision>> expected;
  for (std::int64_t past : {32768, 131072}) {
    for (precision plan : {precision::fp32, precision::bf16}) {
      expected.insert({past, plan, plan});
      expected.insert({past, plan, precision::int8});
      expected.insert({past, plan, precision::k8v4});
      expected.insert({past, plan, precision::int4});
    }
  }
  EXPECT_EQ(steps, expected);
}

// Grouped-query decode at a Llama-3-8B-like width: 32 query heads of 128 over 8 K/V heads, one
// sequence and eight over 8k cached tokens, fp32 and bf16 plans with their own caches.
TEST(BenchPresets, DecodeGqaIsALlama3LikeStepOver8k) {
  using mha::precision;
  std::set<std::tuple<std::int64_t, precision>> steps;
  for (const sweep_point& p : in_series(points_of("decode", 2), "decode_gqa")) {
    EXPECT_EQ(p.problem, sweep_problem(p.problem.batch, 1, 4096, 32, 8, 8192,
                                       p.problem.cfg.precision, p.problem.cfg.precision));
    EXPECT_EQ(p.problem.cfg.head_dim(), 128);
    steps.insert({p.problem.batch, p.problem.cfg.precision});
  }
  const std::set<std::tuple<std::int64_t, precision>> expected = {
      {1, precision::fp32}, {1, precision::bf16}, {8, precision::fp32}, {8, precision::bf16}};
  EXPECT_EQ(steps, expected);
}

// Sliding windows of 512 and 4,096 beside causal attention (0), prefill over 4k to 32k tokens and a
// decode step over as many; the window of 4,096 over 4,096 positions is causal, left out.
TEST(BenchPresets, WindowHasWindowsBesideCausalFrom4kTo32k) {
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> prefill, decode;  // (T, past, w)
  for (const sweep_point& p : points_of("window", 2)) {
    const mha::problem& q = p.problem;
    EXPECT_EQ(q, sweep_problem(1, q.seq_len, 768, 12, 0, q.past, mha::precision::fp32,
                               mha::precision::fp32, q.cfg.window));
    (q.past == 0 ? prefill : decode).insert({q.seq_len, q.past, q.cfg.window});
  }
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> want_prefill, want_decode;
  for (std::int64_t n : {4096, 8192, 16384, 32768}) {
    for (std::int64_t w : {0, 512, 4096}) {
      if (w != n) want_prefill.insert({n, 0, w});  // w 4096 covers every key at T 4096 ...
      want_decode.insert({1, n, w});               // ... but not past 4096 and 1 token
    }
  }
  EXPECT_EQ(prefill, want_prefill);
  EXPECT_EQ(decode, want_decode);
  const expansion e = mha_bench::expand(mha_bench::preset("window", 2));
  ASSERT_EQ(e.dropped.size(), 1u);
  EXPECT_THAT(e.dropped[0], HasSubstr("window 4096 over 4096 positions: it covers every key"));
}

TEST(BenchPresets, QuickIsAHandfulOfGpt2WideShapes) {
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;  // (T, H)
  for (const sweep_point& p : points_of("quick")) {
    EXPECT_EQ(p.problem.cfg.d_out, 768);
    shapes.insert({p.problem.seq_len, p.problem.cfg.n_heads});
  }
  EXPECT_GE(shapes.size(), 4u);
  EXPECT_LE(shapes.size(), 8u);
  EXPECT_TRUE(shapes.contains({1024, 12})) << "GPT-2 small";
}

TEST(BenchPresets, FullIsTheUnionWithoutDuplicates) {
  const auto full = points_of("full");
  const auto key = [](const sweep_point& p) {
    return std::tuple(p.problem.batch, p.problem.seq_len, p.problem.cfg.d_out,
                      p.problem.cfg.n_heads, p.problem.cfg.n_kv_heads, p.problem.past,
                      p.problem.cfg.precision, p.problem.cache_precision(), p.problem.cfg.window,
                      p.threads);
  };
  std::set<decltype(key(full.front()))> seen;
  for (const sweep_point& p : full) EXPECT_TRUE(seen.insert(key(p)).second) << "duplicate point";
  for (std::string_view name : {"quick", "heads", "seq", "threads", "decode", "window", "cores"}) {
    for (const sweep_point& p : points_of(name)) EXPECT_TRUE(seen.contains(key(p))) << name;
  }
  // GPT-2 small is in the quick, seq, threads and cores presets: one point, every series named.
  const auto gpt2 = std::find_if(full.begin(), full.end(), [](const sweep_point& p) {
    return p.problem == sweep_problem(1, 1024, 768, 12) && p.threads == 1;
  });
  ASSERT_NE(gpt2, full.end());
  EXPECT_THAT(gpt2->series, ElementsAre("gpt2_small", "seq", "threads", "cores_prefill"));
}

TEST(BenchPresets, ShapesOfOnePointAreContiguous) {
  const auto full = points_of("full");
  std::vector<mha::problem> order;
  for (const sweep_point& p : full) {
    if (order.empty() || !(order.back() == p.problem)) order.push_back(p.problem);
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    for (std::size_t j = i + 1; j < order.size(); ++j) EXPECT_FALSE(order[i] == order[j]);
  }
}

TEST(BenchPresets, UnknownPresetListsTheValidOnes) {
  try {
    mha_bench::preset("huge", 2);
    FAIL() << "no exception";
  } catch (const mha::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'huge'"));
    EXPECT_THAT(e.what(), HasSubstr("quick, heads, seq, threads, decode, window, cores, full"));
  }
}

}  // namespace
