// The xsimd backend's own contracts: ISA choice (MHA_XSIMD_ISA, pinned ISAs, description) and
// the kernel entries other backends build on (GEMM over a sub-range of tiles, softmax pieces),
// for every ISA this CPU runs. Forward-pass correctness is the conformance suite's job.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "base/bf16.hpp"
#include "base/checks.hpp"
#include "common/buffer.hpp"
#include "kernels/interface/gemm.hpp"
#include "kernels/interface/isa_kernels.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/error.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using mha::isa;

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

const char* arch_name(isa isa) {
  return isa == isa::amx || isa == isa::avx512bf16 || isa == isa::avx512 ? "avx512bw"
         : isa == isa::avx2                                              ? "fma3+avx2"
         : isa == isa::neon64                                            ? "arm64+neon"
                                                                         : "sse2";
}

// The ISAs this build has kernels for (its architecture's rows, best first), the baseline last,
// and their names as messages list them ("amx, avx512bf16, avx512, avx2, sse2" on x86-64).
const std::vector<isa> built = mha::detail::built_isas();
const isa baseline = built.back();
const std::string built_names = mha::detail::isa_names(built);

TEST(XsimdIsa, SupportedListIsBestFirstAndEndsWithTheBaseline) {
  const std::vector<isa> isas = mha::xsimd_supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), baseline);
  for (std::size_t i = 1; i < isas.size(); ++i) EXPECT_GT(isas[i - 1], isas[i]);
}

TEST(XsimdIsa, DefaultIsTheBestSupportedWhenUnset) {
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const isa_environment env(unset);
    EXPECT_EQ(mha::xsimd_default_isa(), mha::xsimd_supported_isas().front());
  }
}

TEST(XsimdIsa, EnvironmentForcesEachSupportedIsa) {
  for (isa isa : mha::xsimd_supported_isas()) {
    const isa_environment env(std::string(mha::to_string(isa)).c_str());
    EXPECT_EQ(mha::xsimd_default_isa(), isa);
    const std::string description = mha::xsimd_backend().description();
    EXPECT_NE(description.find(arch_name(isa)), std::string::npos) << description;
    EXPECT_EQ(mha::xsimd_backend().isa(), isa);
  }
}

TEST(XsimdIsa, UnknownEnvironmentValueIsAnErrorNamingIt) {
  const isa_environment env("avx9");
  const std::string message = invalid_argument_message([] { mha::xsimd_default_isa(); });
  EXPECT_NE(message.find("'avx9'"), std::string::npos) << message;
  EXPECT_NE(message.find(built_names), std::string::npos) << message;
  // prepare() and description() of the default backend report it too; pinned ISAs ignore it.
  const mha::config cfg{.d_in = 4, .d_out = 4, .n_heads = 1, .context_length = 2};
  EXPECT_THROW(mha::xsimd_backend().prepare(cfg, mha::formulation::split_weight,
                                            mha::weights::random(cfg, 1)),
               mha::invalid_argument);
  EXPECT_THROW(mha::xsimd_backend().description(), mha::invalid_argument);
  EXPECT_NO_THROW(mha::xsimd_backend(baseline).description());
}

TEST(XsimdIsa, UnsupportedIsaIsAnErrorListingTheSupportedOnes) {
  const std::vector<isa> supported = mha::xsimd_supported_isas();
  for (isa isa : built) {
    if (std::find(supported.begin(), supported.end(), isa) != supported.end()) continue;
    const std::string name(mha::to_string(isa));
    EXPECT_NE(invalid_argument_message([&] { mha::xsimd_backend(isa); }).find(name),
              std::string::npos);
    const isa_environment env(name.c_str());
    EXPECT_NE(invalid_argument_message([] { mha::xsimd_default_isa(); }).find("supports"),
              std::string::npos);
  }
  if (supported.size() == built.size()) GTEST_SKIP() << "this CPU runs every ISA";
}

TEST(XsimdIsa, AnIsaWithoutXsimdKernelsIsAnErrorNamingIt) {
  for (isa other : {isa::scalar, isa::sse41}) {
    const std::string message = invalid_argument_message([&] { mha::xsimd_backend(other); });
    EXPECT_NE(message.find(std::string(mha::to_string(other))), std::string::npos) << message;
    EXPECT_NE(message.find("xsimd has " + built_names), std::string::npos) << message;
    const isa_environment env(std::string(mha::to_string(other)).c_str());
    EXPECT_NE(invalid_argument_message([] { mha::xsimd_default_isa(); }).find("expected one of"),
              std::string::npos);
  }
}

