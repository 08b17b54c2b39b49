// mha::attention over a KV cache (mha::make_attention_cache, mha/attention.hpp): every backend
// that runs attention calls, decoding the next tokens of sequences of different lengths through
// its cache (a prefill, one-token steps, a chunk; grouped heads; head_dim 8, 16 and 64) against
// mha::attention over all the keys each sequence has seen; fp32, bf16, int8 and k8v4 caches (int8
// against the derived bound of its codes, and both coded caches against the naive backend's of
// the same format, their reference); the errors it names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/int8.hpp"
#include "int8_bounds.hpp"
#include "mha/mha.hpp"
#include "mha_testing.hpp"
#include "support.hpp"

namespace {

using mha::heads_view;
using mha::precision;
using mha_test::expect_error;
using mha_test::int8_bound;
using mha_test::int8_kernels_tolerance;
using mha_test::kernels_tolerance;

struct cache_case {
  std::int64_t batch = 2, heads = 4, kv_heads = 2, head_dim = 16, capacity = 24;
  precision kv = precision::fp32, compute = precision::fp32;
};

// One model's stream: per sequence, every key and value it has produced (dense (H_kv, n, D)
// after each call), so that a call's reference is mha::attention over them.
struct stream {
  cache_case c;
  std::mt19937 rng{11};
  std::vector<std::vector<float>> keys, values;  // per sequence, (H_kv, tokens, D)
  std::vector<std::int64_t> tokens;

  explicit stream(const cache_case& cc)
      : c(cc), keys(cc.batch), values(cc.batch), tokens(cc.batch, 0) {}

  std::vector<float> random(std::int64_t n) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> t(static_cast<std::size_t>(n));
    for (float& x : t) x = u(rng);
    return t;
  }
};

// A (B, H, T, D) dense view.
template <class T>
heads_view<T> dense(T* data, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) {
  return heads_view<T>::dense(data, b, h, t, d);
}

// One call of T new tokens for every sequence through the cache; returns max|out - reference|
// and the largest |value| (for a relative bound), the reference being mha::attention on
// `reference_backend` over each sequence's keys so far, bottom-right causal, in the cache's
// compute precision.
// out = causal mha::attention on `on` of q (batch, heads, t, d) and k, v (batch, kv_heads, t, d)
// over `cache`, all dense.
void causal_call(const mha::backend& on, mha::kv_cache& cache, const std::vector<float>& q,
                 const std::vector<float>& k, const std::vector<float>& v, std::vector<float>& out,
                 std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t t,
                 std::int64_t d) {
  mha::attention_options o;
  o.causal = true;
  o.alignment = mha::causal_alignment::bottom_right;
  mha::attention(on, dense<const float>(q.data(), batch, heads, t, d),
                 dense<const float>(k.data(), batch, kv_heads, t, d),
                 dense<const float>(v.data(), batch, kv_heads, t, d), cache,
                 dense(out.data(), batch, heads, t, d), o);
}

