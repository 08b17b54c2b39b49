// Incremental calls through a KV cache (docs/design.md §1.4): every backend x formulation x
// conformance shape, prefill then token by token, against the same plan's full forward passes;
// sequences of one batch at different lengths; the errors, which leave the cache as it was;
// concurrent runs on different caches.
//
// The backends that decode share their projection and attention arithmetic between the two
// modes (a row's result depends on neither the rows computed with it nor the block it falls in:
// docs/design.md §2.2), so an incremental y must equal the full forward's rows bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "decode_calls.hpp"
#include "driver/kv_cache_access.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"
#include "mha_testing.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using namespace mha_test::decode_calls;
using param = mha_test::conformance_param;

mha::problem decode_problem(const shape& s, formulation form) {
  return {s.config(), form, s.batch, 1, /*past=*/std::max<std::int64_t>(s.seq_len - 1, 1)};
}

class Decode : public testing::TestWithParam<param> {};

TEST_P(Decode, PrefillThenTokensEqualsFullForward) {
  const auto& [backend, form, s] = GetParam();
  const mha::config cfg = s.config();
  MHA_TEST_SKIP_IF_DECLINED(backend, decode_problem(s, form));
  const auto [w, x] = mha_test::inputs_of(cfg, s);
  const auto p = backend.backend->prepare(cfg, form, w);
  mha::kv_cache cache = p->make_cache(s.batch, s.seq_len);
  expect_cache_bytes(cache, cfg, s.batch, s.seq_len);
  // Half the sequence at once, then one token per call.
  const std::int64_t half = (s.seq_len + 1) / 2;
  EXPECT_TRUE(matches_calls(*backend.backend, *p, w, x,
                            incremental(*p, cache, x, s.batch, s.seq_len, half, 1), s.batch,
                            s.seq_len, half, 1));
  EXPECT_EQ(cache.lengths(),
            std::vector<std::int64_t>(static_cast<std::size_t>(s.batch), s.seq_len));

  // Again after reset, three tokens per call from the start.
  cache.reset();
  EXPECT_TRUE(matches_calls(*backend.backend, *p, w, x,
                            incremental(*p, cache, x, s.batch, s.seq_len, 3, 3), s.batch, s.seq_len,
                            3, 3));
}

// Training mode: the dropout mask is keyed on absolute positions, so it is the full forward's.
TEST_P(Decode, DropoutMatchesFullForward) {
  const auto& [backend, form, s] = GetParam();
  mha::config cfg = s.config();
  cfg.dropout = 0.25;
  MHA_TEST_SKIP_IF_DECLINED(backend, decode_problem(s, form));
  const mha::weights w = mha::weights::random(cfg, 7);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 5);
  const mha::run_options training{.training = true, .seed = 42};
  const auto p = backend.backend->prepare(cfg, form, w);
  mha::kv_cache cache = p->make_cache(s.batch, s.seq_len);
  // A prompt of 1 token, then 4 at a time.
  EXPECT_TRUE(matches_calls(*backend.backend, *p, w, x,
                            incremental(*p, cache, x, s.batch, s.seq_len, 1, 4, training), s.batch,
                            s.seq_len, 1, 4, training));
}

INSTANTIATE_TEST_SUITE_P(All, Decode, mha_test::conformance_params(),
                         mha_test::conformance_param_name);

// The rest runs on each backend that decodes, split-weight and wrapper, on one small module.
class DecodeBackend : public testing::TestWithParam<mha_test::backend_form_param> {
 protected:
  static constexpr std::int64_t batch = 3, seq_len = 12;
  const mha::config cfg{.d_in = 16, .d_out = 24, .n_heads = 4, .context_length = seq_len};

  const mha::backend& backend() const { return *std::get<0>(GetParam()).backend; }

