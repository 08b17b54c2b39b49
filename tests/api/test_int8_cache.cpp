// The int8 and k8v4 KV caches (docs/design.md §1.7) on every backend that keeps them: their rows'
// codes, the same arithmetic as the naive reference, int8's derived bound against the exact
// function (random inputs, an outlier channel, a long context), split keys bitwise for every
// thread count, and what declines them.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "base/int8.hpp"
#include "base/value4.hpp"
#include "mha/backends/naive.hpp"
#include "mha/error.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using mha::formulation;
using mha::precision;

// ---- one row's codes ----

// Every element within half a step of its value (plus a float rounding), the step the smallest
// bf16 at or above max(range / 254, |min| / 32767), so within int8_element_error of the row's
// largest magnitude; the offset less than a step below the smallest element.
void expect_row_within_its_bound(const std::vector<float>& x) {
  std::vector<std::uint8_t> codes(x.size());
  const mha::detail::int8_row row =
      mha::detail::quantize_row(x.data(), static_cast<std::int64_t>(x.size()), codes.data());
  const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
  const float wanted = std::max((*hi - *lo) / 254.0f, std::abs(*lo) / 32767.0f);
  const float step = row.scale();
  ASSERT_GE(step, wanted);
  ASSERT_EQ(mha::detail::round_bf16(step), step);
  // The bf16 just below the step (one unit less in its top half) would not cover the row.
  const float below = std::bit_cast<float>(std::bit_cast<std::uint32_t>(step) - 0x10000u);
  EXPECT_LT(below, wanted) << "a smaller bf16 step would do";
  EXPECT_LE(row.offset(), *lo);
  EXPECT_LT(*lo - row.offset(), step);
  const double largest = std::max(-double{*lo}, double{*hi});
  for (std::size_t d = 0; d < x.size(); ++d) {
    const float back = mha::detail::dequantize(codes[d], row);
    EXPECT_LE(std::abs(back - x[d]), step * (0.5f + 1e-4f)) << d;
    EXPECT_LE(std::abs(back - x[d]), mha::detail::int8_element_error * largest) << d;
  }
}

TEST(Int8Row, EveryElementWithinHalfAStepOfTheSmallestBf16StepThatCoversTheRow) {
  expect_row_within_its_bound(mha_test::random_floats(64, 3, 5.0f));
  // Rows from tiny to huge, centred and far from zero (the zero's 16 bits then set the step).
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-100.0f, 100.0f), shift(-3.0f, 3.0f);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> x =
        mha_test::random_floats(1 + i % 130, static_cast<std::uint32_t>(i), 1.0f);
    const float magnitude = std::exp2(exponent(rng)),
                centre = magnitude * std::exp2(10.0f * shift(rng));
    for (float& e : x) e = centre * (i % 2 == 0 ? 1.0f : -1.0f) + magnitude * e;
    expect_row_within_its_bound(x);
  }
}

TEST(Int8Row, ARowUsesEveryCodeWhenItsZeroFitsAndZerosAreExact) {
  const std::vector<float> x = mha_test::random_floats(64, 5, 2.0f);
  std::vector<std::uint8_t> codes(x.size());
  mha::detail::quantize_row(x.data(), 64, codes.data());
  const auto [lo, hi] = std::minmax_element(codes.begin(), codes.end());
  EXPECT_LE(*lo, 1);  // the offset is less than a step below the smallest element
  EXPECT_GE(*hi, 254);

  const std::vector<float> zeros(17, 0.0f);
  std::vector<std::uint8_t> zero_codes(17, 9);
  const mha::detail::int8_row flat = mha::detail::quantize_row(zeros.data(), 17, zero_codes.data());
  EXPECT_EQ(flat.word, 0u);
  for (std::uint8_t c : zero_codes) EXPECT_EQ(mha::detail::dequantize(c, flat), 0.0f);
  // Below 2^-111 the step would not be a normal float: the row reads as zeros.
  const std::vector<float> tiny(5, 0x1p-115f);
  std::vector<std::uint8_t> tiny_codes(5);
  const mha::detail::int8_row none = mha::detail::quantize_row(tiny.data(), 5, tiny_codes.data());
  for (std::uint8_t c : tiny_codes) EXPECT_EQ(mha::detail::dequantize(c, none), 0.0f);
}

