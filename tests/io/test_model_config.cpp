// A Hugging Face config.json as mha reads it (mha::io::parse_model_config, which `mha run
// --model`, `mha inspect`, Plan.from_pretrained and Plan.from_module share): the keys that
// change a model type's attention are computed as transformers computes them, or refused naming
// the key; values out of range are refused naming config.json and the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_config.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"
#include "mha/registry.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
namespace io = mha::io;
using mha_test::expect_error;
using nlohmann::json;

json llama() {
  return {{"model_type", "llama"},    {"hidden_size", 32},      {"num_attention_heads", 8},
          {"num_key_value_heads", 2}, {"num_hidden_layers", 2}, {"max_position_embeddings", 64},
          {"rope_theta", 10000.0}};
}
json with(json c, const json& changes) {
  c.update(changes);
  return c;
}
io::model_config parsed(const json& c, std::int64_t layer = 0) {
  return io::parse_model_config(c.dump(), "config.json", layer);
}

// GPT-2's per-layer and disabled scaling, BERT's relative position embeddings: refused naming the
// key, its value and the model type; transformers' defaults (and null) are what mha computes.
TEST(ModelConfig, KeysMhaDoesNotComputeAreRefusedByName) {
  const json gpt2 = {
      {"model_type", "gpt2"}, {"n_embd", 16}, {"n_head", 4}, {"n_layer", 2}, {"n_positions", 32}};
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(gpt2, {{"scale_attn_by_inverse_layer_idx", true}}));
      },
      {"config.json: scale_attn_by_inverse_layer_idx is true", "gpt2 model",
       "divides layer n's scores by n + 1"});
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(gpt2, {{"scale_attn_weights", false}}));
      },
      {"scale_attn_weights is false", "leaves the scores unscaled"});
  EXPECT_EQ(parsed(with(gpt2, {{"scale_attn_weights", true},
                               {"scale_attn_by_inverse_layer_idx", false},
                               {"reorder_and_upcast_attn", true}}))
                .cfg.n_heads,
            4);
  const json bert = {{"model_type", "roberta"},
                     {"hidden_size", 16},
                     {"num_attention_heads", 2},
                     {"num_hidden_layers", 2},
                     {"max_position_embeddings", 24}};
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(bert, {{"position_embedding_type", "relative_key"}}));
      },
      {"position_embedding_type is \"relative_key\"", "roberta model"});
  EXPECT_FALSE(parsed(with(bert, {{"position_embedding_type", nullptr}})).cfg.causal);
  EXPECT_TRUE(parsed(with(bert, {{"is_decoder", true}})).cfg.causal);
  // A key another model type reads is not this one's: Llama has no sliding window.
  EXPECT_EQ(parsed(with(llama(), {{"sliding_window", 4}})).window, 0);
}

// Mistral windows every layer (4096 keys when config.json does not say, as MistralConfig
// defaults); Qwen2 the layers from max_window_layers on when use_sliding_window, or those its
// layer_types name.
TEST(ModelConfig, SlidingWindowsAsTransformersSetsThem) {
  const json mistral = with(llama(), {{"model_type", "mistral"}});
  EXPECT_EQ(parsed(mistral).window, 4096);
  EXPECT_EQ(parsed(mistral).window_key, "sliding_window");
  EXPECT_EQ(parsed(with(mistral, {{"sliding_window", nullptr}})).window, 0);
  EXPECT_EQ(parsed(with(mistral, {{"sliding_window", 4}}), 1).window, 4);
  // Mistral's nn.Linear layers have no bias, whatever attention_bias says.
  EXPECT_FALSE(parsed(with(mistral, {{"attention_bias", true}})).cfg.qkv_bias);

  const json qwen2 = with(llama(), {{"model_type", "qwen2"}, {"sliding_window", 4}});
  EXPECT_TRUE(parsed(qwen2).cfg.qkv_bias);
  EXPECT_EQ(parsed(qwen2, 1).window, 0);  // use_sliding_window defaults to false
  const json windowed = with(qwen2, {{"use_sliding_window", true}, {"max_window_layers", 0}});
  EXPECT_EQ(parsed(windowed, 0).window, 4);
  EXPECT_EQ(parsed(with(windowed, {{"max_window_layers", 1}}), 0).window, 0);
  EXPECT_EQ(parsed(with(windowed, {{"max_window_layers", 1}}), 1).window, 4);
  const json typed = with(windowed, {{"layer_types", {"sliding_attention", "full_attention"}}});
  EXPECT_EQ(parsed(typed, 0).window, 4);
  EXPECT_EQ(parsed(typed, 1).window, 0);
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(typed, {{"layer_types", {"chunked_attention", "full_attention"}}}));
      },
      {"layer_types holds \"chunked_attention\"", "qwen2"});
  expect_error<mha::format_error>(
      [&] {
        parsed(with(typed, {{"layer_types", {"full_attention"}}}));
      },
      {"layer_types is", "expected a list of 2 layer types"});
  expect_error<mha::format_error>(
      [&] {
        parsed(with(typed, {{"use_sliding_window", false}}));
      },
      {"layer_types holds sliding_attention, but no sliding window is set"});
}

