// The attention call's extensions (docs/design.md §1.9): sliding windows, soft-capping and
// sinks, on every backend that runs the call, against the float64 reference of
// attention_call_data.hpp written from their definitions. Windows shorter and longer than the
// rows, on the block path (prefill), a chunk over more keys, a decode step over keys split into
// chunks; with masks, grouped heads, head sizes of every path, bf16; keys outside a window never
// read; bitwise the same for every thread count; the errors they name.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_call_data.hpp"
#include "int8_bounds.hpp"
#include "mha/mha.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using namespace mha_test::attention_call;
using mha::precision;
using mha_test::int8_bound;
using mha_test::int8_kernels_tolerance;

template <class T>
heads_view<T> dense(T* data, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) {
  return heads_view<T>::dense(data, b, h, t, d);
}

call_case windowed(std::int64_t rows, std::int64_t keys, std::int64_t window) {
  call_case c;
  c.rows = rows;
  c.keys = keys;
  c.window = window;
  c.causal = true;
  c.alignment = causal_alignment::bottom_right;
  return c;
}

std::vector<call_case> extension_cases() {
  std::vector<call_case> cases;
  // Windows of 1 key, shorter than a key tile, a tile and longer; rows == keys (a prefill),
  // a chunk over more keys, a decode step (split into chunks past 2048 keys, the window's keys
  // alone counted).
  for (const auto& [rows, keys] :
       {std::pair{9, 9}, {300, 300}, {64, 1100}, {1, 37}, {1, 5000}, {5, 600}}) {
    for (const std::int64_t window : {1, 5, 64, 257, 3000}) {
      if (window >= keys && window != 3000) continue;
      cases.push_back(windowed(rows, keys, window));
    }
  }
  // A decode step whose window's first key (1) rounds down to the key step (0), making its keys
  // one more than the window and one more split chunk (2049 keys of 2048: 2 chunks; 4097: 3).
  for (const std::int64_t window : {2048, 4096}) cases.push_back(windowed(1, window + 1, window));
  // Every head size's path (narrow, odd, registers), grouped heads, multi-query, a top-left
  // prefill, (B, T, H, D) buffers, with a mask.
  for (const std::int64_t head_dim : {3, 8, 64, 256}) {
    call_case c = windowed(40, 40, 16);
    c.head_dim = head_dim;
    c.kv_heads = head_dim == 256 ? 1 : 2;
    c.alignment = causal_alignment::top_left;
    cases.push_back(c);
  }
  call_case c = windowed(33, 90, 20);
  c.mask = attention_mask::kind::boolean;
  c.transposed = true;
  cases.push_back(c);
  c.mask = attention_mask::kind::additive;
  cases.push_back(c);
  // Soft-capping (Gemma 2's 50, and a cap the scores reach), alone, with a mask, with a window.
  for (const float cap : {50.0f, 0.5f}) {
    c = {};
    c.softcap = cap;
    cases.push_back(c);
    c.causal = true;
    c.mask = attention_mask::kind::additive;
    c.rows = 40;
    c.keys = 300;
    cases.push_back(c);
    c = windowed(300, 300, 64);
    c.softcap = cap;
    cases.push_back(c);
  }
  // Sinks (one of them far above every score), alone, with a window, over split keys, with a
  // mask whose row sees no key (zeros, sink or not).
  c = {};
  c.sinks = true;
  cases.push_back(c);
  c = windowed(200, 200, 30);
  c.sinks = true;
  cases.push_back(c);
  c = windowed(1, 5000, 0);
  c.sinks = true;
  cases.push_back(c);
  c = windowed(1, 5000, 2500);
  c.sinks = true;
  c.softcap = 30.0f;
  cases.push_back(c);
  c = {};
  c.sinks = true;
  c.mask = attention_mask::kind::boolean;
  cases.push_back(c);
  // bf16, and bf16 operands read in place (decode) or packed, with all three.
  for (const bool operands : {false, true}) {
    for (const auto& [rows, keys] : {std::pair{1, 700}, {70, 300}, {1, 5000}}) {
      c = windowed(rows, keys, 100);
      c.head_dim = 64;
      c.precision = mha::precision::bf16;
      c.bf16_operands = operands;
      c.softcap = 20.0f;
      c.sinks = true;
      cases.push_back(c);
    }
  }
  return cases;
}

class AttentionExtensions : public testing::TestWithParam<call_case> {};

