// Hugging Face model folders (mha::io::load_model, `mha run --model`, `mha inspect`): each known
// model type from its config.json, plain and sharded, the flags checked against the config, and
// hostile folders (files outside the folder, oversized or mistyped configs, broken indexes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "mha/error.hpp"
#include "mha/io.hpp"
#include "mha/registry.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
namespace io = mha::io;
using mha_test::expect_error;
using mha_test::expect_same_weights;
using nlohmann::json;

// `pattern` with its "{}" replaced by n.
std::string named(std::string pattern, int n) {
  return pattern.replace(pattern.find("{}"), 2, std::to_string(n));
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// The block of each of `layers` layers of one model: random weights of `cfg` in `l`, named
// <root><before><n><after>... as the model type names them, beside an embedding and an MLP
// tensor that are never part of a block.
struct model {
  mha::config cfg;
  std::vector<mha::weights> blocks;
  io::tensor_file file;
};
model make_model(const mha::config& cfg, io::layout l, const std::string& block_name,
                 int layers = 2) {
  model m{cfg, {}, {}};
  for (int n = 0; n < layers; ++n) {
    m.blocks.push_back(mha::weights::random(cfg, 40 + static_cast<std::uint64_t>(n)));
    const std::string prefix = named(block_name, n);
    for (auto& [name, t] : io::to_state_dict(cfg, m.blocks.back(), l).tensors) {
      // GPT-2's causal mask buffers are not saved by transformers 5.
      if (name != "bias") m.file.tensors.emplace(prefix + name, std::move(t));
    }
    m.file.tensors[prefix.substr(0, prefix.find_last_of('.', prefix.size() - 2) + 1) +
                   "mlp.weight"] = {{2, 2}, {1, 2, 3, 4}};
  }
  m.file.tensors["embeddings.weight"] = {{3, cfg.d_in}, std::vector<float>(3 * cfg.d_in)};
  m.file.metadata = {{"format", "pt"}};
  return m;
}

class ModelFolder : public mha_test::scratch_test {
 protected:
  // A Llama with 8 heads over 2 K/V heads, Llama 3.1's scaled rotary embedding, saved as a
  // *ForCausalLM does (model.layers.N.self_attn.).
  static mha::config llama_config() {
    mha::config c{.d_in = 32, .d_out = 32, .n_heads = 8, .context_length = 64};
    c.n_kv_heads = 2;
    c.out_proj_bias = false;
    c.rope_base = 500000.0;
    c.rope_scaling = {mha::rope_scaling::type::llama3, 8.0, 1.0, 4.0, 16};
    return c;
  }
  static json llama_json() {
    return {{"model_type", "llama"},
            {"hidden_size", 32},
            {"num_attention_heads", 8},
            {"num_key_value_heads", 2},
            {"num_hidden_layers", 2},
            {"max_position_embeddings", 64},
            {"head_dim", 4},
            {"attention_bias", false},
            {"dtype", "float32"},
            {"rope_parameters",
             {{"rope_type", "llama3"},
              {"rope_theta", 500000.0},
              {"factor", 8.0},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 16}}}};
  }
  // BERT's attention, as BertForMaskedLM saves it (bert.encoder.layer.N.attention.).
  static mha::config bert_config() {
    return {.d_in = 16,
            .d_out = 16,
            .n_heads = 2,
            .context_length = 24,
            .causal = false,
            .qkv_bias = true};
  }
  fs::path write_llama(const std::string& name, json config = llama_json()) {
    const fs::path folder = dir_ / name;
    llama_ = make_model(llama_config(), io::layout::llama, "model.layers.{}.self_attn.");
    write_text(folder / "config.json", config.dump());
    io::write_safetensors(folder / "model.safetensors", llama_.file);
    return folder;
  }
  // The llama model as two shards and an index: layer 0 in the first, layer 1 in the second.
  fs::path write_sharded(const std::string& name) {
    const fs::path folder = dir_ / name;
    llama_ = make_model(llama_config(), io::layout::llama, "model.layers.{}.self_attn.");
    write_text(folder / "config.json", llama_json().dump());
    io::tensor_file shards[2];
    json map = json::object();
    for (auto& [tensor, t] : llama_.file.tensors) {
      const int shard = tensor.starts_with("model.layers.1.") ? 1 : 0;
      const std::string file = named("model-0000{}-of-00002.safetensors", shard + 1);
      map[tensor] = file;
      shards[shard].tensors.emplace(tensor, t);
    }
    for (int s = 0; s < 2; ++s) {
      io::write_safetensors(folder / named("model-0000{}-of-00002.safetensors", s + 1), shards[s]);
    }
    write_text(folder / "model.safetensors.index.json",
               json{{"metadata", {{"total_size", 1}}}, {"weight_map", map}}.dump());
    return folder;
  }
  model llama_;
};