// A windowed layer computes its window (config::window): the context a caller gets is the
// model's max_position_embeddings, not the window.
TEST(ModelConfig, AWindowIsTheLayersConfigNotACapOnTheContext) {
  const io::model_config m =
      parsed(with(llama(), {{"model_type", "mistral"}, {"sliding_window", 4}}));
  EXPECT_EQ(m.cfg.window, 4);
  EXPECT_EQ(m.window, 4);
  const io::detail::block_context c = io::detail::context_of(m, 0, 0, "--context-length", "dir");
  EXPECT_EQ(c.length, 64);
  EXPECT_THAT(c.source, testing::HasSubstr("max_position_embeddings"));
  EXPECT_EQ(io::detail::context_of(m, 0, 16, "--context-length", "dir").length, 16);
  expect_error<mha::invalid_argument>(
      [&] { io::detail::context_of(m, 0, 65, "--context-length", "dir"); },
      {"65 exceeds config.json's max_position_embeddings 64"});
  EXPECT_EQ(io::detail::context_of(parsed(llama()), 1, 0, "", "dir").length, 64);
}

// A rotary embedding's values are checked as read, naming config.json and the key: a base of 0
// (which once ran as no rotary embedding at all), negative or 1; factors below 1; llama3's
// frequency factors out of order.
TEST(ModelConfig, RopeValuesAreCheckedNamingTheirKey) {
  const std::pair<json, std::vector<std::string>> cases[] = {
      {{{"rope_theta", 0}},
       {"config.json: rope_theta is 0, expected a finite base > 1", "a llama model rotates"}},
      {{{"rope_theta", -10000}}, {"rope_theta is -10000"}},
      {{{"rope_theta", 1}}, {"rope_theta is 1"}},
      {{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 0.5}}}},
       {"rope_parameters.rope_theta is 0.5"}},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", 0}}}},
       {"config.json: rope_scaling.factor is 0, expected a number >= 1"}},
      {{{"rope_scaling", {{"type", "linear"}, {"factor", -2}}}}, {"rope_scaling.factor is -2"}},
      {{{"rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 8},
          {"low_freq_factor", 4},
          {"high_freq_factor", 1},
          {"original_max_position_embeddings", 16}}}},
       {"rope_scaling.high_freq_factor is 1, expected a number above low_freq_factor (4)"}},
      {{{"rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 8},
          {"low_freq_factor", 0},
          {"high_freq_factor", 4},
          {"original_max_position_embeddings", 16}}}},
       {"rope_scaling.low_freq_factor is 0, expected a number > 0"}},
  };
  for (const auto& [change, message] : cases) {
    expect_error<mha::format_error>([&] { parsed(with(llama(), change)); }, message);
  }
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(llama(), {{"rope_scaling", {{"rope_type", "longrope"}, {"factor", 4}}}}));
      },
      {"rope_scaling.rope_type is 'longrope'", "default, linear, llama3 and yarn"});
}

// Both rope_parameters and a rope_scaling: transformers 5 takes a non-empty rope_scaling (with
// rope_theta from it, else the top level), as mha does; an empty one defers to rope_parameters.
TEST(ModelConfig, RopeScalingWinsOverRopeParametersAsInTransformers) {
  json both = with(llama(), {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e5}}},
                             {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}});
  io::model_config m = parsed(both);
  EXPECT_EQ(m.cfg.rope_scaling, (mha::rope_scaling{mha::rope_scaling::type::linear, 2.0}));
  EXPECT_EQ(m.cfg.rope_base, 10000.0);  // the top level's rope_theta, not rope_parameters'
  both["rope_scaling"] = json::object();
  m = parsed(both);
  EXPECT_EQ(m.cfg.rope_scaling, mha::rope_scaling{});
  EXPECT_EQ(m.cfg.rope_base, 5e5);
}

