// Internal: a sharded model folder's model.safetensors.index.json (which file holds each tensor),
// read as a stream of JSON events into one buffer of names: no document of the file is built,
// so a hostile index of max_model_index_bytes costs about its own size again, not gigabytes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mha::io::detail {

class tensor_index {
 public:
  // The entries, sorted by name.
  std::size_t size() const noexcept { return entries_.size(); }
  std::string_view name(std::size_t i) const noexcept {
    return std::string_view(names_).substr(entries_[i].offset, entries_[i].size);
  }
  std::uint32_t file(std::size_t i) const noexcept { return entries_[i].file; }
  // The file holding `name`, or nullopt when the index does not name it.
  std::optional<std::uint32_t> file_of(std::string_view name) const noexcept;
  // The entries [first, last) whose names start with `prefix`.
  std::pair<std::size_t, std::size_t> under(std::string_view prefix) const noexcept;

 private:
  friend tensor_index parse_tensor_index(
      std::string_view, std::string_view,
      const std::function<std::uint32_t(std::string_view, std::string_view)>&);
  struct entry {
    std::uint32_t offset, size, file;
  };
  std::string names_;  // every name, back to back
  std::vector<entry> entries_;
};

// The weight_map of an index whose text is `text` (at most max_model_index_bytes), `source`
// naming it in messages. `file(shard, tensor)` gives the number of the file a shard's name
// leads to; it is called once per distinct shard name (with the first tensor naming it), and may
// throw. The text must be one JSON object with a weight_map object of strings; anything beside
// weight_map is checked as JSON (no key twice in an object, at most max_json_depth levels) and
// ignored. mha::format_error naming the index and the entry: not JSON, a duplicate key, a value
// that is not a file name, more than max_model_index_entries entries or max_model_shards files.
tensor_index parse_tensor_index(
    std::string_view text, std::string_view source,
    const std::function<std::uint32_t(std::string_view shard, std::string_view tensor)>& file);

}  // namespace mha::io::detail