// AMX runs where the CPU has it and Linux grants the tiles: the best ISA, described as tiles.
// Elsewhere asking for it is an error that says why (no tiles, or the refusal).
TEST(XsimdIsa, AmxRunsWhereGrantedElseAnErrorSaysWhy) {
  const std::vector<isa> supported = mha::xsimd_supported_isas();
  if (!mha::detail::cpu_runs(isa::amx)) {
    const std::string& why = mha::detail::amx_refusal();
    ASSERT_FALSE(why.empty());
    EXPECT_EQ(std::find(supported.begin(), supported.end(), isa::amx), supported.end());
    EXPECT_NE(invalid_argument_message([] { mha::xsimd_backend(isa::amx); }).find(why),
              std::string::npos);
    const isa_environment env("amx");
    EXPECT_NE(invalid_argument_message([] { mha::xsimd_default_isa(); }).find(why),
              std::string::npos);
    GTEST_SKIP() << "the AMX kernels do not run here: " << why;
  }
  EXPECT_TRUE(mha::detail::amx_refusal().empty());
  EXPECT_EQ(supported.front(), isa::amx);
  EXPECT_NE(mha::xsimd_backend(isa::amx).description().find("AMX tiles"), std::string::npos);
}

TEST(XsimdIsa, PinnedBackendsDescribeTheirIsa) {
  for (isa isa : mha::xsimd_supported_isas()) {
    const mha::backend& b = mha::xsimd_backend(isa);
    EXPECT_EQ(b.name(), "xsimd");
    const std::string lanes = std::to_string(mha::detail::kernels_for(isa).lanes) + " lanes";
    EXPECT_NE(b.description().find(arch_name(isa)), std::string::npos) << b.description();
    EXPECT_NE(b.description().find(lanes), std::string::npos) << b.description();
    EXPECT_EQ(b.isa(), isa);
  }
}

class XsimdKernels : public testing::TestWithParam<isa> {
 protected:
  const mha::detail::isa_kernels& kernels() const { return mha::detail::kernels_for(GetParam()); }
};

// C = A W^T + bias in two sub-range calls per tile shape (rows split mid-block, panels split),
// on awkward sizes: every edge micro-kernel, partial last panels, K = 1, K over several k slices
// of the blocking with a partial last one, rows over two row blocks. Each call leaves C
// outside its range untouched, so tiles can be handed to threads in any partition.
// pack_pair_block writes element (kk, nn) of a block, rounded to bf16, into its half of word
// p * pairs(k) * nr + kk / 2 * nr + nn % nr (p = nn / nr; low half for even kk), from either
// orientation of B, and leaves every other half as it was: blocks with odd ends, a partial
// last panel, a block starting mid-panel.
TEST(XsimdPacking, PairBlocksPutEachElementInItsHalfAndKeepTheRest) {
  namespace d = mha::detail;
  const std::int64_t k = 301, n = 21;  // 151 pairs, panels of 8 (the last partial)
  const int nr = 8;
  const std::vector<float> b = mha_test::random_floats(static_cast<std::size_t>(k * n), 11);
  struct block {
    std::int64_t k0, k1, n0, n1;
  };
  for (const bool columns_contiguous : {true, false}) {
    for (const block blk : {block{0, k, 0, n}, block{3, 300, 5, 17}, block{1, 2, 7, 8},
                            block{2, 3, 0, 21}, block{40, 297, 9, 10}}) {
      const std::int64_t rows = blk.k1 - blk.k0, cols = blk.n1 - blk.n0;
      // The block as the source: (kk, nn) at src[(kk - k0) * stride_k + (nn - n0) * stride_n].
      const std::int64_t stride_k = columns_contiguous ? 1 : cols,
                         stride_n = columns_contiguous ? rows : 1;
      std::vector<float> src(static_cast<std::size_t>(rows * cols));
      for (std::int64_t kk = blk.k0; kk < blk.k1; ++kk)
        for (std::int64_t nn = blk.n0; nn < blk.n1; ++nn)
          src[static_cast<std::size_t>((kk - blk.k0) * stride_k + (nn - blk.n0) * stride_n)] =
              b[static_cast<std::size_t>(kk * n + nn)];
      const std::size_t words = static_cast<std::size_t>((k + 1) / 2 * d::round_up(n, nr));
      std::vector<d::bf16_pair> packed(words, 0xabcdabcdu);
      d::pack_pair_block(src.data(), stride_k, stride_n, k, blk.k0, blk.k1, blk.n0, blk.n1, nr,
                         packed.data());
      for (std::int64_t kk = 0; kk < k; ++kk) {
        for (std::int64_t nn = 0; nn < n; ++nn) {
          const d::bf16_pair word = packed[static_cast<std::size_t>(nn / nr * ((k + 1) / 2) * nr +
                                                                    kk / 2 * nr + nn % nr)];
          const auto half = static_cast<d::bf16>(kk % 2 == 0 ? word & 0xffffu : word >> 16);
          const bool inside = kk >= blk.k0 && kk < blk.k1 && nn >= blk.n0 && nn < blk.n1;
          const d::bf16 expected =
              inside ? d::to_bf16(b[static_cast<std::size_t>(kk * n + nn)]) : d::bf16{0xabcd};
          ASSERT_EQ(half, expected) << "(" << kk << ", " << nn << ") of block [" << blk.k0 << ", "
                                    << blk.k1 << ") x [" << blk.n0 << ", " << blk.n1 << "), "
                                    << (columns_contiguous ? "columns" : "rows") << " contiguous";
        }
      }
    }
  }
}

