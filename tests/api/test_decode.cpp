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

#include "driver/kv_cache_access.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"
#include "mha_testing.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using mha::formulation;
using mha_test::shape;
using param = mha_test::conformance_param;

// Rows [first, first + count) of every sequence of a (batch, seq_len, width) tensor.
std::vector<float> rows_of(const std::vector<float>& t, std::int64_t batch, std::int64_t seq_len,
                           std::int64_t width, std::int64_t first, std::int64_t count) {
  std::vector<float> out;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto from = t.begin() + (b * seq_len + first) * width;
    out.insert(out.end(), from, from + count * width);
  }
  return out;
}

// The calls of a generation loop over x (batch, seq_len, d_in): `prefill` tokens, then `chunk`
// at a time. f(at, t) for each call of tokens [at, at + t).
template <class F>
void for_each_call(std::int64_t seq_len, std::int64_t prefill, std::int64_t chunk, F&& f) {
  for (std::int64_t at = 0; at < seq_len;) {
    const std::int64_t t = std::min(at == 0 ? prefill : chunk, seq_len - at);
    f(at, t);
    at += t;
  }
}

// Feeds x through `cache` call by call; returns the calls' outputs as one (batch, seq_len,
// d_out) tensor.
std::vector<float> incremental(const mha::plan& p, mha::kv_cache& cache,
                               const std::vector<float>& x, std::int64_t batch,
                               std::int64_t seq_len, std::int64_t prefill, std::int64_t chunk,
                               const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
  for_each_call(seq_len, prefill, chunk, [&](std::int64_t at, std::int64_t t) {
    const std::vector<float> xs = rows_of(x, batch, seq_len, cfg.d_in, at, t);
    std::vector<float> ys(static_cast<std::size_t>(batch * t * cfg.d_out));
    p.run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, cfg.d_out}, cache, options);
    for (std::int64_t b = 0; b < batch; ++b) {
      std::copy_n(ys.begin() + b * t * cfg.d_out, t * cfg.d_out,
                  y.begin() + (b * seq_len + at) * cfg.d_out);
    }
  });
  return y;
}

// The full forward of x, the causal calls' expected rows.
std::vector<float> full_forward(const mha::plan& p, const std::vector<float>& x, std::int64_t batch,
                                std::int64_t seq_len, const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
  p.run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.d_out}, options);
  return y;
}

// Incremental rows against the full forward's: bit for bit on the backends whose incremental
// calls run the kernels of their full forward (mha_test::decodes_bitwise), within twice the
// conformance bound (each side within 1e-5 * max|y| of the oracle) on the others.
testing::AssertionResult same_rows(const mha::backend& backend, const std::vector<float>& got,
                                   const std::vector<float>& expected) {
  if (got.size() != expected.size()) {
    return testing::AssertionFailure() << got.size() << " values, expected " << expected.size();
  }
  if (mha_test::decodes_bitwise(backend)) {
    if (got == expected) return testing::AssertionSuccess();
    return testing::AssertionFailure()
           << "not bitwise equal: max |difference| " << mha_test::max_abs_diff(got, expected);
  }
  const double difference = mha_test::max_abs_diff(got, expected),
               bound = 2e-5 * mha_test::max_abs(expected);
  if (difference <= bound) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "max |difference| " << difference << " > " << bound;
}

// What the calls of a generation loop over x must give: for each call of tokens [at, at + t),
// rows [at, at + t) of the forward pass over the tokens fed so far, [0, at + t). Causal, that is
// the plan's own full forward over the whole sequence (same_rows); non-causal, a query sees the
// tokens fed up to its call and none later, checked against the double oracle of each prefix
// within the conformance bound (a full forward per call would build oneDNN primitives for
// every length).
testing::AssertionResult matches_calls(const mha::backend& backend, const mha::plan& p,
                                       const mha::weights& w, const std::vector<float>& x,
                                       const std::vector<float>& got, std::int64_t batch,
                                       std::int64_t seq_len, std::int64_t prefill,
                                       std::int64_t chunk, const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  if (cfg.causal) return same_rows(backend, got, full_forward(p, x, batch, seq_len, options));
  std::vector<double> expected(got.size());
  for_each_call(seq_len, prefill, chunk, [&](std::int64_t at, std::int64_t t) {
    const std::int64_t n = at + t;
    std::vector<mha_reference::row> rows;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = at; i < n; ++i) rows.push_back({b, i});
    const std::vector<double> ys = mha_reference::forward_rows(
        cfg, w, rows_of(x, batch, seq_len, cfg.d_in, 0, n), batch, n, rows, options);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(ys.begin() + static_cast<std::ptrdiff_t>(r) * cfg.d_out, cfg.d_out,
                  expected.begin() + (rows[r].batch * seq_len + rows[r].token) * cfg.d_out);
    }
  });
  const double difference = mha_test::max_abs_diff(got, expected),
               bound = 1e-5 * mha_test::max_abs(expected);
  if (difference <= bound) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "max |y - oracle| " << difference << " > " << bound;
}

