// A PyTorch state_dict <-> (config, weights): every layout, where H, the K/V heads, the rotary
// embedding and the context length come from, blocks of whole-model checkpoints, and every way a
// state_dict can disagree with itself or with the options.
#include <gtest/gtest.h>

#include "mha/error.hpp"
#include "mha/io.hpp"
#include "support.hpp"

namespace {

namespace io = mha::io;
using io::layout;
using mha_test::expect_error;
using mha_test::expect_same_weights;

mha::config small_config(bool qkv_bias = true, bool out_proj = true) {
  return {.d_in = 5,
          .d_out = 6,
          .n_heads = 3,
          .context_length = 4,
          .qkv_bias = qkv_bias,
          .out_proj = out_proj};
}

// A module every layout holds: d_in = d_out, every bias.
mha::config square_config() {
  mha::config c = small_config();
  c.d_in = 6;
  return c;
}

// The state_dict of a random module, in `l`.
io::tensor_file state_dict(layout l, const mha::config& cfg = small_config()) {
  return io::to_state_dict(cfg, mha::weights::random(cfg, 5), l);
}

// `f` with every tensor name prefixed by `prefix` (a block of a whole-model checkpoint).
io::tensor_file prefixed(io::tensor_file f, const std::string& prefix) {
  io::tensor_file out{{}, f.metadata};
  for (auto& [name, t] : f.tensors) out.tensors.emplace(prefix + name, std::move(t));
  return out;
}

std::string label(const testing::TestParamInfo<layout>& info) {
  return std::string(io::to_string(info.param));
}

class EveryLayout : public testing::TestWithParam<layout> {};

// What a layout writes it reads back exactly; what it cannot hold it refuses to write.
TEST_P(EveryLayout, RoundTripsWhatItHoldsAndRefusesTheRest) {
  int written = 0;
  for (const std::int64_t d_in : {5, 6}) {
    for (const int flags : {0, 1, 2, 3, 4, 5, 6, 7}) {
      for (const std::int64_t kv : {0, 1}) {
        for (const double rope : {0.0, 10000.0}) {
          mha::config cfg = small_config(flags & 1, flags & 2);
          cfg.d_in = d_in;
          cfg.out_proj_bias = !cfg.out_proj || (flags & 4);
          cfg.n_kv_heads = kv;
          cfg.rope_base = rope;
          const mha::weights w = mha::weights::random(cfg, 9);
          io::tensor_file f;
          try {
            f = io::to_state_dict(cfg, w, GetParam());
          } catch (const mha::invalid_argument& e) {
            EXPECT_THAT(e.what(), testing::HasSubstr("layout")) << mha::to_string(cfg);
            continue;
          }
          ++written;
          // Through the file format too: what is written is what PyTorch's load_state_dict reads.
          const io::loaded_module m =
              io::module_from_state_dict(io::parse_safetensors(io::safetensors_bytes(f)));
          EXPECT_EQ(m.layout, GetParam());
          mha::config expected = cfg;
          expected.causal = GetParam() != layout::bert;  // BERT's attention is an encoder's
          EXPECT_EQ(mha::to_string(m.cfg), mha::to_string(expected));
          expect_same_weights(m.w, w);
        }
      }
    }
  }
  EXPECT_GT(written, 0);
}

// The mask buffers' size, or the metadata context_length where the layout has no mask.
TEST_P(EveryLayout, ContextLengthFromTheFileOrOption) {
  io::tensor_file f = state_dict(GetParam(), square_config());
  const bool masks = !f.metadata.contains("context_length");
  EXPECT_EQ(masks, GetParam() != layout::torch_mha && GetParam() != layout::llama &&
                       GetParam() != layout::bert);
  EXPECT_EQ(io::module_from_state_dict(f).cfg.context_length, 4);
  EXPECT_EQ(io::module_from_state_dict(f, {.context_length = 3}).cfg.context_length, 3);
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(f, {.context_length = 5}); },
      {"context_length 5 exceeds the file's, 4",
       masks ? "mask buffer (4, 4)" : "the metadata context_length"});
  f.metadata["context_length"] = "6";
  if (masks) {
    expect_error<mha::format_error>(
        [&] { io::module_from_state_dict(f); },
        {"context lengths disagree", "context_length gives 6", "mask buffer (4, 4) gives 4"});
  }
  std::erase_if(f.tensors,
                [](const auto& e) { return e.first.ends_with("mask") || e.first == "bias"; });
  f.metadata.erase("context_length");
  EXPECT_EQ(io::module_from_state_dict(f).cfg.context_length, 0) << "none in the file";
}

