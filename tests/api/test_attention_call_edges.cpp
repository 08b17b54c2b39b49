// mha::attention at its edges and on bad arguments: finite extreme mask values and empty shapes
// give SDPA's answer, an out overlapping the mask or itself is refused, and every bad argument
// is named (test_attention_call.cpp has the reference over the cases).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_call_data.hpp"
#include "mha/mha.hpp"
#include "support.hpp"

namespace {

using namespace mha_test::attention_call;
using mha::invalid_argument;

// Finite mask values of any size give SDPA's result, in one key tile or split over key chunks
// (5000 keys, merged by their maxima): a row whose keys are all at float32's lowest value
// (transformers' "masked" value) averages them, as SDPA's scores absorb the dot products; a +3e38
// bias takes that key's value; of two keys at -3e38 and -2.5e38 the larger wins. log2(e) times
// such a value is past float32's range: the kernels keep masked scores halved.
TEST(AttentionCall, FiniteExtremeMaskValuesGiveSdpasResult) {
  constexpr float lowest = std::numeric_limits<float>::lowest();
  for (const std::int64_t keys : {37, 5000}) {
    for (const int pattern : {0, 1, 2, 3}) {
      call_case c;
      c.rows = 3;
      c.keys = keys;
      c.head_dim = 8 * (pattern + 1);
      c.mask = attention_mask::kind::additive;
      call_data data(c);
      for (std::int64_t b = 0; b < c.batch; ++b) {
        for (std::int64_t i = 0; i < c.rows; ++i) {
          for (std::int64_t j = 0; j < c.keys; ++j) {
            float& m = data.additive[data.mask_index(b, 0, i, j)];
            switch (pattern) {
              case 0:
                m = lowest;
                break;  // every key
              case 1:
                m = j == 2 ? 3e38f : 0.0f;
                break;  // one huge bias
              case 2:
                m = j == 1 ? -2.5e38f : -3e38f;
                break;  // the larger wins
              default:
                m = (j + i) % 3 == 0 ? 0.0f : lowest;
                break;  // a padding mask
            }
          }
        }
      }
      const std::vector<double> want = data.reference();
      for (const auto& [label, backend] : mha_test::backend_cases()) {
        if (!backend->supports_attention(c.precision)) continue;
        SCOPED_TRACE(label + " keys " + std::to_string(keys) + " pattern " +
                     std::to_string(pattern));
        data.run(*backend);
        double worst = 0.0;
        for (std::size_t i = 0; i < want.size(); ++i)
          worst = std::max(worst, std::fabs(static_cast<double>(data.out[i]) - want[i]));
        EXPECT_LE(worst, 2e-5);
        if (pattern == 1) {  // key 2's value, exactly (its weight 1, the others 0)
          EXPECT_EQ(data.out[0], data.at(data.v, c.kv_heads, c.keys, 0, 0, 2, 0));
        }
      }
    }
  }
}

// Empty tensors are SDPA's: a zero batch, head count, query rows or head_dim computes nothing
// (the views may have no data), zero keys give zeros.
TEST(AttentionCall, EmptyShapesGiveSdpasAnswer) {
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(mha::precision::fp32)) continue;
    SCOPED_TRACE(label);
    std::vector<float> q(64, 1.0f), k(64, 1.0f), out(64, std::nanf(""));
    using view = heads_view<const float>;
    // (batch, heads, rows, head_dim) of q and (keys) of k and v.
    for (const auto& [b, h, l, d] :
         {std::array<std::int64_t, 4>{0, 2, 3, 4}, {1, 0, 3, 4}, {1, 2, 0, 4}, {1, 2, 3, 0}}) {
      const float* keys = b * h * d == 0 ? nullptr : k.data();  // k and v are empty too
      mha::attention(*backend, view::dense(nullptr, b, h, l, d), view::dense(keys, b, h, 5, d),
                     view::dense(keys, b, h, 5, d), heads_view<float>::dense(nullptr, b, h, l, d));
      mha::attention(*backend, view::dense(q.data(), b, h, l, d), view::dense(k.data(), b, h, 5, d),
                     view::dense(k.data(), b, h, 5, d),
                     heads_view<float>::dense(out.data(), b, h, l, d));
      for (const float y : out) EXPECT_TRUE(std::isnan(y));  // nothing written
    }
    for (const bool causal : {false, true}) {
      mha::attention_options o;
      o.causal = causal;
      std::fill(out.begin(), out.end(), std::nanf(""));
      mha::attention(*backend, view::dense(q.data(), 1, 2, 3, 4), view::dense(nullptr, 1, 2, 0, 4),
                     view::dense(nullptr, 1, 2, 0, 4),
                     heads_view<float>::dense(out.data(), 1, 2, 3, 4), o);
      for (std::size_t i = 0; i < 24; ++i) EXPECT_EQ(out[i], 0.0f) << i;
      EXPECT_TRUE(std::isnan(out[24]));
    }
  }
}

