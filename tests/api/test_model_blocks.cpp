// The module axes of the models people run now (docs/design.md §1.9, §1.10): an out projection
// back to a width of its own (config::out_features: Gemma, gpt-oss, Mistral NeMo), q/k norms
// (config::qk_norm: Gemma 3, Qwen3), logit soft-capping (config::softcap: Gemma 2) and attention
// sinks (config::sinks: gpt-oss), on every backend and formulation against the float64
// reference, forward and decoding through fp32 and int8 caches, with a sliding window, grouped
// heads and RoPE as Gemma 3's layers have them; what makes each axis the function it claims; the
// errors they name.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace {

using mha::precision;
using mha_test::expect_error;

// Gemma 3's layer in small: 4 query heads over 2 K/V heads of 8, an inner width (32) apart from
// the hidden size (24 in, 40 out, so neither is the other), q/k norms, RoPE, a window of 16,
// Gemma 2's soft-capping at a cap the scores reach, and gpt-oss's sinks.
mha::config gemma_like() {
  mha::config cfg;
  cfg.d_in = 24;
  cfg.d_out = 32;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 2;
  cfg.context_length = 70;
  cfg.rope_base = 10000.0;
  cfg.out_proj_bias = false;
  cfg.out_features = 40;
  cfg.qk_norm = true;
  cfg.window = 16;
  cfg.softcap = 1.5;
  cfg.sinks = true;
  return cfg;
}

std::vector<float> run(const mha::backend& backend, mha::formulation form, const mha::config& cfg,
                       const mha::weights& w, const std::vector<float>& x, std::int64_t batch,
                       std::int64_t seq_len) {
  const auto p = backend.prepare(cfg, form, w);
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.out_width()));
  p->run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.out_width()});
  return y;
}

TEST(ModelBlocks, EveryBackendMatchesTheReferenceForwardAndDecoding) {
  const mha::config cfg = gemma_like();
  const std::int64_t batch = 2, seq_len = 70;
  const mha::weights w = mha::weights::random(cfg, 11);
  ASSERT_EQ(w.out_proj.out, 40);
  ASSERT_EQ(w.q_norm.size(), 8u);
  const std::vector<float> x =
      mha_test::random_floats(static_cast<std::size_t>(batch * seq_len * cfg.d_in), 5, 2.0f);
  const std::vector<double> want = mha_reference::forward(cfg, w, x, batch, seq_len);
  ASSERT_EQ(want.size(), static_cast<std::size_t>(batch * seq_len * 40));
  mha::config uncapped = cfg;
  uncapped.softcap = 0.0;
  EXPECT_GT(mha_test::max_abs_diff(std::vector<float>(want.begin(), want.end()),
                                   mha_reference::forward(uncapped, w, x, batch, seq_len)),
            1e-2);  // the cap changes the function here
  mha::config sinkless = cfg;
  sinkless.sinks = false;
  mha::weights without_sinks = w;
  without_sinks.sinks.clear();
  EXPECT_GT(
      mha_test::max_abs_diff(std::vector<float>(want.begin(), want.end()),
                             mha_reference::forward(sinkless, without_sinks, x, batch, seq_len)),
      1e-2);  // and so do the sinks
  const double scale = std::max(1.0, mha_test::max_abs(want));
  int ran = 0;
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    for (const mha::formulation form : mha::formulations()) {
      SCOPED_TRACE(label + " " + std::string(mha::to_string(form)));
      if (const mha::support why = backend->supports(mha::problem{cfg, form}); !why) {
        EXPECT_THAT(why.reason(), testing::HasSubstr("is not implemented"));  // oneDNN
        continue;
      }
      ++ran;
      EXPECT_LE(mha_test::max_abs_diff(run(*backend, form, cfg, w, x, batch, seq_len), want),
                2e-5 * scale);
      const auto p = backend->prepare(cfg, form, w);
      for (const precision kv : {precision::fp32, precision::int8}) {
        if (!backend->supports(mha::problem{cfg, form, batch, 1, 40, kv})) continue;
        // A prefill of 40 (past the window), then one token at a time: each key normalised
        // once, as it enters the cache.
        mha::kv_cache cache = p->make_cache(batch, seq_len, kv);
        std::vector<float> got(want.size());
        for (std::int64_t at = 0; at < seq_len;) {
          const std::int64_t t = at == 0 ? 40 : 1;
          std::vector<float> xs, ys(static_cast<std::size_t>(batch * t * 40));
          for (std::int64_t b = 0; b < batch; ++b) {
            const auto from = x.begin() + (b * seq_len + at) * cfg.d_in;
            xs.insert(xs.end(), from, from + t * cfg.d_in);
          }
          p->run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, 40}, cache);
          for (std::int64_t b = 0; b < batch; ++b) {
            std::copy_n(ys.begin() + b * t * 40, t * 40, got.begin() + (b * seq_len + at) * 40);
          }
          at += t;
        }
        EXPECT_LE(mha_test::max_abs_diff(got, want), (kv == precision::int8 ? 5e-2 : 2e-5) * scale)
            << mha::to_string(kv);
      }
    }
  }
  EXPECT_GE(ran, 6);
}

