// Properties every backend and formulation must have, beyond matching the oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "mha/registry.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using param = std::tuple<mha_test::backend_case, mha::formulation>;

class Properties : public testing::TestWithParam<param> {
 protected:
  const mha::backend& backend() const { return *std::get<0>(GetParam()).backend; }
  mha::formulation form() const { return std::get<1>(GetParam()); }

  std::vector<float> run(const mha::config& cfg, const mha::weights& w, const std::vector<float>& x,
                         std::int64_t batch, std::int64_t seq_len, const mha::run_options& o = {}) {
    return mha_test::forward(backend(), form(), cfg, w, x, batch, seq_len, o);
  }
};

mha::config make_config(std::int64_t d_in, std::int64_t d_out, std::int64_t heads,
                        std::int64_t ctx) {
  mha::config c;
  c.d_in = d_in;
  c.d_out = d_out;
  c.n_heads = heads;
  c.context_length = ctx;
  return c;
}

// Row t of a (batch, seq_len, features) tensor, as a vector.
std::vector<float> token(const std::vector<float>& y, std::int64_t b, std::int64_t t,
                         std::int64_t seq_len, std::int64_t features) {
  const auto first = y.begin() + (b * seq_len + t) * features;
  return {first, first + features};
}

// Changing token j leaves every output i < j bitwise unchanged, and does change output j.
TEST_P(Properties, CausalOutputsIgnoreLaterTokens) {
  const std::int64_t batch = 2, t = 37, j = 20;
  const mha::config cfg = make_config(24, 36, 6, t);
  const mha::weights w = mha::weights::random(cfg, 5);
  std::vector<float> x = mha_test::random_floats(batch * t * cfg.d_in, 6);
  const std::vector<float> before = run(cfg, w, x, batch, t);
  const std::vector<float> other = mha_test::random_floats(cfg.d_in, 7, 3.0f);
  for (std::int64_t b = 0; b < batch; ++b)
    std::copy(other.begin(), other.end(), x.begin() + (b * t + j) * cfg.d_in);
  const std::vector<float> after = run(cfg, w, x, batch, t);

  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < j; ++i) {
      EXPECT_EQ(token(before, b, i, t, cfg.d_out), token(after, b, i, t, cfg.d_out))
          << "b " << b << " token " << i;
    }
    EXPECT_NE(token(before, b, j, t, cfg.d_out), token(after, b, j, t, cfg.d_out));
  }
}

// Without the causal mask, earlier outputs do see a later token.
TEST_P(Properties, NonCausalOutputsSeeLaterTokens) {
  const std::int64_t t = 9, j = 8;
  mha::config cfg = make_config(8, 8, 2, t);
  cfg.causal = false;
  const mha::weights w = mha::weights::random(cfg, 5);
  std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 6);
  const std::vector<float> before = run(cfg, w, x, 1, t);
  for (std::int64_t f = 0; f < cfg.d_in; ++f) x[j * cfg.d_in + f] += 1.0f;
  const std::vector<float> after = run(cfg, w, x, 1, t);
  EXPECT_NE(token(before, 0, 0, t, cfg.d_out), token(after, 0, 0, t, cfg.d_out));
}

// Permuting the heads' weights (no out_proj) permutes the output's head blocks.
TEST_P(Properties, HeadPermutationPermutesOutputBlocks) {
  const std::int64_t t = 11, heads = 4;
  mha::config cfg = make_config(12, 20, heads, t);
  cfg.out_proj = false;
  const mha::weights w = mha::weights::random(cfg, 10);
  const std::int64_t order[heads] = {2, 0, 3, 1};  // head h of `permuted` is head order[h] of w
  std::vector<mha::head_weights> heads_of_w, permuted_heads;
  for (std::int64_t h = 0; h < heads; ++h) heads_of_w.push_back(w.head(cfg, h));
  for (std::int64_t h = 0; h < heads; ++h) permuted_heads.push_back(heads_of_w[order[h]]);
  const mha::weights permuted = mha::weights::from_heads(cfg, permuted_heads, {});

  const std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 11);
  const std::vector<float> y = run(cfg, w, x, 1, t), yp = run(cfg, permuted, x, 1, t);
  const std::int64_t hd = cfg.head_dim();
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t e = 0; e < hd; ++e) {
        EXPECT_NEAR(yp[i * cfg.d_out + h * hd + e], y[i * cfg.d_out + order[h] * hd + e], 1e-6)
            << "token " << i << " head " << h;
      }
    }
  }
}