TEST(Int8Row, ANonFiniteOrHugeElementMakesTheRowNan) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(), -0x1p127f}) {
    std::vector<float> x(8, 1.0f);
    x[3] = bad;
    std::vector<std::uint8_t> codes(8);
    const mha::detail::int8_row row = mha::detail::quantize_row(x.data(), 8, codes.data());
    EXPECT_TRUE(std::isnan(mha::detail::dequantize(codes[0], row))) << bad;
    EXPECT_TRUE(std::isnan(row.offset())) << bad;
  }
  // Just below 2^127 the row is kept, and its steps stay finite.
  const std::vector<float> big{-0x1.fffffep126f, 0x1.fffffep126f};
  std::vector<std::uint8_t> codes(2);
  const mha::detail::int8_row row = mha::detail::quantize_row(big.data(), 2, codes.data());
  EXPECT_TRUE(std::isfinite(mha::detail::dequantize(codes[0], row)));
  EXPECT_TRUE(std::isfinite(mha::detail::dequantize(codes[1], row)));
}

// ---- a k8v4 value group's codes ----

// Turning twice gives the group back (the rotation is its own inverse), and keeps its length.
TEST(Value4Group, TurningIsItsOwnInverseAndKeepsTheLength) {
  for (const std::int64_t n : {32, 24, 17, 8, 1}) {
    const std::vector<float> x = mha_test::random_floats(static_cast<std::size_t>(n), 3, 2.0f);
    std::vector<float> y = x;
    mha::detail::turn(y.data(), n);
    double before = 0.0, after = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      before += double{x[i]} * x[i];
      after += double{y[i]} * y[i];
    }
    EXPECT_NEAR(after, before, 1e-5 * before) << n;
    if (n & (n - 1) || n == 1) {  // blocks smaller than the group where n is no power of two
      EXPECT_EQ(n & -n, n == 24 ? 8 : 1);
    } else {
      EXPECT_NE(y, x) << n;
    }
    mha::detail::turn(y.data(), n);
    for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-6f) << n << ", " << i;
  }
  // One large element turned is spread over the whole group: every element 1 / sqrt(32) of it.
  std::vector<float> spike(32, 0.0f);
  spike[5] = 8.0f;
  mha::detail::turn(spike.data(), 32);
  for (const float e : spike) EXPECT_NEAR(std::abs(e), 8.0f / std::sqrt(32.0f), 1e-6f);
}

// Every turned element within half a step of its value, the step the smallest bf16 at or above
// max(16 range / 247, 16 |min| / 32767), so within value4_element_error of the group's range;
// the offset less than a sixteenth of a step below the smallest element, every code in [0, 15].
TEST(Value4Group, EveryElementWithinHalfAStepOfTheSmallestBf16StepThatCoversTheGroup) {
  for (const float shift : {0.0f, 3.0f, -40.0f}) {
    std::vector<float> x = mha_test::random_floats(32, 11, 2.0f);
    for (float& e : x) e += shift;
    x[7] = 30.0f;  // an outlier
    std::vector<std::uint8_t> codes(32);
    const mha::detail::value4_row row = mha::detail::quantize_group(x.data(), 32, codes.data());
    std::vector<float> turned = x;
    mha::detail::turn(turned.data(), 32);
    const auto [lo, hi] = std::minmax_element(turned.begin(), turned.end());
    const float wanted =
        std::max((*hi - *lo) * (16.0f / 247.0f), std::abs(*lo) * (16.0f / 32767.0f));
    const float step = row.scale();
    ASSERT_GE(step, wanted);
    EXPECT_LT(std::bit_cast<float>(std::bit_cast<std::uint32_t>(step) - 0x10000u), wanted);
    EXPECT_LE(row.offset(), *lo);
    EXPECT_LT(*lo - row.offset(), step / 16.0f);
    for (std::size_t d = 0; d < 32; ++d) {
      EXPECT_LE(codes[d], 15) << d;
      const float back = mha::detail::dequantize(codes[d], row);
      EXPECT_LE(std::abs(back - turned[d]), step * (0.5f + 1e-4f)) << shift << ", " << d;
      EXPECT_LE(std::abs(back - turned[d]),
                mha::detail::value4_element_error * (*hi - *lo) + 1e-6 * std::abs(*lo))
          << shift << ", " << d;
    }
  }
}

