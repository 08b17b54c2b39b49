// The xsimd backend's own contracts: ISA choice (MHA_XSIMD_ISA, pinned ISAs, description) and
// the kernel entries other backends build on (GEMM over a sub-range of tiles, softmax pieces),
// for every ISA this CPU runs. Forward-pass correctness is the conformance suite's job.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "backends/xsimd/kernels.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/error.hpp"
#include "support.hpp"

namespace {

using mha::xsimd_isa;

// Sets MHA_XSIMD_ISA for one scope (nullptr: unset), restoring "unset" after.
class isa_environment {
 public:
  explicit isa_environment(const char* value) {
    if (value == nullptr) {
      ::unsetenv("MHA_XSIMD_ISA");
    } else {
      ::setenv("MHA_XSIMD_ISA", value, 1);
    }
  }
  ~isa_environment() { ::unsetenv("MHA_XSIMD_ISA"); }
  isa_environment(const isa_environment&) = delete;
  isa_environment& operator=(const isa_environment&) = delete;
};

// The message of the mha::invalid_argument f() throws ("" when it throws nothing).
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const mha::invalid_argument& e) {
    return e.what();
  }
  return "";
}

const char* arch_name(xsimd_isa isa) {
  return isa == xsimd_isa::avx512 ? "avx512bw" : isa == xsimd_isa::avx2 ? "fma3+avx2" : "sse2";
}

TEST(XsimdIsa, SupportedListIsBestFirstAndEndsWithTheBaseline) {
  const std::vector<xsimd_isa> isas = mha::xsimd_supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), xsimd_isa::sse2);
  for (std::size_t i = 1; i < isas.size(); ++i) EXPECT_LT(isas[i - 1], isas[i]);
}

TEST(XsimdIsa, DefaultIsTheBestSupportedWhenUnset) {
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const isa_environment env(unset);
    EXPECT_EQ(mha::xsimd_default_isa(), mha::xsimd_supported_isas().front());
  }
}

TEST(XsimdIsa, EnvironmentForcesEachSupportedIsa) {
  for (xsimd_isa isa : mha::xsimd_supported_isas()) {
    const isa_environment env(std::string(mha::to_string(isa)).c_str());
    EXPECT_EQ(mha::xsimd_default_isa(), isa);
    const std::string description = mha::xsimd_backend().description();
    EXPECT_NE(description.find(arch_name(isa)), std::string::npos) << description;
  }
}

TEST(XsimdIsa, UnknownEnvironmentValueIsAnErrorNamingIt) {
  const isa_environment env("avx9");
  const std::string message = invalid_argument_message([] { mha::xsimd_default_isa(); });
  EXPECT_NE(message.find("'avx9'"), std::string::npos) << message;
  EXPECT_NE(message.find("avx512, avx2, sse2"), std::string::npos) << message;
  // prepare() and description() of the default backend report it too; pinned ISAs ignore it.
  const mha::config cfg{.d_in = 4, .d_out = 4, .n_heads = 1, .context_length = 2};
  EXPECT_THROW(mha::xsimd_backend().prepare(cfg, mha::formulation::split_weight,
                                            mha::weights::random(cfg, 1)),
               mha::invalid_argument);
  EXPECT_THROW(mha::xsimd_backend().description(), mha::invalid_argument);
  EXPECT_NO_THROW(mha::xsimd_backend(xsimd_isa::sse2).description());
}

TEST(XsimdIsa, UnsupportedIsaIsAnErrorListingTheSupportedOnes) {
  const std::vector<xsimd_isa> supported = mha::xsimd_supported_isas();
  for (xsimd_isa isa : {xsimd_isa::avx512, xsimd_isa::avx2}) {
    if (std::find(supported.begin(), supported.end(), isa) != supported.end()) continue;
    const std::string name(mha::to_string(isa));
    EXPECT_NE(invalid_argument_message([&] { mha::xsimd_backend(isa); }).find(name),
              std::string::npos);
    const isa_environment env(name.c_str());
    EXPECT_NE(invalid_argument_message([] { mha::xsimd_default_isa(); }).find("supports"),
              std::string::npos);
  }
  if (supported.size() == 3) GTEST_SKIP() << "this CPU runs every ISA";
}

TEST(XsimdIsa, OutOfRangeEnumIsAnError) {
  const std::string message =
      invalid_argument_message([] { mha::xsimd_backend(static_cast<xsimd_isa>(7)); });
  EXPECT_NE(message.find('7'), std::string::npos) << message;
}

TEST(XsimdIsa, PinnedBackendsDescribeTheirIsa) {
  for (xsimd_isa isa : mha::xsimd_supported_isas()) {
    const mha::backend& b = mha::xsimd_backend(isa);
    EXPECT_EQ(b.name(), "xsimd");
    const std::string lanes = std::to_string(mha::detail::kernels_for(isa).lanes) + " lanes";
    EXPECT_NE(b.description().find(arch_name(isa)), std::string::npos) << b.description();
    EXPECT_NE(b.description().find(lanes), std::string::npos) << b.description();
  }
}

