#include "core/io_common.hpp"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <system_error>

namespace mha::io::detail {

using mha::detail::text;

void decode_f32(const std::byte* p, std::size_t n, float* out) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    // An empty tensor's out may be nullptr, which memcpy must not get even for 0 bytes (found by
    // fuzz_npy under UBSan).
    if (n != 0) std::memcpy(out, p, n * sizeof(float));
  } else {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(load_le<std::uint32_t>(p + 4 * i));
  }
}

void append_f32(std::vector<std::byte>& out, std::span<const float> values) {
  out.reserve(out.size() + values.size() * sizeof(float));
  for (float v : values) append_le(out, std::bit_cast<std::uint32_t>(v));
}

std::string printable(std::string_view name) {
  constexpr std::size_t shown = 64;
  std::string out = "'";
  for (std::size_t i = 0; i < name.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  out += name.size() > shown ? "'..." : "'";
  return out;
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + ")";
}

bool element_count(std::span<const std::int64_t> shape, std::int64_t element_bytes,
                   std::int64_t& elements) noexcept {
  std::int64_t count = 1, bytes = element_bytes;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count) ||
        __builtin_mul_overflow(bytes, d, &bytes)) {
      return false;
    }
  }
  elements = count;
  return true;
}

void check_tensor(std::string_view what, const tensor& t) {
  std::int64_t elements = 0;
  if (!element_count(t.shape, sizeof(float), elements)) {
    throw invalid_argument(text(what, " has shape ", shape_text(t.shape),
                                "; dimensions must be >= 0 and the byte count fit in int64"));
  }
  if (static_cast<std::uint64_t>(elements) != t.values.size()) {
    throw invalid_argument(text(what, " has shape ", shape_text(t.shape), " (", elements,
                                " elements) but holds ", t.values.size(), " values"));
  }
}

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  // Only regular files: a device or pipe (/dev/zero, a FIFO) would be read without end.
  // A path that cannot be stat'ed (absent, no permission) falls through to the open's error.
  std::error_code ignored;
  const std::filesystem::file_status status = std::filesystem::status(path, ignored);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw error(text("mha: cannot read '", path.string(),
                     "': not a regular file (a directory, device or pipe); expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw error(
        text("mha: cannot open '", path.string(), "': ", std::generic_category().message(errno)));
  }
  std::vector<std::byte> bytes;
  constexpr std::size_t chunk = std::size_t{1} << 20;
  while (in) {
    const std::size_t old_size = bytes.size();
    bytes.resize(old_size + chunk);
    in.read(reinterpret_cast<char*>(bytes.data() + old_size), chunk);
    bytes.resize(old_size + static_cast<std::size_t>(in.gcount()));
  }
  // eof ends a good read; bad is a read error.
  if (in.bad() || !in.eof()) {
    throw error(
        text("mha: cannot read '", path.string(), "': ", std::generic_category().message(errno)));
  }
  return bytes;
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::filesystem::path temporary = path;
  temporary += ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw error(text("mha: cannot create '", temporary.string(),
                       "': ", std::generic_category().message(errno)));
    }
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      const int reason = errno;
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw error(text("mha: cannot write '", path.string(),
                       "': ", std::generic_category().message(reason)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    const std::string reason = ec.message();
    std::filesystem::remove(temporary, ec);
    throw error(text("mha: cannot write '", path.string(), "': ", reason));
  }
}

}  // namespace mha::io::detail
