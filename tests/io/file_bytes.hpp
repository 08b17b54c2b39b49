// The bytes of safetensors and .npy files built by hand, and the checks that parsing them fails
// naming what is wrong: shared by the io suites (test_io.cpp, test_io_malformed.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "mha/error.hpp"
#include "mha/io.hpp"
#include "support.hpp"

namespace mha_test::io_files {

inline std::vector<std::byte> bytes_of(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

inline void append(std::vector<std::byte>& out, std::uint64_t value, int n) {
  for (int i = 0; i < n; ++i) out.push_back(std::byte(value >> (8 * i)));
}

// A safetensors file: `header` (its length written in front unless `length` overrides it)
// followed by `data`.
inline std::vector<std::byte> safetensors(
    std::string_view header, std::vector<std::byte> data = {},
    std::uint64_t length = std::numeric_limits<std::uint64_t>::max()) {
  std::vector<std::byte> out;
  append(out, length == std::numeric_limits<std::uint64_t>::max() ? header.size() : length, 8);
  const auto text = bytes_of(header);
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline std::vector<std::byte> zeros(std::size_t n) { return std::vector<std::byte>(n); }

// A version 1.0 .npy file with this header dict and `data_bytes` zero bytes of data.
inline std::vector<std::byte> npy(std::string_view dict, std::size_t data_bytes, int major = 1) {
  std::vector<std::byte> out = bytes_of("\x93NUMPY");
  out.push_back(std::byte(major));
  out.push_back(std::byte{0});
  append(out, dict.size(), major == 1 ? 2 : 4);
  const auto text = bytes_of(dict);
  out.insert(out.end(), text.begin(), text.end());
  out.resize(out.size() + data_bytes);
  return out;
}

// Expect parsing to throw mha::format_error with every fragment in its message.
inline void expect_bad_safetensors(const std::vector<std::byte>& file,
                                   std::initializer_list<const char*> fragments) {
  mha_test::expect_error<mha::format_error>([&] { mha::io::parse_safetensors(file); }, fragments);
}
inline void expect_bad_safetensors(std::string_view header, std::size_t data_bytes,
                                   std::initializer_list<const char*> fragments) {
  expect_bad_safetensors(safetensors(header, zeros(data_bytes)), fragments);
}

inline void expect_bad_npy(const std::vector<std::byte>& file,
                           std::initializer_list<const char*> fragments) {
  mha_test::expect_error<mha::format_error>([&] { mha::io::parse_npy(file); }, fragments);
}
// A version 1.0 file with header `dict` and `data_bytes` bytes of data.
inline void expect_bad_npy(std::string_view dict, std::size_t data_bytes,
                           std::initializer_list<const char*> fragments) {
  expect_bad_npy(npy(dict, data_bytes), fragments);
}

// The header dict of a float32 array with this shape literal.
inline std::string f4_dict(std::string_view shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(shape) + ", }";
}

}  // namespace mha_test::io_files