// Sizes are multiplied with overflow checks: head_dim 2^62 over 8 heads is refused, never wraps.
TEST(ModelConfig, HeadDimTimesHeadsDoesNotOverflow) {
  expect_error<mha::format_error>(
      [&] {
        parsed(with(llama(), {{"head_dim", std::int64_t{1} << 62}}));
      },
      {"head_dim is 4611686018427387904, whose product with num_attention_heads 8 overflows"});
  expect_error<mha::format_error>([&] { io::parse_model_config("[1]", "config.json"); },
                                  {"config.json: is a JSON array, expected an object"});
}

// An inner width of its own (Mistral NeMo: head_dim 128 x 32 heads over a hidden size of 5120):
// heads of head_dim, the out projection back to hidden_size (config::out_features).
TEST(ModelConfig, AnInnerWidthIsTheOutProjectionsInput) {
  const mha::config cfg = parsed(with(llama(), {{"model_type", "mistral"}, {"head_dim", 6}})).cfg;
  EXPECT_EQ(cfg.d_in, 32);
  EXPECT_EQ(cfg.d_out, 48);
  EXPECT_EQ(cfg.head_dim(), 6);
  EXPECT_EQ(cfg.out_features, 32);
  EXPECT_EQ(cfg.out_width(), 32);
  EXPECT_EQ(parsed(llama()).cfg.out_features, 0);  // head_dim * heads = hidden_size: d_out
}

json gemma3() {
  return {{"model_type", "gemma3_text"},
          {"hidden_size", 40},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 1},
          {"head_dim", 16},
          {"num_hidden_layers", 6},
          {"max_position_embeddings", 128},
          {"query_pre_attn_scalar", 16},
          {"rms_norm_eps", 1e-5},
          {"sliding_window", 8},
          {"attn_logit_softcapping", nullptr},
          {"layer_types",
           {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "full_attention"}},
          {"rope_parameters",
           {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}};
}

// Gemma 3 as transformers 5 writes it: heads of head_dim back to hidden_size, q/k norms of
// rms_norm_eps (weights 1 + w), sliding layers by layer_types with their own rotary embedding.
TEST(ModelConfig, Gemma3sLayersAsTransformersComputesThem) {
  const io::model_config sliding = parsed(gemma3(), 0), full = parsed(gemma3(), 5);
  for (const io::model_config& m : {sliding, full}) {
    EXPECT_EQ(m.cfg.d_out, 64);
    EXPECT_EQ(m.cfg.out_features, 40);
    EXPECT_EQ(m.cfg.kv_heads(), 1);
    EXPECT_TRUE(m.cfg.qk_norm);
    EXPECT_EQ(m.cfg.qk_norm_eps, 1e-5);
    EXPECT_EQ(m.qk_norm_offset, 1.0);
    EXPECT_FALSE(m.cfg.qkv_bias || m.cfg.out_proj_bias);
  }
  EXPECT_EQ(sliding.cfg.window, 8);
  EXPECT_EQ(sliding.cfg.rope_base, 10000.0);
  EXPECT_EQ(sliding.cfg.rope_scaling.kind, mha::rope_scaling::type::none);
  EXPECT_EQ(full.cfg.window, 0);
  EXPECT_EQ(full.cfg.rope_base, 1e6);
  EXPECT_EQ(full.cfg.rope_scaling.kind, mha::rope_scaling::type::linear);
  EXPECT_EQ(full.cfg.rope_scaling.factor, 8.0);
  // Older configs: a pattern of sliding layers, rope_theta for the full ones and
  // rope_local_base_freq for the sliding ones.
  json old = gemma3();
  old.erase("layer_types");
  old.erase("rope_parameters");
  old.update({{"sliding_window_pattern", 3}, {"rope_theta", 1e6}, {"rope_local_base_freq", 1e4}});
  EXPECT_EQ(parsed(old, 1).cfg.window, 8);
  EXPECT_EQ(parsed(old, 1).cfg.rope_base, 1e4);
  EXPECT_EQ(parsed(old, 2).cfg.window, 0);
  EXPECT_EQ(parsed(old, 2).cfg.rope_base, 1e6);
  EXPECT_EQ(parsed(old, 1).cfg.softcap, 0.0);  // Gemma 3: none
  // Gemma 2: no q/k norms, every other layer sliding, soft-capped at 50 unless null.
  json gemma2 = old;
  gemma2.update({{"model_type", "gemma2"}});
  gemma2.erase("sliding_window_pattern");
  gemma2.erase("attn_logit_softcapping");
  EXPECT_FALSE(parsed(gemma2, 0).cfg.qk_norm);
  EXPECT_EQ(parsed(gemma2, 0).cfg.softcap, 50.0);
  EXPECT_EQ(parsed(with(gemma2, {{"attn_logit_softcapping", 30.0}}), 0).cfg.softcap, 30.0);
  EXPECT_EQ(parsed(with(gemma2, {{"attn_logit_softcapping", nullptr}}), 0).cfg.softcap, 0.0);
  EXPECT_EQ(parsed(gemma2, 0).cfg.window, 8);
  EXPECT_EQ(parsed(gemma2, 1).cfg.window, 0);
}