struct step_error {
  double error = 0, max_value = 0;
};
step_error step(const mha::backend& backend, const mha::backend& reference_backend,
                mha::kv_cache& cache, stream& s, std::int64_t t, std::int64_t first = 0,
                std::int64_t count = 0) {
  cache_case c = s.c;
  const std::int64_t d = c.head_dim, offset = first;
  c.batch = count > 0 ? count : c.batch;
  std::vector<float> q = s.random(c.batch * c.heads * t * d);
  std::vector<float> k = s.random(c.batch * c.kv_heads * t * d);
  std::vector<float> v = s.random(c.batch * c.kv_heads * t * d);
  std::vector<float> out(q.size(), std::nanf(""));
  mha::attention_options o;
  o.causal = true;
  o.alignment = mha::causal_alignment::bottom_right;
  o.precision = c.compute;
  mha::attention(backend, dense<const float>(q.data(), c.batch, c.heads, t, d),
                 dense<const float>(k.data(), c.batch, c.kv_heads, t, d),
                 dense<const float>(v.data(), c.batch, c.kv_heads, t, d), cache,
                 dense(out.data(), c.batch, c.heads, t, d), o, offset);
  step_error e;
  for (std::int64_t call_b = 0; call_b < c.batch; ++call_b) {
    const std::int64_t b = offset + call_b;  // the cache's sequence
    // The sequence's keys and values with this call's appended, per K/V head.
    const std::int64_t before = s.tokens[b], after = before + t;
    std::vector<float> keys(static_cast<std::size_t>(c.kv_heads * after * d)), values(keys.size());
    for (std::int64_t g = 0; g < c.kv_heads; ++g) {
      for (std::int64_t j = 0; j < after; ++j) {
        const bool is_new = j >= before;
        const float* from_k = is_new ? &k[((call_b * c.kv_heads + g) * t + (j - before)) * d]
                                     : &s.keys[b][(g * before + j) * d];
        const float* from_v = is_new ? &v[((call_b * c.kv_heads + g) * t + (j - before)) * d]
                                     : &s.values[b][(g * before + j) * d];
        std::copy(from_k, from_k + d, &keys[(g * after + j) * d]);
        std::copy(from_v, from_v + d, &values[(g * after + j) * d]);
      }
    }
    s.keys[b] = keys;
    s.values[b] = values;
    s.tokens[b] = after;
    std::vector<float> expected(static_cast<std::size_t>(c.heads * t * d));
    mha::attention(reference_backend,
                   dense<const float>(&q[call_b * c.heads * t * d], 1, c.heads, t, d),
                   dense<const float>(keys.data(), 1, c.kv_heads, after, d),
                   dense<const float>(values.data(), 1, c.kv_heads, after, d),
                   dense(expected.data(), 1, c.heads, t, d), o);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const double got = out[static_cast<std::size_t>(call_b * c.heads * t * d) + i];
      e.error = std::max(e.error, std::abs(got - expected[i]));
      e.max_value = std::max(e.max_value, std::abs(static_cast<double>(expected[i])));
    }
    EXPECT_EQ(cache.length(b), after);
  }
  return e;
}

class AttentionCache : public testing::TestWithParam<mha_test::backend_case> {};

INSTANTIATE_TEST_SUITE_P(Backends, AttentionCache,
                         testing::ValuesIn(mha_test::attention_backend_cases()),
                         [](const auto& param_info) { return param_info.param.label; });

// Prefill of 5, three one-token steps, a chunk of 2, then sequence 1 restarted (reset) and
// stepped on alone with sequence 0 further on: sequences of different lengths in one call.
std::vector<std::int64_t> run_stream(const mha::backend& backend, const cache_case& c,
                                     double tolerance, bool relative) {
  stream s(c);
  mha::kv_cache cache = mha::make_attention_cache(backend, c.batch, c.capacity, c.kv_heads,
                                                  c.head_dim, c.kv, c.compute);
  EXPECT_EQ(cache.precision(), c.kv);
  EXPECT_EQ(cache.heads(), c.kv_heads);
  std::vector<std::int64_t> lengths;
  const auto check = [&](std::int64_t t) {
    const step_error e = step(backend, backend, cache, s, t);
    const double bound = relative ? tolerance * std::max(1.0, e.max_value) : tolerance;
    EXPECT_LE(e.error, bound) << t << " tokens after " << s.tokens[0] - t;
  };
  for (const std::int64_t t : {5, 1, 1, 1, 2}) check(t);
  cache.reset(1);
  s.keys[1].clear();
  s.values[1].clear();
  s.tokens[1] = 0;
  for (const std::int64_t t : {1, 3}) check(t);
  for (std::int64_t b = 0; b < c.batch; ++b) lengths.push_back(cache.length(b));
  return lengths;
}