// Every backend agrees with the float64 reference (bounds as the plain call's tests).
TEST_P(AttentionExtensions, EveryBackendMatchesTheReference) {
  const call_case c = GetParam();
  call_data data(c);
  const std::vector<double> want = data.reference();
  const double bound = c.precision == mha::precision::bf16 ? 4e-3 : 2e-5;
  int ran = 0;
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(c.precision)) continue;
    SCOPED_TRACE(label);
    data.run(*backend);
    ++ran;
    EXPECT_LE(mha_test::max_abs_diff(data.out, want), bound);
  }
  EXPECT_GE(ran, 1);
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionExtensions, testing::ValuesIn(extension_cases()),
                         [](const auto& p) { return p.param.name(); });

// A window is not the same function as plain causal attention once the rows pass it: the
// reference's own check, so that the cases above prove something.
TEST(AttentionExtensions, AWindowShorterThanTheRowsChangesTheResult) {
  call_case c = windowed(64, 64, 16);
  call_data with(c);
  c.window = 0;
  call_data without(c);
  const std::vector<double> a = with.reference(), b = without.reference();
  double most = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) most = std::max(most, std::fabs(a[i] - b[i]));
  EXPECT_GT(most, 0.05);
}

// Keys a step or more before a row's window are never read: NaN there leaves every result
// finite and the reference's (prefill blocks and a split decode step).
TEST(AttentionExtensions, KeysBeforeTheWindowAreNeverRead) {
  for (const auto& [rows, keys, window] :
       {std::tuple{1, 6000, 300}, {1, 6000, 2600}, {200, 1200, 100}}) {
    call_case c = windowed(rows, keys, window);
    c.batch = 1;
    call_data data(c);
    const std::vector<double> want = data.reference();
    // Keys every row's window starts 64 or more keys after (the first row's window start, less
    // a key step of 64 keys).
    const std::int64_t first_row_start = keys - rows - window + 1, margin = 64;
    for (std::int64_t g = 0; g < c.kv_heads; ++g) {
      for (std::int64_t j = 0; j < first_row_start - margin; ++j) {
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          const auto at = static_cast<std::size_t>((g * keys + j) * c.head_dim + d);
          data.k[at] = data.v[at] = std::nanf("");
        }
      }
    }
    for (const auto& [label, backend] : mha_test::backend_cases()) {
      if (!backend->supports_attention(c.precision)) continue;
      SCOPED_TRACE(label + " " + c.name());
      data.run(*backend);
      EXPECT_LE(mha_test::max_abs_diff(data.out, want), 2e-5);
    }
  }
}

// A window's split decode step, sinks and soft-caps give the same bits for every thread count.
TEST(AttentionExtensions, EveryThreadCountGivesTheSameBits) {
  call_case c = windowed(1, 9000, 5000);
  c.sinks = true;
  c.softcap = 10.0f;
  call_data data(c);
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    if (!backend->supports_attention(c.precision) || backend->max_threads() == 1) continue;
    SCOPED_TRACE(label);
    data.run(*backend, 1);
    const std::vector<float> one = data.out;
    for (const int threads : {2, 3}) {
      data.run(*backend, threads);
      EXPECT_EQ(data.out, one) << threads << " threads";
    }
  }
}

