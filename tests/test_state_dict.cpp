// A PyTorch state_dict <-> (config, weights): both layouts, where n_heads and context_length come
// from, and every way a state_dict can disagree with itself or with the options.
#include <gtest/gtest.h>

#include "mha/error.hpp"
#include "mha/io.hpp"
#include "support.hpp"

namespace {

namespace io = mha::io;
using mha::formulation;
using mha_test::expect_error;

mha::config small_config(bool qkv_bias = true, bool out_proj = true) {
  return {.d_in = 5,
          .d_out = 6,
          .n_heads = 3,
          .context_length = 4,
          .qkv_bias = qkv_bias,
          .out_proj = out_proj};
}

void expect_same_weights(const mha::weights& a, const mha::weights& b) {
  for (auto [x, y] : {std::pair{&a.query, &b.query},
                      {&a.key, &b.key},
                      {&a.value, &b.value},
                      {&a.out_proj, &b.out_proj}}) {
    EXPECT_EQ(x->out, y->out);
    EXPECT_EQ(x->in, y->in);
    EXPECT_EQ(x->weight, y->weight);
    EXPECT_EQ(x->bias, y->bias);
  }
}

// The state_dict of a random small module, in `layout`.
io::tensor_file state_dict(formulation layout, const mha::config& cfg = small_config()) {
  return io::to_state_dict(cfg, mha::weights::random(cfg, 5), layout);
}

class BothLayouts : public testing::TestWithParam<formulation> {};

TEST_P(BothLayouts, RoundTripsEveryFlagCombination) {
  for (bool bias : {false, true}) {
    for (bool proj : {false, true}) {
      const mha::config cfg = small_config(bias, proj);
      const mha::weights w = mha::weights::random(cfg, 9);
      // Through the file format too: what is written is what PyTorch's load_state_dict reads.
      const io::loaded_module m = io::module_from_state_dict(
          io::parse_safetensors(io::safetensors_bytes(io::to_state_dict(cfg, w, GetParam()))));
      EXPECT_EQ(m.layout, GetParam());
      EXPECT_EQ(mha::to_string(m.cfg), mha::to_string(cfg));
      expect_same_weights(m.w, w);
    }
  }
}

TEST_P(BothLayouts, NamesArePyTorchs) {
  const io::tensor_file f = state_dict(GetParam());
  const std::string head = GetParam() == formulation::wrapper ? "heads.2." : "";
  for (const std::string& name :
       {head + "W_query.weight", head + "W_key.bias", head + "W_value.weight", head + "mask",
        std::string("out_proj.weight"), std::string("out_proj.bias")}) {
    EXPECT_TRUE(f.tensors.contains(name)) << name;
  }
  EXPECT_EQ(f.tensors.at(head + "W_query.weight").shape,
            (std::vector<std::int64_t>{GetParam() == formulation::wrapper ? 2 : 6, 5}));
  // triu(ones(4, 4), diagonal=1)
  EXPECT_EQ(f.tensors.at(head + "mask").values,
            (std::vector<float>{0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(f.metadata.at("num_heads"), "3");
}

TEST_P(BothLayouts, ContextLengthFromMaskOrOption) {
  EXPECT_EQ(io::module_from_state_dict(state_dict(GetParam())).cfg.context_length, 4);
  EXPECT_EQ(
      io::module_from_state_dict(state_dict(GetParam()), {.context_length = 3}).cfg.context_length,
      3);
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(state_dict(GetParam()), {.context_length = 5}); },
      {"context_length 5", "mask buffer (4, 4)"});
  io::tensor_file f = state_dict(GetParam());
  std::erase_if(f.tensors, [](const auto& e) { return e.first.ends_with("mask"); });
  EXPECT_EQ(io::module_from_state_dict(f).cfg.context_length, 0) << "no mask, no option";
}

TEST_P(BothLayouts, HeadsOptionMustAgreeWithTheFile) {
  EXPECT_EQ(io::module_from_state_dict(state_dict(GetParam()), {.n_heads = 3}).cfg.n_heads, 3);
  expect_error<mha::invalid_argument>(
      [&] { io::module_from_state_dict(state_dict(GetParam()), {.n_heads = 2}); },
      {"head counts disagree", "gives 3", "the n_heads option (--heads) gives 2"});
}

INSTANTIATE_TEST_SUITE_P(Layouts, BothLayouts,
                         testing::Values(formulation::wrapper, formulation::split_weight),
                         [](const auto& param) {
                           return std::string(mha::to_string(param.param));
                         });

TEST(StateDict, WrapperLayoutStacksHeadsIntoTheSplitWeights) {
  const mha::config cfg = small_config();
  const mha::weights w = mha::weights::random(cfg, 2);
  expect_same_weights(
      io::module_from_state_dict(io::to_state_dict(cfg, w, formulation::wrapper)).w,
      io::module_from_state_dict(io::to_state_dict(cfg, w, formulation::split_weight)).w);
}

TEST(StateDict, HeadsFromMetadataOptionOrGroups) {
  io::tensor_file f = state_dict(formulation::split_weight);
  f.metadata.clear();
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f); },
                                      {"number of heads is unknown", "--heads"});
  EXPECT_EQ(io::module_from_state_dict(f, {.n_heads = 2}).cfg.n_heads, 2);
  expect_error<mha::invalid_argument>([&] { io::module_from_state_dict(f, {.n_heads = 4}); },
                                      {"n_heads 4 does not divide d_out 6"});

  io::tensor_file g = state_dict(formulation::wrapper);
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