TEST_P(AttentionCache, Fp32DecodesAsTheCallOverAllItsKeys) {
  for (const std::int64_t head_dim : {8, 16, 64}) {
    cache_case c;
    c.head_dim = head_dim;
    const auto lengths = run_stream(*GetParam().backend, c, 2e-6, true);
    EXPECT_EQ(lengths, (std::vector<std::int64_t>{14, 4}));
  }
  cache_case mqa;  // one K/V head for all four query heads
  mqa.kv_heads = 1;
  run_stream(*GetParam().backend, mqa, 2e-6, true);
}

TEST_P(AttentionCache, Bf16DecodesAsTheBf16CallOverAllItsKeys) {
  cache_case c;
  c.kv = c.compute = precision::bf16;
  // The same rounded operands; the order of the sums and the rounding of the weights before
  // P V may differ between the cache's path and the call's: within bf16's step.
  run_stream(*GetParam().backend, c, 1.0 / 128, true);
}

// int8 (and k8v4, whose worst case is no useful bound against the exact call: docs/design.md
// §1.7) against the naive backend's cache of the same format, fed the same stream: the same codes.
// Head_dim 8, 64 and (k8v4) 80: one group of the values, two, and a last group of 16.
TEST_P(AttentionCache, Int8StaysWithinItsCodesBoundAndMatchesTheNaiveReference) {
  for (const precision kv : {precision::int8, precision::k8v4})
    for (const precision compute : {precision::fp32, precision::bf16}) {
      for (const std::int64_t head_dim : {8, 64, 80}) {
        if (head_dim == 80 && kv == precision::int8) continue;
        SCOPED_TRACE(std::string(mha::to_string(kv)));
        cache_case c;
        c.kv = kv;
        c.compute = compute;
        c.head_dim = head_dim;
        // Against the fp32 (bf16) call over the exact keys: the codes' bound (values in [-1, 1];
        // bf16 adds its own step).
        const double bound = int8_bound(head_dim) + (compute == precision::bf16 ? 1.0 / 128 : 0.0);
        if (kv == precision::int8) run_stream(*GetParam().backend, c, bound, false);
        // Against the naive backend's int8 cache fed the same stream: the same codes.
        stream mine(c), theirs(c);
        mha::kv_cache a = mha::make_attention_cache(*GetParam().backend, c.batch, c.capacity,
                                                    c.kv_heads, head_dim, c.kv, compute);
        mha::kv_cache b = mha::make_attention_cache(mha::naive_backend(), c.batch, c.capacity,
                                                    c.kv_heads, head_dim, c.kv, compute);
        for (const std::int64_t t : {6, 1, 1}) {
          // Both streams draw the same numbers (same seed, same order).
          const std::int64_t d = head_dim;
          std::vector<float> q = mine.random(c.batch * c.heads * t * d),
                             k = mine.random(c.batch * c.kv_heads * t * d),
                             v = mine.random(c.batch * c.kv_heads * t * d);
          std::vector<float> out_a(q.size()), out_b(q.size());
          mha::attention_options o;
          o.causal = true;
          o.alignment = mha::causal_alignment::bottom_right;
          o.precision = compute;
          const auto call = [&](const mha::backend& on, mha::kv_cache& cache,
                                std::vector<float>& out) {
            mha::attention(on, dense<const float>(q.data(), c.batch, c.heads, t, d),
                           dense<const float>(k.data(), c.batch, c.kv_heads, t, d),
                           dense<const float>(v.data(), c.batch, c.kv_heads, t, d), cache,
                           dense(out.data(), c.batch, c.heads, t, d), o);
          };
          call(*GetParam().backend, a, out_a);
          call(mha::naive_backend(), b, out_b);
          EXPECT_LE(mha_test::max_abs_diff(out_a, out_b),
                    (compute == precision::bf16 ? 1.0 / 128 : 0.0) + kernels_tolerance(kv, d))
              << "head_dim " << d << ", " << t << " tokens";
        }
      }
    }
}

