// The public API's plain parts: registry, problem strings, FLOP formula, weights, views.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "mha/mha.hpp"
#include "support.hpp"

namespace {

TEST(Registry, NaiveIsAlwaysLast) {
  const auto& list = mha::available_backends();
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(list.back()->name(), "naive");
  EXPECT_EQ(list.back(), &mha::naive_backend());
}

TEST(Registry, NamesAreUniqueAndFound) {
  std::set<std::string_view> names;
  for (const mha::backend* b : mha::available_backends()) {
    EXPECT_TRUE(names.insert(b->name()).second) << b->name();
    EXPECT_EQ(mha::find_backend(b->name()), b);
    EXPECT_EQ(&mha::require_backend(b->name()), b);
    EXPECT_FALSE(b->description().empty());
  }
  EXPECT_EQ(mha::find_backend("no-such-backend"), nullptr);
}

// The registry holds exactly the backends CMake built, in their declared order (MHA_BACKEND_NAMES,
// written from the mha_add_backend calls).
TEST(Registry, ListMatchesBuildConfig) {
  std::string names;
  for (const mha::backend* b : mha::available_backends()) {
    if (!names.empty()) names += ',';
    names += b->name();
  }
  EXPECT_EQ(names, MHA_BACKEND_NAMES);
}

TEST(Registry, DefaultHonoursEnvironment) {
  ::unsetenv("MHA_BACKEND");
  EXPECT_EQ(&mha::default_backend(), mha::available_backends().front());
  ::setenv("MHA_BACKEND", "naive", 1);
  EXPECT_EQ(&mha::default_backend(), &mha::naive_backend());
  ::setenv("MHA_BACKEND", "", 1);
  EXPECT_EQ(&mha::default_backend(), mha::available_backends().front());
  ::unsetenv("MHA_BACKEND");
}

TEST(Formulation, NamesRoundTrip) {
  for (auto f : mha::formulations()) EXPECT_EQ(mha::parse_formulation(mha::to_string(f)), f);
  EXPECT_EQ(mha::to_string(mha::formulation::split_weight), "split_weight");
}

// mha/isas.def's rows: every isa has a distinct name that parses back, an FMA peak class of the
// bench's loops, and native bf16 exactly where its figures are read against a bf16 peak.
TEST(Isa, RowsNameEveryIsaOnce) {
  std::set<std::string_view> names;
  for (mha::isa i : mha::all_isas) {
    const std::string_view name = mha::to_string(i);
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(mha::parse_isa(name), i) << name;
    EXPECT_TRUE(std::set<std::string_view>({"portable", "avx2", "avx512", "neon"})
                    .count(mha::fma_peak_of(i)))
        << name << ": " << mha::fma_peak_of(i);
  }
  EXPECT_EQ(mha::to_string(mha::isa::avx512bf16), "avx512bf16");
  EXPECT_EQ(mha::fma_peak_of(mha::isa::sse2), "portable");
  EXPECT_EQ(mha::fma_peak_of(mha::isa::amx), "avx512");
  EXPECT_TRUE(mha::native_bf16(mha::isa::amx));
  EXPECT_FALSE(mha::native_bf16(mha::isa::avx512));
  EXPECT_EQ(mha::parse_isa("avx-512"), std::nullopt);
  EXPECT_EQ(mha::to_string(static_cast<mha::isa>(std::size(mha::all_isas))), "unknown");
}

TEST(Problem, CanonicalString) {
  mha::problem p;
  p.cfg = {.d_in = 768, .d_out = 768, .n_heads = 12, .context_length = 1024};
  p.batch = 4;
  p.seq_len = 256;
  EXPECT_EQ(mha::to_string(p), "split_weight/b4/t256/din768/dout768/h12");
  p.form = mha::formulation::wrapper;
  p.cfg.causal = false;
  p.cfg.qkv_bias = true;
  p.cfg.out_proj = false;
  EXPECT_EQ(mha::to_string(p), "wrapper/b4/t256/din768/dout768/h12/noncausal/qkv_bias/no_out_proj");
}

TEST(Problem, FlopsFollowTheFormula) {
  mha::problem p;
  p.cfg = {.d_in = 4, .d_out = 6, .n_heads = 2, .context_length = 3};
  p.batch = 2;
  p.seq_len = 3;
  // QKV 2*2*3*4*6*3 = 864, out_proj 2*2*3*6*6 = 432, attention 4*2*2*3*(3*4/2) = 288.
  EXPECT_EQ(mha::flops(p), 864.0 + 432.0 + 288.0);
  p.cfg.causal = false;  // 9 pairs instead of 6
  EXPECT_EQ(mha::flops(p), 864.0 + 432.0 + 432.0);
  p.cfg.out_proj = false;
  EXPECT_EQ(mha::flops(p), 864.0 + 432.0);
}

// The wave's axes appear only when not the default, in one fixed order, and parse back.
TEST(Problem, NewAxesInTheCanonicalStringRoundTrip) {
  mha::problem p;
  p.cfg = {.d_in = 4096, .d_out = 4096, .n_heads = 32, .context_length = 1024};
  p.form = mha::formulation::wrapper;
  p.seq_len = 1;
  p.past = 1023;
  p.cfg.n_kv_heads = 8;
  p.cfg.precision = mha::precision::bf16;
  EXPECT_EQ(mha::to_string(p), "wrapper/b1/t1/past1023/din4096/dout4096/h32/kvh8/bf16");
  EXPECT_EQ(mha::parse_problem(mha::to_string(p)), p);
  p.cfg.n_kv_heads = 32;  // == n_heads: multi-head attention, no kvh part
  EXPECT_EQ(mha::to_string(p), "wrapper/b1/t1/past1023/din4096/dout4096/h32/bf16");

  for (const char* name : {"split_weight/b4/t256/din768/dout768/h12",
                           "wrapper/b2/t17/din24/dout32/h4/noncausal/qkv_bias/no_out_proj",
                           "split_weight/b1/t8/past3/din16/dout16/h4/kvh1/noncausal"}) {
    const mha::problem parsed = mha::parse_problem(name);
    EXPECT_EQ(mha::to_string(parsed), name);
    EXPECT_EQ(parsed.cfg.context_length, parsed.past + parsed.seq_len) << name;
    mha::validate(parsed.cfg);
  }
  // Any order after the formulation; fp32 may be spelled out.
  EXPECT_EQ(mha::to_string(mha::parse_problem("split_weight/h12/fp32/dout768/din768/t256/b4")),
            "split_weight/b4/t256/din768/dout768/h12");
}

// Every optional part at once, in to_string's order; rotary bases in std::to_chars' shortest
// digits (what mhapy.problem.shortest_decimal reproduces).
TEST(Problem, EveryOptionalPartRoundTrips) {
  mha::problem p;
  p.cfg = {.d_in = 64, .d_out = 64, .n_heads = 8, .context_length = 10};
  p.form = mha::formulation::fused_qkv;
  p.past = 9;
  p.cfg.n_kv_heads = 2;
  p.cfg.rope_base = 500000;
  p.cfg.causal = false;
  p.cfg.qkv_bias = true;
  p.cfg.out_proj_bias = false;
  p.cfg.precision = mha::precision::bf16;
  const std::string name =
      "fused_qkv/b1/t1/past9/din64/dout64/h8/kvh2/rope5e+05/noncausal/qkv_bias/"
      "no_out_bias/bf16";
  EXPECT_EQ(mha::to_string(p), name);
  EXPECT_EQ(mha::parse_problem(name), p);
  p.cfg.rope_base = 10000;
  p.cfg.out_proj = false;  // no out_proj: no bias to lack, so no no_out_bias
  EXPECT_EQ(mha::to_string(p),
            "fused_qkv/b1/t1/past9/din64/dout64/h8/kvh2/rope10000/noncausal/qkv_bias/no_out_proj/"
            "bf16");
  EXPECT_EQ(mha::parse_problem("split_weight/b1/t1/din8/dout8/h2/rope1e4").cfg.rope_base, 10000.0);
}

TEST(Problem, ParseNamesTheBadPart) {
  using mha_test::expect_error;
  expect_error<mha::invalid_argument>([] { mha::parse_problem("split_weight/b4/t256/din768"); },
                                      {"no dout<number> part"});
  expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b4/t256/din768/dout768/h12/fast"); },
      {"unknown part 'fast'", "kvh<K>"});
  expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b4/b2/t256/din768/dout768/h12"); }, {"gives b twice"});
  // Every part at most once, flags and the precision too; counts are decimal digits.
  expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b1/t1/din8/dout8/h2/noncausal/noncausal"); },
      {"gives noncausal twice"});
  expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b1/t1/din8/dout8/h2/bf16/fp32"); },
      {"gives fp32 or bf16 twice"});
  expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b1/t1/past-1/din8/dout8/h2"); },
      {"unknown part 'past-1'"});
  expect_error<mha::invalid_argument>(
      [] { mha::parse_problem("split_weight/b1/t1/din8/dout8/h2/rope"); }, {"unknown part 'rope'"});
  expect_error<mha::invalid_argument>([] { mha::parse_problem("fused/b1/t1/din1/dout1/h1"); },
                                      {"unknown formulation 'fused'"});
}

