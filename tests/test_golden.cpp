// PyTorch goldens (tests/golden, written by `python3 -m mhapy.golden`): every backend x
// formulation x case reproduces PyTorch's output, through the io API and through `mha run`.
// Either file layout runs in either formulation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "mha/io.hpp"
#include "mha/registry.hpp"
#include "support.hpp"

namespace {

namespace io = mha::io;
namespace fs = std::filesystem;

// Allowed error relative to max|y|: PyTorch and every backend compute in float32 with different
// summation orders; both stay within a few ulp of the largest output.
constexpr double relative_tolerance = 1e-5;

struct golden_case {
  std::string name;
  std::optional<std::int64_t> heads;  // --heads, for files without metadata num_heads
  bool causal = true;
  fs::path weights, input, output;
};

const std::vector<golden_case>& golden_cases() {
  static const std::vector<golden_case> cases = [] {
    const fs::path dir = MHA_GOLDEN_DIR;
    std::ifstream in(dir / "cases.json");
    const nlohmann::json manifest = nlohmann::json::parse(in);
    std::vector<golden_case> list;
    for (const nlohmann::json& c : manifest.at("cases")) {
      golden_case g{c.at("name"),          std::nullopt,        c.at("causal"),
                    dir / c.at("weights"), dir / c.at("input"), dir / c.at("output")};
      if (!c.at("heads_option").is_null()) g.heads = c.at("heads_option").get<std::int64_t>();
      list.push_back(g);
    }
    return list;
  }();
  return cases;
}

// Checks y (from the module run on the case's input) against PyTorch's output.
void expect_matches_pytorch(const golden_case& c, const io::tensor& y) {
  const io::tensor expected = io::read_npy(c.output);
  ASSERT_EQ(y.shape, expected.shape);
  const double scale = mha_test::max_abs(expected.values);
  ASSERT_GT(scale, 0.0);
  const double error = mha_test::max_abs_diff(y.values, expected.values);
  EXPECT_LE(error, relative_tolerance * scale) << "max |y| = " << scale;
  // In --gtest_output=json:...: the figure the issue asks to report.
  std::ostringstream relative;
  relative << std::scientific << error / scale;
  testing::Test::RecordProperty("relative_error", relative.str());
}

using io_param = std::tuple<mha_test::backend_case, mha::formulation, golden_case>;
class GoldenIo : public testing::TestWithParam<io_param> {};

TEST_P(GoldenIo, MatchesPyTorch) {
  const auto& [backend, form, c] = GetParam();
  io::loaded_module m = io::load_module(c.weights, {.n_heads = c.heads.value_or(0)});
  m.cfg.causal = c.causal;
  const io::tensor x = io::read_npy(c.input);
  ASSERT_TRUE(x.shape.size() == 2 || x.shape.size() == 3);
  const std::int64_t batch = x.shape.size() == 3 ? x.shape[0] : 1;
  const std::int64_t tokens = x.shape[x.shape.size() - 2];
  io::tensor y{x.shape,
               mha_test::forward(*backend.backend, form, m.cfg, m.w, x.values, batch, tokens)};
  y.shape.back() = m.cfg.d_out;
  expect_matches_pytorch(c, y);
}

std::string io_name(const testing::TestParamInfo<io_param>& info) {
  const auto& [backend, form, c] = info.param;
  return backend.label + "_" + std::string(mha::to_string(form)) + "_" + c.name;
}

const auto formulations =
    testing::Values(mha::formulation::wrapper, mha::formulation::split_weight);

INSTANTIATE_TEST_SUITE_P(Golden, GoldenIo,
                         testing::Combine(testing::ValuesIn(mha_test::backend_cases()),
                                          formulations, testing::ValuesIn(golden_cases())),
                         io_name);

// The command picks backends by name: every one in the registry.
std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const mha::backend* b : mha::available_backends()) names.emplace_back(b->name());
  return names;
}

using command_param = std::tuple<std::string, mha::formulation, golden_case>;
class GoldenCommand : public mha_test::scratch_test,
                      public testing::WithParamInterface<command_param> {};

TEST_P(GoldenCommand, MhaRunMatchesPyTorch) {
  const auto& [backend, form, c] = GetParam();
  const fs::path output = dir_ / "y.npy";
  std::vector<std::string> args = {
      "run",       "--backend", backend,   "--formulation", std::string(mha::to_string(form)),
      "--weights", c.weights,   "--input", c.input,         "--output",
      output};
  if (c.heads) args.insert(args.end(), {"--heads", std::to_string(*c.heads)});
  if (!c.causal) args.emplace_back("--no-causal");
  const mha_test::command_result r = mha_test::run_mha(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_matches_pytorch(c, io::read_npy(output));
}

std::string command_name(const testing::TestParamInfo<command_param>& info) {
  const auto& [backend, form, c] = info.param;
  return backend + "_" + std::string(mha::to_string(form)) + "_" + c.name;
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenCommand,
                         testing::Combine(testing::ValuesIn(backend_names()), formulations,
                                          testing::ValuesIn(golden_cases())),
                         command_name);

}  // namespace