TEST_F(ModelFolder, LlamaFromItsConfigWithScaledRope) {
  const fs::path folder = write_llama("llama");
  const io::model_folder f = io::read_model_folder(folder);
  EXPECT_EQ(f.model_type, "llama");
  EXPECT_EQ(f.layers, 2);
  EXPECT_EQ(f.root, "model.");
  EXPECT_EQ(f.block_prefix(1), "model.layers.1.self_attn.");
  EXPECT_EQ(f.dtype, "float32");
  for (int layer = 0; layer < 2; ++layer) {
    const io::loaded_module m = io::load_model(folder, layer);
    EXPECT_EQ(m.layout, io::layout::llama);
    EXPECT_EQ(m.prefix, f.block_prefix(layer));
    EXPECT_EQ(m.cfg, llama_config()) << mha::to_string(m.cfg);
    expect_same_weights(m.w, llama_.blocks[static_cast<std::size_t>(layer)]);
  }
}

// Older and Hub configs: rope_theta and rope_scaling at the top level ("type" or "rope_type"),
// and the linear and default types.
TEST_F(ModelFolder, OlderRopeKeysAndTypes) {
  json c = llama_json();
  c.erase("rope_parameters");
  c["rope_theta"] = 500000.0;
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  mha::config expected = llama_config();
  expected.rope_scaling = {mha::rope_scaling::type::linear, 2.0};
  EXPECT_EQ(io::load_model(write_llama("linear", c), 0).cfg, expected);
  c["rope_scaling"] = nullptr;
  expected.rope_scaling = {};
  EXPECT_EQ(io::load_model(write_llama("plain", c), 0).cfg, expected);
  c.erase("rope_theta");  // Hugging Face's default base
  expected.rope_base = 10000.0;
  EXPECT_EQ(io::load_model(write_llama("default", c), 0).cfg, expected);
}