// Grouped K/V shrink the K and V projections; cached tokens add (query, key) pairs.
TEST(Problem, FlopsCountGroupsAndCachedTokens) {
  mha::problem p;
  p.cfg = {.d_in = 4, .d_out = 6, .n_heads = 2, .context_length = 8, .out_proj = false};
  p.batch = 2;
  p.seq_len = 3;
  p.cfg.n_kv_heads = 1;  // d_kv = 3: Q 2*2*3*4*6 = 288, K and V 2*2*3*4*3 = 144 each
  EXPECT_EQ(mha::flops(p), 288.0 + 2 * 144.0 + 288.0);
  p.past = 5;  // pairs 3*5 + 6 = 21: attention 4*2*2*3*21 = 1008
  EXPECT_EQ(mha::flops(p), 288.0 + 2 * 144.0 + 1008.0);
  p.cfg.causal = false;  // pairs 3*8 = 24
  EXPECT_EQ(mha::flops(p), 288.0 + 2 * 144.0 + 1152.0);
  p.cfg.causal = true;
  p.cfg.window = 2;  // positions 5, 6, 7 see 2 keys each: 6 pairs
  EXPECT_EQ(mha::flops(p), 288.0 + 2 * 144.0 + 288.0);
  p.past = 0;  // positions 0, 1, 2 see 1, 2, 2 keys
  EXPECT_EQ(mha::flops(p), 288.0 + 2 * 144.0 + 240.0);
  p.cfg.window = 3;  // as wide as the call: causal's 6 pairs
  EXPECT_EQ(mha::flops(p), 288.0 + 2 * 144.0 + 288.0);
}