// gpt-oss: a sink per head and every bias (as GptOssConfig: attention_bias true, sliding_window
// 128 when absent), every other layer sliding, its YaRN rotary embedding as transformers reads it
// (attention_factor from factor, or mscale over mscale_all_dim, or stated).
TEST(ModelConfig, GptOsssLayersAsTransformersComputesThem) {
  const json gpt_oss = {
      {"model_type", "gpt_oss"},       {"hidden_size", 40}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2},      {"head_dim", 16},    {"num_hidden_layers", 4},
      {"max_position_embeddings", 64}, {"rope_theta", 1e4}};
  const mha::config sliding = parsed(gpt_oss, 0).cfg, full = parsed(gpt_oss, 1).cfg;
  EXPECT_TRUE(sliding.sinks && full.sinks);
  EXPECT_TRUE(sliding.qkv_bias && sliding.out_proj_bias);
  EXPECT_EQ(sliding.window, 128);
  EXPECT_EQ(full.window, 0);
  EXPECT_EQ((std::pair{sliding.d_out, sliding.out_features}),
            (std::pair{std::int64_t{64}, std::int64_t{40}}));
  EXPECT_FALSE(parsed(with(gpt_oss, {{"attention_bias", false}})).cfg.qkv_bias);
  const json yarn = {{"rope_type", "yarn"},   {"factor", 32.0},
                     {"beta_fast", 32.0},     {"beta_slow", 1.0},
                     {"truncate", false},     {"original_max_position_embeddings", 4096},
                     {"rope_theta", 150000.0}};
  const mha::config cfg = parsed(with(gpt_oss, {{"rope_parameters", yarn}})).cfg;
  EXPECT_EQ(cfg.rope_base, 150000.0);
  EXPECT_EQ(cfg.rope_scaling.kind, mha::rope_scaling::type::yarn);
  EXPECT_EQ(cfg.rope_scaling.original_context, 4096);
  EXPECT_FALSE(cfg.rope_scaling.truncate);
  EXPECT_DOUBLE_EQ(mha::rope_amplitude(cfg), 0.1 * std::log(32.0) + 1.0);
  json scaled = yarn;
  scaled.update({{"mscale", 2.0}, {"mscale_all_dim", 1.0}});
  EXPECT_DOUBLE_EQ(
      parsed(with(gpt_oss, {{"rope_parameters", scaled}})).cfg.rope_scaling.attention_factor,
      (0.2 * std::log(32.0) + 1.0) / (0.1 * std::log(32.0) + 1.0));
  scaled["attention_factor"] = 0.75;
  EXPECT_EQ(parsed(with(gpt_oss, {{"rope_parameters", scaled}})).cfg.rope_scaling.attention_factor,
            0.75);
  scaled.erase("factor");  // max_position_embeddings over the original context
  EXPECT_EQ(parsed(with(gpt_oss, {{"rope_parameters", scaled}, {"max_position_embeddings", 8192}}))
                .cfg.rope_scaling.factor,
            2.0);
  expect_error<mha::format_error>(
      [&] {
        parsed(with(gpt_oss, {{"rope_parameters", with(yarn, {{"beta_slow", 40.0}})}}));
      },
      {"rope_parameters.beta_slow is 40", "between 0 and beta_fast (32)"});
}

// What Gemma's attention does that a plan's module does not compute: refused naming the key.
TEST(ModelConfig, GemmasKeysMhaDoesNotComputeAreRefusedByName) {
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(gemma3(), {{"query_pre_attn_scalar", 144}}));
      },
      {"query_pre_attn_scalar is 144", "gemma3_text model", "144^-0.5, not head_dim 16^-0.5"});
  expect_error<mha::format_error>(
      [&] {
        parsed(with(gemma3(), {{"attn_logit_softcapping", -2.0}}));
      },
      {"attn_logit_softcapping is -2", "expected a number >= 0 or null"});
  expect_error<mha::unsupported>(
      [&] {
        parsed(with(gemma3(), {{"use_bidirectional_attention", true}}));
      },
      {"use_bidirectional_attention is true", "attend to later tokens too"});
}