TEST(Value4Group, AConstantGroupIsExactAndANonFiniteOneIsNan) {
  std::vector<float> zeros(32, 0.0f);
  std::vector<std::uint8_t> codes(32);
  const mha::detail::value4_row row = mha::detail::quantize_group(zeros.data(), 32, codes.data());
  for (std::size_t d = 0; d < 32; ++d) EXPECT_EQ(mha::detail::dequantize(codes[d], row), 0.0f);
  std::vector<float> bad(32, 1.0f);
  bad[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(mha::detail::quantize_group(bad.data(), 32, codes.data()).scale()));
}

// ---- through a plan ----

struct case_param {
  mha_test::backend_case backend;
  formulation form;
  precision plan;
  precision kv;  // int8 or k8v4
};
// "xsimd_avx2_wrapper_bf16_int8": the test's name, and how gtest prints the case
// (tests/support.hpp says why).
std::string case_name(const case_param& c) {
  return c.backend.label + "_" + std::string(mha::to_string(c.form)) + "_" +
         std::string(mha::to_string(c.plan)) + "_" + std::string(mha::to_string(c.kv));
}
void PrintTo(const case_param& c, std::ostream* os) { *os << case_name(c); }

std::vector<case_param> case_params() {
  std::vector<case_param> out;
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    for (formulation form : mha::formulations()) {
      for (precision p : {precision::fp32, precision::bf16}) {
        for (precision kv : {precision::int8, precision::k8v4}) out.push_back({b, form, p, kv});
      }
    }
  }
  return out;
}

// GQA (2 K/V heads of 4), RoPE, Q/K/V biases, head_dim 16.
const mha_test::shape decode_shape{2, 40, 24, 64, 4, true, true, true, 2, 10000.0};

mha::config config_of(const mha_test::shape& s, precision p) {
  mha::config cfg = s.config();
  cfg.precision = p;
  return cfg;
}

// The tokens [0, tokens) of x (batch, s.seq_len, d_in) fed through a cache of `kv`: a prefill of
// `prefill` tokens, then one at a time, each call run with `options`; the outputs (batch, tokens,
// d_out).
std::vector<float> decode(const mha::plan& p, const std::vector<float>& x, std::int64_t batch,
                          std::int64_t seq_len, std::int64_t tokens, std::int64_t prefill,
                          std::optional<precision> kv, const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  mha::kv_cache cache = p.make_cache(batch, tokens, kv);
  std::vector<float> got(static_cast<std::size_t>(batch * tokens * cfg.d_out));
  for (std::int64_t at = 0; at < tokens;) {
    const std::int64_t t = at == 0 ? prefill : 1;
    std::vector<float> xs, ys(static_cast<std::size_t>(batch * t * cfg.d_out));
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto from = x.begin() + (b * seq_len + at) * cfg.d_in;
      xs.insert(xs.end(), from, from + t * cfg.d_in);
    }
    p.run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, cfg.d_out}, cache, options);
    for (std::int64_t b = 0; b < batch; ++b) {
      std::copy_n(ys.begin() + b * t * cfg.d_out, t * cfg.d_out,
                  got.begin() + (b * tokens + at) * cfg.d_out);
    }
    at += t;
  }
  return got;
}

// x's first `tokens` of each sequence, as a (batch, tokens, d_in) input.
std::vector<float> first_tokens(const std::vector<float>& x, std::int64_t batch,
                                std::int64_t seq_len, std::int64_t tokens, std::int64_t d_in) {
  std::vector<float> out;
  for (std::int64_t b = 0; b < batch; ++b) {
    out.insert(out.end(), x.begin() + b * seq_len * d_in,
               x.begin() + (b * seq_len + tokens) * d_in);
  }
  return out;
}

class Int8Cache : public testing::TestWithParam<case_param> {};

// k8v4's values: sqrt(32) times the turned values' 16-bit weights' error where int8 has its own
// (int8_kernels_bound); against the exact function, the bound computed from the turned value
// groups' ranges (int8_cache_bound with kv).