TEST(Config, KvHeadsMustDivideHeadsAndPrecisionBeNamed) {
  using mha_test::expect_error;
  mha::config c{.d_in = 8, .d_out = 12, .n_heads = 6, .context_length = 4};
  c.n_kv_heads = 4;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); },
                                      {"n_kv_heads (4) must divide n_heads (6)"});
  c.n_kv_heads = -1;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"n_kv_heads (-1)"});
  c.n_kv_heads = 3;
  mha::validate(c);
  EXPECT_EQ(c.kv_heads(), 3);
  EXPECT_EQ(c.d_kv(), 6);
  EXPECT_THAT(mha::to_string(c), testing::HasSubstr(" n_kv_heads=3"));
  c.precision = static_cast<mha::precision>(7);
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"unknown precision value 7"});
  c.precision = mha::precision::int8;  // a cache's format only
  expect_error<mha::invalid_argument>([&] { mha::validate(c); },
                                      {"precision int8 is a KV cache's format", "fp32 or bf16"});
  EXPECT_EQ(mha::parse_precision("bf16"), mha::precision::bf16);
  EXPECT_EQ(mha::parse_precision("int8"), mha::precision::int8);
  expect_error<mha::invalid_argument>(
      [] { mha::parse_precision("fp16"); },
      {"unknown precision 'fp16'", "fp32, bf16, int8, k8v4 or int4"});
}