// Every writable buffer against every readable one and against itself: out sharing memory with
// the mask (a broadcast mask sliced from out's buffer), out with a stride of 0 (an expanded
// dimension: each (b, h) would write one slab, and the work would have no bound in memory), out
// whose rows overlap, keys expanded along their rows. Each is refused naming it.
TEST(AttentionCall, OutOverlappingTheMaskOrItselfIsRefused) {
  const mha::backend& backend = mha::naive_backend();
  default_views views;
  auto& [c, data] = views;
  const auto& [q, k, v, out] = views.operands();
  // A (1, 1, rows, keys) float mask in out's last elements.
  mha::attention_options o;
  o.mask = {attention_mask::kind::additive,
            data.out.data() + data.out.size() - c.rows * c.keys,
            1,
            1,
            c.rows,
            c.keys,
            0,
            0,
            c.keys};
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"out may overlap the mask"});
  // ... and a boolean one in its first bytes.
  std::vector<unsigned char> bytes(data.out.size() * sizeof(float));
  o.mask = {attention_mask::kind::boolean, bytes.data() + 8, 1, 1, c.rows, c.keys, 0, 0, c.keys};
  expect_error<invalid_argument>(
      [&] {
        mha::attention(backend, q, k, v,
                       heads_view<float>::dense(reinterpret_cast<float*>(bytes.data()), c.batch,
                                                c.heads, c.rows, c.head_dim),
                       o);
      },
      {"out may overlap the mask"});
  auto expanded = out;
  expanded.batch_stride = 0;
  expect_error<invalid_argument>(
      [&] { mha::attention(backend, q, k, v, expanded); },
      {"out of shape (2, 4, 5, 16) has strides (0, 80, 16, 1)", "elements overlap"});
  auto rows_overlap = out;
  rows_overlap.row_stride = c.head_dim - 1;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, rows_overlap); },
                                 {"elements overlap"});
  auto heads_overlap = out;  // heads interleaved with rows
  heads_overlap.head_stride = c.head_dim;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, heads_overlap); },
                                 {"elements overlap"});
  auto same_key = k;
  same_key.row_stride = 0;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, same_key, v, out); },
                                 {"k has 9 keys at row stride 0"});
  // A (B, T, H, D) out seen as (B, H, T, D) is one element per result: accepted.
  call_case bthd = c;
  bthd.transposed = true;
  call_data transposed(bthd);
  EXPECT_NO_THROW(transposed.run(backend));
}

TEST(AttentionCall, BadArgumentsAreNamed) {
  const mha::backend& backend = mha::naive_backend();
  default_views views;
  auto& [c, data] = views;
  const auto& [q, k, v, out] = views.operands();
  auto k3 = k;
  k3.heads = 3;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k3, k3, out); },
                                 {"q has 4 heads and k 3", "multiple"});
  auto wide = k;
  wide.head_dim = 8;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, wide, wide, out); },
                                 {"head_dim must be the same"});
  auto short_v = v;
  short_v.rows = 3;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, short_v, out); },
                                 {"v (2, 2, 3, 16)", "expected the same shape"});
  // out starts and ends inside v's buffer: a view running past v's end could also reach what
  // the allocator placed after it (q's buffer, when the heap laid them out so).
  std::vector<float> v_then_out(data.v.size() + data.out.size());
  std::copy(data.v.begin(), data.v.end(), v_then_out.begin());
  const auto v_inside = data.view<const float>(v_then_out.data(), c.kv_heads, c.keys);
  expect_error<invalid_argument>(
      [&] {
        mha::attention(backend, q, k, v_inside, data.view(v_then_out.data() + 4, c.heads, c.rows));
      },
      {"out may overlap v"});
  auto null_q = q;
  null_q.data = nullptr;
  expect_error<invalid_argument>([&] { mha::attention(backend, null_q, k, v, out); },
                                 {"q of shape (2, 4, 5, 16) has no data"});
  auto huge = q;
  huge.head_stride = std::int64_t{1} << 62;  // 3 of them pass 2^63
  expect_error<invalid_argument>([&] { mha::attention(backend, huge, k, v, out); },
                                 {"reach past 2^63"});
  mha::attention_options o;
  o.mask = {attention_mask::kind::additive, data.additive.data(), 3, 1, 5, 9, 45, 0, 9};
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"mask's batch (3) must be 2 or 1"});
  o.mask = {attention_mask::kind::additive, data.additive.data(), 2, 1, 5, 8, 45, 0, 9};
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"the mask is (2, 1, 5, 8), expected (2 or 1, 4 or 1, 5, 9)"});
  o.mask = {attention_mask::kind::boolean, data.keep.data(), 2, 1, 5, 9, std::int64_t{1} << 62, 0,
            std::int64_t{1} << 62};
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"the mask's strides", "reach past 2^63"});
  o = {};
  o.scale = std::numeric_limits<float>::infinity();
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"scale (inf) must be finite"});
  o = {};
  o.precision = mha::precision::int8;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"precision int8"});
  o = {};
  o.threads = -1;
  expect_error<invalid_argument>([&] { mha::attention(backend, q, k, v, out, o); },
                                 {"threads (-1)"});
  const std::vector<mha::bfloat16> words(data.q.size() + data.k.size());
  const auto q16 = data.view<const mha::bfloat16>(words.data(), c.heads, c.rows);
  const auto k16 = data.view<const mha::bfloat16>(words.data() + data.q.size(), c.kv_heads, c.keys);
  expect_error<invalid_argument>(
      [&] { mha::attention(backend, q16, k16, k16, out); },
      {"q, k and v are bfloat16 and the precision is fp32", "computed in precision bf16"});
  o = {};
  o.precision = mha::precision::bf16;
  expect_error<invalid_argument>(
      [&] {
        mha::attention(
            backend, q16, k16, k16,
            data.view(reinterpret_cast<float*>(const_cast<mha::bfloat16*>(words.data())) + 2,
                      c.heads, c.rows),
            o);
      },
      {"out may overlap q"});
}

}  // namespace
