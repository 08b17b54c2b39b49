// The bad-input catalogue (docs/design.md §1.2): one test per error case, each asserting the
// exception type and that the message names the offending value. Hostile model folders (files
// outside the folder, oversized, deep or mistyped configs, broken indexes) are in
// tests/io/test_model_folder.cpp, beside the folders they break.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "mha/error.hpp"
#include "mha/mha.hpp"
#include "mha/registry.hpp"
#include "support.hpp"

namespace {

using mha_test::expect_error;

mha::config good_config() {
  mha::config c;
  c.d_in = 8;
  c.d_out = 12;
  c.n_heads = 3;
  c.context_length = 10;
  return c;
}

TEST(BadConfig, DOutNotDivisibleByHeads) {
  mha::config c = good_config();
  c.d_out = 10;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"d_out (10)", "n_heads (3)"});
}

TEST(BadConfig, ZeroDIn) {
  mha::config c = good_config();
  c.d_in = 0;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"d_in (0)", ">= 1"});
}

TEST(BadConfig, NegativeDOut) {
  mha::config c = good_config();
  c.d_out = -12;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"d_out (-12)"});
}

TEST(BadConfig, ZeroHeads) {
  mha::config c = good_config();
  c.n_heads = 0;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"n_heads (0)"});
}

TEST(BadConfig, ZeroContextLength) {
  mha::config c = good_config();
  c.context_length = 0;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"context_length (0)"});
}

TEST(BadConfig, DropoutOne) {
  mha::config c = good_config();
  c.dropout = 1.0f;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"dropout (1)", "[0, 1)"});
}

// Floats in messages carry enough digits to tell them from their neighbours (issue 17 I).
TEST(BadConfig, DropoutJustBelowOneIsPrintedInFull) {
  mha::config c = good_config();
  c.dropout = std::nextafter(1.0f, 2.0f);
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"dropout (1.0000001)"});
}

TEST(BadConfig, DropoutNegative) {
  mha::config c = good_config();
  c.dropout = -0.25f;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"dropout (-0.25)"});
}

TEST(BadConfig, DropoutNan) {
  mha::config c = good_config();
  c.dropout = std::nanf("");
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"dropout (nan)"});
}

TEST(BadConfig, ByteCountOverflows) {
  mha::config c = good_config();
  c.d_in = std::int64_t{1} << 40;
  c.d_out = std::int64_t{3} << 40;
  expect_error<mha::invalid_argument>(
      [&] { mha::validate(c); }, {"W_query.weight", "3298534883328 x 1099511627776", "overflow"});
}

TEST(BadConfig, PrepareNamesTheBackend) {
  mha::config c = good_config();
  c.n_heads = 5;
  expect_error<mha::invalid_argument>(
      [&] { mha::naive_backend().prepare(c, mha::formulation::wrapper, {}); },
      {"naive", "d_out (12)", "n_heads (5)"});
}

TEST(BadFormulation, UnknownName) {
  expect_error<mha::invalid_argument>([] { mha::parse_formulation("splitweight"); },
                                      {"'splitweight'", "wrapper", "split_weight"});
}

TEST(BadWeights, WrongWeightShape) {
  const mha::config c = good_config();
  mha::weights w = mha::weights::random(c, 1);
  w.key.out = 11;
  expect_error<mha::invalid_argument>([&] { mha::validate(c, w); },
                                      {"W_key.weight is (11, 8)", "expected (12, 8)"});
}

TEST(BadWeights, TruncatedWeightData) {
  const mha::config c = good_config();
  mha::weights w = mha::weights::random(c, 1);
  w.value.weight.pop_back();
  expect_error<mha::invalid_argument>([&] { mha::validate(c, w); },
                                      {"W_value.weight holds 95", "96"});
}

TEST(BadWeights, MissingQkvBias) {
  mha::config c = good_config();
  c.qkv_bias = true;
  mha::weights w = mha::weights::random(c, 1);
  w.query.bias.clear();
  expect_error<mha::invalid_argument>([&] { mha::validate(c, w); }, {"W_query.bias holds 0", "12"});
}