// A sliding window's cache (make_attention_cache with a window): a ring of ring_slots(window)
// tokens per sequence, whatever the capacity, read in key order. A prefill longer than the ring
// (taken ring_chunk tokens at a time), single steps that wrap it several times, a chunk, a
// rollback; each call against the windowed call over every key the sequence has seen (fp32:
// rounding; bf16: its step; int8: the naive backend's ring within the kernels' bound; k8v4 and
// int4 the same, their 4-bit codes' worst case being no useful bound against the exact call).
void ring_stream(const mha::backend& backend) {
  const std::int64_t batch = 2, heads = 4, kv_heads = 2, d = 16, window = 40, capacity = 5000;
  for (const precision kv :
       {precision::fp32, precision::bf16, precision::int8, precision::k8v4, precision::int4}) {
    const precision compute = kv == precision::bf16 ? precision::bf16 : precision::fp32;
    mha::kv_cache cache =
        mha::make_attention_cache(backend, batch, capacity, kv_heads, d, kv, compute, window);
    mha::kv_cache naive = mha::make_attention_cache(mha::naive_backend(), batch, capacity, kv_heads,
                                                    d, kv, compute, window);
    EXPECT_EQ(cache.window(), window);
    EXPECT_EQ(cache.slots(), mha::ring_slots(window));
    EXPECT_LT(cache.bytes(), static_cast<std::size_t>(2 * batch * kv_heads * capacity * d));
    std::mt19937 rng(11);
    std::int64_t fed = 0;
    const auto random = [&](std::int64_t n) {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> t(static_cast<std::size_t>(n));
      for (float& x : t) x = u(rng);
      return t;
    };
    std::vector<std::vector<float>> keys(batch), values(batch);  // (H_kv, seen, D) per sequence
    const auto call = [&](std::int64_t t) {
      std::vector<float> q = random(batch * heads * t * d), k = random(batch * kv_heads * t * d),
                         v = random(batch * kv_heads * t * d);
      std::vector<float> out(q.size()), out_naive(q.size());
      mha::attention_options o;
      o.causal = true;
      o.alignment = mha::causal_alignment::bottom_right;
      o.precision = compute;
      mha::attention(backend, dense<const float>(q.data(), batch, heads, t, d),
                     dense<const float>(k.data(), batch, kv_heads, t, d),
                     dense<const float>(v.data(), batch, kv_heads, t, d), cache,
                     dense(out.data(), batch, heads, t, d), o);
      mha::attention(mha::naive_backend(), dense<const float>(q.data(), batch, heads, t, d),
                     dense<const float>(k.data(), batch, kv_heads, t, d),
                     dense<const float>(v.data(), batch, kv_heads, t, d), naive,
                     dense(out_naive.data(), batch, heads, t, d), o);
      double error = 0.0, naive_error = 0.0;
      for (std::int64_t b = 0; b < batch; ++b) {
        const std::int64_t before = cache.length(b) - t, after = before + t;
        std::vector<float> all_k(static_cast<std::size_t>(kv_heads * after * d)),
            all_v(all_k.size());
        for (std::int64_t g = 0; g < kv_heads; ++g) {
          for (std::int64_t j = 0; j < after; ++j) {
            const bool is_new = j >= before;
            const auto at = static_cast<std::size_t>(((b * kv_heads + g) * t + (j - before)) * d);
            const float* from_k = is_new ? &k[at] : &keys[b][(g * before + j) * d];
            const float* from_v = is_new ? &v[at] : &values[b][(g * before + j) * d];
            std::copy(from_k, from_k + d, &all_k[(g * after + j) * d]);
            std::copy(from_v, from_v + d, &all_v[(g * after + j) * d]);
          }
        }
        keys[b] = all_k;
        values[b] = all_v;
        std::vector<float> want(static_cast<std::size_t>(heads * t * d));
        o.alignment = mha::causal_alignment::bottom_right;
        o.window = window;
        mha::attention(mha::naive_backend(),
                       dense<const float>(&q[b * heads * t * d], 1, heads, t, d),
                       dense<const float>(all_k.data(), 1, kv_heads, after, d),
                       dense<const float>(all_v.data(), 1, kv_heads, after, d),
                       dense(want.data(), 1, heads, t, d), o);
        o.window = 0;
        for (std::size_t i = 0; i < want.size(); ++i) {
          const std::size_t at = static_cast<std::size_t>(b * heads * t * d) + i;
          error = std::max(error, std::abs(double{out[at]} - want[i]));
          naive_error = std::max(naive_error, std::abs(double{out[at]} - out_naive[at]));
        }
      }
      if (kv == precision::k8v4 || kv == precision::int4) {
        EXPECT_LE(naive_error, mha_test::kernels_tolerance(kv, d)) << t << " tokens after " << fed;
      } else if (kv == precision::int8) {
        EXPECT_LE(naive_error, int8_kernels_tolerance(d)) << t << " tokens after " << fed;
        EXPECT_LE(error, int8_bound(d)) << t << " tokens";
      } else {
        EXPECT_LE(error, kv == precision::bf16 ? 1.0 / 128 : 2e-6) << t << " tokens";
      }
      fed += t;
    };
    call(700);  // past the ring (384 slots) and ring_chunk: taken 256 tokens at a time
    for (int i = 0; i < 300; ++i) call(1);  // around the ring and past it
    call(5);
    for (mha::kv_cache* c : {&cache, &naive}) {
      for (std::int64_t b = 0; b < batch; ++b) c->truncate(b, c->length(b) - 3);
    }
    for (std::int64_t b = 0; b < batch; ++b) {  // the stream forgets them too
      const std::int64_t kept = cache.length(b);
      std::vector<float> k_kept, v_kept;
      for (std::int64_t g = 0; g < kv_heads; ++g) {
        const std::int64_t seen = static_cast<std::int64_t>(keys[b].size()) / (kv_heads * d);
        k_kept.insert(k_kept.end(), keys[b].begin() + g * seen * d,
                      keys[b].begin() + (g * seen + kept) * d);
        v_kept.insert(v_kept.end(), values[b].begin() + g * seen * d,
                      values[b].begin() + (g * seen + kept) * d);
      }
      keys[b] = k_kept;
      values[b] = v_kept;
    }
    call(1);
    call(4);
    expect_error<mha::invalid_argument>([&] { cache.truncate(0, cache.length(0) - 300); },
                                        {"at most that many can be taken back"});
  }
}