// The SIMD kernels compute qscale scale_j (qi . c_j) + offset_j sum(q) and
// sum_j s q_j c_j + sum_j p_j offset_j, with 16-bit queries qi and weights q_j, where naive
// widens each code to offset + scale c first and computes in fp32: the same function within
// int8_kernels_bound (16-bit queries and weights; fp32 rounding alone measured 1.5e-6 of
// max|y|). A bf16 plan rounds the heads' outputs to bf16 before out_proj, where a difference can
// land on the other side of a tie: the bf16 oracle's 2u (docs/design.md §1.5) on top.
double naive_tolerance(const mha_test::shape& s, const mha::config& cfg, const mha::weights& w,
                       const std::vector<float>& x, std::int64_t tokens,
                       const std::vector<float>& expected, precision kv) {
  const std::vector<float> cached = first_tokens(x, s.batch, s.seq_len, tokens, s.d_in);
  const double max_y = mha_test::max_abs(expected);
  const double bf16 = cfg.precision == precision::bf16 ? mha_reference::bf16_bound * max_y : 0.0;
  return bf16 +
         mha_reference::int8_kernels_bound(s.config(), w, cached, s.batch * tokens, max_y, kv);
}

TEST_P(Int8Cache, DecodeMatchesTheNaiveReferenceAndItsBound) {
  const auto& [backend, form, plan_precision, kv] = GetParam();
  const mha_test::shape& s = decode_shape;
  const mha::config cfg = config_of(s, plan_precision);
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, 1, 8, kv});
  const mha::weights w = mha::weights::random(cfg, 5);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 6, 2.0f);
  const auto p = backend.backend->prepare(cfg, form, w);
  const std::vector<float> got = decode(*p, x, s.batch, s.seq_len, 32, 20, kv);

  const auto reference = mha::naive_backend().prepare(cfg, form, w);
  const std::vector<float> expected = decode(*reference, x, s.batch, s.seq_len, 32, 20, kv);
  EXPECT_LE(mha_test::max_abs_diff(got, expected), naive_tolerance(s, cfg, w, x, 32, expected, kv));

  // The cache is lossy: it must not be the fp32 cache by accident.
  const std::vector<float> fp32 = decode(*backend.backend->prepare(s.config(), form, w), x, s.batch,
                                         s.seq_len, 32, 20, precision::fp32);
  EXPECT_GT(mha_test::max_abs_diff(got, fp32), 0.0);
  // k8v4 reads 4-bit values: further from fp32 than int8 (its keys are int8's).
  if (kv == precision::k8v4) {
    const std::vector<float> int8 = decode(*p, x, s.batch, s.seq_len, 32, 20, precision::int8);
    EXPECT_GT(mha_test::max_abs_diff(got, fp32), mha_test::max_abs_diff(int8, fp32));
  }
  // Against the exact function of the same tokens (the fp32 module's, in double).
  const std::vector<float> x32 = first_tokens(x, s.batch, s.seq_len, 32, s.d_in);
  const std::vector<double> exact = mha_reference::forward(s.config(), w, x32, s.batch, 32);
  const double bound = mha_reference::int8_cache_bound(s.config(), w, x32, s.batch * 32,
                                                       mha_test::max_abs(exact), kv);
  const double error = mha_test::max_abs_diff(got, exact);
  EXPECT_LE(error, bound);
  RecordProperty("error_over_bound", std::to_string(error / bound));
}

// One query row per K/V head (no grouped heads), head_dims whose pairs (11, 3 and 41) are not a
// multiple of the integer kernel's accumulator chains: a decode step's scores read K^T as one
// stream (code_pair_row), its remainder pairs too; the same function as naive's. Head_dim 81 is
// odd (its last pair half empty) and longer than the append's chunks of 64 codes.
TEST_P(Int8Cache, OneRowPerHeadMatchesTheNaiveReference) {
  const auto& [backend, form, plan_precision, kv] = GetParam();
  for (const mha_test::shape& s : {mha_test::shape{2, 24, 16, 44, 2, true, true, true, 0, 0.0},
                                   mha_test::shape{1, 24, 16, 18, 3, true, false, true, 0, 0.0},
                                   mha_test::shape{1, 24, 16, 162, 2, true, false, true, 0, 0.0}}) {
    const mha::config cfg = config_of(s, plan_precision);
    MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, 1, 8, kv});
    const mha::weights w = mha::weights::random(cfg, 7);
    const std::vector<float> x =
        mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 3, 2.0f);
    const std::vector<float> got =
        decode(*backend.backend->prepare(cfg, form, w), x, s.batch, s.seq_len, 24, 6, kv);
    const std::vector<float> expected =
        decode(*mha::naive_backend().prepare(cfg, form, w), x, s.batch, s.seq_len, 24, 6, kv);
    EXPECT_LE(mha_test::max_abs_diff(got, expected),
              naive_tolerance(s, cfg, w, x, 24, expected, kv))
        << "head_dim " << cfg.head_dim();
  }
}