// The SIMD kernels' 16-bit weights come in chunks of weight_chunk_keys keys, each with its own
// scale (code_scales::value_weights). Value rows whose magnitude doubles every half chunk give
// neighbouring chunks largest weights 4x apart, so a chunk scaled as another would be off by a
// large share of the output, far past the kernels' bound; a causal prefill of three chunks and 4
// tokens (row blocks whose later rows read keys the earlier ones must not) and two decode steps.
TEST_P(AttentionCache, Int8WeightsOfEachChunkKeepTheirScale) {
  const mha::backend& backend = *GetParam().backend;
  for (const precision kv : {precision::int8, precision::k8v4})
    for (const std::int64_t head_dim : {16, 64}) {
      constexpr std::int64_t chunk = mha::detail::weight_chunk_keys, prefill = 3 * chunk + 4;
      const std::int64_t batch = 1, heads = 4, kv_heads = 2, capacity = prefill + 2;
      mha::kv_cache mine = mha::make_attention_cache(backend, batch, capacity, kv_heads, head_dim,
                                                     kv, precision::fp32);
      mha::kv_cache naive = mha::make_attention_cache(mha::naive_backend(), batch, capacity,
                                                      kv_heads, head_dim, kv, precision::fp32);
      stream s(cache_case{});
      std::int64_t seen = 0;
      for (const std::int64_t t : {prefill, std::int64_t{1}, std::int64_t{1}}) {
        const std::int64_t d = head_dim;
        std::vector<float> q = s.random(batch * heads * t * d),
                           k = s.random(batch * kv_heads * t * d),
                           v = s.random(batch * kv_heads * t * d);
        for (std::int64_t g = 0; g < kv_heads; ++g) {
          for (std::int64_t i = 0; i < t; ++i) {
            const float magnitude =
                std::exp2(static_cast<float>(seen + i - prefill - 1) / (chunk / 2));
            for (std::int64_t e = 0; e < d; ++e)
              v[static_cast<std::size_t>((g * t + i) * d + e)] *= magnitude;
          }
        }
        std::vector<float> out_a(q.size()), out_b(q.size());
        causal_call(backend, mine, q, k, v, out_a, batch, heads, kv_heads, t, d);
        causal_call(mha::naive_backend(), naive, q, k, v, out_b, batch, heads, kv_heads, t, d);
        EXPECT_LE(mha_test::max_abs_diff(out_a, out_b), kernels_tolerance(kv, d))
            << mha::to_string(kv) << ", head_dim " << d << ", " << t << " tokens after " << seen;
        seen += t;
      }
    }
}

// Values at the ends of float's range: a chunk's weights w = p scale_j then lie far below 2^-96
// (values of 2^-100 have scales near 2^-107), where the SIMD kernels' 16-bit weights once dropped
// every weight (their chunk's scale 0) while each value's offset was still added: a relative
// error of 2 where naive's is 0.0055. Every magnitude stays within the kernels' bound of naive,
// relative to the values' magnitude.
TEST_P(AttentionCache, Int8ValuesOfEveryMagnitudeKeepTheKernelsBound) {
  const mha::backend& backend = *GetParam().backend;
  const std::int64_t batch = 1, heads = 2, kv_heads = 1, d = 16, t = 40;
  for (const precision kv : {precision::int8, precision::k8v4})
    for (const float magnitude : {0x1p-110f, 0x1p-100f, 0x1p-88f, 0x1p-60f, 0x1p60f, 0x1p120f}) {
      mha::kv_cache mine =
          mha::make_attention_cache(backend, batch, t, kv_heads, d, kv, precision::fp32);
      mha::kv_cache naive = mha::make_attention_cache(mha::naive_backend(), batch, t, kv_heads, d,
                                                      kv, precision::fp32);
      stream s(cache_case{});
      std::vector<float> q = s.random(batch * heads * t * d),
                         k = s.random(batch * kv_heads * t * d),
                         v = s.random(batch * kv_heads * t * d);
      for (float& e : v) e *= magnitude;
      std::vector<float> out_a(q.size()), out_b(q.size());
      causal_call(backend, mine, q, k, v, out_a, batch, heads, kv_heads, t, d);
      causal_call(mha::naive_backend(), naive, q, k, v, out_b, batch, heads, kv_heads, t, d);
      double error = 0;
      for (std::size_t i = 0; i < out_a.size(); ++i)
        error = std::max(error, std::abs(double{out_a[i]} - out_b[i]) / magnitude);
      EXPECT_LE(error, kernels_tolerance(kv, d))
          << mha::to_string(kv) << ", values of magnitude " << magnitude;
    }
}