TEST(AttentionExtensions, AWindowsRingMatchesTheWindowedCallOverEveryKey) {
  for (const auto& [label, on] : mha_test::backend_cases()) {
    if (!on->supports_attention(precision::fp32)) continue;
    SCOPED_TRACE(label);
    ring_stream(*on);
  }
}

// A coded ring takes a long call ring_chunk tokens at a time, but sets a sequence's key channel
// scales from all of the call's keys (base/int8.hpp: its prompt's), as a cache that takes the
// call whole does: a window of 500 over a ring (capacity 5000) and over a cache too short to
// need one (capacity 700 < its 896 slots), fed the same 700 tokens in one call whose key channel
// 3 grows eightfold after token 300, hold the same codes, so their outputs differ by the
// schedule's rounding only (scales from the first 256 keys alone moved them by 3.4e-3).
TEST(AttentionExtensions, ACodedRingSetsItsChannelScalesFromTheWholeCall) {
  const std::int64_t heads = 2, kv_heads = 1, d = 16, t = 700, window = 500;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto random = [&](std::int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = u(rng);
    return x;
  };
  const std::vector<float> q = random(heads * t * d), v = random(kv_heads * t * d);
  std::vector<float> k = random(kv_heads * t * d);
  for (std::int64_t i = 300; i < t; ++i) k[static_cast<std::size_t>(i * d + 3)] *= 8.0f;
  int ran = 0;
  for (const auto& [label, on] : mha_test::backend_cases()) {
    if (!on->supports_attention(precision::fp32)) continue;
    for (const precision kv : {precision::int8, precision::k8v4, precision::int4}) {
      SCOPED_TRACE(label + " " + std::string(mha::to_string(kv)));
      mha::kv_cache ring =
          mha::make_attention_cache(*on, 1, 5000, kv_heads, d, kv, precision::fp32, window);
      mha::kv_cache whole =
          mha::make_attention_cache(*on, 1, t, kv_heads, d, kv, precision::fp32, window);
      ASSERT_LT(ring.slots(), ring.capacity());
      ASSERT_EQ(whole.slots(), whole.capacity());
      std::vector<float> out_ring(q.size()), out_whole(q.size());
      mha::attention_options o;
      o.causal = true;
      o.alignment = mha::causal_alignment::bottom_right;
      for (auto [cache, out] : {std::pair{&ring, &out_ring}, std::pair{&whole, &out_whole}}) {
        mha::attention(*on, dense<const float>(q.data(), 1, heads, t, d),
                       dense<const float>(k.data(), 1, kv_heads, t, d),
                       dense<const float>(v.data(), 1, kv_heads, t, d), *cache,
                       dense(out->data(), 1, heads, t, d), o);
      }
      EXPECT_LE(mha_test::max_abs_diff(out_ring, out_whole), 2e-5);
      ++ran;
    }
  }
  EXPECT_GE(ran, 6);
}

