// .npy: "\x93NUMPY", version (major, minor), header length (2 bytes for 1.0, 4 for 2.0/3.0,
// little-endian), then a Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a newline, then the data in C order.
#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <set>

#include "io/common.hpp"
#include "mha/io.hpp"

namespace mha::io {
namespace {

using detail::fail;
using detail::printable;
using detail::shape_text;

constexpr std::string_view magic = "\x93NUMPY";

struct npy_header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// Reads the header dict. Accepts exactly what numpy writes and reads back with
// ast.literal_eval: string keys, the values a string, True/False and a tuple of non-negative
// integers, optional trailing commas, whitespace between tokens. No escapes, no expressions.
class header_reader {
 public:
  header_reader(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  npy_header read() {
    npy_header h;
    std::set<std::string, std::less<>> seen;
    expect('{', "the header dict");
    while (!accept('}')) {
      const std::string key = string_literal();
      if (!seen.insert(key).second) fail(source_, "header has the key ", printable(key), " twice");
      expect(':', "after a key");
      if (key == "descr") {
        h.descr = string_literal();
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
      } else if (key == "shape") {
        h.shape = integer_tuple();
      } else {
        fail(source_, "header has the unexpected key ", printable(key),
             "; expected descr, fortran_order and shape");
      }
      if (!accept(',')) {
        expect('}', "after a value");
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail(source_, "header has ", unexpected(), " after the dict");
    for (const char* key : {"descr", "fortran_order", "shape"}) {
      if (!seen.contains(key)) fail(source_, "header lacks the key '", key, "'");
    }
    return h;
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::string unexpected() const {
    if (pos_ >= text_.size()) return "the end of the header";
    return printable(text_.substr(pos_, 1)) + " at byte " + std::to_string(pos_);
  }
  void expect(char c, std::string_view where) {
    if (!accept(c))
      fail(source_, "header has ", unexpected(), " where '", c, "' belongs (", where, ")");
  }

  // 'text' or "text", without escapes.
  std::string string_literal() {
    skip_space();
    const char q = pos_ < text_.size() ? text_[pos_] : '\0';
    if (q != '\'' && q != '"')
      fail(source_, "header has ", unexpected(), " where a string belongs");
    const std::size_t close = text_.find(q, pos_ + 1);
    const std::size_t escape = text_.find('\\', pos_ + 1);
    if (close == std::string_view::npos || escape < close) {
      fail(source_, "header has an unterminated or escaped string at byte ", pos_);
    }
    std::string s(text_.substr(pos_ + 1, close - pos_ - 1));
    pos_ = close + 1;
    return s;
  }

  bool boolean() {
    skip_space();
    for (const bool value : {true, false}) {
      const std::string_view word = value ? "True" : "False";
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail(source_, "header has ", unexpected(), " where True or False belongs (fortran_order)");
  }

  std::vector<std::int64_t> integer_tuple() {
    std::vector<std::int64_t> values;
    expect('(', "the shape tuple");
    while (!accept(')')) {
      if (values.size() == max_npy_rank) {
        fail(source_, "header has a shape of more than ", max_npy_rank, " dimensions");
      }
      values.push_back(integer());
      if (!accept(',')) {
        expect(')', "the end of the shape tuple");
        break;
      }
    }
    return values;
  }

  // A non-negative decimal integer below 2^63, without sign or leading zeros.
  std::int64_t integer() {
    skip_space();
    const std::size_t first = pos_;
    std::int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_add_overflow(value, text_[pos_] - '0', &value)) {
        fail(source_, "header has a shape dimension at byte ", first, " that exceeds 2^63 - 1");
      }
      ++pos_;
    }
    if (pos_ == first || (text_[first] == '0' && pos_ - first > 1) ||
        (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))) {
      pos_ = first;
      fail(source_, "header has ", unexpected(),
           " where a shape dimension (a non-negative integer) belongs");
    }
    return value;
  }

  std::string_view text_;
  std::string_view source_;
  std::size_t pos_ = 0;
};

// What the header says: the shape, the element size and where the data starts. `prefix` holds
// the file's first bytes (at least the whole header, when the file has it), file_bytes its size.
struct npy_layout {
  std::vector<std::int64_t> shape;
  std::string descr;
  std::int64_t elements = 0, element_bytes = 0;
  std::uint64_t data_start = 0;
};

npy_layout parse_layout(std::span<const std::byte> prefix, std::uint64_t file_bytes,
                        std::string_view source) {
  if (prefix.size() < 10 ||
      std::string_view(reinterpret_cast<const char*>(prefix.data()), magic.size()) != magic) {
    fail(source, "not a .npy file (it does not start with \\x93NUMPY)");
  }
  const auto major = std::to_integer<unsigned>(prefix[6]);
  const auto minor = std::to_integer<unsigned>(prefix[7]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(source, "unsupported .npy format version ", major, ".", minor,
         "; expected 1.0, 2.0 or 3.0");
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (prefix.size() < 8 + length_bytes) fail(source, "file ends inside the header length");
  const std::uint64_t header_bytes = major == 1 ? detail::load_le<std::uint16_t>(prefix.data() + 8)
                                                : detail::load_le<std::uint32_t>(prefix.data() + 8);
  if (header_bytes > max_npy_header_bytes) {
    fail(source, "header length ", header_bytes, " exceeds the limit of ", max_npy_header_bytes,
         " bytes");
  }
  const std::size_t header_start = 8 + length_bytes;
  if (header_bytes > file_bytes - header_start) {
    fail(source, "header length ", header_bytes, " runs past the end of the file (",
         file_bytes - header_start, " bytes follow the length)");
  }
  const npy_header h =
      header_reader({reinterpret_cast<const char*>(prefix.data() + header_start), header_bytes},
                    source)
          .read();

  npy_layout l;
  if (h.descr == "<f4") {
    l.element_bytes = 4;
  } else if (h.descr == "<f8") {
    l.element_bytes = 8;
  } else {
    fail(source, "unsupported dtype ", printable(h.descr),
         "; expected '<f4' (float32) or '<f8' (float64), little-endian");
  }
  if (h.fortran_order) {
    fail(source, "array is in Fortran order; save a C-order array (np.ascontiguousarray)");
  }
  if (!detail::element_count(h.shape, l.element_bytes, l.elements)) {
    fail(source, "shape ", shape_text(h.shape), " has a byte count that overflows int64");
  }
  l.data_start = header_start + header_bytes;
  const std::uint64_t data_bytes = file_bytes - l.data_start;
  const auto expected = static_cast<std::uint64_t>(l.elements * l.element_bytes);
  if (data_bytes != expected) {
    fail(source, "shape ", shape_text(h.shape), " of ", h.descr, " needs ", expected,
         " data bytes but the file has ", data_bytes);
  }
  l.shape = h.shape;
  l.descr = h.descr;
  return l;
}

tensor decode(const npy_layout& l, const std::byte* data) {
  tensor t{l.shape, std::vector<float>(static_cast<std::size_t>(l.elements))};
  if (l.element_bytes == 4) {
    detail::decode_f32(data, t.values.size(), t.values.data());
  } else {
    for (std::size_t i = 0; i < t.values.size(); ++i) {
      t.values[i] =
          static_cast<float>(std::bit_cast<double>(detail::load_le<std::uint64_t>(data + 8 * i)));
    }
  }
  return t;
}

}  // namespace

tensor parse_npy(std::span<const std::byte> bytes, std::string_view source) {
  const npy_layout l = parse_layout(bytes, bytes.size(), source);
  return decode(l, bytes.data() + l.data_start);
}

std::vector<std::byte> npy_bytes(const tensor& t) {
  detail::check_tensor("npy: the array", t);
  if (t.shape.size() > max_npy_rank) {
    throw invalid_argument(mha::detail::text("npy: the array has ", t.shape.size(),
                                             " dimensions, more than .npy allows (", max_npy_rank,
                                             ")"));
  }
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    dict += (i ? ", " : "") + std::to_string(t.shape[i]);
  }
  dict += t.shape.size() == 1 ? ",), }" : "), }";

  // Magic, version, length, dict, spaces, '\n': a multiple of 64 bytes, as numpy aligns it. With
  // at most max_npy_rank dimensions the header stays far below version 1.0's 64 KiB.
  constexpr std::size_t prefix = 10;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';

  std::vector<std::byte> out;
  out.reserve(prefix + dict.size() + t.values.size() * sizeof(float));
  detail::append_text(out, magic);
  out.push_back(std::byte{1});  // version 1.0
  out.push_back(std::byte{0});
  detail::append_le(out, static_cast<std::uint16_t>(dict.size()));
  detail::append_text(out, dict);
  detail::append_f32(out, t.values);
  return out;
}

// The header is read and checked (its shape against the file's size too) before the data: a
// huge file with a bad header costs only its header.
tensor read_npy(const std::filesystem::path& path) {
  const std::string source = path.string();
  detail::input_file in(path);
  const std::uint64_t file_bytes = in.size();
  std::vector<std::byte> prefix(
      static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, 12 + max_npy_header_bytes)));
  in.read(0, prefix);
  const npy_layout l = parse_layout(prefix, file_bytes, source);
  std::vector<std::byte> data(static_cast<std::size_t>(file_bytes - l.data_start));
  in.read(l.data_start, data);
  return decode(l, data.data());
}

void write_npy(const std::filesystem::path& path, const tensor& t) {
  detail::write_file(path, npy_bytes(t));
}

}  // namespace mha::io