TEST(BadStateDict, UnexpectedNames) {
  for (const char* name : {"W_query.scale", "heads.0.out_proj.weight", "heads.01.W_query.weight",
                           "heads.x.W_query.weight", "heads.-1.W_query.weight", "heads.0",
                           "heads.99999999999999999999.mask", "encoder.W_query.weight"}) {
    io::tensor_file f = state_dict(formulation::split_weight);
    f.tensors[name] = {{1}, {0.0f}};
    expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                    {"unexpected tensor", name});
  }
}

// A sign or leading zero must not alias another head: heads.-0 would otherwise be read as
// head 0 and silently replace heads.0's tensors (issue 17 A).
TEST(BadStateDict, NonCanonicalHeadIndicesAreRejected) {
  for (const char* index : {"-0", "+0", "-1", "00", "01", " 0", "0x0", ""}) {
    io::tensor_file f = state_dict(formulation::wrapper);
    const std::string name = std::string("heads.") + index + ".W_query.weight";
    f.tensors[name] = f.tensors.at("heads.0.W_query.weight");
    expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                    {"unexpected tensor", "not canonical", "no sign"});
  }
  io::tensor_file ok = state_dict(formulation::wrapper);
  EXPECT_EQ(io::module_from_state_dict(ok).cfg.n_heads, 3);
}

TEST(BadStateDict, MixedOrNoLayout) {
  io::tensor_file f = state_dict(formulation::split_weight);
  const io::tensor_file heads = state_dict(formulation::wrapper);
  f.tensors["heads.0.W_query.weight"] = heads.tensors.at("heads.0.W_query.weight");
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"both split names", "heads.0"});
  io::tensor_file only_proj;
  only_proj.tensors["out_proj.weight"] = {{2, 2}, {1, 2, 3, 4}};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(only_proj); },
                                  {"no attention weights"});
  io::tensor_file leftover = heads;
  leftover.tensors["W_query.bias"] = {{6}, std::vector<float>(6)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(leftover); },
                                  {"unexpected tensor 'W_query.bias'"});
}

TEST(BadStateDict, MissingOrMisshapedTensors) {
  auto without = [](formulation layout, const std::string& name) {
    io::tensor_file f = state_dict(layout);
    f.tensors.erase(name);
    return f;
  };
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(without(formulation::split_weight, "W_key.weight")); },
      {"'W_key.weight' is missing"});
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(without(formulation::wrapper, "heads.1.W_value.weight")); },
      {"'heads.1.W_value.weight' is missing"});
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(without(formulation::split_weight, "W_value.bias")); },
      {"2 of the 3 biases", "all or none"});
  expect_error<mha::format_error>(
      [&] { io::module_from_state_dict(without(formulation::split_weight, "out_proj.bias")); },
      {"'out_proj.weight' is present without 'out_proj.bias'"});

  io::tensor_file f = state_dict(formulation::split_weight);
  f.tensors["W_key.weight"].shape = {5, 6};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"'W_key.weight' has shape (5, 6), expected (6, 5)"});
  f = state_dict(formulation::split_weight);
  f.tensors["W_query.weight"] = {{30}, std::vector<float>(30)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"'W_query.weight' has shape (30)", "(out, in)"});
  f = state_dict(formulation::split_weight);
  f.tensors["out_proj.bias"] = {{5}, std::vector<float>(5)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"'out_proj.bias' has shape (5), expected (6)"});
}

TEST(BadStateDict, HeadsThatDisagreeOrHaveAGap) {
  io::tensor_file f = state_dict(formulation::wrapper);
  for (const char* p : {"W_query", "W_key", "W_value"}) {
    f.tensors.erase(std::string("heads.1.") + p + ".weight");
    f.tensors.erase(std::string("heads.1.") + p + ".bias");
  }
  f.tensors.erase("heads.1.mask");
  f.metadata.clear();
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"heads up to heads.2 but no heads.1"});

  io::tensor_file g = state_dict(formulation::wrapper, small_config(false));
  g.tensors["heads.2.W_query.weight"] = {{3, 5}, std::vector<float>(15)};
  g.tensors["heads.2.W_key.weight"] = {{3, 5}, std::vector<float>(15)};
  g.tensors["heads.2.W_value.weight"] = {{3, 5}, std::vector<float>(15)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                  {"head 2 has W_query.weight (3, 5)", "head 0 has (2, 5)"});
}

TEST(BadStateDict, MasksMustBeSquareAndAgree) {
  io::tensor_file f = state_dict(formulation::split_weight);
  f.tensors["mask"] = {{4, 3}, std::vector<float>(12)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(f); },
                                  {"'mask' has shape (4, 3)", "(C, C)"});
  io::tensor_file g = state_dict(formulation::wrapper);
  g.tensors["heads.1.mask"] = {{5, 5}, std::vector<float>(25)};
  expect_error<mha::format_error>([&] { io::module_from_state_dict(g); },
                                  {"'heads.1.mask' is (5, 5)", "'heads.0.mask' is (4, 4)"});
}

TEST(BadStateDict, NegativeOptions) {
  expect_error<mha::invalid_argument>(
      [] { io::module_from_state_dict(state_dict(formulation::wrapper), {.n_heads = -1}); },
      {"n_heads (-1)"});
}

}  // namespace