// Training mode through an int8 cache: the SIMD kernels apply dropout's multipliers to the
// weights as they are made and quantised (code_scales::value_weights), naive to the weights of
// the widened rows; the same function (the multipliers are keyed on absolute positions). A kept
// weight is scaled by 1 / (1 - p), so the kernels' bound grows by that factor; leaving the
// multipliers out moves the outputs by more than twice that (int8's), or (k8v4's looser bound)
// the kernels' outputs lie nearer naive's with dropout than without it by a factor of 10.
TEST_P(Int8Cache, DropoutMatchesTheNaiveReference) {
  const auto& [backend, form, plan_precision, kv] = GetParam();
  const mha_test::shape& s = decode_shape;
  mha::config cfg = config_of(s, plan_precision);
  cfg.dropout = 0.25f;
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, s.batch, 1, 8, kv});
  const mha::weights w = mha::weights::random(cfg, 5);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 6, 2.0f);
  const mha::run_options training{.training = true, .seed = 42};
  const std::vector<float> got =
      decode(*backend.backend->prepare(cfg, form, w), x, s.batch, s.seq_len, 32, 20, kv, training);
  const std::vector<float> expected = decode(*mha::naive_backend().prepare(cfg, form, w), x,
                                             s.batch, s.seq_len, 32, 20, kv, training);
  const double tolerance = naive_tolerance(s, cfg, w, x, 32, expected, kv) / (1.0 - cfg.dropout);
  EXPECT_LE(mha_test::max_abs_diff(got, expected), tolerance);
  // Dropout is applied: kernels that left it out (the inference outputs, within the tolerance)
  // would fail the check above.
  const std::vector<float> inference =
      decode(*mha::naive_backend().prepare(cfg, form, w), x, s.batch, s.seq_len, 32, 20, kv);
  if (kv == precision::k8v4) {
    EXPECT_GT(mha_test::max_abs_diff(inference, got), 10.0 * mha_test::max_abs_diff(got, expected));
  } else {
    EXPECT_GT(mha_test::max_abs_diff(inference, expected), 2.0 * tolerance);
  }
}

// An outlier channel: key and value channel 0 of every head 50 times the rest (the pattern of
// trained LLMs' keys), which coarsens every other channel's codes; still within the bound.
TEST_P(Int8Cache, AnOutlierChannelStaysWithinTheBound) {
  const auto& [backend, form, plan_precision, kv] = GetParam();
  const mha_test::shape s{1, 48, 32, 64, 4, true, false, true, 0, 0.0};
  if (plan_precision != precision::fp32) GTEST_SKIP() << "the fp32 plan covers it";
  const mha::config cfg = s.config();
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, 1, 1, 8, kv});
  mha::weights w = mha::weights::random(cfg, 9);
  for (std::int64_t h = 0; h < cfg.kv_heads(); ++h) {
    for (std::int64_t i = 0; i < cfg.d_in; ++i) {
      w.key.weight[h * cfg.head_dim() * cfg.d_in + i] *= 50.0f;
      w.value.weight[h * cfg.head_dim() * cfg.d_in + i] *= 50.0f;
    }
  }
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.seq_len * s.d_in), 8, 1.0f);
  const auto p = backend.backend->prepare(cfg, form, w);
  const std::vector<float> got = decode(*p, x, 1, s.seq_len, s.seq_len, 8, kv);
  const std::vector<double> exact = mha_reference::forward(cfg, w, x, 1, s.seq_len);
  EXPECT_LE(mha_test::max_abs_diff(got, exact),
            mha_reference::int8_cache_bound(cfg, w, x, s.seq_len, mha_test::max_abs(exact), kv));
}