TEST_F(ModelFolder, Gpt2Qwen2AndBertConventions) {
  // GPT-2: Conv1D blocks at transformer.h.N.attn., every bias, n_embd/n_head/n_layer.
  mha::config gpt2{.d_in = 16, .d_out = 16, .n_heads = 4, .context_length = 32, .qkv_bias = true};
  model g = make_model(gpt2, io::layout::gpt2, "transformer.h.{}.attn.", 3);
  write_text(dir_ / "gpt2/config.json", json{{"model_type", "gpt2"},
                                             {"n_embd", 16},
                                             {"n_head", 4},
                                             {"n_layer", 3},
                                             {"n_positions", 32}}
                                            .dump());
  io::write_safetensors(dir_ / "gpt2/model.safetensors", g.file);
  io::loaded_module m = io::load_model(dir_ / "gpt2", 2);
  EXPECT_EQ(m.cfg, gpt2);
  expect_same_weights(m.w, g.blocks[2]);

  // Qwen2: Llama's names with Q/K/V biases and no o_proj bias, no model. root.
  mha::config qwen = llama_config();
  qwen.qkv_bias = true;
  qwen.rope_scaling = {};
  qwen.rope_base = 1000000.0;
  model q = make_model(qwen, io::layout::llama, "layers.{}.self_attn.");
  json qc = llama_json();
  qc["model_type"] = "qwen2";
  qc.erase("attention_bias");
  qc["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  write_text(dir_ / "qwen2/config.json", qc.dump());
  io::write_safetensors(dir_ / "qwen2/model.safetensors", q.file);
  m = io::load_model(dir_ / "qwen2", 1);
  EXPECT_EQ(m.cfg, qwen);
  expect_same_weights(m.w, q.blocks[1]);

  // BERT as BertForMaskedLM saves it: bert.encoder.layer.N.attention., not causal, with the
  // LayerNorm after the residual beside the block (not read into it).
  const mha::config bert = bert_config();
  model b = make_model(bert, io::layout::bert, "bert.encoder.layer.{}.attention.");
  for (int n = 0; n < 2; ++n) {
    b.file.tensors[named("bert.encoder.layer.{}.attention.output.LayerNorm.weight", n)] = {
        {16}, std::vector<float>(16, 1.0f)};
  }
  write_text(dir_ / "bert/config.json", json{{"model_type", "bert"},
                                             {"hidden_size", 16},
                                             {"num_attention_heads", 2},
                                             {"num_hidden_layers", 2},
                                             {"max_position_embeddings", 24},
                                             {"position_embedding_type", "absolute"}}
                                            .dump());
  io::write_safetensors(dir_ / "bert/model.safetensors", b.file);
  m = io::load_model(dir_ / "bert", 0);
  EXPECT_EQ(m.layout, io::layout::bert);
  EXPECT_EQ(m.cfg, bert);
  expect_same_weights(m.w, b.blocks[0]);

  // Configs whose sizes are not the tensors'.
  json narrow = llama_json();
  narrow["hidden_size"] = 16;
  narrow["head_dim"] = 2;
  expect_error<mha::format_error>([&] { io::load_model(write_llama("narrow", narrow), 0); },
                                  {"says hidden size 16", "maps 32 features to 32"});
  json kv = llama_json();
  kv["num_key_value_heads"] = 4;
  expect_error<mha::format_error>([&] { io::load_model(write_llama("kv", kv), 0); },
                                  {"K/V head counts disagree", "num_key_value_heads gives 4"});

  // A Llama whose config says attention_bias but whose tensors have none.
  json lc = llama_json();
  lc["attention_bias"] = true;
  expect_error<mha::format_error>([&] { io::load_model(write_llama("biased", lc), 0); },
                                  {"with Q/K/V biases", "attention_bias", "are without"});
}

// Only the shard holding the layer is opened: a corrupt second shard does not stop layer 0.
TEST_F(ModelFolder, ShardedReadsOnlyTheLayersShard) {
  const fs::path folder = write_sharded("sharded");
  const io::model_folder f = io::read_model_folder(folder);
  EXPECT_EQ(f.files.size(), 2u);
  EXPECT_EQ(f.block_files(1),
            std::vector<fs::path>{fs::canonical(folder) / "model-00002-of-00002.safetensors"});
  write_text(folder / "model-00002-of-00002.safetensors", "not a safetensors file");
  const io::loaded_module m = io::load_model(folder, 0);
  expect_same_weights(m.w, llama_.blocks[0]);
  expect_error<mha::format_error>([&] { io::load_model(folder, 1); },
                                  {"model-00002-of-00002.safetensors"});
  fs::remove(folder / "model-00002-of-00002.safetensors");
  expect_error<mha::format_error>([&] { io::load_model(folder, 0); },
                                  {"model-00002-of-00002.safetensors", "cannot be opened"});
}

TEST_F(ModelFolder, IndexNamingATensorItsShardLacks) {
  const fs::path folder = write_sharded("lying");
  json index = json::parse(std::ifstream(folder / "model.safetensors.index.json"));
  index["weight_map"]["model.layers.0.self_attn.extra.weight"] = "model-00001-of-00002.safetensors";
  write_text(folder / "model.safetensors.index.json", index.dump());
  expect_error<mha::format_error>([&] { io::load_model(folder, 0); },
                                  {"lacks the tensor 'model.layers.0.self_attn.extra.weight'"});
}

// Every file an index names must resolve inside the folder.
TEST_F(ModelFolder, ShardsOutsideTheFolderAreRefused) {
  const fs::path folder = write_sharded("escape");
  write_text(dir_ / "outside.safetensors", "x");
  fs::create_symlink(dir_ / "outside.safetensors", folder / "link.safetensors");
  const json original = json::parse(std::ifstream(folder / "model.safetensors.index.json"));
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"../outside.safetensors", {"'../outside.safetensors'", "outside the model folder"}},
      {(dir_ / "outside.safetensors").string(), {"not a relative path inside the folder"}},
      {"link.safetensors", {"'link.safetensors'", "outside the model folder"}},
      {"model.safetensors.index.json", {"the folder's own index, as a shard"}},
      {"config.json", {"the folder's own config.json, as a shard"}},
      {"missing.safetensors", {"'missing.safetensors'", "cannot be opened"}},
  };
  for (const auto& [shard, message] : cases) {
    json index = original;
    index["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = shard;
    write_text(folder / "model.safetensors.index.json", index.dump());
    expect_error<mha::format_error>([&] { io::read_model_folder(folder); }, message);
  }
  // 100k entries naming the index itself: refused at the first, not read 100k times.
  json index = {{"weight_map", json::object()}};
  for (int i = 0; i < 100000; ++i) {
    index["weight_map"][named("t{}", i)] = "model.safetensors.index.json";
  }
  write_text(folder / "model.safetensors.index.json", index.dump());
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); }, {"own index"});
}