  void SetUp() override {
    const auto& [backend, form] = GetParam();
    MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, batch, 1, 4});
    plan_ = backend.backend->prepare(cfg, form, mha::weights::random(cfg, 3));
    x_ = mha_test::random_floats(static_cast<std::size_t>(batch * seq_len * cfg.d_in), 11, 4.0f);
    full_.resize(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
    plan_->run({x_.data(), batch, seq_len, cfg.d_in}, {full_.data(), batch, seq_len, cfg.d_out});
  }

  // One call of `t` tokens: sequence b gets its tokens from position starts[b] on.
  std::vector<float> step(mha::kv_cache& cache, const std::vector<std::int64_t>& starts,
                          std::int64_t t) const {
    return step_of(x_, cache, starts, t);
  }
  // step() on another input.
  std::vector<float> step_of(const std::vector<float>& x, mha::kv_cache& cache,
                             const std::vector<std::int64_t>& starts, std::int64_t t) const {
    std::vector<float> xs, ys(static_cast<std::size_t>(batch * t * cfg.d_out));
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto from = x.begin() + (b * seq_len + starts[static_cast<std::size_t>(b)]) * cfg.d_in;
      xs.insert(xs.end(), from, from + t * cfg.d_in);
    }
    plan_->run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, cfg.d_out}, cache);
    return ys;
  }
  // Row r of sequence b of a call's output of t tokens per sequence, starting `at` floats in.
  std::vector<float> row_of(const std::vector<float>& ys, std::int64_t b, std::int64_t r,
                            std::int64_t t, std::int64_t at = 0) const {
    const auto from = ys.begin() + at + (b * t + r) * cfg.d_out;
    return {from, from + cfg.d_out};
  }
  // The full forward's rows [first, first + t) of sequence b.
  std::vector<float> expected(std::int64_t b, std::int64_t first, std::int64_t t) const {
    const auto from = full_.begin() + (b * seq_len + first) * cfg.d_out;
    return {from, from + t * cfg.d_out};
  }
  static std::vector<float> sequence(const std::vector<float>& ys, std::int64_t b, std::int64_t t,
                                     std::int64_t width) {
    return {ys.begin() + b * t * width, ys.begin() + (b + 1) * t * width};
  }

  std::unique_ptr<mha::plan> plan_;
  std::vector<float> x_, full_;
};

// Continuous batching: sequence 1 restarts while 0 and 2 go on, so one call attends over 4
// cached tokens for sequence 1 and 8 for the others.
TEST_P(DecodeBackend, SequencesAtDifferentLengths) {
  mha::kv_cache cache = plan_->make_cache(batch, seq_len);
  step(cache, {0, 0, 0}, 4);
  cache.reset(1);
  const std::vector<float> second = step(cache, {4, 0, 4}, 4);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{8, 4, 8}));
  const std::vector<float> third = step(cache, {8, 4, 8}, 1);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{9, 5, 9}));
  for (std::int64_t b : {0, 2}) {
    EXPECT_TRUE(same_rows(backend(), sequence(second, b, 4, cfg.d_out), expected(b, 4, 4)))
        << "sequence " << b;
    EXPECT_TRUE(same_rows(backend(), sequence(third, b, 1, cfg.d_out), expected(b, 8, 1)))
        << "sequence " << b;
  }
  EXPECT_TRUE(same_rows(backend(), sequence(second, 1, 4, cfg.d_out), expected(1, 0, 4)));
  EXPECT_TRUE(same_rows(backend(), sequence(third, 1, 1, cfg.d_out), expected(1, 4, 1)));
}

// mha_testing::hold_zero_tokens, the benchmarks' rewind, stands for a prefill of zero tokens
// (keys and values 0: the module has no qkv_bias): the next call computes what it computes
// after a real prefill of x = 0.
TEST_P(DecodeBackend, HeldZeroTokensEqualAPrefillOfZeros) {
  ASSERT_FALSE(cfg.qkv_bias);
  const std::vector<float> zeros(x_.size(), 0.0f);
  mha::kv_cache fed = plan_->make_cache(batch, seq_len);
  step_of(zeros, fed, {0, 0, 0}, 8);
  mha::kv_cache held = plan_->make_cache(batch, seq_len);
  mha_testing::hold_zero_tokens(held, 8);
  EXPECT_EQ(held.lengths(), fed.lengths());
  EXPECT_EQ(step(held, {8, 8, 8}, 2), step(fed, {8, 8, 8}, 2));
}

// truncate() rolls sequences back to tokens they hold: the next call computes what it computes
// after a cache that was only ever fed those tokens, and a length past them is an error.
TEST_P(DecodeBackend, TruncateRollsBackToTheKeptTokens) {
  mha::kv_cache fed = plan_->make_cache(batch, seq_len);
  step(fed, {0, 0, 0}, 3);
  mha::kv_cache rolled = plan_->make_cache(batch, seq_len);
  step(rolled, {0, 0, 0}, 3);  // as `fed` (a GEMM's rounding may depend on its rows)
  step(rolled, {3, 3, 3}, 3);
  rolled.truncate(0, 3);
  rolled.truncate(1, 3);
  rolled.truncate(2, 3);
  EXPECT_EQ(rolled.lengths(), fed.lengths());
  EXPECT_EQ(step(rolled, {3, 3, 3}, 2), step(fed, {3, 3, 3}, 2));
  mha_test::expect_error<mha::invalid_argument>([&] { rolled.truncate(1, 6); },
                                                {"length 6 of sequence 1", "[0, 5]"});
  mha_test::expect_error<mha::invalid_argument>([&] { rolled.truncate(1, -1); }, {"length -1"});
  mha_test::expect_error<mha::invalid_argument>([&] { rolled.truncate(batch, 0); },
                                                {std::to_string(batch)});
  EXPECT_EQ(rolled.lengths(), (std::vector<std::int64_t>{5, 5, 5}));
}