// A windowed model from its folder: `mha run` and load_model compute its window (config::window).
class ModelConfigFolder : public mha_test::scratch_test {
 protected:
  fs::path write(const std::string& name, const json& config, const mha::config& cfg) {
    const fs::path folder = dir_ / name;
    fs::create_directories(folder);
    std::ofstream(folder / "config.json") << config.dump();
    io::tensor_file file;
    for (int layer = 0; layer < 2; ++layer) {
      const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
      weights_.push_back(mha::weights::random(cfg, static_cast<std::uint64_t>(layer) + 7));
      for (auto& [n, t] : io::to_state_dict(cfg, weights_.back(), io::layout::llama).tensors) {
        file.tensors.emplace(prefix + n, std::move(t));
      }
    }
    io::write_safetensors(folder / "model.safetensors", file);
    return folder;
  }
  std::vector<mha::weights> weights_;
};

// A sliding layer's folder runs its window past its length: the CLI's output is the windowed
// plan's, which differs from full attention once the input passes the window.
TEST_F(ModelConfigFolder, ASlidingWindowIsComputedPastItsLength) {
  mha::config cfg{.d_in = 32, .d_out = 32, .n_heads = 8, .context_length = 64};
  cfg.n_kv_heads = 2;
  cfg.rope_base = 10000.0;
  cfg.out_proj_bias = false;
  cfg.window = 4;
  const fs::path folder =
      write("mistral", with(llama(), {{"model_type", "mistral"}, {"sliding_window", 4}}), cfg);
  EXPECT_EQ(io::load_model(folder, 1).cfg, cfg);

  const std::int64_t tokens = 16;
  io::tensor x{{1, tokens, 32}, mha_test::random_floats(static_cast<std::size_t>(tokens) * 32, 3)};
  io::write_npy(dir_ / "x.npy", x);
  const mha_test::command_result r = mha_test::run_mha(
      {"run", "--model", folder.string(), "--layer", "1", "--backend", "naive", "--input",
       (dir_ / "x.npy").string(), "--output", (dir_ / "y.npy").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<float> y(tokens * 32), full(tokens * 32);
  const auto run = [&](const mha::config& c, std::vector<float>& out) {
    mha::require_backend("naive")
        .prepare(c, mha::formulation::split_weight, weights_[1])
        ->run({x.values.data(), 1, tokens, 32}, {out.data(), 1, tokens, 32});
  };
  run(cfg, y);
  EXPECT_EQ(io::read_npy(dir_ / "y.npy").values, y);
  mha::config plain = cfg;
  plain.window = 0;
  run(plain, full);
  EXPECT_NE(y, full);
}

// A Gemma 3 folder: each layer with its own window and rotary embedding, its norms' weights read
// as 1 + the tensors' (Gemma's RMS norm), the CLI's output the layer's plan's.
TEST_F(ModelConfigFolder, Gemma3sLayersAreComputedWithTheirNormsWindowsAndRope) {
  json config = gemma3();
  config.update(
      {{"num_hidden_layers", 2}, {"layer_types", {"sliding_attention", "full_attention"}}});
  mha::config full = parsed(config, 1).cfg;
  const fs::path folder = write("gemma3", config, full);
  const io::loaded_module sliding = io::load_model(folder, 0), loaded = io::load_model(folder, 1);
  EXPECT_EQ(loaded.cfg, full);
  EXPECT_EQ(sliding.cfg.window, 8);
  EXPECT_EQ(sliding.cfg.rope_base, 1e4);
  ASSERT_EQ(loaded.w.q_norm.size(), 16u);
  for (std::size_t e = 0; e < 16; ++e) {
    EXPECT_EQ(loaded.w.q_norm[e], weights_[1].q_norm[e] + 1.0f);
    EXPECT_EQ(loaded.w.k_norm[e], weights_[1].k_norm[e] + 1.0f);
  }
  EXPECT_EQ(loaded.w.out_proj.weight, weights_[1].out_proj.weight);

  const std::int64_t tokens = 12;
  io::tensor x{{1, tokens, 40}, mha_test::random_floats(static_cast<std::size_t>(tokens) * 40, 3)};
  io::write_npy(dir_ / "x.npy", x);
  const mha_test::command_result r = mha_test::run_mha(
      {"run", "--model", folder.string(), "--layer", "0", "--backend", "naive", "--input",
       (dir_ / "x.npy").string(), "--output", (dir_ / "y.npy").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<float> y(tokens * 40);
  mha::require_backend("naive")
      .prepare(sliding.cfg, mha::formulation::split_weight, sliding.w)
      ->run({x.values.data(), 1, tokens, 40}, {y.data(), 1, tokens, 40});
  EXPECT_EQ(io::read_npy(dir_ / "y.npy").values, y);
  EXPECT_EQ(io::read_npy(dir_ / "y.npy").shape, (std::vector<std::int64_t>{1, tokens, 40}));
}

}  // namespace