// What makes the norms the function they claim: a q/k-normed module does not change when the Q
// and K projections are scaled (the norm divides the scale out; the reference without norms
// does change), and changes when a norm weight does.
TEST(ModelBlocks, TheNormsDivideOutTheProjectionsScale) {
  mha::config cfg = gemma_like();
  cfg.window = 0;
  const mha::weights w = mha::weights::random(cfg, 4);
  const std::vector<float> x = mha_test::random_floats(3 * 20 * 24, 6, 2.0f);
  mha::weights scaled = w;
  for (mha::linear_weights* l : {&scaled.query, &scaled.key}) {
    for (float& v : l->weight) v *= 8.0f;  // exact in binary floating point
  }
  const std::vector<float> y =
      run(mha::naive_backend(), mha::formulation::split_weight, cfg, w, x, 3, 20);
  EXPECT_LE(mha_test::max_abs_diff(y, run(mha::naive_backend(), mha::formulation::split_weight, cfg,
                                          scaled, x, 3, 20)),
            1e-5 * mha_test::max_abs(std::vector<double>(y.begin(), y.end())));
  mha::config plain = cfg;
  plain.qk_norm = false;
  mha::weights unnormed = w, unnormed_scaled = scaled;
  for (mha::weights* each : {&unnormed, &unnormed_scaled})
    each->q_norm.clear(), each->k_norm.clear();
  const std::vector<double> unscaled = mha_reference::forward(plain, unnormed, x, 3, 20);
  EXPECT_GT(mha_test::max_abs_diff(std::vector<float>(unscaled.begin(), unscaled.end()),
                                   mha_reference::forward(plain, unnormed_scaled, x, 3, 20)),
            1e-2);
  mha::weights other_norm = w;
  other_norm.k_norm[3] *= 3.0f;
  EXPECT_GT(mha_test::max_abs_diff(y, run(mha::naive_backend(), mha::formulation::split_weight, cfg,
                                          other_norm, x, 3, 20)),
            1e-3);
}

TEST(ModelBlocks, BadValuesAreNamed) {
  mha::config cfg = gemma_like();
  cfg.out_features = -2;
  expect_error<mha::invalid_argument>([&] { mha::validate(cfg); },
                                      {"out_features (-2) must be >= 0"});
  cfg.out_features = 40;
  cfg.out_proj = false;
  expect_error<mha::invalid_argument>(
      [&] { mha::validate(cfg); }, {"out_features (40)", "a module without out_proj takes none"});
  cfg = gemma_like();
  cfg.softcap = -1.0;
  expect_error<mha::invalid_argument>([&] { mha::validate(cfg); },
                                      {"softcap (-1) must be finite and >= 0"});
  cfg = gemma_like();
  mha::weights three_sinks = mha::weights::random(cfg, 1);
  three_sinks.sinks.pop_back();
  expect_error<mha::invalid_argument>([&] { mha::validate(cfg, three_sinks); },
                                      {"sinks holds 3 logits, expected n_heads = 4"});
  cfg.qk_norm_eps = 0.0;
  expect_error<mha::invalid_argument>([&] { mha::validate(cfg); },
                                      {"qk_norm_eps (0) must be finite and > 0"});
  cfg = gemma_like();
  mha::weights w = mha::weights::random(cfg, 1);
  w.k_norm.pop_back();
  expect_error<mha::invalid_argument>([&] { mha::validate(cfg, w); },
                                      {"k_norm.weight holds 7 elements, expected head_dim = 8"});
  mha::config plain = cfg;
  plain.qk_norm = false;
  w = mha::weights::random(cfg, 1);
  expect_error<mha::invalid_argument>([&] { mha::validate(plain, w); },
                                      {"q_norm.weight is present", "qk_norm = false"});
  plain = cfg;
  plain.out_features = 0;
  expect_error<mha::invalid_argument>([&] { mha::validate(plain, w); },
                                      {"out_proj.weight is (40, 32), expected (32, 32)"});
  // The output's width is out_features.
  const auto p = mha::naive_backend().prepare(cfg, mha::formulation::split_weight, w);
  std::vector<float> x(24), y(32);
  expect_error<mha::invalid_argument>(
      [&] {
        p->run({x.data(), 1, 1, 24}, {y.data(), 1, 1, 32});
      },
      {"expected (1, 1, 40)"});
}