TEST_P(EveryLayout, HeadsOptionMustAgreeWithTheFile) {
  const io::tensor_file f = state_dict(GetParam(), square_config());
  EXPECT_EQ(io::module_from_state_dict(f, {.n_heads = 3}).cfg.n_heads, 3);
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(f, {.n_heads = 2}); },
      {"head counts disagree", "gives 3", "the n_heads option (--heads) gives 2"});
}

// One block among others of a whole-model checkpoint: picked by its prefix, with or without
// the final '.', whatever else the file holds.
TEST_P(EveryLayout, PrefixPicksOneBlockOfAModel) {
  const mha::config cfg = square_config();
  io::tensor_file model;
  std::vector<mha::weights> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(mha::weights::random(cfg, 20 + i));
    for (auto& [name, t] : prefixed(io::to_state_dict(cfg, blocks.back(), GetParam()),
                                    "h." + std::to_string(i) + ".attn.")
                               .tensors) {
      model.tensors.emplace(name, std::move(t));
    }
    // GPT-2's MLP has a c_proj too, and no c_attn: not an attention block.
    model.tensors["h." + std::to_string(i) + ".mlp.c_proj.weight"] = {{6, 6},
                                                                      std::vector<float>(36)};
    model.tensors["h." + std::to_string(i) + ".ln_1.weight"] = {{6}, std::vector<float>(6)};
  }
  model.tensors["wte.weight"] = {{11, 6}, std::vector<float>(66)};
  model.metadata = {{"num_heads", "3"}, {"rope_base", "0"}};

  std::vector<std::string> names;
  for (const auto& [name, t] : model.tensors) names.push_back(name);
  EXPECT_EQ(io::attention_prefixes(names),
            (std::vector<std::string>{"h.0.attn.", "h.1.attn.", "h.2.attn."}));
  for (const std::string prefix : {"h.1.attn.", "h.1.attn"}) {
    const io::loaded_module m = io::module_from_state_dict(model, {.prefix = prefix});
    EXPECT_EQ(m.prefix, "h.1.attn.");
    EXPECT_EQ(m.layout, GetParam());
    expect_same_weights(m.w, blocks[1]);
  }
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(model, {.prefix = "h.1."}); },
      {"no attention block at the prefix 'h.1.'",
       "at the 3 prefixes 'h.0.attn.', 'h.1.attn.' "
       "and 'h.2.attn.'"});
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(model); },
      {"holds attention blocks at the 3 prefixes", "none at the top level", "--prefix"});
}

INSTANTIATE_TEST_SUITE_P(Layouts, EveryLayout, testing::ValuesIn(io::layouts()), label);

