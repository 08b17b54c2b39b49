// mha::attention (mha/attention.hpp): every backend that runs it against a float64 reference of
// SDPA's meaning written here from its definition (mask matrix first, then the softmax), over
// query rows shorter, equal and longer than the keys, both causal alignments, additive and
// boolean masks (broadcast, rows that see no key), grouped heads, strided inputs and bf16; the
// errors it names.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention_call_data.hpp"
#include "mha/mha.hpp"
#include "support.hpp"

namespace {

using namespace mha_test::attention_call;

// bf16 operands and causal bottom_right with a boolean mask, head_dim 64: at these (rows, keys)
// read in place (one row), packed, split over key chunks, with rows that see no key.
constexpr std::pair<std::int64_t, std::int64_t> bf16_result_shapes[] = {
    {1, 37}, {40, 300}, {1, 5000}, {9, 4}};
call_case bf16_result_case(std::int64_t rows, std::int64_t keys, bool bf16_out) {
  call_case c;
  c.precision = mha::precision::bf16;
  c.bf16_operands = true;
  c.bf16_out = bf16_out;
  c.rows = rows;
  c.keys = keys;
  c.head_dim = 64;
  c.causal = true;
  c.alignment = causal_alignment::bottom_right;
  c.mask = attention_mask::kind::boolean;
  return c;
}

std::vector<call_case> call_cases() {
  std::vector<call_case> cases;
  for (const auto& [rows, keys] : {std::pair{5, 9}, {9, 9}, {9, 4}, {1, 37}, {40, 300}}) {
    for (const int mode : {0, 1, 2}) {  // not causal, top_left, bottom_right
      for (const auto mask : {attention_mask::kind::none, attention_mask::kind::additive,
                              attention_mask::kind::boolean}) {
        call_case c;
        c.rows = rows;
        c.keys = keys;
        c.causal = mode > 0;
        c.alignment = mode == 2 ? causal_alignment::bottom_right : causal_alignment::top_left;
        c.mask = mask;
        cases.push_back(c);
      }
    }
  }
  // Head sizes of the narrow path (8), an odd one, 64; masks broadcast over batch or per head;
  // (B, T, H, D) buffers; multi-query; bf16.
  call_case c;
  c.head_dim = 8;
  cases.push_back(c);
  c.mask = attention_mask::kind::additive;
  cases.push_back(c);
  c = {};
  c.head_dim = 5;
  c.causal = true;
  c.mask = attention_mask::kind::boolean;
  c.mask_per_batch = false;
  cases.push_back(c);
  c = {};
  c.head_dim = 64;
  c.rows = 17;
  c.keys = 70;
  c.mask = attention_mask::kind::additive;
  c.mask_per_head = true;
  c.transposed = true;
  cases.push_back(c);
  c = {};
  c.kv_heads = 1;
  c.causal = true;
  c.alignment = causal_alignment::bottom_right;
  c.transposed = true;
  cases.push_back(c);
  for (const auto mask : {attention_mask::kind::none, attention_mask::kind::boolean}) {
    c = {};
    c.precision = mha::precision::bf16;
    c.head_dim = 32;
    c.rows = 12;
    c.keys = 30;
    c.causal = true;
    c.alignment = causal_alignment::bottom_right;
    c.mask = mask;
    cases.push_back(c);
  }
  // bfloat16 operands: a decode step of grouped heads (K and V read in place), head sizes past
  // and short of whole registers of pairs (80, 5), with masks; a chunk of rows (K and V
  // packed), a split decode step over 5000 keys.
  const auto operands = [&](std::int64_t rows, std::int64_t keys, std::int64_t head_dim) {
    c = {};
    c.precision = mha::precision::bf16;
    c.bf16_operands = true;
    c.rows = rows;
    c.keys = keys;
    c.head_dim = head_dim;
    return c;
  };
  c = operands(1, 37, 64);
  c.kv_heads = 1;
  c.causal = true;
  c.alignment = causal_alignment::bottom_right;
  c.transposed = true;
  cases.push_back(c);
  c = operands(1, 37, 80);
  c.kv_heads = 4;
  c.mask = attention_mask::kind::additive;
  cases.push_back(c);
  c = operands(3, 70, 5);
  c.mask = attention_mask::kind::boolean;
  cases.push_back(c);
  c = operands(2, 70, 48);
  c.causal = true;
  c.alignment = causal_alignment::bottom_right;
  cases.push_back(c);
  c = operands(40, 300, 64);
  c.causal = true;
  c.transposed = true;
  cases.push_back(c);
  c = operands(12, 30, 33);
  c.mask = attention_mask::kind::boolean;
  cases.push_back(c);
  c = operands(1, 5000, 64);
  c.batch = 1;
  cases.push_back(c);
  for (const auto& [rows, keys] : bf16_result_shapes)
    cases.push_back(bf16_result_case(rows, keys, true));
  return cases;
}

class AttentionCall : public testing::TestWithParam<call_case> {};

// Every backend that runs the call agrees with the float64 reference: fp32 within the rounding
// of sums of O(keys) terms, bf16 (operands rounded as in the reference) within its sums' rounding
// and the weights' (P is rounded to bf16: 2^-9 relative, times the sum of |v|, at most 1 each).
TEST_P(AttentionCall, EveryBackendMatchesTheReference) {
  const call_case c = GetParam();
  call_data data(c);
  const std::vector<double> want = data.reference();
  // bf16 results add their own rounding: half a bf16 ulp of |y| <= 1.
  const double bound =
      c.precision == mha::precision::bf16 ? 4e-3 + (c.bf16_out ? 0x1p-9 : 0.0) : 2e-5;
  int ran = 0;
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(c.precision)) continue;
    SCOPED_TRACE(label);
    data.run(*backend);
    ++ran;
    double worst = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(data.out[i]) - want[i]));
    EXPECT_LE(worst, bound);
  }
  EXPECT_GE(ran, 1);
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionCall, testing::ValuesIn(call_cases()),
                         [](const auto& p) { return p.param.name(); });