// A NaN key and value in a later token reach no earlier row (their codes are never read
// there), as in an fp32 cache; the rows that see it are NaN.
TEST_P(Int8Cache, NonFiniteTokensReachOnlyTheRowsThatSeeThem) {
  const auto& [backend, form, plan_precision, kv] = GetParam();
  const mha_test::shape s{1, 16, 8, 16, 2, true, false, true, 0, 0.0};
  const mha::config cfg = config_of(s, plan_precision);
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, 1, 1, 8, kv});
  const auto p = backend.backend->prepare(cfg, form, mha::weights::random(cfg, 2));
  std::vector<float> x = mha_test::random_floats(static_cast<std::size_t>(16 * 8), 4, 1.0f);
  x[10 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> y = decode(*p, x, 1, 16, 16, 12, kv);
  for (std::int64_t t = 0; t < 16; ++t) {
    const bool any_nan = std::any_of(y.begin() + t * 16, y.begin() + (t + 1) * 16,
                                     [](float v) { return std::isnan(v); });
    EXPECT_EQ(any_nan, t >= 10) << "token " << t;
  }
}

// A key of magnitude 2^124 or more (here exactly 2^124: x's element 0 through a key weight of 1,
// read by no query or value) may have no int8 row once its channel scale (down to 1/8) grows it
// (its steps would pass float's range, read as NaN): the run is refused naming the element, the
// cache unchanged; 2^123 is held and computed finite.
TEST_P(Int8Cache, KeysPastTheFormatsRangeAreRefusedByName) {
  const auto& [backend, form, plan_precision, kv] = GetParam();
  const mha_test::shape s{1, 2, 8, 16, 2, true, false, true, 0, 0.0};
  const mha::config cfg = config_of(s, plan_precision);
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, 1, 1, 8, kv});
  mha::weights w = mha::weights::random(cfg, 3);
  std::fill(w.key.weight.begin(), w.key.weight.end(), 0.0f);
  w.key.weight[0] = 1.0f;  // key element 0 of head 0 is x's element 0, which nothing else reads
  for (mha::linear_weights* other : {&w.query, &w.value}) {
    for (std::int64_t r = 0; r < other->out; ++r) other->weight[r * other->in] = 0.0f;
  }
  const auto p = backend.backend->prepare(cfg, form, w);
  mha::kv_cache cache = p->make_cache(1, 2, kv);
  std::vector<float> x(16, 0.5f), y(2 * 16);
  x[0] = 0x1p124f;
  mha_test::expect_error<mha::invalid_argument>(
      [&] {
        p->run({x.data(), 1, 2, 8}, {y.data(), 1, 2, 16}, cache);
      },
      {"a key (sequence 0, K/V head 0, token 0, element 0) is 2.1267648e+37",
       std::string("an ") + std::string(mha::to_string(kv)) +
           " cache holds finite keys of magnitude below 2^124"});
  EXPECT_EQ(cache.length(0), 0);
  x[0] = 0x1p123f;
  p->run({x.data(), 1, 2, 8}, {y.data(), 1, 2, 16}, cache);
  EXPECT_EQ(cache.length(0), 2);
  for (const float e : y) EXPECT_TRUE(std::isfinite(e));
}

INSTANTIATE_TEST_SUITE_P(All, Int8Cache, testing::ValuesIn(case_params()),
                         [](const auto& p) { return case_name(p.param); });