TEST(BadWeights, UnexpectedQkvBias) {
  const mha::config c = good_config();
  mha::weights w = mha::weights::random(c, 1);
  w.query.bias.assign(12, 0.0f);
  expect_error<mha::invalid_argument>([&] { mha::validate(c, w); }, {"W_query.bias is present"});
}

TEST(BadWeights, MissingOutProj) {
  const mha::config c = good_config();
  mha::weights w = mha::weights::random(c, 1);
  w.out_proj = {};
  expect_error<mha::invalid_argument>([&] { mha::validate(c, w); },
                                      {"out_proj.weight is (0, 0)", "(12, 12)"});
}

TEST(BadWeights, UnexpectedOutProj) {
  mha::config c = good_config();
  const mha::weights w = mha::weights::random(c, 1);
  c.out_proj = false;
  expect_error<mha::invalid_argument>([&] { mha::validate(c, w); },
                                      {"out_proj weights are present", "out_proj = false"});
}

TEST(BadWeights, HeadIndexOutOfRange) {
  const mha::config c = good_config();
  const mha::weights w = mha::weights::random(c, 1);
  expect_error<mha::invalid_argument>([&] { w.head(c, 3); }, {"head index 3", "[0, 3)"});
}

TEST(BadWeights, WrongNumberOfHeads) {
  const mha::config c = good_config();
  const mha::weights w = mha::weights::random(c, 1);
  const std::vector<mha::head_weights> two = {w.head(c, 0), w.head(c, 1)};
  expect_error<mha::invalid_argument>([&] { mha::weights::from_heads(c, two, w.out_proj); },
                                      {"2 heads given", "n_heads = 3"});
}

TEST(BadWeights, HeadOfWrongShape) {
  const mha::config c = good_config();
  const mha::weights w = mha::weights::random(c, 1);
  std::vector<mha::head_weights> heads = {w.head(c, 0), w.head(c, 1), w.head(c, 2)};
  heads[1].key.weight.resize(3);
  expect_error<mha::invalid_argument>([&] { mha::weights::from_heads(c, heads, w.out_proj); },
                                      {"head 1", "W_key.weight holds 3", "32"});
}

class BadRun : public testing::Test {
 protected:
  mha::config cfg = good_config();
  std::unique_ptr<mha::plan> plan = mha::naive_backend().prepare(
      cfg, mha::formulation::split_weight, mha::weights::random(cfg, 1));
  std::vector<float> x = std::vector<float>(2 * 10 * 8, 0.5f), y = std::vector<float>(2 * 10 * 12);
};

TEST_F(BadRun, SeqLenAboveContextLength) {
  std::vector<float> big(2 * 11 * 8);
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({big.data(), 2, 11, 8}, {y.data(), 2, 11, 12});
      },
      {"naive", "seq_len (11)", "context_length (10)"});
}

TEST_F(BadRun, ZeroSeqLen) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 2, 0, 8}, {y.data(), 2, 0, 12});
      },
      {"seq_len (0)"});
}

TEST_F(BadRun, ZeroBatch) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 0, 10, 8}, {y.data(), 0, 10, 12});
      },
      {"batch (0)"});
}

TEST_F(BadRun, InputFeaturesNotDIn) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 2, 8, 10}, {y.data(), 2, 8, 12});
      },
      {"(2, 8, 10)", "(10) must equal d_in (8)"});
}

TEST_F(BadRun, OutputShapeWrong) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 2, 10, 8}, {y.data(), 2, 10, 8});
      },
      {"output y is (2, 10, 8)", "expected (2, 10, 12)"});
}

TEST_F(BadRun, NullInput) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({nullptr, 2, 10, 8}, {y.data(), 2, 10, 12});
      },
      {"input x has no data"});
}

TEST_F(BadRun, NullOutput) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 2, 10, 8}, {nullptr, 2, 10, 12});
      },
      {"output y has no data"});
}