TEST(StateDict, NamesAndShapesAreTheModulesOwn) {
  const mha::config cfg = square_config();
  const std::map<layout, std::vector<std::pair<std::string, std::vector<std::int64_t>>>> names = {
      {layout::split, {{"W_query.weight", {6, 6}}, {"W_key.bias", {6}}, {"mask", {4, 4}}}},
      {layout::wrapper, {{"heads.2.W_query.weight", {2, 6}}, {"heads.2.mask", {4, 4}}}},
      {layout::torch_mha,
       {{"in_proj_weight", {18, 6}}, {"in_proj_bias", {18}}, {"out_proj.weight", {6, 6}}}},
      {layout::gpt2, {{"c_attn.weight", {6, 18}}, {"c_proj.bias", {6}}, {"bias", {1, 1, 4, 4}}}},
      {layout::llama, {{"q_proj.weight", {6, 6}}, {"v_proj.bias", {6}}, {"o_proj.weight", {6, 6}}}},
  };
  for (const auto& [l, expected] : names) {
    const io::tensor_file f = state_dict(l, cfg);
    for (const auto& [name, shape] : expected) {
      ASSERT_TRUE(f.tensors.contains(name)) << name;
      EXPECT_EQ(f.tensors.at(name).shape, shape) << name;
    }
    EXPECT_EQ(f.metadata.at("num_heads"), "3");
  }
  // triu(ones(4, 4), diagonal=1) in the seeds' modules, tril(ones) in GPT-2.
  EXPECT_EQ(state_dict(layout::split, cfg).tensors.at("mask").values,
            (std::vector<float>{0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(state_dict(layout::gpt2, cfg).tensors.at("bias").values,
            (std::vector<float>{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
  // Llama's file states its rotary embedding, even none.
  EXPECT_EQ(state_dict(layout::llama, cfg).metadata.at("rope_base"), "0");
}

TEST(StateDict, FusedLayoutsStackQkvAndGpt2StoresThemTransposed) {
  const mha::config cfg = square_config();
  const mha::weights w = mha::weights::random(cfg, 3);
  const mha::linear_weights fused = w.fused_qkv();
  const io::tensor_file mha_file = io::to_state_dict(cfg, w, layout::torch_mha);
  EXPECT_EQ(mha_file.tensors.at("in_proj_weight").values, fused.weight);
  EXPECT_EQ(mha_file.tensors.at("in_proj_bias").values, fused.bias);
  const io::tensor_file gpt2 = io::to_state_dict(cfg, w, layout::gpt2);
  const std::vector<float>& c_attn = gpt2.tensors.at("c_attn.weight").values;  // (6, 18)
  const std::vector<float>& c_proj = gpt2.tensors.at("c_proj.weight").values;  // (6, 6)
  for (std::size_t out = 0; out < 18; ++out) {
    for (std::size_t in = 0; in < 6; ++in) {
      EXPECT_EQ(c_attn[in * 18 + out], fused.weight[out * 6 + in]);
      if (out < 6) {
        EXPECT_EQ(c_proj[in * 6 + out], w.out_proj.weight[out * 6 + in]);
      }
    }
  }
  // fused_qkv's PyTorch module is nn.MultiheadAttention.
  EXPECT_EQ(
      io::to_state_dict(cfg, w, mha::formulation::fused_qkv).tensors.at("in_proj_weight").values,
      fused.weight);
}

TEST(StateDict, LayoutsRefuseWhatTheirModuleCannotBe) {
  mha::config grouped = square_config();
  grouped.n_kv_heads = 1;
  const mha::config narrow = small_config();  // d_in 5, d_out 6
  mha::config no_bias = square_config();
  no_bias.qkv_bias = false;
  mha::config no_proj = square_config();
  no_proj.out_proj = false;
  const std::vector<std::tuple<layout, mha::config, const char*>> refused = {
      {layout::wrapper, grouped, "n_kv_heads = n_heads"},
      {layout::torch_mha, grouped, "n_kv_heads = n_heads"},
      {layout::torch_mha, narrow, "d_in = d_out"},
      {layout::torch_mha, no_proj, "an out_proj"},
      {layout::gpt2, no_bias, "every bias"},
  };
  for (const auto& [l, cfg, why] : refused) {
    expect_error<mha::invalid_argument>(
        [&] { io::to_state_dict(cfg, mha::weights::random(cfg, 1), l); },
        {"to_state_dict: the ", std::string(io::to_string(l)).c_str(), why});
  }
}

TEST(StateDict, WrapperLayoutStacksHeadsIntoTheSplitWeights) {
  const mha::config cfg = small_config();
  const mha::weights w = mha::weights::random(cfg, 2);
  expect_same_weights(io::module_from_state_dict(io::to_state_dict(cfg, w, layout::wrapper)).w,
                      io::module_from_state_dict(io::to_state_dict(cfg, w, layout::split)).w);
}

TEST(StateDict, HeadsFromMetadataOptionOrGroups) {
  io::tensor_file f = state_dict(layout::split);
  f.metadata.clear();
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f); },
                                      {"number of heads is unknown", "--heads"});
  EXPECT_EQ(io::module_from_state_dict(f, {.n_heads = 2}).cfg.n_heads, 2);
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f, {.n_heads = 4}); },
                                      {"n_heads 4 does not divide d_out 6"});

  io::tensor_file g = state_dict(layout::wrapper);
  g.metadata.clear();
  EXPECT_EQ(io::module_from_state_dict(g).cfg.n_heads, 3) << "counted heads.{h} groups";
  g.metadata["num_heads"] = "2";
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(g); },
      {"the metadata num_heads gives 2", "the 3 heads.{h} groups gives 3"});
  for (const char* bad : {"zero", "0", "-3", "3 ", ""}) {
    f.metadata["num_heads"] = bad;
    expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                    {"metadata num_heads", "positive integer"});
  }
}

