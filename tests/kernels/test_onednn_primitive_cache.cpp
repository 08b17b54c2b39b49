// The oneDNN backend's primitive cache (src/backends/onednn/primitive_cache.hpp) on its own:
// insertion, hits, the order of eviction, the capacity, failed builds, racing builders, and
// keys that tell apart every field oneDNN fixes when it creates a primitive.
#include <gtest/gtest.h>

#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/onednn/primitive_cache.hpp"

namespace {

using mha::detail::primitive_cache;

// A cache of strings that counts its builds.
template <std::size_t capacity>
struct counted_cache {
  primitive_cache<int, std::string, capacity> cache;
  int builds = 0;

  std::shared_ptr<const std::string> get(int key) {
    return cache.get(key, [&] {
      ++builds;
      return "value " + std::to_string(key);
    });
  }
  // The keys held, most recently used first.
  std::vector<int> keys() const {
    std::vector<int> out;
    cache.for_each([&](int key, const std::string&) { out.push_back(key); });
    return out;
  }
};

TEST(OnednnPrimitiveCache, BuildsAMissingKeyOnceAndFindsItAfterwards) {
  counted_cache<3> c;
  EXPECT_TRUE(c.keys().empty());
  const auto first = c.get(7);
  EXPECT_EQ(*first, "value 7");
  EXPECT_EQ(c.builds, 1);
  EXPECT_EQ(c.keys(), std::vector<int>{7});
  const auto again = c.get(7);
  EXPECT_EQ(c.builds, 1);
  EXPECT_EQ(again.get(), first.get());  // the very value, not a copy
}

TEST(OnednnPrimitiveCache, KeepsTheMostRecentlyUsedFirst) {
  counted_cache<3> c;
  c.get(1);
  c.get(2);
  c.get(3);
  EXPECT_EQ(c.keys(), (std::vector<int>{3, 2, 1}));
  c.get(1);  // a hit moves its key to the front
  EXPECT_EQ(c.keys(), (std::vector<int>{1, 3, 2}));
  EXPECT_EQ(c.builds, 3);
}

TEST(OnednnPrimitiveCache, EvictsTheLeastRecentlyUsed) {
  counted_cache<3> c;
  c.get(1);
  c.get(2);
  c.get(3);
  c.get(1);
  c.get(4);  // 2 is the least recently used
  EXPECT_EQ(c.keys(), (std::vector<int>{4, 1, 3}));
  c.get(2);  // built again, evicting 3
  EXPECT_EQ(c.builds, 5);
  EXPECT_EQ(c.keys(), (std::vector<int>{2, 4, 1}));
}

TEST(OnednnPrimitiveCache, HoldsAtMostItsCapacity) {
  counted_cache<3> c;
  for (int key = 0; key < 10; ++key) c.get(key);
  EXPECT_EQ(c.keys(), (std::vector<int>{9, 8, 7}));
  counted_cache<1> one;
  one.get(1);
  one.get(2);
  EXPECT_EQ(one.keys(), std::vector<int>{2});
}

// A caller still holding an evicted value keeps it (concurrent runs share primitives).
TEST(OnednnPrimitiveCache, AnEvictedValueLivesOnWhileHeld) {
  counted_cache<1> c;
  const auto held = c.get(1);
  c.get(2);
  EXPECT_EQ(c.keys(), std::vector<int>{2});
  EXPECT_EQ(*held, "value 1");
}

TEST(OnednnPrimitiveCache, AFailedBuildInsertsNothing) {
  counted_cache<3> c;
  c.get(1);
  EXPECT_THROW(c.cache.get(2, []() -> std::string { throw std::runtime_error("no kernel"); }),
               std::runtime_error);
  EXPECT_EQ(c.keys(), std::vector<int>{1});
  EXPECT_EQ(*c.get(2), "value 2");
  EXPECT_EQ(c.builds, 2);
}

// Two callers that both miss a key both build it (outside the lock); the first to insert wins
// and both get its value. The latch makes both builds run at once.
TEST(OnednnPrimitiveCache, RacingBuildersShareTheFirstInsertedValue) {
  primitive_cache<int, std::string, 3> cache;
  std::latch both_building(2);
  const auto build = [&] {
    both_building.arrive_and_wait();
    return std::string("built");
  };
  std::shared_ptr<const std::string> got[2];
  std::thread other([&] { got[1] = cache.get(5, build); });
  got[0] = cache.get(5, build);
  other.join();
  EXPECT_EQ(got[0].get(), got[1].get());
  int entries = 0;
  cache.for_each([&](int, const std::string&) { ++entries; });
  EXPECT_EQ(entries, 1);
}

// One change of one field of a key.
template <class Key>
struct field_change {
  const char* field;
  std::function<void(Key&)> change;
};

// Every field of Key takes part in its equality, and so in the cache's lookups: `base` with
// any one field changed is another key, built anew; base itself is found again.
template <class Key>
void expect_every_field_distinguishes(const Key& base,
                                      const std::vector<field_change<Key>>& changes) {
  primitive_cache<Key, int, 64> cache;
  int builds = 0;
  const auto build = [&] { return ++builds; };
  const Key copy = base;
  EXPECT_TRUE(copy == base);
  cache.get(base, build);
  for (const auto& [field, change] : changes) {
    Key other = base;
    change(other);
    EXPECT_FALSE(other == base) << field;
    const int before = builds;
    cache.get(other, build);
    EXPECT_EQ(builds, before + 1) << field;
  }
  const int before = builds;
  cache.get(base, build);
  EXPECT_EQ(builds, before);
}

TEST(OnednnPrimitiveKeys, LinearKeyComparesEveryField) {
  using key = mha::detail::linear_key;
  expect_every_field_distinguishes<key>(
      {.rows = 128, .in = 768, .out = 2304, .bias = true, .threads = 2},
      {{"rows", [](key& k) { k.rows = 129; }},
       {"in", [](key& k) { k.in = 769; }},
       {"out", [](key& k) { k.out = 2305; }},
       {"bias", [](key& k) { k.bias = false; }},
       {"threads", [](key& k) { k.threads = 1; }}});
}

TEST(OnednnPrimitiveKeys, HeadSplitKeyComparesEveryField) {
  using key = mha::detail::head_split_key;
  expect_every_field_distinguishes<key>(
      {.batch = 2, .seq_len = 64, .heads = 12, .head_dim = 64, .threads = 2},
      {{"batch", [](key& k) { k.batch = 3; }},
       {"seq_len", [](key& k) { k.seq_len = 65; }},
       {"heads", [](key& k) { k.heads = 6; }},
       {"head_dim", [](key& k) { k.head_dim = 128; }},
       {"threads", [](key& k) { k.threads = 1; }}});
}

TEST(OnednnPrimitiveKeys, AttentionKeyComparesEveryFieldOfItsGeometry) {
  using key = mha::detail::attention_key;
  const key base{.geometry = {.rows = 64,
                              .positions = 16,
                              .keys = 128,
                              .head_dim = 32,
                              .group = 2,
                              .q_stride = 4096,
                              .kv_stride = 8192,
                              .causal = true,
                              .scale = 0.125f,
                              .mask_per_run = true,
                              .bf16 = false},
                 .threads = 2};
  expect_every_field_distinguishes<key>(
      base, {{"rows", [](key& k) { k.geometry.rows = 65; }},
             {"positions", [](key& k) { k.geometry.positions = 32; }},
             {"keys", [](key& k) { k.geometry.keys = 192; }},
             {"head_dim", [](key& k) { k.geometry.head_dim = 64; }},
             {"group", [](key& k) { k.geometry.group = 1; }},
             {"q_stride", [](key& k) { k.geometry.q_stride = 2048; }},
             {"kv_stride", [](key& k) { k.geometry.kv_stride = 0; }},
             {"causal", [](key& k) { k.geometry.causal = false; }},
             {"scale", [](key& k) { k.geometry.scale = 0.25f; }},
             {"mask_per_run", [](key& k) { k.geometry.mask_per_run = false; }},
             {"bf16", [](key& k) { k.geometry.bf16 = true; }},
             {"threads", [](key& k) { k.threads = 1; }}});
}

TEST(OnednnPrimitiveKeys, ToBf16KeyComparesEveryField) {
  using key = mha::detail::to_bf16_key;
  expect_every_field_distinguishes<key>(
      {.dims = {2, 4, 16, 32}, .strides = {2048, 512, 32, 1}, .threads = 2},
      {{"dims", [](key& k) { k.dims[2] = 17; }},
       {"dims' rank", [](key& k) { k.dims.pop_back(); }},
       {"strides", [](key& k) { k.strides[0] = 4096; }},
       {"threads", [](key& k) { k.threads = 1; }}});
}

}  // namespace