// A long context: 4200 keys split into chunks of 2048 (docs/design.md §1.4) read from codes;
// every thread count gives the same bits, and the rows stay within the bound (k8v4 and int4:
// within the kernels' bound of the naive reference's; int4's keys coded in 65 groups of 64, the
// last 40 exact).
TEST(Int8CacheLong, SplitKeysAreBitwiseForEveryThreadCountAndWithinTheBound) {
  const mha_test::shape s{1, 4200, 16, 32, 2, true, false, true, 0, 0.0};
  const mha::config cfg = s.config();
  const mha::weights w = mha::weights::random(cfg, 5);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.seq_len * s.d_in), 17, 3.0f);
  const std::vector<double> exact = mha_reference::forward(cfg, w, x, 1, s.seq_len);
  const double bound =
      mha_reference::int8_cache_bound(cfg, w, x, s.seq_len, mha_test::max_abs(exact));
  const auto naive = mha::naive_backend().prepare(cfg, formulation::split_weight, w);
  const std::vector<float> naive_k8v4 =
      decode(*naive, x, 1, s.seq_len, s.seq_len, 4190, precision::k8v4);
  const std::vector<float> naive_int4 =
      decode(*naive, x, 1, s.seq_len, s.seq_len, 4190, precision::int4);
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    for (const precision kv : {precision::int8, precision::k8v4, precision::int4}) {
      if (mha_test::declined(b, {cfg, formulation::split_weight, 1, 1, 4100, kv})) continue;
      const auto p = b.backend->prepare(cfg, formulation::split_weight, w);
      const std::vector<float> one =
          decode(*p, x, 1, s.seq_len, s.seq_len, 4190, kv, {.threads = 1});
      if (kv == precision::int8) {
        EXPECT_LE(mha_test::max_abs_diff(one, exact), bound) << b.label;
      } else {
        const std::vector<float>& same = kv == precision::k8v4 ? naive_k8v4 : naive_int4;
        EXPECT_LE(mha_test::max_abs_diff(one, same),
                  naive_tolerance(s, cfg, w, x, s.seq_len, same, kv))
            << b.label << ", " << mha::to_string(kv);
      }
      if (b.backend->max_threads() == 1) continue;
      for (int threads : {2, 3}) {
        EXPECT_EQ(decode(*p, x, 1, s.seq_len, s.seq_len, 4190, kv, {.threads = threads}), one)
            << b.label << ", " << mha::to_string(kv) << ", " << threads << " threads";
      }
    }
  }
}

// Bytes: codes where fp32 keeps floats, plus a scale and an offset per row, and head_dim key
// channel scales per (sequence, K/V head).
TEST(Int8CacheSupport, ACacheHoldsCodesAndSaysItsPrecision) {
  const mha::config cfg{.d_in = 16, .d_out = 128, .n_heads = 2, .context_length = 4096};
  const mha::weights w = mha::weights::random(cfg, 1);
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    if (mha_test::declined(b, {cfg, formulation::split_weight, 1, 1, 3, precision::int8})) continue;
    const auto p = b.backend->prepare(cfg, formulation::split_weight, w);
    const mha::kv_cache cache = p->make_cache(3, 4096, precision::int8);
    EXPECT_EQ(cache.precision(), precision::int8);
    EXPECT_EQ(p->make_cache(3, 4096).precision(), precision::fp32);
    // K and V of 3 sequences, 4096 tokens, 2 heads: 64 codes and one 4-byte word a row; 64
    // channel scales a head.
    const std::size_t codes = 2 * 3 * 4096 * 2 * 64, scales = 2 * 3 * 4096 * 2 * 4 + 3 * 2 * 64 * 4;
    EXPECT_GE(cache.bytes(), codes + scales) << b.label;
    EXPECT_LE(cache.bytes(), codes + scales + 3 * 2 * 64 * 3) << b.label;  // lines of padding
    // 68 of a bf16 row's 128 bytes.
    EXPECT_LE(static_cast<double>(cache.bytes()), 0.54 * (2 * 3 * 4096 * 2 * 64 * 2)) << b.label;
    // k8v4: the keys as int8's; a value row 32 bytes of codes and a word per group of 32, 40:
    // 108 bytes a token and head where int8 takes 136.
    const mha::kv_cache k8v4 = p->make_cache(3, 4096, precision::k8v4);
    EXPECT_EQ(k8v4.precision(), precision::k8v4);
    const std::size_t tokens = 3 * 4096 * 2, k8v4_bytes = tokens * 108 + 3 * 2 * 64 * 4;
    EXPECT_GE(k8v4.bytes(), k8v4_bytes) << b.label;
    EXPECT_LE(k8v4.bytes(), k8v4_bytes + 3 * 2 * 64 * 3) << b.label;
    // int4: a key row 32 bytes of codes and its share of its group's channel words (64 of them
    // per 64 tokens: 4 bytes), a value row as k8v4's: 76 bytes a token and head (0.56 of int8's);
    // and a head's 128 recent exact keys (32 KiB and their positions).
    const mha::kv_cache int4 = p->make_cache(3, 4096, precision::int4);
    EXPECT_EQ(int4.precision(), precision::int4);
    const std::size_t int4_bytes = tokens * 76 + 3 * 2 * (128 * 64 * 4 + 128 * 8);
    EXPECT_GE(int4.bytes(), int4_bytes) << b.label;
    EXPECT_LE(int4.bytes(), int4_bytes + 3 * 2 * 64 * 3) << b.label;
  }
}