TEST_P(XsimdKernels, GemmSubRangesMatchDoubleProducts) {
  for (int t = 0; t < kernels().tile_count; ++t) {
    const int nr = kernels().tiles[t].nr;
    for (const auto [m, k, n] : {std::array<std::int64_t, 3>{1, 1, 1},
                                 {37, 5, 2 * nr + 3},
                                 {23, 17, nr},
                                 {4, 64, nr - 1},
                                 {300, 2 * mha::detail::gemm_k_slice + 88, 2 * nr + 3}}) {
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

// The bf16 GEMM: C = A W^T + bias over bf16 pairs (A through to_pairs, W and the bias rounded
// at packing) in fp32 sums, for every tile shape, with k past whole AMX tiles (16 pairs) and
// row counts past whole tiles (16 rows). Each element within fp32 summation error of the double
// product of the rounded operands, and sub-range calls bitwise equal to one whole call (what
// keeps results alike for every thread count).
// The kernels' packer writes pack_pair_block's words: every panel width of the ISA, both
// orientations of B (V's rows in place, K^T's columns gathered), blocks with odd ends, mid-panel
// starts and partial registers, and values that round every way (ties, NaN, Inf, denormals,
// -0, values that overflow to Inf); words outside the block are kept.
TEST_P(XsimdKernels, PackPairsWritesPackPairBlocksWords) {
  namespace d = mha::detail;
  const std::int64_t k = 301, n = 77;
  std::vector<float> b = mha_test::random_floats(static_cast<std::size_t>(k * n), 12, 4.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -0.0f,
                            std::bit_cast<float>(0x3f808000u),   // a tie: rounds to even
                            std::bit_cast<float>(0x3f818000u),   // a tie: rounds up
                            std::numeric_limits<float>::max(),   // rounds to Inf
                            std::bit_cast<float>(0x7f800001u)};  // a signalling NaN
  for (std::size_t i = 0; i < b.size(); i += 7) b[i] = specials[i / 7 % std::size(specials)];
  struct block {
    std::int64_t k0, k1, n0, n1;
  };
  for (int t = 0; t < kernels().tile_count; ++t) {
    const int nr = kernels().tiles[t].nr;
    for (const bool columns_contiguous : {true, false}) {
      for (const block blk : {block{0, k, 0, n}, block{3, 300, 5, 70}, block{1, 2, 7, 8},
                              block{2, 3, 0, n}, block{40, 297, 9, 10}, block{0, 64, 32, 64}}) {
        const std::int64_t rows = blk.k1 - blk.k0, cols = blk.n1 - blk.n0;
        const std::int64_t stride_k = columns_contiguous ? 1 : cols + 3,
                           stride_n = columns_contiguous ? rows + 5 : 1;
        std::vector<float> src(static_cast<std::size_t>(rows * cols + 3 * rows + 5 * cols + 8));
        for (std::int64_t kk = blk.k0; kk < blk.k1; ++kk)
          for (std::int64_t nn = blk.n0; nn < blk.n1; ++nn)
            src[static_cast<std::size_t>((kk - blk.k0) * stride_k + (nn - blk.n0) * stride_n)] =
                b[static_cast<std::size_t>(kk * n + nn)];
        const std::size_t words = static_cast<std::size_t>((k + 1) / 2 * d::round_up(n, nr));
        std::vector<d::bf16_pair> expected(words, 0xabcdabcdu), got = expected;
        d::pack_pair_block(src.data(), stride_k, stride_n, k, blk.k0, blk.k1, blk.n0, blk.n1, nr,
                           expected.data());
        kernels().pack_pairs(src.data(), stride_k, stride_n, k, blk.k0, blk.k1, blk.n0, blk.n1, nr,
                             got.data());
        for (std::size_t w = 0; w < words; ++w) {
          ASSERT_EQ(got[w], expected[w])
              << "nr " << nr << (columns_contiguous ? " K^T" : " V") << " block [" << blk.k0 << ", "
              << blk.k1 << ") x [" << blk.n0 << ", " << blk.n1 << ") word " << w;
        }
      }
    }
  }
}

TEST_P(XsimdKernels, PairGemmSubRangesMatchRoundedProducts) {
  for (int t = 0; t < kernels().tile_count; ++t) {
    const int nr = kernels().tiles[t].nr;
    for (const auto [m, k, n] : {std::array<std::int64_t, 3>{1, 1, 1},
                                 {17, 33, 2 * nr + 3},
                                 {16, 64, nr},
                                 {5, 7, nr - 1},
                                 {33, 31, nr},
                                 {70, 256, 2 * nr + 3},
                                 {40, 2 * mha::detail::gemm_k_slice + 88, 2 * nr + 3},
                                 {300, 45, 2 * nr + 3},
                                 // C's rows 2 KiB apart over many k slices (AMX: the edge buffer)
                                 {34, 4096, 512}}) {
      const std::vector<float> a = mha_test::random_floats(m * k, 1),
                               w = mha_test::random_floats(n * k, 2),
                               bias = mha_test::random_floats(n, 3);
      const std::int64_t kp = mha::detail::pairs(k);
      std::vector<mha::detail::bf16_pair> a_pairs(m * kp);
      kernels().to_pairs(a.data(), m, k, k, a_pairs.data());
      const mha::detail::packed_matrix packed(w.data(), bias.data(), n, k, nr, true);
      const mha::detail::pair_panels_view b = packed.pair_view();
      // C whole on cache lines (the tiles keep partial sums in it, unless its rows alias), and
      // split one float past them (the tiles keep them in their edge buffer): the same bits.
      mha::detail::float_buffer whole_buffer(m * n), split_buffer(m * n + 1);
      float *whole = whole_buffer.data(), *split = split_buffer.data() + 1;
      std::fill_n(whole, m * n, std::numeric_limits<float>::quiet_NaN());
      std::fill_n(split, m * n, std::numeric_limits<float>::quiet_NaN());
      kernels().pair_gemm({a_pairs.data(), kp, b, whole, n, m}, 0, m, 0, b.panels());
      const mha::detail::pair_gemm_args g{a_pairs.data(), kp, b, split, n, m};
      const std::int64_t row_split = m / 2 + 1 < m ? m / 2 + 1 : m, panel_split = b.panels() / 2;
      kernels().pair_gemm(g, 0, row_split, 0, panel_split);
      kernels().pair_gemm(g, 0, row_split, panel_split, b.panels());
      kernels().pair_gemm(g, row_split, m, 0, b.panels());
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double expected = mha::detail::round_bf16(bias[j]), magnitude = std::abs(expected);
          for (std::int64_t kk = 0; kk < k; ++kk) {
            const double product = double{mha::detail::round_bf16(a[i * k + kk])} *
                                   mha::detail::round_bf16(w[j * k + kk]);
            expected += product;
            magnitude += std::abs(product);
          }
          const std::string where = "nr " + std::to_string(nr) + " (m, k, n) = (" +
                                    std::to_string(m) + ", " + std::to_string(k) + ", " +
                                    std::to_string(n) + ") at C[" + std::to_string(i) + "][" +
                                    std::to_string(j) + "]";
          // fp32 sums of k + 1 terms: each rounding at most 2^-24 of a partial sum.
          ASSERT_NEAR(whole[i * n + j], expected, (k + 1) * 0x1p-24 * magnitude) << where;
          ASSERT_EQ(std::bit_cast<std::uint32_t>(split[i * n + j]),
                    std::bit_cast<std::uint32_t>(whole[i * n + j]))
              << where;
        }
      }
    }
  }
}

// row_max and exp2_sum over every length up to a few registers, lanes past the end padded with
// values that must be ignored; exp2_sum zeroes them.
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
    // 2^ of the float difference the kernel computes (its rounding is not the kernel's error).
    for (std::int64_t j = 0; j < n; ++j) sum += expected[j] = std::exp2(double{x[j] - largest});
    const float got = kernels().exp2_sum(x.data(), n, largest, 1.0f);
    EXPECT_NEAR(got, sum, 1e-6 * sum) << "n " << n;
    for (std::int64_t j = 0; j < n; ++j)
      EXPECT_NEAR(x[j], expected[j], 2e-7 * expected[j]) << "n " << n << " j " << j;
    for (std::int64_t j = n; j < static_cast<std::int64_t>(x.size()); ++j)
      EXPECT_EQ(x[j], 0.0f) << "n " << n << " padding lane " << j;
  }
}

