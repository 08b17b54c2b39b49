// How the oneDNN backend slices an attention call (src/backends/onednn/attention_plan.hpp), on
// its own: the plan of each kind of call, as numbers worked out by hand from the layouts the
// driver hands over, and the slices every plan's loop visits.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "backends/onednn/attention_plan.hpp"
#include "base/bf16.hpp"
#include "common/attention_args.hpp"
#include "driver/kv_cache_access.hpp"

namespace {

using mha::detail::attention_args;
using mha::detail::attention_plan;
using mha::detail::plan_attention;
using query_source = attention_plan::query_source;
using kv_source = attention_plan::kv_source;

// Where the driver's projections leave Q, K and V.
enum class layout {
  head_major,  // project_heads (split_weight, fused_qkv): (batch, heads, seq_len, head_dim)
  wrapper,     // per-head buffers: (heads, batch, seq_len, head_dim)
  rows,        // one head's projection as plain rows: (batch, seq_len, head_dim)
};

// The arguments of a call of `batch` sequences of `seq_len` new tokens through `heads` query
// heads over `kv_heads` K/V heads of head_dim, in `where`'s strides; no data (the planner reads
// none).
attention_args call(layout where, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                    std::int64_t seq_len, std::int64_t head_dim) {
  attention_args a;
  a.batch = batch;
  a.heads = heads;
  a.kv_group = heads / kv_heads;
  a.seq_len = seq_len;
  a.head_dim = head_dim;
  a.scale = 0.125f;
  const std::int64_t block = seq_len * head_dim;
  const auto view = [&](std::int64_t count) -> mha::detail::head_view<const float> {
    switch (where) {
      case layout::head_major:
        return {nullptr, count * block, block, head_dim};
      case layout::wrapper:
        return {nullptr, block, batch * block, head_dim};
      case layout::rows:
        break;
    }
    return {nullptr, block, head_dim, head_dim};
  };
  a.q = view(heads);
  a.k = a.v = view(kv_heads);
  a.out = {nullptr, seq_len * heads * head_dim, head_dim, heads * head_dim};
  return a;
}

// A row-major cache (float or bf16 elements) of `capacity` tokens holding `lengths`.
struct cache {
  std::vector<std::int64_t> lengths;
  mha::detail::kv_store store;