// int4 (base/key4.hpp): keys coded per channel of each group of 64 tokens when its last token
// arrives, the newest (an unfilled group's) exact. Against the naive backend's int4 cache fed the
// same stream (the same codes, read as scale code + offset in fp32): a call of 40 (every key
// exact), one of 60 (the first group coded), single steps across the next group's end (127, 128,
// 129), then a chunk of 70 that fills a group within the call; grouped heads; head_dim 8, 64, 80
// and 81 (word rows of 8 dimensions, a last one part empty), in fp32 and bf16. The keys are
// coded: k8v4 holds the same values' codes with 8-bit keys, so int4's outputs differ from its by
// the keys' codes alone, and by far more once the groups are coded (4 bits a key element where
// k8v4 has 8) than while every key read is exact.
TEST_P(AttentionCache, Int4CodesKeyGroupsAsTheyFillAndMatchesTheNaiveReference) {
  const mha::backend& backend = *GetParam().backend;
  for (const precision compute : {precision::fp32, precision::bf16}) {
    for (const std::int64_t d : {8, 64, 80, 81}) {
      SCOPED_TRACE(std::string(mha::to_string(compute)) + ", head_dim " + std::to_string(d));
      const std::int64_t batch = 2, heads = 4, kv_heads = 2, capacity = 300;
      stream s(cache_case{});
      const auto make = [&](const mha::backend& on, precision kv) {
        return mha::make_attention_cache(on, batch, capacity, kv_heads, d, kv, compute);
      };
      mha::kv_cache mine = make(backend, precision::int4),
                    naive = make(mha::naive_backend(), precision::int4),
                    k8v4 = make(backend, precision::k8v4);
      double exact_keys = 0.0;  // the mean |int4 - k8v4| of the call whose keys are all exact
      for (const std::int64_t t : {40, 60, 1, 1, 1, 25, 1, 1, 1, 70}) {
        const std::vector<float> q = s.random(batch * heads * t * d),
                                 k = s.random(batch * kv_heads * t * d),
                                 v = s.random(batch * kv_heads * t * d);
        std::vector<float> out(q.size()), out_naive(q.size()), out_k8v4(q.size());
        mha::attention_options o;
        o.causal = true;
        o.alignment = mha::causal_alignment::bottom_right;
        o.precision = compute;
        const auto call = [&](const mha::backend& on, mha::kv_cache& cache,
                              std::vector<float>& to) {
          mha::attention(on, dense<const float>(q.data(), batch, heads, t, d),
                         dense<const float>(k.data(), batch, kv_heads, t, d),
                         dense<const float>(v.data(), batch, kv_heads, t, d), cache,
                         dense(to.data(), batch, heads, t, d), o);
        };
        call(backend, mine, out);
        call(mha::naive_backend(), naive, out_naive);
        call(backend, k8v4, out_k8v4);
        const std::int64_t held = mine.length(0);
        EXPECT_LE(
            mha_test::max_abs_diff(out, out_naive),
            (compute == precision::bf16 ? 1.0 / 128 : 0.0) + kernels_tolerance(precision::int4, d))
            << t << " tokens after " << held - t;
        double mean = 0.0;
        for (std::size_t i = 0; i < out.size(); ++i) mean += std::abs(double{out[i]} - out_k8v4[i]);
        mean /= static_cast<double>(out.size());
        if (held == 40) exact_keys = mean;
        if (held >= 128 && compute == precision::fp32) {
          EXPECT_GT(mean, 4.0 * exact_keys) << t << " tokens after " << held - t;
        }
      }
    }
  }
}