// The rope scaling in the canonical string: its type and parameters, read back exactly.
TEST(Problem, RopeScalingRoundTrips) {
  mha::problem p = mha::parse_problem("split_weight/b1/t4/din64/dout64/h4/kvh2/rope5e+05");
  p.cfg.rope_scaling = {mha::rope_scaling::type::llama3, 8.0, 1.0, 4.0, 8192};
  EXPECT_EQ(mha::to_string(p),
            "split_weight/b1/t4/din64/dout64/h4/kvh2/rope5e+05/rope_llama3_8_1_4_8192");
  EXPECT_EQ(mha::parse_problem(mha::to_string(p)), p);
  p.cfg.rope_scaling = {mha::rope_scaling::type::linear, 2.5};
  EXPECT_EQ(mha::to_string(p), "split_weight/b1/t4/din64/dout64/h4/kvh2/rope5e+05/rope_linear2.5");
  EXPECT_EQ(mha::parse_problem(mha::to_string(p)), p);
  for (const char* bad : {"rope_linear", "rope_llama3_8_1_4", "rope_llama3_8_1_4_8192_1",
                          "rope_llama3_8_1_4_8k", "rope_yarn4"}) {
    mha_test::expect_error<mha::invalid_argument>(
        [&] { mha::parse_problem(std::string("split_weight/b1/t1/din8/dout8/h2/rope1e4/") + bad); },
        {std::string("unknown part '") + bad + "'"});
  }
}

// Hugging Face's rope types as facts: linear divides every frequency by the factor; llama3 keeps
// the pairs whose wavelength 2 pi / f is below original_context / high_freq_factor, divides
// those above original_context / low_freq_factor, and blends linearly in context / wavelength
// between (so the scaled frequency falls monotonically from f to f / factor across the band).
TEST(Config, RopeFrequenciesFollowTheScalingType) {
  mha::config c{.d_in = 64, .d_out = 64, .n_heads = 4, .context_length = 8};
  EXPECT_TRUE(mha::rope_frequencies(c).empty()) << "no rotary embedding";
  c.rope_base = 10000.0;
  const std::vector<double> plain = mha::rope_frequencies(c);
  ASSERT_EQ(plain.size(), 8u);
  for (std::size_t e = 0; e < plain.size(); ++e)
    EXPECT_DOUBLE_EQ(plain[e], std::pow(10000.0, -2.0 * static_cast<double>(e) / 16.0));

  c.rope_scaling = {mha::rope_scaling::type::linear, 4.0};
  const std::vector<double> linear = mha::rope_frequencies(c);
  for (std::size_t e = 0; e < plain.size(); ++e) EXPECT_DOUBLE_EQ(linear[e], plain[e] / 4.0);

  c.rope_scaling = {mha::rope_scaling::type::llama3, 8.0, 1.0, 4.0, 64};
  const std::vector<double> llama3 = mha::rope_frequencies(c);
  int kept = 0, slowed = 0, blended = 0;
  for (std::size_t e = 0; e < plain.size(); ++e) {
    const double wavelength = 2 * std::acos(-1.0) / plain[e];
    if (wavelength < 64.0 / 4.0) {
      EXPECT_EQ(llama3[e], plain[e]) << e;
      ++kept;
    } else if (wavelength > 64.0 / 1.0) {
      EXPECT_DOUBLE_EQ(llama3[e], plain[e] / 8.0) << e;
      ++slowed;
    } else {
      // The blend's weight on the unscaled frequency: (64 / wavelength - 1) / (4 - 1).
      const double smooth = (64.0 / wavelength - 1.0) / 3.0;
      EXPECT_GT(smooth, 0.0);
      EXPECT_LT(smooth, 1.0);
      EXPECT_DOUBLE_EQ(llama3[e], (1 - smooth) * plain[e] / 8.0 + smooth * plain[e]) << e;
      EXPECT_LT(llama3[e], plain[e]);
      EXPECT_GT(llama3[e], plain[e] / 8.0);
      ++blended;
    }
  }
  EXPECT_EQ(kept, 1);  // wavelengths 6.3 | 20, 63 | 199, 628, ...
  EXPECT_EQ(blended, 2);
  EXPECT_EQ(slowed, 5);
  mha::validate(c);
  EXPECT_THAT(mha::to_string(c), testing::HasSubstr(" rope_scaling=llama3_8_1_4_64"));
}

