// mha::attention (mha/attention.hpp): every backend that runs it against a float64 reference of
// SDPA's meaning written here from its definition (mask matrix first, then the softmax), over
// query rows shorter, equal and longer than the keys, both causal alignments, additive and
// boolean masks (broadcast, rows that see no key), grouped heads, strided inputs and bf16; the
// errors it names.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "mha/mha.hpp"
#include "support.hpp"

namespace {

using mha::attention_mask;
using mha::causal_alignment;
using mha::heads_view;
using mha_test::expect_error;

constexpr float minus_inf = -std::numeric_limits<float>::infinity();

struct call_case {
  std::int64_t batch = 2, heads = 4, kv_heads = 2, rows = 5, keys = 9, head_dim = 16;
  bool causal = false;
  causal_alignment alignment = causal_alignment::top_left;
  attention_mask::kind mask = attention_mask::kind::none;
  bool mask_per_batch = true, mask_per_head = false;
  bool transposed = false;  // q, k, v and out as (B, T, H, D) buffers seen through strides
  mha::precision precision = mha::precision::fp32;
  bool bf16_operands = false;  // q, k and v passed as bfloat16 (the values rounded to bf16)
  bool bf16_out = false;       // with bf16_operands: out in bfloat16 (widened into `out`)

  std::string name() const {
    std::string n;
    for (const auto& [key, value] : {std::pair{"b", batch},
                                     {"_h", heads},
                                     {"_kv", kv_heads},
                                     {"_l", rows},
                                     {"_s", keys},
                                     {"_d", head_dim}}) {
      n += key;
      n += std::to_string(value);
    }
    if (causal) n += alignment == causal_alignment::top_left ? "_topleft" : "_bottomright";
    if (mask == attention_mask::kind::additive) n += "_additive";
    if (mask == attention_mask::kind::boolean) n += "_boolean";
    if (mask != attention_mask::kind::none && !mask_per_batch) n += "_maskb1";
    if (mask != attention_mask::kind::none && mask_per_head) n += "_maskperhead";
    if (transposed) n += "_bthd";
    if (precision == mha::precision::bf16) n += "_bf16";
    if (bf16_operands) n += "_operands";
    if (bf16_out) n += "_out";
    return n;
  }
};

// Tensors of one case, with the mask's rows: the last query row of batch 0 sees no key (every
// key masked), other entries masked at random (a quarter), additive values in [-2, 2].
struct call_data {
  call_case c;
  std::vector<float> q, k, v, out, additive;
  std::vector<unsigned char> keep;

  explicit call_data(const call_case& cc, std::uint32_t seed = 7) : c(cc) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto fill = [&](std::vector<float>& t, std::int64_t n) {
      t.resize(static_cast<std::size_t>(n));
      for (float& x : t) x = u(rng);
    };
    fill(q, c.batch * c.heads * c.rows * c.head_dim);
    fill(k, c.batch * c.kv_heads * c.keys * c.head_dim);
    fill(v, c.batch * c.kv_heads * c.keys * c.head_dim);
    out.assign(q.size(), std::nanf(""));
    const std::int64_t mb = c.mask_per_batch ? c.batch : 1, mh = c.mask_per_head ? c.heads : 1;
    const std::int64_t n = mb * mh * c.rows * c.keys;
    additive.resize(static_cast<std::size_t>(n));
    keep.resize(static_cast<std::size_t>(n));
    std::uniform_int_distribution<int> quarter(0, 3);
    for (std::int64_t i = 0; i < n; ++i) {
      const bool masked = quarter(rng) == 0 || i / c.keys == c.rows - 1;  // row L-1 of (0, 0)
      keep[static_cast<std::size_t>(i)] = masked ? 0 : 1;
      additive[static_cast<std::size_t>(i)] = masked ? minus_inf : 2.0f * u(rng);
    }
  }