// A call past the capacity throws naming the sequence and the lengths, and changes nothing: the
// next call that fits still computes the full forward's rows.
TEST_P(DecodeBackend, CapacityErrorLeavesTheCacheIntact) {
  mha::kv_cache cache = plan_->make_cache(batch, 6);
  EXPECT_EQ(cache.capacity(), 6);
  step(cache, {0, 0, 0}, 4);
  cache.reset(1);
  mha_test::expect_error<mha::invalid_argument>(
      [&] {
        step(cache, {4, 0, 4}, 3);
      },
      {"sequence 0 holds 4 tokens; 3 more make 7, past the cache's capacity (6)"});
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{4, 0, 4}));
  const std::vector<float> ys = step(cache, {4, 0, 4}, 2);
  EXPECT_TRUE(same_rows(backend(), sequence(ys, 0, 2, cfg.d_out), expected(0, 4, 2)));
  EXPECT_TRUE(same_rows(backend(), sequence(ys, 1, 2, cfg.d_out), expected(1, 0, 2)));
}

TEST_P(DecodeBackend, BadCachesAndShapesThrow) {
  mha_test::expect_error<mha::invalid_argument>(
      [&] { (void)plan_->make_cache(batch, seq_len + 1); },
      {"cache capacity (13)", "context_length (12)"});
  mha_test::expect_error<mha::invalid_argument>([&] { (void)plan_->make_cache(0, 4); },
                                                {"cache batch (0) must be >= 1"});
  mha::kv_cache small = plan_->make_cache(batch - 1, seq_len);
  mha_test::expect_error<mha::invalid_argument>(
      [&] {
        step(small, {0, 0, 0}, 1);
      },
      {"input batch (3) must equal the cache's batch (2)"});
  const auto other =
      std::get<0>(GetParam())
          .backend->prepare(cfg, std::get<1>(GetParam()), mha::weights::random(cfg, 3));
  mha::kv_cache foreign = other->make_cache(batch, seq_len);
  mha_test::expect_error<mha::invalid_argument>(
      [&] {
        step(foreign, {0, 0, 0}, 1);
      },
      {"made by another plan"});
  EXPECT_EQ(foreign.lengths(), (std::vector<std::int64_t>{0, 0, 0}));
  mha_test::expect_error<mha::invalid_argument>([&] { (void)foreign.length(3); },
                                                {"sequence 3 is out of range", "holds 3"});
  mha_test::expect_error<mha::invalid_argument>([&] { foreign.reset(-1); },
                                                {"sequence -1 is out of range"});
}

// A NaN or Inf in a chunk's later token never reaches the chunk's earlier rows, and the tokens
// a reset sequence held before (the bad one among them) never reach the new sequence's rows:
// each equals the same call on clean input, bit for bit, and is finite.
TEST_P(DecodeBackend, NonFiniteTokensReachOnlyTheRowsThatSeeThem) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x_bad = x_;
    for (std::int64_t b = 0; b < batch; ++b) x_bad[(b * seq_len + 7) * cfg.d_in + 2] = bad;
    const auto chunks = [&](const std::vector<float>& x) {
      mha::kv_cache cache = plan_->make_cache(batch, seq_len);
      std::vector<float> ys = step_of(x, cache, {0, 0, 0}, 5);
      const std::vector<float> chunk = step_of(x, cache, {5, 5, 5}, 4);  // tokens 5..8, 7 bad
      ys.insert(ys.end(), chunk.begin(), chunk.end());
      // Sequence 1 starts over: its new rows 0..2 lie where tokens 0..2 were, 7 is stale.
      cache.reset(1);
      const std::vector<float> again = step_of(x, cache, {9, 0, 9}, 3);
      return std::pair(ys, again);
    };
    const auto [clean, clean_again] = chunks(x_);
    const auto [got, got_again] = chunks(x_bad);
    for (std::int64_t b = 0; b < batch; ++b) {
      // The first call's 5 rows and the chunk's rows of tokens 5 and 6.
      for (std::int64_t r : {0, 1, 2, 3, 4}) {
        EXPECT_EQ(row_of(got, b, r, 5), row_of(clean, b, r, 5)) << "b " << b << " token " << r;
      }
      for (std::int64_t r : {0, 1}) {
        const std::vector<float> row = row_of(got, b, r, 4, batch * 5 * cfg.d_out);
        EXPECT_EQ(row, row_of(clean, b, r, 4, batch * 5 * cfg.d_out))
            << "b " << b << " token " << 5 + r;
        for (float v : row) EXPECT_TRUE(std::isfinite(v)) << "b " << b << " token " << 5 + r;
      }
    }
    for (std::int64_t r : {0, 1, 2}) {
      const std::vector<float> row = row_of(got_again, 1, r, 3);
      EXPECT_EQ(row, row_of(clean_again, 1, r, 3)) << "restarted sequence, token " << r;
      for (float v : row) EXPECT_TRUE(std::isfinite(v)) << "restarted sequence, token " << r;
    }
  }
}

