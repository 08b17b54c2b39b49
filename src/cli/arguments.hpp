// The `mha` command: its subcommands and their options.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mha_cli {

// A mistake on the command line (unknown option, missing or malformed value): exit code 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The options given to one subcommand: "--name value" and "--flag", each at most once.
class arguments {
 public:
  // Parses `args` against the accepted option names (without "--"). Throws usage_error for a
  // positional argument, an unknown or repeated option, or a valued option without its value.
  arguments(std::span<char* const> args, std::span<const std::string_view> valued,
            std::span<const std::string_view> flags);

  bool has(std::string_view name) const { return given_.contains(name); }
  // The value of --name; usage_error when it was not given.
  const std::string& required(std::string_view name) const;
  std::string text_or(std::string_view name, std::string_view fallback) const;
  // --name as an integer in [min, max], or fallback when absent; usage_error naming the value.
  std::int64_t integer_or(std::string_view name, std::int64_t fallback, std::int64_t min,
                          std::int64_t max) const;
  std::uint64_t unsigned_or(std::string_view name, std::uint64_t fallback) const;
  double real_or(std::string_view name, double fallback) const;

 private:
  std::map<std::string, std::string, std::less<>> given_;  // flags map to ""
};

// One subcommand: `mha <name> [options]`.
struct command {
  std::string_view name;
  std::string_view summary;  // one line, for `mha --help`
  std::string_view usage;    // the whole `mha <name> --help` text
  std::vector<std::string_view> valued;
  std::vector<std::string_view> flags;
  // Returns the exit code: 0 success, 1 a check failed. Throws usage_error or mha::error for
  // usage or input errors (exit code 2).
  int (*run)(const arguments&);
};

const command& backends_command();
const command& inspect_command();
const command& run_command();
const command& verify_command();

}  // namespace mha_cli