TEST(ModelBlocks, TheProblemStringSpellsBothAxes) {
  const mha::problem p{gemma_like(), mha::formulation::split_weight, 1, 70};
  const std::string name = mha::to_string(p);
  EXPECT_THAT(name, testing::HasSubstr("/w16/cap1.5/sinks/"));
  EXPECT_THAT(name, testing::HasSubstr("/out40/qknorm1e-06"));
  EXPECT_EQ(mha::parse_problem(name).cfg, p.cfg);
  // The out projection counts out_features: 2 B T d_out out_features.
  mha::problem narrower = p;
  narrower.cfg.out_features = 0;
  EXPECT_DOUBLE_EQ(mha::flops(p) - mha::flops(narrower), 2.0 * 70 * 32 * (40 - 32));
  // A yarn rotary embedding's every parameter round-trips.
  mha::problem yarn = p;
  yarn.cfg.rope_scaling = {.kind = mha::rope_scaling::type::yarn,
                           .factor = 4.0,
                           .original_context = 16,
                           .beta_fast = 8.0,
                           .beta_slow = 0.5,
                           .truncate = false,
                           .attention_factor = 1.25};
  EXPECT_THAT(mha::to_string(yarn), testing::HasSubstr("/rope_yarn_4_8_0.5_16_1.25_0/"));
  EXPECT_EQ(mha::parse_problem(mha::to_string(yarn)).cfg, yarn.cfg);
}

// YaRN (gpt-oss): pairs that turn fewer than beta_slow times over the original context slowed by
// `factor`, those turning more than beta_fast times kept, and cos and sin scaled by the attention
// factor, which scales every score by its square; on every backend against the reference, whose
// unscaled function differs.
TEST(ModelBlocks, YarnsRotaryEmbeddingOnEveryBackend) {
  mha::config cfg = gemma_like();
  cfg.rope_scaling = {.kind = mha::rope_scaling::type::yarn,
                      .factor = 8.0,
                      .original_context = 4096,
                      .truncate = false};
  const std::vector<double> f = mha::rope_frequencies(cfg);
  mha::config plain = cfg;
  plain.rope_scaling = {};
  const std::vector<double> unscaled = mha::rope_frequencies(plain);
  ASSERT_EQ(f.size(), 4u);
  // head_dim 8, base 10^4, 4096 positions: the ramp runs from pair 1.31 (32 turns) to pair 2.81
  // (one turn): pairs 0 and 1 kept, pair 2 blended, pair 3 divided by the factor.
  EXPECT_EQ(f[0], unscaled[0]);
  EXPECT_EQ(f[1], unscaled[1]);
  EXPECT_LT(f[2], unscaled[2]);
  EXPECT_GT(f[2], unscaled[2] / 8.0);
  EXPECT_DOUBLE_EQ(f[3], unscaled[3] / 8.0);
  EXPECT_DOUBLE_EQ(mha::rope_amplitude(cfg), 0.1 * std::log(8.0) + 1.0);
  const mha::weights w = mha::weights::random(cfg, 5);
  const std::vector<float> x = mha_test::random_floats(2 * 30 * 24, 8, 2.0f);
  const std::vector<double> want = mha_reference::forward(cfg, w, x, 2, 30);
  EXPECT_GT(mha_test::max_abs_diff(std::vector<float>(want.begin(), want.end()),
                                   mha_reference::forward(plain, w, x, 2, 30)),
            1e-2);
  for (const auto& [label, backend] : mha_test::backend_cases()) {
    for (const mha::formulation form : mha::formulations()) {
      if (!backend->supports(mha::problem{cfg, form})) continue;
      SCOPED_TRACE(label + " " + std::string(mha::to_string(form)));
      EXPECT_LE(mha_test::max_abs_diff(run(*backend, form, cfg, w, x, 2, 30), want),
                2e-5 * std::max(1.0, mha_test::max_abs(want)));
    }
  }
  cfg.rope_scaling.beta_slow = 40.0;
  expect_error<mha::invalid_argument>(
      [&] { mha::validate(cfg); },
      {"beta_fast (32) and beta_slow (40)", "0 < beta_slow < beta_fast"});
}

}  // namespace