// A Hugging Face cache snapshot links its files into the repo's blobs/: allowed there only.
TEST_F(ModelFolder, CacheSnapshotLinksIntoItsBlobs) {
  const fs::path source = write_llama("source");
  const fs::path repo = dir_ / "models--org--tiny";
  const fs::path snapshot = repo / "snapshots" / "abc123";
  fs::create_directories(snapshot);
  fs::create_directories(repo / "blobs");
  // Blobs are named by their hashes; the snapshot's links by what they are.
  for (const char* file : {"config.json", "model.safetensors"}) {
    const std::string blob = std::string(file) == "config.json" ? "9f3c" : "e81a";
    fs::copy_file(source / file, repo / "blobs" / blob);
    fs::create_symlink(fs::path("../../blobs") / blob, snapshot / file);
  }
  expect_same_weights(io::load_model(snapshot, 1).w, llama_.blocks[1]);
  EXPECT_EQ(io::read_model_folder(snapshot).file_names,
            std::vector<std::string>{"model.safetensors"});
  const mha_test::command_result inspect =
      mha_test::run_mha({"inspect", "--model", snapshot.string()});
  EXPECT_THAT(inspect.output, testing::HasSubstr("layer 1: model.layers.1.self_attn. in "
                                                 "model.safetensors\n"));
  EXPECT_THAT(inspect.output, testing::Not(testing::HasSubstr("e81a")));
  // A snapshot whose blob was deleted: the link dangles, and the message says so.
  fs::remove(repo / "blobs" / "e81a");
  expect_error<mha::format_error>(
      [&] { io::read_model_folder(snapshot); },
      {"'model.safetensors'", "a link to '../../blobs/e81a'", "does not exist (a dangling link)"});
  fs::copy_file(source / "model.safetensors", repo / "blobs" / "e81a");
  // A link into another repo's blobs is outside.
  const fs::path other = dir_ / "models--org--other" / "blobs";
  fs::create_directories(other);
  fs::rename(repo / "blobs" / "e81a", other / "model.safetensors");
  fs::remove(snapshot / "model.safetensors");
  fs::create_symlink(other / "model.safetensors", snapshot / "model.safetensors");
  expect_error<mha::format_error>([&] { io::read_model_folder(snapshot); },
                                  {"'model.safetensors'", "outside the model folder"});
}