// One plan, one cache per thread: each thread's token-by-token outputs are the full forward's.
TEST_P(DecodeBackend, ConcurrentRunsOnDifferentCaches) {
  constexpr int threads = 4;
  std::vector<std::vector<float>> got(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      mha::kv_cache cache = plan_->make_cache(batch, seq_len);
      got[static_cast<std::size_t>(i)] = incremental(*plan_, cache, x_, batch, seq_len, 2, 1);
    });
  }
  for (std::thread& t : pool) t.join();
  for (int i = 0; i < threads; ++i)
    EXPECT_TRUE(same_rows(backend(), got[static_cast<std::size_t>(i)], full_)) << i;
}

// Two threads decode into one cache with one free slot, many times over: one call holds the
// cache (kv_cache's one caller at a time), so exactly one token is appended, the other call
// throws (naming the concurrent use, or the capacity when it came second) and the cache never
// holds more than its capacity. Before the claim, both passed the capacity check and wrote K and
// V past the storage (ASan: heap-buffer-overflow). Under TSan too (the xsimd and naive cases).
TEST_P(DecodeBackend, ConcurrentRunsOnOneCacheNeverPassItsCapacity) {
  constexpr std::int64_t capacity = 6;
  mha::kv_cache cache = plan_->make_cache(batch, capacity);
  step(cache, {0, 0, 0}, capacity - 1);
  for (int round = 0; round < 100; ++round) {
    for (std::int64_t b = 0; b < batch; ++b) cache.truncate(b, capacity - 1);
    std::atomic<int> ready{0}, appended{0}, refused{0};
    const auto decode = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      try {
        step(cache, {5, 5, 5}, 1);
        appended.fetch_add(1);
      } catch (const mha::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_TRUE(what.find("in use by another call") != std::string::npos ||
                    what.find("past the cache's capacity (6)") != std::string::npos)
            << what;
        refused.fetch_add(1);
      }
    };
    std::thread first(decode), second(decode);
    first.join();
    second.join();
    ASSERT_EQ(appended.load(), 1) << "round " << round;
    ASSERT_EQ(refused.load(), 1) << "round " << round;
    ASSERT_EQ(cache.lengths(), std::vector<std::int64_t>(batch, capacity)) << "round " << round;
  }
}

// A cache held by a call refuses a second caller whatever it asks (run, reset, truncate) and is
// left as it was; released, it serves the next.
TEST_P(DecodeBackend, CacheHeldByACallRefusesAnother) {
  mha::kv_cache cache = plan_->make_cache(batch, seq_len);
  step(cache, {0, 0, 0}, 2);
  mha_testing::hold(cache, [&] {
    for (const auto& call : std::initializer_list<std::function<void()>>{
             [&] {
               step(cache, {2, 2, 2}, 1);
             },
             [&] { cache.reset(); }, [&] { cache.reset(1); }, [&] { cache.truncate(0, 1); }}) {
      mha_test::expect_error<mha::invalid_argument>(call, {"kv_cache", "in use by another call"});
    }
  });
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  const std::vector<float> ys = step(cache, {2, 2, 2}, 1);
  EXPECT_TRUE(same_rows(backend(), sequence(ys, 0, 1, cfg.d_out), expected(0, 2, 1)));
}

INSTANTIATE_TEST_SUITE_P(All, DecodeBackend, mha_test::backend_form_params(),
                         mha_test::backend_form_name);

}  // namespace