TEST_F(BadRun, InputAndOutputOverlap) {
  std::vector<float> both(2 * 10 * 12 + 8);
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({both.data() + 8, 1, 10, 8}, {both.data(), 1, 10, 12});
      },
      {"overlap"});
}

TEST_F(BadRun, NegativeThreads) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 2, 10, 8}, {y.data(), 2, 10, 12}, {.threads = -2});
      },
      {"threads (-2)", ">= 0"});
}

// An OpenMP runtime asked for a million threads fails to start them (and aborts): capped.
TEST_F(BadRun, AbsurdThreadCount) {
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run({x.data(), 2, 10, 8}, {y.data(), 2, 10, 12}, {.threads = 1'000'000});
      },
      {"threads (1000000)", "<= 1024"});
}

TEST_F(BadRun, OutputUntouchedOnError) {
  std::fill(y.begin(), y.end(), 7.0f);
  EXPECT_THROW(plan->run({x.data(), 2, 10, 8}, {y.data(), 2, 10, 8}), mha::invalid_argument);
  for (float v : y) ASSERT_EQ(v, 7.0f);
}

// naive and onednn hold T x T scores: past MHA_MAX_SCORE_BYTES (default 4 GiB) run() throws
// before allocating them, naming T, the bytes and the limit (issue 17 G).
TEST(ScoreMemory, LimitIsCheckedBeforeAllocating) {
  const mha::config cfg{.d_in = 1, .d_out = 1, .n_heads = 1, .context_length = 40000};
  const mha::weights w = mha::weights::random(cfg, 1);
  const std::int64_t t = 40000;  // 6.4 GB of scores for one head
  std::vector<float> x(t, 0.5f), y(t);
  for (const char* name : {"naive", "onednn"}) {
    const mha::backend* b = mha::find_backend(name);
    if (b == nullptr) continue;
    for (const auto form : mha::formulations()) {
      const auto plan = b->prepare(cfg, form, w);
      expect_error<mha::invalid_argument>(
          [&] {
            plan->run({x.data(), 1, t, 1}, {y.data(), 1, t, 1});
          },
          {name, "T = 40000", "bytes for its T x T attention scores", "limit of 4294967296",
           "MHA_MAX_SCORE_BYTES"});
      ::setenv("MHA_MAX_SCORE_BYTES", "1000", 1);
      expect_error<mha::invalid_argument>(
          [&] {
            plan->run({x.data(), 1, 20, 1}, {y.data(), 1, 20, 1});
          },
          {name, "T = 20", "limit of 1000 bytes"});
      ::setenv("MHA_MAX_SCORE_BYTES", "100000", 1);
      EXPECT_NO_THROW(plan->run({x.data(), 1, 20, 1}, {y.data(), 1, 20, 1})) << "raised limit";
      ::setenv("MHA_MAX_SCORE_BYTES", "4G", 1);
      expect_error<mha::invalid_argument>(
          [&] {
            plan->run({x.data(), 1, 20, 1}, {y.data(), 1, 20, 1});
          },
          {"MHA_MAX_SCORE_BYTES is '4G'"});
      ::unsetenv("MHA_MAX_SCORE_BYTES");
    }
  }
}

TEST(BadView, SpanSizeDisagreesWithShape) {
  std::vector<float> storage(23);
  expect_error<mha::invalid_argument>(
      [&] { mha::tensor_view<float> v(std::span<float>(storage), 2, 3, 4); },
      {"23 floats", "(2, 3, 4)"});
}

TEST(BadBackend, UnknownNameListsAvailable) {
  expect_error<mha::invalid_argument>([] { mha::require_backend("cuda"); }, {"'cuda'", "naive"});
}

TEST(BadBackend, UnknownEnvironmentName) {
  ::setenv("MHA_BACKEND", "fastest", 1);
  expect_error<mha::invalid_argument>([] { mha::default_backend(); },
                                      {"MHA_BACKEND", "'fastest'", "naive"});
  ::unsetenv("MHA_BACKEND");
}

}  // namespace