  cache(const attention_args& a, std::int64_t capacity, std::vector<std::int64_t> held, bool bf16)
      : lengths(std::move(held)),
        store{
            nullptr, a.kv_heads(),
            bf16 ? mha::detail::row_major_cache::head_bytes<mha::detail::bf16>(capacity, a.head_dim)
                 : mha::detail::row_major_cache::head_bytes<float>(capacity, a.head_dim),
            capacity, lengths.data()} {}
};

// The loop the plan describes visits every (sequence, K/V head) of the call exactly once, in
// whole groups.
void expect_slices_cover_the_call(const attention_args& a, const attention_plan& p) {
  ASSERT_GE(p.geometry.group, 1);
  ASSERT_EQ(p.inner % p.geometry.group, 0) << "groups must tile the inner axis";
  std::map<std::pair<std::int64_t, std::int64_t>, int> visits;
  for (std::int64_t o = 0; o < p.outer; ++o) {
    for (std::int64_t first = 0; first < p.inner; first += p.geometry.group) {
      for (std::int64_t s = 0; s < p.geometry.group; ++s) {
        const auto [b, kv] = p.slice(o, first, s);
        ++visits[{b, kv}];
      }
    }
  }
  EXPECT_EQ(static_cast<std::int64_t>(visits.size()), a.batch * a.kv_heads());
  for (const auto& [slice, count] : visits) {
    EXPECT_TRUE(slice.first >= 0 && slice.first < a.batch && slice.second >= 0 &&
                slice.second < a.kv_heads())
        << "b" << slice.first << " kv" << slice.second;
    EXPECT_EQ(count, 1) << "b" << slice.first << " kv" << slice.second;
  }
}

// A full forward: each sequence's heads are back to back, so a group of heads is read in place
// through one slice stride; 4 heads of 128 x 128 scores (64 KiB each) fill the 256 KiB budget.
TEST(OnednnAttentionPlan, Prefill) {
  const attention_args a = call(layout::head_major, 2, 4, 4, 128, 64);
  const attention_plan p = plan_attention(a);
  const mha::detail::attention_geometry expected{.rows = 128,
                                                 .positions = 128,
                                                 .keys = 128,
                                                 .head_dim = 64,
                                                 .group = 4,
                                                 .q_stride = 128 * 64,
                                                 .kv_stride = 128 * 64,
                                                 .causal = true,
                                                 .scale = 0.125f,
                                                 .mask_per_run = false,
                                                 .bf16 = false};
  EXPECT_EQ(p.geometry, expected);
  EXPECT_EQ(p.queries, query_source::in_place);
  EXPECT_EQ(p.keys_values, kv_source::projections);
  EXPECT_FALSE(p.over_batch);
  EXPECT_EQ(p.outer, 2);  // sequences
  EXPECT_EQ(p.inner, 4);  // K/V heads
  EXPECT_EQ(p.q_slice, 128 * 64);
  EXPECT_EQ(p.kv_slice, 128 * 64);
  EXPECT_TRUE(p.gather_q.dims.empty());
  EXPECT_TRUE(p.gather_kv.dims.empty());
  EXPECT_EQ(p.out_floats, 4u * 128 * 64);
  EXPECT_EQ(p.mask_floats, 0u);
  EXPECT_EQ(p.query_floats, 0u);
  EXPECT_EQ(p.key_floats + p.value_floats, 0u);
  expect_slices_cover_the_call(a, p);
}

TEST(OnednnAttentionPlan, NonCausalDiffersOnlyInTheMask) {
  attention_args a = call(layout::head_major, 2, 4, 4, 128, 64);
  const attention_plan causal = plan_attention(a);
  a.causal = false;
  const attention_plan p = plan_attention(a);
  EXPECT_FALSE(p.geometry.causal);
  mha::detail::attention_geometry g = p.geometry;
  g.causal = true;
  EXPECT_EQ(g, causal.geometry);
  EXPECT_EQ(p.q_slice, causal.q_slice);
  EXPECT_EQ(p.out_floats, causal.out_floats);
  expect_slices_cover_the_call(a, p);
}

// One new token per sequence against the cache read in place: the keys padded to the bucket of
// the longest sequence (101 keys -> 128), slices one cache head apart (2 * 300 * 64 elements:
// 300 key rows, then 300 value rows), and a (rows, keys) mask per sequence.
TEST(OnednnAttentionPlan, DecodeWithCache) {
  attention_args a = call(layout::head_major, 2, 4, 4, 1, 64);
  const cache held(a, 300, {100, 37}, false);
  a.cache = &held.store;
  const attention_plan p = plan_attention(a);
  const mha::detail::attention_geometry expected{.rows = 1,
                                                 .positions = 1,
                                                 .keys = 128,
                                                 .head_dim = 64,
                                                 .group = 4,
                                                 .q_stride = 64,
                                                 .kv_stride = 2 * 300 * 64,
                                                 .causal = true,
                                                 .scale = 0.125f,
                                                 .mask_per_run = true,
                                                 .bf16 = false};
  EXPECT_EQ(p.geometry, expected);
  EXPECT_EQ(p.queries, query_source::in_place);
  EXPECT_EQ(p.keys_values, kv_source::cache);
  EXPECT_FALSE(p.over_batch);  // a cache is per sequence
  EXPECT_EQ(p.outer, 2);
  EXPECT_EQ(p.inner, 4);
  EXPECT_EQ(p.kv_slice, 2 * 300 * 64);
  EXPECT_EQ(p.mask_floats, 128u);
  EXPECT_EQ(p.out_floats, 4u * 64);
  expect_slices_cover_the_call(a, p);
}

// A chunk whose bucket (104 keys -> 128) passes the capacity stops at the capacity.
TEST(OnednnAttentionPlan, DecodeBucketStopsAtTheCapacity) {
  attention_args a = call(layout::head_major, 1, 2, 2, 4, 16);
  const cache held(a, 120, {100}, false);
  a.cache = &held.store;
  const attention_plan p = plan_attention(a);
  EXPECT_EQ(p.geometry.keys, 120);
  EXPECT_EQ(p.geometry.rows, 4);
  EXPECT_EQ(p.mask_floats, 4u * 120);
}

// Four query heads per K/V head: a slice stacks their 4 x 16 rows. Head-major, they are one
// block; the wrapper's per-head buffers of 3 sequences are not, so they are copied.
TEST(OnednnAttentionPlan, GroupedKeysAndValues) {
  const attention_args stacked = call(layout::head_major, 1, 8, 2, 16, 32);
  const attention_plan p = plan_attention(stacked);
  EXPECT_EQ(p.geometry.rows, 64);
  EXPECT_EQ(p.geometry.positions, 16);
  EXPECT_EQ(p.geometry.keys, 16);
  EXPECT_EQ(p.geometry.group, 2);
  EXPECT_EQ(p.queries, query_source::in_place);
  EXPECT_EQ(p.q_slice, 4 * 16 * 32);  // a K/V head's 4 query heads
  EXPECT_EQ(p.geometry.q_stride, 4 * 16 * 32);
  EXPECT_EQ(p.kv_slice, 16 * 32);
  EXPECT_EQ(p.geometry.kv_stride, 16 * 32);
  EXPECT_EQ(p.query_floats, 0u);
  expect_slices_cover_the_call(stacked, p);

  const attention_args apart = call(layout::wrapper, 3, 8, 2, 16, 32);
  const attention_plan w = plan_attention(apart);
  EXPECT_EQ(w.queries, query_source::copied);
  EXPECT_FALSE(w.over_batch);  // grouped: a slice is (b, g) even in the wrapper's buffers
  EXPECT_EQ(w.outer, 3);
  EXPECT_EQ(w.inner, 2);
  EXPECT_EQ(w.q_slice, 4 * 3 * 16 * 32);
  EXPECT_EQ(w.geometry.q_stride, 64 * 32);  // the copies are dense
  EXPECT_EQ(w.kv_slice, 3 * 16 * 32);
  EXPECT_EQ(w.geometry.kv_stride, 3 * 16 * 32);
  EXPECT_EQ(w.query_floats, 2u * 64 * 32);
  expect_slices_cover_the_call(apart, w);
}

// bf16 without a cache: Q, K and V rounded into dense bf16 slices by reorders, two elements
// per float of staging.
TEST(OnednnAttentionPlan, Bf16GathersQueriesKeysAndValues) {
  attention_args a = call(layout::head_major, 1, 4, 4, 32, 16);
  a.bf16 = true;
  const attention_plan p = plan_attention(a);
  EXPECT_TRUE(p.geometry.bf16);
  EXPECT_EQ(p.geometry.group, 4);
  EXPECT_EQ(p.queries, query_source::gathered_bf16);
  EXPECT_EQ(p.keys_values, kv_source::gathered_bf16);
  EXPECT_EQ(p.gather_q, (mha::detail::strided_dims{{4, 1, 32, 16}, {512, 512, 16, 1}}));
  EXPECT_EQ(p.gather_kv, (mha::detail::strided_dims{{4, 32, 16}, {512, 16, 1}}));
  EXPECT_EQ(p.geometry.q_stride, 32 * 16);
  EXPECT_EQ(p.geometry.kv_stride, 32 * 16);
  EXPECT_EQ(p.query_floats, 4u * 32 * 16 / 2);
  EXPECT_EQ(p.key_floats, 4u * 32 * 16 / 2);
  EXPECT_EQ(p.value_floats, 4u * 32 * 16 / 2);
  EXPECT_EQ(p.out_floats, 4u * 32 * 16);  // the outputs stay f32
  expect_slices_cover_the_call(a, p);
}

// bf16 with a cache: the queries are gathered, the keys and values read from the bf16 cache in
// place (its strides count bf16 elements).
TEST(OnednnAttentionPlan, Bf16DecodeReadsTheCacheInPlace) {
  attention_args a = call(layout::head_major, 1, 2, 2, 1, 16);
  a.bf16 = true;
  const cache held(a, 64, {10}, true);
  a.cache = &held.store;
  const attention_plan p = plan_attention(a);
  EXPECT_EQ(p.queries, query_source::gathered_bf16);
  EXPECT_EQ(p.keys_values, kv_source::cache);
  EXPECT_EQ(p.geometry.keys, 64);
  EXPECT_EQ(p.geometry.kv_stride, 2 * 64 * 16);
  EXPECT_EQ(p.gather_q, (mha::detail::strided_dims{{2, 1, 1, 16}, {16, 16, 16, 1}}));
  EXPECT_TRUE(p.gather_kv.dims.empty());
  EXPECT_EQ(p.key_floats + p.value_floats, 0u);
  EXPECT_EQ(p.mask_floats, 64u);
  expect_slices_cover_the_call(a, p);
}

// One head, or the wrapper's per-head buffers without grouping: each head's sequences are back
// to back, so slices run along the batch within a head.
TEST(OnednnAttentionPlan, SlicesRunAlongTheBatchWhereSequencesAreBackToBack) {
  const attention_args one_head = call(layout::rows, 2, 1, 1, 5, 8);
  const attention_plan p = plan_attention(one_head);
  EXPECT_TRUE(p.over_batch);
  EXPECT_EQ(p.outer, 1);
  EXPECT_EQ(p.inner, 2);
  EXPECT_EQ(p.geometry.group, 2);
  EXPECT_EQ(p.q_slice, 5 * 8);
  EXPECT_EQ(p.kv_slice, 5 * 8);
  EXPECT_EQ(p.slice(0, 0, 1), (attention_plan::slice_index{1, 0}));
  expect_slices_cover_the_call(one_head, p);

  const attention_args wrapper = call(layout::wrapper, 3, 4, 4, 8, 16);
  const attention_plan w = plan_attention(wrapper);
  EXPECT_TRUE(w.over_batch);
  EXPECT_EQ(w.outer, 4);  // heads
  EXPECT_EQ(w.inner, 3);  // sequences
  EXPECT_EQ(w.slice(2, 0, 1), (attention_plan::slice_index{1, 2}));
  expect_slices_cover_the_call(wrapper, w);

  // A single sequence of a single head: one slice.
  const attention_plan single = plan_attention(call(layout::rows, 1, 1, 1, 5, 8));
  EXPECT_FALSE(single.over_batch);
  EXPECT_EQ(single.outer * single.inner, 1);
  EXPECT_EQ(single.geometry.group, 1);
}

// Groups are the largest divisor of the slices whose scores fit 256 KiB: 12 heads of 64 KiB go
// 4 at a time (groups at heads 0, 4, 8), a prime count one at a time, and a slice over the
// budget alone.
TEST(OnednnAttentionPlan, GroupBoundaries) {
  const attention_args twelve = call(layout::head_major, 1, 12, 12, 128, 64);
  const attention_plan p = plan_attention(twelve);
  EXPECT_EQ(p.geometry.group, 4);
  EXPECT_EQ(p.slice(0, 4, 0), (attention_plan::slice_index{0, 4}));
  EXPECT_EQ(p.slice(0, 8, 3), (attention_plan::slice_index{0, 11}));
  expect_slices_cover_the_call(twelve, p);

  const attention_args seven = call(layout::head_major, 2, 7, 7, 128, 64);
  EXPECT_EQ(plan_attention(seven).geometry.group, 1);
  expect_slices_cover_the_call(seven, plan_attention(seven));

  const attention_args long_rows = call(layout::head_major, 1, 4, 4, 512, 64);
  EXPECT_EQ(plan_attention(long_rows).geometry.group, 1);

  const attention_args small = call(layout::head_major, 1, 96, 96, 16, 8);
  EXPECT_EQ(plan_attention(small).geometry.group, 96);  // 96 KiB in all
}

TEST(OnednnAttentionPlan, KeyBuckets) {
  using mha::detail::key_bucket;
  EXPECT_EQ(key_bucket(1, 1000), 64);
  EXPECT_EQ(key_bucket(64, 1000), 64);
  EXPECT_EQ(key_bucket(65, 1000), 128);
  EXPECT_EQ(key_bucket(513, 1000), 576);    // granule 64 up to 1023 keys
  EXPECT_EQ(key_bucket(1025, 4096), 1152);  // then 1/8 of the power of two
  EXPECT_EQ(key_bucket(4097, 8192), 4608);
  EXPECT_EQ(key_bucket(101, 100), 100);  // never past the capacity
}

}  // namespace