// The seeds' GroupedQueryAttention: W_key and W_value of n_kv_heads * head_dim rows.
TEST(StateDict, KvHeadsFromTheShapesCheckedAgainstMetadataAndOption) {
  mha::config cfg = {.d_in = 5, .d_out = 8, .n_heads = 4, .context_length = 4, .n_kv_heads = 2};
  for (const layout l : {layout::split, layout::llama}) {
    io::tensor_file f = state_dict(l, cfg);
    f.metadata = {{"num_heads", "4"}, {"rope_base", "0"}};
    EXPECT_EQ(io::module_from_state_dict(f).cfg.n_kv_heads, 2) << "2 x head_dim 2 rows";
    EXPECT_EQ(io::module_from_state_dict(f, {.n_kv_heads = 2}).cfg.n_kv_heads, 2);
    expect_error<mha::invalid_argument>(
        [&] { io::module_from_state_dict(f, {.n_kv_heads = 4}); },
        {"K/V head counts disagree", "the n_kv_heads option (--kv-heads) gives 4", "the shape of ",
         "gives 2"});
    for (const char* key : {"num_kv_heads", "num_kv_groups"}) {
      io::tensor_file g = f;
      g.metadata[key] = "2";
      EXPECT_EQ(io::module_from_state_dict(g).cfg.n_kv_heads, 2) << key;
      g.metadata[key] = "1";
      expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                      {"K/V head counts disagree", key, "gives 1"});
      g.metadata[key] = "two";
      expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                      {"metadata ", key, "positive integer"});
    }
  }
  io::tensor_file f = state_dict(layout::split, cfg);
  f.metadata = {{"num_heads", "4"}};
  f.tensors["W_key.weight"] = {{3, 5}, std::vector<float>(15)};
  f.tensors["W_value.weight"] = {{3, 5}, std::vector<float>(15)};
  f.tensors.erase("W_key.bias");
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(f); },
      {"W_key.weight has 3 rows", "head_dim 2", "dividing n_heads"});
  f.tensors["W_key.weight"] = {{6, 5}, std::vector<float>(30)};
  f.tensors["W_value.weight"] = {{6, 5}, std::vector<float>(30)};
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f); },
                                      {"W_key.weight has 6 rows", "dividing n_heads"});
  f.tensors["W_value.weight"] = {{4, 5}, std::vector<float>(20)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"'W_value.weight' has shape (4, 5), expected (6, 5)"});
}