// With V = 1 everywhere (zero value weights, bias 1) and no out_proj, every output is the sum of
// an attention row: softmax rows sum to 1.
TEST_P(Properties, AttentionRowsSumToOne) {
  const std::int64_t t = 33;
  mha::config cfg = make_config(10, 12, 3, t);
  cfg.qkv_bias = true;
  cfg.out_proj = false;
  mha::weights w = mha::weights::random(cfg, 12);
  std::fill(w.value.weight.begin(), w.value.weight.end(), 0.0f);
  std::fill(w.value.bias.begin(), w.value.bias.end(), 1.0f);
  const std::vector<float> y =
      run(cfg, w, mha_test::random_floats(2 * t * cfg.d_in, 13, 10.0f), 2, t);
  for (float v : y) ASSERT_NEAR(v, 1.0f, 1e-5f);
}

// Each batch element is computed as if alone.
TEST_P(Properties, BatchElementsAreIndependent) {
  const std::int64_t t = 21, batch = 3;
  const mha::config cfg = make_config(16, 24, 4, t);
  const mha::weights w = mha::weights::random(cfg, 14);
  const std::vector<float> x = mha_test::random_floats(batch * t * cfg.d_in, 15);
  const std::vector<float> y = run(cfg, w, x, batch, t);
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::vector<float> xb(x.begin() + b * t * cfg.d_in, x.begin() + (b + 1) * t * cfg.d_in);
    const std::vector<float> yb = run(cfg, w, xb, 1, t);
    const std::vector<float> slice(y.begin() + b * t * cfg.d_out,
                                   y.begin() + (b + 1) * t * cfg.d_out);
    EXPECT_LE(mha_test::max_abs_diff(slice, yb), 1e-6) << "batch element " << b;
  }
}

// A run with shorter T than context_length equals the prefix of a run with longer T (causal).
TEST_P(Properties, ShorterSequenceIsPrefixOfLonger) {
  const std::int64_t t = 30, prefix = 13;
  const mha::config cfg = make_config(16, 16, 2, t);
  const mha::weights w = mha::weights::random(cfg, 16);
  const std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 17);
  const std::vector<float> y = run(cfg, w, x, 1, t);
  const std::vector<float> yp = run(cfg, w, {x.begin(), x.begin() + prefix * cfg.d_in}, 1, prefix);
  EXPECT_LE(
      mha_test::max_abs_diff(yp, std::vector<float>(y.begin(), y.begin() + prefix * cfg.d_out)),
      1e-6);
}

// Huge scores (inputs x1000) must not overflow exp: the max is subtracted before exponentiating.
TEST_P(Properties, LargeScoresStayFinite) {
  const std::int64_t t = 16;
  const mha::config cfg = make_config(8, 8, 2, t);
  const mha::weights w = mha::weights::random(cfg, 18);
  const std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 19, 1000.0f);
  const std::vector<float> y = run(cfg, w, x, 1, t);
  const std::vector<double> ref = mha_reference::forward(cfg, w, x, 1, t);
  for (float v : y) ASSERT_TRUE(std::isfinite(v));
  // Scores near 1e5 carry float32 rounding of ~1e-2 into the exponent; the outputs follow.
  EXPECT_LE(mha_test::max_abs_diff(y, ref), 2e-2 * mha_test::max_abs(ref));
}

// NaN in the input propagates as IEEE arithmetic does and nothing crashes: every token that
// attends to the NaN token is NaN.
TEST_P(Properties, NanInputPropagates) {
  const std::int64_t t = 5;
  const mha::config cfg = make_config(8, 8, 2, t);
  const mha::weights w = mha::weights::random(cfg, 20);
  std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 21);
  x[2 * cfg.d_in] = std::nanf("");  // token 2
  const std::vector<float> y = run(cfg, w, x, 1, t);
  for (std::int64_t i = 2; i < t; ++i) {
    for (float v : token(y, 0, i, t, cfg.d_out)) EXPECT_TRUE(std::isnan(v)) << "token " << i;
  }
}

