// safetensors: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data; offsets are relative to the first byte after the header.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "io/common.hpp"
#include "io/json.hpp"
#include "mha/io.hpp"

namespace mha::io {
namespace {

using detail::fail;
using detail::printable;
using detail::shape_text;
using nlohmann::json;

constexpr std::string_view metadata_key = "__metadata__";

// IEEE binary16 -> binary32, exactly (every half is a float).
float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Decoders of n elements of one dtype into float32; false when an element has no float value.
bool decode_f32(const std::byte* p, std::size_t n, float* out) noexcept {
  detail::decode_f32(p, n, out);
  return true;
}
bool decode_f16(const std::byte* p, std::size_t n, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = half_to_float(detail::load_le<std::uint16_t>(p + 2 * i));
  return true;
}
bool decode_bf16(const std::byte* p, std::size_t n, float* out) noexcept {
  // bfloat16 is the top half of a binary32.
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = std::bit_cast<float>(std::uint32_t{detail::load_le<std::uint16_t>(p + 2 * i)} << 16);
  }
  return true;
}
bool decode_f64(const std::byte* p, std::size_t n, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(std::bit_cast<double>(detail::load_le<std::uint64_t>(p + 8 * i)));
  }
  return true;
}
bool decode_bool(const std::byte* p, std::size_t n, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{0} && p[i] != std::byte{1}) return false;
    out[i] = p[i] == std::byte{1} ? 1.0f : 0.0f;
  }
  return true;
}

// A safetensors dtype: its element size and, for the float-valued ones mha reads, its decoder
// (nullptr: an integer or 8-bit float type, which a checkpoint may hold beside the block, e.g. an
// int64 position_ids buffer; its header entry is checked, its data never read).
struct dtype {
  std::string_view name;
  std::int64_t bytes;
  bool (*decode)(const std::byte*, std::size_t, float*) noexcept;
};
constexpr std::array<dtype, 15> dtypes = {{{"F32", 4, decode_f32},
                                           {"F16", 2, decode_f16},
                                           {"BF16", 2, decode_bf16},
                                           {"F64", 8, decode_f64},
                                           {"BOOL", 1, decode_bool},
                                           {"I64", 8, nullptr},
                                           {"I32", 4, nullptr},
                                           {"I16", 2, nullptr},
                                           {"I8", 1, nullptr},
                                           {"U64", 8, nullptr},
                                           {"U32", 4, nullptr},
                                           {"U16", 2, nullptr},
                                           {"U8", 1, nullptr},
                                           {"F8_E4M3", 1, nullptr},
                                           {"F8_E5M2", 1, nullptr}}};
constexpr std::string_view readable_dtypes = "F32, F16, BF16, F64, BOOL";
// A dtype this reader does not know (a newer format's): its entry's byte range is checked
// against the others, not against its shape, and reading it is an error.
constexpr dtype unknown_dtype = {"", 0, nullptr};

// One checked header entry: the tensor's bytes are data[begin, end).
struct entry {
  std::string name;
  std::string type_name;
  const dtype* type;
  std::vector<std::int64_t> shape;
  std::int64_t elements;
  std::uint64_t begin, end;
};

// The header as JSON: duplicate keys and NUL bytes rejected (nlohmann's lexer takes a NUL for
// the end of the input and would ignore whatever follows it).
json parse_header(std::string_view header, std::string_view source) {
  if (const std::size_t nul = header.find('\0'); nul != std::string_view::npos) {
    fail(source, "header has a NUL byte at byte ", nul,
         "; the JSON text must fill the header (padded with spaces)");
  }
  return detail::parse_json(header, source, "header");
}

// A JSON value that must be a non-negative integer below 2^63.
std::uint64_t unsigned_value(const json& v, std::string_view source, std::string_view what) {
  if (!v.is_number_unsigned() ||
      v.get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
    // nlohmann rejects non-finite numbers (1e999, NaN) while parsing; 2.5, -1, 2^64 and
    // non-numbers end here.
    const std::string shown = v.is_number() ? v.dump() : "a JSON " + std::string(v.type_name());
    fail(source, what, " has ", shown, ", expected an integer in [0, 2^63)");
  }
  return v.get<std::uint64_t>();
}

