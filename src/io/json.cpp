#include "io/json.hpp"

#include <string>
#include <unordered_set>
#include <vector>

#include "io/common.hpp"

namespace mha::io::detail {
namespace {

using nlohmann::json;

// A SAX pass that rejects duplicate keys at any depth (nlohmann would keep the last) in linear
// time, one hash set of keys per open object, and nesting deeper than max_json_depth.
// (nlohmann's callback parser, used before, rescans the parent object after every nested object:
// quadratic in the entries.)
class json_check {
 public:
  json_check(std::string_view source, std::string_view what) : source_(source), what_(what) {}
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    open_.emplace_back();
    return deeper();
  }
  bool key(json::string_t& key) {
    if (!open_.back().insert(key).second)
      fail(source_, what_, " has the key ", printable(key), " twice");
    return true;
  }
  bool end_object() {
    open_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return deeper(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    fail(source_, what_, " is not valid JSON: ", escaped(e.what()));
  }

 private:
  bool deeper() {
    if (++depth_ > max_json_depth) {
      fail(source_, what_, " nests objects and arrays deeper than ", max_json_depth, " levels");
    }
    return true;
  }
  std::string_view source_, what_;
  std::size_t depth_ = 0;
  std::vector<std::unordered_set<std::string>> open_;
};

}  // namespace

json parse_json(std::string_view text, std::string_view source, std::string_view what) {
  json_check check(source, what);
  json::sax_parse(text, &check);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(source, what, " is not valid JSON: ", escaped(e.what()));
  }
}

}  // namespace mha::io::detail
