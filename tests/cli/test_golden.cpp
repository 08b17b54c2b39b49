// PyTorch goldens (tests/golden, written by `python3 -m mhapy.golden`): every backend x
// formulation x case reproduces PyTorch's output, through the io API and through `mha run`.
// Every file layout (the seeds' split and wrapper modules, grouped K/V heads with rotary
// embedding, nn.MultiheadAttention, GPT-2, Llama, blocks of whole-model checkpoints) runs in
// every formulation, and is detected as the layout cases.json names. The incremental cases (a
// `prefill` and a `chunk` in cases.json: PyTorch's module with a KV cache, fed the same way) run
// through plan::make_cache and plan::run(x, y, cache), and through `mha run --incremental`; a
// backend that declines decode is skipped with its reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>

#include "mha/backend.hpp"
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
  std::string layout;  // io::to_string of the layout the file has
  // What the file does not say: --heads, --kv-heads, --rope-base (as cases.json writes it) and
  // --prefix (the block of a whole-model checkpoint).
  std::optional<std::int64_t> heads, kv_heads;
  std::optional<std::string> rope_base;
  std::string prefix;
  bool causal = true;
  fs::path weights, input, output;
  // Incremental cases: the first call takes `prefill` tokens (none when 0), the later ones
  // `chunk`; the output is every call's y in order. nullopt: one full forward pass.
  std::optional<std::int64_t> prefill, chunk;
};
// gtest prints a case by its name (tests/support.hpp says why).
void PrintTo(const golden_case& c, std::ostream* os) { *os << c.name; }

// The cases of cases.json that are incremental, or those that are not.
std::vector<golden_case> golden_cases(bool incremental) {
  static const std::vector<golden_case> cases = [] {
    const fs::path dir = MHA_GOLDEN_DIR;
    std::ifstream in(dir / "cases.json");
    const nlohmann::json manifest = nlohmann::json::parse(in);
    std::vector<golden_case> list;
    for (const nlohmann::json& c : manifest.at("cases")) {
      const auto number = [&](const char* key) -> std::optional<std::int64_t> {
        if (!c.contains(key) || c.at(key).is_null()) return std::nullopt;
        return c.at(key).get<std::int64_t>();
      };
      golden_case g{c.at("name"),           c.at("layout"),
                    number("heads_option"), number("kv_heads_option"),
                    std::nullopt,           c.value("prefix", ""),
                    c.at("causal"),         dir / c.at("weights"),
                    dir / c.at("input"),    dir / c.at("output"),
                    number("prefill"),      number("chunk")};
      if (c.contains("rope_base_option")) g.rope_base = c.at("rope_base_option").dump();
      list.push_back(g);
    }
    return list;
  }();
  std::vector<golden_case> some;
  for (const golden_case& c : cases) {
    if (c.chunk.has_value() == incremental) some.push_back(c);
  }
  return some;
}

// A case's module (its config as the command builds it) and input.
struct loaded_case {
  io::loaded_module m;
  io::tensor x;
  std::int64_t batch = 1, tokens = 0;
};

loaded_case load_case(const golden_case& c) {
  io::state_dict_options options{
      .n_heads = c.heads.value_or(0), .n_kv_heads = c.kv_heads.value_or(0), .prefix = c.prefix};
  if (c.rope_base) options.rope_base = std::stod(*c.rope_base);
  loaded_case l{io::load_module(c.weights, options), io::read_npy(c.input)};
  EXPECT_EQ(io::to_string(l.m.layout), c.layout);
  l.m.cfg.causal = c.causal;
  const std::vector<std::int64_t>& shape = l.x.shape;
  EXPECT_TRUE(shape.size() == 2 || shape.size() == 3);
  l.batch = shape.size() == 3 ? shape[0] : 1;
  l.tokens = shape[shape.size() - 2];
  // Weights without a mask buffer (the KV-cache modules' files): any T, as `mha run` has it.
  if (l.m.cfg.context_length == 0) l.m.cfg.context_length = l.tokens;
  return l;
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
  const loaded_case l = load_case(c);
  io::tensor y{l.x.shape, mha_test::forward(*backend.backend, form, l.m.cfg, l.m.w, l.x.values,
                                            l.batch, l.tokens)};
  y.shape.back() = l.m.cfg.d_out;
  expect_matches_pytorch(c, y);
}

std::string io_name(const testing::TestParamInfo<io_param>& info) {
  const auto& [backend, form, c] = info.param;
  return backend.label + "_" + std::string(mha::to_string(form)) + "_" + c.name;
}

const auto formulations = testing::ValuesIn(mha::formulations());