TEST(StateDict, RopeBaseFromMetadataOrOption) {
  mha::config cfg = square_config();
  cfg.rope_base = 500000.0;
  io::tensor_file f = state_dict(layout::split, cfg);
  EXPECT_EQ(f.metadata.at("rope_base"), "500000");
  EXPECT_EQ(io::module_from_state_dict(f).cfg.rope_base, 500000.0);
  EXPECT_EQ(io::module_from_state_dict(f, {.rope_base = 500000.0}).cfg.rope_base, 500000.0);
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(f, {.rope_base = 10000.0}); },
      {"rotary embedding bases disagree", "(--rope-base) gives 10000", "rope_base gives 500000"});
  f.metadata["rope_theta"] = "10000.0";
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"the metadata rope_theta gives 10000"});
  f.metadata.erase("rope_base");
  EXPECT_EQ(io::module_from_state_dict(f).cfg.rope_base, 10000.0) << "Hugging Face's name";
  for (const char* bad : {"-1", "inf", "nan", "1e400", "ten", ""}) {
    f.metadata["rope_theta"] = bad;
    expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                    {"metadata rope_theta", "a number >= 0"});
  }
  f.metadata.erase("rope_theta");
  EXPECT_EQ(io::module_from_state_dict(f).cfg.rope_base, 0.0) << "none stated: none";
  EXPECT_EQ(io::module_from_state_dict(f, {.rope_base = 10000.0}).cfg.rope_base, 10000.0);
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f, {.rope_base = 0.5}); },
                                      {"rope_base (0.5) must be 0"});
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f, {.rope_base = -1}); },
                                      {"rope_base option (-1)", ">= 0"});

  // Llama rotates: its base must be stated (0 states none).
  io::tensor_file llama = state_dict(layout::llama, square_config());
  llama.metadata.erase("rope_base");
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(llama); },
                                      {"rotates queries and keys", "rope_theta", "--rope-base"});
  EXPECT_EQ(io::module_from_state_dict(llama, {.rope_base = 0.0}).cfg.rope_base, 0.0);
  llama.metadata["rope_theta"] = "500000";
  EXPECT_EQ(io::module_from_state_dict(llama).cfg.rope_base, 500000.0);
}

TEST(StateDict, OutProjWithoutBiasIsLlamasAndTheSeedsGqa) {
  mha::config cfg = small_config(false);
  cfg.out_proj_bias = false;
  io::tensor_file f = state_dict(layout::split, cfg);
  EXPECT_FALSE(f.tensors.contains("out_proj.bias"));
  const io::loaded_module m = io::module_from_state_dict(f);
  EXPECT_TRUE(m.cfg.out_proj);
  EXPECT_FALSE(m.cfg.out_proj_bias);
}

TEST(StateDict, BuffersTheLayoutsCarryAreAccepted) {
  io::tensor_file gpt2 = state_dict(layout::gpt2, square_config());
  gpt2.tensors["masked_bias"] = {{}, {-1e4f}};
  EXPECT_EQ(io::module_from_state_dict(gpt2).cfg.context_length, 4);
  gpt2.tensors["bias"].shape = {1, 4, 4};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(gpt2); },
                                  {"'bias' has shape (1, 4, 4)", "(1, 1, C, C)"});
  io::tensor_file llama = state_dict(layout::llama, square_config());
  llama.tensors["rotary_emb.inv_freq"] = {{1}, {1.0f}};
  EXPECT_EQ(io::module_from_state_dict(llama).layout, layout::llama);
}

TEST(BadStateDict, UnexpectedNames) {
  for (const char* name : {"W_query.scale", "heads.0.out_proj.weight", "heads.01.W_query.weight",
                           "heads.x.W_query.weight", "heads.-1.W_query.weight", "heads.0",
                           "heads.99999999999999999999.mask", "encoder.W_query.weight"}) {
    io::tensor_file f = state_dict(layout::split);
    f.tensors[name] = {{1}, {0.0f}};
    expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                    {"unexpected tensor", name, "in a split block", "W_query"});
  }
  io::tensor_file f = state_dict(layout::gpt2, square_config());
  f.tensors["bias_k"] = {{1}, {0.0f}};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"unexpected tensor 'bias_k' in a gpt2 block", "c_attn.weight"});
}

// A sign or leading zero must not alias another head: heads.-0 would otherwise be read as
// head 0 and silently replace heads.0's tensors (issue 17 A).
TEST(BadStateDict, NonCanonicalHeadIndicesAreRejected) {
  for (const char* index : {"-0", "+0", "-1", "00", "01", " 0", "0x0", ""}) {
    io::tensor_file f = state_dict(layout::wrapper);
    const std::string name = std::string("heads.") + index + ".W_query.weight";
    f.tensors[name] = f.tensors.at("heads.0.W_query.weight");
    expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                    {"unexpected tensor", "not canonical", "no sign"});
  }
  io::tensor_file ok = state_dict(layout::wrapper);
  EXPECT_EQ(io::module_from_state_dict(ok).cfg.n_heads, 3);
}