  // A (B, H, T, D) view of t, or of t laid out as (B, T, H, D).
  template <class T>
  heads_view<T> view(T* t, std::int64_t heads, std::int64_t rows) const {
    if (!c.transposed) return heads_view<T>::dense(t, c.batch, heads, rows, c.head_dim);
    return {t,          c.batch,           heads, rows, c.head_dim, rows * heads * c.head_dim,
            c.head_dim, heads * c.head_dim};
  }
  float at(const std::vector<float>& t, std::int64_t heads, std::int64_t rows, std::int64_t b,
           std::int64_t h, std::int64_t i, std::int64_t d) const {
    const heads_view<const float> w = view<const float>(t.data(), heads, rows);
    return w.data[b * w.batch_stride + h * w.head_stride + i * w.row_stride + d];
  }
  std::int64_t mask_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return (((c.mask_per_batch ? b : 0) * (c.mask_per_head ? c.heads : 1) +
             (c.mask_per_head ? h : 0)) *
                c.rows +
            i) *
               c.keys +
           j;
  }

  mha::attention_options options() const {
    mha::attention_options o;
    o.causal = c.causal;
    o.alignment = c.alignment;
    o.precision = c.precision;
    if (c.mask != attention_mask::kind::none) {
      const bool boolean = c.mask == attention_mask::kind::boolean;
      const std::int64_t mb = c.mask_per_batch ? c.batch : 1, mh = c.mask_per_head ? c.heads : 1;
      o.mask = {c.mask,
                boolean ? static_cast<const void*>(keep.data()) : additive.data(),
                mb,
                mh,
                c.rows,
                c.keys,
                c.mask_per_batch ? mh * c.rows * c.keys : 0,
                c.mask_per_head ? c.rows * c.keys : 0,
                c.keys};
    }
    return o;
  }

  void run(const mha::backend& backend, int threads = 0) {
    mha::attention_options o = options();
    o.threads = threads;
    if (c.bf16_operands) {
      const auto words = [](const std::vector<float>& t) {
        std::vector<mha::bfloat16> w(t.size());
        for (std::size_t i = 0; i < t.size(); ++i) w[i] = {mha::detail::to_bf16(t[i])};
        return w;
      };
      const std::vector<mha::bfloat16> q16 = words(q), k16 = words(k), v16 = words(v);
      const auto q_view = view<const mha::bfloat16>(q16.data(), c.heads, c.rows);
      const auto k_view = view<const mha::bfloat16>(k16.data(), c.kv_heads, c.keys);
      const auto v_view = view<const mha::bfloat16>(v16.data(), c.kv_heads, c.keys);
      if (!c.bf16_out) {
        mha::attention(backend, q_view, k_view, v_view, view(out.data(), c.heads, c.rows), o);
        return;
      }
      std::vector<mha::bfloat16> out16(out.size(), mha::bfloat16{0x7fc0});  // NaN
      mha::attention(backend, q_view, k_view, v_view, view(out16.data(), c.heads, c.rows), o);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = mha::detail::from_bf16(out16[i].bits);
      return;
    }
    mha::attention(backend, view<const float>(q.data(), c.heads, c.rows),
                   view<const float>(k.data(), c.kv_heads, c.keys),
                   view<const float>(v.data(), c.kv_heads, c.keys),
                   view(out.data(), c.heads, c.rows), o);
  }

  // SDPA's definition in float64 (bf16: q, k and v rounded first, as the kernels' operands are).
  std::vector<double> reference() const {
    const bool bf16 = c.precision == mha::precision::bf16;
    const auto operand = [&](float x) {
      return bf16 ? static_cast<double>(mha::detail::round_bf16(x)) : static_cast<double>(x);
    };
    std::vector<double> y(q.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    const std::int64_t group = c.heads / c.kv_heads;
    for (std::int64_t b = 0; b < c.batch; ++b) {
      for (std::int64_t h = 0; h < c.heads; ++h) {
        for (std::int64_t i = 0; i < c.rows; ++i) {
          std::vector<double> s(static_cast<std::size_t>(c.keys), -INFINITY);
          double max = -INFINITY;
          for (std::int64_t j = 0; j < c.keys; ++j) {
            const std::int64_t limit = c.alignment == causal_alignment::top_left
                                           ? i
                                           : i + c.keys - c.rows;  // attends to j <= limit
            if (c.causal && j > limit) continue;
            double bias = 0.0;
            if (c.mask == attention_mask::kind::boolean && !keep[mask_index(b, h, i, j)]) continue;
            if (c.mask == attention_mask::kind::additive) bias = additive[mask_index(b, h, i, j)];
            if (bias == -INFINITY) continue;
            double dot = 0.0;
            for (std::int64_t d = 0; d < c.head_dim; ++d) {
              dot += operand(at(q, c.heads, c.rows, b, h, i, d)) *
                     operand(at(k, c.kv_heads, c.keys, b, h / group, j, d));
            }
            s[j] = scale * dot + bias;
            max = std::max(max, s[j]);
          }
          double sum = 0.0;
          for (double& x : s) sum += x = x == -INFINITY ? 0.0 : std::exp(x - max);
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            double o = 0.0;
            for (std::int64_t j = 0; j < c.keys; ++j)
              if (s[j] != 0.0) o += s[j] * operand(at(v, c.kv_heads, c.keys, b, h / group, j, d));
            const heads_view<const float> w = view<const float>(nullptr, c.heads, c.rows);
            y[b * w.batch_stride + h * w.head_stride + i * w.row_stride + d] =
                sum == 0.0 ? 0.0 : o / sum;
          }
        }
      }
    }
    return y;
  }
};

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

// The default case's data and its views, for the tests of bad arguments.
struct default_views {
  call_case c;
  call_data data{c};

  struct views {
    heads_view<const float> q, k, v;
    heads_view<float> out;
  };
  views operands() {
    return {data.view<const float>(data.q.data(), c.heads, c.rows),
            data.view<const float>(data.k.data(), c.kv_heads, c.keys),
            data.view<const float>(data.v.data(), c.kv_heads, c.keys),
            data.view(data.out.data(), c.heads, c.rows)};
  }
};

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
  const call_case& c = views.c;
  call_data& data = views.data;
  const auto& [q, k, v, out] = views.operands();
  using mha::invalid_argument;
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

TEST(AttentionCall, BadArgumentsAreNamed) {
  const mha::backend& backend = mha::naive_backend();
  default_views views;
  const call_case& c = views.c;
  call_data& data = views.data;
  const auto& [q, k, v, out] = views.operands();
  using mha::invalid_argument;
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
