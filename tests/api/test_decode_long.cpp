// Incremental calls over long caches and at every call size (docs/design.md §1.4): a call of
// few rows over more than 2048 keys split into chunks, every call size where the kernels' row
// blocking changes, and the cache's size and alignment (test_decode.cpp: the conformance shapes
// and one small module on every backend).
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

// Long caches: a decode call of few rows over more than 2048 keys splits them into chunks on the
// SIMD backends (src/kernels/interface/attention.hpp, split-KV). One call of 4102 tokens of both
// sequences gives the expected rows and, rolled back to 4094 tokens, the prompt. Then sequence 0
// crosses a chunk boundary inside a call (its rows 0-1 see no key of the third chunk, rows 2-4
// do) and sequence 1 restarts, so one call mixes 3 chunks and 1. Every row is the long call's
// within the conformance bound, and every thread count gives the same bits (onednn: within
// onednn_thread_tolerance), each on a copy of the prompt's cache. (That a call through a cache
// gives the full forward's rows: test_decode.cpp; the long call's thread counts:
// TbbPlan.ThreadCountNeverChangesTheResult, OnednnPlan.ThreadCountKeepsResultAndCallerSetting.)
// Heads of head_dim 16 (the register tiles) and 8 (the SIMD backends' narrow-head kernel with 16
// lanes).
class DecodeLongCache
    : public testing::TestWithParam<
          std::tuple<mha_test::backend_case, formulation, std::int64_t /* n_heads */>> {
 protected:
  static constexpr std::int64_t batch = 2, prompt = 4094, seq_len = prompt + 8;
  const mha::config cfg{
      .d_in = 16, .d_out = 32, .n_heads = std::get<2>(GetParam()), .context_length = seq_len};

  // Runs tokens [starts[b], starts[b] + t) of each sequence b of x through `cache` on `threads`
  // threads and appends the call's rows to `out`.
  void call(const mha::plan& p, mha::kv_cache& cache, const std::vector<float>& x,
            const std::vector<std::int64_t>& starts, std::int64_t t, int threads,
            std::vector<float>& out) const {
    std::vector<float> xs, ys(static_cast<std::size_t>(batch * t * cfg.d_out));
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto from = x.begin() + (b * seq_len + starts[static_cast<std::size_t>(b)]) * cfg.d_in;
      xs.insert(xs.end(), from, from + t * cfg.d_in);
    }
    p.run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, cfg.d_out}, cache,
          {.threads = threads});
    out.insert(out.end(), ys.begin(), ys.end());
  }

  // The calls after the prompt, on a copy of its cache: sequence 1 restarts; 5 tokens; 3 tokens.
  std::vector<float> continuation(const mha::plan& p, const mha::kv_cache& prompted,
                                  const std::vector<float>& x, int threads) const {
    mha::kv_cache cache = prompted.copy();
    cache.reset(1);
    std::vector<float> out;
    call(p, cache, x, {prompt, 0}, 5, threads, out);
    call(p, cache, x, {prompt + 5, 5}, 3, threads, out);
    return out;
  }
};

TEST_P(DecodeLongCache, SplitKeysMatchTheLongCallAndEveryThreadCount) {
  const mha_test::backend_case& backend = std::get<0>(GetParam());
  const formulation form = std::get<1>(GetParam());
  MHA_TEST_SKIP_IF_DECLINED(backend, {cfg, form, batch, 1, 4100});
  const auto p = backend.backend->prepare(cfg, form, mha::weights::random(cfg, 5));
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(batch * seq_len * cfg.d_in), 17, 3.0f);
  mha::kv_cache prompted = p->make_cache(batch, seq_len);
  const std::vector<float> long_call =
      incremental(*p, prompted, x, batch, seq_len, seq_len, seq_len, {.threads = 1});
  prompted.truncate(0, prompt);

  // The rows the calls after the prompt compute, from the long call: rows 4094..4098 of sequence
  // 0 and 0..4 of sequence 1, then 4099..4101 and 5..7.
  std::vector<float> expected;
  const auto rows = [&](std::int64_t b, std::int64_t first, std::int64_t n) {
    const auto from = long_call.begin() + (b * seq_len + first) * cfg.d_out;
    expected.insert(expected.end(), from, from + n * cfg.d_out);
  };
  rows(0, prompt, 5), rows(1, 0, 5), rows(0, prompt + 5, 3), rows(1, 5, 3);
  const std::vector<float> one = continuation(*p, prompted, x, 1);
  ASSERT_EQ(one.size(), expected.size());
  EXPECT_LE(mha_test::max_abs_diff(one, expected), 1e-5 * mha_test::max_abs(expected));
  for (int threads : {2, 3}) {
    if (backend.backend->max_threads() == 1) break;
    const std::vector<float> other = continuation(*p, prompted, x, threads);
    if (mha_test::decodes_bitwise(*backend.backend)) {
      EXPECT_EQ(other, one) << threads << " threads";
    } else {  // onednn: its strided decode matmuls split reductions by thread count
      EXPECT_LE(mha_test::max_abs_diff(other, one),
                mha::onednn_thread_tolerance * mha_test::max_abs(one))
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
