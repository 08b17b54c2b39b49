// mha backends: what is built in, best first.
#include <cstdio>
#include <string>

#include "cli/arguments.hpp"
#include "mha/registry.hpp"

namespace mha_cli {
namespace {

int list_backends(const arguments&) {
  std::printf("%-10s %-8s %-16s %s\n", "backend", "threads", "isa", "description");
  for (const mha::backend* b : mha::available_backends()) {
    std::printf("%-10s %-8d %-16s %s\n", std::string(b->name()).c_str(), b->max_threads(),
                b->isa().c_str(), b->description().c_str());
  }
  return 0;
}

}  // namespace

const command& backends_command() {
  static const command c{
      "backends",
      "list the backends built in, best first",
      "usage: mha backends\n\n"
      "Lists the backends built into this mha, best first: name, the most threads\n"
      "`mha run --threads` can use, the instruction set its kernels dispatch to on this CPU\n"
      "(after MHA_XSIMD_ISA / ONEDNN_MAX_CPU_ISA caps), and a description.\n"
      "The default backend is the first, or the one the environment variable MHA_BACKEND names.\n",
      {},
      {},
      list_backends};
  return c;
}

}  // namespace mha_cli