entry parse_entry(const std::string& name, const json& info, std::uint64_t data_bytes,
                  std::string_view source) {
  const std::string label = "tensor " + printable(name);
  if (!info.is_object())
    fail(source, label, " is a JSON ", info.type_name(), ", expected an object");
  for (const auto& [field, value] : info.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      fail(source, label, " has the unexpected field ", printable(field),
           "; expected dtype, shape and data_offsets");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) fail(source, label, " lacks the field '", field, "'");
  }

  entry e{name, {}, &unknown_dtype, {}, 0, 0, 0};
  const json& type = info["dtype"];
  if (!type.is_string()) fail(source, label, " has a dtype that is a JSON ", type.type_name());
  e.type_name = type.get<std::string>();
  for (const dtype& d : dtypes) {
    if (e.type_name == d.name) e.type = &d;
  }

  const json& shape = info["shape"];
  if (!shape.is_array()) fail(source, label, " has a shape that is a JSON ", shape.type_name());
  for (const json& d : shape) {
    e.shape.push_back(static_cast<std::int64_t>(unsigned_value(d, source, label + " shape")));
  }
  if (!detail::element_count(e.shape, std::max<std::int64_t>(1, e.type->bytes), e.elements)) {
    fail(source, label, " has shape ", shape_text(e.shape), " whose byte count overflows int64");
  }

  const json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(source, label, " has data_offsets ", offsets.is_array() ? "of size " : "of type ",
         offsets.is_array() ? std::to_string(offsets.size()) : offsets.type_name(),
         ", expected [begin, end]");
  }
  e.begin = unsigned_value(offsets[0], source, label + " data_offsets[0]");
  e.end = unsigned_value(offsets[1], source, label + " data_offsets[1]");
  if (e.begin > e.end || e.end > data_bytes) {
    fail(source, label, " has data_offsets [", e.begin, ", ", e.end,
         "] outside the data section [0, ", data_bytes, "]");
  }
  const auto expected = static_cast<std::uint64_t>(e.elements * e.type->bytes);
  if (e.type != &unknown_dtype && e.end - e.begin != expected) {
    fail(source, label, " is ", e.type->name, " of shape ", shape_text(e.shape), " (", expected,
         " bytes) but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes");
  }
  return e;
}

// The entries' byte ranges, in order, must tile the data section exactly.
void check_tiling(std::vector<entry>& entries, std::uint64_t data_bytes, std::string_view source) {
  std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  const entry* previous = nullptr;
  for (const entry& e : entries) {
    if (e.begin < covered) {
      fail(source, "tensor ", printable(e.name), " data_offsets [", e.begin, ", ", e.end,
           "] overlap tensor ", printable(previous->name), " [", previous->begin, ", ",
           previous->end, "]");
    }
    if (e.begin > covered) {
      fail(source, "data bytes [", covered, ", ", e.begin, ") belong to no tensor (next is ",
           printable(e.name), ")");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes) {
    fail(source, "data section has ", data_bytes, " bytes but the tensors cover ", covered);
  }
}

// The header length from the first 8 bytes, checked against the cap and the file size.
std::uint64_t header_length(std::span<const std::byte> first8, std::uint64_t file_bytes,
                            std::string_view source) {
  if (file_bytes < 8) {
    fail(source, "file is ", file_bytes, " bytes, too short for the 8-byte header length");
  }
  const auto header_bytes = detail::load_le<std::uint64_t>(first8.data());
  if (header_bytes > max_safetensors_header_bytes) {
    fail(source, "header length ", header_bytes, " exceeds the limit of ",
         max_safetensors_header_bytes, " bytes");
  }
  if (header_bytes > file_bytes - 8) {
    fail(source, "header length ", header_bytes, " runs past the end of the file (", file_bytes - 8,
         " bytes follow the length)");
  }
  return header_bytes;
}

// The checked header: metadata and the entries, which tile a data section of data_bytes.
struct checked_header {
  std::map<std::string, std::string, std::less<>> metadata;
  std::vector<entry> entries;
};

checked_header check_header(std::string_view header_text, std::uint64_t data_bytes,
                            std::string_view source) {
  const json header = parse_header(header_text, source);
  if (!header.is_object())
    fail(source, "header is a JSON ", header.type_name(), ", expected an object");
  checked_header h;
  for (const auto& [name, info] : header.items()) {
    if (name != metadata_key) {
      h.entries.push_back(parse_entry(name, info, data_bytes, source));
      continue;
    }
    if (!info.is_object())
      fail(source, metadata_key, " is a JSON ", info.type_name(), ", expected an object");
    for (const auto& [key, value] : info.items()) {
      if (!value.is_string()) {
        fail(source, metadata_key, " value of ", printable(key), " is a JSON ", value.type_name(),
             ", expected a string");
      }
      h.metadata.emplace(key, value.get<std::string>());
    }
  }
  check_tiling(h.entries, data_bytes, source);
  return h;
}

// Throws unless entry e's dtype has float values mha reads.
void check_readable(const entry& e, std::string_view source) {
  if (e.type->decode == nullptr) {
    fail(source, "tensor ", printable(e.name), " has the unsupported dtype ",
         printable(e.type_name), "; supported: ", readable_dtypes);
  }
}

// The tensor of entry e from its bytes (e.end - e.begin of them); e is readable.
tensor decode(const entry& e, std::span<const std::byte> bytes, std::string_view source) {
  tensor t{e.shape, std::vector<float>(static_cast<std::size_t>(e.elements))};
  if (!e.type->decode(bytes.data(), t.values.size(), t.values.data())) {
    fail(source, "tensor ", printable(e.name), " of dtype BOOL holds a byte other than 0 or 1");
  }
  return t;
}

}  // namespace

