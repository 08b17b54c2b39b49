// bf16 modules (docs/design.md §1.5) on every backend that computes them: the accuracy the
// design states, against the double oracle on bf16-rounded operands (tight) and against the
// fp32 function (the derived bound); decode through a cache that holds bf16; thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "mha/backends/xsimd.hpp"
#include "mha/build_config.hpp"
#include "reference.hpp"
#include "support.hpp"
#if MHA_WITH_TBB
#include "mha/backends/tbb.hpp"
#endif

namespace {

using mha::formulation;
using mha_test::shape;
using param = mha_test::conformance_param;

// bf16's unit roundoff: half a unit in the last place of its 8 significant bits.
const double u = std::ldexp(1.0, -9);

mha::config bf16_config(const shape& s) {
  mha::config cfg = s.config();
  cfg.precision = mha::precision::bf16;
  return cfg;
}

class Bf16 : public testing::TestWithParam<param> {};

// Against the oracle of the same function (operands rounded, sums exact): the only differences
// are fp32 sums and a rounding that lands on the other side of a bf16 tie for fp32 than for
// double, or of the softmax weights formed against a running rather than the final row max:
// each moves an operand by one bf16 unit, 2u of it. Bound: 2u * max|y| (measured up to 1.1e-3
// = 0.56 of it at T = 600, 1e-7 at most shapes).
TEST_P(Bf16, MatchesTheOracleOnRoundedOperands) {
  const auto& [backend, form, s] = GetParam();
  const mha::config cfg = bf16_config(s);
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, s.seq_len});
  const auto [w, x] = mha_test::inputs_of(cfg, s);
  const std::vector<float> y =
      mha_test::forward(*backend.backend, form, cfg, w, x, s.batch, s.seq_len);
  const std::vector<double> expected = mha_reference::forward(cfg, w, x, s.batch, s.seq_len);
  EXPECT_LE(mha_test::max_abs_diff(y, expected),
            mha_reference::bf16_bound * mha_test::max_abs(expected));
}

// Against the fp32 function: |y - y_fp32| <= u (4 + 4 S) max|y_fp32|, S the largest |score|
// (docs/design.md §1.5 derives it: the rounded operands of the projections and out_proj, and
// the softmax's sensitivity to its scores). Measured at most u (1.5 + 0.35 S) here.
TEST_P(Bf16, StaysWithinTheStatedBoundOfFp32) {
  const auto& [backend, form, s] = GetParam();
  const mha::config cfg = bf16_config(s);
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, s.seq_len});
  const mha::config fp32 = s.config();
  for (const float input_scale : {1.0f, 10.0f}) {
    const auto [w, x] = mha_test::inputs_of(cfg, s, input_scale);
    const std::vector<float> y =
        mha_test::forward(*backend.backend, form, cfg, w, x, s.batch, s.seq_len);
    const std::vector<double> expected = mha_reference::forward(fp32, w, x, s.batch, s.seq_len);
    const double scores = mha_reference::max_abs_score(fp32, w, x, s.batch, s.seq_len);
    EXPECT_LE(mha_test::max_abs_diff(y, expected),
              u * (4 + 4 * scores) * mha_test::max_abs(expected))
        << "inputs x" << input_scale << ", largest |score| " << scores;
  }
}

INSTANTIATE_TEST_SUITE_P(All, Bf16, mha_test::conformance_params(),
                         mha_test::conformance_param_name);

// A bf16 plan's cache holds bf16: half an fp32 plan's bytes; a generation loop through it gives
// the full forward's rows, bit for bit on the backends whose decode shares their kernels.
class Bf16Decode : public testing::TestWithParam<mha_test::backend_form_param> {};

// Grouped K/V heads with head_dim 16 and 8 (a full forward packs a head of fewer than 16
// dimensions into wider V panels than its cache holds: AMX runs its P V on tiles), and one K/V
// head per query head (a token's single row runs on vectors where the full forward's run on
// tiles): the tokens equal the full forward.
TEST_P(Bf16Decode, CacheHoldsBf16AndTokensEqualTheFullForward) {
  const auto& [backend, form] = GetParam();
  for (const auto& [heads, kv_heads] :
       {std::pair<std::int64_t, std::int64_t>{4, 2}, {8, 2}, {4, 0}}) {
    SCOPED_TRACE(testing::Message() << "heads " << heads << ", kv heads " << kv_heads);
    const shape s{2, 40, 24, 64, heads, true, true, true, kv_heads, 10000.0};
    const mha::config cfg = bf16_config(s);
    MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, 1, 8});
    const mha::weights w = mha::weights::random(cfg, 5);
    const std::vector<float> x =
        mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 6, 2.0f);
    const auto p = backend.backend->prepare(cfg, form, w);
    const auto fp32 = backend.backend->prepare(s.config(), form, w);
    mha::kv_cache cache = p->make_cache(s.batch, 32);
    EXPECT_EQ(cache.bytes() * 2, fp32->make_cache(s.batch, 32).bytes());

    std::vector<float> full(static_cast<std::size_t>(s.batch * 32 * cfg.d_out));
    std::vector<float> x32;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      x32.insert(x32.end(), x.begin() + b * s.seq_len * s.d_in,
                 x.begin() + (b * s.seq_len + 32) * s.d_in);
    }
    p->run({x32.data(), s.batch, 32, cfg.d_in}, {full.data(), s.batch, 32, cfg.d_out});
    // 20 tokens, then one at a time.
    std::vector<float> got(full.size());
    for (std::int64_t at = 0; at < 32;) {
      const std::int64_t t = at == 0 ? 20 : 1;
      std::vector<float> xs, ys(static_cast<std::size_t>(s.batch * t * cfg.d_out));
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const auto from = x32.begin() + (b * 32 + at) * cfg.d_in;
        xs.insert(xs.end(), from, from + t * cfg.d_in);
      }
      p->run({xs.data(), s.batch, t, cfg.d_in}, {ys.data(), s.batch, t, cfg.d_out}, cache);
      for (std::int64_t b = 0; b < s.batch; ++b) {
        std::copy_n(ys.begin() + b * t * cfg.d_out, t * cfg.d_out,
                    got.begin() + (b * 32 + at) * cfg.d_out);
      }
      at += t;
    }
    if (mha_test::decodes_bitwise(*backend.backend)) {
      EXPECT_EQ(got, full);
    } else {
      EXPECT_LE(mha_test::max_abs_diff(got, full), 4 * u * mha_test::max_abs(full));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Bf16Decode, mha_test::backend_form_params(),
                         mha_test::backend_form_name);

#if MHA_WITH_TBB
// The parallel bf16 kernels are the xsimd ones on pieces: every thread count gives the xsimd
// backend's bits.
TEST(Bf16Tbb, EveryThreadCountEqualsTheXsimdBackend) {
  const shape s{3, 130, 64, 96, 12, true, true, true, 4};
  const mha::config cfg = bf16_config(s);
  const mha::weights w = mha::weights::random(cfg, 9);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 10, 2.0f);
  for (formulation form : mha::formulations()) {
    const std::vector<float> expected =
        mha_test::forward(mha::xsimd_backend(), form, cfg, w, x, s.batch, s.seq_len);
    for (int threads : {1, 2, 3}) {
      EXPECT_EQ(mha_test::forward(mha::tbb_backend(), form, cfg, w, x, s.batch, s.seq_len,
                                  {.threads = threads}),
                expected)
          << mha::to_string(form) << " threads " << threads;
    }
  }
}
#endif

}  // namespace
