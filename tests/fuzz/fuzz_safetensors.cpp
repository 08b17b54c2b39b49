// libFuzzer target: parse_safetensors on arbitrary bytes. It returns or throws
// mha::format_error, never reads out of bounds (ASan) or hits undefined behaviour (UBSan), and
// what it returns survives safetensors_bytes -> parse_safetensors unchanged.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  mha::io::tensor_file file;
  try {
    file = mha::io::parse_safetensors({reinterpret_cast<const std::byte*>(data), size});
  } catch (const mha::format_error&) {
    return 0;
  }
  const mha::io::tensor_file back =
      mha::io::parse_safetensors(mha::io::safetensors_bytes(file));  // must not throw
  mha_fuzz::require(back.metadata == file.metadata, "metadata round trip");
  mha_fuzz::require(back.tensors.size() == file.tensors.size(), "tensor count round trip");
  for (const auto& [name, t] : file.tensors) {
    const auto it = back.tensors.find(name);
    mha_fuzz::require(it != back.tensors.end() && it->second.shape == t.shape &&
                          mha_fuzz::same_bits(it->second.values, t.values),
                      "tensor round trip");
  }
  return 0;
}