// kv_cache::bytes() is the nominal 2 * B * capacity * H_kv * head_dim floats plus the padding of
// the backend's layout: at most the capacity rounded up to 32 keys and head_dim to 32 (the
// widest SIMD panels), and a cache line per head.
// Every formulation caches kv_heads heads (the wrapper one per K/V group).
void expect_cache_bytes(const mha::kv_cache& cache, const mha::config& cfg, std::int64_t batch,
                        std::int64_t capacity) {
  const std::int64_t heads = cfg.kv_heads();
  const auto up = [](std::int64_t n) { return (n + 31) / 32 * 32; };
  const std::int64_t hd = cfg.head_dim();
  EXPECT_GE(cache.bytes(), static_cast<std::size_t>(2 * batch * capacity * heads * hd) * 4);
  EXPECT_LE(cache.bytes(),
            static_cast<std::size_t>(batch * heads * (2 * up(capacity) * up(hd) + 16)) * 4);
}

mha::problem decode_problem(const shape& s, formulation form) {
  return {s.config(), form, s.batch, 1, /*past=*/std::max<std::int64_t>(s.seq_len - 1, 1)};
}

class Decode : public testing::TestWithParam<param> {};

TEST_P(Decode, PrefillThenTokensEqualsFullForward) {
  const auto& [backend, form, s] = GetParam();
  const mha::config cfg = s.config();
  if (const auto why = mha_test::declined(backend, decode_problem(s, form))) GTEST_SKIP() << *why;
  const mha::weights w = mha::weights::random(cfg, 1234);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 99, 10.0f);
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
  if (const auto why = mha_test::declined(backend, decode_problem(s, form))) GTEST_SKIP() << *why;
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
class DecodeBackend
    : public testing::TestWithParam<std::tuple<mha_test::backend_case, formulation>> {
 protected:
  static constexpr std::int64_t batch = 3, seq_len = 12;
  const mha::config cfg{.d_in = 16, .d_out = 24, .n_heads = 4, .context_length = seq_len};

  const mha::backend& backend() const { return *std::get<0>(GetParam()).backend; }

  void SetUp() override {
    const auto& [backend, form] = GetParam();
    if (const auto why = mha_test::declined(backend, {cfg, form, batch, 1, 4}))
      GTEST_SKIP() << *why;
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

INSTANTIATE_TEST_SUITE_P(All, DecodeBackend,
                         testing::Combine(testing::ValuesIn(mha_test::backend_cases()),
                                          testing::ValuesIn(mha::formulations())),
                         [](const auto& p) {
                           return std::get<0>(p.param).label + "_" +
                                  std::string(mha::to_string(std::get<1>(p.param)));
                         });

// Long caches: a decode call of few rows over more than 2048 keys splits them into chunks on the
// SIMD backends (src/kernels/attention.hpp, split-KV). Sequence 0 crosses a chunk boundary inside a
// call (its rows 0-1 see no key of the third chunk, rows 2-4 do); sequence 1 restarts, so one
// call mixes 3 chunks and 1. Every output is the full forward's within the conformance bound,
// and every thread count gives the same bits (onednn: within onednn_thread_tolerance). Heads of
// head_dim 16 (the register tiles) and 8 (the SIMD backends' narrow-head kernel with 16 lanes).
class DecodeLongCache
    : public testing::TestWithParam<
          std::tuple<mha_test::backend_case, formulation, std::int64_t /* n_heads */>> {
 protected:
  static constexpr std::int64_t batch = 2, seq_len = 4200;
  const mha::config cfg{
      .d_in = 16, .d_out = 32, .n_heads = std::get<2>(GetParam()), .context_length = seq_len};

  // The calls' outputs: 4094 tokens of both sequences; reset sequence 1; 5 tokens; 3 tokens.
  std::vector<float> calls(const mha::plan& p, const std::vector<float>& x, int threads) const {
    mha::kv_cache cache = p.make_cache(batch, seq_len);
    std::vector<float> out;
    const auto call = [&](const std::vector<std::int64_t>& starts, std::int64_t t) {
      std::vector<float> xs, ys(static_cast<std::size_t>(batch * t * cfg.d_out));
      for (std::int64_t b = 0; b < batch; ++b) {
        const auto from =
            x.begin() + (b * seq_len + starts[static_cast<std::size_t>(b)]) * cfg.d_in;
        xs.insert(xs.end(), from, from + t * cfg.d_in);
      }
      p.run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, cfg.d_out}, cache,
            {.threads = threads});
      out.insert(out.end(), ys.begin(), ys.end());
    };
    call({0, 0}, 4094);
    cache.reset(1);
    call({4094, 0}, 5);
    call({4099, 5}, 3);
    return out;
  }
};

