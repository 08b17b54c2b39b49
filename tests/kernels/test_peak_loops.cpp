// The kernels' peak loops (isa_kernels::fma_rounds, bf16_rounds), the yardsticks the bench reads
// figures against, for every ISA this CPU runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/interface/isa_kernels.hpp"
#include "mha/backends/xsimd.hpp"
#include "support.hpp"  // how gtest prints an isa

namespace {

using mha::isa;

class PeakLoops : public testing::TestWithParam<isa> {
 protected:
  const mha::detail::isa_kernels& kernels() const { return mha::detail::kernels_for(GetParam()); }
};

// The peak loops the bench reads figures against: the FLOPs each claims are the work it did.
// fma_rounds' chains (FLOPs / (2 lanes rounds)) each converge from 1 + 0.001 c towards 1
// (acc * 0.999999 + 1e-6), so their sum after r rounds is known; bf16_rounds' dot-product
// chains each add 2^-9 a round to 0.001 c (AMX: every element of C 2^-5 a round).
TEST_P(PeakLoops, CountTheFlopsTheyDo) {
  constexpr std::int64_t rounds = 1000;
  const double lanes = kernels().lanes;
  float sink = 0;
  ASSERT_NE(kernels().fma_rounds, nullptr);
  const double flops = kernels().fma_rounds(rounds, &sink);
  const double chains = flops / (2 * lanes * rounds);
  EXPECT_EQ(chains, std::round(chains)) << flops;
  EXPECT_GE(chains, 8);
  const double decay = std::pow(0.999999, rounds);
  EXPECT_NEAR(sink, lanes * (chains + 0.001 * decay * chains * (chains - 1) / 2), 1e-3 * sink);
  EXPECT_EQ(kernels().fma_rounds(2 * rounds, &sink), 2 * flops);

  ASSERT_EQ(kernels().bf16_rounds != nullptr, mha::native_bf16(GetParam()))
      << "a bf16 loop exactly where the ISA's bf16 is native";
  if (kernels().bf16_rounds == nullptr) return;
  const double bf16_flops = kernels().bf16_rounds(rounds, &sink);
  if (GetParam() == isa::amx) {
    EXPECT_EQ(bf16_flops, 4.0 * 16 * 16 * 16 * 4 * rounds);
    EXPECT_EQ(sink, rounds / 32.0);
  } else {
    const double dot_chains = bf16_flops / (4 * lanes * rounds);
    EXPECT_EQ(dot_chains, std::round(dot_chains)) << bf16_flops;
    EXPECT_NEAR(sink,
                lanes * (0.001 * dot_chains * (dot_chains - 1) / 2 + dot_chains * rounds / 512.0),
                1e-3 * sink);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, PeakLoops, testing::ValuesIn(mha::xsimd_supported_isas()),
                         [](const testing::TestParamInfo<isa>& p) {
                           return std::string(mha::to_string(p.param));
                         });

}  // namespace
