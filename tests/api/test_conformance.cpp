// One suite over every built backend x formulation x awkward shape, against the double oracle.
// Later backends join by being in mha::available_backends().
#include <gtest/gtest.h>

#include "mha/registry.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using mha_test::shape;
using param = mha_test::conformance_param;

// Allowed error relative to max|y|: float32 accumulation over K <= 96 terms in the projections
// and T <= 65 in attention stays within a few ulp of the largest output.
constexpr double relative_tolerance = 1e-5;

class Conformance : public testing::TestWithParam<param> {};

TEST_P(Conformance, MatchesDoubleReference) {
  const auto& [backend, form, s] = GetParam();
  const mha::config cfg = s.config();
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, s.seq_len});
  const auto [w, x] = mha_test::inputs_of(cfg, s);
  const std::vector<float> y =
      mha_test::forward(*backend.backend, form, cfg, w, x, s.batch, s.seq_len);
  const std::vector<double> expected = mha_reference::forward(cfg, w, x, s.batch, s.seq_len);

  const double scale = mha_test::max_abs(expected);
  ASSERT_GT(scale, 0.0);
  EXPECT_LE(mha_test::max_abs_diff(y, expected), relative_tolerance * scale)
      << "max |y| = " << scale;
}

INSTANTIATE_TEST_SUITE_P(All, Conformance, mha_test::conformance_params(),
                         mha_test::conformance_param_name);

}  // namespace