// A copy (kv_cache::copy) holds the same tokens in storage of its own: the same next step gives
// the same bits in both, and each grows and resets apart; a plan's cache copies too.
TEST_P(AttentionCache, ACopyHoldsTheSameTokensApart) {
  for (const precision kv : {precision::fp32, precision::int8, precision::k8v4}) {
    cache_case c;
    c.kv = kv;
    stream s(c);
    mha::kv_cache cache = mha::make_attention_cache(*GetParam().backend, c.batch, c.capacity,
                                                    c.kv_heads, c.head_dim, c.kv, c.compute);
    step(*GetParam().backend, *GetParam().backend, cache, s, 5);
    mha::kv_cache twin = cache.copy();
    EXPECT_EQ(twin.lengths(), cache.lengths());
    EXPECT_EQ(twin.bytes(), cache.bytes());
    stream again = s;  // the same next numbers for both
    const step_error a = step(*GetParam().backend, *GetParam().backend, cache, s, 1);
    const step_error b = step(*GetParam().backend, *GetParam().backend, twin, again, 1);
    EXPECT_EQ(a.error, b.error);
    twin.reset(0);
    EXPECT_EQ(cache.length(0), 6);
    EXPECT_EQ(twin.length(0), 0);
  }
  const mha::config cfg = mha_test::shape{1, 4, 8, 16, 2}.config();
  const auto p = mha::naive_backend().prepare(cfg, mha::formulation::split_weight,
                                              mha::weights::random(cfg, 1));
  mha::kv_cache made = p->make_cache(1, 4);
  std::vector<float> x(8, 0.25f), y(16);
  p->run({x.data(), 1, 1, 8}, {y.data(), 1, 1, 16}, made);
  mha::kv_cache twin = made.copy();
  std::vector<float> y_twin(16);
  p->run({x.data(), 1, 1, 8}, {y.data(), 1, 1, 16}, made);
  p->run({x.data(), 1, 1, 8}, {y_twin.data(), 1, 1, 16}, twin);
  EXPECT_EQ(y, y_twin);
}

TEST_P(AttentionCache, SequencesOfOneCacheAreCalledApartOrTogether) {
  // A padded batch's prefill: each sequence alone (its own length), then steps of all three and
  // of the last two; untouched sequences keep their lengths.
  cache_case c;
  c.batch = 3;
  stream s(c);
  mha::kv_cache cache = mha::make_attention_cache(*GetParam().backend, c.batch, c.capacity,
                                                  c.kv_heads, c.head_dim, c.kv, c.compute);
  const auto check = [&](std::int64_t t, std::int64_t first, std::int64_t count) {
    const step_error e = step(*GetParam().backend, *GetParam().backend, cache, s, t, first, count);
    EXPECT_LE(e.error, 2e-6 * std::max(1.0, e.max_value)) << t << " tokens from " << first;
  };
  check(7, 0, 1);
  check(3, 1, 1);
  check(5, 2, 1);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{7, 3, 5}));
  check(1, 0, 3);
  check(2, 1, 2);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{8, 6, 8}));
  std::vector<float> q(4 * 16), k(2 * 16), out(q.size());
  mha::attention_options o;
  o.causal = true;
  o.alignment = mha::causal_alignment::bottom_right;
  for (const std::int64_t first : {-1, 3}) {
    expect_error<mha::invalid_argument>(
        [&] {
          mha::attention(*GetParam().backend, dense<const float>(q.data(), 1, 4, 1, 16),
                         dense<const float>(k.data(), 1, 2, 1, 16),
                         dense<const float>(k.data(), 1, 2, 1, 16), cache,
                         dense(out.data(), 1, 4, 1, 16), o, first);
        },
        {"first_sequence (", "must be a sequence of the cache, 0 to 2"});
  }
  expect_error<mha::invalid_argument>(
      [&] {
        std::vector<float> q2(2 * 4 * 16), k2(2 * 2 * 16), out2(q2.size());
        mha::attention(*GetParam().backend, dense<const float>(q2.data(), 2, 4, 1, 16),
                       dense<const float>(k2.data(), 2, 2, 1, 16),
                       dense<const float>(k2.data(), 2, 2, 1, 16), cache,
                       dense(out2.data(), 2, 4, 1, 16), o, 2);
      },
      {"1 <= B <= 1"});
}