// A plan with a sliding window (config::window: a model folder's Mistral or Qwen2 layer): every
// backend that computes it, in every formulation, with grouped heads and RoPE, against the
// float64 reference over rows past the window; decoding through a cache (plain and int8) gives
// the full forward's rows; backends without windows say so.
TEST(AttentionExtensions, PlansWithAWindowMatchTheReference) {
  mha_test::shape s{2, 70, 24, 32, 4, true, true, true, 2, 10000.0};
  mha::config cfg = s.config();
  cfg.window = 16;
  const mha::weights w = mha::weights::random(cfg, 3);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 5, 2.0f);
  const std::vector<double> want = mha_reference::forward(cfg, w, x, s.batch, s.seq_len);
  mha::config plain = cfg;
  plain.window = 0;
  EXPECT_GT(mha_test::max_abs_diff(std::vector<float>(want.begin(), want.end()),
                                   mha_reference::forward(plain, w, x, s.batch, s.seq_len)),
            1e-2);  // past the window, a different function
  int ran = 0;
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    for (const mha::formulation form : mha::formulations()) {
      SCOPED_TRACE(label + " " + std::string(mha::to_string(form)));
      if (const mha::support why = backend->supports(mha::problem{cfg, form}); !why) {
        EXPECT_THAT(why.reason(), testing::HasSubstr("a sliding window (window 16)"));
        continue;
      }
      ++ran;
      const auto p = backend->prepare(cfg, form, w);
      std::vector<float> y(want.size());
      p->run({x.data(), s.batch, s.seq_len, s.d_in}, {y.data(), s.batch, s.seq_len, s.d_out});
      EXPECT_LE(mha_test::max_abs_diff(y, want), 2e-5 * std::max(1.0, mha_test::max_abs(want)));
      if (!backend->supports(mha::problem{cfg, form, s.batch, 1, 40})) continue;
      for (const precision kv : {precision::fp32, precision::int8}) {
        if (!backend->supports(mha::problem{cfg, form, s.batch, 1, 40, kv})) continue;
        // A prefill of 40 (past the window), then one token at a time.
        mha::kv_cache cache = p->make_cache(s.batch, s.seq_len, kv);
        std::vector<float> got(want.size());
        for (std::int64_t at = 0; at < s.seq_len;) {
          const std::int64_t t = at == 0 ? 40 : 1;
          std::vector<float> xs, ys(static_cast<std::size_t>(s.batch * t * s.d_out));
          for (std::int64_t b = 0; b < s.batch; ++b) {
            const auto from = x.begin() + (b * s.seq_len + at) * s.d_in;
            xs.insert(xs.end(), from, from + t * s.d_in);
          }
          p->run({xs.data(), s.batch, t, s.d_in}, {ys.data(), s.batch, t, s.d_out}, cache);
          for (std::int64_t b = 0; b < s.batch; ++b) {
            std::copy_n(ys.begin() + b * t * s.d_out, t * s.d_out,
                        got.begin() + (b * s.seq_len + at) * s.d_out);
          }
          at += t;
        }
        EXPECT_LE(mha_test::max_abs_diff(got, want),
                  (kv == precision::int8 ? 5e-2 : 2e-5) * std::max(1.0, mha_test::max_abs(want)))
            << mha::to_string(kv);
      }
    }
  }
  EXPECT_GE(ran, 3);
}

TEST(AttentionExtensions, BadValuesAreNamed) {
  default_views d;
  const auto [q, k, v, out] = d.operands();
  const auto call = [&](const mha::attention_options& o) {
    return [&, o] { mha::attention(mha::naive_backend(), q, k, v, out, o); };
  };
  mha::attention_options o;
  o.causal = true;
  o.window = -3;
  expect_error<mha::invalid_argument>(call(o), {"window (-3) must be >= 0"});
  o.window = 4;
  o.causal = false;
  expect_error<mha::invalid_argument>(call(o), {"a sliding window (4) is causal"});
  o.causal = true;
  o.alignment = causal_alignment::top_left;
  default_views rows_past_keys;
  rows_past_keys.c.rows = 12;
  rows_past_keys.c.keys = 5;
  rows_past_keys.data = call_data(rows_past_keys.c);
  const auto [q2, k2, v2, out2] = rows_past_keys.operands();
  expect_error<mha::invalid_argument>(
      [&] { mha::attention(mha::naive_backend(), q2, k2, v2, out2, o); },
      {"a sliding window with 12 query rows over 5 keys, causal top-left"});
  o = {};
  o.softcap = -1.0f;
  expect_error<mha::invalid_argument>(call(o), {"softcap (-1) must be finite and >= 0"});
  o.softcap = std::numeric_limits<float>::infinity();
  expect_error<mha::invalid_argument>(call(o), {"softcap (inf) must be finite"});
  o = {};
  const std::vector<float> three(3, 0.0f), nan_sink = {0.0f, std::nanf(""), 0.0f, 0.0f};
  o.sinks = three;
  expect_error<mha::invalid_argument>(call(o), {"3 sinks for 4 query heads"});
  o.sinks = nan_sink;
  expect_error<mha::invalid_argument>(call(o), {"the sink of head 1 is nan"});
}

}  // namespace