// Every path of the kernels at the row counts where its blocking changes: the stacked rows of a
// K/V head (rows x query heads per K/V head) at 1, 2, 7, 8, 9, 14-18, 30-34 cover the direct
// block (at most 8 rows, K and V read in place), the packed blocks and their edges (registers of
// 8 or 16 rows); head sizes of the narrow path (3, 8: a register of rows transposed, read in
// place or packed) and of the register tiles (16, 64); rows that see the keys' end (bottom_right)
// and more rows than keys (top_left, calls of at most S rows, the last a leftover); fp32, bf16
// and bf16 operands; with a boolean mask (which leaves the narrow path). Once a head_dim 8 call
// of at most 8 stacked rows crashed (the narrow path read a packed K^T the direct block never
// made).
TEST(AttentionCall, EveryPathAtTheRowCountsWhereItsBlockingChanges) {
  for (const std::int64_t rows : {1, 2, 7, 8, 9, 15, 16, 17}) {
    for (const std::int64_t group : {1, 2}) {
      for (const std::int64_t head_dim : {3, 8, 16, 64}) {
        for (const int variant : {0, 1, 2}) {  // fp32, bf16, bf16 operands
          for (const bool short_keys : {false, true}) {
            for (const auto mask : {attention_mask::kind::none, attention_mask::kind::boolean}) {
              call_case c;
              c.batch = 1;
              c.kv_heads = 2;
              c.heads = 2 * group;
              c.rows = rows;
              c.keys = short_keys ? 5 : rows + 20;
              c.head_dim = head_dim;
              c.causal = true;
              c.alignment =
                  short_keys ? causal_alignment::top_left : causal_alignment::bottom_right;
              c.mask = mask;
              c.precision = variant == 0 ? mha::precision::fp32 : mha::precision::bf16;
              c.bf16_operands = variant == 2;
              call_data data(c);
              const std::vector<double> want = data.reference();
              const double bound = variant == 0 ? 2e-5 : 4e-3;
              for (const auto& [label, backend] : mha_test::backend_cases()) {
                if (!backend->supports_attention(c.precision)) continue;
                SCOPED_TRACE(label + " " + c.name());
                data.run(*backend);
                double worst = 0.0;
                for (std::size_t i = 0; i < want.size(); ++i)
                  worst = std::max(worst, std::fabs(static_cast<double>(data.out[i]) - want[i]));
                EXPECT_LE(worst, bound);
              }
            }
          }
        }
      }
    }
  }
}

