// The public API's plain parts: registry, problem strings, FLOP formula, weights, views.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "mha/mha.hpp"

namespace {

TEST(Registry, NaiveIsAlwaysLast) {
  const auto& list = mha::available_backends();
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(list.back()->name(), "naive");
  EXPECT_EQ(list.back(), &mha::naive_backend());
}

TEST(Registry, NamesAreUniqueAndFound) {
  std::set<std::string_view> names;
  for (const mha::backend* b : mha::available_backends()) {
    EXPECT_TRUE(names.insert(b->name()).second) << b->name();
    EXPECT_EQ(mha::find_backend(b->name()), b);
    EXPECT_EQ(&mha::require_backend(b->name()), b);
    EXPECT_FALSE(b->description().empty());
  }
  EXPECT_EQ(mha::find_backend("no-such-backend"), nullptr);
}

TEST(Registry, ListMatchesBuildConfig) {
  const std::size_t expected = 1 + MHA_WITH_XSIMD + MHA_WITH_ONEDNN + MHA_WITH_TBB;
  EXPECT_EQ(mha::available_backends().size(), expected);
}

TEST(Registry, DefaultHonoursEnvironment) {
  ::unsetenv("MHA_BACKEND");
  EXPECT_EQ(&mha::default_backend(), mha::available_backends().front());
  ::setenv("MHA_BACKEND", "naive", 1);
  EXPECT_EQ(&mha::default_backend(), &mha::naive_backend());
  ::setenv("MHA_BACKEND", "", 1);
  EXPECT_EQ(&mha::default_backend(), mha::available_backends().front());
  ::unsetenv("MHA_BACKEND");
}

TEST(Formulation, NamesRoundTrip) {
  for (auto f : {mha::formulation::wrapper, mha::formulation::split_weight})
    EXPECT_EQ(mha::parse_formulation(mha::to_string(f)), f);
  EXPECT_EQ(mha::to_string(mha::formulation::split_weight), "split_weight");
}

TEST(Problem, CanonicalString) {
  mha::problem p;
  p.cfg = {.d_in = 768, .d_out = 768, .n_heads = 12, .context_length = 1024};
  p.batch = 4;
  p.seq_len = 256;
  EXPECT_EQ(mha::to_string(p), "split_weight/b4/t256/din768/dout768/h12");
  p.form = mha::formulation::wrapper;
  p.cfg.causal = false;
  p.cfg.qkv_bias = true;
  p.cfg.out_proj = false;
  EXPECT_EQ(mha::to_string(p), "wrapper/b4/t256/din768/dout768/h12/noncausal/qkv_bias/no_out_proj");
}

TEST(Problem, FlopsFollowTheFormula) {
  mha::problem p;
  p.cfg = {.d_in = 4, .d_out = 6, .n_heads = 2, .context_length = 3};
  p.batch = 2;
  p.seq_len = 3;
  // QKV 2*2*3*4*6*3 = 864, out_proj 2*2*3*6*6 = 432, attention 4*2*2*3*(3*4/2) = 288.
  EXPECT_EQ(mha::flops(p), 864.0 + 432.0 + 288.0);
  p.cfg.causal = false;  // 9 pairs instead of 6
  EXPECT_EQ(mha::flops(p), 864.0 + 432.0 + 432.0);
  p.cfg.out_proj = false;
  EXPECT_EQ(mha::flops(p), 864.0 + 432.0);
}

TEST(Problem, Gpt2SmallFlops) {
  mha::problem p;
  p.cfg = {.d_in = 768, .d_out = 768, .n_heads = 12, .context_length = 1024};
  p.seq_len = 1024;
  const double expected = 2.0 * 1024 * 768 * 768 * 4 + 4.0 * 12 * 64 * (1024.0 * 1025 / 2);
  EXPECT_EQ(mha::flops(p), expected);
}

mha::config small_config(bool qkv_bias, bool out_proj) {
  return {.d_in = 6,
          .d_out = 8,
          .n_heads = 2,
          .context_length = 4,
          .qkv_bias = qkv_bias,
          .out_proj = out_proj};
}

TEST(Weights, RandomIsReproducibleAndSeeded) {
  const mha::config c = small_config(true, true);
  const auto a = mha::weights::random(c, 1), b = mha::weights::random(c, 1),
             d = mha::weights::random(c, 2);
  EXPECT_EQ(a.query.weight, b.query.weight);
  EXPECT_EQ(a.out_proj.bias, b.out_proj.bias);
  EXPECT_NE(a.query.weight, d.query.weight);
  EXPECT_NE(a.query.weight, a.key.weight);
}

TEST(Weights, RandomFollowsNnLinearDistribution) {
  const mha::config c{.d_in = 100, .d_out = 400, .n_heads = 4, .context_length = 1};
  const auto w = mha::weights::random(c, 7);
  const float bound = 1.0f / std::sqrt(100.0f);
  const auto [lo, hi] = std::minmax_element(w.query.weight.begin(), w.query.weight.end());
  EXPECT_GE(*lo, -bound);
  EXPECT_LT(*hi, bound);
  EXPECT_LT(*lo, -0.99f * bound);  // 40000 draws reach both ends
  EXPECT_GT(*hi, 0.99f * bound);
  double mean = 0.0;
  for (float v : w.query.weight) mean += v;
  mean /= static_cast<double>(w.query.weight.size());
  EXPECT_NEAR(mean, 0.0, 6 * bound / std::sqrt(3.0 * 40000));
  // out_proj's fan-in is d_out.
  const float out_bound = 1.0f / std::sqrt(400.0f);
  for (float v : w.out_proj.weight) ASSERT_LE(std::abs(v), out_bound);
}

TEST(Weights, BiasesFollowConfig) {
  const auto with = mha::weights::random(small_config(true, true), 1);
  EXPECT_EQ(with.query.bias.size(), 8u);
  EXPECT_EQ(with.out_proj.bias.size(), 8u);
  const auto without = mha::weights::random(small_config(false, false), 1);
  EXPECT_TRUE(without.query.bias.empty());
  EXPECT_EQ(without.out_proj.out, 0);
  EXPECT_TRUE(without.out_proj.weight.empty());
}

TEST(Weights, HeadIsRowSliceAndFromHeadsInvertsIt) {
  const mha::config c = small_config(true, true);
  const auto w = mha::weights::random(c, 3);
  const mha::head_weights h1 = w.head(c, 1);
  ASSERT_EQ(h1.value.out, 4);
  ASSERT_EQ(h1.value.in, 6);
  EXPECT_EQ(h1.value.weight, std::vector<float>(w.value.weight.begin() + 24, w.value.weight.end()));
  EXPECT_EQ(h1.value.bias, std::vector<float>(w.value.bias.begin() + 4, w.value.bias.end()));
  EXPECT_NE(h1.query.weight.data(), w.query.weight.data() + 24);  // its own storage

  const std::vector<mha::head_weights> heads = {w.head(c, 0), h1};
  const auto back = mha::weights::from_heads(c, heads, w.out_proj);
  EXPECT_EQ(back.query.weight, w.query.weight);
  EXPECT_EQ(back.key.bias, w.key.bias);
  EXPECT_EQ(back.value.out, 8);
}

TEST(TensorView, SpanOfMatchingSize) {
  std::vector<float> storage(24);
  const mha::tensor_view<float> v(std::span<float>(storage), 2, 3, 4);
  EXPECT_EQ(v.data(), storage.data());
  EXPECT_EQ(v.size(), 24);
  const mha::tensor_view<const float> c = v;
  EXPECT_EQ(c.features(), 4);
}

}  // namespace