TEST_P(AttentionCache, ItsCacheIsItsOwnAndItsCallsAreChecked) {
  const mha::backend& backend = *GetParam().backend;
  const std::int64_t d = 16;
  mha::kv_cache cache =
      mha::make_attention_cache(backend, 1, 4, 2, d, precision::int8, precision::fp32);
  std::vector<float> q(4 * 3 * d, 0.5f), k(2 * 3 * d, 0.25f), v(2 * 3 * d, 1.0f), out(q.size());
  mha::attention_options o;
  o.causal = true;
  o.alignment = mha::causal_alignment::bottom_right;
  const auto call = [&](mha::kv_cache& with, std::int64_t t, const mha::attention_options& opts) {
    mha::attention(
        backend, dense<const float>(q.data(), 1, 4, t, d), dense<const float>(k.data(), 1, 2, t, d),
        dense<const float>(v.data(), 1, 2, t, d), with, dense(out.data(), 1, 4, t, d), opts);
  };
  call(cache, 3, o);
  EXPECT_EQ(cache.length(0), 3);
  // Past the capacity: refused, naming the sequence; the cache unchanged.
  expect_error<mha::invalid_argument>([&] { call(cache, 2, o); },
                                      {"sequence 0 holds 3 tokens; 2 more make 5", "capacity (4)"});
  EXPECT_EQ(cache.length(0), 3);
  // Not causal over several new tokens; a mask; another precision.
  cache.reset();
  mha::attention_options loose = o;
  loose.causal = false;
  expect_error<mha::invalid_argument>([&] { call(cache, 2, loose); }, {"not causal"});
  call(cache, 1, loose);  // one token: the flag makes no difference
  // Top-left, several new rows over held tokens would stand before them: refused, naming the
  // sequence, the cache unchanged. One row, or rows into an empty sequence, agree with
  // bottom-right and are taken.
  mha::attention_options top_left = o;
  top_left.alignment = mha::causal_alignment::top_left;
  expect_error<mha::invalid_argument>([&] { call(cache, 2, top_left); },
                                      {"2 new tokens, causal top-left", "sequence 0 holds 1 tokens",
                                       "pass causal_alignment "
                                       "bottom_right"});
  EXPECT_EQ(cache.length(0), 1);
  call(cache, 1, top_left);
  EXPECT_EQ(cache.length(0), 2);
  cache.reset();
  call(cache, 2, top_left);
  EXPECT_EQ(cache.length(0), 2);
  cache.reset();
  call(cache, 1, loose);
  const float zeros[4] = {};
  mha::attention_options masked = o;
  masked.mask = {mha::attention_mask::kind::additive, zeros, 1, 1, 1, 1, 0, 0, 1};
  expect_error<mha::invalid_argument>([&] { call(cache, 1, masked); }, {"a mask with a kv_cache"});
  mha::attention_options bf16 = o;
  bf16.precision = precision::bf16;
  expect_error<mha::invalid_argument>([&] { call(cache, 1, bf16); },
                                      {"precision bf16", "made for fp32 calls"});
  // Shapes that do not match the cache: other K/V heads, head_dim, batch.
  expect_error<mha::invalid_argument>(
      [&] {
        mha::attention(backend, dense<const float>(q.data(), 1, 4, 1, d),
                       dense<const float>(k.data(), 1, 4, 1, d),
                       dense<const float>(v.data(), 1, 4, 1, d), cache,
                       dense(out.data(), 1, 4, 1, d), o);
      },
      {"the cache holds 1 sequences of 2 K/V heads of head_dim 16"});
  expect_error<mha::invalid_argument>(
      [&] {
        mha::attention(backend, dense<const float>(q.data(), 1, 4, 1, 8),
                       dense<const float>(k.data(), 1, 2, 1, 8),
                       dense<const float>(v.data(), 1, 2, 1, 8), cache,
                       dense(out.data(), 1, 4, 1, 8), o);
      },
      {"head_dim 16"});
  // out overlapping q.
  expect_error<mha::invalid_argument>(
      [&] {
        mha::attention(backend, dense<const float>(q.data(), 1, 4, 1, d),
                       dense<const float>(k.data(), 1, 2, 1, d),
                       dense<const float>(v.data(), 1, 2, 1, d), cache, dense(q.data(), 1, 4, 1, d),
                       o);
      },
      {"out may overlap q"});
  // Another backend's cache, and a plan's cache, are refused; this cache by a plan too.
  const mha::backend& other =
      backend.name() == "naive" ? mha::xsimd_backend() : mha::naive_backend();
  mha::kv_cache theirs =
      mha::make_attention_cache(other, 1, 4, 2, d, precision::fp32, precision::fp32);
  expect_error<mha::invalid_argument>(
      [&] { call(theirs, 1, o); },
      {"made for the attention calls of", std::string(other.name()).c_str()});
  mha::config cfg;
  cfg.d_in = cfg.d_out = 4 * d;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 2;
  cfg.context_length = 8;
  const auto plan = mha::naive_backend().prepare(cfg, mha::formulation::split_weight,
                                                 mha::weights::random(cfg, 3));
  mha::kv_cache planned = plan->make_cache(1, 4);
  expect_error<mha::invalid_argument>([&] { call(planned, 1, o); }, {"made by a plan"});
  std::vector<float> x(4 * d), y(4 * d);
  mha::kv_cache naive_cache =
      mha::make_attention_cache(mha::naive_backend(), 1, 4, 2, d, precision::fp32, precision::fp32);
  expect_error<mha::invalid_argument>(
      [&] {
        plan->run(mha::tensor_view<const float>(x.data(), 1, 1, 4 * d),
                  mha::tensor_view<float>(y.data(), 1, 1, 4 * d), naive_cache);
      },
      {"made for attention calls (mha::make_attention_cache)"});
  // A cache in use by another call.
  mha_testing::hold(cache, [&] {
    expect_error<mha::invalid_argument>([&] { call(cache, 1, o); }, {"in use by another call"});
  });
}

