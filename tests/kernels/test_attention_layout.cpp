// The attention kernel's geometry per ISA (isa_kernels::layout, src/kernels/attention.cpp): the
// path it names, and the workspace it sizes.
#include <gtest/gtest.h>

#include <string>

#include "kernels/interface/attention.hpp"
#include "kernels/interface/isa_kernels.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/config.hpp"
#include "support.hpp"  // how gtest prints an isa

namespace {

class AttentionLayout : public testing::TestWithParam<mha::isa> {
 protected:
  const mha::detail::isa_kernels& kernels() const { return mha::detail::kernels_for(GetParam()); }
};

// Per-thread scratch is O(tile): it stops growing with the sequence once that passes the key
// tile; the packed head grows linearly (T * head_dim), never with T^2.
TEST_P(AttentionLayout, AttentionWorkspaceGrowsLinearlyInSequence) {
  const mha::detail::attention_layout small = kernels().layout(
                                          {.seq_len = 1024, .keys = 1024, .head_dim = 64}),
                                      large = kernels().layout(
                                          {.seq_len = 8192, .keys = 8192, .head_dim = 64});
  EXPECT_EQ(small.scratch_floats(), large.scratch_floats());
  EXPECT_LE(large.head_units(), 8 * small.head_units() + 64);
  EXPECT_GE(large.head_units(), 2 * 8192 * 64);
}

// The scores' row stride holds a key tile and is never a multiple of 1 KiB: such rows share a
// few L1 sets (the key tile of 512 floats, 2 KiB, is the case that matters). Where it is padded
// for that, it grows by at most two lines and stays whole lines for P's pairs (half as wide),
// for fp32, bf16 and int8 layouts alike.
TEST_P(AttentionLayout, ScoreRowsAreOffL1SetAliasing) {
  constexpr std::int64_t line_floats = 16, aliasing_floats = 256;
  int padded = 0;
  for (const std::int64_t keys : {48, 256, 300, 512, 1024, 8192}) {
    for (const std::int64_t key_tile : {256, 512, 1024}) {
      for (const bool bf16 : {false, true}) {
        mha::detail::attention_request r{.seq_len = 64,
                                         .keys = keys,
                                         .head_dim = 64,
                                         .key_tile = key_tile,
                                         .bf16_operands = bf16};
        for (const bool coded : {false, true}) {
          const auto l = kernels().layout(coded ? r.cache_format(mha::precision::int8) : r);
          const std::int64_t row = std::min(l.key_tile, mha::detail::round_up(keys, l.key_step));
          const std::string what = "keys " + std::to_string(keys) + " tile " +
                                   std::to_string(l.key_tile) + (bf16 ? " bf16" : "") +
                                   (coded ? " int8" : "");
          EXPECT_NE(l.score_cols % aliasing_floats, 0) << what;
          EXPECT_GE(l.score_cols, row) << what;
          EXPECT_LE(l.score_cols, row + 2 * line_floats) << what;
          if (l.score_cols == row) continue;
          ++padded;
          EXPECT_EQ(l.score_cols % (2 * line_floats), 0) << what;
        }
      }
    }
  }
  EXPECT_GT(padded, 0);  // the 512-key tile, at least
}

// The layout names the kernel's path once (attention_path): an int8 cache's codes; narrow fp32
// heads whose scores go to the softmax as they are, packed or in place; K and V read in place by
// a block of at most direct_rows rows; else packed, bf16 blocks of several rows on tiles where
// the ISA has tile products.
TEST_P(AttentionLayout, AttentionLayoutChoosesOnePath) {
  using mha::detail::attention_path;
  using request = mha::detail::attention_request;
  const auto path = [&](request r) { return kernels().layout(r).path; };
  const auto in_place = [&](request r) { return kernels().layout(r).in_place; };
  const request decode{.seq_len = 1, .keys = 300, .head_dim = 64};
  const request prefill{.seq_len = 300, .keys = 300, .head_dim = 64};

  request coded = decode;
  coded.kv_rows = 512;
  for (const mha::precision kv : {mha::precision::int8, mha::precision::k8v4, mha::precision::int4})
    EXPECT_EQ(path(coded.cache_format(kv)), attention_path::codes) << mha::to_string(kv);

  request narrow = prefill;
  narrow.head_dim = mha::detail::narrow_dims;
  narrow.plain_scores = true;
  EXPECT_EQ(path(narrow), attention_path::narrow);
  narrow.seq_len = 1;
  narrow.in_place = true;
  EXPECT_EQ(path(narrow), attention_path::narrow);
  EXPECT_TRUE(in_place(narrow));  // the narrow path reads K and V where they lie
  narrow.plain_scores = false;    // a mask, dropout, a soft-cap or sinks
  EXPECT_EQ(path(narrow), attention_path::direct);
  narrow.head_dim += 1;
  narrow.plain_scores = true;
  EXPECT_EQ(path(narrow), attention_path::direct);

  for (const bool bf16 : {false, true}) {
    request r = decode;
    r.bf16_operands = bf16;
    r.plain_scores = true;
    r.in_place = true;
    EXPECT_EQ(path(r), attention_path::direct) << "bf16 " << bf16;
    r.seq_len = mha::detail::direct_rows + 1;  // too many rows to read each key once
    EXPECT_FALSE(in_place(r));
    const attention_path many =
        bf16 && kernels().pair_tile_cols > 0 ? attention_path::tiles : attention_path::packed;
    EXPECT_EQ(path(r), many) << "bf16 " << bf16;
    r.seq_len = 1;
    r.in_place = false;  // one row over packed heads: vectors
    EXPECT_EQ(path(r), attention_path::packed) << "bf16 " << bf16;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AttentionLayout, testing::ValuesIn(mha::xsimd_supported_isas()),
                         [](const testing::TestParamInfo<mha::isa>& p) {
                           return std::string(mha::to_string(p.param));
                         });

}  // namespace
