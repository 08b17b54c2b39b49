// mha: run attention on a PyTorch module's weights, list backends, verify them.
// Exit codes: 0 success, 1 a check failed, 2 a usage or input error (one line on stderr).
#include <array>
#include <iostream>
#include <span>
#include <string_view>

#include "cli/arguments.hpp"

namespace {

const std::array<const mha_cli::command*, 3>& commands() {
  static const std::array<const mha_cli::command*, 3> list = {
      &mha_cli::backends_command(), &mha_cli::run_command(), &mha_cli::verify_command()};
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

bool wants_help(std::span<char* const> args) {
  for (std::string_view a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
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
    return 0;
  }
  const mha_cli::command* c = find_command(name);
  if (argc < 2) {
    print_usage(std::cerr);
    return 2;
  }
  if (c == nullptr) {
    std::cerr << "mha: unknown command '" << name
              << "'; expected backends, run or verify (see mha --help)\n";
    return 2;
  }
  const std::span<char* const> args(argv + 2, static_cast<std::size_t>(argc - 2));
  if (wants_help(args)) {
    std::cout << c->usage;
    return 0;
  }
  try {
    return c->run(mha_cli::arguments(args, c->valued, c->flags));
  } catch (const mha_cli::usage_error& e) {
    std::cerr << "mha " << name << ": " << e.what() << " (see mha " << name << " --help)\n";
  } catch (const std::exception& e) {
    // mha::error names the value; others (std::bad_alloc for an input too large to hold) too.
    std::cerr << "mha " << name << ": " << e.what() << '\n';
  }
  return 2;
}