TEST(BadStateDict, TwoLayoutsOrNone) {
  io::tensor_file f = state_dict(layout::split);
  const io::tensor_file heads = state_dict(layout::wrapper);
  f.tensors["heads.0.W_query.weight"] = heads.tensors.at("heads.0.W_query.weight");
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(f); },
      {"two layouts", "split ('W_key.weight')", "wrapper ('heads.0.W_query.weight')"});
  io::tensor_file g = state_dict(layout::llama, square_config());
  g.tensors["in_proj_weight"] = {{18, 6}, std::vector<float>(108)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                  {"two layouts", "torch_mha", "llama"});

  io::tensor_file only_proj;
  only_proj.tensors["out_proj.weight"] = {{2, 2}, {1, 2, 3, 4}};
  only_proj.tensors["q_weight"] = {{2, 2}, {1, 2, 3, 4}};
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(only_proj); },
      {"no attention weights in a layout mha knows", "split (the seeds'", "W_query.weight",
       "wrapper (", "heads.{h}.W_query.weight",
       "torch_mha (torch.nn.MultiheadAttention): "
       "in_proj_weight",
       "gpt2 (GPT-2's attention): c_attn.weight", "llama (Llama's attention): q_proj.weight"});
  io::tensor_file leftover = heads;
  leftover.tensors["W_query.bias"] = {{6}, std::vector<float>(6)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(leftover); },
                                  {"unexpected tensor 'W_query.bias'"});
}

TEST(BadStateDict, PrefixesHoldingABlockAreListed) {
  io::tensor_file model;
  for (int i = 0; i < 12; ++i) {
    for (auto& [name, t] :
         prefixed(state_dict(layout::gpt2, square_config()), "h." + std::to_string(i) + ".attn.")
             .tensors) {
      model.tensors.emplace(name, std::move(t));
    }
  }
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(model, {.n_heads = 3, .prefix = "h.12.attn."}); },
      {"no attention block at the prefix 'h.12.attn.'",
       "12 prefixes 'h.0.attn.', 'h.1.attn.', "
       "'h.10.attn.'",
       " and 2 more"});
  EXPECT_EQ(io::module_from_state_dict(model, {.n_heads = 3, .prefix = "h.11.attn."}).prefix,
            "h.11.attn.");
  expect_error<mha::invalid_argument>(
      [&] {
        io::module_from_state_dict(prefixed(state_dict(layout::split), "transformer.h.0.attn."));
      },
      {"holds an attention block at the prefix 'transformer.h.0.attn.', none at the top level"});
}

