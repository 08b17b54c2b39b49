// The oracle itself, against cases whose answer follows from the formulas by hand.
#include <gtest/gtest.h>

#include "reference.hpp"
#include "support.hpp"

namespace {

mha::linear_weights layer(std::int64_t out, std::int64_t in, std::vector<float> weight,
                          std::vector<float> bias = {}) {
  return {out, in, std::move(weight), std::move(bias)};
}

// With one token, attention weights are [1]: y = Wo (Wv x + bv) + bo whatever Q and K are.
TEST(Reference, SingleTokenIsValueThenOutProj) {
  const mha::config cfg{.d_in = 2, .d_out = 2, .n_heads = 1, .context_length = 1, .qkv_bias = true};
  mha::weights w;
  w.query = layer(2, 2, {5, 6, 7, 8}, {1, 1});
  w.key = layer(2, 2, {-1, 2, 3, -4}, {0, 2});
  w.value = layer(2, 2, {1, 2, 3, 4}, {0.5f, -0.5f});
  w.out_proj = layer(2, 2, {2, 0, 1, 1}, {10, 20});
  const std::vector<float> x = {1, -1};
  // v = (1 - 2 + 0.5, 3 - 4 - 0.5) = (-0.5, -1.5); y = (2 * -0.5 + 10, -0.5 - 1.5 + 20).
  EXPECT_EQ(mha_reference::forward(cfg, w, x, 1, 1), (std::vector<double>{9.0, 18.0}));
}

// Equal keys give equal scores, so token i averages the values of tokens 0..i (causal) or of
// every token (non-causal). Two heads of one dimension each, identity value weights.
TEST(Reference, EqualKeysAverageTheVisibleValues) {
  mha::config cfg{.d_in = 2, .d_out = 2, .n_heads = 2, .context_length = 3, .out_proj = false};
  mha::weights w;
  w.query = layer(2, 2, {1, 0, 0, 1});
  w.key = layer(2, 2, {0, 0, 0, 0});
  w.value = layer(2, 2, {1, 0, 0, 1});
  const std::vector<float> x = {3, 30, 6, 60, 9, 90};  // three tokens
  EXPECT_EQ(mha_reference::forward(cfg, w, x, 1, 3), (std::vector<double>{3, 30, 4.5, 45, 6, 60}));
  cfg.causal = false;
  EXPECT_EQ(mha_reference::forward(cfg, w, x, 1, 3), (std::vector<double>{6, 60, 6, 60, 6, 60}));
}

// Sampled rows are exactly the corresponding rows of the full output.
TEST(Reference, RowsMatchFullForward) {
  const mha::config cfg{.d_in = 6, .d_out = 8, .n_heads = 2, .context_length = 9, .qkv_bias = true};
  const mha::weights w = mha::weights::random(cfg, 3);
  const std::vector<float> x = mha_test::random_floats(3 * 9 * 6, 4);
  const std::vector<double> full = mha_reference::forward(cfg, w, x, 3, 9);
  const std::vector<mha_reference::row> rows = {{2, 8}, {0, 0}, {2, 3}};
  const std::vector<double> some = mha_reference::forward_rows(cfg, w, x, 3, 9, rows);
  ASSERT_EQ(some.size(), 3u * 8u);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::int64_t e = 0; e < 8; ++e) {
      EXPECT_EQ(some[r * 8 + e], full[(rows[r].batch * 9 + rows[r].token) * 8 + e]) << r;
    }
  }
}

}  // namespace