// Across the whole range a weight can take, 2^x stays within 2e-7 of exp2 (one sweep of every
// exponent, each value at several mantissas, including integers and half-integers, where the
// reduction switches k).
TEST_P(XsimdKernels, Exp2IsAccurateDownToItsCutoff) {
  const std::int64_t lanes = kernels().lanes;
  std::vector<float> x;
  for (float v = 0.0f; v >= -125.0f; v -= 0.125f) x.push_back(v);
  for (float v = -1e-8f; v > -1e-1f; v *= 3.0f) x.push_back(v);
  const std::size_t n = x.size();
  x.resize((n + lanes - 1) / lanes * lanes);
  const std::vector<float> input(x.begin(), x.begin() + n);
  kernels().exp2_sum(x.data(), static_cast<std::int64_t>(n), 0.0f, 1.0f);
  for (std::size_t j = 0; j < n; ++j) {
    const double expected = std::exp2(double{input[j]});
    EXPECT_NEAR(x[j], expected, 2e-7 * expected) << "2^" << input[j];
  }
}

// pack_block of B's rows and of B's columns (a transposed source, taken in 4 x 4 blocks) puts
// each element of its block where the panel layout says, for blocks that start and end inside
// panels and sizes off the blocks, and writes nothing else.
TEST(XsimdPacking, PackBlockPutsEveryElementInItsPanelPlace) {
  constexpr std::int64_t k = 13, n = 37;
  for (const int nr : {8, 16, 32}) {
    for (const bool transposed : {false, true}) {
      for (const auto [k0, k1, n0, n1] :
           {std::array<std::int64_t, 4>{0, k, 0, n}, std::array<std::int64_t, 4>{3, 11, 5, 34},
            std::array<std::int64_t, 4>{4, 8, 9, 10}}) {
        // B (k, n) with element (kk, nn) = kk * 100 + nn, stored as rows or as columns.
        const std::int64_t stride_k = transposed ? 1 : n, stride_n = transposed ? k : 1;
        std::vector<float> b(static_cast<std::size_t>(k * n));
        for (std::int64_t kk = 0; kk < k; ++kk) {
          for (std::int64_t nn = 0; nn < n; ++nn)
            b[kk * stride_k + nn * stride_n] = static_cast<float>(kk * 100 + nn);
        }
        std::vector<float> packed(static_cast<std::size_t>(mha::detail::packed_size(k, n, nr)),
                                  -1.0f);
        mha::detail::pack_block(b.data() + k0 * stride_k + n0 * stride_n, stride_k, stride_n, k, k0,
                                k1, n0, n1, nr, packed.data());
        for (std::int64_t kk = 0; kk < k; ++kk) {
          for (std::int64_t nn = 0; nn < mha::detail::round_up(n, nr); ++nn) {
            const bool inside = kk >= k0 && kk < k1 && nn >= n0 && nn < n1;
            ASSERT_EQ(packed[nn / nr * k * nr + kk * nr + nn % nr],
                      inside ? static_cast<float>(kk * 100 + nn) : -1.0f)
                << "nr " << nr << (transposed ? " columns" : " rows") << " block [" << k0 << ", "
                << k1 << ") x [" << n0 << ", " << n1 << "), element (" << kk << ", " << nn << ")";
          }
        }
      }
    }
  }
}