TEST(Config, RopeScalingIsValidated) {
  using mha_test::expect_error;
  mha::config c{.d_in = 16, .d_out = 16, .n_heads = 2, .context_length = 8};
  c.rope_scaling = {mha::rope_scaling::type::linear, 2.0};
  expect_error<mha::invalid_argument>([&] { mha::validate(c); },
                                      {"rope_scaling linear", "rope_base is 0"});
  c.rope_base = 10000.0;
  mha::validate(c);
  c.rope_scaling.factor = 0.5;
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"factor (0.5)", ">= 1"});
  c.rope_scaling = {mha::rope_scaling::type::llama3, 8.0, 4.0, 1.0, 8192};
  expect_error<mha::invalid_argument>([&] { mha::validate(c); },
                                      {"low_freq_factor (4)", "high_freq_factor (1)"});
  c.rope_scaling = {mha::rope_scaling::type::llama3, 8.0, 1.0, 4.0, 0};
  expect_error<mha::invalid_argument>([&] { mha::validate(c); }, {"original_context (0)"});
  c.rope_scaling = {mha::rope_scaling::type::none, 2.0};
  expect_error<mha::invalid_argument>([&] { mha::validate(c); },
                                      {"rope_scaling none has parameters", "factor 2"});
}

// A backend says what it declines and why; prepare() of a declined problem throws
// mha::unsupported naming the backend and the reason, before looking at the weights.
TEST(Backend, DeclinedProblemsThrowUnsupportedWithTheReason) {
  mha::config c{.d_in = 8, .d_out = 8, .n_heads = 4, .context_length = 4};
  const mha::weights w = mha::weights::random(c, 1);
  for (const mha::backend* b : mha::available_backends()) {
    for (auto form : mha::formulations()) {
      EXPECT_TRUE(b->supports({c, form})) << b->name();
      // Decode and bf16: as the claims table says (docs/design.md §2.3); a declined one throws
      // mha::unsupported with the reason from prepare().
      const mha::problem decode{c, form, 1, 1, /*past=*/3};
      EXPECT_EQ(static_cast<bool>(b->supports(decode)),
                mha_test::claims({std::string(b->name()), b}, decode))
          << b->name();
      mha::config bf16 = c;
      bf16.precision = mha::precision::bf16;
      const mha::support s = b->supports({bf16, form});
      EXPECT_EQ(static_cast<bool>(s), mha_test::claims({std::string(b->name()), b}, {bf16, form}))
          << b->name();
      if (!s) {
        EXPECT_FALSE(s.reason().empty()) << b->name();
        mha_test::expect_error<mha::unsupported>(
            [&] { b->prepare(bf16, form, w); },
            {std::string(b->name()).c_str(), s.reason().c_str()});
      }
    }
  }
  // Grouped K/V and rotary embedding: every backend computes them, in every formulation.
  c.n_kv_heads = 2;
  c.rope_base = 10000.0;
  const mha::weights grouped = mha::weights::random(c, 1);
  for (const mha::backend* b : mha::available_backends()) {
    for (auto form : mha::formulations()) {
      EXPECT_TRUE(b->supports({c, form})) << b->name();
      EXPECT_NO_THROW(b->prepare(c, form, grouped)) << b->name();
    }
  }
}

TEST(Problem, Gpt2SmallFlops) {
  mha::problem p;
  p.cfg = {.d_in = 768, .d_out = 768, .n_heads = 12, .context_length = 1024};
  p.seq_len = 1024;
  const double expected = 2.0 * 1024 * 768 * 768 * 4 + 4.0 * 12 * 64 * (1024.0 * 1025 / 2);
  EXPECT_EQ(mha::flops(p), expected);
}

mha::config small_config(bool qkv_bias, bool out_proj) {
  return {.d_in = 6,
          .d_out = 8,
          .n_heads = 2,
          .context_length = 4,
          .qkv_bias = qkv_bias,
          .out_proj = out_proj};
}

TEST(Weights, RandomIsReproducibleAndSeeded) {
  const mha::config c = small_config(true, true);
  const auto a = mha::weights::random(c, 1), b = mha::weights::random(c, 1),
             d = mha::weights::random(c, 2);
  EXPECT_EQ(a.query.weight, b.query.weight);
  EXPECT_EQ(a.out_proj.bias, b.out_proj.bias);
  EXPECT_NE(a.query.weight, d.query.weight);
  EXPECT_NE(a.query.weight, a.key.weight);
}