TEST_F(ModelFolder, HostileOrWrongConfigs) {
  struct bad {
    std::function<void(json&)> change;
    std::vector<std::string> message;
  };
  const bad cases[] = {
      {[](json& c) { c["num_attention_heads"] = "8"; },
       {"num_attention_heads is \"8\", expected a positive integer"}},
      {[](json& c) { c["num_hidden_layers"] = -2; }, {"num_hidden_layers is -2"}},
      {[](json& c) { c.erase("hidden_size"); }, {"has no hidden_size"}},
      {[](json& c) { c["rope_parameters"]["factor"] = "8"; },
       {"rope_parameters.factor is \"8\", expected a number"}},
      {[](json& c) { c["num_key_value_heads"] = 3; },
       {"num_key_value_heads is 3, which does not divide num_attention_heads 8"}},
      {[](json& c) { c["rope_parameters"] = 5; }, {"rope_parameters is 5, expected an object"}},
  };
  for (const bad& b : cases) {
    json c = llama_json();
    b.change(c);
    expect_error<mha::format_error>([&] { io::read_model_folder(write_llama("bad", c)); },
                                    b.message);
  }
  // What mha does not compute: a rope type or a partial rotary embedding, a model type it does
  // not know.
  json longrope = llama_json();
  longrope["rope_parameters"]["rope_type"] = "longrope";
  expect_error<mha::unsupported>(
      [&] { io::read_model_folder(write_llama("longrope", longrope)); },
      {"rope_parameters.rope_type is 'longrope'", "default, linear, llama3 and yarn"});
  json partial = llama_json();
  partial["rope_parameters"]["partial_rotary_factor"] = 0.5;
  expect_error<mha::unsupported>([&] { io::read_model_folder(write_llama("partial", partial)); },
                                 {"partial_rotary_factor is 0.5"});
  // Heads wider than the hidden size are read (config::out_features), and must be the tensors'.
  json wide = llama_json();
  wide["head_dim"] = 8;
  const fs::path wide_folder = write_llama("wide", wide);
  EXPECT_EQ(io::read_model_folder(wide_folder).cfg.d_out, 64);
  expect_error<mha::format_error>(
      [&] { io::load_model(wide_folder, 0); },
      {"says hidden size 32 and heads of 64 features", "maps 32 features to 32 and back to 32"});
  json unknown = llama_json();
  unknown["model_type"] = "qwen3";
  expect_error<mha::unsupported>(
      [&] { io::read_model_folder(write_llama("unknown", unknown)); },
      {"model_type 'qwen3' is not one mha reads",
       "gpt2, llama, mistral, qwen2, gemma2, gemma3_text, gpt_oss, bert"});

  // Size and depth capped before anything is built from them.
  const fs::path folder = write_llama("huge");
  write_text(folder / "config.json",
             "{\"model_type\": \"llama\", \"pad\": \"" + std::string(2 << 20, 'x') + "\"}");
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); },
                                  {"config.json", "more than the 1048576 bytes"});
  write_text(folder / "config.json", std::string(100000, '[') + std::string(100000, ']'));
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); },
                                  {"config.json", "deeper than 64 levels"});
  write_text(folder / "config.json", "{\"model_type\": \"llama\", \"model_type\": \"gpt2\"}");
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); },
                                  {"the key 'model_type' twice"});
  expect_error<mha::invalid_argument>([&] { io::read_model_folder(dir_ / "nothing"); },
                                      {"is not a folder"});
}

// What the caller states must be what the config states.
TEST_F(ModelFolder, OptionsMustAgreeWithTheConfig) {
  const fs::path folder = write_llama("llama");
  EXPECT_EQ(io::load_model(folder, 0, {.n_heads = 8, .n_kv_heads = 2}).cfg.n_heads, 8);
  expect_error<mha::invalid_argument>(
      [&] { io::load_model(folder, 0, {.n_heads = 4}); },
      {"the n_heads option (--heads) gives 4", "config.json's heads is 8"});
  expect_error<mha::invalid_argument>([&] { io::load_model(folder, 0, {.rope_base = 10000.0}); },
                                      {"--rope-base", "10000", "500000"});
  EXPECT_EQ(io::load_model(folder, 0, {.context_length = 10}).cfg.context_length, 10);
  expect_error<mha::invalid_argument>([&] { io::load_model(folder, 0, {.context_length = 65}); },
                                      {"65 exceeds", "max_position_embeddings 64"});
  expect_error<mha::invalid_argument>([&] { io::load_model(folder, 2); },
                                      {"layer 2 is not one of the model's 2 layers"});
  expect_error<mha::invalid_argument>(
      [&] { io::load_model(folder, 0, {.prefix = "model.layers.0."}); }, {"--prefix"});
}

