// Internal: what the safetensors, .npy and state_dict code share. Untrusted bytes are only ever
// read through the span-checked helpers here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/text.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"

namespace mha::io::detail {

// The unsigned little-endian integer in bytes [0, N). The caller checked the span's size.
template <class U>
U load_le(const std::byte* p) noexcept {
  U value = 0;
  for (std::size_t i = sizeof(U); i-- > 0;)
    value = static_cast<U>((value << 8) | std::to_integer<U>(p[i]));
  return value;
}

// `value` as N little-endian bytes appended to `out`.
template <class U>
void append_le(std::vector<std::byte>& out, U value) {
  for (std::size_t i = 0; i < sizeof(U); ++i) out.push_back(std::byte(value >> (8 * i)));
}

inline void append_text(std::vector<std::byte>& out, std::string_view s) {
  // resize + memcpy: GCC 12 flags vector::insert of a byte range after reserve() with a false
  // -Wstringop-overflow.
  const std::size_t old_size = out.size();
  out.resize(old_size + s.size());
  if (!s.empty()) std::memcpy(out.data() + old_size, s.data(), s.size());
}

// The float32 values of n little-endian IEEE binary32 elements starting at p.
void decode_f32(const std::byte* p, std::size_t n, float* out) noexcept;
void append_f32(std::vector<std::byte>& out, std::span<const float> values);

// A name from an untrusted file, fit for a one-line message: quoted, control and non-ASCII
// bytes escaped (\xNN), cut after 64 bytes ("...").
std::string printable(std::string_view name);

// `s` with every byte that is not printable ASCII (control bytes, 0x7f-0xff) as \xNN, and \ as
// \x5c: for messages that quote file content (a JSON parser's "last read: ..."). Not cut.
std::string escaped(std::string_view s);

// "(2, 3, 4)", "()" for a scalar.
std::string shape_text(std::span<const std::int64_t> shape);

// The number of elements of `shape` in `elements`; false when a dimension is negative or the
// byte count, elements * element_bytes, overflows int64.
bool element_count(std::span<const std::int64_t> shape, std::int64_t element_bytes,
                   std::int64_t& elements) noexcept;

// Throws mha::invalid_argument "<what> has shape ..." unless t is valid (see io::tensor); `what`
// names the tensor ("safetensors: tensor 'W_query.weight'").
void check_tensor(std::string_view what, const tensor& t);

// A regular file opened for reading in parts (a header, then the data it describes), so that
// nothing is read before it was checked. mha::error naming the path and the system's reason.
class input_file {
 public:
  // Refuses what is not a regular file (a device or pipe would be read without end).
  explicit input_file(const std::filesystem::path& path);
  ~input_file();
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  // The size when opened.
  std::uint64_t size() const noexcept { return size_; }
  // Exactly out.size() bytes from `offset`; mha::error when the file is shorter (it shrank).
  void read(std::uint64_t offset, std::span<std::byte> out) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Writes `bytes` to `path`. A regular file (or a new one) is replaced atomically: a temporary
// file with a unique short name is created in the same directory (O_EXCL|O_NOFOLLOW), given the
// existing file's mode (else 0666 & ~umask), written, fsync'ed and renamed over `path` (over the
// file a symlink names, keeping the link), so a failed write never leaves a partial file under
// the final name and concurrent writers each leave a whole file. A path that exists and is not
// a regular file (a device, FIFO, or a symlink to one: /dev/null, /dev/stdout), or is under /dev
// or /proc (/dev/stdout redirected to a file), is written through, as cp does. mha::error on
// failure.
void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes);

// Throws mha::format_error "<source>: <args...>".
template <class... Args>
[[noreturn]] void fail(std::string_view source, Args&&... args) {
  throw format_error(mha::detail::text(source, ": ", std::forward<Args>(args)...));
}

}  // namespace mha::io::detail
