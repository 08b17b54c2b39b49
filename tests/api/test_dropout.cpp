// Training-mode dropout (docs/design.md §1.1): the shared counter-based mask and its use by
// backends.
#include <gtest/gtest.h>

#include <cmath>

#include "base/dropout.hpp"
#include "base/philox.hpp"
#include "mha/registry.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using mha::detail::dropout_spec;

// Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
TEST(Philox, MatchesRandom123KnownAnswers) {
  using mha::detail::philox4x32_10;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (mha::detail::philox_counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (mha::detail::philox_counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (mha::detail::philox_counter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// The keep rate over 2^20 decisions is within 6 standard deviations of 1 - p.
TEST(DropoutMask, KeepRateWithinBinomialBounds) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const dropout_spec d{p, 2024};
    const std::int64_t n = 1 << 20, side = 1024;
    std::int64_t kept = 0;
    for (std::int64_t i = 0; i < side; ++i)
      for (std::int64_t j = 0; j < side; ++j) kept += mha::detail::dropout_keep(d, 1, 2, i, j);
    const double mean = n * (1.0 - p), sigma = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(kept), mean, 6 * sigma) << "p = " << p;
  }
}

// Row segments starting anywhere agree with the element-wise decision (tiles may start mid-word).
TEST(DropoutMask, MultipliersMatchKeepDecisions) {
  const dropout_spec d{0.3f, 77};
  for (std::int64_t j0 : {0, 1, 3, 5}) {
    std::vector<float> m(23);
    mha::detail::dropout_multipliers(d, 2, 5, 9, j0, j0 + 23, m.data());
    for (std::int64_t j = j0; j < j0 + 23; ++j) {
      EXPECT_EQ(m[j - j0], mha::detail::dropout_keep(d, 2, 5, 9, j) ? 1.0f / 0.7f : 0.0f)
          << "j0 " << j0 << " j " << j;
    }
  }
}

// Each coordinate of (b, h, i, j) and the seed changes the mask.
TEST(DropoutMask, EveryCoordinateMatters) {
  const dropout_spec d{0.5f, 1}, other_seed{0.5f, 2};
  auto row = [](const dropout_spec& s, std::int64_t b, std::int64_t h, std::int64_t i) {
    std::vector<bool> keep;
    for (std::int64_t j = 0; j < 64; ++j) keep.push_back(mha::detail::dropout_keep(s, b, h, i, j));
    return keep;
  };
  const auto base = row(d, 0, 0, 0);
  EXPECT_NE(base, row(d, 1, 0, 0));
  EXPECT_NE(base, row(d, 0, 1, 0));
  EXPECT_NE(base, row(d, 0, 0, 1));
  EXPECT_NE(base, row(other_seed, 0, 0, 0));
  EXPECT_EQ(base, row(d, 0, 0, 0));
}

class Dropout : public testing::TestWithParam<mha_test::backend_form_param> {
 protected:
  static constexpr std::int64_t batch = 2, t = 24;
  mha::config cfg(float p) const {
    mha::config c;
    c.d_in = 12;
    c.d_out = 16;
    c.n_heads = 4;
    c.context_length = t;
    c.dropout = p;
    return c;
  }
  std::vector<float> run(float p, const mha::run_options& options) const {
    const mha::config c = cfg(p);
    return mha_test::forward(*std::get<0>(GetParam()).backend, std::get<1>(GetParam()), c,
                             mha::weights::random(c, 3), x, batch, t, options);
  }
  const std::vector<float> x = mha_test::random_floats(batch * t * 12, 4, 2.0f);
};

TEST_P(Dropout, InferenceIgnoresP) { EXPECT_EQ(run(0.5f, {}), run(0.0f, {})); }

TEST_P(Dropout, ZeroPTrainingEqualsInference) {
  EXPECT_EQ(run(0.0f, {.threads = 0, .training = true, .seed = 9}), run(0.0f, {}));
}

TEST_P(Dropout, SameSeedSameMaskOtherSeedOtherMask) {
  const auto a = run(0.4f, {.threads = 0, .training = true, .seed = 1});
  EXPECT_EQ(a, run(0.4f, {.threads = 0, .training = true, .seed = 1}));
  EXPECT_NE(a, run(0.4f, {.threads = 0, .training = true, .seed = 2}));
  EXPECT_NE(a, run(0.4f, {}));
}

// The backend applies exactly the shared mask: it matches the oracle in training mode.
TEST_P(Dropout, MatchesReferenceInTrainingMode) {
  const mha::config c = cfg(0.3f);
  const mha::weights w = mha::weights::random(c, 3);
  const mha::run_options options{.threads = 0, .training = true, .seed = 5};
  const auto expected = mha_reference::forward(c, w, x, batch, t, options);
  EXPECT_LE(mha_test::max_abs_diff(run(0.3f, options), expected),
            1e-5 * mha_test::max_abs(expected));
}

INSTANTIATE_TEST_SUITE_P(All, Dropout, mha_test::backend_form_params(),
                         mha_test::backend_form_name);

}  // namespace