tensor_file parse_safetensors(std::span<const std::byte> bytes, std::string_view source) {
  const std::uint64_t header_bytes =
      header_length(bytes.first(std::min<std::size_t>(8, bytes.size())), bytes.size(), source);
  const std::span<const std::byte> data = bytes.subspan(8 + header_bytes);
  checked_header h = check_header(
      {reinterpret_cast<const char*>(bytes.data() + 8), static_cast<std::size_t>(header_bytes)},
      data.size(), source);
  tensor_file file;
  file.metadata = std::move(h.metadata);
  for (const entry& e : h.entries) check_readable(e, source);
  for (const entry& e : h.entries) {
    file.tensors.emplace(e.name, decode(e, data.subspan(e.begin, e.end - e.begin), source));
  }
  return file;
}

std::vector<std::byte> safetensors_bytes(const tensor_file& file) {
  json header = json::object();
  if (!file.metadata.empty()) header[metadata_key] = file.metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (name == metadata_key) {
      throw invalid_argument(
          mha::detail::text("safetensors: ", printable(name), " is reserved, not a tensor name"));
    }
    detail::check_tensor("safetensors: tensor " + printable(name), t);
    const std::uint64_t end = offset + t.values.size() * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw invalid_argument(
        mha::detail::text("safetensors: a tensor name or metadata string is "
                          "not valid UTF-8 (",
                          e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<std::byte> out;
  out.reserve(8 + text.size() + offset);
  detail::append_le<std::uint64_t>(out, text.size());
  detail::append_text(out, text);
  for (const auto& [name, t] : file.tensors) detail::append_f32(out, t.values);
  return out;
}

tensor_file read_safetensors(const std::filesystem::path& path) {
  return read_safetensors(path, [](std::string_view) { return true; });
}

// The header is read and checked, against the file's size too, before any data is read: a huge
// file with a bad or small header costs only its header. Then each kept tensor's bytes alone.
tensor_file read_safetensors(const std::filesystem::path& path,
                             const std::function<bool(std::string_view name)>& keep) {
  const std::string source = path.string();
  detail::input_file in(path);
  std::array<std::byte, 8> first8{};
  const std::uint64_t file_bytes = in.size();
  in.read(0, std::span(first8).first(std::min<std::uint64_t>(8, file_bytes)));
  const std::uint64_t header_bytes = header_length(first8, file_bytes, source);
  std::string header_text(static_cast<std::size_t>(header_bytes), '\0');
  in.read(8, std::as_writable_bytes(std::span(header_text)));
  const std::uint64_t data_start = 8 + header_bytes;
  checked_header h = check_header(header_text, file_bytes - data_start, source);
  tensor_file file;
  file.metadata = std::move(h.metadata);
  std::vector<const entry*> kept;
  for (const entry& e : h.entries) {
    if (!keep(e.name)) continue;
    check_readable(e, source);
    kept.push_back(&e);
  }
  std::vector<std::byte> bytes;
  for (const entry* each : kept) {
    const entry& e = *each;
    bytes.resize(static_cast<std::size_t>(e.end - e.begin));
    in.read(data_start + e.begin, bytes);
    file.tensors.emplace(e.name, decode(e, bytes, source));
  }
  return file;
}

void write_safetensors(const std::filesystem::path& path, const tensor_file& file) {
  detail::write_file(path, safetensors_bytes(file));
}

}  // namespace mha::io