TEST(Weights, RandomFollowsNnLinearDistribution) {
  const mha::config c{.d_in = 100, .d_out = 400, .n_heads = 4, .context_length = 1};
  const auto w = mha::weights::random(c, 7);
  const float bound = 1.0f / std::sqrt(100.0f);
  const auto [lo, hi] = std::minmax_element(w.query.weight.begin(), w.query.weight.end());
  EXPECT_GE(*lo, -bound);
  EXPECT_LT(*hi, bound);
  EXPECT_LT(*lo, -0.99f * bound);  // 40000 draws reach both ends
  EXPECT_GT(*hi, 0.99f * bound);
  double mean = 0.0;
  for (float v : w.query.weight) mean += v;
  mean /= static_cast<double>(w.query.weight.size());
  EXPECT_NEAR(mean, 0.0, 6 * bound / std::sqrt(3.0 * 40000));
  // out_proj's fan-in is d_out.
  const float out_bound = 1.0f / std::sqrt(400.0f);
  for (float v : w.out_proj.weight) ASSERT_LE(std::abs(v), out_bound);
}

TEST(Weights, BiasesFollowConfig) {
  const auto with = mha::weights::random(small_config(true, true), 1);
  EXPECT_EQ(with.query.bias.size(), 8u);
  EXPECT_EQ(with.out_proj.bias.size(), 8u);
  const auto without = mha::weights::random(small_config(false, false), 1);
  EXPECT_TRUE(without.query.bias.empty());
  EXPECT_EQ(without.out_proj.out, 0);
  EXPECT_TRUE(without.out_proj.weight.empty());
}

TEST(Weights, HeadIsRowSliceAndFromHeadsInvertsIt) {
  const mha::config c = small_config(true, true);
  const auto w = mha::weights::random(c, 3);
  const mha::head_weights h1 = w.head(c, 1);
  ASSERT_EQ(h1.value.out, 4);
  ASSERT_EQ(h1.value.in, 6);
  EXPECT_EQ(h1.value.weight, std::vector<float>(w.value.weight.begin() + 24, w.value.weight.end()));
  EXPECT_EQ(h1.value.bias, std::vector<float>(w.value.bias.begin() + 4, w.value.bias.end()));
  EXPECT_NE(h1.query.weight.data(), w.query.weight.data() + 24);  // its own storage

  const std::vector<mha::head_weights> heads = {w.head(c, 0), h1};
  const auto back = mha::weights::from_heads(c, heads, w.out_proj);
  EXPECT_EQ(back.query.weight, w.query.weight);
  EXPECT_EQ(back.key.bias, w.key.bias);
  EXPECT_EQ(back.value.out, 8);
}

// With grouped K/V the key and value projections have kv_heads * head_dim rows, and head h's
// K/V are its group's rows.
TEST(Weights, GroupedHeadsShareTheirGroupsKeyAndValueRows) {
  mha::config c = small_config(true, false);
  c.n_heads = 4;
  c.n_kv_heads = 2;  // head_dim 2, d_kv 4: heads 0-1 read K/V rows 0-1, heads 2-3 rows 2-3
  const auto w = mha::weights::random(c, 3);
  EXPECT_EQ(w.key.out, 4);
  EXPECT_EQ(w.value.bias.size(), 4u);
  EXPECT_EQ(w.query.out, 8);
  const mha::head_weights h3 = w.head(c, 3);
  EXPECT_EQ(h3.key.weight, std::vector<float>(w.key.weight.begin() + 12, w.key.weight.end()));
  EXPECT_EQ(h3.query.weight, std::vector<float>(w.query.weight.begin() + 36, w.query.weight.end()));
  mha::weights wrong = w;
  wrong.key = w.query;
  mha_test::expect_error<mha::invalid_argument>([&] { mha::validate(c, wrong); },
                                                {"W_key.weight is (8, 6), expected (4, 6)"});
  const std::vector<mha::head_weights> heads = {w.head(c, 0), w.head(c, 1), w.head(c, 2), h3};
  mha_test::expect_error<mha::invalid_argument>([&] { mha::weights::from_heads(c, heads, {}); },
                                                {"n_kv_heads (2) must equal n_heads (4)"});
}

TEST(TensorView, SpanOfMatchingSize) {
  std::vector<float> storage(24);
  const mha::tensor_view<float> v(std::span<float>(storage), 2, 3, 4);
  EXPECT_EQ(v.data(), storage.data());
  EXPECT_EQ(v.size(), 24);
  const mha::tensor_view<const float> c = v;
  EXPECT_EQ(c.features(), 4);
}

}  // namespace