// Tensors beside the block are never read, whatever their dtype: an int64 buffer, a dtype newer
// than this reader.
TEST_F(ModelFolder, TensorsOutsideTheBlockAreNotRead) {
  const fs::path folder = write_llama("llama");
  std::vector<std::byte> bytes = io::safetensors_bytes(llama_.file);
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = header_size << 8 | std::to_integer<std::uint64_t>(bytes[i]);
  json header =
      json::parse(std::string(reinterpret_cast<const char*>(bytes.data()) + 8, header_size));
  const std::uint64_t data = bytes.size() - 8 - header_size;
  header["model.position_ids"] = {
      {"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {data, data + 16}}};
  header["model.packed"] = {
      {"dtype", "F4"}, {"shape", {4}}, {"data_offsets", {data + 16, data + 18}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = std::byte(text.size() >> (8 * i));
  for (char ch : text) out.push_back(std::byte(ch));
  out.insert(out.end(), bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size), bytes.end());
  out.insert(out.end(), 18, std::byte{7});
  std::ofstream(folder / "model.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  expect_same_weights(io::load_model(folder, 1).w, llama_.blocks[1]);
  expect_error<mha::format_error>([&] { io::read_safetensors(folder / "model.safetensors"); },
                                  {"'model.position_ids' has the unsupported dtype 'I64'"});
}

// Every layer config.json counts must have its block among the tensors; the first missing one
// is named, so a config of 2^62 layers is refused at once (inspect once printed a line per
// layer without end) and a layer beyond the tensors is named rather than listing every layout.
TEST_F(ModelFolder, EveryLayerHasItsBlock) {
  json many = llama_json();
  many["num_hidden_layers"] = std::int64_t{1} << 62;
  const fs::path folder = write_llama("many", many);
  expect_error<mha::format_error>([&] { io::load_model(folder, 5); },
                                  {"says the model has 4611686018427387904 layers",
                                   "no attention block of layer 2 at "
                                   "'model.layers.2.self_attn.'"});
  const mha_test::command_result inspect =
      mha_test::run_mha({"inspect", "--model", folder.string()});
  EXPECT_EQ(inspect.exit_code, 2);
  EXPECT_LT(inspect.output.size(), 1000u) << inspect.output;

  const fs::path sharded = write_sharded("lacking");
  json index = json::parse(std::ifstream(sharded / "model.safetensors.index.json"));
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end();) {
    it = it.key().starts_with("model.layers.1.") ? index["weight_map"].erase(it) : std::next(it);
  }
  write_text(sharded / "model.safetensors.index.json", index.dump());
  expect_error<mha::format_error>([&] { io::load_model(sharded, 0); },
                                  {"no attention block of layer 1 at 'model.layers.1.self_attn.'"});
}

// An index is read as a stream into one buffer of names: its entries and shards are capped
// (an index of 4.8 million entries once took 3.5 GB and 19 s), duplicate names are refused, and
// a link that loops is named as one.
TEST_F(ModelFolder, IndexesAreCappedAndReadLean) {
  const fs::path folder = write_sharded("capped");
  std::string text = R"({"weight_map": {"model.layers.0.self_attn.q_proj.weight": "s.safetensors")";
  text.reserve(static_cast<std::size_t>(io::max_model_index_entries) * 16);
  for (std::int64_t i = 0; i < io::max_model_index_entries; ++i) {
    text += ",\"t" + std::to_string(i) + "\":\"s.safetensors\"";
  }
  text += "}}";
  fs::copy_file(folder / "model-00001-of-00002.safetensors", folder / "s.safetensors");
  write_text(folder / "model.safetensors.index.json", text);
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); },
                                  {"names more than 1048576 tensors"});
  write_text(
      folder / "model.safetensors.index.json",
      R"({"weight_map": {"b": "s.safetensors", "a": "s.safetensors", "b": "s.safetensors"}})");
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); },
                                  {"weight_map has the key 'b' twice"});
  for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"weight_map": {"a": 5}})", "weight_map entry 'a' is 5, expected a shard's file"},
           {R"({"weight_map": {"a": ["x"]}})", "weight_map entry 'a' is an array"},
           {R"({"weight_map": "x"})", "has no weight_map object"},
           {R"({"metadata": {"k": 1, "k": 2}, "weight_map": {}})", "has the key 'k' twice"},
           {R"([1, 2])", "is a JSON array, expected an object"},
           {R"({"weight_map": {"a": "s.safetensors")", "is not valid JSON"}}) {
    write_text(folder / "model.safetensors.index.json", bad);
    expect_error<mha::format_error>([&] { io::read_model_folder(folder); }, {message.c_str()});
  }
  fs::create_symlink("loop.safetensors", folder / "loop.safetensors");
  write_text(folder / "model.safetensors.index.json",
             R"({"weight_map": {"model.layers.0.self_attn.q_proj.weight": "loop.safetensors"}})");
  expect_error<mha::format_error>([&] { io::read_model_folder(folder); },
                                  {"'loop.safetensors'", "a link in a loop of links"});
}

