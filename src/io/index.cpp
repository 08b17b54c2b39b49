#include "io/index.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "io/common.hpp"
#include "io/json.hpp"

namespace mha::io::detail {
namespace {

using mha::detail::text;
using nlohmann::json;

// The SAX events of an index: the weight_map's entries go to `names`/`entries`; every other
// object is checked for duplicate keys (the weight_map's are found by sorting afterwards, which
// needs no set of its keys) and the whole for depth.
class index_reader {
 public:
  using entry_sink = std::function<void(std::string_view name, std::string_view shard)>;
  index_reader(std::string_view source, entry_sink sink)
      : source_(source), sink_(std::move(sink)) {}

  bool null() { return value("null", "null"); }
  bool boolean(bool b) { return value("boolean", b ? "true" : "false"); }
  bool number_integer(json::number_integer_t n) { return value("number", text(n)); }
  bool number_unsigned(json::number_unsigned_t n) { return value("number", text(n)); }
  bool number_float(json::number_float_t, const json::string_t& s) { return value("number", s); }
  bool binary(json::binary_t&) { return value("binary", "binary data"); }
  bool string(json::string_t& s) {
    if (in_map()) {
      sink_(entry_name_, s);
      return true;
    }
    return value("string", "");
  }
  bool start_object(std::size_t) {
    if (in_map()) not_a_name("an object");
    if (depth_ == 1 && top_key_ == "weight_map" && map_depth_ == 0) {
      map_depth_ = depth_ + 1;
    } else {
      open_.emplace_back();
    }
    return deeper();
  }
  bool key(json::string_t& key) {
    if (in_map()) {
      entry_name_ = std::move(key);
      return true;
    }
    // An index holds a few keys beside its weight_map (metadata's total_size); the cap keeps the
    // sets that find duplicates small.
    if (++other_keys_ > max_other_keys) {
      fail(source_, "has more than ", max_other_keys, " keys outside its weight_map");
    }
    if (!open_.back().insert(key).second) {
      fail(source_, "has the key ", printable(key), " twice");
    }
    if (depth_ == 1) top_key_ = key;
    return true;
  }
  bool end_object() {
    if (in_map()) {
      map_done_ = true;
      map_depth_ = -1;  // one weight_map: a second is a duplicate key of the top level
    } else {
      open_.pop_back();
    }
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (in_map()) not_a_name("an array");
    if (depth_ == 0) fail(source_, "is a JSON array, expected an object");
    return deeper();
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    fail(source_, "is not valid JSON: ", escaped(e.what()));
  }

  bool has_map() const noexcept { return map_done_; }

 private:
  bool in_map() const noexcept { return map_depth_ > 0 && depth_ == map_depth_; }
  bool value(std::string_view type, std::string_view shown) {
    if (depth_ == 0) fail(source_, "is a JSON ", type, ", expected an object");
    if (in_map()) not_a_name(shown);
    return true;
  }
  [[noreturn]] void not_a_name(std::string_view shown) const {
    fail(source_, "weight_map entry ", printable(entry_name_), " is ", escaped(shown),
         ", expected a shard's file name");
  }
  bool deeper() {
    if (++depth_ > static_cast<std::int64_t>(max_json_depth)) {
      fail(source_, "nests objects and arrays deeper than ", max_json_depth, " levels");
    }
    return true;
  }

  static constexpr std::int64_t max_other_keys = 65536;
  std::string_view source_;
  entry_sink sink_;
  std::int64_t other_keys_ = 0;
  std::int64_t depth_ = 0,
               map_depth_ = 0;  // map_depth_: the weight_map's entries' depth, once open
  bool map_done_ = false;
  std::string top_key_, entry_name_;
  std::vector<std::unordered_set<std::string>> open_;
};

}  // namespace

std::optional<std::uint32_t> tensor_index::file_of(std::string_view name) const noexcept {
  const auto [first, last] = under(name);
  for (std::size_t i = first; i < last; ++i) {
    if (this->name(i) == name) return entries_[i].file;
  }
  return std::nullopt;
}

std::pair<std::size_t, std::size_t> tensor_index::under(std::string_view prefix) const noexcept {
  std::size_t first = 0, count = entries_.size();
  while (count > 0) {  // the first name not below prefix
    const std::size_t half = count / 2;
    if (name(first + half) < prefix) {
      first += half + 1;
      count -= half + 1;
    } else {
      count = half;
    }
  }
  std::size_t last = first;
  while (last < entries_.size() && name(last).starts_with(prefix)) ++last;
  return {first, last};
}

tensor_index parse_tensor_index(
    std::string_view text, std::string_view source,
    const std::function<std::uint32_t(std::string_view, std::string_view)>& file) {
  tensor_index index;
  std::map<std::string, std::uint32_t, std::less<>> shards;  // name -> file
  index_reader reader(source, [&](std::string_view name, std::string_view shard) {
    if (index.entries_.size() == static_cast<std::size_t>(max_model_index_entries)) {
      fail(source, "names more than ", max_model_index_entries,
           " tensors, more than mha reads from an index");
    }
    auto it = shards.find(shard);
    if (it == shards.end()) {
      if (shards.size() == static_cast<std::size_t>(max_model_shards)) {
        fail(source, "names more than ", max_model_shards,
             " shard files, more than mha reads from an index");
      }
      it = shards.emplace(std::string(shard), file(shard, name)).first;
    }
    index.entries_.push_back({static_cast<std::uint32_t>(index.names_.size()),
                              static_cast<std::uint32_t>(name.size()), it->second});
    index.names_.append(name);
  });
  json::sax_parse(text, &reader);
  if (!reader.has_map()) fail(source, "has no weight_map object (tensor name -> shard file)");

  auto& entries = index.entries_;
  const auto name_of = [&](const tensor_index::entry& e) {
    return std::string_view(index.names_).substr(e.offset, e.size);
  };
  std::sort(entries.begin(), entries.end(),
            [&](const auto& a, const auto& b) { return name_of(a) < name_of(b); });
  const auto twice = std::adjacent_find(entries.begin(), entries.end(),
                                        [&](auto& a, auto& b) { return name_of(a) == name_of(b); });
  if (twice != entries.end()) {
    fail(source, "weight_map has the key ", printable(name_of(*twice)), " twice");
  }
  return index;
}

}  // namespace mha::io::detail
