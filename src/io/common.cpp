#include "io/common.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <random>
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

namespace {
void append_escaped(std::string& out, std::string_view s, bool quote_escaped) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\' && !(quote_escaped && c == '\'')) {
      out += static_cast<char>(c);
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
}
}  // namespace

std::string printable(std::string_view name) {
  constexpr std::size_t shown = 64;
  std::string out = "'";
  append_escaped(out, name.substr(0, shown), true);
  out += name.size() > shown ? "'..." : "'";
  return out;
}

std::string escaped(std::string_view s) {
  std::string out;
  append_escaped(out, s, false);
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

input_file::input_file(const std::filesystem::path& path) : path_(path) {
  std::error_code ignored;
  const std::filesystem::file_status status = std::filesystem::status(path, ignored);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw error(text("mha: cannot read '", path.string(),
                     "': not a regular file (a directory, device or pipe); expected a file"));
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) {
    throw error(
        text("mha: cannot open '", path.string(), "': ", std::generic_category().message(errno)));
  }
  struct ::stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int reason = S_ISREG(st.st_mode) ? errno : EINVAL;
    ::close(fd_);
    throw error(
        text("mha: cannot read '", path.string(), "': ", std::generic_category().message(reason)));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

input_file::~input_file() {
  if (fd_ >= 0) ::close(fd_);
}

void input_file::read(std::uint64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ::ssize_t n = ::pread(fd_, out.data() + done,
                                std::min<std::size_t>(out.size() - done, std::size_t{1} << 30),
                                static_cast<::off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw error(text("mha: cannot read '", path_.string(),
                       "': ", std::generic_category().message(errno)));
    }
    if (n == 0) {
      throw error(text("mha: cannot read '", path_.string(), "': the file shrank to ",
                       offset + done, " bytes while being read"));
    }
    done += static_cast<std::size_t>(n);
  }
}

namespace {

[[noreturn]] void write_error(std::string_view what, const std::filesystem::path& path,
                              int reason) {
  throw error(text("mha: cannot ", what, " '", path.string(),
                   "': ", std::generic_category().message(reason)));
}

// Writes every byte to fd; false with errno set on failure.
bool write_all(int fd, std::span<const std::byte> bytes) {
  const auto* p = reinterpret_cast<const char*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const ::ssize_t n = ::write(fd, p, std::min<std::size_t>(left, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

// Not a file to replace (a device, FIFO, or a symlink to one; a path under /dev or /proc):
// written through, as cp does (truncated first when it is a regular file).
void write_through(const std::filesystem::path& path, std::span<const std::byte> bytes,
                   bool regular) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | (regular ? O_TRUNC : 0));
  if (fd < 0) write_error("open", path, errno);
  if (!write_all(fd, bytes)) {
    const int reason = errno;
    ::close(fd);
    write_error("write", path, reason);
  }
  if (::close(fd) != 0) write_error("write", path, errno);
}

// A new file in `directory` with a unique short name, created with O_EXCL|O_NOFOLLOW so that
// nothing already there (a file, a planted symlink) is followed, truncated or removed.
int create_temporary(const std::filesystem::path& directory, std::filesystem::path& created) {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device entropy;
  static constexpr char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::uint64_t bits = (std::uint64_t{entropy()} << 32) ^ entropy() ^
                         (std::uint64_t(::getpid()) << 20) ^ counter.fetch_add(1);
    std::string name = ".mha-";
    for (int i = 0; i < 8; ++i, bits /= 36) name += alphabet[bits % 36];
    created = directory / name;
    const int fd =
        ::open(created.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

void write_file(const std::filesystem::path& requested, std::span<const std::byte> bytes) {
  std::filesystem::path path = requested;
  struct ::stat existing {};
  const bool exists = ::stat(path.c_str(), &existing) == 0;
  if (exists && S_ISDIR(existing.st_mode)) write_error("write", path, EISDIR);
  // Paths under /dev and /proc (/dev/stdout, /proc/self/fd/1) name an open file or a device,
  // never a file to replace, even when they lead to a regular file (stdout redirected to one).
  const std::string& name = path.native();
  const bool special = name.starts_with("/dev/") || name.starts_with("/proc/");
  if (exists && (special || !S_ISREG(existing.st_mode))) {
    return write_through(path, bytes, S_ISREG(existing.st_mode));
  }
  if (exists) {
    // A symlink to a regular file: the file it names is replaced, the link kept.
    std::error_code ec;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) {
      const std::filesystem::path target = std::filesystem::canonical(path, ec);
      if (!ec) path = target;
    }
  }
  std::filesystem::path directory = path.parent_path();
  if (directory.empty()) directory = ".";

  std::filesystem::path temporary;
  const int fd = create_temporary(directory, temporary);
  if (fd < 0) {
    const int reason = errno;
    throw error(text("mha: cannot create '", requested.string(), "' (a temporary file in '",
                     directory.string(), "'): ", std::generic_category().message(reason)));
  }
  auto fail_removing = [&](std::string_view what, int reason) {
    ::close(fd);
    ::unlink(temporary.c_str());
    write_error(what, requested, reason);
  };
  if (exists) {
    // The existing file's mode (and owner, where permitted) carries over; a new file gets
    // 0666 & ~umask from open.
    if (::fchmod(fd, existing.st_mode & 07777) != 0) fail_removing("write", errno);
    if (::fchown(fd, existing.st_uid, existing.st_gid) != 0) {
      // Only root may give a file away; keeping our own owner is what cp does too.
    }
  }
  if (!write_all(fd, bytes)) fail_removing("write", errno);
  if (::fsync(fd) != 0) fail_removing("write", errno);
  if (::close(fd) != 0) {
    const int reason = errno;
    ::unlink(temporary.c_str());
    write_error("write", requested, reason);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int reason = errno;
    ::unlink(temporary.c_str());
    write_error("write", requested, reason);
  }
  // The rename itself durable: best effort (some file systems refuse fsync on a directory).
  if (const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace mha::io::detail
