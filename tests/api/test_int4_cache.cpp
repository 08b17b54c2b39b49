// The int4 KV cache's own rules (base/key4.hpp; docs/design.md §1.7): each channel of a group of
// 64 tokens coded on its own, and a rollback only where the exact keys it needs are kept. Its
// calls against the naive reference are in test_attention_cache.cpp and test_int8_cache.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/key4.hpp"
#include "base/value4.hpp"
#include "mha/mha.hpp"
#include "support.hpp"

namespace {

using mha::precision;
using mha_test::expect_error;

// An int4 cache's key group (base/key4.hpp): each channel of 64 tokens coded on its own, every
// element within half its channel's step (value4_row's: the smallest bf16 at or above
// range / 15.4375), so a channel 1000 times the others' costs only itself.
TEST(Key4Group, EachChannelIsCodedOnItsOwnWithinHalfItsStep) {
  constexpr std::int64_t d = 24;
  std::vector<float> rows = mha_test::random_floats(mha::detail::key4_recent * d, 5, 1.0f);
  for (std::int64_t t = 0; t < mha::detail::key4_recent; ++t) rows[t * d + 7] *= 1000.0f;
  std::vector<std::int64_t> positions(mha::detail::key4_recent);
  const mha::detail::key4_recent_rows recent{rows.data(), positions.data()};
  // Positions 64 to 127 held, in rows 64 to 127 (the group's rows are consecutive).
  for (std::int64_t p = 64; p < 128; ++p) positions[p % mha::detail::key4_recent] = p;
  std::vector<mha::detail::value4_row> words(d);
  std::vector<std::uint8_t> codes(64 * d, 255);
  mha::detail::key4_code_group(recent, d, 64, words.data(),
                               [&](std::int64_t t, std::int64_t e, std::uint8_t c) {
                                 codes[static_cast<std::size_t>(t * d + e)] = c;
                               });
  for (std::int64_t e = 0; e < d; ++e) {
    float lo = rows[64 * d + e], hi = lo;
    for (std::int64_t t = 64; t < 128; ++t) {
      lo = std::min(lo, rows[t * d + e]);
      hi = std::max(hi, rows[t * d + e]);
    }
    const float step = words[e].scale();
    EXPECT_GE(step, (hi - lo) / 15.4375f) << e;
    EXPECT_LT(step, (hi - lo) / 15.4375f * 1.01f) << e;  // its own range's, rounded up to bf16
    for (std::int64_t t = 0; t < 64; ++t) {
      const std::uint8_t c = codes[static_cast<std::size_t>(t * d + e)];
      ASSERT_LE(c, 15);
      EXPECT_LE(std::abs(mha::detail::dequantize(c, words[e]) - rows[(64 + t) * d + e]),
                step * (0.5f + 1e-4f))
          << "channel " << e << ", token " << t;
    }
  }
  // The channel of outliers has a step 1000 times another's; the others' steps are their own.
  EXPECT_GT(words[7].scale(), 500.0f * words[3].scale());
  // A rollback to 100 leaves 96..99 uncoded: held. To 50: 0..49 are not.
  EXPECT_TRUE(mha::detail::key4_can_truncate(positions.data(), 100));
  EXPECT_TRUE(mha::detail::key4_can_truncate(positions.data(), 64));
  EXPECT_FALSE(mha::detail::key4_can_truncate(positions.data(), 50));
}

class Int4Cache : public testing::TestWithParam<mha_test::backend_case> {};

INSTANTIATE_TEST_SUITE_P(Backends, Int4Cache,
                         testing::ValuesIn(mha_test::attention_backend_cases()),
                         [](const auto& param_info) { return param_info.param.label; });

// out = causal mha::attention on `on` of q (1, heads, t, d) and k, v (1, kv_heads, t, d) over
// `cache`, all dense.
void causal_call(const mha::backend& on, mha::kv_cache& cache, const std::vector<float>& q,
                 const std::vector<float>& k, const std::vector<float>& v, std::vector<float>& out,
                 std::int64_t heads, std::int64_t kv_heads, std::int64_t t, std::int64_t d) {
  mha::attention_options o;
  o.causal = true;
  o.alignment = mha::causal_alignment::bottom_right;
  using view = mha::heads_view<const float>;
  mha::attention(on, view::dense(q.data(), 1, heads, t, d),
                 view::dense(k.data(), 1, kv_heads, t, d), view::dense(v.data(), 1, kv_heads, t, d),
                 cache, mha::heads_view<float>::dense(out.data(), 1, heads, t, d), o);
}

// An int4 cache keeps the exact keys of its last 128 positions: a rollback into its last coded
// group (a rejected draft) finds them, and the group, filled again, is coded from them: the next
// call gives the bits a cache fed only the kept tokens gives. A rollback past them is refused,
// naming where it may go; one to a group's end needs none.
TEST_P(Int4Cache, RollsBackWhereItsExactKeysAreKept) {
  const mha::backend& backend = *GetParam().backend;
  const std::int64_t heads = 2, kv_heads = 1, d = 16;
  const auto make = [&] {
    return mha::make_attention_cache(backend, 1, 400, kv_heads, d, precision::int4,
                                     precision::fp32);
  };
  const auto random = [](std::int64_t n, std::uint32_t seed) {
    return mha_test::random_floats(static_cast<std::size_t>(n), seed, 1.0f);
  };
  const std::vector<float> q = random(heads * 140 * d, 1), k = random(kv_heads * 140 * d, 2),
                           v = random(kv_heads * 140 * d, 3);
  const std::vector<float> q2 = random(heads * 40 * d, 4), k2 = random(kv_heads * 40 * d, 5),
                           v2 = random(kv_heads * 40 * d, 6);
  std::vector<float> out(q.size()), again(q2.size()), fresh(q2.size());
  mha::kv_cache rolled = make(), kept = make();
  causal_call(backend, rolled, q, k, v, out, heads, kv_heads, 140, d);
  rolled.truncate(0, 100);  // groups 0 coded, 1 (64..127) coded then taken back into
  causal_call(backend, rolled, q2, k2, v2, again, heads, kv_heads, 40, d);
  // The first 100 tokens of the same stream (one head of K/V: token i's row at i * d).
  const auto first = [&](const std::vector<float>& x, std::int64_t h) {
    std::vector<float> part;
    for (std::int64_t i = 0; i < h; ++i) {
      const auto from = x.begin() + i * 140 * d;
      part.insert(part.end(), from, from + 100 * d);
    }
    return part;
  };
  std::vector<float> out100(static_cast<std::size_t>(heads * 100 * d));
  causal_call(backend, kept, first(q, heads), first(k, kv_heads), first(v, kv_heads), out100, heads,
              kv_heads, 100, d);
  causal_call(backend, kept, q2, k2, v2, fresh, heads, kv_heads, 40, d);
  EXPECT_EQ(again, fresh);
  // 140 tokens held: positions 12..139 exact; a rollback to 30 would leave 0..29 uncoded.
  expect_error<mha::invalid_argument>(
      [&] { rolled.truncate(0, 30); },
      {"truncate sequence 0 from 140 to 30", "an int4 cache", "take it back to 0, a whole group"});
  EXPECT_EQ(rolled.length(0), 140);
  rolled.truncate(0, 64);
  EXPECT_EQ(rolled.length(0), 64);
}

}  // namespace