// AVX-512 forms 2^x with vreduceps and vscalefps, AVX2 through the exponent's bits: the weights
// are the same bits on every ISA with FMA, the cutoff included. (SSE2 has no FMA: its polynomial
// rounds twice a step, so it differs in the last bit.)
TEST(XsimdIsa, Exp2IsTheSameBitsOnEveryIsaWithFma) {
  const std::vector<isa> isas = mha::xsimd_supported_isas();
  if (std::find(isas.begin(), isas.end(), isa::avx2) == isas.end())
    GTEST_SKIP() << "this CPU has no AVX2: no two ISAs with FMA to compare";
  std::vector<float> input;
  for (float v = 0.0f; v >= -126.0f; v -= 0.0625f) input.push_back(v);
  for (float v = -1e-30f; v > -1.0f; v *= 7.0f) input.push_back(v);
  input.push_back(-std::numeric_limits<float>::infinity());
  for (const float r : mha_test::random_floats(4096, 11, 40.0f)) input.push_back(-std::abs(r));
  const std::int64_t n = static_cast<std::int64_t>(input.size());
  input.resize(static_cast<std::size_t>((n + 15) / 16 * 16));  // room for every ISA's lanes
  std::vector<float> expected = input;
  mha::detail::kernels_for(isa::avx2).exp2_sum(expected.data(), n, 0.0f, 1.0f);
  for (const isa isa : isas) {
    if (isa == isa::sse2) continue;
    std::vector<float> got = input;
    mha::detail::kernels_for(isa).exp2_sum(got.data(), n, 0.0f, 1.0f);
    for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[j]), std::bit_cast<std::uint32_t>(expected[j]))
          << mha::to_string(isa) << ": 2^" << input[j] << " = " << got[j] << ", avx2 "
          << expected[j];
  }
}