TEST(BadStateDict, MissingOrMisshapedTensors) {
  auto without = [](layout l, const std::string& name) {
    io::tensor_file f = state_dict(l, square_config());
    f.tensors.erase(name);
    return f;
  };
  auto reshaped = [](layout l, const std::string& name, std::vector<std::int64_t> shape) {
    io::tensor_file f = state_dict(l, square_config());
    std::int64_t n = 1;
    for (const std::int64_t d : shape) n *= d;
    f.tensors[name] = {std::move(shape), std::vector<float>(static_cast<std::size_t>(n))};
    return f;
  };
  const std::vector<std::pair<io::tensor_file, std::vector<const char*>>> bad = {
      {without(layout::split, "W_key.weight"), {"'W_key.weight' is missing"}},
      {without(layout::wrapper, "heads.1.W_value.weight"), {"'heads.1.W_value.weight' is missing"}},
      {without(layout::split, "W_value.bias"), {"2 of the 3 biases", "all or none"}},
      {without(layout::llama, "k_proj.bias"), {"2 of the 3 biases", "k_proj.bias"}},
      {without(layout::split, "out_proj.weight"),
       {"'out_proj.bias' is present without 'out_proj.weight'"}},
      {without(layout::torch_mha, "out_proj.weight"), {"'out_proj.weight' is missing"}},
      {without(layout::gpt2, "c_attn.bias"), {"'c_attn.bias' is missing"}},
      {without(layout::gpt2, "c_proj.weight"), {"'c_proj.weight' is missing"}},
      {reshaped(layout::split, "W_key.weight", {6, 5}),
       {"'W_key.weight' has 5 columns but 'W_query.weight' has 6", "same d_in"}},
      {reshaped(layout::split, "W_query.weight", {30}),
       {"'W_query.weight' has shape (30)", "(out, in)"}},
      {reshaped(layout::split, "out_proj.bias", {5}),
       {"'out_proj.bias' has shape (5), expected (6)"}},
      {reshaped(layout::torch_mha, "in_proj_weight", {12, 6}),
       {"'in_proj_weight' has shape (12, 6), expected (3 d, d) with d = 6"}},
      {reshaped(layout::torch_mha, "in_proj_bias", {12}),
       {"'in_proj_bias' has shape (12), expected (18)"}},
      {reshaped(layout::gpt2, "c_attn.weight", {18, 6}),
       {"'c_attn.weight' has shape (18, 6), expected (d, 3 d) with d = 18", "(in, out)"}},
      {reshaped(layout::gpt2, "c_proj.weight", {6, 5}),
       {"'c_proj.weight' has shape (6, 5), expected (6, 6)"}},
      {reshaped(layout::llama, "o_proj.weight", {6, 5}),
       {"'o_proj.weight' has shape (6, 5), expected (6, 6)"}},
  };
  for (const auto& [f, fragments] : bad) {
    try {
      io::module_from_state_dict(f);
      ADD_FAILURE() << "no error: " << fragments[0];
    } catch (const mha::format_error& e) {
      for (const char* fragment : fragments) EXPECT_THAT(e.what(), testing::HasSubstr(fragment));
    }
  }
}

TEST(BadStateDict, HeadsThatDisagreeOrHaveAGap) {
  io::tensor_file f = state_dict(layout::wrapper);
  for (const char* p : {"W_query", "W_key", "W_value"}) {
    f.tensors.erase(std::string("heads.1.") + p + ".weight");
    f.tensors.erase(std::string("heads.1.") + p + ".bias");
  }
  f.tensors.erase("heads.1.mask");
  f.metadata.clear();
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"heads up to heads.2 but no heads.1"});

  io::tensor_file g = state_dict(layout::wrapper, small_config(false));
  g.tensors["heads.2.W_query.weight"] = {{3, 5}, std::vector<float>(15)};
  g.tensors["heads.2.W_key.weight"] = {{3, 5}, std::vector<float>(15)};
  g.tensors["heads.2.W_value.weight"] = {{3, 5}, std::vector<float>(15)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                  {"head 2 has W_query.weight (3, 5)", "head 0 has (2, 5)"});
  g.tensors["heads.2.W_query.weight"] = {{2, 5}, std::vector<float>(10)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                  {"'heads.2.W_key.weight' has 3 rows", "as wide as its Q"});
}

TEST(BadStateDict, MasksMustBeSquareAndAgree) {
  io::tensor_file f = state_dict(layout::split);
  f.tensors["mask"] = {{4, 3}, std::vector<float>(12)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"'mask' has shape (4, 3)", "(C, C)"});
  io::tensor_file g = state_dict(layout::wrapper);
  g.tensors["heads.1.mask"] = {{5, 5}, std::vector<float>(25)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                  {"'heads.1.mask' is (5, 5)", "'heads.0.mask' is (4, 4)"});
}

TEST(BadStateDict, NegativeOptions) {
  for (const io::state_dict_options& o :
       {io::state_dict_options{.n_heads = -1}, io::state_dict_options{.n_kv_heads = -1},
        io::state_dict_options{.context_length = -1}}) {
    expect_error<mha::invalid_argument>(
        [&] { io::module_from_state_dict(state_dict(layout::wrapper), o); },
        {"n_heads (", "n_kv_heads (", "context_length (", "-1", ">= 0"});
  }
}

}  // namespace
