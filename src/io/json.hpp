// Internal: JSON from untrusted files (a safetensors header, a model's config.json and index),
// parsed once through checks that nlohmann's parser does not make.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

namespace mha::io::detail {

// The most levels of nested objects and arrays parse_json accepts (a safetensors header has 3, a
// model's config.json 4 or 5).
inline constexpr std::size_t max_json_depth = 64;

// `text` parsed as one JSON value, refusing what nlohmann would accept silently or slowly: a key
// twice in one object (nlohmann keeps the last), nesting deeper than max_json_depth. A
// mha::format_error "<source>: <what> has the key 'k' twice", "... is not valid JSON: ...",
// "... nests deeper than 64 levels". Linear in the text's size.
nlohmann::json parse_json(std::string_view text, std::string_view source, std::string_view what);

}  // namespace mha::io::detail