TEST_P(DecodeLongCache, SplitKeysMatchTheFullForwardAndEveryThreadCount) {
  const mha_test::backend_case& backend = std::get<0>(GetParam());
  const formulation form = std::get<1>(GetParam());
  if (const auto why = mha_test::declined(backend, {cfg, form, batch, 1, 4100}))
    GTEST_SKIP() << *why;
  const auto p = backend.backend->prepare(cfg, form, mha::weights::random(cfg, 5));
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(batch * seq_len * cfg.d_in), 17, 3.0f);
  std::vector<float> full(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
  p->run({x.data(), batch, seq_len, cfg.d_in}, {full.data(), batch, seq_len, cfg.d_out});

  const std::vector<float> got = calls(*p, x, 1);
  // The rows each call computed, from the full forward: call 1 rows 0..4093 of both sequences,
  // call 2 rows 4094..4098 of sequence 0 and 0..4 of sequence 1, call 3 4099..4101 and 5..7.
  std::vector<float> expected;
  const auto rows = [&](std::int64_t b, std::int64_t first, std::int64_t n) {
    const auto from = full.begin() + (b * seq_len + first) * cfg.d_out;
    expected.insert(expected.end(), from, from + n * cfg.d_out);
  };
  rows(0, 0, 4094), rows(1, 0, 4094), rows(0, 4094, 5), rows(1, 0, 5), rows(0, 4099, 3),
      rows(1, 5, 3);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_LE(mha_test::max_abs_diff(got, expected), 1e-5 * mha_test::max_abs(expected));
  for (int threads : {2, 3}) {
    if (backend.backend->max_threads() == 1) break;
    const std::vector<float> other = calls(*p, x, threads);
    if (mha_test::decodes_bitwise(*backend.backend)) {
      EXPECT_EQ(other, got) << threads << " threads";
    } else {  // onednn: its strided decode matmuls split reductions by thread count
      EXPECT_LE(mha_test::max_abs_diff(other, got),
                mha::onednn_thread_tolerance * mha_test::max_abs(got))
          << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, DecodeLongCache,
                         testing::Combine(testing::ValuesIn(mha_test::backend_cases()),
                                          testing::ValuesIn(mha::formulations()),
                                          testing::Values(2, 4)),
                         [](const auto& p) {
                           return std::get<0>(p.param).label + "_" +
                                  std::string(mha::to_string(std::get<1>(p.param))) + "_h" +
                                  std::to_string(std::get<2>(p.param));
                         });

// Calls of every size where the kernels' row blocking changes (1, 2, 7, 8, 9, 15, 16, 17 tokens:
// 2 to 34 stacked rows with two query heads per K/V head), head sizes of the narrow path (8) and
// of the register tiles (16), fp32 and bf16: every call's rows are the full forward's, bit for
// bit where the backend decodes with its forward's kernels.
TEST(DecodeSupport, EveryCallSizeWhereTheBlockingChanges) {
  for (const std::int64_t head_dim : {8, 16}) {
    for (const mha::precision precision : {mha::precision::fp32, mha::precision::bf16}) {
      const mha::config cfg{.d_in = 16,
                            .d_out = 4 * head_dim,
                            .n_heads = 4,
                            .context_length = 40,
                            .n_kv_heads = 2,
                            .precision = precision};
      const mha::weights w = mha::weights::random(cfg, 5);
      const std::vector<float> x = mha_test::random_floats(2 * 40 * 16, 17, 2.0f);
      for (const mha_test::backend_case& b : mha_test::backend_cases()) {
        for (const formulation form : mha::formulations()) {
          if (mha_test::declined(b, {cfg, form, 2, 1, 3})) continue;
          const auto p = b.backend->prepare(cfg, form, w);
          for (const std::int64_t chunk : {1, 2, 7, 8, 9, 15, 16, 17}) {
            SCOPED_TRACE(b.label + " " + std::string(mha::to_string(form)) + " " +
                         mha::to_string(cfg) + " chunk " + std::to_string(chunk));
            mha::kv_cache cache = p->make_cache(2, 40);
            EXPECT_TRUE(matches_calls(*b.backend, *p, w, x,
                                      incremental(*p, cache, x, 2, 40, chunk, chunk), 2, 40, chunk,
                                      chunk));
          }
        }
      }
    }
  }
}

// With GPT-2's head_dim (64) and a capacity of whole panels, a cache is exactly its nominal size
// on every backend: 2 * B * capacity * H_kv * head_dim floats.
TEST(DecodeSupport, CacheOfWholePanelsHasTheNominalSize) {
  const mha::config cfg{.d_in = 16, .d_out = 128, .n_heads = 2, .context_length = 4096};
  const mha::weights w = mha::weights::random(cfg, 1);
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    for (formulation form : mha::formulations()) {
      if (mha_test::declined(b, {cfg, form, 1, 1, 3})) continue;
      const auto p = b.backend->prepare(cfg, form, w);
      EXPECT_EQ(p->make_cache(3, 4096).bytes(), std::size_t{2 * 3 * 4096 * 2 * 64 * 4}) << b.label;
    }
  }
}

// A cache's storage starts on a cache line, and one of 2 MiB or more on a 2 MiB boundary (where
// Linux can back it with huge pages), on every backend; it is zeroed and decodes as any other.
TEST(DecodeSupport, LargeCacheStartsOnAHugePageBoundary) {
  const mha::config cfg{.d_in = 16, .d_out = 128, .n_heads = 2, .context_length = 4096};
  const mha::weights w = mha::weights::random(cfg, 1);
  constexpr std::uintptr_t huge_page = std::uintptr_t{2} << 20;
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    if (mha_test::declined(b, {cfg, formulation::split_weight, 1, 1, 3})) continue;
    const auto p = b.backend->prepare(cfg, formulation::split_weight, w);
    mha::kv_cache small = p->make_cache(1, 16), large = p->make_cache(2, 4096);
    ASSERT_LT(small.bytes(), huge_page) << b.label;
    ASSERT_GE(large.bytes(), huge_page) << b.label;
    const auto address = [](mha::kv_cache& c) {
      return reinterpret_cast<std::uintptr_t>(mha::detail::kv_cache_access::store(c).data);
    };
    EXPECT_EQ(address(small) % 64, 0u) << b.label;
    EXPECT_EQ(address(large) % huge_page, 0u) << b.label;
    const std::byte* data = mha::detail::kv_cache_access::store(large).data;
    EXPECT_TRUE(std::all_of(data, data + large.bytes(), [](std::byte x) {
      return x == std::byte{0};
    })) << b.label;
  }
}