// `mha inspect` validates as `mha run` does (a bad rope value is refused by both, naming
// config.json and the key) and prints file content escaped.
TEST_F(ModelFolder, InspectValidatesAndEscapesAsRunDoes) {
  json bad = llama_json();
  bad["rope_parameters"]["factor"] = 0;
  const fs::path folder = write_llama("bad", bad);
  for (const char* command : {"inspect", "run"}) {
    std::vector<std::string> line = {command, "--model", folder.string()};
    if (std::string(command) == "run") {
      io::write_npy(dir_ / "x.npy", {{1, 2, 32}, std::vector<float>(64)});
      line.insert(line.end(), {"--layer", "0", "--input", (dir_ / "x.npy").string(), "--output",
                               (dir_ / "y.npy").string()});
    }
    const mha_test::command_result r = mha_test::run_mha(line);
    EXPECT_EQ(r.exit_code, 2) << command;
    EXPECT_THAT(r.output, testing::HasSubstr("config.json: rope_parameters.factor is 0, expected a "
                                             "number >= 1"))
        << command;
  }
  json escaping = llama_json();
  escaping["dtype"] = "float32\x1b[31m\x07";
  const mha_test::command_result r =
      mha_test::run_mha({"inspect", "--model", write_llama("escaping", escaping).string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, testing::HasSubstr("dtype float32\\x1b[31m\\x07\n"));
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos);
}

// An encoder's attention sees the whole sequence: `mha run --incremental` refuses it (it once
// ran, 3x off the forward) and a causal BERT (is_decoder) decodes.
TEST_F(ModelFolder, AnEncoderHasNoDecode) {
  const mha::config bert = bert_config();
  model b = make_model(bert, io::layout::bert, "bert.encoder.layer.{}.attention.");
  fs::create_directories(dir_ / "bert");
  io::write_safetensors(dir_ / "bert/model.safetensors", b.file);
  io::write_npy(dir_ / "x.npy", {{1, 5, 16}, mha_test::random_floats(80, 2)});
  for (const bool decoder : {false, true}) {
    write_text(dir_ / "bert/config.json", json{{"model_type", "bert"},
                                               {"hidden_size", 16},
                                               {"num_attention_heads", 2},
                                               {"num_hidden_layers", 2},
                                               {"max_position_embeddings", 24},
                                               {"is_decoder", decoder}}
                                              .dump());
    const mha_test::command_result r = mha_test::run_mha(
        {"run", "--model", (dir_ / "bert").string(), "--layer", "0", "--incremental", "--input",
         (dir_ / "x.npy").string(), "--output", (dir_ / "y.npy").string()});
    EXPECT_EQ(r.exit_code, decoder ? 0 : 2) << r.output;
    if (!decoder) {
      EXPECT_THAT(r.output, testing::HasSubstr("an encoder's attention"));
    }
  }
}

// `mha run --model` computes what a plan of the loaded block computes; `mha inspect` names
// every layer's block.
TEST_F(ModelFolder, CommandLine) {
  const fs::path folder = write_llama("llama");
  const mha_test::command_result inspect =
      mha_test::run_mha({"inspect", "--model", folder.string()});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  for (const char* part :
       {"llama model (llama layout), 2 layers, dtype float32", "8 heads of 4, 2 K/V heads, causal",
        "base 500000, llama3 scaling (factor 8, low_freq_factor 1, "
        "high_freq_factor 4, original context 16)",
        "layer 1: model.layers.1.self_attn. in model.safetensors"}) {
    EXPECT_THAT(inspect.output, testing::HasSubstr(part));
  }
  io::tensor x{{1, 20, 32}, mha_test::random_floats(20 * 32, 3)};
  io::write_npy(dir_ / "x.npy", x);
  const mha_test::command_result run = mha_test::run_mha(
      {"run", "--model", folder.string(), "--layer", "1", "--backend", "naive", "--input",
       (dir_ / "x.npy").string(), "--output", (dir_ / "y.npy").string()});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  mha::config cfg = llama_config();
  cfg.context_length = 20;
  std::vector<float> y(20 * 32);
  mha::require_backend("naive")
      .prepare(cfg, mha::formulation::split_weight, llama_.blocks[1])
      ->run({x.values.data(), 1, 20, 32}, {y.data(), 1, 20, 32});
  EXPECT_EQ(io::read_npy(dir_ / "y.npy").values, y);
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--model", folder.string()}, "--model needs --layer"},
           {{"--model", folder.string(), "--layer", "0", "--weights", "w"}, "either --model"},
           {{"--model", folder.string(), "--layer", "0", "--prefix", "p"}, "--prefix applies to"},
           {{"--model", folder.string(), "--layer", "0", "--heads", "2"},
            "config.json's heads is 8"}}) {
    std::vector<std::string> line = {"run", "--input", (dir_ / "x.npy").string(), "--output",
                                     (dir_ / "z.npy").string()};
    line.insert(line.end(), args.begin(), args.end());
    const mha_test::command_result r = mha_test::run_mha(line);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, testing::HasSubstr(message));
  }
}

}  // namespace