class XsimdKernels : public testing::TestWithParam<xsimd_isa> {
 protected:
  const mha::detail::isa_kernels& kernels() const { return mha::detail::kernels_for(GetParam()); }
};

// C = A W^T + bias in two sub-range calls per tile shape (rows split mid-block, panels split),
// on awkward sizes: every edge micro-kernel, partial last panels, K = 1. Each call leaves C
// outside its range untouched, so tiles can be handed to threads in any partition.
TEST_P(XsimdKernels, GemmSubRangesMatchDoubleProducts) {
  for (int t = 0; t < kernels().tile_count; ++t) {
    const int nr = kernels().tiles[t].nr;
    for (const auto [m, k, n] : {std::array<std::int64_t, 3>{1, 1, 1},
                                 {37, 5, 2 * nr + 3},
                                 {23, 17, nr},
                                 {4, 64, nr - 1}}) {
      const std::vector<float> a = mha_test::random_floats(m * k, 1),
                               w = mha_test::random_floats(n * k, 2),
                               bias = mha_test::random_floats(n, 3);
      const mha::detail::packed_matrix packed(w.data(), bias.data(), n, k, nr);
      const mha::detail::panels_view b = packed.view();
      const float sentinel = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> c(m * n, sentinel);
      const mha::detail::gemm_args g{a.data(), k, b, c.data(), n, m};
      const std::int64_t row_split = m / 2, panel_split = b.panels() / 2;
      kernels().gemm(g, 0, row_split, 0, b.panels());
      kernels().gemm(g, row_split, m, 0, panel_split);
      // Still untouched: rows past row_split in the panels the second call did not cover.
      for (std::int64_t i = row_split; i < m; ++i) {
        for (std::int64_t j = panel_split * nr; j < n; ++j)
          ASSERT_TRUE(std::isnan(c[i * n + j])) << "C[" << i << "][" << j << "] written";
      }
      kernels().gemm(g, row_split, m, panel_split, b.panels());
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double expected = bias[j];
          for (std::int64_t kk = 0; kk < k; ++kk) expected += double{a[i * k + kk]} * w[j * k + kk];
          ASSERT_NEAR(c[i * n + j], expected, 1e-5 * (1.0 + std::abs(expected)))
              << "nr " << nr << " (m, k, n) = (" << m << ", " << k << ", " << n << ") at C[" << i
              << "][" << j << "]";
        }
      }
    }
  }
}

// row_max and exp_sum over every length up to a few registers, lanes past the end padded with
// values that must be ignored; exp_sum zeroes them.
TEST_P(XsimdKernels, SoftmaxPiecesMatchScalarMath) {
  const std::int64_t lanes = kernels().lanes;
  for (std::int64_t n = 1; n <= 3 * lanes + 1; ++n) {
    std::vector<float> x = mha_test::random_floats((n + lanes - 1) / lanes * lanes, 4, 20.0f);
    for (std::int64_t j = n; j < static_cast<std::int64_t>(x.size()); ++j) x[j] = 1e30f;
    float largest = x[0];
    for (std::int64_t j = 1; j < n; ++j) largest = std::max(largest, x[j]);
    ASSERT_EQ(kernels().row_max(x.data(), n), largest) << "n " << n;

    double sum = 0.0;
    std::vector<double> expected(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) sum += expected[j] = std::exp(double{x[j]} - largest);
    const float got = kernels().exp_sum(x.data(), n, largest);
    EXPECT_NEAR(got, sum, 1e-6 * sum) << "n " << n;
    for (std::int64_t j = 0; j < n; ++j) EXPECT_NEAR(x[j], expected[j], 1e-6) << "n " << n;
    for (std::int64_t j = n; j < static_cast<std::int64_t>(x.size()); ++j)
      EXPECT_EQ(x[j], 0.0f) << "n " << n << " padding lane " << j;
  }
}

// -inf scores (masked) give exactly 0 weight and never NaN.
TEST_P(XsimdKernels, ExpOfMinusInfinityIsZero) {
  const std::int64_t lanes = kernels().lanes;
  std::vector<float> x(lanes, -std::numeric_limits<float>::infinity());
  x[0] = 0.0f;
  EXPECT_EQ(kernels().exp_sum(x.data(), lanes, 0.0f), 1.0f);
  for (std::int64_t j = 1; j < lanes; ++j) EXPECT_EQ(x[j], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Isa, XsimdKernels, testing::ValuesIn(mha::xsimd_supported_isas()),
                         [](const testing::TestParamInfo<xsimd_isa>& p) {
                           return std::string(mha::to_string(p.param));
                         });

}  // namespace