TEST(AttentionCacheMade, BadArgumentsAreNamed) {
  const mha::backend& b = mha::naive_backend();
  expect_error<mha::invalid_argument>(
      [&] { mha::make_attention_cache(b, 0, 4, 2, 16, precision::fp32, precision::fp32); },
      {"batch (0)", "must each be >= 1"});
  expect_error<mha::invalid_argument>(
      [&] { mha::make_attention_cache(b, 1, 4, 2, 16, precision::fp32, precision::bf16); },
      {"a fp32 cache is computed in fp32"});
  expect_error<mha::invalid_argument>(
      [&] { mha::make_attention_cache(b, 1, 4, 2, 16, precision::int8, precision::int8); },
      {"the attention's precision is int8"});
  expect_error<mha::invalid_argument>(
      [&] {
        mha::make_attention_cache(b, 1, std::int64_t{1} << 40, 1 << 20, 16, precision::fp32,
                                  precision::fp32);
      },
      {"kv cache"});
  for (const mha::backend* other : mha::available_backends()) {
    if (other->supports_attention(precision::fp32)) continue;
    expect_error<mha::unsupported>(
        [&] { mha::make_attention_cache(*other, 1, 4, 2, 16, precision::fp32, precision::fp32); },
        {std::string(other->name()).c_str()});
  }
}

}  // namespace