// Row i depends only on tokens <= i, even when a later token is NaN or Inf: masked keys never
// enter the arithmetic (no 0 * NaN from a masked weight, no micro-block computing keys past a
// row's causal limit) (issue 17 H). Shapes past one micro-block and one key tile.
TEST_P(Properties, NonFiniteLateTokenLeavesEarlierRowsUnchanged) {
  const std::int64_t batch = 2;
  for (const std::int64_t t : {2, 5, 9, 17, 33, 70, 131, 600}) {
    mha::config cfg = make_config(16, 24, 3, t);
    const mha::weights w = mha::weights::random(cfg, 22);
    const std::vector<float> x = mha_test::random_floats(batch * t * cfg.d_in, 23);
    for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x_bad = x;
      for (std::int64_t b = 0; b < batch; ++b) x_bad[((b + 1) * t - 1) * cfg.d_in + 3] = bad;
      for (const bool training : {false, true}) {
        cfg.dropout = training ? 0.25f : 0.0f;
        const mha::run_options o{.threads = 0, .training = training, .seed = 4};
        const std::vector<float> clean = run(cfg, w, x, batch, t, o);
        const std::vector<float> y = run(cfg, w, x_bad, batch, t, o);
        for (std::int64_t b = 0; b < batch; ++b) {
          for (std::int64_t i = 0; i + 1 < t; ++i) {
            const std::vector<float> row = token(y, b, i, t, cfg.d_out);
            ASSERT_EQ(row, token(clean, b, i, t, cfg.d_out))
                << "T " << t << " b " << b << " token " << i << " late token " << bad
                << (training ? " training" : " inference");
            for (float v : row) ASSERT_TRUE(std::isfinite(v));
          }
        }
      }
    }
  }
}

// A value that overflows to Inf in a late token, in bf16 at head_dim 32 and 64, where AMX runs
// P V on tiles: the keys of the diagonal, which only a tile's later rows see, enter the tiles
// with their NaN and Inf set to 0 and come back only for the rows that see them. Earlier rows
// keep their bits; the token's own row and every later one are not finite (through V alone:
// the feature that overflows has no weight in Q and K, which stay finite). Late tokens at every
// offset of a 16-row tile, spread over the sequence: 20, 37, ..., 292, a step of 17 (elsewhere
// this runs the vector kernels).
TEST_P(Properties, Bf16InfiniteLateValueReachesOnlyTheRowsThatSeeIt) {
  const std::int64_t t = 300, feature = 5;
  for (const std::int64_t heads : {2, 1}) {
    mha::config cfg = make_config(16, 64, heads, t);
    cfg.precision = mha::precision::bf16;
    MHA_TEST_SKIP_IF_DECLINED(std::get<0>(GetParam()), {cfg, form(), 1, t});
    mha::weights w = mha::weights::random(cfg, 31);
    for (std::int64_t o = 0; o < cfg.d_out; ++o) {
      w.query.weight[o * cfg.d_in + feature] = 0.0f;
      w.key.weight[o * cfg.d_in + feature] = 0.0f;
      w.value.weight[o * cfg.d_in + feature] = o % 2 == 0 ? 4.0f : -4.0f;  // 4 x 3e38 is Inf
    }
    const std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 32);
    const std::vector<float> clean = run(cfg, w, x, 1, t);
    for (std::int64_t late = 20; late < t; late += 17) {
      std::vector<float> x_bad = x;
      x_bad[late * cfg.d_in + feature] = 3e38f;
      const std::vector<float> y = run(cfg, w, x_bad, 1, t);
      for (std::int64_t i = 0; i < t; ++i) {
        const std::vector<float> row = token(y, 0, i, t, cfg.d_out);
        if (i < late) {
          ASSERT_EQ(row, token(clean, 0, i, t, cfg.d_out))
              << "H " << heads << " token " << i << " late token " << late;
        } else {
          ASSERT_FALSE(
              std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); }))
              << "H " << heads << " token " << i << " sees late token " << late;
        }
      }
    }
  }
}