// Below the cutoff, and for -inf scores, weights are exactly 0 (never NaN); NaN stays NaN.
TEST_P(XsimdKernels, Exp2EdgeValues) {
  const std::int64_t lanes = kernels().lanes;
  std::vector<float> x(static_cast<std::size_t>(lanes), -std::numeric_limits<float>::infinity());
  x[0] = 0.0f;
  if (lanes > 2) x[1] = -125.5f;
  EXPECT_EQ(kernels().exp2_sum(x.data(), lanes, 0.0f, 1.0f), 1.0f);
  for (std::int64_t j = 1; j < lanes; ++j) EXPECT_EQ(x[j], 0.0f);

  std::vector<float> y(static_cast<std::size_t>(lanes), -1.0f);
  y[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(kernels().exp2_sum(y.data(), lanes, 0.0f, 1.0f)));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.5f);
}

// The attention kernel against the double oracle for key tiles from the narrowest the ISA allows
// (narrower than a query block, so some rows have no key in a tile) through ragged ones to one
// tile per row (the unfused form), on a sequence that is no multiple of any of them, an odd
// head_dim and a multiple of the panels, causal or not, with and without dropout.
TEST_P(XsimdKernels, AttentionMatchesReferenceForEveryKeyTile) {
  for (const bool causal : {true, false}) {
    // 3 and 8: the narrow-head kernel (head_dim <= 8 with 16 lanes, <= 4 otherwise), without
    // dropout.
    for (const std::int64_t head_dim : {3, 8, 19, 64}) {
      for (const float dropout : {0.0f, 0.3f}) {
        const mha_reference::attention_shape shape{2, 3, 150, head_dim, causal, dropout, 17};
        const std::int64_t size = shape.batch * shape.heads * shape.seq_len * head_dim;
        const std::vector<float> q = mha_test::random_floats(size, 5, 3.0f),
                                 k = mha_test::random_floats(size, 6, 3.0f),
                                 v = mha_test::random_floats(size, 7);
        std::vector<std::vector<double>> expected;
        double largest = 0.0;
        for (std::int64_t row = 0; row < shape.batch * shape.heads * shape.seq_len; ++row) {
          const std::int64_t i = row % shape.seq_len, head = row / shape.seq_len;
          expected.push_back(mha_reference::attention_row(shape, q, k, v, head / shape.heads,
                                                          head % shape.heads, i));
          largest = std::max(largest, mha_test::max_abs(expected.back()));
        }
        mha::detail::attention_args args;
        const std::int64_t head_stride = shape.seq_len * head_dim;
        std::vector<float> out(size);
        args.q = {q.data(), shape.heads * head_stride, head_stride, head_dim};
        args.k = {k.data(), shape.heads * head_stride, head_stride, head_dim};
        args.v = {v.data(), shape.heads * head_stride, head_stride, head_dim};
        args.out = {out.data(), shape.heads * head_stride, head_stride, head_dim};
        args.batch = shape.batch;
        args.heads = shape.heads;
        args.seq_len = shape.seq_len;
        args.head_dim = head_dim;
        args.causal = causal;
        args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        args.dropout = {dropout, shape.seed};
        for (const std::int64_t key_tile : {1, 64, 100, 150}) {
          std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
          mha::detail::attention(kernels(), args, key_tile);
          for (std::size_t row = 0; row < expected.size(); ++row) {
            const std::vector<float> got(out.begin() + row * head_dim,
                                         out.begin() + (row + 1) * head_dim);
            ASSERT_LE(mha_test::max_abs_diff(got, expected[row]), 1e-5 * largest)
                << "key tile " << key_tile << (causal ? " causal" : " non-causal") << " head_dim "
                << head_dim << " dropout " << dropout << " row " << row % shape.seq_len
                << " of head " << row / shape.seq_len;
          }
        }
      }
    }
  }
}

