// mha: run attention on a PyTorch module's weights, list backends, verify them.
// Exit codes: 0 success, 1 a check failed, 2 a usage or input error (one line on stderr).
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <span>
#include <string_view>

#include "cli/arguments.hpp"

namespace {

const std::array<const mha_cli::command*, 4>& commands() {
  static const std::array<const mha_cli::command*, 4> list = {
      &mha_cli::backends_command(), &mha_cli::inspect_command(), &mha_cli::run_command(),
      &mha_cli::verify_command()};
  return list;
}

void print_usage(std::ostream& out) {
  out << "usage: mha <command> [options]    (mha <command> --help for its options)\n\n"
         "commands:\n";
  for (const mha_cli::command* c : commands()) {
    out << "  " << c->name << std::string(10 - c->name.size(), ' ') << c->summary << '\n';
  }
  out << "\nexit codes: 0 success, 1 a check failed, 2 a usage or input error\n";
}

// A standalone --help or -h; not an option's value (`--output -h` writes a file named -h).
bool wants_help(std::span<char* const> args, std::span<const std::string_view> valued) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--help" || a == "-h") return true;
    if (a.starts_with("--") &&
        std::find(valued.begin(), valued.end(), a.substr(2)) != valued.end()) {
      ++i;  // its value, whatever it looks like
    }
  }
  return false;
}

// Flushes standard output; a write that failed (a full disk, /dev/full, a closed pipe) turns
// success into exit code 2 with one line on stderr, so no output is silently lost.
int flushed(int code, std::string_view name) {
  std::cout.flush();
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) {
    const int reason = errno;
    std::cerr << "mha" << (name.empty() ? "" : " ") << name << ": cannot write to standard output: "
              << (reason != 0 ? std::strerror(reason) : "write error") << '\n';
    return 2;
  }
  return code;
}

const mha_cli::command* find_command(std::string_view name) {
  for (const mha_cli::command* c : commands()) {
    if (c->name == name) return c;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view name = argc >= 2 ? argv[1] : "";
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(std::cout);
    return flushed(0, "");
  }
  const mha_cli::command* c = find_command(name);
  if (argc < 2) {
    print_usage(std::cerr);
    return 2;
  }
  if (c == nullptr) {
    std::cerr << "mha: unknown command '" << name
              << "'; expected backends, inspect, run or verify (see mha --help)\n";
    return 2;
  }
  const std::span<char* const> args(argv + 2, static_cast<std::size_t>(argc - 2));
  if (wants_help(args, c->valued)) {
    std::cout << c->usage;
    return flushed(0, name);
  }
  try {
    return flushed(c->run(mha_cli::arguments(args, c->valued, c->flags)), name);
  } catch (const mha_cli::usage_error& e) {
    std::cerr << "mha " << name << ": " << e.what() << " (see mha " << name << " --help)\n";
  } catch (const std::exception& e) {
    // mha::error names the value; others (std::bad_alloc for an input too large to hold) too.
    std::cerr << "mha " << name << ": " << e.what() << '\n';
  }
  return 2;
}
