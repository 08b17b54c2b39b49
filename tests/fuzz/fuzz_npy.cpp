// libFuzzer target: parse_npy on arbitrary bytes. It returns or throws mha::format_error, never
// reads out of bounds (ASan) or hits undefined behaviour (UBSan), and what it returns survives
// npy_bytes -> parse_npy unchanged.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  mha::io::tensor t;
  try {
    t = mha::io::parse_npy({reinterpret_cast<const std::byte*>(data), size});
  } catch (const mha::format_error&) {
    return 0;
  }
  const mha::io::tensor back = mha::io::parse_npy(mha::io::npy_bytes(t));  // must not throw
  mha_fuzz::require(back.shape == t.shape && mha_fuzz::same_bits(back.values, t.values),
                    "npy round trip");
  return 0;
}