// A row that sees no key comes out as zeros (SDPA's answer), and so do the rows before the
// diagonal under bottom_right with more query rows than keys; the others are finite.
TEST(AttentionCall, RowsThatSeeNoKeyAreZeros) {
  call_case c;
  c.rows = 9;
  c.keys = 4;
  c.causal = true;
  c.alignment = causal_alignment::bottom_right;
  c.mask = attention_mask::kind::boolean;
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(c.precision)) continue;
    SCOPED_TRACE(label);
    call_data data(c);
    data.run(*backend);
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t i = 0; i < c.rows; ++i) {
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          const float y = data.at(data.out, c.heads, c.rows, 0, h, i, d);
          if (i < c.rows - c.keys || i == c.rows - 1) {
            EXPECT_EQ(y, 0.0f) << "h " << h << " row " << i;
          } else {
            EXPECT_TRUE(std::isfinite(y)) << "h " << h << " row " << i;
          }
        }
      }
    }
  }
}

// tbb's result is the same bits for every thread count, and the same as xsimd's (one kernel).
TEST(AttentionCall, ParallelIsBitwiseTheSameForEveryThreadCount) {
  const mha::backend* tbb = mha::find_backend("tbb");
  if (tbb == nullptr) GTEST_SKIP() << "tbb is not built";
  call_case c;
  c.rows = 70;
  c.keys = 600;
  c.causal = true;
  c.mask = attention_mask::kind::additive;
  call_data one(c), two(c);
  one.run(*tbb, 1);
  two.run(*tbb, 2);
  EXPECT_EQ(one.out, two.out);
}

// A decode step over a long context (split into key chunks) with a mask that hides a whole
// chunk from some rows: the merge keeps those rows right.
TEST(AttentionCall, SplitKeysWithAMaskedChunk) {
  call_case c;
  c.rows = 1;
  c.keys = 5000;
  c.head_dim = 64;
  c.mask = attention_mask::kind::boolean;
  call_data data(c);
  // Batch 0 head rows see only keys >= 4200 (the last chunk); batch 1 sees no key at all.
  for (std::int64_t b = 0; b < c.batch; ++b) {
    for (std::int64_t j = 0; j < c.keys; ++j)
      data.keep[data.mask_index(b, 0, 0, j)] = b == 0 && j >= 4200 ? 1 : 0;
  }
  const std::vector<double> want = data.reference();
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(c.precision)) continue;
    SCOPED_TRACE(label);
    data.run(*backend);
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(data.out[i], want[i], 2e-5);
  }
}

// bfloat16 operands are the same call as float operands holding the same (bf16) values: naive
// widens them (the same bits), and where the SIMD kernels pack K and V (many query rows) they
// pack the same pairs (the same bits); a few rows read them in place (within the bf16 bound of
// the reference test above).
TEST(AttentionCall, Bf16OperandsAreTheRoundedFloats) {
  call_case c;
  c.precision = mha::precision::bf16;
  c.rows = 40;
  c.keys = 300;
  c.head_dim = 64;
  c.causal = true;
  c.mask = attention_mask::kind::additive;
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(c.precision)) continue;
    SCOPED_TRACE(label);
    call_data floats(c);
    for (auto* t : {&floats.q, &floats.k, &floats.v}) {
      for (float& x : *t) x = mha::detail::round_bf16(x);
    }
    call_data words = floats;
    words.c.bf16_operands = true;
    floats.run(*backend);
    words.run(*backend);
    EXPECT_EQ(floats.out, words.out);
  }
}

// bfloat16 results are the float results rounded to the nearest bf16, bit for bit: in place,
// packed, split over key chunks, and the zeros of rows that see no key.
TEST(AttentionCall, Bf16ResultsAreTheFloatResultsRounded) {
  for (const auto& [rows, keys] : bf16_result_shapes) {
    const call_case c = bf16_result_case(rows, keys, false);
    for (const auto& [label, backend] : mha_test::backend_cases()) {
      if (!backend->supports_attention(c.precision)) continue;
      SCOPED_TRACE(label + " " + c.name());
      call_data floats(c);
      call_data words = floats;
      words.c.bf16_out = true;
      floats.run(*backend);
      words.run(*backend);
      for (float& y : floats.out) y = mha::detail::round_bf16(y);
      EXPECT_EQ(floats.out, words.out);
    }
  }
}

// A backend without the call says so, naming itself and the ones that have it.
TEST(AttentionCall, DeclinedWithTheReason) {
  const mha::backend* onednn = mha::find_backend("onednn");
  if (onednn == nullptr) GTEST_SKIP() << "onednn is not built";
  EXPECT_THAT(onednn->supports_attention(mha::precision::fp32).reason(),
              testing::HasSubstr("not implemented on onednn"));
  call_case c;
  call_data data(c);
  expect_error<mha::unsupported>([&] { data.run(*onednn); },
                                 {"onednn: ", "xsimd, tbb and naive run it"});
}

}  // namespace
