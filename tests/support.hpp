// Helpers shared by the test files.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "mha/backend.hpp"
#include "mha/config.hpp"
#include "mha/io.hpp"
#include "mha/isa.hpp"

// How gtest prints the library's enums when they are test parameters: by name. gtest finds
// PrintTo by argument-dependent lookup, so these live in the enums' namespaces. Without them
// gtest prints an enum class's bytes with snprintf for each parameterised test at start-up;
// with the printers of mha_test's parameter types below, a test process that runs one test
// starts in 35 ms instead of 137 (perf stat, 2-vCPU Xeon), and ctest runs one per test.
namespace mha {
inline void PrintTo(formulation f, std::ostream* os) { *os << to_string(f); }
inline void PrintTo(precision p, std::ostream* os) { *os << to_string(p); }
inline void PrintTo(isa i, std::ostream* os) { *os << to_string(i); }
}  // namespace mha
namespace mha::io {
inline void PrintTo(layout l, std::ostream* os) { *os << to_string(l); }
}  // namespace mha::io

namespace mha_test {

// Runs f, expects an exception of type E whose message contains every fragment.
template <class E, class F>
void expect_error(F&& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    for (const char* fragment : fragments) EXPECT_THAT(e.what(), testing::HasSubstr(fragment));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}
// The same with fragments built at run time.
template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    for (const std::string& fragment : fragments) {
      EXPECT_THAT(e.what(), testing::HasSubstr(fragment));
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// One test shape: a module and the input it runs on.
struct shape {
  std::int64_t batch, seq_len, d_in, d_out, n_heads;
  bool causal = true, qkv_bias = false, out_proj = true;
  std::int64_t n_kv_heads = 0;  // config::n_kv_heads: 0 = n_heads
  double rope_base = 0.0;       // config::rope_base: 0 = no rotary embedding
  bool out_proj_bias = true;
  mha::rope_scaling rope_scaling = {};

  mha::config config() const;
  // "b3_t17_din24_dout30_h3" plus "_kvh2", "_noncausal", "_qkvbias", "_noproj", "_rope10000",
  // "_linear4" or "_llama3" (a rope scaling), "_nooutbias".
  std::string name() const;
};

// The conformance shapes: T in {1,2,7,17,33,64,65}, B in {1,3}, d_in != d_out, head_dim 1, odd,
// above one AVX-512 register and a multiple of a GEMM panel (head-major projections), H in
// {1,2,3,4,12,96}, every flag both ways.
const std::vector<shape>& conformance_shapes();

// A backend under test and the label its tests carry ("naive", "xsimd_avx2", ...).
struct backend_case {
  std::string label;
  const mha::backend* backend;
};

// How gtest prints these parameters (a failure's GetParam(), --gtest_list_tests): by name
// (mha's enums above say why it matters).
inline void PrintTo(const backend_case& b, std::ostream* os) { *os << b.label; }
inline void PrintTo(const shape& s, std::ostream* os) { *os << s.name(); }

// Every backend of mha::available_backends(), best first, plus variants a backend offers for
// testing (an xsimd ISA other than the one dispatched to, ...).
const std::vector<backend_case>& backend_cases();
// ... those whose attention calls take a KV cache (backend::supports_attention).
std::vector<backend_case> attention_backend_cases();

// The parameter of the suites that run the conformance set (conformance, decode, bf16): every
// backend case x formulation x conformance shape, their generator, and the test names they carry
// ("xsimd_avx2_split_weight_b3_t17_din24_dout30_h3").
using conformance_param = std::tuple<backend_case, mha::formulation, shape>;
inline auto conformance_params() {
  return testing::Combine(testing::ValuesIn(backend_cases()),
                          testing::ValuesIn(mha::formulations()),
                          testing::ValuesIn(conformance_shapes()));
}
std::string conformance_param_name(const testing::TestParamInfo<conformance_param>& info);

// The parameter of the suites over every backend case x formulation (decode, dropout, bf16's
// per-backend checks), their generator, and the test names they carry ("xsimd_avx2_wrapper").
using backend_form_param = std::tuple<backend_case, mha::formulation>;
inline auto backend_form_params() {
  return testing::Combine(testing::ValuesIn(backend_cases()),
                          testing::ValuesIn(mha::formulations()));
}
inline std::string backend_form_name(const testing::TestParamInfo<backend_form_param>& info) {
  return std::get<0>(info.param).label + "_" + std::string(mha::to_string(std::get<1>(info.param)));
}

// Whether the documentation says `b` computes p (docs/design.md §2.3 lists what each backend
// does beyond fp32 multi-head attention): a backend that declines a problem it claims fails the
// suites; one that declines an unclaimed problem is skipped with its reason.
bool claims(const backend_case& b, const mha::problem& p);

// Whether b's incremental calls (decode) run the same kernels as its full forward, so that
// their rows equal the full forward's bit for bit (docs/design.md §1.4): naive, xsimd and tbb;
// not onednn, whose decode primitives have other shapes and reduction orders.
bool decodes_bitwise(const mha::backend& b);

// When b declines p: the reason, to skip the test with (MHA_TEST_SKIP_IF_DECLINED), after
// failing the test when b claims p. nullopt when b computes p.
std::optional<std::string> declined(const backend_case& b, const mha::problem& p);

// Skips the running test, saying why, where declined(b, p) says b declines p. A macro because
// GTEST_SKIP returns from the test body; the problem is __VA_ARGS__ so that a braced problem's
// commas pass through.
#define MHA_TEST_SKIP_IF_DECLINED(b, ...) \
  if (const auto declined_why = mha_test::declined(b, __VA_ARGS__)) GTEST_SKIP() << *declined_why

// n floats uniform in [-scale, scale), reproducible from seed.
std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f);

// The inputs of the suites over backend x formulation x shape: cfg's random weights (seed 1234)
// and s's x (batch, seq_len, d_in) uniform in [-input_scale, input_scale) (seed 99; x10 puts
// the scores well away from 0, which exercises the softmax's max subtraction).
struct shape_inputs {
  mha::weights w;
  std::vector<float> x;
};
shape_inputs inputs_of(const mha::config& cfg, const shape& s, float input_scale = 10.0f);

// Prepares `form` on `backend` and runs x (batch, seq_len, d_in) through it.
std::vector<float> forward(const mha::backend& backend, mha::formulation form,
                           const mha::config& cfg, const mha::weights& w,
                           const std::vector<float>& x, std::int64_t batch, std::int64_t seq_len,
                           const mha::run_options& options = {});

double max_abs(const std::vector<double>& v);
double max_abs(const std::vector<float>& v);
// max_i |a_i - b_i|; NaN when any element is NaN (so comparisons with it fail).
double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b);
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// Expects a and b to be the same layers, bit for bit: shapes, weights and biases.
void expect_same_weights(const mha::weights& a, const mha::weights& b);

// A test with its own empty directory dir_, removed afterwards. Unique per process and test, so
// concurrent ctest runs (even from other checkouts) never share files.
class scratch_test : public testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::filesystem::path dir_;
};

// What the `mha` command (built with the tests) printed and returned.
struct command_result {
  int exit_code = -1;
  std::string output;  // stdout and stderr interleaved
};
// Runs `mha args...` and waits for it.
command_result run_mha(const std::vector<std::string>& args);
// The emulator that runs this suite, MHA_TEST_EMULATOR ("" when unset: the suite runs on its
// CPU). scripts/test-aarch64.sh sets it to qemu-aarch64 for the cross-built suite.
std::string emulator();
// The shell words that start the `mha` command: its path, quoted, after the emulator when there
// is one (the program is the emulator's to start, as this one's was).
std::string mha_command_line();

}  // namespace mha_test
