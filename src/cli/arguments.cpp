#include "cli/arguments.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace mha_cli {
namespace {

bool listed(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

template <class T>
T parse_number(std::string_view name, const std::string& value, std::string_view expected) {
  T parsed{};
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (ec != std::errc{} || end != value.data() + value.size()) {
    throw usage_error("--" + std::string(name) + " expects " + std::string(expected) + ", got '" +
                      value + "'");
  }
  return parsed;
}

}  // namespace

arguments::arguments(std::span<char* const> args, std::span<const std::string_view> valued,
                     std::span<const std::string_view> flags) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (!arg.starts_with("--")) {
      throw usage_error("unexpected argument '" + std::string(arg) + "'");
    }
    const std::string name(arg.substr(2));
    if (given_.contains(name)) throw usage_error("--" + name + " is given twice");
    if (listed(flags, name)) {
      given_.emplace(name, "");
    } else if (listed(valued, name)) {
      if (i + 1 == args.size()) throw usage_error("--" + name + " needs a value");
      given_.emplace(name, args[++i]);
    } else {
      throw usage_error("unknown option " + std::string(arg));
    }
  }
}

const std::string& arguments::required(std::string_view name) const {
  const auto it = given_.find(name);
  if (it == given_.end()) throw usage_error("--" + std::string(name) + " is required");
  return it->second;
}

std::string arguments::text_or(std::string_view name, std::string_view fallback) const {
  const auto it = given_.find(name);
  return it == given_.end() ? std::string(fallback) : it->second;
}

std::int64_t arguments::integer_or(std::string_view name, std::int64_t fallback, std::int64_t min,
                                   std::int64_t max) const {
  const auto it = given_.find(name);
  if (it == given_.end()) return fallback;
  const std::string expected =
      "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  const auto value = parse_number<std::int64_t>(name, it->second, expected);
  if (value < min || value > max) {
    throw usage_error("--" + std::string(name) + " expects " + expected + ", got '" + it->second +
                      "'");
  }
  return value;
}

std::uint64_t arguments::unsigned_or(std::string_view name, std::uint64_t fallback) const {
  const auto it = given_.find(name);
  if (it == given_.end()) return fallback;
  return parse_number<std::uint64_t>(name, it->second, "a non-negative integer");
}

double arguments::real_or(std::string_view name, double fallback) const {
  const auto it = given_.find(name);
  if (it == given_.end()) return fallback;
  const auto value = parse_number<double>(name, it->second, "a number");
  if (!std::isfinite(value)) {
    throw usage_error("--" + std::string(name) + " expects a finite number, got '" + it->second +
                      "'");
  }
  return value;
}

}  // namespace mha_cli