// A plan's rotary table holds the positions its calls reach, not its whole context: a module
// whose config allows 2^62 positions (a model's max_position_embeddings, a file's metadata)
// runs forward and decode calls on every backend as one of 16 positions does, bit for bit.
// Sized to the context, the table once overflowed (2^62 x head_dim / 2) and crashed, or asked
// for terabytes (2^40).
TEST(DecodeSupport, RotaryTableHoldsThePositionsCallsReach) {
  mha::config small{.d_in = 16, .d_out = 16, .n_heads = 4, .context_length = 16};
  small.n_kv_heads = 2;
  small.rope_base = 10000.0;
  const mha::weights w = mha::weights::random(small, 5);
  const std::vector<float> x = mha_test::random_floats(2 * 9 * 16, 6);
  for (const std::int64_t context : {std::int64_t{1} << 40, std::int64_t{1} << 62}) {
    mha::config huge = small;
    huge.context_length = context;
    for (const mha_test::backend_case& b : mha_test::backend_cases()) {
      const auto expected = b.backend->prepare(small, formulation::split_weight, w);
      const auto plan = b.backend->prepare(huge, formulation::split_weight, w);
      std::vector<float> y(2 * 9 * 16), y_small(y.size());
      plan->run({x.data(), 2, 9, 16}, {y.data(), 2, 9, 16});
      expected->run({x.data(), 2, 9, 16}, {y_small.data(), 2, 9, 16});
      EXPECT_EQ(y, y_small) << b.label << " at context " << context;
      if (mha_test::declined(b, {huge, formulation::split_weight, 2, 1, 8})) continue;
      mha::kv_cache cache = plan->make_cache(2, 12), cache_small = expected->make_cache(2, 12);
      for (int step = 0; step < 2; ++step) {
        plan->run({x.data(), 2, 4, 16}, {y.data(), 2, 4, 16}, cache);
        expected->run({x.data(), 2, 4, 16}, {y_small.data(), 2, 4, 16}, cache_small);
        EXPECT_EQ(y, y_small) << b.label << " decode step " << step << " at context " << context;
      }
    }
  }
}

// make_cache declines exactly when backend::supports declines decode, with its reason.
TEST(DecodeSupport, MakeCacheFollowsSupports) {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const mha::weights w = mha::weights::random(cfg, 1);
  for (const mha_test::backend_case& b : mha_test::backend_cases()) {
    for (formulation form : mha::formulations()) {
      const mha::support s = b.backend->supports({cfg, form, 1, 1, 3});
      const auto p = b.backend->prepare(cfg, form, w);
      if (s) {
        EXPECT_EQ(p->make_cache(2, 4).batch(), 2) << b.label;
      } else {
        mha_test::expect_error<mha::unsupported>([&] { (void)p->make_cache(2, 4); },
                                                 {s.reason().c_str()});
      }
    }
  }
}

}  // namespace