// Two runs of one plan give bitwise identical output; so do two plans of the same weights.
TEST_P(Properties, Deterministic) {
  const std::int64_t t = 18;
  const mha::config cfg = make_config(20, 24, 3, t);
  const mha::weights w = mha::weights::random(cfg, 22);
  const std::vector<float> x = mha_test::random_floats(2 * t * cfg.d_in, 23);
  const auto plan = backend().prepare(cfg, form(), w);
  std::vector<float> y1(2 * t * cfg.d_out), y2(y1.size());
  plan->run({x.data(), 2, t, cfg.d_in}, {y1.data(), 2, t, cfg.d_out});
  plan->run({x.data(), 2, t, cfg.d_in}, {y2.data(), 2, t, cfg.d_out});
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(y1, run(cfg, w, x, 2, t));
}

// run() is const and thread-safe: threads sharing one plan, with different batch sizes (so
// per-call scratch of different sizes), get exactly what sequential runs get.
TEST_P(Properties, ConcurrentRunsMatchSequentialRuns) {
  const std::int64_t t = 12;
  const mha::config cfg = make_config(16, 24, 4, t);
  const auto plan = backend().prepare(cfg, form(), mha::weights::random(cfg, 26));
  constexpr int callers = 4;
  std::vector<std::vector<float>> x(callers), expected(callers), got(callers);
  for (int c = 0; c < callers; ++c) {
    const std::int64_t batch = c + 1;
    x[c] = mha_test::random_floats(batch * t * cfg.d_in, 27 + c);
    expected[c].resize(batch * t * cfg.d_out);
    got[c].resize(expected[c].size());
    plan->run({x[c].data(), batch, t, cfg.d_in}, {expected[c].data(), batch, t, cfg.d_out});
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      for (int repeat = 0; repeat < 3; ++repeat)
        plan->run({x[c].data(), c + 1, t, cfg.d_in}, {got[c].data(), c + 1, t, cfg.d_out});
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int c = 0; c < callers; ++c) EXPECT_EQ(got[c], expected[c]) << "caller " << c;
}

// A plan keeps no reference to the weights it was prepared from.
TEST_P(Properties, PlanOwnsItsWeights) {
  const std::int64_t t = 6;
  const mha::config cfg = make_config(8, 12, 3, t);
  auto w = std::make_unique<mha::weights>(mha::weights::random(cfg, 24));
  const std::vector<float> x = mha_test::random_floats(t * cfg.d_in, 25);
  const std::vector<float> expected = run(cfg, *w, x, 1, t);
  const auto plan = backend().prepare(cfg, form(), *w);
  w.reset();
  std::vector<float> y(t * cfg.d_out);
  plan->run({x.data(), 1, t, cfg.d_in}, {y.data(), 1, t, cfg.d_out});
  EXPECT_EQ(y, expected);
}

std::string param_name(const testing::TestParamInfo<param>& info) {
  return std::get<0>(info.param).label + "_" + std::string(mha::to_string(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(All, Properties,
                         testing::Combine(testing::ValuesIn(mha_test::backend_cases()),
                                          testing::ValuesIn(mha::formulations())),
                         param_name);

// The formulations compute the same function (once per backend), with grouped K/V heads and
// rotary embedding too.
class Formulations : public testing::TestWithParam<mha_test::backend_case> {};

TEST_P(Formulations, EveryFormulationComputesTheSameFunction) {
  const mha::backend& backend = *GetParam().backend;
  for (const bool grouped : {false, true}) {
    // Grouped: multi-query with rotary embedding, at head_dim 16 (rotation needs it even).
    mha::config cfg = make_config(40, grouped ? 80 : 60, 5, 19);
    cfg.qkv_bias = true;
    if (grouped) {
      cfg.n_kv_heads = 1;
      cfg.rope_base = 10000.0;
    }
    const mha::weights w = mha::weights::random(cfg, 8);
    const std::vector<float> x = mha_test::random_floats(3 * 19 * cfg.d_in, 9, 4.0f);
    const auto split = mha_test::forward(backend, mha::formulation::split_weight, cfg, w, x, 3, 19);
    const double scale = mha_test::max_abs(split);
    ASSERT_GT(scale, 0.0);
    for (const mha::formulation form : mha::formulations()) {
      EXPECT_LE(mha_test::max_abs_diff(mha_test::forward(backend, form, cfg, w, x, 3, 19), split),
                1e-5 * scale)
          << mha::to_string(form) << (grouped ? " grouped, rotary" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Formulations, testing::ValuesIn(mha_test::backend_cases()),
                         [](const testing::TestParamInfo<mha_test::backend_case>& p) {
                           return p.param.label;
                         });

}  // namespace