INSTANTIATE_TEST_SUITE_P(Golden, GoldenIo,
                         testing::Combine(testing::ValuesIn(mha_test::backend_cases()),
                                          formulations, testing::ValuesIn(golden_cases(false))),
                         io_name);

// The problem whose support decides whether a backend runs an incremental case: one token
// after all but one (decode; a backend that decodes at all decodes every case here).
mha::problem decode_problem(const loaded_case& l, mha::formulation form) {
  return {l.m.cfg, form, l.batch, 1, std::max<std::int64_t>(l.tokens - 1, 1)};
}

class GoldenIncremental : public testing::TestWithParam<io_param> {};

TEST_P(GoldenIncremental, MatchesPyTorch) {
  const auto& [backend, form, c] = GetParam();
  const loaded_case l = load_case(c);
  MHA_TEST_SKIP_IF_DECLINED(backend, decode_problem(l, form));
  const auto plan = backend.backend->prepare(l.m.cfg, form, l.m.w);
  mha::kv_cache cache = plan->make_cache(l.batch, l.tokens);
  const std::int64_t d_in = l.m.cfg.d_in, d_out = l.m.cfg.d_out;
  io::tensor y{l.x.shape, std::vector<float>(static_cast<std::size_t>(l.batch * l.tokens * d_out))};
  y.shape.back() = d_out;
  // The calls `mha run --incremental` makes: each takes tokens [at, at + t) of every sequence.
  for (std::int64_t at = 0, t = 0; at < l.tokens; at += t) {
    t = std::min(at == 0 && *c.prefill > 0 ? *c.prefill : *c.chunk, l.tokens - at);
    std::vector<float> xs, ys(static_cast<std::size_t>(l.batch * t * d_out));
    for (std::int64_t b = 0; b < l.batch; ++b) {
      const auto row = l.x.values.begin() + (b * l.tokens + at) * d_in;
      xs.insert(xs.end(), row, row + t * d_in);
    }
    plan->run({xs.data(), l.batch, t, d_in}, {ys.data(), l.batch, t, d_out}, cache);
    for (std::int64_t b = 0; b < l.batch; ++b) {
      std::copy_n(ys.begin() + b * t * d_out, t * d_out,
                  y.values.begin() + (b * l.tokens + at) * d_out);
    }
  }
  EXPECT_EQ(cache.lengths(),
            std::vector<std::int64_t>(static_cast<std::size_t>(l.batch), l.tokens));
  expect_matches_pytorch(c, y);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenIncremental,
                         testing::Combine(testing::ValuesIn(mha_test::backend_cases()),
                                          formulations, testing::ValuesIn(golden_cases(true))),
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
  if (c.chunk) {
    const mha_test::backend_case b{backend, &mha::require_backend(backend)};
    if (const auto why = mha_test::declined(b, decode_problem(load_case(c), form))) {
      GTEST_SKIP() << *why;
    }
  }
  const fs::path output = dir_ / "y.npy";
  std::vector<std::string> args = {
      "run",       "--backend", backend,   "--formulation", std::string(mha::to_string(form)),
      "--weights", c.weights,   "--input", c.input,         "--output",
      output};
  if (c.heads) args.insert(args.end(), {"--heads", std::to_string(*c.heads)});
  if (c.kv_heads) args.insert(args.end(), {"--kv-heads", std::to_string(*c.kv_heads)});
  if (c.rope_base) args.insert(args.end(), {"--rope-base", *c.rope_base});
  if (!c.prefix.empty()) args.insert(args.end(), {"--prefix", c.prefix});
  if (!c.causal) args.emplace_back("--no-causal");
  if (c.chunk) {
    args.insert(args.end(), {"--incremental", "--prefill", std::to_string(*c.prefill), "--chunk",
                             std::to_string(*c.chunk)});
  }
  const mha_test::command_result r = mha_test::run_mha(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_matches_pytorch(c, io::read_npy(output));
}

std::string command_name(const testing::TestParamInfo<command_param>& info) {
  const auto& [backend, form, c] = info.param;
  return backend + "_" + std::string(mha::to_string(form)) + "_" + c.name;
}

// Full forward passes, and `mha run --incremental --prefill N --chunk S` for the incremental
// cases.
INSTANTIATE_TEST_SUITE_P(Golden, GoldenCommand,
                         testing::Combine(testing::ValuesIn(backend_names()), formulations,
                                          testing::ValuesIn(golden_cases(false))),
                         command_name);
INSTANTIATE_TEST_SUITE_P(GoldenIncremental, GoldenCommand,
                         testing::Combine(testing::ValuesIn(backend_names()), formulations,
                                          testing::ValuesIn(golden_cases(true))),
                         command_name);

}  // namespace