// make_cache declines exactly what backend::supports declines, with its reason; onednn says
// why it keeps no int8 cache, and a precision that is not one is an error naming it.
TEST(Int8CacheSupport, MakeCacheFollowsSupports) {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const mha::weights w = mha::weights::random(cfg, 1);
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    const mha::support s =
        b.backend->supports({cfg, formulation::split_weight, 1, 1, 3, precision::int8});
    if (b.backend->name() == "onednn") {
      EXPECT_FALSE(s);
      EXPECT_NE(s.reason().find("int8 KV cache"), std::string::npos) << s.reason();
      const mha::support k8v4 =
          b.backend->supports({cfg, formulation::split_weight, 1, 1, 3, precision::k8v4});
      EXPECT_NE(k8v4.reason().find("k8v4 KV cache is not implemented"), std::string::npos)
          << k8v4.reason();
      const mha::support int4 =
          b.backend->supports({cfg, formulation::split_weight, 1, 1, 3, precision::int4});
      EXPECT_NE(int4.reason().find("int4 KV cache is not implemented"), std::string::npos)
          << int4.reason();
    }
    const auto p = b.backend->prepare(cfg, formulation::split_weight, w);
    if (s) {
      EXPECT_EQ(p->make_cache(2, 4, precision::int8).precision(), precision::int8) << b.label;
    } else {
      mha_test::expect_error<mha::unsupported>([&] { (void)p->make_cache(2, 4, precision::int8); },
                                               {"KV cache of int8"});
    }
    mha_test::expect_error<mha::invalid_argument>(
        [&] { (void)p->make_cache(2, 4, static_cast<precision>(9)); },
        {"unknown KV cache precision value 9"});
  }
  // An fp32 cache with a bf16 plan (and the reverse) is not kept by any backend.
  mha::config bf16 = cfg;
  bf16.precision = precision::bf16;
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    const mha::support s =
        b.backend->supports({bf16, formulation::split_weight, 1, 1, 3, precision::fp32});
    EXPECT_FALSE(s) << b.label;
  }
}

TEST(Int8CacheProblem, NamesSpellTheCacheOnlyWhenItIsNotThePlans) {
  mha::problem p = mha::parse_problem("split_weight/b1/t1/past8/din8/dout8/h2/kv_int8");
  EXPECT_EQ(p.kv_precision, precision::int8);
  EXPECT_EQ(p.cache_precision(), precision::int8);
  EXPECT_EQ(mha::to_string(p), "split_weight/b1/t1/past8/din8/dout8/h2/kv_int8");
  p = mha::parse_problem("split_weight/b1/t1/past8/din8/dout8/h2/bf16/kv_bf16");
  EXPECT_EQ(p.kv_precision, std::nullopt);
  EXPECT_EQ(mha::to_string(p), "split_weight/b1/t1/past8/din8/dout8/h2/bf16");
  p = mha::parse_problem("split_weight/b1/t1/past8/din8/dout8/h2/kv_k8v4");
  EXPECT_EQ(p.cache_precision(), precision::k8v4);
  EXPECT_EQ(mha::to_string(p), "split_weight/b1/t1/past8/din8/dout8/h2/kv_k8v4");
  p = mha::parse_problem("split_weight/b1/t1/past8/din8/dout8/h2/kv_int4");
  EXPECT_EQ(p.cache_precision(), precision::int4);
  mha_test::expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b1/t1/din8/dout8/h2/kv_int2"); },
      {"unknown part 'kv_int2'", "kv_<fp32, bf16, int8, k8v4 or int4>"});
}

}  // namespace
