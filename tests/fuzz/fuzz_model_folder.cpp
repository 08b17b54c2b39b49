// libFuzzer target: a Hugging Face model folder (read_model_folder, load_model) whose
// config.json is the input up to its first NUL byte and, when the input has one, whose
// model.safetensors.index.json is the rest (the folder then has two shards instead of
// model.safetensors). Reading returns or throws mha::format_error / mha::invalid_argument /
// mha::unsupported; a layer it loads is a valid module (validate() passes) of the config's sizes
// that runs on the naive backend at its context length, and nothing is read outside the folder
// (the one file outside it, a valid shard, must never be accepted).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"

namespace {

namespace fs = std::filesystem;

// A scratch folder per process: a two-layer Llama as one file and as shards (one per layer) and,
// beside the folder, a copy of a shard that no index may reach.
struct folder {
  fs::path root, model;
  folder() {
    root = fs::temp_directory_path() / ("mha_fuzz_model_folder_" + std::to_string(getpid()));
    model = root / "model";
    fs::create_directories(model);
    mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 16};
    cfg.out_proj_bias = false;
    mha::io::tensor_file both;
    for (int layer = 0; layer < 2; ++layer) {
      mha::io::tensor_file shard;
      const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
      for (auto& [name, t] :
           mha::io::to_state_dict(cfg, mha::weights::random(cfg, 1), mha::io::layout::llama)
               .tensors) {
        both.tensors.emplace(prefix + name, t);
        shard.tensors.emplace(prefix + name, std::move(t));
      }
      mha::io::write_safetensors(model / ("shard" + std::to_string(layer) + ".safetensors"), shard);
      if (layer == 0) mha::io::write_safetensors(root / "outside.safetensors", shard);
    }
    mha::io::write_safetensors(model / "both.safetensors", both);
  }
  ~folder() { fs::remove_all(root); }
};

void write(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const folder f;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  write(f.model / "config.json", input.substr(0, nul));
  fs::remove(f.model / "model.safetensors.index.json");
  fs::remove(f.model / "model.safetensors");
  if (nul == std::string_view::npos) {
    fs::copy_file(f.model / "both.safetensors", f.model / "model.safetensors");
  } else {
    write(f.model / "model.safetensors.index.json", input.substr(nul + 1));
  }
  try {
    const mha::io::model_folder m = mha::io::read_model_folder(f.model);
    for (const fs::path& file : m.files) {
      mha_fuzz::require(file.parent_path() == fs::canonical(f.model), "a file outside the folder");
    }
    for (std::int64_t layer = 0; layer < std::min<std::int64_t>(m.layers, 2); ++layer) {
      mha::io::loaded_module block = mha::io::load_model(f.model, layer);
      mha::validate(block.cfg, block.w);  // must not throw
      mha_fuzz::run_first_tokens(block.cfg, block.w);
      mha_fuzz::require(block.cfg.d_in == m.cfg.d_in && block.cfg.n_heads == m.cfg.n_heads &&
                            block.cfg.kv_heads() == m.cfg.kv_heads(),
                        "a block of the config's sizes");
    }
  } catch (const mha::format_error&) {
  } catch (const mha::invalid_argument&) {
  } catch (const mha::unsupported&) {
  }
  return 0;
}