// The death tests' style: "threadsafe" (the child re-executes this program), or "fast" (fork
// only) where the suite runs under an emulator (MHA_TEST_EMULATOR: qemu-user cannot start the
// cross-built program again without a binfmt handler).
const char* death_test_style() { return mha_test::emulator().empty() ? "threadsafe" : "fast"; }

// A broken internal contract stops the program with its place and condition (MHA_EXPECTS), and
// the kernel entries check theirs in debug and sanitizer builds: a panel width no tile has, a
// GEMM row range past A's rows. (Release builds compile the checks away: skipped there.)
TEST(Contracts, ABrokenContractAbortsNamingItsPlaceAndCondition) {
  GTEST_FLAG_SET(death_test_style, death_test_style());
  EXPECT_DEATH(mha::detail::broken_contract("rows <= 16", "tile.cpp", 42),
               "tile.cpp:42: contract broken: rows <= 16");
}

TEST_P(XsimdKernels, KernelEntriesCheckTheirContractsInCheckedBuilds) {
#if defined(NDEBUG) && !defined(MHA_CHECKED_BUILD)
  GTEST_SKIP() << "a release build: MHA_EXPECTS compiles away";
#else
  GTEST_FLAG_SET(death_test_style, death_test_style());
  EXPECT_DEATH(kernels().tile_for(3), "contract broken: .*tile_for");
  const int nr = kernels().tiles[0].nr;
  const std::vector<float> a = mha_test::random_floats(4 * 8, 1),
                           w = mha_test::random_floats(nr * 8, 2);
  const mha::detail::packed_matrix packed(w.data(), nullptr, nr, 8, nr);
  std::vector<float> c(4 * nr);
  const mha::detail::gemm_args g{a.data(), 8, packed.view(), c.data(), nr, 4};
  EXPECT_DEATH(kernels().gemm(g, 0, 5, 0, 1), "contract broken: .*row_end <= g.m");
  EXPECT_DEATH(kernels().gemm(g, 0, 4, 0, 2), "contract broken: .*panel_end <= g.b.panels");
#endif
}

INSTANTIATE_TEST_SUITE_P(Isa, XsimdKernels, testing::ValuesIn(mha::xsimd_supported_isas()),
                         [](const testing::TestParamInfo<isa>& p) {
                           return std::string(mha::to_string(p.param));
                         });

}  // namespace
