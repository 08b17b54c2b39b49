// mha backends: what is built in, best first.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "base/feature_probes.hpp"
#include "cli/arguments.hpp"
#include "mha/registry.hpp"

namespace mha_cli {
namespace {

int list_backends(const arguments&) {
  std::printf("%-10s %-8s %-16s %s\n", "backend", "threads", "isa", "description");
  for (const mha::backend* b : mha::available_backends()) {
    std::printf("%-10s %-8d %-16s %s\n", std::string(b->name()).c_str(), b->max_threads(),
                std::string(mha::to_string(b->isa())).c_str(), b->description().c_str());
    // Every formulation is asked; one declined alone is named.
    for (const auto& [feature, declines] : mha::detail::declines(*b)) {
      const std::string answer = declines.empty() ? "yes"
                                 : declines.size() == mha::formulations().size()
                                     ? "declined: " + declines[0].second
                                     : "declined in " +
                                           std::string(mha::to_string(declines[0].first)) + ": " +
                                           declines[0].second;
      std::printf("%-10s   %-14s %s\n", "", feature, answer.c_str());
    }
    // mha::attention on q, k, v already projected (docs/design.md §1.8), in fp32.
    // ... with the extensions every backend that runs it computes (§1.9).
    const mha::support call = b->supports_attention(mha::precision::fp32);
    std::printf("%-10s   %-14s %s\n", "", "attention-call",
                call ? "yes (windows, soft-caps, sinks)" : ("declined: " + call.reason()).c_str());
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
      "(after MHA_XSIMD_ISA / ONEDNN_MAX_CPU_ISA caps), and a description; under each,\n"
      "whether it computes grouped-query attention, bf16, decode, a sliding window and the\n"
      "attention call (mha::attention, Python's mha.attention, with its windows, soft-caps and\n"
      "sinks), or why it declines.\n"
      "The default backend is the first, or the one the environment variable MHA_BACKEND names.\n",
      {},
      {},
      list_backends};
  return c;
}

}  // namespace mha_cli
